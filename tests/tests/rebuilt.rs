#![cfg(any(feature = "postgres", feature = "mysql"))]
//! What operators do to a live database, met by handlers that are running: a migration that
//! retypes a column, a table rebuilt under a transaction, an account's hourly limit, a
//! session's settings that bound its `SELECT`s or quote every identifier. Each is what a
//! redelivery (or the same attempt, its statement unprepared) gets past, or what an operator
//! must act on: never a dead letter, never a healthy table refused.

/// Delivers until the answer is not a statement timeout: under an operator's tight bound the
/// handler's own statements keep it, and on a loaded machine one of them can pass it — a
/// transient failure that a redelivery retries. The startup check's reads run past such a
/// bound on every attempt unless the check lifts it for them: twenty in a row fail the test.
fn under_a_tight_bound<T>(mut deliver: impl FnMut() -> Result<T, inbox_diesel::Error>) -> T {
    use inbox_diesel::{ErrorClass, TransientKind};
    for _ in 0..20 {
        match deliver() {
            Err(e) if e.class() == ErrorClass::Transient(TransientKind::StatementTimeout) => {}
            answer => return answer.unwrap(),
        }
    }
    panic!("twenty deliveries in a row timed out");
}

#[cfg(feature = "postgres")]
mod postgres {
    use diesel::connection::SimpleConnection;
    use diesel::prelude::*;
    use inbox_diesel::{Outcome, idempotent};
    use inbox_tests::postgres::PgDb;
    use inbox_tests::server::count;

    diesel::table! {
        accounts (id) {
            id -> Integer,
            note -> Varchar,
            balance -> BigInt,
        }
    }

    #[idempotent(consumer = "credit", key = id)]
    fn credit(conn: &mut PgConnection, id: &str) -> Result<i64, inbox_diesel::Error> {
        diesel::update(accounts::table.find(1))
            .set(accounts::balance.eq(accounts::balance + 1))
            .execute(conn)?;
        let (_note, balance): (String, i64) = accounts::table
            .find(1)
            .select((accounts::note, accounts::balance))
            .first(conn)?;
        Ok(balance)
    }

    fn with_note(db: &PgDb) {
        db.connect()
            .batch_execute("ALTER TABLE accounts ADD COLUMN note VARCHAR(10) NOT NULL DEFAULT 'x'")
            .unwrap();
    }

    /// A column that a statement diesel cached reads is retyped while consumers run:
    /// PostgreSQL refuses the cached plan (`cached plan must not change result type`, 0A000)
    /// on every connection that ran it before, and the delivery was dead-lettered. The
    /// attempt runs again with the statement unprepared.
    #[test]
    fn a_column_retyped_under_a_cached_statement_is_read_again() {
        let db = PgDb::new("retyped_column");
        with_note(&db);
        let mut conn = db.connect();
        assert_eq!(credit(&mut conn, "m-1").unwrap(), Outcome::Processed(1));
        db.connect()
            .batch_execute("ALTER TABLE accounts ALTER COLUMN note TYPE VARCHAR(20)")
            .unwrap();
        assert_eq!(credit(&mut conn, "m-2").unwrap(), Outcome::Processed(2));
        assert_eq!(credit(&mut conn, "m-3").unwrap(), Outcome::Processed(3));
        assert!(credit(&mut conn, "m-2").unwrap().is_duplicate());
        assert_eq!(
            count(
                &mut conn,
                "SELECT count(*) AS n FROM inbox WHERE consumer = 'credit'"
            ),
            3
        );
    }

    #[idempotent(consumer = "lock-all", key = id)]
    fn lock_all(conn: &mut PgConnection, id: &str) -> Result<(), inbox_diesel::Error> {
        diesel::sql_query(
            "DO $$ BEGIN FOR i IN 1..1000 LOOP \
             EXECUTE format('LOCK TABLE t%s IN ACCESS EXCLUSIVE MODE', i); END LOOP; END $$",
        )
        .execute(conn)?;
        Ok(())
    }

