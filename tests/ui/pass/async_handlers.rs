//! Async handlers that must keep compiling, on SQLite through diesel-async.

use diesel::{ExpressionMethods, QueryDsl};
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use diesel_async::{AsyncConnection, RunQueryDsl};
use inbox_diesel::{Outcome, idempotent};

type Db = SyncConnectionWrapper<diesel::SqliteConnection>;

diesel::table! {
    accounts (id) {
        id -> Integer,
        balance -> BigInt,
    }
}

pub struct Msg {
    pub id: u64,
    pub amount: i64,
}

async fn add(conn: &mut Db, amount: i64) -> diesel::QueryResult<usize> {
    diesel::update(accounts::table.find(1))
        .set(accounts::balance.eq(accounts::balance + amount))
        .execute(conn)
        .await
}

/// A helper, a reborrow, a nested transaction, a fully qualified call, an owned parameter.
#[idempotent(consumer = "credit", key = msg.id)]
pub async fn credit(conn: &mut SyncConnectionWrapper<diesel::SqliteConnection>, msg: Msg, note: String) -> diesel::QueryResult<i64> {
    add(conn, msg.amount).await?;
    add(&mut *conn, note.len() as i64).await?;
    conn.transaction(async |inner| add(inner, 1).await).await?;
    RunQueryDsl::execute(diesel::delete(accounts::table.find(2)), conn).await?;
    accounts::table.select(accounts::balance).first(conn).await
}

/// Spawned on a multi-threaded runtime: the handler's future is `Send`.
pub async fn pump(mut conn: Db) {
    let handle = tokio::spawn(async move {
        credit(&mut conn, Msg { id: 1, amount: 10 }, String::from("n")).await
    });
    let outcome: diesel::QueryResult<Outcome<i64>> = handle.await.unwrap();
    let _ = outcome;
}

fn main() {}
