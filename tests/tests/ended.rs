#![cfg(any(feature = "postgres", feature = "mysql"))]
//! A body that ends the handler's transaction itself — a `ROLLBACK` or a `COMMIT` it sends, a
//! legacy helper's `BEGIN …; COMMIT` — after which its writes commit on their own. On
//! PostgreSQL `COMMIT` then answered success (with a warning) for a transaction that was not
//! there: the message was answered `Processed` without its marker, and each redelivery
//! applied the writes after the `ROLLBACK` again; a helper that committed early and a
//! transient failure after it made the retry meet the marker and answer `Duplicate` for work
//! never finished. Now each is reported (`TransactionEnded`, an alert: every delivery would
//! do the same), never `Processed` or `Duplicate`, and never retried. MariaDB, where the
//! writes after a `ROLLBACK` stay in a transaction the runtime rolls back (`autocommit` off),
//! reports too. Sync and async.

macro_rules! ended {
    ($db:ty, $conn:ty, $fail_transiently:expr) => {
        use diesel::connection::SimpleConnection;
        use inbox_diesel::{Action, idempotent};

        /// `then` after the body's first write, which marks account 1.
        #[idempotent(consumer = "ended", key = id)]
        fn handle(
            conn: &mut $conn,
            id: &str,
            then: &dyn Fn(&mut $conn) -> diesel::QueryResult<()>,
        ) -> Result<(), inbox_diesel::Error> {
            conn.batch_execute("UPDATE accounts SET balance = balance + 1 WHERE id = 1")?;
            then(conn)?;
            Ok(())
        }

        fn rolls_back_then_writes(conn: &mut $conn) -> diesel::QueryResult<()> {
            conn.batch_execute("ROLLBACK")?;
            conn.batch_execute("UPDATE accounts SET balance = balance + 100 WHERE id = 1")
        }

        fn commits_then_writes(conn: &mut $conn) -> diesel::QueryResult<()> {
            conn.batch_execute("COMMIT")?;
            conn.batch_execute("UPDATE accounts SET balance = balance + 100 WHERE id = 1")
        }

        /// A legacy helper's transaction of its own, then a failure (PostgreSQL: a transient one).
        fn helper_commits_then_fails(conn: &mut $conn) -> diesel::QueryResult<()> {
            conn.batch_execute(
                "BEGIN; UPDATE accounts SET balance = balance + 10 WHERE id = 1; COMMIT",
            )?;
            conn.batch_execute($fail_transiently)
        }

        #[test]
        fn a_body_that_ends_its_transaction_is_reported_never_processed() {
            type Shape = fn(&mut $conn) -> diesel::QueryResult<()>;
            let shapes: [(&str, Shape); 3] = [
                ("rolls back, then writes", rolls_back_then_writes),
                ("commits, then writes", commits_then_writes),
                (
                    "a helper commits, then a transient failure",
                    helper_commits_then_fails,
                ),
            ];
            let db = <$db>::new("ended");
            for (n, (shape, then)) in shapes.into_iter().enumerate() {
                let key = format!("m-{n}");
                let mut conn = db.connect();
                // Reported, never `Processed`: the first delivery's answer an alert; a
                // redelivery meets the same, or the marker the body's `COMMIT` committed.
                let error = handle(&mut conn, &key, &then).unwrap_err();
                assert_eq!(error.action(), Action::Alert, "{shape}: {error:?}");
                match handle(&mut conn, &key, &then) {
                    Err(error) => assert_eq!(error.action(), Action::Alert, "{shape}: {error:?}"),
                    Ok(outcome) => assert!(outcome.is_duplicate(), "{shape}: {outcome:?}"),
                }
                // The connection goes on.
                let mut check = db.connect();
                assert!(
                    handle(&mut conn, &format!("ok-{n}"), &|_| Ok(()))
                        .unwrap()
                        .is_processed(),
                    "{shape}"
                );
                check
                    .batch_execute("UPDATE accounts SET balance = 0; DELETE FROM inbox")
                    .unwrap();
            }
        }
    };
}