    /// A transaction that needs more locks than the server's lock table holds
    /// (`max_locks_per_transaction`: "out of shared memory", 53200) was dead-lettered. The
    /// server is short, not the message: an alert, and after the operator raises the
    /// setting the redelivery processes it.
    #[test]
    fn a_server_short_of_lock_memory_alerts() {
        use inbox_diesel::{Action, ErrorClass};
        let server = inbox_tests::private::PrivatePostgres::start_with(
            "C",
            &[
                "max_locks_per_transaction=10",
                "max_connections=5",
                "autovacuum_max_workers=1",
                "max_worker_processes=0",
                "max_wal_senders=0",
            ],
        );
        let url = server.url("postgres", "postgres");
        let mut conn = PgConnection::establish(&url).unwrap();
        conn.batch_execute(&inbox_diesel::schema::postgres::create_table_sql(
            &inbox_diesel::InboxSchema::DEFAULT,
        ))
        .unwrap();
        // Ten at a time: a string of statements is one transaction, which takes a lock each.
        for first in (1..=1000).step_by(10) {
            let tables: String = (first..first + 10)
                .map(|i| format!("CREATE TABLE t{i} (id int);"))
                .collect();
            conn.batch_execute(&tables).unwrap();
        }
        let error = lock_all(&mut conn, "m-1").unwrap_err();
        assert_eq!(error.class(), ErrorClass::ResourceExhausted, "{error:?}");
        assert_eq!(error.action(), Action::Alert);
        assert_eq!(count(&mut conn, "SELECT count(*) AS n FROM inbox"), 0);
    }

    #[idempotent(consumer = "notes", key = id)]
    fn note(conn: &mut PgConnection, id: &str) -> Result<(), inbox_diesel::Error> {
        diesel::sql_query("UPDATE notes SET v = v + 1").execute(conn)?;
        Ok(())
    }

    #[idempotent(consumer = "sorted", key = id)]
    fn sorted(conn: &mut PgConnection, id: &str) -> Result<(), inbox_diesel::Error> {
        diesel::sql_query(
            "CREATE TEMP TABLE IF NOT EXISTS sorted AS \
             SELECT g FROM generate_series(1, 200000) g ORDER BY g DESC",
        )
        .execute(conn)?;
        Ok(())
    }

    /// Settings a role or a database gives its sessions, met in a body: a table a
    /// publication publishes updates of, without a replica identity (55000), and a sort
    /// past `temp_file_limit` (53400) were dead-lettered — a schema fault and a resource the
    /// server lacks, alerts both; the redelivery after the operator's fix processes them.
    #[test]
    fn a_publication_or_a_temp_file_limit_alerts() {
        use inbox_diesel::{Action, ErrorClass};
        let db = PgDb::new("publication");
        let mut admin = db.connect();
        admin
            .batch_execute(
                "CREATE TABLE notes (v int NOT NULL); INSERT INTO notes VALUES (0); \
                 CREATE PUBLICATION notes_out FOR TABLE notes",
            )
            .unwrap();
        let mut conn = db.connect();
        let error = note(&mut conn, "m-1").unwrap_err();
        assert_eq!(error.class(), ErrorClass::Schema, "{error:?}");
        assert_eq!(error.action(), Action::Alert);
        admin
            .batch_execute("ALTER TABLE notes REPLICA IDENTITY FULL")
            .unwrap();
        assert!(note(&mut conn, "m-1").unwrap().is_processed());

        conn.batch_execute("SET work_mem = '64kB'; SET temp_file_limit = '64kB'")
            .unwrap();
        let error = sorted(&mut conn, "m-2").unwrap_err();
        assert_eq!(error.class(), ErrorClass::ResourceExhausted, "{error:?}");
        assert_eq!(error.action(), Action::Alert);
        conn.batch_execute("RESET temp_file_limit").unwrap();
        assert!(sorted(&mut conn, "m-2").unwrap().is_processed());
        admin.batch_execute("DROP PUBLICATION notes_out").unwrap();
    }

