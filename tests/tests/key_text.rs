//! The optional `key_text` column on every backend: the same cases, included per backend
//! with its connection types.

mod sqlite {
    use inbox_tests::sqlite::SqliteDb as Db;

    type Conn = diesel::SqliteConnection;
    type AsyncConn =
        diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>;

    fn id_literal(id: inbox_tests::Uuid) -> String {
        format!("X'{}'", id.simple())
    }

    include!("behaviour/key_text.rs");

    /// A `key_text` the runtime cannot write text to is refused by the startup check,
    /// before any marker.
    #[test]
    fn a_key_text_of_another_type_is_refused_before_any_marker() {
        let db = Db::new("key_text_type");
        db.connect()
            .batch_execute("ALTER TABLE inbox ADD COLUMN key_text INTEGER")
            .unwrap();
        let mut conn = db.connect();
        let error = by_text(&mut conn, &"a".to_owned()).unwrap_err();
        let chain = inbox_tests::error_chain(&error);
        assert!(
            chain.contains("column `key_text` is INTEGER, expected unbounded text"),
            "{chain}"
        );
        assert_eq!(stored_text(&mut conn, "activities", "a"), None);
        assert_eq!(balance(&mut conn), 0);
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use inbox_tests::postgres::PgDb as Db;

    type Conn = diesel::PgConnection;
    type AsyncConn = diesel_async::AsyncPgConnection;

    fn id_literal(id: inbox_tests::Uuid) -> String {
        format!("'{id}'::uuid")
    }

    include!("behaviour/key_text.rs");

    use inbox_diesel::schema::Backend;

    /// What an operator does with the column: turn a text key back into its stored id in
    /// SQL, and find the row.
    #[test]
    fn text_key_sql_of_key_text_is_the_message_id() {
        let db = Db::new("key_text_sql");
        add_key_text(&db);
        let mut conn = db.connect();
        conn.batch_execute("CREATE EXTENSION IF NOT EXISTS pgcrypto")
            .unwrap();
        for id in ["https://example.social/users/zoë/statuses/日本", "it's"] {
            assert!(by_text(&mut conn, &id.to_owned()).unwrap().is_processed());
        }
        let computed = Backend::Postgres.text_key_sql("key_text").unwrap();
        let matching: Vec<KeyText> = diesel::sql_query(format!(
            "SELECT key_text FROM inbox WHERE message_id = {computed}"
        ))
        .load(&mut conn)
        .unwrap();
        assert_eq!(matching.len(), 2);
    }
}

#[cfg(feature = "mysql")]
mod mysql {
    use inbox_tests::mysql::MysqlDb as Db;

    type Conn = diesel::MysqlConnection;
    type AsyncConn = diesel_async::AsyncMysqlConnection;

    fn id_literal(id: inbox_tests::Uuid) -> String {
        format!("X'{}'", id.simple())
    }

    include!("behaviour/key_text.rs");

    use inbox_diesel::schema::Backend;

    /// As on PostgreSQL: the stored id of a text key, from its `key_text`, in SQL.
    #[test]
    fn text_key_sql_of_key_text_is_the_message_id() {
        let db = Db::new("key_text_sql");
        add_key_text(&db);
        let mut conn = db.connect();
        for id in ["https://example.social/users/zoë/statuses/日本", "it's"] {
            assert!(by_text(&mut conn, &id.to_owned()).unwrap().is_processed());
        }
        let computed = Backend::Mysql.text_key_sql("key_text").unwrap();
        let matching: Vec<KeyText> = diesel::sql_query(format!(
            "SELECT key_text FROM inbox WHERE message_id = {computed}"
        ))
        .load(&mut conn)
        .unwrap();
        assert_eq!(matching.len(), 2);
    }
}
