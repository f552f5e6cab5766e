//! The startup check on every backend: the same cases, included per backend.

mod sqlite {
    use inbox_tests::sqlite::SqliteDb as Db;

    type Conn = diesel::SqliteConnection;
    const DROP_UNIQUE_INDEX: &str = "DROP INDEX ux_inbox_message_consumer";
    const NOTICES_AN_INDEX_DROPPED_UNDER_A_CHECKED_SESSION: bool = true;

    include!("behaviour/schema_check.rs");
}

#[cfg(feature = "postgres")]
mod postgres {
    use inbox_tests::postgres::PgDb as Db;

    type Conn = diesel::PgConnection;
    const DROP_UNIQUE_INDEX: &str = "DROP INDEX ux_inbox_message_consumer";
    const NOTICES_AN_INDEX_DROPPED_UNDER_A_CHECKED_SESSION: bool = true;

    include!("behaviour/schema_check.rs");
}

#[cfg(feature = "mysql")]
mod mysql {
    use inbox_tests::mysql::MysqlDb as Db;

    type Conn = diesel::MysqlConnection;
    const DROP_UNIQUE_INDEX: &str = "ALTER TABLE inbox DROP INDEX ux_inbox_message_consumer";
    // An insert without the index succeeds, and the session's mark says "checked".
    const NOTICES_AN_INDEX_DROPPED_UNDER_A_CHECKED_SESSION: bool = false;

    include!("behaviour/schema_check.rs");
}
