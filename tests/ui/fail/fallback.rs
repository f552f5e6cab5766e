// After an error in the attribute, the function keeps the signature the expansion would have
// given it: callers that use the outcome type-check, and the attribute's error is the only
// one — no "expected `Outcome`, found `()`" after it, no unused parameters.

use diesel::prelude::*;
use inbox_diesel::{BatchOutcome, Outcome, StaleClaimOutcome, idempotent};

pub struct Msg {
    pub id: u64,
}

#[idempotent(consumer = "credit")]
fn missing_key(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    Ok(())
}

#[idempotent(consumer = "credit", key = msg.id, retry = 3)]
fn unknown_option(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<u32> {
    Ok(7)
}

#[idempotent(consumer = 5, batch = msgs, key = |m| m.id)]
fn batch_with_a_bad_consumer(conn: &mut SqliteConnection, msgs: &[Msg]) -> QueryResult<()> {
    Ok(())
}

#[idempotent(consumer = "mail", key = msg.id, mode = "claim", on_expired = "report", lease_ms = 0)]
fn claim_with_a_zero_lease(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    Ok(())
}

#[idempotent(consumer = "credit", key = msg.id, isolation = "snapshot")]
async fn async_with_a_bad_isolation(
    conn: &mut diesel_async::sync_connection_wrapper::SyncConnectionWrapper<SqliteConnection>,
    msg: &Msg,
) -> QueryResult<()> {
    Ok(())
}

fn pump(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    match missing_key(conn, msg)? {
        Outcome::Processed(()) => {}
        Outcome::Duplicate { .. } => {}
    }
    if let Outcome::Processed(n) = unknown_option(conn, msg)? {
        let _: u32 = n;
    }
    match claim_with_a_zero_lease(conn, msg)? {
        StaleClaimOutcome::Processed(()) | StaleClaimOutcome::Duplicate { .. } => {}
        StaleClaimOutcome::InFlight { .. } | StaleClaimOutcome::StaleClaim { .. } => {}
    }
    let outcome: BatchOutcome<()> = batch_with_a_bad_consumer(conn, &[])?;
    let _ = outcome.processed;
    Ok(())
}

async fn pump_async(
    conn: &mut diesel_async::sync_connection_wrapper::SyncConnectionWrapper<SqliteConnection>,
    msg: &Msg,
) -> QueryResult<bool> {
    Ok(async_with_a_bad_isolation(conn, msg).await?.is_processed())
}

fn main() {
    let _ = (pump, pump_async);
}
