// The bodies here never run; only the errors are under test.
#![allow(unused_variables, unused_imports, dead_code)]

use std::sync::LazyLock;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::r2d2::{ConnectionManager, Pool};
use inbox_diesel::guarded;
use inbox_diesel::handler::{Handler, run_once, run_once_stored};

static CREDIT: LazyLock<Handler> = LazyLock::new(|| Handler::new("credit").unwrap());

pub struct Context {
    pub pool: Pool<ConnectionManager<SqliteConnection>>,
}

/// A pool captured by the body: its connection commits on its own.
fn captured_pool(conn: &mut SqliteConnection, ctx: &Context, id: u64) -> QueryResult<()> {
    run_once(conn, &CREDIT, &id, guarded!(|tx| {
        let mut audit = ctx.pool.get().unwrap();
        audit.batch_execute("INSERT INTO audit VALUES (1)")?;
        tx.batch_execute("UPDATE accounts SET balance = balance + 1")
    }))?;
    Ok(())
}

/// A second connection captured from the caller.
fn captured_connection(
    conn: &mut SqliteConnection,
    other: &mut SqliteConnection,
    id: u64,
) -> QueryResult<()> {
    run_once(conn, &CREDIT, &id, guarded!(|tx| {
        diesel::sql_query("INSERT INTO audit VALUES (1)").execute(other)?;
        Ok(())
    }))?;
    Ok(())
}

/// The transaction's name shadowed by another connection.
fn shadowed(conn: &mut SqliteConnection, id: u64) -> QueryResult<()> {
    run_once(conn, &CREDIT, &id, guarded!(|tx| {
        let tx = &mut SqliteConnection::establish("other.sqlite").unwrap();
        tx.batch_execute("INSERT INTO audit VALUES (1)")
    }))?;
    Ok(())
}

mod asynchronous {
    use diesel::SqliteConnection;
    use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
    use diesel_async::{AsyncConnection, RunQueryDsl};
    use inbox_diesel::guarded;
    use inbox_diesel::handler::run_once_async;

    type AsyncSqlite = SyncConnectionWrapper<SqliteConnection>;

    /// An async body that opens a connection of its own.
    async fn established(conn: &mut AsyncSqlite, id: u64) -> diesel::QueryResult<()> {
        run_once_async(conn, &super::CREDIT, &id, guarded!(async |tx: &mut AsyncSqlite| {
            let mut other = AsyncSqlite::establish("other.sqlite").await.unwrap();
            diesel::sql_query("INSERT INTO audit VALUES (1)")
                .execute(&mut other)
                .await?;
            Ok(())
        }))
        .await?;
        Ok(())
    }
}

/// A stored-result body handing a pool to a helper.
fn helper_given_the_pool(conn: &mut SqliteConnection, ctx: &Context, id: u64) -> QueryResult<()> {
    fn audit(pool: &Pool<ConnectionManager<SqliteConnection>>) -> QueryResult<i64> {
        Ok(1)
    }
    run_once_stored(conn, &CREDIT, &id, None, guarded!(|tx| audit(&ctx.pool)))?;
    Ok(())
}

/// A closure that did not pass through `guarded!` is not a body of the function API.
fn unchecked(conn: &mut SqliteConnection, id: u64) -> QueryResult<()> {
    run_once(conn, &CREDIT, &id, |tx: &mut SqliteConnection| {
        tx.batch_execute("UPDATE accounts SET balance = balance + 1")
    })?;
    Ok(())
}

fn main() {}