    #[idempotent(consumer = "mail", key = id, mode = "claim")]
    fn mail(
        conn: &mut PgConnection,
        id: &str,
        sent: &std::sync::atomic::AtomicUsize,
    ) -> Result<(), inbox_diesel::Error> {
        sent.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }

    /// An inbox a publication publishes updates of, without a replica identity (a
    /// partitioned inbox's partitions have no primary key; here `REPLICA IDENTITY NOTHING`):
    /// claim mode's stamp after the side effect was refused by the server, the claim stayed,
    /// and the effect would run again once its lease ended. The check refuses claim mode
    /// there before any effect; transaction mode, which only inserts, goes on.
    #[test]
    fn claim_mode_on_an_inbox_published_without_a_replica_identity_is_refused() {
        let db = PgDb::new("published_inbox");
        with_note(&db);
        let mut admin = db.connect();
        admin
            .batch_execute(
                "ALTER TABLE inbox REPLICA IDENTITY NOTHING; \
                 CREATE PUBLICATION inbox_out FOR TABLE inbox",
            )
            .unwrap();
        let sent = std::sync::atomic::AtomicUsize::new(0);
        let mut conn = db.connect();
        let error = mail(&mut conn, "m-1", &sent).unwrap_err();
        assert!(matches!(error, inbox_diesel::Error::Schema(_)), "{error:?}");
        assert!(error.to_string().contains("replica identity"), "{error}");
        assert_eq!(
            sent.load(std::sync::atomic::Ordering::SeqCst),
            0,
            "no effect ran"
        );
        assert_eq!(credit(&mut conn, "m-1").unwrap(), Outcome::Processed(1));
        admin
            .batch_execute("ALTER TABLE inbox REPLICA IDENTITY DEFAULT")
            .unwrap();
        assert!(mail(&mut conn, "m-1", &sent).unwrap().is_processed());
        assert_eq!(sent.load(std::sync::atomic::Ordering::SeqCst), 1);
        admin.batch_execute("DROP PUBLICATION inbox_out").unwrap();
    }

    /// `exit_on_error = on` (any role may set it, a role's or a database's setting gives it
    /// to every session): the server ended the session at the first error the runtime
    /// expects — its marker statement not yet prepared on a new session —, and every
    /// delivery failed as a lost connection, for ever. The check refuses the session,
    /// naming the setting.
    #[test]
    fn a_session_that_exits_on_error_is_refused_by_the_check() {
        let db = PgDb::new("exit_on_error");
        with_note(&db);
        let mut conn = db.connect();
        conn.batch_execute("SET exit_on_error = on").unwrap();
        let error = credit(&mut conn, "m-1").unwrap_err();
        assert!(matches!(error, inbox_diesel::Error::Schema(_)), "{error:?}");
        assert!(error.to_string().contains("exit_on_error"), "{error}");
        conn.batch_execute("SET exit_on_error = off").unwrap();
        assert_eq!(credit(&mut conn, "m-1").unwrap(), Outcome::Processed(1));
    }

    #[derive(QueryableByName)]
    struct Setting {
        #[diesel(sql_type = diesel::sql_types::Text)]
        value: String,
    }

    /// A role's tight `statement_timeout` (`2ms`, what an operator sets to keep an OLTP
    /// service's queries short): the startup check's catalog reads ran past it on every new
    /// session, and every delivery failed as a transient timeout — retried until the
    /// broker's limit dead-lettered it. The check lifts the bound for its own reads and puts
    /// it back: the handler's statements keep it.
    #[test]
    fn a_tight_statement_timeout_leaves_the_check_alone() {
        let db = PgDb::new("tight_timeout");
        with_note(&db);
        let mut conn = db.connect();
        conn.batch_execute("SET statement_timeout = '2ms'").unwrap();
        for (i, id) in ["m-1", "m-2", "m-3"].into_iter().enumerate() {
            let outcome = super::under_a_tight_bound(|| credit(&mut conn, id));
            assert_eq!(outcome, Outcome::Processed(i as i64 + 1));
        }
        assert!(super::under_a_tight_bound(|| credit(&mut conn, "m-1")).is_duplicate());
        let setting: Setting =
            diesel::sql_query("SELECT current_setting('statement_timeout') AS value")
                .get_result(&mut conn)
                .unwrap();
        assert_eq!(setting.value, "2ms", "the session's own bound is put back");
        let slow = diesel::sql_query("SELECT pg_sleep(0.05)").execute(&mut conn);
        assert!(slow.is_err(), "and holds for the application's statements");
        assert_eq!(
            count(
                &mut db.connect(),
                "SELECT balance AS n FROM accounts WHERE id = 1"
            ),
            3
        );
    }

