// The handlers here never run; only the error is under test.
#![allow(unused_variables, unused_imports, dead_code)]

use std::sync::LazyLock;

use diesel::{ExpressionMethods, QueryDsl};
use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use diesel_async::RunQueryDsl;
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
}

static POOL: LazyLock<Pool<Db>> = LazyLock::new(|| {
    Pool::builder(AsyncDieselConnectionManager::<Db>::new(":memory:")).build().unwrap()
});

#[idempotent(consumer = "credit", key = msg.id)]
async fn on_credit(conn: &mut Db, msg: &Msg) -> diesel::QueryResult<()> {
    let mut pooled = POOL.get().await.expect("a pooled connection");
    diesel::update(accounts::table)
        .set(accounts::balance.eq(accounts::balance + 10))
        .execute(&mut pooled)
        .await?;
    Ok(())
}

fn main() {}
