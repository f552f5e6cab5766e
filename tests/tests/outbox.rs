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

    /// `notify_on_commit`: a relay idling for a minute wakes when a handler's transaction
    /// commits a message, rather than at the end of its pause.
    #[test]
    fn a_relay_wakes_on_the_commit_where_the_server_notifies() {
        static NOTIFYING: Outbox = Outbox::new("outbox").notify_on_commit();

        #[idempotent(consumer = "notify", key = *id)]
        fn announce(conn: &mut Conn, id: &u64) -> Result<(), AppError> {
            NOTIFYING.publish(conn, Message::new("orders", format!("{id}")))?;
            Ok(())
        }

        let db = Db::new("outbox_notify");
        setup(&db);
        let downstream = Downstream::default();
        let received = downstream.received.clone();
        let url = db.url().to_owned();
        let started = std::time::Instant::now();
        let report = runtime().block_on(async {
            let mut conn = connect_url(&url).await;
            let relay = Relay::new(NOTIFYING).idle(Duration::from_secs(60));
            let mut sink = downstream.clone();
            let publisher = tokio::task::spawn_blocking({
                let url = url.clone();
                move || {
                    // After the relay found nothing and went idle.
                    std::thread::sleep(Duration::from_millis(300));
                    let mut conn = <Conn as diesel::Connection>::establish(&url).unwrap();
                    assert!(announce(&mut conn, &1).unwrap().is_processed());
                }
            });
            let stop = async move {
                while received.lock().unwrap().is_empty() {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            };
            let report = relay.run(&mut conn, &mut sink, stop).await.unwrap();
            publisher.await.unwrap();
            report
        });
        assert_eq!(report.sent, 1, "{report:?}");
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the relay waited out its idle pause: no notification"
        );
    }
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
