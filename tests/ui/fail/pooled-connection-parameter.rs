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

use diesel::r2d2::{ConnectionManager, PooledConnection};

#[idempotent(consumer = "credit", key = msg.id, conn = conn)]
fn on_credit(
    conn: &mut SqliteConnection,
    audit: &mut PooledConnection<ConnectionManager<SqliteConnection>>,
    msg: &Msg,
) -> QueryResult<()> {
    Ok(())
}

fn main() {}
