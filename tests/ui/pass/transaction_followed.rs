#![allow(unused_variables, dead_code, unused_mut, clippy::all)]
// The handler's transaction followed where real code takes it: a closure returned from a
// block or chosen by an `if` or a `match` and then called with it or handed to its
// `transaction` (a savepoint), a `match` that returns in
// one arm, a `Deref` newtype, a `RefCell` shared by closures, `Option` of it unwrapped, a
// mutex around it. None of these is refused.
include!("../common/sync.rs");

/// A unit of work over the transaction, as repositories are written.
pub struct Tx<'c>(&'c mut SqliteConnection);

impl std::ops::Deref for Tx<'_> {
    type Target = SqliteConnection;
    fn deref(&self) -> &SqliteConnection {
        self.0
    }
}

impl std::ops::DerefMut for Tx<'_> {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        self.0
    }
}

#[idempotent(consumer = "closure-from-a-block", key = msg.id)]
fn closure_from_a_block(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let apply = {
        let amount = msg.amounts.len() as i64;
        move |c: &mut SqliteConnection| add(c, amount)
    };
    apply(conn)?;
    Ok(())
}

#[idempotent(consumer = "named-closure-to-a-savepoint", key = msg.id)]
fn named_closure_to_a_savepoint(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let amount = msg.amounts.len() as i64;
    let work = |c: &mut SqliteConnection| add(c, amount).map(drop);
    conn.transaction(work)?;
    diesel::Connection::transaction(conn, work)?;
    work(conn)?;
    Ok(())
}

#[idempotent(consumer = "closure-from-an-if", key = msg.id)]
fn closure_from_an_if(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let apply = if msg.amounts.is_empty() {
        |c: &mut SqliteConnection| add(c, 1)
    } else {
        |c: &mut SqliteConnection| add(c, -1)
    };
    apply(conn)?;
    Ok(())
}

#[idempotent(consumer = "closure-from-a-match", key = msg.id)]
fn closure_from_a_match(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let apply: fn(&mut SqliteConnection) -> QueryResult<usize> = match msg.amounts.first() {
        Some(_) => |c| add(c, 1),
        None => return Ok(()),
    };
    let step = match msg.name.as_str() {
        "credit" => |c: &mut SqliteConnection| add(c, 1),
        "debit" => |c: &mut SqliteConnection| add(c, -1),
        _ => unreachable!("validated upstream"),
    };
    step(conn)?;
    apply(conn)?;
    Ok(())
}

#[idempotent(consumer = "match-that-returns", key = msg.id)]
fn match_that_returns(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let target = match msg.amounts.first() {
        Some(_) => &mut *conn,
        None => return Ok(()),
    };
    add(target, 1)?;
    let again = if msg.name.is_empty() { return Ok(()) } else { &mut *conn };
    add(again, 1)?;
    Ok(())
}

#[idempotent(consumer = "deref-newtype", key = msg.id)]
fn deref_newtype(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let mut tx = Tx(conn);
    add(&mut *tx, 1)?;
    reset().execute(&mut *tx)?;
    Ok(())
}

#[idempotent(consumer = "refcell-shared", key = msg.id)]
fn refcell_shared(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let shared = RefCell::new(conn);
    let credit = |n: i64| add(&mut shared.borrow_mut(), n);
    let debit = |n: i64| add(&mut shared.borrow_mut(), -n);
    credit(2)?;
    debit(1)?;
    Ok(())
}

#[idempotent(consumer = "option-unwrapped", key = msg.id)]
fn option_unwrapped(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let mut slot = Some(conn);
    add(slot.as_deref_mut().unwrap(), 1)?;
    let taken = slot.take().unwrap();
    add(taken, 1)?;
    Ok(())
}

#[idempotent(consumer = "mutex-around-it", key = msg.id)]
fn mutex_around_it(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let guarded = Mutex::new(conn);
    add(&mut guarded.lock().unwrap(), 1)?;
    Ok(())
}

#[idempotent(consumer = "arms-bound-to-it", key = msg.id)]
fn arms_bound_to_it(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let c = match &mut *conn {
        c if msg.amounts.is_empty() => c,
        c => &mut *c,
    };
    add(c, 1)?;
    let mut tx = Tx(conn);
    add(&mut tx.0, 1)?;
    let Tx(inner) = tx;
    add(inner, 1)?;
    Ok(())
}

fn main() {}
