//! The transactional outbox on SQLite always, PostgreSQL and MariaDB with their features:
//! messages published in a handler's transaction, and relays — alone, side by side, with a
//! poison message, through a broker outage, after a lost mark — sending each once, in order
//! per key.

mod sqlite {
    use diesel::Connection;
    use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
    use inbox_tests::sqlite::SqliteDb as Db;

    type Conn = diesel::SqliteConnection;
    const BACKEND: inbox_diesel::schema::Backend = inbox_diesel::schema::Backend::Sqlite;
    const INT8: &str = "BIGINT";

    async fn connect_url(url: &str) -> SyncConnectionWrapper<Conn> {
        let mut conn = Conn::establish(url).unwrap();
        diesel::connection::SimpleConnection::batch_execute(
            &mut conn,
            "PRAGMA busy_timeout = 5000",
        )
        .unwrap();
        SyncConnectionWrapper::new(conn)
    }

    include!("behaviour/outbox.rs");
}

#[cfg(feature = "postgres")]
mod postgres {
    use diesel_async::AsyncConnection;
    use inbox_tests::postgres::PgDb as Db;

    type Conn = diesel::PgConnection;
    const BACKEND: inbox_diesel::schema::Backend = inbox_diesel::schema::Backend::Postgres;
    const INT8: &str = "BIGINT";

    async fn connect_url(url: &str) -> diesel_async::AsyncPgConnection {
        diesel_async::AsyncPgConnection::establish(url)
            .await
            .unwrap()
    }

    include!("behaviour/outbox.rs");
    include!("behaviour/outbox_server.rs");
}

#[cfg(feature = "mysql")]
mod mysql {
    use diesel_async::AsyncConnection;
    use inbox_tests::mysql::MysqlDb as Db;

    type Conn = diesel::MysqlConnection;
    const BACKEND: inbox_diesel::schema::Backend = inbox_diesel::schema::Backend::Mysql;
    const INT8: &str = "SIGNED";

    async fn connect_url(url: &str) -> diesel_async::AsyncMysqlConnection {
        diesel_async::AsyncMysqlConnection::establish(url)
            .await
            .unwrap()
    }

    include!("behaviour/outbox.rs");
    include!("behaviour/outbox_server.rs");
}
