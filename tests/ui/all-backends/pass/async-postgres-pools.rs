//! An async handler on `&mut AsyncPgConnection`, called with deadpool and bb8 connections.

use diesel::ExpressionMethods;
use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use inbox_diesel::{Outcome, idempotent};

diesel::table! {
    accounts (id) {
        id -> Integer,
        balance -> BigInt,
    }
}

pub struct Msg {
    pub id: inbox_diesel::Uuid,
}

#[idempotent(consumer = "credit", key = msg.id, isolation = "repeatable read")]
pub async fn credit(conn: &mut AsyncPgConnection, msg: &Msg) -> diesel::QueryResult<()> {
    diesel::update(accounts::table).set(accounts::balance.eq(0)).execute(conn).await?;
    Ok(())
}

pub async fn through_deadpool(pool: &diesel_async::pooled_connection::deadpool::Pool<AsyncPgConnection>, msg: &Msg) {
    let mut pooled = pool.get().await.unwrap();
    let _: diesel::QueryResult<Outcome<()>> = credit(&mut pooled, msg).await;
}

pub async fn through_bb8(pool: &diesel_async::pooled_connection::bb8::Pool<AsyncPgConnection>, msg: &Msg) {
    let mut pooled = pool.get().await.unwrap();
    let _: diesel::QueryResult<Outcome<()>> = credit(&mut pooled, msg).await;
}

fn main() {
    let _ = AsyncDieselConnectionManager::<AsyncPgConnection>::new("postgres://localhost/test");
}
