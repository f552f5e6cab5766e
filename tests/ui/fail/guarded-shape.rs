// The bodies here never run; only the errors are under test.
#![allow(unused_variables, unused_imports, dead_code)]

use std::sync::LazyLock;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use inbox_diesel::guarded;
use inbox_diesel::handler::{Handler, run_once, run_once_async};

type AsyncSqlite = SyncConnectionWrapper<SqliteConnection>;

static CREDIT: LazyLock<Handler> = LazyLock::new(|| Handler::new("credit").unwrap());

/// Not a closure.
fn not_a_closure(conn: &mut SqliteConnection, id: u64) -> QueryResult<()> {
    let body = |tx: &mut SqliteConnection| Ok(());
    run_once(conn, &CREDIT, &id, guarded!(body))?;
    Ok(())
}

/// No transaction parameter.
fn no_parameter(conn: &mut SqliteConnection, id: u64) -> QueryResult<()> {
    run_once(conn, &CREDIT, &id, guarded!(|| Ok(())))?;
    Ok(())
}

/// The transaction as a pattern the guard cannot follow.
fn wildcard(conn: &mut SqliteConnection, id: u64) -> QueryResult<()> {
    run_once(conn, &CREDIT, &id, guarded!(|_| Ok(())))?;
    Ok(())
}

/// A closure returning an async block instead of an async closure.
async fn async_block(conn: &mut AsyncSqlite, id: u64) -> QueryResult<()> {
    run_once_async(conn, &CREDIT, &id, guarded!(|tx: &mut AsyncSqlite| async move { Ok(()) }))
        .await?;
    Ok(())
}

fn main() {}
