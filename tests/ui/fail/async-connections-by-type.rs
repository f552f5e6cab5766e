// The same rule for `async fn` handlers on diesel-async: deadpool and bb8 checkouts, a
// global behind tokio's mutex, shadowing patterns, a pool parameter, claim mode. The
// handlers never run; only the errors are under test. Each handler is one form.
#![allow(unused_variables, unused_imports, dead_code, unused_mut)]

use std::sync::LazyLock;

use diesel::{ExpressionMethods, QueryDsl};
use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use diesel_async::pooled_connection::{bb8, deadpool};
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use diesel_async::{AsyncConnection, RunQueryDsl};
use inbox_diesel::idempotent;

type Db = SyncConnectionWrapper<diesel::SqliteConnection>;

diesel::table! {
    accounts (id) {
        id -> Integer,
        balance -> BigInt,
    }
}

pub struct Msg {
    pub id: u64,
}

static POOL: LazyLock<deadpool::Pool<Db>> = LazyLock::new(|| {
    deadpool::Pool::builder(AsyncDieselConnectionManager::<Db>::new(":memory:")).build().unwrap()
});
static GLOBAL: LazyLock<tokio::sync::Mutex<Option<Db>>> = LazyLock::new(Default::default);

async fn add(conn: &mut Db) -> diesel::QueryResult<usize> {
    diesel::update(accounts::table).set(accounts::balance.eq(0)).execute(conn).await
}

#[idempotent(consumer = "if-let", key = msg.id)]
async fn if_let(conn: &mut Db, msg: &Msg) -> diesel::QueryResult<()> {
    if let Ok(mut conn) = POOL.get().await {
        add(&mut conn).await?;
    }
    Ok(())
}

#[idempotent(consumer = "tokio-mutex", key = msg.id)]
async fn tokio_mutex(conn: &mut Db, msg: &Msg) -> diesel::QueryResult<()> {
    let mut global = GLOBAL.lock().await;
    add(global.as_mut().unwrap()).await?;
    Ok(())
}

#[idempotent(consumer = "bb8", key = msg.id, conn = conn)]
async fn bb8_parameter(conn: &mut Db, pool: &bb8::Pool<Db>, msg: &Msg) -> diesel::QueryResult<()> {
    Ok(())
}

#[idempotent(consumer = "deadpool-checkout", key = msg.id)]
async fn checkout_to_a_helper(conn: &mut Db, msg: &Msg) -> diesel::QueryResult<()> {
    let mut pooled = POOL.get().await.unwrap();
    add(&mut pooled).await?;
    Ok(())
}

#[idempotent(consumer = "transaction", key = msg.id)]
async fn transaction_on_a_checkout(conn: &mut Db, msg: &Msg) -> diesel::QueryResult<()> {
    let mut pooled = POOL.get().await.unwrap();
    pooled.transaction(async |c| add(c).await).await?;
    Ok(())
}

#[idempotent(consumer = "claim", key = msg.id, mode = "claim")]
async fn claim_mode(conn: &mut Db, msg: &Msg) -> diesel::QueryResult<()> {
    add(conn).await?;
    Ok(())
}

fn main() {}
