//! The payments API on each backend: `app.rs`, included with the backend's diesel-async
//! connection type and its business tables' DDL.

pub mod sqlite {
    use diesel::SqliteConnection;
    use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;

    pub type Conn = SyncConnectionWrapper<SqliteConnection>;
    const BACKEND: inbox_diesel::schema::Backend = inbox_diesel::schema::Backend::Sqlite;
    const BUSINESS_SCHEMA: [&str; 3] = [
        "PRAGMA journal_mode = WAL",
        "CREATE TABLE accounts (id BIGINT PRIMARY KEY, balance_cents BIGINT NOT NULL)",
        "CREATE TABLE payments (id INTEGER PRIMARY KEY AUTOINCREMENT,
                                account BIGINT NOT NULL REFERENCES accounts (id),
                                amount_cents BIGINT NOT NULL)",
    ];

    include!("app.rs");
}

#[cfg(feature = "postgres")]
pub mod postgres {
    pub type Conn = diesel_async::AsyncPgConnection;
    const BACKEND: inbox_diesel::schema::Backend = inbox_diesel::schema::Backend::Postgres;
    const BUSINESS_SCHEMA: [&str; 2] = [
        "CREATE TABLE accounts (id BIGINT PRIMARY KEY, balance_cents BIGINT NOT NULL)",
        "CREATE TABLE payments (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                                account BIGINT NOT NULL REFERENCES accounts (id),
                                amount_cents BIGINT NOT NULL)",
    ];

    include!("app.rs");
}
