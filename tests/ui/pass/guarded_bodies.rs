// Bodies of the function API that pass the guard: the transaction, reborrows of it, helpers
// given it, captured values that are not connections, a stored result, an async body.
#![allow(dead_code)]

use std::sync::LazyLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use inbox_diesel::handler::{Handler, run_once, run_once_stored};
use inbox_diesel::{Outcome, guarded};

static CREDIT: LazyLock<Handler> = LazyLock::new(|| Handler::new("credit").unwrap());

fn helper(conn: &mut SqliteConnection, amount: i64) -> QueryResult<usize> {
    diesel::sql_query("UPDATE accounts SET balance = balance + ?")
        .bind::<diesel::sql_types::BigInt, _>(amount)
        .execute(conn)
}

fn credit(conn: &mut SqliteConnection, id: &str, amount: i64, seen: &AtomicUsize) -> QueryResult<Outcome<()>> {
    run_once(conn, &CREDIT, id, guarded!(|tx| {
        seen.fetch_add(1, Ordering::Relaxed);
        helper(tx, amount)?;
        helper(&mut *tx, amount)?;
        let again = &mut *tx;
        again.batch_execute("SELECT 1")?;
        // `?` inside a macro's arguments leaves the body as it would anywhere else.
        let changed = format!("{} rows", helper(tx, 0)?);
        if changed.is_empty() {
            return Err(diesel::result::Error::NotFound);
        }
        Ok(())
    }))
}

fn stored(conn: &mut SqliteConnection, id: &str) -> QueryResult<Outcome<String>> {
    let label = format!("receipt for {id}");
    run_once_stored(conn, &CREDIT, id, Some(inbox_diesel::Fingerprint::of(id)), guarded!(
        move |tx: &mut SqliteConnection| -> QueryResult<String> {
            tx.batch_execute("SELECT 1")?;
            Ok(label.clone())
        }
    ))
}

/// Exits a macro writes: `anyhow::bail!`, `ensure!`, `?` inside `vec!`'s repeat form.
fn exits_from_macros(conn: &mut SqliteConnection, id: &str, n: usize) -> anyhow::Result<Outcome<usize>> {
    run_once(conn, &CREDIT, id, guarded!(|tx| {
        if n == 0 {
            anyhow::bail!("nothing to credit");
        }
        anyhow::ensure!(n < 100, "too many: {n}");
        let updated = vec![helper(tx, 1)?; n];
        Ok(updated.len())
    }))
}

/// A declared return type that a `return` coerces to.
fn coerced(conn: &mut SqliteConnection, id: &str) -> QueryResult<Outcome<String>> {
    run_once_stored(conn, &CREDIT, id, None, guarded!(|tx| -> QueryResult<String> {
        let shown: Box<dyn std::fmt::Display> = Box::new(helper(tx, 0)?);
        if shown.to_string().is_empty() {
            return Ok(String::new());
        }
        Ok(shown.to_string())
    }))
}

mod asynchronous {
    use diesel::SqliteConnection;
    use diesel_async::RunQueryDsl;
    use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
    use inbox_diesel::handler::run_once_async;
    use inbox_diesel::{Outcome, guarded};

    type AsyncSqlite = SyncConnectionWrapper<SqliteConnection>;

    pub async fn credit_async(
        conn: &mut AsyncSqlite,
        id: &str,
    ) -> diesel::QueryResult<Outcome<usize>> {
        run_once_async(conn, &super::CREDIT, id, guarded!(async |tx: &mut AsyncSqlite| {
            if id.is_empty() {
                return Ok(0);
            }
            // `?` in a macro's argument, in an async body.
            let label = format!("{}", diesel::sql_query("SELECT 1").execute(&mut *tx).await?);
            if label.is_empty() {
                return Err(diesel::result::Error::NotFound);
            }
            let n = diesel::sql_query("UPDATE accounts SET balance = balance + 1")
                .execute(tx)
                .await?;
            Ok(n)
        }))
        .await
    }
}

fn main() {}
