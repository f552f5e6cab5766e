// MySQL and MariaDB ignore trailing spaces when they compare names: `credit ` would share the
// markers of `credit` there. The handlers here never run; only the errors are under test.
#![allow(unused_variables, unused_imports)]

use diesel::prelude::*;
use inbox_diesel::idempotent;

pub struct Msg {
    pub id: u64,
}

#[idempotent(consumer = "credit ", key = msg.id)]
fn trailing(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    Ok(())
}

#[idempotent(consumer = " credit", key = msg.id)]
fn leading(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    Ok(())
}

fn main() {}
