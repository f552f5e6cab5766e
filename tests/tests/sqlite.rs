//! The backend suite on SQLite (always runs: SQLite is compiled in).

inbox_tests::suite!(inbox_tests::sqlite::SqliteDb, diesel::SqliteConnection);
inbox_tests::batch_suite!(inbox_tests::sqlite::SqliteDb);
inbox_tests::claim_suite!(
    inbox_tests::sqlite::SqliteDb,
    diesel::SqliteConnection,
    sqlite
);
