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

pub struct Deps {
    pub audit: Checkout,
    pub shards: Vec<Checkout>,
}

impl Deps {
    pub fn checkout(&self) -> Checkout {
        checkout()
    }
}

// F12: a `match` arm's binding is the scrutinee; what its method returns is not
#[idempotent(consumer = "f12", key = msg.id)]
fn f12(conn: &mut SqliteConnection, msg: &Msg, deps: &Deps) -> QueryResult<()> {
    let mut audit = match deps {
        d if msg.amounts.is_empty() => return Ok(()),
        d => d.checkout(),
    };
    audit.batch_execute("DELETE FROM accounts")?;
    let held = &mut *GLOBAL.lock().unwrap();
    let mut other = match held {
        h => &mut *h,
    };
    other.batch_execute("DELETE FROM accounts")?;
    Ok(())
}

// F13: nor its fields and indexes
#[idempotent(consumer = "f13", key = msg.id)]
fn f13(conn: &mut SqliteConnection, msg: &Msg, deps: &mut Deps) -> QueryResult<()> {
    let audit = match &mut *deps {
        d => &mut d.audit,
    };
    audit.batch_execute("DELETE FROM accounts")?;
    let first = match &mut deps.shards {
        s => &mut s[0],
    };
    first.batch_execute("DELETE FROM accounts")?;
    Ok(())
}

pub trait Scoped {
    fn audit_scope(&mut self) -> AuditScope;
}

impl Scoped for SqliteConnection {
    fn audit_scope(&mut self) -> AuditScope {
        AuditScope
    }
}

pub struct AuditScope;

impl AuditScope {
    pub fn run<T>(self, f: impl FnOnce(&mut SqliteConnection) -> T) -> T {
        f(&mut SqliteConnection::establish(":memory:").unwrap())
    }
}

pub struct AuditConnection;

impl AuditConnection {
    pub fn transaction<T>(_: &mut SqliteConnection, f: impl FnOnce(&mut SqliteConnection) -> T) -> T {
        f(&mut SqliteConnection::establish(":memory:").unwrap())
    }
}

// F14: a `run` reached through a method of the application's own, and a `transaction` of a
// type of its own named `…Connection`, may hand their closures another connection
#[idempotent(consumer = "f14", key = msg.id)]
fn f14(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    conn.audit_scope().run(|c| c.batch_execute("DELETE FROM accounts"))?;
    AuditConnection::transaction(conn, |c| c.batch_execute("DELETE FROM accounts"))?;
    Ok(())
}

pub struct Tx2<'c>(&'c mut SqliteConnection);

impl Tx2<'_> {
    pub fn lock(&self) -> Checkout {
        checkout()
    }
}

// F15: the methods of the application's newtype around the transaction are its own code
#[idempotent(consumer = "f15", key = msg.id)]
fn f15(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let tx = Tx2(conn);
    tx.lock().batch_execute("DELETE FROM accounts")?;
    Ok(())
}

fn main() {}
