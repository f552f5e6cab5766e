//! Faults read the same whatever language the server speaks. A PostgreSQL initialised on a
//! German system (a private server, `initdb --locale=de_DE.UTF-8`) with two more databases
//! in French and Spanish (`ALTER DATABASE … SET lc_messages`), and MariaDB sessions in
//! German, French and Spanish: each class of the taxonomy provoked for real on a connection
//! the startup check has seen, sync and async, and handlers whose first delivery on a session
//! meets a fault. Before the check set the session's messages to English, a German deadlock
//! or timeout read as an unknown error (dead-lettered), and a MariaDB session in German that
//! the check had not seen failed its marker as a schema fault.

#![cfg(any(feature = "postgres", feature = "mysql"))]

use diesel::result::Error;
use inbox_diesel::{ErrorClass, InboxSchema, TransientKind, classify};

/// The server's message of `error`.
fn message(error: &Error) -> String {
    match error {
        Error::DatabaseError(_, info) => info.message().to_owned(),
        other => other.to_string(),
    }
}

fn class(error: &Error) -> ErrorClass {
    classify(error, &InboxSchema::DEFAULT)
}

const TIMEOUT: ErrorClass = ErrorClass::Transient(TransientKind::StatementTimeout);
const LOCK: ErrorClass = ErrorClass::Transient(TransientKind::LockWaitTimeout);
const DEADLOCK: ErrorClass = ErrorClass::Transient(TransientKind::Deadlock);

#[cfg(feature = "postgres")]
mod postgres {
    use diesel::connection::SimpleConnection;
    use diesel::{Connection, PgConnection};
    use inbox_diesel::{
        Action, ErrorClass, InboxSchema, Outcome, TransientKind, idempotent, schema,
    };
    use inbox_tests::private::PrivatePostgres;
    use inbox_tests::server::count;

    use super::{DEADLOCK, LOCK, TIMEOUT, class, message};

    /// The databases, their language, and `SELECT 1/0`'s message in it. The first is the
    /// server's own language, from `initdb`.
    const LANGUAGES: [(&str, &str, &str); 3] = [
        ("postgres", "de_DE.UTF-8", "Division durch Null"),
        ("fr", "fr_FR.UTF-8", "division par zéro"),
        ("es", "es_ES.UTF-8", "división por cero"),
    ];

    /// The private server: three databases with an inbox, accounts 1 and 2, a table `secret`
    /// nobody but the superuser may read; roles `app` (may not set `lc_messages`) and
    /// `app_granted` (may, PostgreSQL 15's grant).
    fn server() -> PrivatePostgres {
        let server = PrivatePostgres::start("de_DE.UTF-8");
        let mut admin = PgConnection::establish(&server.url("postgres", "postgres")).unwrap();
        for (database, language, _) in &LANGUAGES[1..] {
            admin
                .batch_execute(&format!("CREATE DATABASE {database}"))
                .unwrap();
            admin
                .batch_execute(&format!(
                    "ALTER DATABASE {database} SET lc_messages = '{language}'"
                ))
                .unwrap();
        }
        admin
            .batch_execute(
                "CREATE ROLE app LOGIN; CREATE ROLE app_granted LOGIN;
                 GRANT SET ON PARAMETER lc_messages TO app_granted",
            )
            .unwrap();
        for (database, ..) in LANGUAGES {
            let mut conn = PgConnection::establish(&server.url("postgres", database)).unwrap();
            conn.batch_execute(&schema::postgres::create_table_sql(&InboxSchema::DEFAULT))
                .unwrap();
            conn.batch_execute(
                "CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance BIGINT NOT NULL);
                 INSERT INTO accounts VALUES (1, 0), (2, 0);
                 CREATE TABLE secret (id INTEGER);
                 GRANT ALL ON inbox, accounts TO app, app_granted;
                 GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO app, app_granted",
            )
            .unwrap();
        }
        server
    }

    fn error_of(conn: &mut PgConnection, sql: &str) -> diesel::result::Error {
        conn.batch_execute(sql).expect_err(sql)
    }

    fn connect(url: &str) -> PgConnection {
        PgConnection::establish(url).unwrap_or_else(|e| panic!("{url}: {e}"))
    }

    /// A role that may set its messages (here PostgreSQL 15's grant) whose setting of them
    /// fails for another reason, reported in German: that failure, not a role that may not
    /// change its messages — an alert with the wrong advice (an operator's trial: a French
    /// server's statement timeout read as the refusal). The failure here: the settings view
    /// taken from the roles. A role without the grant is still told it may not.
    #[test]
    fn a_role_that_may_set_its_messages_is_not_told_it_may_not() {
        use inbox_diesel::schema::SchemaError;
        let server = server();
        connect(&server.url("postgres", "postgres"))
            .batch_execute("REVOKE SELECT ON pg_catalog.pg_settings FROM PUBLIC")
            .unwrap();
        let mut granted = connect(&server.url("app_granted", "postgres"));
        let failed = schema::verify(&mut granted, &InboxSchema::DEFAULT).unwrap_err();
        assert!(
            matches!(failed, SchemaError::Database(_)),
            "{failed}: {failed:?}"
        );
        let mut refused = connect(&server.url("app", "postgres"));
        let refused = schema::verify(&mut refused, &InboxSchema::DEFAULT).unwrap_err();
        assert!(
            matches!(refused, SchemaError::Session { .. }),
            "{refused}: {refused:?}"
        );
    }

