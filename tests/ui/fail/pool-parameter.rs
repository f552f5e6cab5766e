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

use diesel::r2d2::{ConnectionManager, Pool};

fn audit(pool: &Pool<ConnectionManager<SqliteConnection>>) -> QueryResult<usize> {
    diesel::sql_query("INSERT INTO audit VALUES (1)").execute(&mut pool.get().unwrap())
}

// A pool parameter may be a replica's, read through its checkouts; handed on whole, or its
// checkout handed to a write, it is refused.
#[idempotent(consumer = "credit", key = msg.id)]
fn on_credit(
    conn: &mut SqliteConnection,
    msg: &Msg,
    pool: &Pool<ConnectionManager<SqliteConnection>>,
) -> QueryResult<()> {
    audit(pool)?;
    diesel::update(accounts::table)
        .set(accounts::balance.eq(0))
        .execute(&mut pool.get().unwrap())?;
    Ok(())
}

fn main() {}
