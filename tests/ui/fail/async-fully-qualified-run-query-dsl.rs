// The handlers here never run; only the error is under test.
#![allow(unused_variables, unused_imports, dead_code)]

use diesel::ExpressionMethods;
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
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

#[idempotent(consumer = "credit", key = msg.id)]
async fn on_credit(conn: &mut Db, audit: &tokio::sync::Mutex<Db>, msg: &Msg) -> diesel::QueryResult<()> {
    let query = diesel::update(accounts::table).set(accounts::balance.eq(0));
    diesel_async::RunQueryDsl::execute(query, &mut *audit.lock().await).await?;
    Ok(())
}

fn main() {}
