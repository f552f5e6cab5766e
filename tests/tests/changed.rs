#![cfg(any(feature = "postgres", feature = "mysql"))]
//! The inbox table changed while consumers run, after their startup check: a duplicate is
//! answered only on the evidence that the marker of this key and consumer exists. Here the
//! unique index is redefined under the inbox index's name on `message_id` alone — a second
//! consumer's new message then violates an index of that name. Before the evidence was read,
//! MariaDB's error (which names no table, only the index) was taken for a duplicate, and the
//! message was answered `Duplicate` and never applied.

macro_rules! redefined_index {
    ($db:ty, $conn:ty, $redefine:expr, $still_duplicate:expr) => {
        use inbox_diesel::{ErrorClass, Outcome, idempotent};
        use inbox_tests::server::count;

        #[idempotent(consumer = "first", key = id)]
        fn first(conn: &mut $conn, id: &str) -> Result<(), inbox_diesel::Error> {
            let _ = (conn, id);
            Ok(())
        }

        #[idempotent(consumer = "second", key = id)]
        fn second(conn: &mut $conn, id: &str) -> Result<(), inbox_diesel::Error> {
            let _ = (conn, id);
            Ok(())
        }

        #[test]
        fn a_new_message_is_never_answered_duplicate_without_its_marker() {
            use diesel::connection::SimpleConnection;
            let db = <$db>::new("changed_index");
            let mut conn = db.connect();
            assert_eq!(first(&mut conn, "m-1").unwrap(), Outcome::Processed(()));
            assert_eq!(second(&mut conn, "m-0").unwrap(), Outcome::Processed(()));
            db.connect().batch_execute($redefine).unwrap();
            let error = second(&mut conn, "m-1").unwrap_err();
            assert_eq!(error.class(), ErrorClass::Schema, "{error:?}");
            assert_eq!(
                count(
                    &mut conn,
                    "SELECT count(*) AS n FROM inbox WHERE consumer = 'second'"
                ),
                1,
                "only m-0's marker"
            );
            match $still_duplicate {
                // A real duplicate is still one (MySQL, MariaDB: the index takes inserts).
                true => assert!(first(&mut conn, "m-1").unwrap().is_duplicate()),
                // PostgreSQL plans the marker's insert against a unique index on the pair:
                // without one every marker is refused, the table's fault named.
                false => assert_eq!(
                    first(&mut conn, "m-1").unwrap_err().class(),
                    ErrorClass::Schema
                ),
            }
        }
    };
}

#[cfg(feature = "mysql")]
mod mysql {
    redefined_index!(
        inbox_tests::mysql::MysqlDb,
        diesel::MysqlConnection,
        "ALTER TABLE inbox DROP INDEX ux_inbox_message_consumer, \
         ADD UNIQUE INDEX ux_inbox_message_consumer (message_id)",
        true
    );
}

#[cfg(feature = "postgres")]
mod postgres {
    redefined_index!(
        inbox_tests::postgres::PgDb,
        diesel::PgConnection,
        "ALTER TABLE inbox DROP CONSTRAINT IF EXISTS ux_inbox_message_consumer;
         DROP INDEX IF EXISTS ux_inbox_message_consumer;
         CREATE UNIQUE INDEX ux_inbox_message_consumer ON inbox (message_id)",
        false
    );
}

/// A batch on a MariaDB session whose `sql_mode` is not strict, which the check has not seen
/// (the check is remembered per handler; the server session is new). Its multi-row marker
/// insert turned the mark's `NULL` consumer into `''` with a warning, wrote markers of
/// nobody, and the batch's messages were applied again on redelivery. The insert runs in
/// strict mode: the session is refused, checked, and the batch applied once.
#[cfg(feature = "mysql")]
mod non_strict {
    use diesel::connection::SimpleConnection;
    use diesel::{MysqlConnection, RunQueryDsl};
    use inbox_diesel::idempotent;
    use inbox_tests::mysql::MysqlDb;
    use inbox_tests::server::count;

