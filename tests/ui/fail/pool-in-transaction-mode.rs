// The handlers here never run; only the error is under test.
#![allow(unused_variables, unused_imports)]

use diesel::prelude::*;
use diesel::r2d2::{ConnectionManager, Pool};
use inbox_diesel::idempotent;

pub struct Msg {
    pub id: u64,
}

// A pool carries the claim and the stamp of claim mode; a transaction-mode body runs in one
// transaction on one connection.
#[idempotent(consumer = "credit", key = msg.id)]
fn on_credit(pool: &Pool<ConnectionManager<SqliteConnection>>, msg: &Msg) -> QueryResult<()> {
    Ok(())
}
fn main() {}
