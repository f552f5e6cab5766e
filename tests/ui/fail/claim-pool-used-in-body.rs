// The handlers here never run; only the error is under test.
#![allow(unused_variables, unused_imports)]

use diesel::prelude::*;
use diesel::r2d2::{ConnectionManager, Pool};
use inbox_diesel::idempotent;

pub struct Msg {
    pub id: i64,
}

// On a pool as on a connection, a claim-mode body runs outside any transaction: it is given
// `NoConnection` in the pool's place.
#[idempotent(consumer = "mail", key = msg.id, mode = "claim")]
fn on_signup(pool: &Pool<ConnectionManager<SqliteConnection>>, msg: &Msg) -> QueryResult<()> {
    let mut conn = pool.get().unwrap();
    diesel::sql_query("INSERT INTO sent VALUES (1)").execute(&mut *conn)?;
    Ok(())
}
fn main() {}
