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

pub struct Msg {
    pub id: u64,
}

/// A connection that is not the handler's.
static OTHER: LazyLock<Mutex<SqliteConnection>> =
    LazyLock::new(|| Mutex::new(SqliteConnection::establish(":memory:").unwrap()));

#[idempotent(consumer = "credit", key = msg.id)]
fn on_credit(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    // Establishing a connection writes nothing; running a statement on it is refused.
    let mut audit = SqliteConnection::establish("audit.sqlite").expect("audit database");
    diesel::sql_query("INSERT INTO audit VALUES (1)").execute(&mut audit)?;
    Ok(())
}

fn main() {}
