// The handlers here never run; only the error is under test.
#![allow(unused_variables, unused_imports, dead_code)]

use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use inbox_diesel::idempotent;

type Db = SyncConnectionWrapper<diesel::SqliteConnection>;

pub struct Msg {
    pub id: u64,
}

/// An async body may run more than once, so it may not mutate what it captures.
#[idempotent(consumer = "credit", key = msg.id, conn = conn)]
async fn on_credit(conn: &mut Db, msg: &Msg, seen: &mut Vec<u64>) -> diesel::QueryResult<()> {
    seen.push(msg.id);
    Ok(())
}

fn main() {}