    #[idempotent(consumer = "batch", batch = msgs, key = |msg| msg.as_str())]
    fn credit_all(
        conn: &mut MysqlConnection,
        msgs: &[String],
    ) -> Result<usize, inbox_diesel::Error> {
        for _ in msgs {
            diesel::sql_query("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
                .execute(conn)?;
        }
        Ok(msgs.len())
    }

    fn non_strict(db: &MysqlDb) -> MysqlConnection {
        let mut conn = db.connect();
        conn.batch_execute("SET SESSION sql_mode = ''").unwrap();
        conn
    }

    #[test]
    fn a_batch_on_a_new_non_strict_session_is_applied_once() {
        let db = MysqlDb::new("non_strict_batch");
        let first: Vec<String> = (0..3).map(|n| format!("a-{n}")).collect();
        let outcome = credit_all(&mut non_strict(&db), &first).unwrap();
        assert_eq!(outcome.processed.len(), 3, "{outcome:?}");
        let second: Vec<String> = (0..3).map(|n| format!("b-{n}")).collect();
        let outcome = credit_all(&mut non_strict(&db), &second).unwrap();
        assert_eq!(outcome.processed.len(), 3, "{outcome:?}");
        // Delivered again, on yet another new session: all duplicates.
        let again = credit_all(&mut non_strict(&db), &second).unwrap();
        assert_eq!(again.duplicates.len(), 3, "{again:?}");
        let mut conn = db.connect();
        assert_eq!(
            count(
                &mut conn,
                "SELECT count(*) AS n FROM inbox WHERE consumer = ''"
            ),
            0
        );
        assert_eq!(
            count(&mut conn, "SELECT balance AS n FROM accounts WHERE id = 1"),
            6
        );
    }
}

/// A MariaDB session marked as checked by a transaction-mode handler is not taken as checked
/// for claim mode, whose statements take more privileges: here a role that may insert
/// markers but not update them. The claim handler's check, remembered from another session
/// (a role that may), ran again on this one and refused it before the side effect; before
/// the mark recorded the mode, the side effect ran and its stamp failed.
#[cfg(feature = "mysql")]
mod claim_after_transaction_mode {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use diesel::connection::SimpleConnection;
    use diesel::{Connection, MysqlConnection};
    use inbox_diesel::{ErrorClass, idempotent};
    use inbox_tests::mysql::MysqlDb;

    #[idempotent(consumer = "recorded", key = id)]
    fn record(conn: &mut MysqlConnection, id: &str) -> Result<(), inbox_diesel::Error> {
        let _ = (conn, id);
        Ok(())
    }

    #[idempotent(consumer = "notified", key = id, mode = "claim")]
    fn notify(
        conn: &mut MysqlConnection,
        id: &str,
        sent: &AtomicUsize,
    ) -> Result<(), inbox_diesel::Error> {
        let _ = id;
        sent.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    #[test]
    fn a_claim_handler_checks_a_session_marked_for_transaction_mode() {
        let db = MysqlDb::new("claim_after_tx");
        let sent = AtomicUsize::new(0);
        // Checked, and remembered, where the role may do everything.
        assert!(
            notify(&mut db.connect(), "first", &sent)
                .unwrap()
                .is_processed()
        );
        let mut admin = db.connect();
        admin
            .batch_execute("CREATE USER IF NOT EXISTS 'inbox_claim_mode'@'%'")
            .unwrap();
        admin
            .batch_execute(&format!(
                "GRANT SELECT, INSERT ON {}.inbox TO 'inbox_claim_mode'@'%'",
                db.name()
            ))
            .unwrap();
        let mut app = MysqlConnection::establish(&db.url_as("inbox_claim_mode")).unwrap();
        assert!(record(&mut app, "a").unwrap().is_processed());
        let error = notify(&mut app, "b", &sent).unwrap_err();
        assert_eq!(error.class(), ErrorClass::Schema, "{error:?}");
        assert_eq!(sent.load(Ordering::SeqCst), 1, "no side effect for b");
        admin
            .batch_execute("DROP USER 'inbox_claim_mode'@'%'")
            .unwrap();
    }
}

/// A precheck on a MariaDB session given `READ UNCOMMITTED` for its next transaction only
/// (`SET TRANSACTION ISOLATION LEVEL …`, which no variable shows): the precheck's read is
/// that transaction, and another delivery's uncommitted marker read as completed — answered
/// `Duplicate`, and lost when that delivery rolled back. The read is a locking one: it waits
/// for the delivery holding the marker and sees what it ended with.
#[cfg(feature = "mysql")]
mod precheck_next_transaction {
    use diesel::connection::SimpleConnection;
    use diesel::{MysqlConnection, RunQueryDsl};
    use inbox_diesel::{MessageKey, Outcome, idempotent};
    use inbox_tests::mysql::MysqlDb;
    use inbox_tests::server::count;