    /// A session whose `search_path` leaves out the inbox's schema (a role's `search_path =
    /// ''`, a hardened setup): the check said the table does not exist and to generate it,
    /// though it is there. It says where the table is and what to set.
    #[test]
    fn a_table_outside_the_search_path_is_named_with_the_fix() {
        let db = PgDb::new("search_path");
        with_note(&db);
        let mut conn = db.connect();
        conn.batch_execute("SET search_path = ''").unwrap();
        let error = credit(&mut conn, "m-1").unwrap_err();
        assert!(matches!(error, inbox_diesel::Error::Schema(_)), "{error:?}");
        let message = error.to_string();
        assert!(message.contains("search_path"), "{message}");
        assert!(message.contains("public.inbox"), "{message}");
        conn.batch_execute("SET search_path = public").unwrap();
        assert_eq!(credit(&mut conn, "m-1").unwrap(), Outcome::Processed(1));
    }

    mod asynchronous {
        use diesel::{ExpressionMethods, QueryDsl};
        use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
        use inbox_diesel::{Outcome, idempotent};
        use inbox_tests::postgres::PgDb;

        use super::accounts;

        #[idempotent(consumer = "credit", key = id)]
        async fn credit(
            conn: &mut AsyncPgConnection,
            id: &str,
        ) -> Result<i64, inbox_diesel::Error> {
            diesel::update(accounts::table.find(1))
                .set(accounts::balance.eq(accounts::balance + 1))
                .execute(conn)
                .await?;
            let (_note, balance): (String, i64) = accounts::table
                .find(1)
                .select((accounts::note, accounts::balance))
                .first(conn)
                .await?;
            Ok(balance)
        }

        /// The same on diesel-async's connection, whose statement cache is its own.
        #[tokio::test]
        async fn a_column_retyped_under_a_cached_statement_is_read_again() {
            let db = PgDb::new("retyped_column_async");
            super::with_note(&db);
            let mut conn = db.connect_async().await;
            assert_eq!(
                credit(&mut conn, "m-1").await.unwrap(),
                Outcome::Processed(1)
            );
            db.connect_async()
                .await
                .batch_execute("ALTER TABLE accounts ALTER COLUMN note TYPE VARCHAR(20)")
                .await
                .unwrap();
            assert_eq!(
                credit(&mut conn, "m-2").await.unwrap(),
                Outcome::Processed(2)
            );
            assert!(credit(&mut conn, "m-1").await.unwrap().is_duplicate());
        }
    }

    /// `quote_all_identifiers` (a role's or a database's setting, here the session's): the
    /// check read every column type quoted (`"uuid"`) and refused a healthy table, halting
    /// every consumer of the role.
    #[test]
    fn a_session_quoting_every_identifier_is_checked_as_any() {
        let db = PgDb::new("quote_all_identifiers");
        with_note(&db);
        let mut conn = db.connect();
        conn.batch_execute("SET quote_all_identifiers = on")
            .unwrap();
        assert_eq!(credit(&mut conn, "m-1").unwrap(), Outcome::Processed(1));
        assert!(credit(&mut conn, "m-1").unwrap().is_duplicate());
        assert_eq!(credit(&mut conn, "m-2").unwrap(), Outcome::Processed(2));
    }
}

#[cfg(feature = "mysql")]
mod mysql {
    use std::sync::atomic::{AtomicBool, Ordering};