    /// Each class, on a connection the check has seen, in each language.
    #[test]
    fn every_class_reads_the_same_in_german_french_and_spanish() {
        let server = server();
        for (database, language, translated) in LANGUAGES {
            let url = server.url("postgres", database);
            let mut fresh = connect(&url);
            assert_eq!(
                message(&error_of(&mut fresh, "SELECT 1/0")),
                translated,
                "the server speaks {language} on {database}"
            );

            let mut conn = connect(&url);
            schema::verify(&mut conn, &InboxSchema::DEFAULT).unwrap();
            let on = |conn: &mut PgConnection, sql: &str| class(&error_of(conn, sql));
            let context = format!("{database} ({language})");
            assert_eq!(
                message(&error_of(&mut conn, "SELECT 1/0")),
                "division by zero",
                "{context}"
            );
            assert_eq!(
                on(
                    &mut conn,
                    "SET statement_timeout = '20ms'; SELECT pg_sleep(2)"
                ),
                TIMEOUT,
                "{context}"
            );
            assert_eq!(
                on(
                    &mut conn,
                    "SELECT pg_cancel_backend(pg_backend_pid()), pg_sleep(2)"
                ),
                ErrorClass::Transient(TransientKind::Canceled),
                "{context}"
            );
            assert_eq!(on(&mut conn, "SELECT * FROM nope"), ErrorClass::Schema);
            assert_eq!(
                on(
                    &mut conn,
                    "BEGIN READ ONLY; INSERT INTO accounts VALUES (9, 0)"
                ),
                ErrorClass::ReadOnly
            );
            conn.batch_execute("ROLLBACK").unwrap();
            error_of(&mut conn, "BEGIN; SELECT 1/0");
            assert_eq!(on(&mut conn, "SELECT 1"), ErrorClass::TransactionAborted);
            conn.batch_execute("ROLLBACK").unwrap();
            conn.batch_execute("PREPARE twice AS SELECT 1").unwrap();
            assert_eq!(
                on(&mut conn, "PREPARE twice AS SELECT 1"),
                ErrorClass::StatementLost,
                "{context}: 42P05"
            );
            assert_eq!(
                on(&mut conn, "EXECUTE never_prepared"),
                ErrorClass::StatementLost,
                "{context}: 26000"
            );
            let marker = "INSERT INTO inbox (message_id, consumer) \
                          VALUES ('00000000-0000-0000-0000-000000000001', 'languages')";
            conn.batch_execute(marker).unwrap();
            assert_eq!(on(&mut conn, marker), ErrorClass::InboxDuplicate);

            // Row locks held by another session: a lock timeout, NOWAIT, a deadlock.
            let mut holder = connect(&url);
            holder
                .batch_execute("BEGIN; UPDATE accounts SET balance = balance WHERE id = 1")
                .unwrap();
            assert_eq!(
                on(
                    &mut conn,
                    "SET lock_timeout = '20ms'; UPDATE accounts SET balance = 1 WHERE id = 1"
                ),
                LOCK,
                "{context}"
            );
            assert_eq!(
                on(
                    &mut conn,
                    "SELECT * FROM accounts WHERE id = 1 FOR UPDATE NOWAIT"
                ),
                LOCK,
                "{context}: 55P03 under NOWAIT"
            );
            conn.batch_execute("BEGIN; UPDATE accounts SET balance = balance WHERE id = 2")
                .unwrap();
            let mut watcher = connect(&url);
            std::thread::scope(|scope| {
                // The holder waits for `conn`'s row with the longer deadlock timeout: `conn`,
                // waiting next, finds the deadlock.
                let holder = &mut holder;
                let waits = scope.spawn(move || {
                    holder
                        .batch_execute(
                            "SET LOCAL deadlock_timeout = '30s';
                             UPDATE accounts SET balance = balance WHERE id = 2",
                        )
                        .unwrap();
                });
                inbox_tests::wait_until("the holder waits for a row lock", || {
                    count(
                        &mut watcher,
                        "SELECT count(*) AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock'",
                    ) == 1
                });
                assert_eq!(
                    on(
                        &mut conn,
                        "UPDATE accounts SET balance = balance WHERE id = 1"
                    ),
                    DEADLOCK,
                    "{context}"
                );
                conn.batch_execute("ROLLBACK").unwrap();
                waits.join().unwrap();
            });
            holder.batch_execute("ROLLBACK").unwrap();

            // A role that may set its messages: checked, and refused a table it may not read.
            let mut granted = connect(&server.url("app_granted", database));
            schema::verify(&mut granted, &InboxSchema::DEFAULT).unwrap();
            assert_eq!(
                on(&mut granted, "SELECT * FROM secret"),
                ErrorClass::PermissionDenied,
                "{context}"
            );

            // A role that may not: refused by the check, with the fix.
            let mut app = connect(&server.url("app", database));
            let refused = schema::verify(&mut app, &InboxSchema::DEFAULT).unwrap_err();
            let refusal = refused.to_string();
            assert!(
                refusal.starts_with("the session checking the inbox table")
                    && refusal.contains(language)
                    && refusal.contains("ALTER ROLE"),
                "{context}: {refusal}"
            );
            // Not the table's fault: a setting's, an alert.
            assert_eq!(
                inbox_diesel::Error::Schema(refused).class(),
                ErrorClass::ServerSetting,
                "{context}"
            );

            // The session ended by an operator: a lost connection.
            let pid = count(&mut conn, "SELECT pg_backend_pid()::int8 AS n");
            watcher
                .batch_execute(&format!("SELECT pg_terminate_backend({pid})"))
                .unwrap();
            assert_eq!(on(&mut conn, "SELECT 1"), ErrorClass::ConnectionLost);
        }

        // The fix the refusal names: then the role's sessions speak English.
        let mut admin = connect(&server.url("postgres", "postgres"));
        admin
            .batch_execute("ALTER ROLE app SET lc_messages = 'C'")
            .unwrap();
        let mut app = connect(&server.url("app", "fr"));
        schema::verify(&mut app, &InboxSchema::DEFAULT).unwrap();
        assert_eq!(
            message(&error_of(&mut app, "SELECT 1/0")),
            "division by zero"
        );
    }

    /// A body that runs past its statement timeout, every attempt.
    #[idempotent(consumer = "languages", key = id)]
    fn times_out(conn: &mut PgConnection, id: &str) -> Result<(), inbox_diesel::Error> {
        use diesel::RunQueryDsl;
        diesel::sql_query("SET LOCAL statement_timeout = '20ms'").execute(conn)?;
        diesel::sql_query("SELECT pg_sleep(2)").execute(conn)?;
        Ok(())
    }

