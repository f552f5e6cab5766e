// A body may run more than once (a deadlock retried in a fresh transaction): one that moves
// a parameter out is refused — sync, at the move; async, as the parameter's type not being
// `Clone` (the README's "Use it" says what each means). One that only reads the parameter
// compiles.
#![allow(unused_variables)]
use diesel::prelude::*;
use inbox_diesel::idempotent;

pub struct Note(pub String);

pub struct Msg {
    pub id: u64,
    pub note: Note,
}

fn keep(conn: &mut SqliteConnection, note: Note) -> QueryResult<()> {
    Ok(())
}

#[idempotent(consumer = "notes", key = msg.id)]
fn consumes(conn: &mut SqliteConnection, msg: Msg) -> QueryResult<()> {
    keep(conn, msg.note)?;
    Ok(())
}

#[idempotent(consumer = "notes", key = msg.id)]
async fn consumes_async(
    conn: &mut diesel_async::sync_connection_wrapper::SyncConnectionWrapper<SqliteConnection>,
    msg: Msg,
) -> QueryResult<()> {
    let note: Note = msg.note;
    Ok(())
}

#[idempotent(consumer = "notes", key = msg.id)]
async fn reads_async(
    conn: &mut diesel_async::sync_connection_wrapper::SyncConnectionWrapper<SqliteConnection>,
    msg: Msg,
) -> QueryResult<()> {
    let note: &str = &msg.note.0;
    Ok(())
}

fn main() {}
