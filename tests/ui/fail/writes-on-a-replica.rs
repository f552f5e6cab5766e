// A read may run on another connection only when diesel's query builder made it a
// `SELECT`: SQL text — even a `SELECT` — and any statement run by `execute` are refused
// there, sync and async, whatever method runs them.
#![allow(unused_variables, dead_code)]

use diesel::prelude::*;
use diesel::r2d2::{ConnectionManager, Pool};
use inbox_diesel::idempotent;

diesel::table! {
    accounts (id) {
        id -> BigInt,
        balance -> BigInt,
    }
}

#[derive(QueryableByName)]
pub struct Row {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub balance: i64,
}

pub struct Msg {
    pub id: u64,
}

pub struct Ctx {
    pub replica: Pool<ConnectionManager<SqliteConnection>>,
}

#[idempotent(consumer = "writes", key = msg.id)]
fn writes(conn: &mut SqliteConnection, msg: &Msg, ctx: &Ctx) -> QueryResult<()> {
    let mut replica = ctx.replica.get().unwrap();
    let rows: Vec<Row> =
        diesel::sql_query("UPDATE accounts SET balance = 0 RETURNING balance").load(&mut replica)?;
    let row: Row = diesel::sql_query("SELECT balance FROM accounts").get_result(&mut replica)?;
    diesel::insert_into(accounts::table)
        .values(accounts::balance.eq(1))
        .execute(&mut replica)?;
    Ok(())
}

mod asynchronous {
    use diesel::{QueryResult, SqliteConnection};
    use diesel_async::RunQueryDsl;
    use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
    use inbox_diesel::idempotent;

    use super::{Msg, Row};

    type Conn = SyncConnectionWrapper<SqliteConnection>;

    pub struct Ctx {
        pub replica: diesel_async::pooled_connection::deadpool::Pool<Conn>,
    }

    #[idempotent(consumer = "async-writes", key = msg.id)]
    async fn writes(conn: &mut Conn, msg: &Msg, ctx: &Ctx) -> QueryResult<()> {
        let rows: Vec<Row> = diesel::sql_query("DELETE FROM accounts RETURNING balance")
            .get_results(&mut ctx.replica.get().await.unwrap())
            .await?;
        Ok(())
    }
}

fn main() {}