    #[idempotent(consumer = "pre", key = id, precheck = true)]
    fn credit(conn: &mut MysqlConnection, id: &str) -> Result<(), inbox_diesel::Error> {
        diesel::sql_query("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
            .execute(conn)?;
        Ok(())
    }

    #[test]
    fn a_precheck_never_reads_a_marker_that_may_roll_back() {
        let db = MysqlDb::new("precheck_next_ru");
        let id = MessageKey::text("m-1").unwrap().stored_id();
        let mut holder = db.connect();
        holder
            .batch_execute(&format!(
                "START TRANSACTION; INSERT INTO inbox (message_id, consumer, received_at, \
                 processed_at) VALUES (x'{}', 'pre', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))",
                id.simple()
            ))
            .unwrap();
        let mut conn = db.connect();
        conn.batch_execute("SET TRANSACTION ISOLATION LEVEL READ UNCOMMITTED")
            .unwrap();
        std::thread::scope(|scope| {
            let delivery = scope.spawn(|| credit(&mut conn, "m-1"));
            inbox_tests::wait_until("the precheck waits for the marker's lock", || {
                db.waiting_for_a_lock() == 1
            });
            holder.batch_execute("ROLLBACK").unwrap();
            assert_eq!(delivery.join().unwrap().unwrap(), Outcome::Processed(()));
        });
        assert_eq!(
            count(
                &mut db.connect(),
                "SELECT balance AS n FROM accounts WHERE id = 1"
            ),
            1
        );
    }
}

/// A handler returning `diesel::QueryResult` keeps the runtime's class: a marker refused by a
/// `CHECK` added after the startup check is a schema fault (`Alert`), and `classify` of the
/// diesel error the handler returns says so — before, it read the raw error again and said
/// `Other` (`DeadLetter`).
#[cfg(feature = "postgres")]
mod query_result_handler {
    use diesel::PgConnection;
    use diesel::connection::SimpleConnection;
    use inbox_diesel::{Action, ErrorClass, InboxSchema, classify, idempotent};
    use inbox_tests::postgres::PgDb;

    #[idempotent(consumer = "checked", key = id)]
    fn handle(conn: &mut PgConnection, id: &str) -> diesel::QueryResult<()> {
        let _ = (conn, id);
        Ok(())
    }

    #[test]
    fn a_refused_marker_stays_a_schema_fault() {
        let db = PgDb::new("query_result_class");
        let mut conn = db.connect();
        assert!(handle(&mut conn, "a").unwrap().is_processed());
        db.connect()
            .batch_execute(
                "ALTER TABLE inbox ADD CONSTRAINT ck_short CHECK (length(consumer) < 3) NOT VALID",
            )
            .unwrap();
        let error = handle(&mut conn, "b").unwrap_err();
        let class = classify(&error, &InboxSchema::DEFAULT);
        assert_eq!(class, ErrorClass::Schema, "{error:?}");
        assert_eq!(class.action(), Action::Alert);
    }
}

/// Claim mode on a table that swallows inserts since the check (a `BEFORE INSERT` trigger
/// returning `NULL`): every claim insert writes nothing and no claim is there. Before, the
/// runtime took each round for a claim removed under it and answered `InFlight` for ever,
/// with no alert; it is a schema fault (`Alert`), and the side effect never runs.
#[cfg(feature = "postgres")]
mod claim_swallowed {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use diesel::PgConnection;
    use diesel::connection::SimpleConnection;
    use inbox_diesel::{Action, ErrorClass, idempotent};
    use inbox_tests::postgres::PgDb;

