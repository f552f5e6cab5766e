// The handlers here never run; only the error is under test.
#![allow(unused_variables, unused_imports, dead_code)]

use std::sync::LazyLock;

use diesel::prelude::*;
use diesel::r2d2::{ConnectionManager, Pool};
use inbox_diesel::idempotent;

diesel::table! {
    accounts (id) {
        id -> Integer,
        balance -> BigInt,
    }
}

pub struct Msg {
    pub id: u64,
}

static POOL: LazyLock<Pool<ConnectionManager<SqliteConnection>>> =
    LazyLock::new(|| Pool::new(ConnectionManager::new(":memory:")).unwrap());

// The closure's statements run on the pooled connection's own transaction, which commits
// whatever the inbox decides.
#[idempotent(consumer = "credit", key = msg.id)]
fn on_credit(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let mut pooled = POOL.get().expect("a pooled connection");
    pooled.transaction(|c| diesel::update(accounts::table).set(accounts::balance.eq(0)).execute(c))?;
    Ok(())
}

fn main() {}
