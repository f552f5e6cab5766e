//! The backend suite on PostgreSQL, plus what only PostgreSQL does: the deterministic
//! lock wait, aborted transactions, serialization failures. Needs `INBOX_TEST_PG`.

inbox_tests::suite!(inbox_tests::postgres::PgDb, diesel::PgConnection);