    #[idempotent(consumer = "notified", key = id, mode = "claim")]
    fn notify(
        conn: &mut PgConnection,
        id: &str,
        sent: &AtomicUsize,
    ) -> Result<(), inbox_diesel::Error> {
        let _ = id;
        sent.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    #[test]
    fn a_trigger_added_after_the_check_is_a_schema_fault() {
        let db = PgDb::new("claim_swallowed");
        let sent = AtomicUsize::new(0);
        let mut conn = db.connect();
        assert!(notify(&mut conn, "a", &sent).unwrap().is_processed());
        db.connect()
            .batch_execute(
                "CREATE FUNCTION swallow() RETURNS trigger LANGUAGE plpgsql
                     AS $$ BEGIN RETURN NULL; END $$;
                 CREATE TRIGGER swallow BEFORE INSERT ON inbox
                     FOR EACH ROW EXECUTE FUNCTION swallow()",
            )
            .unwrap();
        let error = notify(&mut conn, "b", &sent).unwrap_err();
        assert_eq!(error.class(), ErrorClass::Schema, "{error:?}");
        assert_eq!(error.action(), Action::Alert);
        assert_eq!(sent.load(Ordering::SeqCst), 1, "no side effect for b");
    }
}

/// A connection to another database where a checked one stood, and a table created again
/// under a live connection, on PostgreSQL.
#[cfg(feature = "postgres")]
mod another_database {
    type Db = inbox_tests::postgres::PgDb;
    type DbConnection = diesel::PgConnection;
    const TRIGGER: &str = "CREATE FUNCTION audit() RETURNS trigger LANGUAGE plpgsql
             AS $$ BEGIN RETURN NEW; END $$;
         CREATE TRIGGER audit BEFORE INSERT ON inbox FOR EACH ROW EXECUTE FUNCTION audit()";

    include!("behaviour/tenants.rs");

    /// The table dropped and created again while the connection lives (a migration tool's
    /// "recreate"): the insert names another table now, and the new table is checked — here
    /// refused, as it came back with a trigger.
    #[test]
    fn a_table_created_again_is_checked_again() {
        let db = Db::new("tenant_recreated");
        let mut conn = db.connect();
        assert!(credit(&mut conn, "m-1").unwrap().is_processed());
        let create = inbox_diesel::schema::Backend::Postgres
            .create_table_sql(&inbox_diesel::InboxSchema::DEFAULT);
        db.connect()
            .batch_execute(&format!("DROP TABLE inbox; {create}; {TRIGGER}"))
            .unwrap();
        refused(credit(&mut conn, "m-2"));
        assert_eq!(markers(&db), 0);
    }
}

/// A transaction-mode handler on diesel-async's connection after a transaction opened as
/// SQL: refused, the caller's write not committed, the same connection going on once the
/// caller ended its transaction.
#[cfg(any(feature = "postgres", feature = "mysql"))]
macro_rules! raw_begin_async {
    ($conn:ty, $begin:literal) => {
        #[idempotent(consumer = "raw-begin-tx-async", key = id)]
        async fn credit_async(conn: &mut $conn, id: &str) -> Result<(), Error> {
            let _ = id;
            let update =
                diesel::sql_query("UPDATE accounts SET balance = balance + 1 WHERE id = 1");
            diesel_async::RunQueryDsl::execute(update, conn).await?;
            Ok(())
        }

        #[tokio::test]
        async fn an_async_handler_inside_a_transaction_opened_as_sql_is_refused() {
            use diesel_async::SimpleAsyncConnection;
            let db = Db::new("raw_begin_tx_async");
            let mut conn = db.connect_async().await;
            assert!(credit_async(&mut conn, "c-0").await.unwrap().is_processed());
            conn.batch_execute(concat!(
                $begin,
                "; UPDATE accounts SET balance = balance + 1000 WHERE id = 2"
            ))
            .await
            .unwrap();
            let error = credit_async(&mut conn, "c-1").await.unwrap_err();
            assert!(matches!(error, Error::CalledInsideTransaction), "{error:?}");
            assert_eq!(
                inbox_tests::balance(&mut db.connect(), 2),
                0,
                "the caller's write committed"
            );
            conn.batch_execute("ROLLBACK").await.unwrap();
            assert!(credit_async(&mut conn, "c-1").await.unwrap().is_processed());
            assert!(credit_async(&mut conn, "c-1").await.unwrap().is_duplicate());
            assert_eq!(inbox_tests::balance(&mut db.connect(), 1), 2);
            assert_eq!(inbox_tests::balance(&mut db.connect(), 2), 0);
        }
    };
}

/// Claim mode on PostgreSQL and MariaDB after a transaction opened as SQL.
#[cfg(feature = "postgres")]
mod raw_begin_postgres {
    type Db = inbox_tests::postgres::PgDb;
    type DbConnection = diesel::PgConnection;
    /// A transaction with nothing in it yet, one that has written, and one whose
    /// statement failed.
    const BEGIN: [&str; 3] = [
        "BEGIN",
        "BEGIN; UPDATE accounts SET balance = balance WHERE id = 1",
        "BEGIN; SAVEPOINT s; SELECT 1",
    ];

    include!("behaviour/raw_begin.rs");

