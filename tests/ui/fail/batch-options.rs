// The handlers here never run; only the errors are under test.
#![allow(unused_variables, unused_imports)]

use diesel::prelude::*;
use inbox_diesel::idempotent;

pub struct Msg {
    pub id: u64,
}

#[idempotent(consumer = "credit", batch = messages, key = |msg| msg.id)]
fn batch_names_no_parameter(conn: &mut SqliteConnection, msgs: &[Msg]) -> QueryResult<()> {
    Ok(())
}

#[idempotent(consumer = "credit", batch = msgs, key = msgs.len())]
fn key_is_not_a_closure(conn: &mut SqliteConnection, msgs: &[Msg]) -> QueryResult<()> {
    Ok(())
}

#[idempotent(consumer = "credit", batch = msgs, key = |msg| 7)]
fn key_ignores_its_message(conn: &mut SqliteConnection, msgs: &[Msg]) -> QueryResult<()> {
    Ok(())
}

#[idempotent(consumer = "email", batch = msgs, key = |msg| msg.id, mode = "claim")]
fn batch_in_claim_mode(conn: &mut SqliteConnection, msgs: &[Msg]) -> QueryResult<()> {
    Ok(())
}

#[idempotent(consumer = "credit", batch = msgs, key = |msg| msg.id, precheck = true)]
fn precheck_of_a_batch(conn: &mut SqliteConnection, msgs: &[Msg]) -> QueryResult<()> {
    Ok(())
}

fn main() {}