    /// A session's first delivery: its messages are set to English, and the body's timeout
    /// is retried, then handed back to be redelivered — not dead-lettered. Each connection
    /// opened where the last one lived: the runtime remembers a PostgreSQL check by where the
    /// connection lives and takes it for the checked one, but its server session is new, and
    /// the marker's statement, prepared on each new server session, sets its messages too.
    #[test]
    fn a_timeout_in_german_is_retried_not_dead_lettered() {
        let server = server();
        for round in 0..2 {
            for (database, ..) in LANGUAGES {
                let mut conn = connect(&server.url("postgres", database));
                let error = times_out(&mut conn, &format!("m-{round}")).unwrap_err();
                assert_eq!(error.class(), TIMEOUT, "{database}: {error:?}");
                assert_eq!(error.class().action(), Action::RetryLater);
                // The body's error counts the attempts as the runtime's own errors do: the
                // first and three retries.
                assert_eq!(error.attempts(), 4, "{database}");
                // A pooler's reset (`RESET ALL`) brings back the session's language; each
                // handler transaction sets English again for itself.
                conn.batch_execute("RESET ALL").unwrap();
                let error = times_out(&mut conn, &format!("reset-{round}")).unwrap_err();
                assert_eq!(
                    error.class(),
                    TIMEOUT,
                    "after RESET ALL, {database}: {error:?}"
                );
            }
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            use diesel_async::AsyncConnection;
            for round in 0..2 {
                for (database, ..) in LANGUAGES {
                    let url = server.url("postgres", database);
                    let mut conn = diesel_async::AsyncPgConnection::establish(&url)
                        .await
                        .unwrap();
                    let error = times_out_async(&mut conn, &format!("async-{round}"))
                        .await
                        .unwrap_err();
                    assert_eq!(error.class(), TIMEOUT, "async, {database}: {error:?}");
                    assert_eq!(error.attempts(), 4, "async, {database}");
                }
            }
        });
    }

    #[idempotent(consumer = "languages", key = id)]
    async fn times_out_async(
        conn: &mut diesel_async::AsyncPgConnection,
        id: &str,
    ) -> Result<(), inbox_diesel::Error> {
        use diesel_async::RunQueryDsl;
        diesel::sql_query("SET LOCAL statement_timeout = '20ms'")
            .execute(conn)
            .await?;
        diesel::sql_query("SELECT pg_sleep(2)")
            .execute(conn)
            .await?;
        Ok(())
    }

    /// The async driver (tokio-postgres), after the async check.
    #[test]
    fn async_classes_in_every_language() {
        let server = server();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            use diesel_async::{AsyncConnection, SimpleAsyncConnection};
            for (database, language, translated) in LANGUAGES {
                let url = server.url("postgres", database);
                let mut conn = diesel_async::AsyncPgConnection::establish(&url)
                    .await
                    .unwrap();
                let error = conn.batch_execute("SELECT 1/0").await.unwrap_err();
                assert_eq!(message(&error), translated, "{language}");
                schema::verify_async(&mut conn, &InboxSchema::DEFAULT)
                    .await
                    .unwrap();
                for (sql, expected) in [
                    ("SELECT 1/0", ErrorClass::Other),
                    (
                        "SET statement_timeout = '20ms'; SELECT pg_sleep(2)",
                        TIMEOUT,
                    ),
                    (
                        "SELECT pg_cancel_backend(pg_backend_pid()), pg_sleep(2)",
                        ErrorClass::Transient(TransientKind::Canceled),
                    ),
                    ("SELECT * FROM nope", ErrorClass::Schema),
                    ("EXECUTE never_prepared", ErrorClass::StatementLost),
                ] {
                    let error = conn.batch_execute(sql).await.expect_err(sql);
                    assert_eq!(class(&error), expected, "{language}: {sql}: {error}");
                }
                let mut holder = connect(&url);
                holder
                    .batch_execute("BEGIN; UPDATE accounts SET balance = balance WHERE id = 1")
                    .unwrap();
                let error = conn
                    .batch_execute("SELECT * FROM accounts WHERE id = 1 FOR UPDATE NOWAIT")
                    .await
                    .unwrap_err();
                assert_eq!(class(&error), LOCK, "{language}: {error}");
            }
        });
    }

    /// A claim-mode handler: it counts its side effects, and fails while `fail` says so.
    #[idempotent(consumer = "claimed-de", key = id, mode = "claim")]
    fn send(
        conn: &mut PgConnection,
        id: &str,
        sent: &std::sync::atomic::AtomicUsize,
        fail: bool,
    ) -> Result<(), inbox_diesel::Error> {
        if fail {
            return Err(diesel::result::Error::NotFound.into());
        }
        sent.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }

    /// PgBouncer in transaction mode in front of `server`, two server sessions for each
    /// client's database and user, each reset after every transaction (`DISCARD ALL`: the
    /// prepared statements and what the session set go).
    fn resetting_bouncer(server: &PrivatePostgres) -> inbox_tests::private::PrivatePgbouncer {
        let upstream = url::Url::parse(&server.url("postgres", "postgres")).unwrap();
        inbox_tests::private::PrivatePgbouncer::start_with(
            "127.0.0.1",
            upstream.port().unwrap(),
            &["app_granted", "postgres"],
            "transaction",
            2,
            &[
                "server_reset_query = DISCARD ALL",
                "server_reset_query_always = 1",
            ],
        )
    }

    /// A transaction-mode handler whose body runs diesel's DSL.
    #[idempotent(consumer = "credited-de", key = id)]
    fn credit_dsl(conn: &mut PgConnection, id: &str) -> Result<(), inbox_diesel::Error> {
        use diesel::prelude::*;
        use inbox_tests::accounts;
        diesel::update(accounts::table.find(1))
            .set(accounts::balance.eq(accounts::balance + 1))
            .execute(conn)?;
        Ok(())
    }

    /// diesel's statement cache on (its default) behind a transaction-mode PgBouncer that
    /// resets every server session (`DISCARD ALL`: the prepared statements go, and the
    /// English the check set with them), as a role that starts its sessions in German: a
    /// cached statement missing on the server session it lands on fails in German, naming
    /// it (`vorbereitete Anweisung »__diesel_stmt_1« existiert nicht`). Read by that name,
    /// as a lost statement: the connection stops caching and the delivery runs again (an
    /// operator's trial, a Japanese server: 150 of 200 deliveries alerts, read as schema
    /// faults). Each message applied once, none failing.
    #[test]
    fn a_cached_statement_a_pooler_dropped_is_read_in_any_language() {
        let server = server();
        let bouncer = resetting_bouncer(&server);
        let url = bouncer.url("app_granted", "postgres");
        std::thread::scope(|scope| {
            for consumer in 0..2 {
                let url = &url;
                scope.spawn(move || {
                    let mut conn = connect(url);
                    for n in 0..40 {
                        let key = format!("m-{}", (n + consumer * 20) % 40);
                        let outcome = credit_dsl(&mut conn, &key);
                        assert!(outcome.is_ok(), "{key}: {outcome:?}");
                    }
                });
            }
        });
        let mut admin = connect(&server.url("postgres", "postgres"));
        assert_eq!(
            count(&mut admin, "SELECT balance AS n FROM accounts WHERE id = 1"),
            40,
            "each message applied once"
        );
    }

    /// Claim mode on the German server: its statements run outside any transaction, each on
    /// whichever server session a transaction-mode pooler has free — here PgBouncer, each
    /// server session reset after every transaction (`DISCARD ALL`, which also drops the
    /// prepared statements) —, where only the role's default language holds. A role that
    /// may set its messages (the grant) but starts its sessions in German is refused by the
    /// startup check, naming the role's default as the fix, before anything is written (an
    /// operator's trial: a claim that waited for a migration's table lock failed in
    /// Japanese, read as a schema fault — an alert). Given that default, a claim that waits
    /// for another delivery's row past the role's statement timeout — its insert for an
    /// uncommitted claim, its takeover for a row another transaction holds — is that
    /// timeout, retried; then each message runs once.
    #[test]
    fn claim_mode_needs_the_role_to_start_in_english() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let server = server();
        let mut admin = connect(&server.url("postgres", "postgres"));
        admin
            .batch_execute("ALTER ROLE app_granted SET statement_timeout = '300ms'")
            .unwrap();
        let bouncer = resetting_bouncer(&server);
        let sent = AtomicUsize::new(0);
        for url in [
            bouncer.url("app_granted", "postgres"),
            server.url("app_granted", "postgres"),
            server.url("postgres", "postgres"),
        ] {
            let refused = send(&mut connect(&url), "refused", &sent, false).unwrap_err();
            assert!(
                matches!(refused, inbox_diesel::Error::Schema(_)),
                "{url}: {refused:?}"
            );
            assert_eq!(refused.class().action(), Action::Alert, "{url}");
            let text = refused.to_string();
            assert!(
                text.contains("ALTER ROLE <role> SET lc_messages = 'C'"),
                "{url}: {text}"
            );
        }
        assert_eq!(sent.load(Ordering::SeqCst), 0);
        assert_eq!(
            count(&mut admin, "SELECT count(*) AS n FROM inbox"),
            0,
            "nothing written"
        );

        admin
            .batch_execute("ALTER ROLE app_granted SET lc_messages = 'C'")
            .unwrap();
        // Server sessions the check never saw: the pooler's are ended; it opens new ones.
        let ended = |admin: &mut PgConnection| {
            admin
                .batch_execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                     WHERE usename = 'app_granted'",
                )
                .unwrap();
            std::thread::sleep(std::time::Duration::from_millis(200));
        };
        ended(&mut admin);
        let mut conn = connect(&bouncer.url("app_granted", "postgres"));
        conn.set_prepared_statement_cache_size(diesel::connection::CacheSize::Disabled);
        assert!(
            send(&mut conn, "warm", &sent, false)
                .unwrap()
                .is_processed()
        );
        // The released claim of `m-2`: its next delivery takes it over.
        send(&mut conn, "m-2", &sent, true).unwrap_err();
        let id = inbox_diesel::MessageKey::text("m-1").unwrap().stored_id();
        let mut holder = connect(&server.url("postgres", "postgres"));
        for (key, hold) in [
            (
                "m-1",
                format!(
                    "BEGIN; INSERT INTO inbox (message_id, consumer, received_at, \
                     claimed_until, attempts) VALUES ('{id}', 'claimed-de', now(), \
                     now() + interval '1 minute', 1)"
                ),
            ),
            (
                "m-2",
                "BEGIN; UPDATE inbox SET received_at = received_at \
                 WHERE consumer = 'claimed-de'"
                    .to_owned(),
            ),
        ] {
            ended(&mut admin);
            holder.batch_execute(&hold).unwrap();
            let error = send(&mut conn, key, &sent, false).unwrap_err();
            assert_eq!(error.class(), TIMEOUT, "{key}: {error:?}");
            assert_eq!(error.class().action(), Action::RetryLater, "{key}");
            holder.batch_execute("ROLLBACK").unwrap();
        }
        for key in ["m-1", "m-2"] {
            assert!(
                send(&mut conn, key, &sent, false).unwrap().is_processed(),
                "{key}"
            );
        }
        assert_eq!(
            sent.load(Ordering::SeqCst),
            3,
            "warm, m-1 and m-2 once each"
        );
        assert_eq!(
            count(
                &mut admin,
                "SELECT count(*) AS n FROM inbox WHERE consumer = 'claimed-de' \
                 AND processed_at IS NOT NULL"
            ),
            3
        );
    }

    /// Credits account 1 and keeps the new balance, with the request's fingerprint: the
    /// marker is written at the commit, and the start looks for it.
    #[idempotent(consumer = "kept", key = id, store_result = true, fingerprint = id)]
    fn credit_kept(conn: &mut PgConnection, id: &str) -> Result<i64, inbox_diesel::Error> {
        use diesel::prelude::*;
        diesel::sql_query("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
            .execute(conn)?;
        #[derive(QueryableByName)]
        struct Balance {
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            balance: i64,
        }
        let read = diesel::sql_query("SELECT balance FROM accounts WHERE id = 1");
        Ok(read.get_result::<Balance>(conn)?.balance)
    }

    /// A handler that keeps its result, on databases in German, French and Spanish (the
    /// role may set its messages, and each transaction sets them to English for itself):
    /// the look for a committed marker is read as the duplicate it is, and the stored
    /// balance replayed.
    #[test]
    fn a_kept_result_is_replayed_in_every_language() {
        let server = server();
        for (database, language, _) in LANGUAGES {
            let mut admin = connect(&server.url("postgres", database));
            let (backend, schema) = (schema::Backend::Postgres, InboxSchema::DEFAULT);
            admin
                .batch_execute(&format!(
                    "{}; {}",
                    backend.add_result_sql(&schema),
                    backend.add_fingerprint_sql(&schema)
                ))
                .unwrap();
            let mut conn = connect(&server.url("app_granted", database));
            let first = credit_kept(&mut conn, "k-1").unwrap();
            let Outcome::Processed(balance) = first else {
                panic!("{language}: {first:?}")
            };
            let again = credit_kept(&mut conn, "k-1").unwrap();
            assert!(
                matches!(again, Outcome::Duplicate { stored: Some(b), .. } if b == balance),
                "{language}: {again:?}"
            );
            assert_eq!(
                count(&mut admin, "SELECT balance AS n FROM accounts WHERE id = 1"),
                1,
                "{language}"
            );
        }
    }
}