    raw_begin_async!(diesel_async::AsyncPgConnection, "BEGIN");

    #[idempotent(consumer = "raw-begin-async", key = id, mode = "claim")]
    async fn notify_async(
        conn: &mut diesel_async::AsyncPgConnection,
        id: &str,
        sent: &AtomicUsize,
    ) -> Result<(), Error> {
        let _ = id;
        sent.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    /// The same on diesel-async's connection.
    #[tokio::test]
    async fn an_async_claim_inside_a_transaction_opened_as_sql_is_refused() {
        use diesel_async::SimpleAsyncConnection;
        let db = Db::new("raw_begin_async");
        let sent = AtomicUsize::new(0);
        let mut conn = db.connect_async().await;
        assert!(
            notify_async(&mut conn, "n-0", &sent)
                .await
                .unwrap()
                .is_processed()
        );
        conn.batch_execute("BEGIN").await.unwrap();
        let error = notify_async(&mut conn, "n-1", &sent).await.unwrap_err();
        assert!(matches!(error, Error::CalledInsideTransaction), "{error:?}");
        assert_eq!(sent.load(Ordering::SeqCst), 1);
        conn.batch_execute("ROLLBACK").await.unwrap();
        assert!(
            notify_async(&mut conn, "n-1", &sent)
                .await
                .unwrap()
                .is_processed()
        );
    }
}

#[cfg(feature = "mysql")]
mod raw_begin_mysql {
    type Db = inbox_tests::mysql::MysqlDb;
    type DbConnection = diesel::MysqlConnection;
    const BEGIN: [&str; 3] = [
        "START TRANSACTION",
        "BEGIN; UPDATE accounts SET balance = balance WHERE id = 1",
        "START TRANSACTION WITH CONSISTENT SNAPSHOT",
    ];

    include!("behaviour/raw_begin.rs");

    raw_begin_async!(diesel_async::AsyncMysqlConnection, "START TRANSACTION");
}

/// A schema per tenant, a connection pointed from one to the other by `search_path`: the
/// second tenant's inbox created while the connection lives, after its check of the first.
/// The statements named the table the check had found (`ten1.inbox`): the second tenant's
/// message of an id the first had seen was answered `Duplicate` — lost —, and its new
/// messages' markers went into the first tenant's table. The insert (and a precheck's read)
/// requires the table the handler's unqualified name resolves to on the session to be the
/// one checked: there it is another, the session is checked again, and refused (an
/// unqualified name that means one table per `search_path`).
#[cfg(feature = "postgres")]
mod schema_per_tenant {
    use diesel::connection::SimpleConnection;
    use diesel::{PgConnection, RunQueryDsl};
    use inbox_diesel::{ErrorClass, idempotent};
    use inbox_tests::count;
    use inbox_tests::postgres::PgDb;

    #[idempotent(consumer = "tenant", key = id)]
    fn record(conn: &mut PgConnection, id: &str) -> Result<(), inbox_diesel::Error> {
        diesel::sql_query("INSERT INTO effects (id) VALUES ($1)")
            .bind::<diesel::sql_types::Text, _>(id)
            .execute(conn)?;
        Ok(())
    }

    #[idempotent(consumer = "tenant", key = id, precheck = true)]
    fn record_prechecked(conn: &mut PgConnection, id: &str) -> Result<(), inbox_diesel::Error> {
        diesel::sql_query("INSERT INTO effects (id) VALUES ($1)")
            .bind::<diesel::sql_types::Text, _>(id)
            .execute(conn)?;
        Ok(())
    }

