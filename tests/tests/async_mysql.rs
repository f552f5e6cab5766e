//! The async suites on MySQL/MariaDB through diesel-async's `AsyncMysqlConnection`. Needs
//! `INBOX_TEST_MYSQL`.

type Db = inbox_tests::mysql::MysqlDb;
type AsyncConnection = diesel_async::AsyncMysqlConnection;

include!("behaviour/transaction_async.rs");
/// The batch form.
mod async_batch_form {
    type Db = inbox_tests::mysql::MysqlDb;

    include!("behaviour/batch_async.rs");
}
/// Get-or-create, async.
mod async_get_or_create {
    type Db = inbox_tests::mysql::MysqlDb;
    type AsyncConnection = diesel_async::AsyncMysqlConnection;
    const TABLES: &str = inbox_tests::unique::MYSQL_TABLES;
    const SETUP: &str = "SELECT 1";
    const PK: &str = "PRIMARY";

    include!("behaviour/unique_async.rs");
}
include!("behaviour/server_async.rs");
/// `transaction = "caller"`, async: a job runner's transaction joined.
mod joined_async {
    type Db = inbox_tests::mysql::MysqlDb;
    type AsyncConnection = diesel_async::AsyncMysqlConnection;
    /// The next job, skipping those another worker holds (where the backend can).
    const TAKE_JOB: &str =
        "SELECT id, message FROM jobs ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED";

    include!("behaviour/joined_async.rs");
}
/// `inbox_diesel::testing`'s async helpers.
mod async_testing_kit {
    type Db = inbox_tests::mysql::MysqlDb;
    type AsyncConnection = diesel_async::AsyncMysqlConnection;

    include!("behaviour/testing_async.rs");
}
/// Stored results and fingerprints, async.
mod async_stored {
    type Db = inbox_tests::mysql::MysqlDb;
    type AsyncConnection = diesel_async::AsyncMysqlConnection;
    const BACKEND: inbox_diesel::schema::Backend = inbox_diesel::schema::Backend::Mysql;

    include!("behaviour/stored_async.rs");
}
/// Claim mode, async.
mod async_claim_mode {
    use inbox_diesel::schema::mysql::inbox;

    type Db = inbox_tests::mysql::MysqlDb;
    type AsyncConnection = diesel_async::AsyncMysqlConnection;

    include!("behaviour/claim_async.rs");
}

/// A session the server ended while it sat idle (`wait_timeout`), on a connection the
/// application kept: the delivery on it is a lost connection, and so is the next one — not
/// a handler "called inside an open transaction", which the `ROLLBACK` that never reached
/// the server left diesel-async counting.
mod idle_session {
    use diesel_async::SimpleAsyncConnection;
    use inbox_diesel::{Action, idempotent};

    #[idempotent(consumer = "idle", key = *id)]
    async fn touch(
        conn: &mut diesel_async::AsyncMysqlConnection,
        id: &u64,
    ) -> Result<(), inbox_diesel::Error> {
        conn.batch_execute("SELECT 1").await?;
        Ok(())
    }

    #[tokio::test]
    async fn a_session_ended_while_idle_stays_a_lost_connection() {
        let db = inbox_tests::mysql::MysqlDb::new("idle_ended_async");
        let mut conn = db.connect_async().await;
        conn.batch_execute("SET SESSION wait_timeout = 1")
            .await
            .unwrap();
        assert!(touch(&mut conn, &1).await.unwrap().is_processed());
        tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
        for id in [2, 3] {
            let error = touch(&mut conn, &id).await.unwrap_err();
            assert_eq!(error.action(), Action::Reconnect, "{id}: {error:?}");
        }
    }
}
