// The handlers here never run; only the errors are under test.
#![allow(unused_variables, unused_imports)]

use diesel::prelude::*;
use inbox_diesel::idempotent;

pub struct Msg {
    pub id: u64,
}

#[idempotent(consumer = "jobs", key = msg.id, transaction = "callers")]
fn unknown_transaction(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    Ok(())
}

// Each option that needs a transaction of the handler's own, refused at its token.
#[idempotent(
    consumer = "jobs",
    key = msg.id,
    transaction = "caller",
    retries = 3,
    isolation = "serializable",
    precheck = true,
    idle_in_transaction_ms = 5000,
    on_locked = "in_flight"
)]
fn own_transaction_options(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    Ok(())
}

#[idempotent(consumer = "jobs", key = msg.id, transaction = "caller", mode = "claim")]
fn claim_mode_in_the_callers_transaction(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    Ok(())
}

#[idempotent(consumer = "jobs", batch = msgs, key = |msg| msg.id, transaction = "caller")]
fn batch_in_the_callers_transaction(conn: &mut SqliteConnection, msgs: &[Msg]) -> QueryResult<()> {
    Ok(())
}

#[idempotent(consumer = "jobs", key = msg.id, transaction = "caller_or_own", retries = 3)]
fn retried_where_it_may_join(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    Ok(())
}

fn main() {}
