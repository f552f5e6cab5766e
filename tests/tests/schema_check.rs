//! The startup check on every backend: the same cases, included per backend.

mod sqlite {
    use inbox_tests::sqlite::SqliteDb as Db;

    type Conn = diesel::SqliteConnection;
    const DROP_UNIQUE_INDEX: &str = "DROP INDEX ux_inbox_message_consumer";

    include!("behaviour/schema_check.rs");
}

#[cfg(feature = "postgres")]
mod postgres {
    use inbox_tests::postgres::PgDb as Db;

    type Conn = diesel::PgConnection;
    const DROP_UNIQUE_INDEX: &str = "DROP INDEX ux_inbox_message_consumer";

    include!("behaviour/schema_check.rs");
}

#[cfg(feature = "mysql")]
mod mysql {
    use inbox_tests::mysql::MysqlDb as Db;

    type Conn = diesel::MysqlConnection;
    const DROP_UNIQUE_INDEX: &str = "ALTER TABLE inbox DROP INDEX ux_inbox_message_consumer";

    include!("behaviour/schema_check.rs");
}
