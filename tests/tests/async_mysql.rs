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
