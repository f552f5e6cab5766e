//! The async suite on SQLite through diesel-async's `SyncConnectionWrapper`.

inbox_tests::async_suite!(
    inbox_tests::sqlite::SqliteDb,
    diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>
);
