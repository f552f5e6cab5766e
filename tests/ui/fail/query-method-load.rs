// The handlers here never run; only the error is under test.
#![allow(unused_variables, unused_imports, dead_code)]

use std::sync::{LazyLock, Mutex};

use diesel::prelude::*;
use inbox_diesel::idempotent;

diesel::table! {
    accounts (id) {
        id -> Integer,
        balance -> BigInt,
    }
}

#[derive(QueryableByName)]
pub struct Row {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub balance: i64,
}

pub struct Msg {
    pub id: u64,
}

/// A connection that is not the handler's.
static OTHER: LazyLock<Mutex<SqliteConnection>> =
    LazyLock::new(|| Mutex::new(SqliteConnection::establish(":memory:").unwrap()));

#[idempotent(consumer = "credit", key = msg.id)]
fn on_credit(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    // Text is not told apart from a write: refused on another connection, even a read.
    let rows: Vec<Row> = diesel::sql_query("UPDATE accounts SET balance = 0 RETURNING balance")
        .load(&mut *OTHER.lock().unwrap())?;
    Ok(())
}

fn main() {}
