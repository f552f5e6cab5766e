// A spawned thread or task runs where neither the handler's transaction nor the run-time net
// follows: a closure or an `async` block handed to a spawn may capture no connection or pool,
// even one it only reads with.
#![allow(unused_variables, dead_code)]

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::r2d2::{ConnectionManager, Pool};
use inbox_diesel::idempotent;

diesel::table! {
    accounts (id) {
        id -> BigInt,
        balance -> BigInt,
    }
}

pub struct Msg {
    pub id: u64,
}

type DbPool = Pool<ConnectionManager<SqliteConnection>>;

fn audit_pool() -> DbPool {
    Pool::builder().build_unchecked(ConnectionManager::new(":memory:"))
}

#[idempotent(consumer = "threads", key = msg.id)]
fn threads(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let pool = audit_pool();
    let id = msg.id;
    std::thread::spawn(move || {
        let mut audit = pool.get().unwrap();
        let rows: Vec<(i64, i64)> = accounts::table.load(&mut audit).unwrap();
        println!("{id}");
    });
    let mut checkout = audit_pool().get().unwrap();
    std::thread::scope(|s| {
        s.spawn(|| checkout.batch_execute("UPDATE accounts SET balance = 0"));
    });
    Ok(())
}

#[idempotent(consumer = "tasks", key = msg.id)]
async fn tasks(
    conn: &mut diesel_async::sync_connection_wrapper::SyncConnectionWrapper<SqliteConnection>,
    msg: &Msg,
) -> QueryResult<()> {
    let pool = audit_pool();
    tokio::spawn(async move {
        let _ = pool.get();
    });
    let audit = audit_pool();
    tokio::task::spawn_blocking(move || audit.state());
    Ok(())
}

fn main() {}
