#![allow(unused_variables, unused_imports, dead_code, unused_mut, unused_assignments, unreachable_code)]
// The ways the guard follows the transaction — wrappers built in the body, what their
// accessors give back, closures returned from blocks and matches, arms that return — follow
// other connections just as far: each of these is refused. The handlers never run.
include!("../common/sync.rs");

pub struct Tx<'c>(&'c mut SqliteConnection);

// F01: an `Option` of a checkout, unwrapped
#[idempotent(consumer = "f01", key = msg.id)]
fn f01(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let mut spare = checkout_opt();
    add(spare.as_deref_mut().unwrap(), 1)?;
    Ok(())
}

// F02: a `RefCell` of a checkout
#[idempotent(consumer = "f02", key = msg.id)]
fn f02(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let shared = RefCell::new(checkout());
    Ok(())
}

// F03: a closure returned from a block, writing on a checkout it captured
#[idempotent(consumer = "f03", key = msg.id)]
fn f03(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let apply = {
        let mut other = checkout();
        move |c: &mut SqliteConnection| add(&mut other, 1)
    };
    apply(conn)?;
    Ok(())
}

// F04: a closure chosen by a `match`, called with a checkout
#[idempotent(consumer = "f04", key = msg.id)]
fn f04(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let apply = match msg.amounts.first() {
        Some(_) => |c: &mut SqliteConnection| add(c, 1),
        None => return Ok(()),
    };
    apply(&mut checkout())?;
    Ok(())
}

// F05: a `match` that yields a checkout in one arm and returns in the other
#[idempotent(consumer = "f05", key = msg.id)]
fn f05(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let mut other = checkout();
    let target = match msg.amounts.first() {
        Some(_) => &mut *other,
        None => return Ok(()),
    };
    add(target, 1)?;
    Ok(())
}

// F06: a newtype over a checkout
#[idempotent(consumer = "f06", key = msg.id)]
fn f06(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let mut other = checkout();
    let tx = Tx(&mut other);
    Ok(())
}

// F07: an `Option` of the transaction, refilled with a checkout, then unwrapped
#[idempotent(consumer = "f07", key = msg.id)]
fn f07(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let mut other = checkout();
    let mut slot = Some(&mut *conn);
    slot = Some(&mut other);
    add(slot.as_deref_mut().unwrap(), 1)?;
    Ok(())
}

// F08: an upper-case function that returns a checkout, called like a constructor
#[allow(non_snake_case)]
fn Audit(_: i64) -> Checkout {
    checkout()
}

#[idempotent(consumer = "f08", key = msg.id)]
fn f08(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let audit = Audit(1);
    let holder = (audit,);
    Ok(())
}

// F09: the same, handed on whole
#[idempotent(consumer = "f09", key = msg.id)]
fn f09(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let audit = Audit(1);
    std::mem::drop(audit);
    Ok(())
}

// F10: a named closure, trusted because the transaction is what calls it, handed to a
// connection of its own's transaction
#[idempotent(consumer = "f10", key = msg.id)]
fn f10(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let work = |c: &mut SqliteConnection| add(c, 1).map(drop);
    conn.transaction(work)?;
    let mut other = SqliteConnection::establish(":memory:").unwrap();
    other.transaction(work)?;
    Ok(())
}

fn twice(work: impl Fn(&mut SqliteConnection) -> QueryResult<()>) -> QueryResult<()> {
    work(&mut checkout())?;
    work(&mut checkout())
}

// F11: the same closure handed to a function of the application's own
#[idempotent(consumer = "f11", key = msg.id)]
fn f11(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let work = |c: &mut SqliteConnection| add(c, 1).map(drop);
    work(conn)?;
    twice(work)?;
    Ok(())
}

fn main() {}