/// The same shapes on diesel-async.
macro_rules! ended_async {
    ($db:ty, $conn:ty, $fail_transiently:expr) => {
        use diesel_async::SimpleAsyncConnection;
        use inbox_diesel::{Action, idempotent};

        #[derive(Clone, Copy, Debug)]
        enum Shape {
            RollsBackThenWrites,
            CommitsThenWrites,
            HelperCommitsThenFails,
            Plain,
        }

        #[idempotent(consumer = "ended", key = id)]
        async fn handle(
            conn: &mut $conn,
            id: &str,
            shape: Shape,
        ) -> Result<(), inbox_diesel::Error> {
            conn.batch_execute("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
                .await?;
            let after = "UPDATE accounts SET balance = balance + 100 WHERE id = 1";
            match shape {
                Shape::RollsBackThenWrites => {
                    conn.batch_execute("ROLLBACK").await?;
                    conn.batch_execute(after).await?;
                }
                Shape::CommitsThenWrites => {
                    conn.batch_execute("COMMIT").await?;
                    conn.batch_execute(after).await?;
                }
                Shape::HelperCommitsThenFails => {
                    conn.batch_execute(
                        "BEGIN; UPDATE accounts SET balance = balance + 10 WHERE id = 1; COMMIT",
                    )
                    .await?;
                    conn.batch_execute($fail_transiently).await?;
                }
                Shape::Plain => {}
            }
            Ok(())
        }

        #[tokio::test]
        async fn an_async_body_that_ends_its_transaction_is_reported_never_processed() {
            let db = <$db>::new("ended_async");
            for (n, shape) in [
                Shape::RollsBackThenWrites,
                Shape::CommitsThenWrites,
                Shape::HelperCommitsThenFails,
            ]
            .into_iter()
            .enumerate()
            {
                let key = format!("m-{n}");
                let mut conn = db.connect_async().await;
                let error = handle(&mut conn, &key, shape).await.unwrap_err();
                assert_eq!(error.action(), Action::Alert, "{shape:?}: {error:?}");
                match handle(&mut conn, &key, shape).await {
                    Err(error) => assert_eq!(error.action(), Action::Alert, "{shape:?}: {error:?}"),
                    Ok(outcome) => assert!(outcome.is_duplicate(), "{shape:?}: {outcome:?}"),
                }
                let next = handle(&mut conn, &format!("ok-{n}"), Shape::Plain).await;
                assert!(next.unwrap().is_processed(), "{shape:?}");
            }
        }
    };
}

#[cfg(feature = "postgres")]
mod postgres {
    ended!(
        inbox_tests::postgres::PgDb,
        diesel::PgConnection,
        "DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = '40001'; END $$"
    );
}

#[cfg(feature = "postgres")]
mod postgres_async {
    ended_async!(
        inbox_tests::postgres::PgDb,
        diesel_async::AsyncPgConnection,
        "DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = '40001'; END $$"
    );
}

#[cfg(feature = "mysql")]
mod mysql_async {
    ended_async!(
        inbox_tests::mysql::MysqlDb,
        diesel_async::AsyncMysqlConnection,
        // A business constraint's failure after the helper's implicit commit. (A transient
        // or unrecognised one there is retried: a deadlock ends MariaDB's transaction too, in
        // the server's language, and a copy of the message may have committed its marker
        // since, which the retry answers `Duplicate` — rightly for the copy, wrongly after a
        // helper's commit: not told apart yet.)
        "INSERT INTO accounts (id, balance) VALUES (1, 0)"
    );
}

#[cfg(feature = "mysql")]
mod mysql {
    ended!(
        inbox_tests::mysql::MysqlDb,
        diesel::MysqlConnection,
        // A business constraint's failure after the helper's implicit commit. (A transient
        // or unrecognised one there is retried: a deadlock ends MariaDB's transaction too, in
        // the server's language, and a copy of the message may have committed its marker
        // since, which the retry answers `Duplicate` — rightly for the copy, wrongly after a
        // helper's commit: not told apart yet.)
        "INSERT INTO accounts (id, balance) VALUES (1, 0)"
    );
}