    #[test]
    fn a_session_pointed_at_another_tenants_schema_is_checked_there() {
        let db = PgDb::new("schema_tenants");
        let inbox =
            inbox_diesel::schema::postgres::create_table_sql(&inbox_diesel::InboxSchema::DEFAULT);
        let mut admin = db.connect();
        admin
            .batch_execute(&format!(
                "DROP TABLE inbox; CREATE SCHEMA ten1; CREATE SCHEMA ten2;
                 CREATE TABLE ten1.effects (id TEXT NOT NULL);
                 CREATE TABLE ten2.effects (id TEXT NOT NULL);
                 SET search_path = ten1; {inbox}"
            ))
            .unwrap();
        let mut conn = db.connect();
        conn.batch_execute("SET search_path = ten1").unwrap();
        assert!(record(&mut conn, "m-1").unwrap().is_processed());
        assert!(record_prechecked(&mut conn, "m-1").unwrap().is_duplicate());
        // The second tenant onboarded while the connection lives.
        admin
            .batch_execute(&format!("SET search_path = ten2; {inbox}"))
            .unwrap();
        conn.batch_execute("SET search_path = ten2").unwrap();
        for (id, handler) in [
            ("m-1", record as fn(&mut PgConnection, &str) -> _),
            ("m-2", record),
            ("m-1", record_prechecked),
        ] {
            let error = handler(&mut conn, id).unwrap_err();
            assert_eq!(error.class(), ErrorClass::Schema, "{id}: {error:?}");
            let chain = inbox_tests::error_chain(&error);
            assert!(chain.contains("ten1, ten2"), "{chain}");
        }
        let n = |sql: &str| count(&mut db.connect(), sql);
        assert_eq!(n("SELECT count(*) AS n FROM ten1.inbox"), 1);
        assert_eq!(n("SELECT count(*) AS n FROM ten2.inbox"), 0);
        assert_eq!(n("SELECT count(*) AS n FROM ten1.effects"), 1);
        assert_eq!(n("SELECT count(*) AS n FROM ten2.effects"), 0);
    }
}

/// [`schema_per_tenant`] on diesel-async, in a caller's transaction (`transaction =
/// "caller"`): there the marker's insert is a statement of its own, not the one round trip
/// of the handler's own start, and it requires the checked table as that start does. It did
/// not on diesel-async: the second tenant's marker went into the first tenant's table.
#[cfg(feature = "postgres")]
mod schema_per_tenant_joined_async {
    use diesel::sql_types::Text;
    use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
    use inbox_diesel::{ErrorClass, Outcome, idempotent};
    use inbox_tests::count;
    use inbox_tests::postgres::PgDb;

    #[idempotent(consumer = "tenant", key = id, transaction = "caller")]
    async fn record(conn: &mut AsyncPgConnection, id: &str) -> Result<(), inbox_diesel::Error> {
        diesel::sql_query("INSERT INTO effects (id) VALUES ($1)")
            .bind::<Text, _>(id)
            .execute(conn)
            .await?;
        Ok(())
    }

    async fn in_callers_transaction(
        conn: &mut AsyncPgConnection,
        id: &str,
    ) -> Result<Outcome<()>, inbox_diesel::Error> {
        conn.transaction::<_, inbox_diesel::Error, _>(async |conn| record(conn, id).await)
            .await
    }

    #[tokio::test]
    async fn a_session_pointed_at_another_tenants_schema_is_checked_there() {
        let db = PgDb::new("schema_tenants_async");
        let inbox =
            inbox_diesel::schema::postgres::create_table_sql(&inbox_diesel::InboxSchema::DEFAULT);
        let mut admin = db.connect_async().await;
        admin
            .batch_execute(&format!(
                "DROP TABLE inbox; CREATE SCHEMA ten1; CREATE SCHEMA ten2;
                 CREATE TABLE ten1.effects (id TEXT NOT NULL);
                 CREATE TABLE ten2.effects (id TEXT NOT NULL);
                 SET search_path = ten1; {inbox}"
            ))
            .await
            .unwrap();
        let mut conn = db.connect_async().await;
        conn.batch_execute("SET search_path = ten1").await.unwrap();
        let first = in_callers_transaction(&mut conn, "m-1").await.unwrap();
        assert!(first.is_processed());
        // The second tenant onboarded while the connection lives.
        admin
            .batch_execute(&format!("SET search_path = ten2; {inbox}"))
            .await
            .unwrap();
        conn.batch_execute("SET search_path = ten2").await.unwrap();
        for id in ["m-1", "m-2"] {
            let error = in_callers_transaction(&mut conn, id).await.unwrap_err();
            assert_eq!(error.class(), ErrorClass::Schema, "{id}: {error:?}");
            let chain = inbox_tests::error_chain(&error);
            assert!(chain.contains("ten1, ten2"), "{chain}");
        }
        let n = |sql: &str| count(&mut db.connect(), sql);
        assert_eq!(n("SELECT count(*) AS n FROM ten1.inbox"), 1);
        assert_eq!(n("SELECT count(*) AS n FROM ten2.inbox"), 0);
        assert_eq!(n("SELECT count(*) AS n FROM ten1.effects"), 1);
        assert_eq!(n("SELECT count(*) AS n FROM ten2.effects"), 0);
    }
}
