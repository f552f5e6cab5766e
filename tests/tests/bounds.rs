#![cfg(any(feature = "postgres", feature = "mysql"))]
//! The idle bound of a handler's transaction (`idle_in_transaction_ms`, 10 s by default) is
//! the smaller of the handler's and the session's own: an operator's or a role's tighter
//! bound stays, inside the transaction too; a looser one is tightened for the transaction
//! only.

macro_rules! bound_inside {
    ($db:ty, $conn:ty, $read:expr, $set:expr, $tight:expr, $loose:expr, $handlers:expr) => {
        use diesel::RunQueryDsl;
        use diesel::connection::SimpleConnection;
        use inbox_diesel::idempotent;

        #[derive(diesel::QueryableByName)]
        struct Setting {
            #[diesel(sql_type = diesel::sql_types::Text)]
            value: String,
        }

        /// The bound as the body's statements see it.
        #[idempotent(consumer = "bound", key = id)]
        fn bound(conn: &mut $conn, id: &str) -> Result<String, inbox_diesel::Error> {
            let setting: Setting = diesel::sql_query($read).get_result(conn)?;
            Ok(setting.value)
        }

        #[test]
        fn the_smaller_bound_holds_inside_the_transaction() {
            let db = <$db>::new("idle_bound_kept");
            let mut conn = db.connect();
            conn.batch_execute(&format!($set, $tight)).unwrap();
            let inside = bound(&mut conn, "tight").unwrap().processed().unwrap();
            assert_eq!(inside, $handlers.0, "the session's tighter bound stays");
            conn.batch_execute(&format!($set, $loose)).unwrap();
            let inside = bound(&mut conn, "loose").unwrap().processed().unwrap();
            assert_eq!(inside, $handlers.1, "the handler's bound, tighter");
        }
    };
}

#[cfg(feature = "postgres")]
mod postgres {
    bound_inside!(
        inbox_tests::postgres::PgDb,
        diesel::PgConnection,
        "SELECT current_setting('idle_in_transaction_session_timeout') AS value",
        "SET idle_in_transaction_session_timeout = {}",
        "2000",
        "600000",
        ("2s", "10s")
    );
}

#[cfg(feature = "mysql")]
mod mariadb {
    bound_inside!(
        inbox_tests::mysql::MysqlDb,
        diesel::MysqlConnection,
        "SELECT CAST(@@SESSION.idle_transaction_timeout AS CHAR) AS value",
        "SET SESSION idle_transaction_timeout = {}",
        "2",
        "600",
        ("2", "10")
    );
}

/// A body that sits idle in its transaction past the bound: the server ends the session
/// (PostgreSQL 25P03), and the delivery fails as a lost connection (`Reconnect`: a
/// redelivery on a fresh connection processes it), the error naming `idle_in_transaction_ms`.
#[cfg(feature = "postgres")]
mod idle_past_the_bound {
    use diesel::connection::SimpleConnection;
    use inbox_diesel::{Action, ErrorClass, idempotent};

    #[idempotent(consumer = "idle", key = id, idle_in_transaction_ms = 300)]
    fn dawdles(conn: &mut diesel::PgConnection, id: &str) -> Result<(), inbox_diesel::Error> {
        let _ = id;
        conn.batch_execute("UPDATE accounts SET balance = balance + 1 WHERE id = 1")?;
        std::thread::sleep(std::time::Duration::from_millis(1500));
        conn.batch_execute("UPDATE accounts SET balance = balance + 1 WHERE id = 2")?;
        Ok(())
    }

    #[test]
    fn a_session_ended_by_the_bound_is_a_lost_connection() {
        let db = inbox_tests::postgres::PgDb::new("idle_past_bound");
        let error = dawdles(&mut db.connect(), "m-1").unwrap_err();
        assert_eq!(error.class(), ErrorClass::ConnectionLost, "{error:?}");
        assert_eq!(error.action(), Action::Reconnect);
        // The error itself names the bound, where the driver's says "connection closed".
        assert!(
            matches!(
                error,
                inbox_diesel::Error::IdleBoundExceeded {
                    idle_in_transaction_ms: 300,
                    ..
                }
            ),
            "{error:?}"
        );
        let text = error.to_string();
        assert!(text.contains("idle_in_transaction_ms = 300"), "{text}");
    }
}

/// Claim mode's side effect runs with the session idle, outside any transaction: a server
/// that ends idle sessions sooner than the lease (PostgreSQL's `idle_session_timeout`, a
/// role's say; MariaDB's `wait_timeout`) closed the connection under it, the stamp failed
/// (`EffectNotRecorded`) and, once the lease ended, the next delivery ran the effect again.
/// Claim mode raises the setting for the session to the lease where it is shorter: the
/// effect runs once, and is stamped.
macro_rules! idle_session {
    ($db:ty, $conn:ty, $set:expr) => {
        use std::sync::atomic::{AtomicUsize, Ordering};

        use diesel::connection::SimpleConnection;
        use inbox_diesel::idempotent;

        #[idempotent(consumer = "idle-session", key = id, mode = "claim", lease_ms = 4000)]
        fn notify(
            conn: &mut $conn,
            id: &str,
            sent: &AtomicUsize,
        ) -> Result<(), inbox_diesel::Error> {
            let _ = id;
            std::thread::sleep(std::time::Duration::from_millis(2500));
            sent.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }

        #[test]
        fn a_side_effect_outlasting_the_servers_idle_session_bound_is_stamped() {
            let db = <$db>::new("idle_session");
            let mut conn = db.connect();
            conn.batch_execute($set).unwrap();
            let sent = AtomicUsize::new(0);
            assert!(notify(&mut conn, "n-1", &sent).unwrap().is_processed());
            // Set again on the checked session (as a pool's checkout hook does), after the
            // claim raised it.
            conn.batch_execute($set).unwrap();
            assert!(notify(&mut conn, "n-2", &sent).unwrap().is_processed());
            assert!(
                notify(&mut db.connect(), "n-1", &sent)
                    .unwrap()
                    .is_duplicate()
            );
            assert_eq!(sent.load(Ordering::SeqCst), 2);
            assert_eq!(
                inbox_tests::count(
                    &mut db.connect(),
                    "SELECT count(*) AS n FROM inbox WHERE processed_at IS NOT NULL"
                ),
                2
            );
        }
    };
}

#[cfg(feature = "postgres")]
mod idle_session_postgres {
    idle_session!(
        inbox_tests::postgres::PgDb,
        diesel::PgConnection,
        "SET idle_session_timeout = '1s'"
    );
}

#[cfg(feature = "mysql")]
mod idle_session_mariadb {
    idle_session!(
        inbox_tests::mysql::MysqlDb,
        diesel::MysqlConnection,
        "SET SESSION wait_timeout = 1"
    );
}
