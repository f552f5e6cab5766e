//! Async forms that compile: pooled handler connections, aliases and nested transactions of
//! the transaction, values that are not connections.
#![allow(unused_variables, dead_code)]

use std::collections::HashMap;

use diesel::{ExpressionMethods, QueryDsl};
use diesel_async::pooled_connection::deadpool::Object;
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use diesel_async::{AsyncConnection, RunQueryDsl};
use inbox_diesel::idempotent;

type Db = SyncConnectionWrapper<diesel::SqliteConnection>;

diesel::table! {
    accounts (id) {
        id -> Integer,
        balance -> BigInt,
    }
}

pub struct Msg {
    pub id: u64,
    pub amounts: Vec<i64>,
    pub headers: HashMap<String, String>,
}

async fn add(conn: &mut Db, amount: i64) -> diesel::QueryResult<usize> {
    diesel::update(accounts::table.find(1))
        .set(accounts::balance.eq(accounts::balance + amount))
        .execute(conn)
        .await
}

#[idempotent(consumer = "async-aliases", key = msg.id)]
pub async fn aliases(conn: &mut Db, msg: &Msg) -> diesel::QueryResult<()> {
    let c: &mut Db = &mut *conn;
    add(c, 1).await?;
    let maybe = Some(&mut *conn);
    if let Some(c) = maybe {
        add(c, 2).await?;
    }
    conn.transaction(async |c| add(c, 4).await).await?;
    for amount in &msg.amounts {
        add(conn, *amount).await?;
    }
    let header = msg.headers.get("k").map_or(0, |v| v.len() as i64);
    add(conn, header).await?;
    Ok(())
}

/// A handler that is given a deadpool checkout as its connection.
pub async fn pump(pooled: &mut Object<Db>, msg: &Msg) -> diesel::QueryResult<()> {
    aliases(pooled, msg).await.map(drop)
}

fn main() {}
