// An application's enum of connections (diesel's `MultiConnection`) as the handler's
// connection: the DSL on the enum, a nested transaction on it, and the enum taken apart by
// its variant — each variant holds the connection the handler's transaction is open on.
#![allow(unused_variables, dead_code, irrefutable_let_patterns)]

use diesel::prelude::*;
use inbox_diesel::idempotent;

diesel::table! {
    accounts (id) {
        id -> BigInt,
        balance -> BigInt,
    }
}

pub struct Msg {
    pub id: i64,
}

#[derive(diesel::MultiConnection, inbox_diesel::MultiConnection)]
pub enum Db {
    Sqlite(SqliteConnection),
}

#[idempotent(consumer = "credit", key = msg.id)]
fn credit(conn: &mut Db, msg: &Msg) -> QueryResult<()> {
    diesel::update(accounts::table.find(msg.id))
        .set(accounts::balance.eq(accounts::balance + 1))
        .execute(conn)?;
    conn.transaction(|conn| {
        diesel::update(accounts::table)
            .set(accounts::balance.eq(0))
            .execute(conn)
    })?;
    // A statement of one backend's, on the variant (Vaultwarden's `db_run!` arms).
    match conn {
        Db::Sqlite(sqlite) => diesel::sql_query("UPDATE accounts SET balance = 2").execute(sqlite)?,
    };
    if let Db::Sqlite(sqlite) = conn {
        diesel::sql_query("UPDATE accounts SET balance = 3").execute(sqlite)?;
    }
    Ok(())
}

fn main() {}