#[cfg(feature = "mysql")]
mod mariadb {
    use diesel::connection::SimpleConnection;
    use diesel::{Connection, MysqlConnection};
    use inbox_diesel::{ErrorClass, InboxSchema, Outcome, idempotent, schema};
    use inbox_tests::mysql::MysqlDb;
    use inbox_tests::server::count;

    use super::{DEADLOCK, LOCK, TIMEOUT, class, message};

    /// A session's language, and a word of `Table '…' doesn't exist` in it.
    const LANGUAGES: [(&str, &str); 3] = [
        ("de_DE", "existiert nicht"),
        ("fr_FR", "n'existe pas"),
        ("es_ES", "no existe"),
    ];

    /// A session of `db` speaking `language`, as every session of a server started with
    /// `--lc-messages` would.
    fn speaking(db: &MysqlDb, language: &str) -> MysqlConnection {
        let mut conn = db.connect();
        conn.batch_execute(&format!("SET lc_messages = '{language}'"))
            .unwrap();
        conn
    }

    fn error_of(conn: &mut MysqlConnection, sql: &str) -> diesel::result::Error {
        conn.batch_execute(sql).expect_err(sql)
    }

    #[test]
    fn every_class_reads_the_same_in_german_french_and_spanish() {
        let db = MysqlDb::new("languages");
        let mut admin = db.connect();
        admin
            .batch_execute("CREATE TABLE secret (id INTEGER)")
            .unwrap();
        admin
            .batch_execute("CREATE USER IF NOT EXISTS 'inbox_languages'@'%'")
            .unwrap();
        admin
            .batch_execute(&format!(
                "GRANT ALL ON {}.inbox TO 'inbox_languages'@'%'",
                db.name()
            ))
            .unwrap();
        for (language, translated) in LANGUAGES {
            let mut conn = speaking(&db, language);
            let raw = message(&error_of(&mut conn, "SELECT * FROM nope"));
            assert!(raw.contains(translated), "{language}: {raw}");
            schema::verify(&mut conn, &InboxSchema::DEFAULT).unwrap();
            let on = |conn: &mut MysqlConnection, sql: &str| class(&error_of(conn, sql));
            assert_eq!(on(&mut conn, "SELECT * FROM nope"), ErrorClass::Schema);
            assert_eq!(
                on(
                    &mut conn,
                    "SET STATEMENT max_statement_time = 0.02 FOR SELECT SLEEP(2)"
                ),
                TIMEOUT,
                "{language}"
            );
            assert_eq!(
                on(
                    &mut conn,
                    "START TRANSACTION READ ONLY; INSERT INTO accounts VALUES (9, 0)"
                ),
                ErrorClass::ReadOnly,
                "{language}"
            );
            conn.batch_execute("ROLLBACK").unwrap();
            let marker = "INSERT INTO inbox (message_id, consumer) VALUES (x'01', 'languages')";
            conn.batch_execute(marker).unwrap();
            assert_eq!(
                on(&mut conn, marker),
                ErrorClass::InboxDuplicate,
                "{language}"
            );
            conn.batch_execute("DELETE FROM inbox").unwrap();

            let mut holder = db.connect();
            holder
                .batch_execute(
                    "START TRANSACTION; UPDATE accounts SET balance = balance + 1 WHERE id = 1;
                     INSERT INTO credits (message, account, amount)
                     VALUES ('a', 1, 1), ('b', 1, 1), ('c', 1, 1), ('d', 1, 1)",
                )
                .unwrap();
            assert_eq!(
                on(
                    &mut conn,
                    "SET SESSION innodb_lock_wait_timeout = 1;
                     UPDATE accounts SET balance = 1 WHERE id = 1"
                ),
                LOCK,
                "{language}"
            );
            // A deadlock: `conn` changed less, so InnoDB rolls it back.
            conn.batch_execute(
                "START TRANSACTION; UPDATE accounts SET balance = balance + 1 WHERE id = 2",
            )
            .unwrap();
            std::thread::scope(|scope| {
                let holder = &mut holder;
                let waits = scope.spawn(move || {
                    holder
                        .batch_execute(
                            "SET SESSION innodb_lock_wait_timeout = 30;
                             UPDATE accounts SET balance = balance + 1 WHERE id = 2",
                        )
                        .unwrap();
                });
                inbox_tests::wait_until("the holder waits for a row lock", || {
                    db.waiting_for_a_lock() == 1
                });
                assert_eq!(
                    on(
                        &mut conn,
                        "UPDATE accounts SET balance = balance + 1 WHERE id = 1"
                    ),
                    DEADLOCK,
                    "{language}"
                );
                waits.join().unwrap();
            });
            conn.batch_execute("ROLLBACK").unwrap();
            holder.batch_execute("ROLLBACK").unwrap();

            let mut app = MysqlConnection::establish(&db.url_as("inbox_languages")).unwrap();
            app.batch_execute(&format!("SET lc_messages = '{language}'"))
                .unwrap();
            schema::verify(&mut app, &InboxSchema::DEFAULT).unwrap();
            assert_eq!(
                on(&mut app, "SELECT * FROM secret"),
                ErrorClass::PermissionDenied,
                "{language}"
            );

            let id = count(&mut conn, "SELECT CONNECTION_ID() AS n");
            admin
                .batch_execute(&format!("KILL CONNECTION {id}"))
                .unwrap();
            assert_eq!(on(&mut conn, "SELECT 1"), ErrorClass::ConnectionLost);
        }
        admin
            .batch_execute("DROP USER 'inbox_languages'@'%'")
            .unwrap();
    }

