#![allow(unused_variables, unused_imports, dead_code, unused_mut, irrefutable_let_patterns, unused_assignments, unreachable_code, unused_labels)]
//! Good code a new user wrote, sync: every form compiles.
include!("../common/sync.rs");
use std::collections::HashMap;
#[derive(Debug)]
pub struct AppError;
impl From<diesel::result::Error> for AppError { fn from(_: diesel::result::Error) -> Self { AppError } }
impl From<inbox_diesel::Error> for AppError { fn from(_: inbox_diesel::Error) -> Self { AppError } }
impl From<std::num::ParseIntError> for AppError { fn from(_: std::num::ParseIntError) -> Self { AppError } }
impl From<String> for AppError { fn from(_: String) -> Self { AppError } }
#[derive(Insertable)]
#[diesel(table_name = accounts)]
pub struct NewAccount<'a> { pub id: i32, pub balance: &'a i64 }
pub struct Out { pub name: String, pub n: i64 }
#[derive(Default)]
pub struct Opts { pub a: i64, pub b: String, pub c: Vec<u8> }
fn bump(n: &mut i64) { *n += 1 }
fn takes_str(s: &str) -> usize { s.len() }
fn show<T: std::fmt::Debug>(t: T) -> String { format!("{t:?}") }
fn takes_i64(n: i64) -> i64 { n }
macro_rules! info { ($($t:tt)*) => { let _ = stringify!($($t)*); }; }

