// The handlers here never run; only the errors are under test.
#![allow(unused_variables, unused_imports, dead_code)]

use diesel::prelude::*;
use inbox_diesel::idempotent;

diesel::table! {
    accounts (id) {
        id -> Integer,
        balance -> BigInt,
    }
}

pub struct Msg {
    pub id: u64,
}

/// The application's enum of connections.
#[derive(diesel::MultiConnection, inbox_diesel::MultiConnection)]
pub enum Db {
    Sqlite(SqliteConnection),
}

/// Another enum of connections, as the handler's parameter beside its own: a write
/// through it would commit on its own, outside the handler's transaction.
#[idempotent(consumer = "credit", key = msg.id, conn = conn)]
fn credit(conn: &mut Db, audit: &mut Db, msg: &Msg) -> QueryResult<()> {
    diesel::update(accounts::table)
        .set(accounts::balance.eq(accounts::balance + 1))
        .execute(audit)?;
    Ok(())
}

/// Another enum of connections taken apart: its variant is not the handler's transaction.
#[idempotent(consumer = "credit", key = msg.id, conn = conn)]
fn credit_variant(conn: &mut Db, audit: &mut Db, msg: &Msg) -> QueryResult<()> {
    match audit {
        Db::Sqlite(sqlite) => diesel::sql_query("UPDATE accounts SET balance = 2").execute(sqlite)?,
    };
    Ok(())
}

/// Not an enum.
#[derive(inbox_diesel::MultiConnection)]
pub struct Single(SqliteConnection);

/// A variant that holds more than one connection.
#[derive(inbox_diesel::MultiConnection)]
pub enum Pair {
    Both(SqliteConnection, SqliteConnection),
}

/// A variant whose type is no connection of the runtime's.
#[derive(inbox_diesel::MultiConnection)]
pub enum NotAConnection {
    Text(String),
}

fn main() {}