    /// The body of `deadlocks`: on its first attempt it locks account 2, says so, and
    /// waits until told to lock account 1 — which another session holds while it waits for
    /// account 2: a deadlock, this body its victim. Later attempts run through.
    struct Choreography {
        attempts: std::sync::atomic::AtomicUsize,
        locked: std::sync::mpsc::SyncSender<()>,
        go: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
    }

    /// Through the text protocol (`batch_execute`), which reports no error number.
    #[idempotent(consumer = "deadlocks", key = id)]
    fn deadlocks(
        conn: &mut MysqlConnection,
        id: &str,
        dance: &Choreography,
    ) -> Result<(), inbox_diesel::Error> {
        let _ = id;
        victim(conn, dance)?;
        Ok(())
    }

    /// `deadlocks` with no retry, its error the body's own: a diesel error, as a handler
    /// returning `QueryResult` has it.
    #[idempotent(consumer = "deadlocks-once", key = id, retries = 0)]
    fn deadlocks_once(
        conn: &mut MysqlConnection,
        id: &str,
        dance: &Choreography,
    ) -> diesel::QueryResult<()> {
        let _ = id;
        victim(conn, dance)
    }

    /// The same, its error the application's own, the diesel error on its `source()`: the
    /// runtime cannot write its decision into it, and whoever classifies the diesel error
    /// reads MariaDB's deadlock by its text in the server's language.
    #[idempotent(consumer = "deadlocks-once", key = id, retries = 0)]
    fn deadlocks_once_app(
        conn: &mut MysqlConnection,
        id: &str,
        dance: &Choreography,
    ) -> Result<(), inbox_tests::AppError> {
        let _ = id;
        victim(conn, dance)?;
        Ok(())
    }

    /// The same, its error the inbox's.
    #[idempotent(consumer = "deadlocks-once", key = id, retries = 0)]
    fn deadlocks_once_inbox(
        conn: &mut MysqlConnection,
        id: &str,
        dance: &Choreography,
    ) -> Result<(), inbox_diesel::Error> {
        let _ = id;
        victim(conn, dance)?;
        Ok(())
    }

