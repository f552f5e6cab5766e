// Each mode returns the outcome type that holds only what it can answer: a transaction-mode
// handler cannot be `InFlight`, and a claim-mode handler that takes expired claims over
// cannot report a `StaleClaim`. A pump that expects them is told so by the compiler.

use diesel::prelude::*;
use inbox_diesel::{InFlightOutcome, Outcome, idempotent};

pub struct Msg {
    pub id: u64,
}

#[idempotent(consumer = "credit", key = msg.id)]
fn credit(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    diesel::sql_query("UPDATE accounts SET balance = balance + 1").execute(conn)?;
    Ok(())
}

#[idempotent(consumer = "mail", key = msg.id, mode = "claim")]
fn mail(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    Ok(())
}

fn pump(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    match credit(conn, msg)? {
        Outcome::Processed(()) | Outcome::Duplicate { .. } => {}
        Outcome::InFlight { .. } => {}
    }
    match mail(conn, msg)? {
        InFlightOutcome::Processed(()) | InFlightOutcome::Duplicate { .. } => {}
        InFlightOutcome::InFlight { .. } => {}
        InFlightOutcome::StaleClaim { .. } => {}
    }
    Ok(())
}

fn main() {
    let _ = pump;
}
