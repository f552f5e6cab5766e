//! Forms that must keep compiling.

use diesel::prelude::*;
use inbox_diesel::{Outcome, Uuid, idempotent};

diesel::table! {
    accounts (id) {
        id -> Integer,
        balance -> BigInt,
    }
}

pub struct Msg {
    pub id: Uuid,
    pub text_id: String,
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub amount: i64,
}

#[derive(Debug)]
pub enum AppError {
    Db(diesel::result::Error),
    Inbox(inbox_diesel::Error),
}

impl From<diesel::result::Error> for AppError {
    fn from(e: diesel::result::Error) -> Self {
        AppError::Db(e)
    }
}

impl From<inbox_diesel::Error> for AppError {
    fn from(e: inbox_diesel::Error) -> Self {
        AppError::Inbox(e)
    }
}

/// A helper given the transaction's connection.
fn add(conn: &mut SqliteConnection, amount: i64) -> QueryResult<usize> {
    diesel::update(accounts::table.find(1))
        .set(accounts::balance.eq(accounts::balance + amount))
        .execute(conn)
}

/// `Result<T, E>` with an application error type; `?` on diesel errors; a helper; a loop; an
/// early `return`.
#[idempotent(consumer = "credit", key = msg.id)]
pub fn credit(conn: &mut SqliteConnection, msg: &Msg) -> Result<i64, AppError> {
    if msg.amount == 0 {
        return Ok(0);
    }
    for _ in 0..2 {
        add(conn, msg.amount)?;
    }
    let alias = &mut *conn;
    add(alias, 1)?;
    conn.transaction(|inner| add(inner, 1))?;
    Ok(msg.amount)
}

/// An alias return type, a `String` key borrowed (not moved) from the message.
#[idempotent(consumer = "text", key = msg.text_id)]
pub fn by_text(conn: &mut diesel::SqliteConnection, msg: &Msg) -> QueryResult<()> {
    add(conn, msg.amount).map(drop)
}

/// A Kafka key, a named connection, every option.
#[idempotent(
    consumer = "kafka",
    key = (msg.topic.as_str(), msg.partition, msg.offset),
    conn = db,
    retries = 0,
    isolation = "serializable",
    table = "inbox",
    constraint = "ux_inbox_message_consumer"
)]
pub fn by_offset(db: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    add(db, msg.amount).map(drop)
}

/// A composite key of parameters, one of them a `String` the body still owns afterwards.
#[idempotent(consumer = "notify", key = (version_id, email))]
pub fn notify(conn: &mut SqliteConnection, version_id: i32, email: String) -> QueryResult<usize> {
    add(conn, i64::from(version_id))?;
    Ok(email.len())
}

/// A key formatted from the parameters by inline arguments.
#[idempotent(consumer = "notify-text", key = format!("{version_id}/{email}"))]
pub fn notify_text(conn: &mut SqliteConnection, version_id: i32, email: &str) -> QueryResult<()> {
    add(conn, i64::from(version_id)).map(drop)
}

pub struct Service {
    pub consumer_tag: &'static str,
}

impl Service {
    /// A method; the key computed from `self` and a parameter.
    #[idempotent(consumer = "cloud-event", key = (self.consumer_tag, msg.text_id.as_str()))]
    pub fn handle(&self, conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
        add(conn, msg.amount).map(drop)
    }
}

macro_rules! stamped {
    ($conn:ty) => {
        #[idempotent(consumer = "stamped", key = n)]
        pub fn stamped(conn: &mut $conn, n: u64) -> QueryResult<u64> {
            let _ = conn;
            Ok(n)
        }
    };
}
stamped!(SqliteConnection);

fn main() {
    let _: fn(&mut SqliteConnection, &Msg) -> Result<Outcome<i64>, AppError> = credit;
    let _: fn(&mut SqliteConnection, &Msg) -> QueryResult<Outcome<()>> = by_text;
    let _: fn(&mut SqliteConnection, &Msg) -> QueryResult<Outcome<()>> = by_offset;
    let _: fn(&mut SqliteConnection, u64) -> QueryResult<Outcome<u64>> = stamped;
    let _ = Service::handle;
}
