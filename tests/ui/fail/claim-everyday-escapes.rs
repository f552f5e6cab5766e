#![allow(unused_variables, unused_imports, dead_code, unused_mut, irrefutable_let_patterns, unused_assignments, unreachable_code, unused_labels)]
// Escapes a new user tried in claim mode: each handler reaches the database and is refused.
// The handlers never run.
include!("../common/sync.rs");
macro_rules! log {
    (target: $t:expr, $($a:tt)*) => { println!($($a)*) };
}
fn add_one(c: &mut SqliteConnection) -> QueryResult<usize> { add(c, 1) }

// C01: the static pool to a helper
#[idempotent(consumer = "c01", key = msg.id, mode = "claim")]
fn c01(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    add_with_pool(&POOL)?;
    Ok(())
}
// C02: three boxes around a checkout
#[idempotent(consumer = "c02", key = msg.id, mode = "claim")]
fn c02(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let mut b = POOL.get().map(Box::new).map(Box::new).map(Box::new).unwrap();
    b.batch_execute("DELETE FROM accounts")?;
    Ok(())
}
// C03: a handler-local macro binds a checkout to a caller's name
#[idempotent(consumer = "c03", key = msg.id, mode = "claim")]
fn c03(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    macro_rules! lease { ($n:ident) => { let mut $n = POOL.get().unwrap(); }; }
    lease!(db);
    db.batch_execute("DELETE FROM accounts")?;
    Ok(())
}
// C04: matches! with a guard
#[idempotent(consumer = "c04", key = msg.id, mode = "claim")]
fn c04(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    if matches!(reset().execute(&mut POOL.get().unwrap()), Ok(n) if n > 0) {}
    Ok(())
}
// C06: a &'static pool field of a shared parameter
#[idempotent(consumer = "c06", key = ctx.id, mode = "claim")]
fn c06(conn: &mut SqliteConnection, ctx: &Ctx) -> QueryResult<()> {
    add_with_pool(ctx.pool)?;
    Ok(())
}
// C07: a `target:` log macro around a write
#[idempotent(consumer = "c07", key = msg.id, mode = "claim")]
fn c07(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    log!(target: "audit", "{:?}", add(&mut POOL.get().unwrap(), 1));
    Ok(())
}
// C08: a handler-local macro called with `;` syntax
#[idempotent(consumer = "c08", key = msg.id, mode = "claim")]
fn c08(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    macro_rules! on { ($c:expr ; $sql:literal) => { $c.batch_execute($sql) }; }
    let mut p = checkout();
    on!(p; "DELETE FROM accounts")?;
    Ok(())
}
// C09: a computed-index receiver
#[idempotent(consumer = "c09", key = msg.id, mode = "claim")]
fn c09(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let mut conns: Vec<Checkout> = (0..1).map(|_| checkout()).collect();
    let i = 0;
    conns[i + 0].batch_execute("DELETE FROM accounts")?;
    Ok(())
}
// C10: let-chain receiver
#[idempotent(consumer = "c10", key = msg.id, mode = "claim")]
fn c10(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    if let Ok(mut c) = POOL.get() && c.batch_execute("DELETE FROM accounts").is_ok() {}
    Ok(())
}
// C11: three &mut deep second parameter
#[idempotent(consumer = "c11", key = msg.id, mode = "claim", conn = conn)]
fn c11(conn: &mut SqliteConnection, spare: &mut &mut &mut Checkout, msg: &Msg) -> QueryResult<()> {
    spare.batch_execute("DELETE FROM accounts")?;
    Ok(())
}
fn main() {}
