// The handlers here never run; only the error is under test.
#![allow(unused_variables, unused_imports)]

use diesel::prelude::*;
use inbox_diesel::idempotent;

pub struct Msg {
    pub id: u64,
}

/// A wrapper the runtime does not know.
pub struct TenantConnection(pub SqliteConnection);

#[idempotent(consumer = "credit", key = msg.id)]
fn on_credit(conn: &mut TenantConnection, msg: &Msg) -> QueryResult<()> {
    Ok(())
}

fn main() {}
