#![allow(unused_variables, unused_imports, dead_code, unused_mut, unreachable_code, unused_labels)]
// A value is judged by what it is where it is bound: a `match` or `if let` arm's own binding
// (even one named like the connection parameter), a `break 'label value`, a cast to a
// reference, what a static points to. The handlers never run.
include!("../common/sync.rs");

static AUDIT_POOL: LazyLock<&'static SqlitePool> = LazyLock::new(|| &*POOL);

fn report(pool: &SqlitePool) -> QueryResult<usize> {
    add(&mut pool.get().unwrap(), 1)
}

fn write_dyn(conn: &mut dyn SimpleConnection) -> QueryResult<()> {
    conn.batch_execute("UPDATE accounts SET balance = 0")
}

// V01: an arm that binds `conn`
#[idempotent(consumer = "v01", key = msg.id)]
fn v01(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let mut audit = match SqliteConnection::establish(":memory:") {
        Ok(conn) => conn,
        Err(_) => return Ok(()),
    };
    add(&mut audit, 1)?;
    Ok(())
}

// V02: `if let` that binds `conn`
#[idempotent(consumer = "v02", key = msg.id)]
fn v02(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let mut audit = if let Ok(conn) = POOL.get() { conn } else { return Ok(()) };
    add(&mut audit, 1)?;
    Ok(())
}

// V03: the `let x = match x { Some(x) => x, None => return }` idiom on a parameter
#[idempotent(consumer = "v03", key = msg.id, conn = conn)]
fn v03(conn: &mut SqliteConnection, msg: &Msg, mut audit: Option<&mut SqliteConnection>) -> QueryResult<()> {
    let audit = match audit.as_deref_mut() {
        Some(audit) => audit,
        None => return Ok(()),
    };
    add(audit, 1)?;
    Ok(())
}

// V04: a labeled block that breaks out with another connection
#[idempotent(consumer = "v04", key = msg.id)]
fn v04(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let mut replay = checkout();
    let db: &mut SqliteConnection = 'pick: {
        if msg.amounts.is_empty() { break 'pick &mut replay } else { &mut *conn }
    };
    add(db, 1)?;
    Ok(())
}

// V05: a cast to a trait object
#[idempotent(consumer = "v05", key = msg.id)]
fn v05(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let mut audit = checkout();
    write_dyn(&mut *audit as &mut dyn SimpleConnection)?;
    Ok(())
}

// V06: what a static points to
#[idempotent(consumer = "v06", key = msg.id)]
fn v06(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    report(*AUDIT_POOL)?;
    Ok(())
}

// V07: claim mode, an arm that binds a parameter's name
#[idempotent(consumer = "v07", key = msg.id, mode = "claim")]
fn v07(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let mut msg = match POOL.get() {
        Ok(msg) => msg,
        Err(_) => return Ok(()),
    };
    add(&mut msg, 1)?;
    Ok(())
}

fn main() {}