// G01: a closure taking the connection, called with conn, then a println!
#[idempotent(consumer = "g01", key = msg.id)]
fn g01(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let credit = |c: &mut SqliteConnection, n: i64| add(c, n);
    credit(conn, 1)?;
    println!("credited {}", msg.id);
    Ok(())
}
// G02: an Insertable with a borrowed temporary field, diesel style
#[idempotent(consumer = "g02", key = msg.id)]
fn g02(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let row = NewAccount { id: 1, balance: &msg.amounts.iter().sum::<i64>() };
    diesel::insert_into(accounts::table).values(&row).execute(conn)?;
    Ok(())
}
// G03: a tuple holding a borrowed temporary
#[idempotent(consumer = "g03", key = msg.id)]
fn g03(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let pair = (&format!("{}-x", msg.name), 2);
    println!("{}", pair.0);
    Ok(())
}
// G04: an array of inline consts
#[idempotent(consumer = "g04", key = msg.id)]
fn g04(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let buckets: [Vec<i64>; 3] = [const { Vec::new() }; 3];
    Ok(())
}
// G05: a raw-pointer receiver in an unsafe block
#[idempotent(consumer = "g05", key = msg.id)]
fn g05(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let v = vec![1, 2];
    let p: *const Vec<i32> = &v;
    let n = unsafe { (*p).len() };
    Ok(())
}
// G06: struct update syntax of a struct holding the transaction
#[idempotent(consumer = "g06", key = msg.id)]
fn g06(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let base = Repo { db: conn, n: 0 };
    let repo = Repo { n: 5, ..base };
    add(repo.db, repo.n)?;
    Ok(())
}
// G07: two-phase borrows, Vec<&mut i64>, for over &mut
#[idempotent(consumer = "g07", key = msg.id)]
fn g07(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let mut v: Vec<usize> = Vec::new();
    v.push(v.len());
    let (mut a, mut b) = (1i64, 2i64);
    let mut refs: Vec<&mut i64> = vec![&mut a, &mut b];
    for r in &mut refs { **r += 1; }
    for r in refs.iter_mut() { bump(r); }
    let mut amounts = msg.amounts.clone();
    for x in &mut amounts { *x *= 2; }
    add(conn, amounts.iter().sum())?;
    Ok(())
}
// G08: a &mut non-connection handed twice (implicit reborrow)
#[idempotent(consumer = "g08", key = msg.id)]
fn g08(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let mut count = 0i64;
    let r = &mut count;
    bump(r);
    bump(r);
    let mut s = String::new();
    let w = &mut s;
    w.push('a');
    std::mem::swap(w, &mut String::from("b"));
    w.push('c');
    Ok(())
}
// G09: ? with From conversions, parse, into, collect, Default
#[idempotent(consumer = "g09", key = msg.id)]
fn g09(conn: &mut SqliteConnection, msg: &Msg) -> Result<i64, AppError> {
    let n: i64 = msg.name.parse()?;
    let m = takes_i64(msg.name.parse()?);
    let small: i32 = 3;
    add(conn, small.into())?;
    let names: Vec<String> = msg.amounts.iter().map(|a| a.to_string()).collect();
    let joined = names.join(",");
    let o: Opts = Default::default();
    add(conn, Default::default())?;
    let total: i64 = msg.amounts.iter().copied().sum();
    let ok: Result<i64, String> = Err("x".into());
    let v = ok.map_err(AppError::from)?;
    Ok(n + m + total + v)
}
// G10: format/log/tracing-like macros with %x and ?x
#[idempotent(consumer = "g10", key = msg.id)]
fn g10(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let id = msg.id;
    info!(%id, ?msg.amounts, "credited {}", id);
    println!("{id} {:>width$}", msg.name, width = 10);
    eprintln!("{:?}", msg.amounts);
    let s = format!("{}:{}", msg.name, id);
    let mut out = String::new();
    use std::fmt::Write as _;
    write!(&mut out, "{}", s).unwrap();
    writeln!(out, "{}", id).unwrap();
    Ok(())
}
// G11: matches! with guard, assert!, assert_eq!
#[idempotent(consumer = "g11", key = msg.id)]
fn g11(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let first = msg.amounts.first();
    assert!(matches!(first, Some(n) if *n > 0), "bad {}", msg.id);
    assert_eq!(msg.amounts.len(), 2, "{}", msg.name);
    debug_assert!(msg.id > 0);
    let kind = matches!(msg.name.as_str(), "a" | "b");
    Ok(())
}
// G12: Option / Result combinators with the transaction captured
#[idempotent(consumer = "g12", key = msg.id)]
fn g12(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let first = msg.amounts.first().copied();
    first.map(|n| add(conn, n)).transpose()?;
    let r: QueryResult<usize> = msg.amounts.get(1).ok_or(diesel::result::Error::NotFound).and_then(|n| add(conn, *n));
    let x = first.unwrap_or_default().max(1);
    let y = first.filter(|n| *n > 0).map_or(0, |n| n * 2);
    Ok(())
}
// G13: nested transactions and helpers given conn
#[idempotent(consumer = "g13", key = msg.id)]
fn g13(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    conn.transaction(|c| {
        add(c, 1)?;
        c.immediate_transaction(|d| add(d, 2))?;
        Connection::transaction(c, |e| add(e, 3))
    })?;
    conn.transaction::<_, diesel::result::Error, _>(|c| {
        for a in &msg.amounts { add(c, *a)?; }
        Ok(())
    })?;
    Ok(())
}
// G14: the transaction in a Vec<&mut> and a struct field
#[idempotent(consumer = "g14", key = msg.id)]
fn g14(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let mut repo = Repo { db: conn, n: 1 };
    repo.n += 1;
    add(repo.db, repo.n)?;
    repo.db.batch_execute("SELECT 1")?;
    Ok(())
}
// G15: String moved into a struct, shorthand fields
#[idempotent(consumer = "g15", key = msg.id)]
fn g15(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let name = msg.name.to_uppercase();
    let n = 3;
    let out = Out { name, n };
    let out2 = Out { name: out.name.clone(), ..out };
    let opts = Opts { a: 1, ..Default::default() };
    Ok(())
}
// G16: shadowing non-connection names, and conn by a non-connection
#[idempotent(consumer = "g16", key = msg.id)]
fn g16(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    add(conn, 1)?;
    let msg = &msg.name;
    let msg = msg.trim();
    let n = msg.len();
    let n = n as i64 + 1;
    {
        let conn = "replica-name";
        takes_str(conn);
        println!("{conn}");
    }
    let id = |conn: i64| conn + 1;
    id(2);
    Ok(())
}
// G17: closures mutating captured state
#[idempotent(consumer = "g17", key = msg.id)]
fn g17(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let mut count = 0;
    let mut inc = || count += 1;
    inc();
    inc();
    let mut seen = Vec::new();
    msg.amounts.iter().for_each(|a| seen.push(*a));
    let mut total = 0;
    let mut acc = |x: i64| { total += x; total };
    acc(2);
    Ok(())
}
// G18: labeled loops, loop-break values, labeled blocks, let-else, let chains, slice patterns
#[idempotent(consumer = "g18", key = msg.id)]
fn g18(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    'outer: for a in &msg.amounts {
        for b in &msg.amounts {
            if a == b { continue 'outer; }
            if *a > 100 { break 'outer; }
        }
    }
    let found = loop { break 5i64 };
    let chosen = 'b: { if found > 3 { break 'b 1i64; } 2 };
    let Some(first) = msg.amounts.first() else { return Ok(()) };
    if let Some(last) = msg.amounts.last() && *last > 0 { add(conn, *last)?; }
    match msg.amounts.as_slice() {
        [head, rest @ ..] if *head > 0 => { add(conn, *head + rest.len() as i64)?; }
        [] => {}
        _ => {}
    }
    Ok(())
}
// G19: HashMap, entry API, sort, dedup
#[idempotent(consumer = "g19", key = msg.id)]
fn g19(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let mut map: HashMap<String, i64> = HashMap::new();
    for a in &msg.amounts {
        *map.entry(a.to_string()).or_insert(0) += a;
    }
    let mut keys: Vec<_> = map.keys().cloned().collect();
    keys.sort();
    keys.dedup();
    let total: i64 = map.values().sum();
    add(conn, total)?;
    Ok(())
}
// G20: the transaction in a block, an if, a match
#[idempotent(consumer = "g20", key = msg.id)]
fn g20(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let c = if msg.id > 0 { &mut *conn } else { &mut *conn };
    add(c, 1)?;
    Ok(())
}
// G22: Vec::push of a parsed value whose type a later statement fixes
#[idempotent(consumer = "g22", key = msg.id)]
fn g22(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let mut v = Vec::new();
    v.push(msg.name.parse().unwrap_or(0));
    let total: i64 = v.iter().sum();
    add(conn, total)?;
    Ok(())
}
// G23: std::thread::scope and mem::take of non-db data
#[idempotent(consumer = "g23", key = msg.id)]
fn g23(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let mut names = vec![msg.name.clone()];
    let taken = std::mem::take(&mut names);
    let lens: Vec<usize> = std::thread::scope(|s| {
        let h = s.spawn(|| taken.iter().map(|t| t.len()).collect::<Vec<_>>());
        h.join().unwrap()
    });
    let boxed: Box<dyn Fn(i64) -> i64> = Box::new(|x| x + 1);
    boxed(2);
    Ok(())
}
// G24: Rc<RefCell<..>> of non-db data, Arc<Mutex<..>>
#[idempotent(consumer = "g24", key = msg.id)]
fn g24(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let log = Rc::new(RefCell::new(Vec::<String>::new()));
    log.borrow_mut().push("x".to_string());
    let shared = Arc::new(Mutex::new(0i64));
    *shared.lock().unwrap() += 1;
    let n = *shared.lock().unwrap();
    add(conn, n)?;
    Ok(())
}
fn main() {}
