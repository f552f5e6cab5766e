#![cfg(any(feature = "postgres", feature = "mysql"))]
//! An async handler cancelled inside its transaction — its future dropped by a
//! `tokio::time::timeout` — on a connection the application keeps (no pool): diesel-async
//! leaves the transaction open on it. Every later call on that connection was refused as
//! called inside the caller's transaction (`CalledInsideTransaction`, an alert that halts a
//! pump), though the transaction was the runtime's own. The next delivery rolls it back —
//! nothing of it had committed — and goes on: the cancelled message applied once when it
//! comes again, the others as they come. PostgreSQL and MariaDB.

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
