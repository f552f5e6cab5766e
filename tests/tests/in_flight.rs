//! `on_locked = "in_flight"`: a delivery that finds another one holding the message's marker,
//! uncommitted, answers `InFlight` at once instead of holding its connection while it waits —
//! and the body's own lock waits are as the session had them (checked in the body). PostgreSQL and MariaDB
//! (`INBOX_TEST_PG`, `INBOX_TEST_MYSQL`).

#![cfg(any(feature = "postgres", feature = "mysql"))]

#[cfg(feature = "postgres")]
mod postgres {
    type Db = inbox_tests::postgres::PgDb;
    type Conn = diesel::PgConnection;
    const SESSION_LOCK_WAIT: &str = "SET lock_timeout = '7s'";
    const LOCK_WAIT_RESTORED: &str = "DO $$ BEGIN IF current_setting('lock_timeout') <> '7s' THEN \
         RAISE 'the body kept the marker''s short lock wait'; END IF; END $$";

    include!("behaviour/in_flight.rs");
}

#[cfg(feature = "mysql")]
mod mariadb {
    type Db = inbox_tests::mysql::MysqlDb;
    type Conn = diesel::MysqlConnection;
    const SESSION_LOCK_WAIT: &str = "SET SESSION innodb_lock_wait_timeout = 7";
    const LOCK_WAIT_RESTORED: &str =
        "SELECT IF(@@SESSION.innodb_lock_wait_timeout <> 7, (SELECT 1 UNION SELECT 2), 1)";

    include!("behaviour/in_flight.rs");
}

/// The same through diesel-async: B answers `InFlight` while A's body holds the marker, and
/// A's body waits for locks as its session had it.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread")]
async fn async_postgres_answers_in_flight_instead_of_waiting() {
    use std::time::{Duration, Instant};

    use diesel_async::{AsyncPgConnection, SimpleAsyncConnection};
    use inbox_diesel::{InFlightOutcome, idempotent};
    use tokio::sync::Notify;

    #[idempotent(consumer = "credit", key = *id, on_locked = "in_flight")]
    async fn credit(
        conn: &mut AsyncPgConnection,
        id: &u64,
        held: &Notify,
        go: &Notify,
    ) -> diesel::QueryResult<()> {
        conn.batch_execute("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
            .await?;
        conn.batch_execute(
            "DO $$ BEGIN IF current_setting('lock_timeout') <> '7s' THEN \
             RAISE 'the body kept the marker''s short lock wait'; END IF; END $$",
        )
        .await?;
        held.notify_one();
        go.notified().await;
        Ok(())
    }

    let db = inbox_tests::postgres::PgDb::new("async_in_flight");
    let (held, go) = (
        std::sync::Arc::new(Notify::new()),
        std::sync::Arc::new(Notify::new()),
    );
    let mut a = db.connect_async().await;
    let mut b = db.connect_async().await;
    for conn in [&mut a, &mut b] {
        conn.batch_execute("SET lock_timeout = '7s'").await.unwrap();
    }
    let first = tokio::spawn({
        let (held, go) = (held.clone(), go.clone());
        async move { credit(&mut a, &1, &held, &go).await }
    });
    tokio::time::timeout(Duration::from_secs(30), held.notified())
        .await
        .unwrap_or_else(|_| panic!("A's body never reached its hold: {:?}", first.is_finished()));
    let (unused_held, unused_go) = (Notify::new(), Notify::new());
    unused_go.notify_one();
    let started = Instant::now();
    let answer = credit(&mut b, &1, &unused_held, &unused_go).await.unwrap();
    assert!(
        matches!(answer, InFlightOutcome::InFlight { .. }),
        "{answer:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    go.notify_one();
    assert!(first.await.unwrap().unwrap().is_processed());
    unused_go.notify_one();
    let again = credit(&mut b, &1, &unused_held, &unused_go).await.unwrap();
    assert!(again.is_duplicate(), "{again:?}");
    let balance = inbox_tests::server::count(
        &mut db.connect(),
        "SELECT balance AS n FROM accounts WHERE id = 1",
    );
    assert_eq!(balance, 1, "message 1, once");
}

/// The function API: `Handler::in_flight_when_locked` changes the handler's type, and with it
/// `run_once`'s outcome type — B answers `InFlight` while A's body holds the marker.
#[cfg(feature = "postgres")]
#[test]
fn the_function_api_answers_in_flight_when_its_handler_says_so() {
    use std::sync::{LazyLock, mpsc};

    use diesel::connection::SimpleConnection;
    use inbox_diesel::InFlightOutcome;
    use inbox_diesel::handler::{AnswerInFlight, Handler, run_once};

    static CREDIT: LazyLock<Handler<AnswerInFlight>> =
        LazyLock::new(|| Handler::new("credit").unwrap().in_flight_when_locked());

    fn credit(
        conn: &mut diesel::PgConnection,
        id: u64,
        hold: &dyn Fn(),
    ) -> diesel::QueryResult<InFlightOutcome<()>> {
        run_once(
            conn,
            &CREDIT,
            &id,
            inbox_diesel::guarded!(|tx| {
                tx.batch_execute("UPDATE accounts SET balance = balance + 1 WHERE id = 1")?;
                hold();
                Ok(())
            }),
        )
    }

    let db = inbox_tests::postgres::PgDb::new("in_flight_function");
    let (held_tx, held) = mpsc::channel();
    let (go_tx, go) = mpsc::channel::<()>();
    std::thread::scope(|scope| {
        let mut a = db.connect();
        let first = scope.spawn(move || {
            credit(&mut a, 1, &|| {
                held_tx.send(()).unwrap();
                go.recv().unwrap();
            })
        });
        held.recv().unwrap();
        let mut b = db.connect();
        let answer = credit(&mut b, 1, &|| {}).unwrap();
        assert!(
            matches!(answer, InFlightOutcome::InFlight { .. }),
            "{answer:?}"
        );
        go_tx.send(()).unwrap();
        assert!(first.join().unwrap().unwrap().is_processed());
        assert!(credit(&mut b, 1, &|| {}).unwrap().is_duplicate());
    });
    let balance = inbox_tests::server::count(
        &mut db.connect(),
        "SELECT balance AS n FROM accounts WHERE id = 1",
    );
    assert_eq!(balance, 1, "message 1, once");
}
