// The handlers here never run; only the errors are under test.
#![allow(unused_variables, unused_imports)]

use diesel::prelude::*;
use inbox_diesel::idempotent;

pub struct Msg {
    pub id: u64,
}

#[idempotent(consumer = "email", key = msg.id, mode = "claims")]
fn unknown_mode(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    Ok(())
}

#[idempotent(consumer = "email", key = msg.id, lease_ms = 30000, on_expired = "report")]
fn claim_options_in_transaction_mode(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    Ok(())
}

#[idempotent(consumer = "email", key = msg.id, mode = "claim", isolation = "serializable")]
fn isolation_in_claim_mode(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    Ok(())
}

#[idempotent(consumer = "email", key = msg.id, mode = "claim", lease_ms = 99, on_expired = "retry")]
fn bad_lease_and_policy(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    Ok(())
}

fn main() {}
