// Values whose type a later line settles, where the guard has nothing to ask: an error
// handed back in `Err(…)` (its type the function's or the closure's return), and what a
// formatting or logging macro only prints (`info!(score, …)`, `assert_eq!`).
#![allow(unused_variables, dead_code)]

use diesel::prelude::*;
use inbox_diesel::{guarded, idempotent};

diesel::table! {
    accounts (id) {
        id -> BigInt,
        balance -> BigInt,
    }
}

pub struct Msg {
    pub id: i64,
}

#[derive(Debug)]
pub enum AppError {
    Db(diesel::result::Error),
    Inbox(inbox_diesel::Error),
    Overdrawn,
}

impl From<diesel::result::Error> for AppError {
    fn from(e: diesel::result::Error) -> Self {
        AppError::Db(e)
    }
}

impl inbox_diesel::HasDieselError for AppError {
    fn diesel_error(&self) -> Option<&diesel::result::Error> {
        match self {
            AppError::Db(e) => Some(e),
            _ => None,
        }
    }
}

impl From<inbox_diesel::Error> for AppError {
    fn from(e: inbox_diesel::Error) -> Self {
        AppError::Inbox(e)
    }
}

#[idempotent(consumer = "scores", key = msg.id)]
fn score(conn: &mut SqliteConnection, msg: &Msg) -> Result<i64, AppError> {
    let score = accounts::table
        .find(msg.id)
        .select(accounts::balance)
        .first(conn)?;
    tracing::info!(score, "scored");
    println!("{score}");
    assert_eq!(score, score);
    Ok(score)
}

#[idempotent(consumer = "debits", key = msg.id)]
fn debit(conn: &mut SqliteConnection, msg: &Msg) -> Result<(), AppError> {
    let balance: i64 = accounts::table
        .find(msg.id)
        .select(accounts::balance)
        .first(conn)?;
    if balance < 1 {
        return Err(AppError::Overdrawn);
    }
    match diesel::update(accounts::table.find(msg.id))
        .set(accounts::balance.eq(balance - 1))
        .execute(conn)
    {
        Ok(_) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

static DELETES: std::sync::LazyLock<inbox_diesel::handler::Handler> =
    std::sync::LazyLock::new(|| inbox_diesel::handler::Handler::new("deletes").unwrap());

fn closure_body(
    conn: &mut SqliteConnection,
    id: &str,
) -> Result<inbox_diesel::Outcome<usize>, AppError> {
    inbox_diesel::handler::run_once(
        conn,
        &DELETES,
        id,
        guarded!(|tx| {
            match diesel::sql_query("DELETE FROM accounts").execute(tx) {
                Ok(n) => Ok(n),
                Err(e) => Err(e.into()),
            }
        }),
    )
}

fn main() {}