    /// The body: account 2, then account 1 (see [`Choreography`]).
    fn victim(conn: &mut MysqlConnection, dance: &Choreography) -> diesel::QueryResult<()> {
        let first = dance
            .attempts
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
            == 0;
        conn.batch_execute("UPDATE accounts SET balance = balance + 1 WHERE id = 2")?;
        if first {
            dance.locked.send(()).unwrap();
            dance.go.lock().unwrap().recv().unwrap();
        }
        conn.batch_execute("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
    }

    /// A server whose own language is German (`--lc-messages=de_DE`), with the inbox and
    /// two accounts.
    fn german_server() -> inbox_tests::private::PrivateMariadb {
        let server = inbox_tests::private::PrivateMariadb::start(&["--lc-messages=de_DE"]);
        let mut admin = server.admin();
        admin
            .batch_execute(&schema::mysql::create_table_sql(&InboxSchema::DEFAULT))
            .unwrap();
        admin
            .batch_execute(
                "CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance BIGINT NOT NULL);
                 INSERT INTO accounts VALUES (1, 0), (2, 0);
                 CREATE TABLE credits (n INTEGER)",
            )
            .unwrap();
        server
    }

    /// Runs `deliver` on a fresh connection while another session makes its first attempt
    /// the victim of a deadlock; what `deliver` answered, and how many attempts it made.
    fn in_a_deadlock<R: Send>(
        server: &inbox_tests::private::PrivateMariadb,
        deliver: impl FnOnce(&mut MysqlConnection, &Choreography) -> R + Send,
    ) -> (R, usize) {
        let url = server.url("root");
        let (locked, locked_rx) = std::sync::mpsc::sync_channel(1);
        let (go_tx, go) = std::sync::mpsc::sync_channel(1);
        let dance = Choreography {
            attempts: std::sync::atomic::AtomicUsize::new(0),
            locked,
            go: std::sync::Mutex::new(go),
        };
        let mut holder = MysqlConnection::establish(&url).unwrap();
        holder
            .batch_execute(
                "START TRANSACTION; UPDATE accounts SET balance = balance + 10 WHERE id = 1;
                 INSERT INTO credits VALUES (1), (2), (3), (4)",
            )
            .unwrap();
        let outcome = std::thread::scope(|scope| {
            let delivery = scope.spawn(|| {
                let mut conn = MysqlConnection::establish(&url).unwrap();
                deliver(&mut conn, &dance)
            });
            locked_rx.recv().unwrap();
            let holder = &mut holder;
            let waits = scope.spawn(move || {
                holder
                    .batch_execute("UPDATE accounts SET balance = balance + 10 WHERE id = 2")
                    .unwrap();
                holder.batch_execute("ROLLBACK").unwrap();
            });
            inbox_tests::wait_until("the holder waits for account 2", || {
                count(
                    &mut server.admin(),
                    "SELECT count(*) AS n FROM information_schema.processlist \
                     WHERE id <> CONNECTION_ID() AND command IN ('Query', 'Execute') \
                     AND time_ms > 200",
                ) == 1
            });
            go_tx.send(()).unwrap();
            waits.join().unwrap();
            delivery.join().unwrap()
        });
        (
            outcome,
            dance.attempts.load(std::sync::atomic::Ordering::SeqCst),
        )
    }

    /// A server whose own language is German (`--lc-messages=de_DE`): MariaDB writes a
    /// deadlock in the server's language whatever the session set (other errors follow the
    /// session), and its text protocol reports no error number. The server ended the
    /// transaction: the runtime reads that, and retries the deadlock. With no retry left, the
    /// error handed back says so — a diesel error as the inbox's error of that class,
    /// which `classify` reads, and the inbox's error with that class —, where before it read
    /// as the German text it carries: `Other`, dead-lettered.
    #[test]
    fn a_deadlock_on_a_server_in_german_is_retried() {
        let server = german_server();
        let (outcome, attempts) =
            in_a_deadlock(&server, |conn, dance| deadlocks(conn, "m-1", dance));
        assert_eq!(outcome.unwrap(), Outcome::Processed(()));
        assert_eq!(attempts, 2);
        let mut conn = server.admin();
        assert_eq!(
            count(&mut conn, "SELECT SUM(balance) AS n FROM accounts"),
            2
        );
        assert_eq!(count(&mut conn, "SELECT count(*) AS n FROM inbox"), 1);

        let deadlock = ErrorClass::Transient(inbox_diesel::TransientKind::Deadlock);
        let (outcome, _) = in_a_deadlock(&server, |conn, dance| deadlocks_once(conn, "m-2", dance));
        let error = outcome.unwrap_err();
        let read = inbox_diesel::classify(&error, &InboxSchema::DEFAULT);
        assert_eq!(read, deadlock, "{error:?}");
        assert_eq!(read.action(), inbox_diesel::Action::RetryLater);
        let (outcome, _) = in_a_deadlock(&server, |conn, dance| {
            deadlocks_once_inbox(conn, "m-3", dance)
        });
        let error = outcome.unwrap_err();
        assert_eq!(error.class(), deadlock, "{error:?}");
        assert_eq!(error.action(), inbox_diesel::Action::RetryLater);
        let (outcome, _) = in_a_deadlock(&server, |conn, dance| {
            deadlocks_once_app(conn, "m-4", dance)
        });
        let inbox_tests::AppError::Db(error) = outcome.unwrap_err() else {
            panic!("the body's diesel error")
        };
        assert_eq!(
            inbox_diesel::classify(&error, &InboxSchema::DEFAULT),
            deadlock,
            "{error:?}"
        );
        assert_eq!(count(&mut conn, "SELECT count(*) AS n FROM inbox"), 1);
    }

    /// `deadlocks`, but the body swallows the deadlock and goes on: the server has ended the
    /// transaction, the marker gone with it, and its later write would commit on its own —
    /// `autocommit` is off while the handler runs, so that it opens another transaction
    /// instead, which the runtime rolls back.
    #[idempotent(consumer = "swallows", key = id)]
    fn swallows(
        conn: &mut MysqlConnection,
        id: &str,
        dance: &Choreography,
    ) -> Result<(), inbox_diesel::Error> {
        swallowing(conn, dance, true)
    }

    /// The same with the idle bound off: nothing else sees the transaction gone.
    #[idempotent(consumer = "swallows", key = id, idle_in_transaction_ms = 0)]
    fn swallows_unbounded(
        conn: &mut MysqlConnection,
        id: &str,
        dance: &Choreography,
    ) -> Result<(), inbox_diesel::Error> {
        swallowing(conn, dance, true)
    }

    /// A body that swallows every error and returns `Ok`: the `COMMIT` would answer
    /// success for nothing — the message acknowledged without its marker.
    #[idempotent(consumer = "swallows", key = id, idle_in_transaction_ms = 0)]
    fn swallows_all(
        conn: &mut MysqlConnection,
        id: &str,
        dance: &Choreography,
    ) -> Result<(), inbox_diesel::Error> {
        swallowing(conn, dance, false)
    }

    /// Swallows the deadlock, then fails on what the deadlock's rollback took away: the
    /// row it inserted first is gone (`NotFound`, propagated) — a consequence of the
    /// swallowed deadlock, not a fault of the message.
    #[idempotent(consumer = "swallows", key = id, idle_in_transaction_ms = 0)]
    fn swallows_then_misses(
        conn: &mut MysqlConnection,
        id: &str,
        dance: &Choreography,
    ) -> Result<(), inbox_diesel::Error> {
        use diesel::RunQueryDsl;
        conn.batch_execute("INSERT INTO made (id) VALUES (1)")?;
        swallowing(conn, dance, false)?;
        #[derive(diesel::QueryableByName)]
        struct Made {
            #[diesel(sql_type = diesel::sql_types::Integer)]
            #[allow(dead_code)]
            id: i32,
        }
        diesel::sql_query("SELECT id FROM made WHERE id = 1").get_result::<Made>(conn)?;
        conn.batch_execute("DELETE FROM made")?;
        Ok(())
    }

    /// `swallows` with `retries = 0`: the failure the body reports after the swallowed
    /// deadlock, met by no fresh transaction, is transient — the redelivery runs it again.
    #[idempotent(consumer = "swallows", key = id, retries = 0)]
    fn swallows_unretried(
        conn: &mut MysqlConnection,
        id: &str,
        dance: &Choreography,
    ) -> Result<(), inbox_diesel::Error> {
        swallowing(conn, dance, true)
    }

    /// `swallows_all` with `retries = 0`: the same, for a body that returns `Ok`.
    #[idempotent(consumer = "swallows", key = id, idle_in_transaction_ms = 0, retries = 0)]
    fn swallows_all_unretried(
        conn: &mut MysqlConnection,
        id: &str,
        dance: &Choreography,
    ) -> Result<(), inbox_diesel::Error> {
        swallowing(conn, dance, false)
    }

    fn swallowing(
        conn: &mut MysqlConnection,
        dance: &Choreography,
        propagate: bool,
    ) -> Result<(), inbox_diesel::Error> {
        let first = dance
            .attempts
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
            == 0;
        conn.batch_execute("UPDATE accounts SET balance = balance + 1 WHERE id = 2")?;
        if first {
            dance.locked.send(()).unwrap();
            dance.go.lock().unwrap().recv().unwrap();
        }
        let _ = conn.batch_execute("UPDATE accounts SET balance = balance + 1 WHERE id = 1");
        let later = conn.batch_execute("UPDATE accounts SET balance = balance + 100 WHERE id = 3");
        if propagate {
            later?;
            // And a statement of the body's after that: the transaction it runs in is not
            // the handler's either.
            conn.batch_execute("UPDATE accounts SET balance = balance + 1 WHERE id = 2")?;
        }
        Ok(())
    }

    /// A body that swallows the deadlock the server ended its transaction with, under each
    /// shape: the writes after it commit nothing — before, they committed on their own, and
    /// with the idle bound off the message was acknowledged too (a redelivery wrote them
    /// again) — and the runtime, which sees the transaction is no longer the handler's, rolls
    /// them back and runs the handler again: applied once. The session's settings are put
    /// back: the same connection then commits its own writes as usual.
    #[test]
    fn a_swallowed_deadlock_commits_nothing_and_runs_again() {
        type Handler = fn(
            &mut MysqlConnection,
            &str,
            &Choreography,
        ) -> Result<inbox_diesel::Outcome<()>, inbox_diesel::Error>;
        // With whether the handler retries: one that does not reports a transient failure,
        // and the redelivery runs it again.
        let shapes: [(&str, Handler, bool); 6] = [
            ("propagates", swallows, true),
            ("propagates, idle bound off", swallows_unbounded, true),
            ("returns Ok, idle bound off", swallows_all, true),
            (
                "fails on what the rollback took away",
                swallows_then_misses,
                true,
            ),
            ("propagates, no retries", swallows_unretried, false),
            ("returns Ok, no retries", swallows_all_unretried, false),
        ];
        let db = MysqlDb::new("swallowed_deadlock");
        let mut admin = db.connect();
        admin
            .batch_execute(
                "INSERT INTO accounts VALUES (3, 0);
                 CREATE TABLE IF NOT EXISTS ballast (n INTEGER);
                 CREATE TABLE made (id INTEGER PRIMARY KEY)",
            )
            .unwrap();
        for (n, (shape, handler, retries)) in shapes.into_iter().enumerate() {
            let (locked, locked_rx) = std::sync::mpsc::sync_channel(1);
            let (go_tx, go) = std::sync::mpsc::sync_channel(1);
            let dance = Choreography {
                attempts: std::sync::atomic::AtomicUsize::new(0),
                locked,
                go: std::sync::Mutex::new(go),
            };
            let mut holder = db.connect();
            holder
                .batch_execute(
                    "START TRANSACTION; UPDATE accounts SET balance = balance + 10 WHERE id = 1;
                     INSERT INTO ballast VALUES (1), (2), (3), (4)",
                )
                .unwrap();
            let mut conn = db.connect();
            let key = format!("m-{n}");
            let outcome = std::thread::scope(|scope| {
                let delivery = scope.spawn(|| handler(&mut conn, &key, &dance));
                locked_rx.recv().unwrap();
                let holder = &mut holder;
                let waits = scope.spawn(move || {
                    holder
                        .batch_execute("UPDATE accounts SET balance = balance + 10 WHERE id = 2")
                        .unwrap();
                    holder.batch_execute("ROLLBACK").unwrap();
                });
                inbox_tests::wait_until("the holder waits for account 2", || {
                    db.waiting_for_a_lock() == 1
                });
                go_tx.send(()).unwrap();
                waits.join().unwrap();
                delivery.join().unwrap()
            });
            let outcome = match retries {
                true => outcome,
                false => {
                    let error = outcome.unwrap_err();
                    assert_eq!(
                        error.action(),
                        inbox_diesel::Action::RetryLater,
                        "{shape}: {error:?}"
                    );
                    assert_eq!(
                        count(&mut admin, "SELECT count(*) AS n FROM inbox"),
                        0,
                        "{shape}: no marker"
                    );
                    // The redelivery.
                    handler(&mut conn, &key, &dance)
                }
            };
            // The first attempt's writes after the deadlock were rolled back with it, and the
            // handler ran again in a fresh transaction: applied once.
            assert!(outcome.unwrap().is_processed(), "{shape}");
            assert_eq!(
                dance.attempts.load(std::sync::atomic::Ordering::SeqCst),
                2,
                "{shape}: retried once"
            );
            assert_eq!(
                count(&mut admin, "SELECT count(*) AS n FROM inbox"),
                1,
                "{shape}: one marker"
            );
            assert_eq!(
                inbox_tests::balance(&mut admin, 3),
                100,
                "{shape}: the write after the swallowed deadlock applied once"
            );
            // The session is as it was: its own writes commit, and the next delivery runs.
            conn.batch_execute("UPDATE accounts SET balance = balance + 1000 WHERE id = 3")
                .unwrap();
            assert_eq!(
                inbox_tests::balance(&mut admin, 3),
                1100,
                "{shape}: the session's own write did not commit"
            );
            assert_eq!(
                count(&mut conn, "SELECT CAST(@@autocommit AS SIGNED) AS n"),
                1,
                "{shape}"
            );
            let outcome = handler(&mut conn, &format!("again-{n}"), &dance);
            assert!(outcome.unwrap().is_processed(), "{shape}");
            admin
                .batch_execute("UPDATE accounts SET balance = 0 WHERE id = 3; DELETE FROM inbox")
                .unwrap();
        }
    }

    #[idempotent(consumer = "waits", key = id, retries = 0)]
    fn waits_for_account_1(
        conn: &mut MysqlConnection,
        id: &str,
    ) -> Result<(), inbox_diesel::Error> {
        conn.batch_execute(
            "SET SESSION innodb_lock_wait_timeout = 1;
             UPDATE accounts SET balance = balance + 1 WHERE id = 1",
        )?;
        Ok(())
    }

    /// A session whose language the application (or a pool's hook) set after the startup
    /// check set it to English: a lock wait timeout in the body, through the text protocol
    /// (no error number), was read in German, classed `Other` and dead-lettered. Each
    /// handler transaction speaks English, and the session's language is put back after.
    #[test]
    fn a_language_set_after_the_check_is_english_inside_the_handler() {
        let db = MysqlDb::new("languages_reset");
        let mut conn = db.connect();
        // Checked (which sets the session's messages to English), then set to German.
        assert!(
            waits_for_account_1(&mut conn, "warm")
                .unwrap()
                .is_processed()
        );
        conn.batch_execute("SET SESSION lc_messages = 'de_DE'")
            .unwrap();
        let mut holder = db.connect();
        holder
            .batch_execute("START TRANSACTION; UPDATE accounts SET balance = balance WHERE id = 1")
            .unwrap();
        let error = waits_for_account_1(&mut conn, "m-1").unwrap_err();
        holder.batch_execute("ROLLBACK").unwrap();
        assert_eq!(error.class(), LOCK, "{error:?}");
        assert_eq!(error.action(), inbox_diesel::Action::RetryLater);
        #[derive(diesel::QueryableByName)]
        struct Language {
            #[diesel(sql_type = diesel::sql_types::Text)]
            language: String,
        }
        let language: Language = diesel::RunQueryDsl::get_result(
            diesel::sql_query("SELECT CAST(@@SESSION.lc_messages AS CHAR) AS language"),
            &mut conn,
        )
        .unwrap();
        assert_eq!(
            language.language, "de_DE",
            "the session's own language, put back"
        );
        assert!(
            waits_for_account_1(&mut conn, "m-1")
                .unwrap()
                .is_processed()
        );
    }

    /// DDL in the body: MariaDB commits the open transaction before it — the marker and
    /// the writes before it committed, the handler's transaction gone.
    #[idempotent(consumer = "ddl", key = id)]
    fn with_ddl(conn: &mut MysqlConnection, id: &str) -> Result<(), inbox_diesel::Error> {
        conn.batch_execute("UPDATE accounts SET balance = balance + 1 WHERE id = 1")?;
        conn.batch_execute("CREATE TABLE IF NOT EXISTS ddl_in_a_body (x INTEGER)")?;
        conn.batch_execute("UPDATE accounts SET balance = balance + 1 WHERE id = 2")?;
        Ok(())
    }

    /// What the server committed before the DDL cannot be taken back: the runtime, which
    /// finds its transaction gone and the marker committed, reports it (`TransactionAborted`,
    /// `Alert`) and does not run the handler again — a redelivery is a duplicate — rather
    /// than answering `Processed` for half of the work.
    #[test]
    fn ddl_in_a_body_is_reported_not_retried() {
        let db = MysqlDb::new("ddl_in_a_body");
        let mut conn = db.connect();
        let error = with_ddl(&mut conn, "m-1").unwrap_err();
        assert!(
            matches!(error, inbox_diesel::Error::TransactionAborted { .. }),
            "{error:?}"
        );
        assert_eq!(error.action(), inbox_diesel::Action::Alert);
        let mut admin = db.connect();
        assert_eq!(count(&mut admin, "SELECT count(*) AS n FROM inbox"), 1);
        assert_eq!(
            inbox_tests::balance(&mut admin, 1),
            1,
            "committed by the DDL, once"
        );
        assert_eq!(
            inbox_tests::balance(&mut admin, 2),
            0,
            "after the DDL: rolled back"
        );
        assert!(with_ddl(&mut conn, "m-1").unwrap().is_duplicate());
        assert_eq!(
            count(&mut conn, "SELECT CAST(@@autocommit AS SIGNED) AS n"),
            1
        );
        conn.batch_execute("UPDATE accounts SET balance = balance + 10 WHERE id = 2")
            .unwrap();
        assert_eq!(
            inbox_tests::balance(&mut admin, 2),
            10,
            "the session's own writes commit"
        );
    }

    #[idempotent(consumer = "languages", key = id)]
    fn credit(conn: &mut MysqlConnection, id: &str) -> Result<(), inbox_diesel::Error> {
        use diesel::RunQueryDsl;
        diesel::sql_query("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
            .execute(conn)?;
        Ok(())
    }

    #[idempotent(consumer = "languages", key = id)]
    async fn credit_async(
        conn: &mut diesel_async::AsyncMysqlConnection,
        id: &str,
    ) -> Result<(), inbox_diesel::Error> {
        use diesel_async::RunQueryDsl;
        diesel::sql_query("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
            .execute(conn)
            .await?;
        Ok(())
    }

    /// The check is remembered per handler; a new session in another language gets the
    /// checked statements, which its server refuses (the session mark) in that language.
    /// Recognised by code, not words: the session is checked and the message processed.
    #[test]
    fn a_new_session_in_another_language_is_checked_and_processes() {
        let db = MysqlDb::new("languages_new_session");
        assert!(credit(&mut db.connect(), "first").unwrap().is_processed());
        for (n, (language, _)) in LANGUAGES.into_iter().enumerate() {
            let outcome = credit(&mut speaking(&db, language), &format!("m-{n}"));
            assert_eq!(outcome.unwrap(), Outcome::Processed(()), "{language}");
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            use diesel_async::SimpleAsyncConnection;
            for (n, (language, _)) in LANGUAGES.into_iter().enumerate() {
                let mut conn = db.connect_async().await;
                conn.batch_execute(&format!("SET lc_messages = '{language}'"))
                    .await
                    .unwrap();
                let outcome = credit_async(&mut conn, &format!("async-{n}")).await;
                assert_eq!(
                    outcome.unwrap(),
                    Outcome::Processed(()),
                    "async, {language}"
                );
            }
        });
        let mut conn = db.connect();
        assert_eq!(inbox_tests::balance(&mut conn, 1), 7);
        assert_eq!(count(&mut conn, "SELECT count(*) AS n FROM inbox"), 7);
    }

    /// The async driver (mysql_async), after the async check.
    #[test]
    fn async_classes_in_every_language() {
        let db = MysqlDb::new("languages_async");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            use diesel_async::SimpleAsyncConnection;
            for (language, translated) in LANGUAGES {
                let mut conn = db.connect_async().await;
                conn.batch_execute(&format!("SET lc_messages = '{language}'"))
                    .await
                    .unwrap();
                let raw = conn.batch_execute("SELECT * FROM nope").await.unwrap_err();
                assert!(message(&raw).contains(translated), "{language}: {raw}");
                schema::verify_async(&mut conn, &InboxSchema::DEFAULT)
                    .await
                    .unwrap();
                for (sql, expected) in [
                    ("SELECT * FROM nope", ErrorClass::Schema),
                    (
                        "SET STATEMENT max_statement_time = 0.02 FOR SELECT SLEEP(2)",
                        TIMEOUT,
                    ),
                ] {
                    let error = conn.batch_execute(sql).await.expect_err(sql);
                    assert_eq!(class(&error), expected, "{language}: {sql}: {error}");
                }
                let mut holder = db.connect();
                holder
                    .batch_execute(
                        "START TRANSACTION; UPDATE accounts SET balance = balance WHERE id = 1",
                    )
                    .unwrap();
                let error = conn
                    .batch_execute(
                        "SET SESSION innodb_lock_wait_timeout = 1;
                         UPDATE accounts SET balance = 1 WHERE id = 1",
                    )
                    .await
                    .unwrap_err();
                assert_eq!(class(&error), LOCK, "{language}: {error}");
            }
        });
    }
}
