#![allow(unused_variables, dead_code)]
// What an `async fn` body returns is not asked (its error type may not be settled yet at the
// first `return`), and a `SyncConnectionWrapper`'s `spawn_blocking` hands its closure the
// transaction's own connection. Both compile.
use diesel::prelude::*;
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use inbox_diesel::idempotent;

type Db = SyncConnectionWrapper<SqliteConnection>;

pub struct Msg {
    pub id: u64,
    pub region: String,
}

#[derive(Debug)]
pub enum AppError {
    Db(diesel::result::Error),
    Rate(std::num::ParseIntError),
    Inbox(inbox_diesel::Error),
}

impl From<diesel::result::Error> for AppError {
    fn from(e: diesel::result::Error) -> Self {
        AppError::Db(e)
    }
}

impl From<std::num::ParseIntError> for AppError {
    fn from(e: std::num::ParseIntError) -> Self {
        AppError::Rate(e)
    }
}

impl From<inbox_diesel::Error> for AppError {
    fn from(e: inbox_diesel::Error) -> Self {
        AppError::Inbox(e)
    }
}

async fn fetch_rate(region: &str) -> Result<i64, std::num::ParseIntError> {
    region.parse()
}

fn credit(conn: &mut SqliteConnection, amount: i64) -> QueryResult<usize> {
    diesel::sql_query("UPDATE accounts SET balance = balance + ?")
        .bind::<diesel::sql_types::BigInt, _>(amount)
        .execute(conn)
}

#[idempotent(consumer = "returns-and-blocking", key = msg.id)]
async fn returns_and_blocking(conn: &mut Db, msg: &Msg) -> Result<(), AppError> {
    let rate = match fetch_rate(&msg.region).await {
        Ok(rate) => rate,
        Err(e) => return Err(e.into()),
    };
    conn.spawn_blocking(move |c| credit(c, rate)).await?;
    Ok(())
}

fn main() {}
