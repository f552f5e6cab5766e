#![allow(unused_macros, unused_variables, unused_imports, dead_code, unused_mut, irrefutable_let_patterns, unused_assignments, unreachable_code, unused_labels)]
//! Good code a new user wrote on diesel-async: every form compiles.
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
#[derive(Debug)]
pub struct AppError;
impl From<diesel::result::Error> for AppError { fn from(_: diesel::result::Error) -> Self { AppError } }
impl From<inbox_diesel::Error> for AppError { fn from(_: inbox_diesel::Error) -> Self { AppError } }
impl From<String> for AppError { fn from(_: String) -> Self { AppError } }
pub struct Mailer;
impl Mailer { pub async fn send(&self, to: &str, key: &str) -> Result<(), String> { Ok(()) } }
pub struct RedisConnection;
impl RedisConnection { pub async fn set(&self, k: &str, v: &str) -> Result<(), String> { Ok(()) } }
pub struct NewRow<'a> { pub name: &'a str }

// GA01: join! and select! of non-DB futures, then a write on conn
#[idempotent(consumer = "ga01", key = msg.id)]
async fn ga01(conn: &mut Db, msg: &Msg) -> diesel::QueryResult<()> {
    let (a, b) = tokio::join!(async { 1i64 }, async { 2i64 });
    let c = tokio::select! {
        v = async { 3i64 } => v,
        _ = tokio::time::sleep(std::time::Duration::from_millis(5)) => 0,
    };
    add(conn, a + b + c).await?;
    Ok(())
}
// GA02: nested async transactions with async closures
#[idempotent(consumer = "ga02", key = msg.id)]
async fn ga02(conn: &mut Db, msg: &Msg) -> diesel::QueryResult<()> {
    conn.transaction::<_, diesel::result::Error, _>(async |c| {
        add(c, 1).await?;
        c.transaction::<_, diesel::result::Error, _>(async |d| add(d, 2).await.map(drop)).await
    }).await?;
    Ok(())
}
// GA03: a helper given conn, loops, ? with conversions
#[idempotent(consumer = "ga03", key = msg.id)]
async fn ga03(conn: &mut Db, msg: &Msg) -> Result<(), AppError> {
    for a in &msg.amounts { add(conn, *a).await?; }
    let n: i64 = msg.name.parse().map_err(|e: std::num::ParseIntError| e.to_string())?;
    add_one(conn).await?;
    let v: Vec<String> = msg.amounts.iter().map(|a| format!("{a}")).collect();
    println!("{}", v.join(","));
    Ok(())
}
// GA04: tokio::spawn of a non-DB task, awaiting it
#[idempotent(consumer = "ga04", key = msg.id)]
async fn ga04(conn: &mut Db, msg: &Msg) -> diesel::QueryResult<()> {
    let name = msg.name.clone();
    let len = tokio::spawn(async move { name.len() }).await.unwrap();
    add(conn, len as i64).await?;
    Ok(())
}
// GA05: a closure given conn, called, then a println!
#[idempotent(consumer = "ga05", key = msg.id)]
async fn ga05(conn: &mut Db, msg: &Msg) -> diesel::QueryResult<()> {
    let credit = async |c: &mut Db| add(c, 1).await;
    credit(conn).await?;
    println!("done");
    Ok(())
}
// GA06: a temporary borrowed in a struct (diesel insert style), async
#[idempotent(consumer = "ga06", key = msg.id)]
async fn ga06(conn: &mut Db, msg: &Msg) -> diesel::QueryResult<()> {
    let row = NewRow { name: &msg.name.to_lowercase() };
    println!("{}", row.name);
    add(conn, 1).await?;
    Ok(())
}
// GA07: claim mode: mailer, redis, join!, format, tracing-like macros
#[idempotent(consumer = "ga07", key = msg.id, mode = "claim", conn = conn)]
async fn ga07(conn: &mut Db, mailer: &Mailer, redis: &RedisConnection, msg: &Msg) -> Result<(), AppError> {
    let key = msg.id.to_string();
    let (a, b) = tokio::join!(mailer.send(&msg.name, &key), redis.set(&key, "sent"));
    a?; b?;
    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    let conn = "not a database";
    println!("{conn}");
    Ok(())
}
// GA08: the handler's future is Send (spawned below)
#[idempotent(consumer = "ga08", key = msg.id)]
async fn ga08(conn: &mut Db, msg: &Msg) -> diesel::QueryResult<()> {
    let s = msg.name.clone();
    let r = &s;
    tokio::task::yield_now().await;
    add(conn, r.len() as i64).await?;
    Ok(())
}
fn spawn_it(mut db: Db, msg: Msg) {
    tokio::spawn(async move { let _ = ga08(&mut db, &msg).await; });
}
// GA09: pooled handler connection from deadpool and bb8, calling the handler
async fn call_with_pooled(msg: Msg) {
    let mut p = POOL.get().await.unwrap();
    let _ = ga08(&mut p, &msg).await;
    let b = BB8.get().unwrap();
    let mut q = b.get().await.unwrap();
    let _ = ga08(&mut q, &msg).await;
}
fn main() {}
