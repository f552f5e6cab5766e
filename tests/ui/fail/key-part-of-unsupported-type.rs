// The handlers here never run; only the error is under test.
#![allow(unused_variables, unused_imports)]

use diesel::prelude::*;
use inbox_diesel::idempotent;

#[idempotent(consumer = "credit", key = (account, amount))]
fn on_credit(conn: &mut SqliteConnection, account: i64, amount: f64) -> QueryResult<()> {
    Ok(())
}
fn main() {}
