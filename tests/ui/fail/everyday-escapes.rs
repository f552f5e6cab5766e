#![allow(unused_variables, unused_imports, dead_code, unused_mut, irrefutable_let_patterns, unused_assignments, unreachable_code, unused_labels)]
// Escapes a new user tried, sync: every handler here is refused once or more, each at the
// value that would run a statement outside the transaction. The handlers never run.
include!("../common/sync.rs");
macro_rules! log {
    (target: $t:expr, $($a:tt)*) => { println!($($a)*) };
}
fn add_one(c: &mut SqliteConnection) -> QueryResult<usize> { add(c, 1) }
fn transaction<R>(_: &mut SqliteConnection, f: impl FnOnce(&mut Checkout) -> R) -> R { f(&mut checkout()) }
pub trait Lease { fn borrow_mut(&mut self) -> Checkout; }
impl Lease for SqliteConnection { fn borrow_mut(&mut self) -> Checkout { checkout() } }

// E01: an Option holding the transaction, reassigned with another connection
#[idempotent(consumer = "e01", key = msg.id)]
fn e01(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let mut o = Some(&mut *conn);
    let mut po = POOL.get().ok();
    o = po.as_deref_mut();
    add(o.unwrap(), 1)?;
    Ok(())
}

// E02: mem::replace into an Option of the transaction, then if let
#[idempotent(consumer = "e02", key = msg.id)]
fn e02(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let mut o = Some(conn);
    let mut po = checkout_opt();
    let _ = std::mem::replace(&mut o, po.as_deref_mut());
    if let Some(c) = o {
        reset().execute(c)?;
    }
    Ok(())
}

// E03: mem::swap of a tuple holding the transaction
#[idempotent(consumer = "e03", key = msg.id)]
fn e03(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let mut a = (&mut *conn, 0);
    let mut po = POOL.get().ok();
    let mut b = po.as_deref_mut().zip(Some(0)).unwrap();
    std::mem::swap(&mut a, &mut b);
    add(a.0, 1)?;
    Ok(())
}

// E04: as_mut().unwrap() chain on an Option of the transaction after reassignment
#[idempotent(consumer = "e04", key = msg.id)]
fn e04(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let mut o = Some(conn);
    let mut po = checkout_opt();
    o = po.as_deref_mut();
    o.as_mut().unwrap().batch_execute("DELETE FROM accounts")?;
    Ok(())
}

// E05: three boxes around an established connection, as receiver
#[idempotent(consumer = "e05", key = msg.id)]
fn e05(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let mut b = SqliteConnection::establish(":memory:").map(Box::new).map(Box::new).map(Box::new).unwrap();
    b.batch_execute("DELETE FROM accounts")?;
    Ok(())
}

// E06: three boxes around a pool checkout, as receiver
#[idempotent(consumer = "e06", key = msg.id)]
fn e06(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let mut b = POOL.get().map(Box::new).map(Box::new).map(Box::new).unwrap();
    b.batch_execute("DELETE FROM accounts")?;
    Ok(())
}

// E07: three &mut around a checkout, as receiver
#[idempotent(consumer = "e07", key = msg.id)]
fn e07(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let mut p = checkout();
    let mut r1 = &mut p;
    let mut r2 = &mut r1;
    let r3 = &mut r2;
    r3.batch_execute("DELETE FROM accounts")?;
    Ok(())
}

// E08: the static pool handed to a helper by reference
#[idempotent(consumer = "e08", key = msg.id)]
fn e08(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    add_with_pool(&POOL)?;
    Ok(())
}

// E09: the static pool through a local alias
#[idempotent(consumer = "e09", key = msg.id)]
fn e09(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let p = &*POOL;
    add_with_pool(p)?;
    Ok(())
}

// E10: a &'static pool field of a shared parameter, by value
#[idempotent(consumer = "e10", key = ctx.id)]
fn e10(conn: &mut SqliteConnection, ctx: &Ctx) -> QueryResult<()> {
    add_with_pool(ctx.pool)?;
    Ok(())
}

// E11: a macro_rules! defined in the handler that binds a checkout to a caller's name
#[idempotent(consumer = "e11", key = msg.id)]
fn e11(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    macro_rules! lease {
        ($n:ident) => { let mut $n = POOL.get().unwrap(); };
    }
    lease!(c);
    c.batch_execute("DELETE FROM accounts")?;
    Ok(())
}

// E12: the same, binding the name `conn`
#[idempotent(consumer = "e12", key = msg.id)]
fn e12(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    macro_rules! lease {
        ($n:ident) => { let mut $n = POOL.get().unwrap(); };
    }
    lease!(conn);
    add(&mut conn, 1)?;
    Ok(())
}

// E13: a macro_rules! in the handler called with non-comma syntax
#[idempotent(consumer = "e13", key = msg.id)]
fn e13(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    macro_rules! on {
        ($c:expr => $sql:literal) => { $c.batch_execute($sql) };
    }
    let mut p = checkout();
    on!(p => "DELETE FROM accounts")?;
    Ok(())
}

// E14: matches! with a guard around a write on a checkout
#[idempotent(consumer = "e14", key = msg.id)]
fn e14(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    assert!(matches!(reset().execute(&mut POOL.get().unwrap()), Ok(n) if n > 0));
    Ok(())
}

// E15: vec![x; n] with a write on a checkout
#[idempotent(consumer = "e15", key = msg.id)]
fn e15(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let results = vec![add(&mut POOL.get().unwrap(), 1).is_ok(); 1];
    Ok(())
}

// E16: a log macro with `target:` syntax (defined outside) around a write on a checkout
#[idempotent(consumer = "e16", key = msg.id)]
fn e16(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    log!(target: "audit", "{:?}", add(&mut POOL.get().unwrap(), 1));
    Ok(())
}



// E19: a function named `transaction` given conn, whose closure receives a checkout
#[idempotent(consumer = "e19", key = msg.id)]
fn e19(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    transaction(conn, |c| c.batch_execute("DELETE FROM accounts"))?;
    Ok(())
}

// E20: an extension method named borrow_mut on the transaction that returns a checkout
#[idempotent(consumer = "e20", key = msg.id)]
fn e20(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let mut c = conn.borrow_mut();
    c.batch_execute("DELETE FROM accounts")?;
    Ok(())
}

// E21: a computed-index receiver (documented limit), trivially computed
#[idempotent(consumer = "e21", key = msg.id)]
fn e21(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let mut conns: Vec<Checkout> = (0..1).map(|_| checkout()).collect();
    conns[0 + 0].batch_execute("DELETE FROM accounts")?;
    Ok(())
}

// E22: a second parameter that is three boxes deep
#[idempotent(consumer = "e22", key = msg.id, conn = conn)]
fn e22(conn: &mut SqliteConnection, spare: &mut Box<Box<Box<SqliteConnection>>>, msg: &Msg) -> QueryResult<()> {
    spare.batch_execute("DELETE FROM accounts")?;
    Ok(())
}
fn main() {}