    use diesel::connection::SimpleConnection;
    use diesel::prelude::*;
    use inbox_diesel::{Action, ErrorClass, Outcome, idempotent};
    use inbox_tests::mysql::MysqlDb;
    use inbox_tests::server::count;
    use inbox_tests::{accounts, credits};

    /// Another session's statement, run once, from inside the body: what an operator runs
    /// while the handler's transaction is open.
    struct Operator {
        url: String,
        statement: &'static str,
        done: AtomicBool,
    }

    impl Operator {
        fn once(&self) {
            if !self.done.swap(true, Ordering::SeqCst) {
                MysqlConnection::establish(&self.url)
                    .unwrap()
                    .batch_execute(self.statement)
                    .unwrap();
            }
        }
    }

    #[idempotent(consumer = "report", key = id)]
    fn report(
        conn: &mut MysqlConnection,
        id: &str,
        operator: &Operator,
    ) -> Result<i64, inbox_diesel::Error> {
        // The transaction's snapshot begins with its first read.
        let balance: i64 = accounts::table
            .find(1)
            .select(accounts::balance)
            .first(conn)?;
        operator.once();
        diesel::update(accounts::table.find(1))
            .set(accounts::balance.eq(accounts::balance + 1))
            .execute(conn)?;
        let credited: i64 = credits::table.count().get_result(conn)?;
        Ok(balance + credited)
    }

    /// A table the transaction reads is rebuilt after its snapshot began (`OPTIMIZE TABLE`,
    /// `ALTER … FORCE`, a copying `ALTER`, an online schema change's cut-over): MariaDB
    /// answers 1412, "Table definition has changed, please retry transaction", and the
    /// delivery was dead-lettered; read as a transient failure and retried on the session,
    /// the statement diesel had cached for the rebuilt table waited for an answer until the
    /// idle bound ended the session. It is retried in a fresh transaction, its statements
    /// unprepared, and applied once.
    #[test]
    fn a_table_rebuilt_under_the_transaction_is_retried() {
        for statement in ["ALTER TABLE credits FORCE", "OPTIMIZE TABLE credits"] {
            let db = MysqlDb::new("rebuilt_table");
            let operator = Operator {
                url: db.url().to_owned(),
                statement,
                done: AtomicBool::new(false),
            };
            let mut conn = db.connect();
            let outcome = report(&mut conn, "m-1", &operator).unwrap();
            assert_eq!(outcome, Outcome::Processed(0), "{statement}");
            assert!(operator.done.load(Ordering::SeqCst));
            assert_eq!(
                count(&mut conn, "SELECT balance AS n FROM accounts WHERE id = 1"),
                1,
                "{statement}: applied once"
            );
            assert_eq!(
                count(&mut conn, "SELECT count(*) AS n FROM inbox"),
                1,
                "{statement}"
            );
        }
    }

    #[idempotent(consumer = "credit", key = id)]
    fn credit(conn: &mut MysqlConnection, id: &str) -> Result<(), inbox_diesel::Error> {
        diesel::update(accounts::table.find(1))
            .set(accounts::balance.eq(accounts::balance + 1))
            .execute(conn)?;
        Ok(())
    }

    #[idempotent(consumer = "batch", batch = ids, key = |id| id.as_str())]
    fn credit_all(conn: &mut MysqlConnection, ids: &[String]) -> Result<(), inbox_diesel::Error> {
        for _ in ids {
            diesel::update(accounts::table.find(2))
                .set(accounts::balance.eq(accounts::balance + 1))
                .execute(conn)?;
        }
        Ok(())
    }

