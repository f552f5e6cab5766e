// Durations the servers cannot honour are refused where they are written: a lease that would
// overflow timestamp arithmetic (and read as released), a busy timeout SQLite would wrap to
// no wait at all. The handlers here never run; only the errors are under test.
#![allow(unused_variables, unused_imports)]

use diesel::prelude::*;
use inbox_diesel::idempotent;

pub struct Msg {
    pub id: u64,
}

#[idempotent(consumer = "mail", key = msg.id, mode = "claim", lease_ms = 18446744073709551615)]
fn lease_too_long(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    Ok(())
}

// Not a number of milliseconds: a setting is an expression of type u64.
#[idempotent(consumer = "mail", key = msg.id, mode = "claim", lease_ms = "60s")]
fn lease_as_text(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    Ok(())
}

pub struct Settings {
    pub lease: std::time::Duration,
}

// A setting of another type than u64.
#[idempotent(consumer = "mail", key = msg.id, mode = "claim", lease_ms = settings.lease)]
fn lease_as_a_duration(
    conn: &mut SqliteConnection,
    msg: &Msg,
    settings: &Settings,
) -> QueryResult<()> {
    Ok(())
}

#[idempotent(consumer = "credit", key = msg.id, busy_timeout_ms = 2147483648)]
fn busy_timeout_too_long(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    Ok(())
}

fn main() {}
