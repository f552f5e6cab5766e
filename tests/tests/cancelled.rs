//! A handler cancelled mid-body on MariaDB (`INBOX_TEST_MYSQL`): its pooled connection goes
//! back to the pool with the transaction open, and the server ends that transaction once it
//! has sat idle for `idle_in_transaction_ms` (MariaDB's `idle_transaction_timeout`), so the
//! redelivery waiting on the marker's lock goes on. A handler that ends normally puts the
//! session's own setting back. (PostgreSQL's bound: `port.rs`.)
#![cfg(feature = "mysql")]

use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::{AsyncMysqlConnection, RunQueryDsl};
use inbox_diesel::idempotent;
use inbox_tests::mysql::MysqlDb;
use inbox_tests::server::count;

#[idempotent(consumer = "slow", key = *id, idle_in_transaction_ms = 1000)]
async fn slow(conn: &mut AsyncMysqlConnection, id: &u64, stall: bool) -> diesel::QueryResult<()> {
    diesel::sql_query("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
        .execute(conn)
        .await?;
    if stall {
        tokio::time::sleep(Duration::from_secs(60)).await;
    }
    Ok(())
}

fn is_mariadb(db: &MysqlDb) -> bool {
    count(
        &mut db.connect(),
        "SELECT CAST(VERSION() LIKE '%MariaDB%' AS SIGNED) AS n",
    ) == 1
}

#[test]
fn a_cancelled_handler_holds_the_marker_only_as_long_as_its_bound() {
    let db = MysqlDb::new("cancelled_bound");
    assert!(
        is_mariadb(&db),
        "INBOX_TEST_MYSQL must name a MariaDB server: MySQL has no bound on idle transactions"
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let pool = Pool::builder(AsyncDieselConnectionManager::<AsyncMysqlConnection>::new(
            db.url(),
        ))
        .max_size(1)
        .build()
        .unwrap();
        let mut conn = pool.get().await.unwrap();
        let cancelled =
            tokio::time::timeout(Duration::from_millis(300), slow(&mut conn, &1, true)).await;
        assert!(cancelled.is_err(), "{cancelled:?}");
        drop(conn); // back to the pool, its transaction open and its marker locked
        let mut other = db.connect_async().await;
        // InnoDB's lock wait is 50 s by default: only the bound ends the wait sooner.
        let redelivered =
            tokio::time::timeout(Duration::from_secs(20), slow(&mut other, &1, false))
                .await
                .expect("the marker's lock was released within the bound");
        assert!(redelivered.unwrap().is_processed());
    });
    let balance = count(
        &mut db.connect(),
        "SELECT balance AS n FROM accounts WHERE id = 1",
    );
    assert_eq!(
        balance, 1,
        "the cancelled attempt rolled back; the redelivery applied once"
    );
}

#[idempotent(consumer = "quick", key = *id)]
fn quick(conn: &mut diesel::MysqlConnection, id: &u64, fail: bool) -> diesel::QueryResult<()> {
    conn.batch_execute("UPDATE accounts SET balance = balance + 1 WHERE id = 1")?;
    match fail {
        true => Err(diesel::result::Error::RollbackTransaction),
        false => Ok(()),
    }
}

/// The bound is the handler transaction's: processed, duplicate or failed, the session's
/// own `idle_transaction_timeout` is what it was before — on the sync and the async
/// connection.
#[test]
fn the_sessions_own_setting_is_put_back() {
    let db = MysqlDb::new("idle_restored");
    assert!(
        is_mariadb(&db),
        "INBOX_TEST_MYSQL must name a MariaDB server"
    );
    let setting = "SELECT @@SESSION.idle_transaction_timeout AS n";

    let mut conn = db.connect();
    conn.batch_execute("SET SESSION idle_transaction_timeout = 3600")
        .unwrap();
    assert!(quick(&mut conn, &1, false).unwrap().is_processed());
    assert_eq!(count(&mut conn, setting), 3600);
    assert!(quick(&mut conn, &1, false).unwrap().is_duplicate());
    assert_eq!(count(&mut conn, setting), 3600);
    assert!(quick(&mut conn, &2, true).is_err());
    assert_eq!(count(&mut conn, setting), 3600);

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut conn = db.connect_async().await;
        assert!(slow(&mut conn, &3, false).await.unwrap().is_processed());
        assert!(slow(&mut conn, &3, false).await.unwrap().is_duplicate());
        #[derive(diesel::QueryableByName)]
        struct Setting {
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            n: i64,
        }
        let after: Setting = diesel::sql_query(setting)
            .get_result(&mut conn)
            .await
            .unwrap();
        assert_eq!(after.n, 0, "the server's default, as before");
    });
}
