// The handlers here never run; only the errors are under test.
#![allow(unused_variables, unused_imports)]

use diesel::prelude::*;
use inbox_diesel::idempotent;

pub struct Msg {
    pub id: u64,
}

#[idempotent(consumer = "credit", key = msg.id, on_locked = "skip")]
fn unknown_choice(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    Ok(())
}

#[idempotent(consumer = "credit", key = msg.id, on_locked = in_flight)]
fn not_a_string(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    Ok(())
}

#[idempotent(consumer = "credit", batch = msgs, key = |msg| msg.id, on_locked = "in_flight")]
fn of_a_batch(conn: &mut SqliteConnection, msgs: &[Msg]) -> QueryResult<()> {
    Ok(())
}

#[idempotent(consumer = "email", key = msg.id, mode = "claim", on_locked = "in_flight")]
fn in_claim_mode(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    Ok(())
}

fn main() {}
