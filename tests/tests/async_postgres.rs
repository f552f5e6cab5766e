//! The async suite on PostgreSQL through diesel-async's `AsyncPgConnection`, plus what only
//! PostgreSQL does. Needs `INBOX_TEST_PG`.

inbox_tests::async_suite!(inbox_tests::postgres::PgDb, diesel_async::AsyncPgConnection);
