#![cfg(any(feature = "postgres", feature = "mysql"))]
//! An async handler cancelled inside its transaction — its future dropped by a
//! `tokio::time::timeout` — on a connection the application keeps (no pool): diesel-async
//! leaves the transaction open on it. Every later call on that connection was refused as
//! called inside the caller's transaction (`CalledInsideTransaction`, an alert that halts a
//! pump), though the transaction was the runtime's own. The next delivery rolls it back —
//! nothing of it had committed — and goes on: the cancelled message applied once when it
//! comes again, the others as they come; the application's own transactions on it are
//! refused until then. PostgreSQL and MariaDB.

macro_rules! abandoned {
    ($db:ty, $conn:ty, $connect:ident) => {
        use std::time::Duration;

        use diesel_async::RunQueryDsl;
        use inbox_diesel::idempotent;
        use inbox_tests::count;

        #[idempotent(consumer = "abandoned", key = *id)]
        async fn credit(conn: &mut $conn, id: &u64, stall: bool) -> diesel::QueryResult<()> {
            diesel::sql_query("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
                .execute(conn)
                .await?;
            if stall {
                tokio::time::sleep(Duration::from_secs(60)).await;
            }
            Ok(())
        }

        #[tokio::test]
        async fn a_cancelled_handlers_transaction_is_rolled_back_by_the_next() {
            let db = <$db>::new("abandoned");
            let mut conn = db.$connect().await;
            let cancelled =
                tokio::time::timeout(Duration::from_millis(300), credit(&mut conn, &1, true)).await;
            assert!(cancelled.is_err(), "the handler was cancelled");
            // The same connection: the cancelled message again, then another.
            assert!(credit(&mut conn, &1, false).await.unwrap().is_processed());
            assert!(credit(&mut conn, &2, false).await.unwrap().is_processed());
            assert!(credit(&mut conn, &1, false).await.unwrap().is_duplicate());
            let mut check = db.connect();
            assert_eq!(
                count(&mut check, "SELECT balance AS n FROM accounts WHERE id = 1"),
                2
            );
            assert_eq!(count(&mut check, "SELECT count(*) AS n FROM inbox"), 2);
        }

        /// What the application does on the connection it kept: its own transaction, which
        /// would have nested a savepoint in the dropped one (PostgreSQL) or ended it with the
        /// session's `autocommit` still off (MariaDB) — answered `Ok`, committing nothing —
        /// is refused until a handler's next call rolls the dropped one back; after that,
        /// its writes commit, in a transaction or on their own.
        #[tokio::test]
        async fn the_applications_own_transaction_is_refused_until_the_next_call() {
            use diesel_async::{AsyncConnection, TransactionManager};
            let db = <$db>::new("abandoned_own");
            let mut conn = db.$connect().await;
            let cancelled =
                tokio::time::timeout(Duration::from_millis(300), credit(&mut conn, &1, true)).await;
            assert!(cancelled.is_err(), "the handler was cancelled");
            let own = conn
                .transaction::<_, diesel::result::Error, _>(async |c| {
                    diesel::sql_query("UPDATE accounts SET balance = balance + 100 WHERE id = 1")
                        .execute(c)
                        .await
                })
                .await;
            assert!(
                matches!(own, Err(diesel::result::Error::BrokenTransactionManager)),
                "{own:?}"
            );
            let rollback =
                <$conn as AsyncConnection>::TransactionManager::rollback_transaction(&mut conn)
                    .await;
            assert!(
                matches!(
                    rollback,
                    Err(diesel::result::Error::BrokenTransactionManager)
                ),
                "{rollback:?}"
            );
            let mut check = db.connect();
            assert_eq!(
                count(&mut check, "SELECT balance AS n FROM accounts WHERE id = 1"),
                0
            );
            assert!(credit(&mut conn, &2, false).await.unwrap().is_processed());
            conn.transaction::<_, diesel::result::Error, _>(async |c| {
                diesel::sql_query("UPDATE accounts SET balance = balance + 100 WHERE id = 1")
                    .execute(c)
                    .await
            })
            .await
            .unwrap();
            diesel::sql_query("UPDATE accounts SET balance = balance + 1000 WHERE id = 1")
                .execute(&mut conn)
                .await
                .unwrap();
            assert_eq!(
                count(&mut check, "SELECT balance AS n FROM accounts WHERE id = 1"),
                1101
            );
            assert!(credit(&mut conn, &1, false).await.unwrap().is_processed());
            assert_eq!(count(&mut check, "SELECT count(*) AS n FROM inbox"), 2);
        }

        /// A redelivery cancelled by its caller's timeout while its marker's insert waits on
        /// the marker of a delivery dropped mid-body (a caller whose timeout is shorter than
        /// the idle bound): the server is asked to cancel the waiting insert, so that it does
        /// not take the marker when the first transaction ends and hold it, idle, in an
        /// abandoned transaction of its own — where the next delivery would wait behind it
        /// for the idle bound (10 s), and time out again under the same caller.
        #[tokio::test]
        async fn a_redelivery_cancelled_while_it_waits_leaves_no_lock_behind() {
            let db = <$db>::new("abandoned_wait");
            let mut first = db.$connect().await;
            let cancelled =
                tokio::time::timeout(Duration::from_millis(300), credit(&mut first, &1, true))
                    .await;
            assert!(
                cancelled.is_err(),
                "the first delivery was cancelled in its body"
            );
            let mut second = db.$connect().await;
            let waited =
                tokio::time::timeout(Duration::from_millis(600), credit(&mut second, &1, false))
                    .await;
            assert!(
                waited.is_err(),
                "the redelivery waited on the first's marker"
            );
            // The cancel is sent on a task of its own.
            tokio::time::sleep(Duration::from_millis(300)).await;
            // The first delivery's transaction ends with its session.
            drop(first);
            let mut third = db.$connect().await;
            let started = std::time::Instant::now();
            let outcome =
                tokio::time::timeout(Duration::from_secs(5), credit(&mut third, &1, false)).await;
            let outcome = outcome.unwrap_or_else(|_| {
                panic!("the third delivery waited behind the cancelled second's marker")
            });
            assert!(outcome.unwrap().is_processed());
            assert!(
                started.elapsed() < Duration::from_secs(3),
                "{:?}",
                started.elapsed()
            );
            drop(second);
            let mut check = db.connect();
            assert_eq!(
                count(&mut check, "SELECT balance AS n FROM accounts WHERE id = 1"),
                1
            );
            assert_eq!(count(&mut check, "SELECT count(*) AS n FROM inbox"), 1);
        }

        /// Cancelled at once, in the middle of its first statement's round trip, where the
        /// connection's protocol may be left with no answer to read: the next call is
        /// processed or asks for a new connection (`Reconnect`), never a dead letter or an
        /// alert; each message applied once.
        #[tokio::test]
        async fn a_handler_cancelled_mid_statement_leaves_nothing_to_dead_letter() {
            use inbox_diesel::Action;
            let db = <$db>::new("abandoned_mid");
            let mut conn = db.$connect().await;
            for id in 1..=8u64 {
                let cancelled =
                    tokio::time::timeout(Duration::ZERO, credit(&mut conn, &id, true)).await;
                assert!(cancelled.is_err());
                loop {
                    match credit(&mut conn, &id, false).await {
                        Ok(outcome) => {
                            assert!(outcome.is_processed(), "{id}: {outcome:?}");
                            break;
                        }
                        Err(e) => {
                            let action =
                                inbox_diesel::classify(&e, &inbox_diesel::InboxSchema::DEFAULT)
                                    .action();
                            assert_eq!(action, Action::Reconnect, "{id}: {e:?}");
                            conn = db.$connect().await;
                        }
                    }
                }
            }
            let mut check = db.connect();
            assert_eq!(
                count(&mut check, "SELECT balance AS n FROM accounts WHERE id = 1"),
                8
            );
        }
    };
}

#[cfg(feature = "postgres")]
mod postgres {
    abandoned!(
        inbox_tests::postgres::PgDb,
        diesel_async::AsyncPgConnection,
        connect_async
    );
}

#[cfg(feature = "mysql")]
mod mysql {
    abandoned!(
        inbox_tests::mysql::MysqlDb,
        diesel_async::AsyncMysqlConnection,
        connect_async
    );
}
