// The handlers here never run; only the error is under test.
#![allow(unused_variables, unused_imports, dead_code)]

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use inbox_diesel::idempotent;

diesel::table! {
    sent_mail (id) {
        id -> Integer,
        message -> BigInt,
    }
}

pub struct Msg {
    pub id: i64,
}

fn deliver(msg: &Msg) -> QueryResult<()> {
    Ok(())
}

fn record(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<usize> {
    diesel::insert_into(sent_mail::table).values(sent_mail::message.eq(msg.id)).execute(conn)
}

// A claim-mode body runs outside any transaction: every statement on the handler's
// connection is refused, however it is reached.
#[idempotent(consumer = "email", key = msg.id, mode = "claim")]
fn send_welcome(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    deliver(msg)?;
    diesel::insert_into(sent_mail::table).values(sent_mail::message.eq(msg.id)).execute(conn)?;
    let sent: Vec<i32> = sent_mail::table.select(sent_mail::id).load(&mut *conn)?;
    conn.batch_execute("DELETE FROM sent_mail")?;
    record(conn, msg)?;
    let alias = &mut *conn;
    RunQueryDsl::execute(diesel::delete(sent_mail::table), alias)?;
    conn.transaction(|c| diesel::delete(sent_mail::table).execute(c))?;
    Ok(())
}

fn main() {}