    /// A session whose `SELECT`s are bounded (`sql_select_limit`, which MySQL Workbench's
    /// safe mode sets): the check read one column of the table and refused it, naming
    /// columns that are there.
    #[test]
    fn a_session_with_a_select_limit_is_checked_as_any() {
        let db = MysqlDb::new("select_limit");
        let mut conn = db.connect();
        conn.batch_execute("SET SESSION sql_select_limit = 1")
            .unwrap();
        assert_eq!(credit(&mut conn, "m-1").unwrap(), Outcome::Processed(()));
        assert!(credit(&mut conn, "m-1").unwrap().is_duplicate());
        let ids: Vec<String> = ["m-1", "m-2", "m-3"].map(String::from).to_vec();
        let first = credit_all(&mut conn, &ids).unwrap();
        assert_eq!(first.processed, [0, 1, 2]);
        let again = credit_all(&mut conn, &ids).unwrap();
        assert_eq!(again.duplicates, [0, 1, 2]);
        assert_eq!(
            count(&mut conn, "SELECT balance AS n FROM accounts WHERE id = 2"),
            3
        );
    }

    /// The account's hourly limit spent (`MAX_UPDATES_PER_HOUR`, 1226): the marker's refused
    /// insert read as a schema fault, naming the table. It is the account's limit
    /// (`ResourceExhausted`): an alert, with the server's words as the source, never a dead
    /// letter.
    #[test]
    fn an_accounts_hourly_limit_is_named_and_halts() {
        let db = MysqlDb::new("hourly_limit");
        let user = format!("inbox_quota_{}", std::process::id());
        let mut admin = db.connect();
        admin
            .batch_execute(&format!(
                "CREATE USER '{user}'@'%'; GRANT ALL ON `{}`.* TO '{user}'@'%'; \
                 ALTER USER '{user}'@'%' WITH MAX_UPDATES_PER_HOUR 5",
                db.name()
            ))
            .unwrap();
        let dropped = DropUser(db.connect(), user.clone());
        let mut conn = db.connect_as(&user);
        let mut processed = 0;
        let error = loop {
            match credit(&mut conn, &format!("m-{processed}")) {
                Ok(outcome) => {
                    assert_eq!(outcome, Outcome::Processed(()));
                    processed += 1;
                    assert!(processed < 50, "the limit was never met");
                }
                Err(error) => break error,
            }
        };
        assert_eq!(error.class(), ErrorClass::ResourceExhausted, "{error:?}");
        assert_eq!(error.action(), Action::Alert);
        let chain = format!("{:?}", error);
        assert!(chain.contains("max_updates_per_hour"), "{chain}");
        assert_eq!(
            count(&mut admin, "SELECT balance AS n FROM accounts WHERE id = 1"),
            processed,
            "each processed message applied once, the refused one not at all"
        );
        drop(dropped);
    }

    /// A server that logs statements (`binlog_format = STATEMENT`) under `READ COMMITTED`
    /// (a server's `transaction_isolation`, common where applications came from other
    /// databases): InnoDB cannot log any write, and MariaDB refuses each with 1665. The
    /// delivery halted as a "schema mismatch"; it is the server's setting
    /// (`ServerSetting`), an alert naming the setting, with nothing written.
    #[test]
    fn a_server_setting_that_refuses_every_write_is_named() {
        let server = inbox_tests::private::PrivateMariadb::start(&[
            "--log-bin=binlog",
            "--server-id=1",
            "--binlog-format=STATEMENT",
            "--transaction-isolation=READ-COMMITTED",
        ]);
        let mut admin = server.admin();
        admin
            .batch_execute(
                &inbox_diesel::schema::Backend::Mysql
                    .create_table_sql(&inbox_diesel::InboxSchema::DEFAULT),
            )
            .unwrap();
        admin
            .batch_execute(
                "CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance BIGINT NOT NULL); \
                 INSERT INTO accounts VALUES (1, 0), (2, 0)",
            )
            .unwrap_err();
        // The server refuses the application's own writes too: the table is set up with
        // the statement logged as rows.
        admin
            .batch_execute(
                "SET SESSION binlog_format = 'ROW'; \
                 INSERT INTO accounts VALUES (1, 0), (2, 0)",
            )
            .unwrap();
        let mut conn = MysqlConnection::establish(&server.url("root")).unwrap();
        let error = credit(&mut conn, "m-1").unwrap_err();
        assert_eq!(error.class(), ErrorClass::ServerSetting, "{error:?}");
        assert_eq!(error.action(), Action::Alert);
        let chain = format!("{error}: {error:?}");
        assert!(chain.contains("BINLOG_FORMAT"), "{chain}");
        let ids: Vec<String> = ["m-1", "m-2"].map(String::from).to_vec();
        let error = credit_all(&mut conn, &ids).unwrap_err();
        assert_eq!(error.class(), ErrorClass::ServerSetting, "{error:?}");
        assert_eq!(count(&mut admin, "SELECT count(*) AS n FROM test.inbox"), 0);
        assert_eq!(
            count(&mut admin, "SELECT sum(balance) AS n FROM test.accounts"),
            0
        );
    }

