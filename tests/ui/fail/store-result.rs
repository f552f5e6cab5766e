// The handlers here never run; only the errors are under test: `store_result` and
// `fingerprint` where they cannot apply.
#![allow(unused_variables, unused_imports)]

use diesel::prelude::*;
use inbox_diesel::idempotent;

pub struct Msg {
    pub id: u64,
}

/// Not serde's: it could not be stored, nor read back.
pub struct Receipt {
    pub id: u64,
}

#[idempotent(consumer = "credit", batch = msgs, key = |msg| msg.id, store_result = true)]
fn stored_result_of_a_batch(conn: &mut SqliteConnection, msgs: &[Msg]) -> QueryResult<u64> {
    Ok(7)
}

#[idempotent(consumer = "credit", key = msg.id, store_result = "yes")]
fn store_result_not_a_bool(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<u64> {
    Ok(7)
}

#[idempotent(consumer = "credit", key = msg.id, store_result = true)]
fn stored_result_not_serde(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<Receipt> {
    Ok(Receipt { id: msg.id })
}

#[idempotent(consumer = "credit", batch = msgs, key = |msg| msg.id, fingerprint = msgs.len().to_string())]
fn fingerprint_of_a_batch(conn: &mut SqliteConnection, msgs: &[Msg]) -> QueryResult<()> {
    Ok(())
}

/// A fingerprint is of bytes: a number is not.
#[idempotent(consumer = "credit", key = msg.id, fingerprint = msg.id)]
fn fingerprint_not_bytes(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    Ok(())
}

fn main() {}
