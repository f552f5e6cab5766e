#![allow(unused_variables, unused_imports, dead_code, unused_mut, irrefutable_let_patterns, unused_assignments, unreachable_code, unused_labels)]
// Escapes a new user tried on diesel-async: each handler is refused. The handlers never run.
use std::sync::{Arc, LazyLock};
use diesel::{ExpressionMethods, QueryDsl};
use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use diesel_async::pooled_connection::{bb8, deadpool};
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use diesel_async::{AsyncConnection, RunQueryDsl, SimpleAsyncConnection};
use inbox_diesel::idempotent;

type Db = SyncConnectionWrapper<diesel::SqliteConnection>;
type DpPool = deadpool::Pool<Db>;
type Bb8Pool = bb8::Pool<Db>;
diesel::table! {
    accounts (id) {
        id -> Integer,
        balance -> BigInt,
    }
}
pub struct Msg { pub id: u64, pub amounts: Vec<i64>, pub name: String }
static POOL: LazyLock<DpPool> = LazyLock::new(|| {
    deadpool::Pool::builder(AsyncDieselConnectionManager::<Db>::new(":memory:")).build().unwrap()
});
static BB8: tokio::sync::OnceCell<Bb8Pool> = tokio::sync::OnceCell::const_new();
static GLOBAL: LazyLock<tokio::sync::Mutex<Option<Db>>> = LazyLock::new(Default::default);

async fn add(conn: &mut Db, amount: i64) -> diesel::QueryResult<usize> {
    diesel::update(accounts::table).set(accounts::balance.eq(accounts::balance + amount)).execute(conn).await
}
async fn add_one(conn: &mut Db) -> diesel::QueryResult<usize> { add(conn, 1).await }
async fn add_with_pool(pool: &DpPool) -> diesel::QueryResult<usize> { add(&mut pool.get().await.unwrap(), 1).await }
async fn add_with_bb8(pool: &Bb8Pool) -> diesel::QueryResult<usize> { add(&mut pool.get().await.unwrap(), 1).await }
async fn checkout_opt() -> Option<deadpool::Object<Db>> { POOL.get().await.ok() }
macro_rules! log {
    (target: $t:expr, $($a:tt)*) => { println!($($a)*) };
}
// A01: tokio::select! branch writing on a checkout
#[idempotent(consumer = "a01", key = msg.id)]
async fn a01(conn: &mut Db, msg: &Msg) -> diesel::QueryResult<()> {
    let mut p = POOL.get().await.unwrap();
    tokio::select! {
        r = add(&mut p, 1) => { r?; }
        _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
    }
    Ok(())
}
// A02: an Option of the transaction reassigned with a checkout
#[idempotent(consumer = "a02", key = msg.id)]
async fn a02(conn: &mut Db, msg: &Msg) -> diesel::QueryResult<()> {
    let mut o = Some(&mut *conn);
    let mut po = checkout_opt().await;
    o = po.as_deref_mut();
    add(o.unwrap(), 1).await?;
    Ok(())
}
// A03: three boxes around a deadpool object
#[idempotent(consumer = "a03", key = msg.id)]
async fn a03(conn: &mut Db, msg: &Msg) -> diesel::QueryResult<()> {
    let mut b = POOL.get().await.map(Box::new).map(Box::new).map(Box::new).unwrap();
    b.batch_execute("DELETE FROM accounts").await?;
    Ok(())
}
// A05: the static pool to a helper
#[idempotent(consumer = "a05", key = msg.id)]
async fn a05(conn: &mut Db, msg: &Msg) -> diesel::QueryResult<()> {
    add_with_pool(&POOL).await?;
    Ok(())
}
// A06: a bb8 pool from a static OnceCell to a helper
#[idempotent(consumer = "a06", key = msg.id)]
async fn a06(conn: &mut Db, msg: &Msg) -> diesel::QueryResult<()> {
    let p = BB8.get().unwrap();
    add_with_bb8(p).await?;
    Ok(())
}
// A07: a handler-local macro binds a checkout
#[idempotent(consumer = "a07", key = msg.id)]
async fn a07(conn: &mut Db, msg: &Msg) -> diesel::QueryResult<()> {
    macro_rules! lease { ($n:ident) => { let mut $n = POOL.get().await.unwrap(); }; }
    lease!(c);
    add(&mut c, 1).await?;
    Ok(())
}
// A08: claim mode, select!
#[idempotent(consumer = "a08", key = msg.id, mode = "claim")]
async fn a08(conn: &mut Db, msg: &Msg) -> diesel::QueryResult<()> {
    tokio::select! {
        r = async { add(&mut POOL.get().await.unwrap(), 1).await } => { r?; }
    }
    Ok(())
}
// A09: claim mode, matches! with a guard on an awaited write
#[idempotent(consumer = "a09", key = msg.id, mode = "claim")]
async fn a09(conn: &mut Db, msg: &Msg) -> diesel::QueryResult<()> {
    assert!(matches!(add(&mut POOL.get().await.unwrap(), 1).await, Ok(n) if n > 0));
    Ok(())
}
// A10: the tokio mutex global in a select!
#[idempotent(consumer = "a10", key = msg.id)]
async fn a10(conn: &mut Db, msg: &Msg) -> diesel::QueryResult<()> {
    tokio::select! {
        mut g = GLOBAL.lock() => { add(g.as_mut().unwrap(), 1).await?; }
    }
    Ok(())
}
// A11: a mem::swap of Options, then a nested transaction on it
#[idempotent(consumer = "a11", key = msg.id)]
async fn a11(conn: &mut Db, msg: &Msg) -> diesel::QueryResult<()> {
    let mut a = Some(conn);
    let mut po = checkout_opt().await;
    let mut b = po.as_deref_mut();
    std::mem::swap(&mut a, &mut b);
    if let Some(c) = a {
        c.transaction::<_, diesel::result::Error, _>(async |t| add(t, 1).await.map(drop)).await?;
    }
    Ok(())
}
fn main() {}
