//! A purge dropped by a timeout leaves no lock behind: the next purge — on another
//! connection, or on the same one — runs. PostgreSQL and MariaDB, through diesel-async.

#[cfg(any(feature = "postgres", feature = "mysql"))]
use std::time::Duration;

#[cfg(any(feature = "postgres", feature = "mysql"))]
use inbox_diesel::InboxSchema;
#[cfg(any(feature = "postgres", feature = "mysql"))]
use inbox_diesel::purge::{Purge, purge, purge_async};

/// Small batches with a long pause: the timeout drops the purge after its first batch.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn slow_purge() -> Purge {
    Purge::older_than(Duration::from_secs(86_400))
        .batch_size(10)
        .pause_between_batches(Duration::from_secs(5))
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// On a deadpool connection, which goes back to the pool as it is: another purge runs at once.
#[cfg(feature = "postgres")]
#[test]
fn a_cancelled_purge_leaves_no_lock_on_postgres() {
    use diesel_async::pooled_connection::AsyncDieselConnectionManager;
    let db = inbox_tests::postgres::PgDb::new("purge_cancelled");
    db.seed_archive(100);
    runtime().block_on(async {
        let pool = diesel_async::pooled_connection::deadpool::Pool::builder(
            AsyncDieselConnectionManager::<diesel_async::AsyncPgConnection>::new(db.url()),
        )
        .max_size(1)
        .build()
        .unwrap();
        let mut conn = pool.get().await.unwrap();
        let cancelled = tokio::time::timeout(
            Duration::from_millis(500),
            purge_async(&mut *conn, &InboxSchema::DEFAULT, &slow_purge()),
        )
        .await;
        assert!(
            cancelled.is_err(),
            "the purge was still pausing: {cancelled:?}"
        );
        drop(conn);
        let report = purge(
            &mut db.connect(),
            &InboxSchema::DEFAULT,
            &Purge::older_than(Duration::from_secs(86_400)),
        )
        .unwrap();
        assert!(report.ran, "{report:?}");
        assert_eq!(report.removed, 90, "the first batch had removed 10");
    });
}

/// On MariaDB the lock is the session's: while the cancelled purge's connection keeps it, a
/// purge elsewhere is told the lock's session is idle (stuck, not busy); the same connection's
/// next purge takes the lock over instead of holding it twice, and once that purge ends, a
/// purge elsewhere runs.
#[cfg(feature = "mysql")]
#[test]
fn a_cancelled_purge_leaves_no_lock_on_mariadb() {
    let db = inbox_tests::mysql::MysqlDb::new("purge_cancelled");
    db.seed_archive(100);
    runtime().block_on(async {
        use diesel_async::AsyncConnection;
        let mut conn = diesel_async::AsyncMysqlConnection::establish(db.url())
            .await
            .unwrap();
        let cancelled = tokio::time::timeout(
            Duration::from_millis(500),
            purge_async(&mut conn, &InboxSchema::DEFAULT, &slow_purge()),
        )
        .await;
        assert!(
            cancelled.is_err(),
            "the purge was still pausing: {cancelled:?}"
        );
        // Meanwhile a purge elsewhere is told the lock is held by an idle session: stuck, not
        // busy.
        let blocked = purge(
            &mut db.connect(),
            &InboxSchema::DEFAULT,
            &Purge::older_than(Duration::from_secs(86_400)),
        )
        .unwrap();
        assert!(!blocked.ran);
        assert!(blocked.lock_holder_idle_for.is_some(), "{blocked:?}");
        let again = purge_async(
            &mut conn,
            &InboxSchema::DEFAULT,
            &Purge::older_than(Duration::from_secs(86_400)),
        )
        .await
        .unwrap();
        assert!(again.ran, "{again:?}");
        let elsewhere = purge(
            &mut db.connect(),
            &InboxSchema::DEFAULT,
            &Purge::older_than(Duration::from_secs(86_400)),
        )
        .unwrap();
        assert!(
            elsewhere.ran,
            "the lock was released once and is free: {elsewhere:?}"
        );
    });
}
