// The handlers here never run; only the error is under test.
#![allow(unused_variables, unused_imports)]

use diesel::prelude::*;
use inbox_diesel::idempotent;

const PREFIX: &str = "credit";

// A format string whose braces name no parameter: one key for every message.
#[idempotent(consumer = "credit", key = format!("{PREFIX}/{{account}}"))]
fn on_credit(conn: &mut SqliteConnection, account: i64) -> QueryResult<()> {
    Ok(())
}
fn main() {}