    /// An account whose password expired (`ALTER USER … PASSWORD EXPIRE`, a password
    /// lifetime): MariaDB still opens its connections, in a mode that refuses every statement
    /// but the password's change (1820). The check's refused read halted as a "schema
    /// mismatch"; it is the account's (`PermissionDenied`), named, and nothing is written.
    #[test]
    fn an_expired_password_is_named_as_the_accounts() {
        let db = MysqlDb::new("expired_password");
        let user = format!("inbox_expired_{}", std::process::id());
        let mut admin = db.connect();
        admin
            .batch_execute(&format!(
                "CREATE USER '{user}'@'%'; GRANT ALL ON `{}`.* TO '{user}'@'%'; \
                 ALTER USER '{user}'@'%' PASSWORD EXPIRE",
                db.name()
            ))
            .unwrap();
        let dropped = DropUser(db.connect(), user.clone());
        let mut conn = db.connect_as(&user);
        let error = credit(&mut conn, "m-1").unwrap_err();
        assert_eq!(error.class(), ErrorClass::PermissionDenied, "{error:?}");
        assert_eq!(error.action(), Action::Alert);
        assert!(error.to_string().contains("SET PASSWORD"), "{error}");
        assert_eq!(count(&mut admin, "SELECT count(*) AS n FROM inbox"), 0);
        drop(dropped);
    }

    struct DropUser(MysqlConnection, String);

    impl Drop for DropUser {
        fn drop(&mut self) {
            let _ = self
                .0
                .batch_execute(&format!("DROP USER IF EXISTS '{}'@'%'", self.1));
        }
    }

    /// A session's tight `max_statement_time` (`0.001`, a millisecond): the check's catalog
    /// reads ran past it on every new session, and every delivery failed as a transient
    /// timeout. They run free of it, for themselves alone: the handler keeps the bound.
    #[test]
    fn a_tight_statement_time_leaves_the_check_alone() {
        let db = MysqlDb::new("tight_statement_time");
        let mut conn = db.connect();
        conn.batch_execute("SET SESSION max_statement_time = 0.001")
            .unwrap();
        assert_eq!(
            super::under_a_tight_bound(|| credit(&mut conn, "m-1")),
            Outcome::Processed(())
        );
        assert!(super::under_a_tight_bound(|| credit(&mut conn, "m-1")).is_duplicate());
        let slow = diesel::sql_query("SELECT SLEEP(0.05) FROM accounts").execute(&mut conn);
        assert!(
            slow.is_err(),
            "the bound holds for the application's statements"
        );
        assert_eq!(
            count(
                &mut db.connect(),
                "SELECT balance AS n FROM accounts WHERE id = 1"
            ),
            1
        );
    }

    /// The check's own catalog reads refused by a session setting it cannot read
    /// (`max_join_size` below what `information_schema` examines): an alert for the operator,
    /// never a dead letter of the message.
    #[test]
    fn a_check_refused_by_a_session_setting_alerts() {
        let db = MysqlDb::new("max_join_size");
        let mut conn = db.connect();
        conn.batch_execute("SET SESSION max_join_size = 1").unwrap();
        let error = credit(&mut conn, "m-1").unwrap_err();
        assert_eq!(error.action(), Action::Alert, "{error:?}");
        assert_eq!(
            count(&mut db.connect(), "SELECT count(*) AS n FROM inbox"),
            0
        );
    }
}
