//! What an operator controls, provoked for real: tables altered the way schemas drift,
//! session settings pools set, roles with privileges revoked, a pooler's reset, time zones.
//! Nothing may be lost or applied twice: each shape the runtime cannot rely on is refused by
//! the startup check (naming the table and the fix) before any marker is written, and each
//! fault comes back with the `Action` a pump takes.
//!
//! SQLite always; PostgreSQL and MariaDB with their features (`INBOX_TEST_PG`,
//! `INBOX_TEST_MYSQL`).

use diesel::connection::SimpleConnection;
use inbox_diesel::{Action, Error, Outcome};
use inbox_tests::AppError;

/// The inbox's error out of a handler's `AppError`.
fn inbox_error<T: std::fmt::Debug>(result: Result<T, AppError>) -> Error {
    match result {
        Err(AppError::Inbox(error)) => error,
        other => panic!("expected an inbox error, got {other:?}"),
    }
}

/// The schema refusal of a handler's result: its whole text.
fn refusal<T: std::fmt::Debug>(result: Result<T, AppError>) -> String {
    match inbox_error(result) {
        error @ Error::Schema(_) => {
            assert_eq!(error.action(), Action::Alert);
            inbox_tests::error_chain(&error)
        }
        other => panic!("expected a schema refusal, got {other:?}"),
    }
}

/// A name for one more database of this test process: tests run in parallel, each
/// database under a name of its own.
fn next_name(prefix: &str) -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    format!("{prefix}{n}")
}

/// Runs `alter` on the table, then a delivery on a fresh connection: it must be refused
/// with a text containing each of `expected`, and its body must not have run.
fn refused<C: SimpleConnection>(
    connect: impl Fn() -> C,
    run: fn(&mut C, &u64) -> Result<Outcome<()>, AppError>,
    balance: fn(&mut C) -> i64,
    alter: &str,
    expected: &[&str],
) {
    connect()
        .batch_execute(alter)
        .unwrap_or_else(|e| panic!("{alter}: {e}"));
    let mut conn = connect();
    let text = refusal(run(&mut conn, &1));
    for part in expected {
        assert!(
            text.contains(part),
            "{alter}\nrefused with: {text}\nmissing: {part}"
        );
    }
    assert_eq!(balance(&mut conn), 0, "{alter}: the body ran");
}

mod sqlite {
    use super::*;
    use diesel::prelude::*;
    use inbox_diesel::idempotent;
    use inbox_tests::sqlite::SqliteDb as Db;

    type Conn = diesel::SqliteConnection;

    include!("behaviour/operator_handlers.rs");

    #[idempotent(consumer = "operator", batch = ids, key = |id| *id)]
    fn apply_batch(conn: &mut Conn, ids: &[u64]) -> Result<(), AppError> {
        for _ in ids {
            diesel::sql_query("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
                .execute(conn)?;
        }
        Ok(())
    }

    fn balance(conn: &mut Conn) -> i64 {
        #[derive(diesel::QueryableByName)]
        struct Balance {
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            n: i64,
        }
        diesel::sql_query("SELECT balance AS n FROM accounts WHERE id = 1")
            .get_result::<Balance>(conn)
            .unwrap()
            .n
    }

    fn shape(alter: &str, expected: &[&str]) {
        let db = Db::new(&next_name("shape"));
        refused(|| db.connect(), apply, balance, alter, expected);
    }

    #[test]
    fn a_trigger_that_swallows_the_marker_is_refused() {
        shape(
            "CREATE TRIGGER swallow BEFORE INSERT ON inbox BEGIN SELECT RAISE(IGNORE); END",
            &["trigger `swallow`", "DROP TRIGGER swallow", "main.inbox"],
        );
    }

    /// A trigger created under a connection that had checked the table: the insert writes
    /// nothing, and without the evidence of an existing marker the message is not a
    /// duplicate — the table is checked again and refused. (Before, the new message was
    /// answered `Duplicate` and never applied.)
    #[test]
    fn an_insert_swallowed_under_a_checked_connection_is_not_a_duplicate() {
        let db = Db::new("swallowed");
        let mut conn = db.connect();
        assert!(apply(&mut conn, &1).unwrap().is_processed());
        db.connect()
            .batch_execute(
                "CREATE TRIGGER swallow BEFORE INSERT ON inbox BEGIN SELECT RAISE(IGNORE); END",
            )
            .unwrap();
        let text = refusal(apply(&mut conn, &2));
        assert!(text.contains("trigger `swallow`"), "{text}");
        let text = refusal(apply_batch(&mut db.connect(), &[3, 4]));
        assert!(text.contains("trigger `swallow`"), "{text}");
        // The evidence itself, on a connection whose check is remembered: the batch's
        // duplicate (1) is confirmed, the swallowed new one (5) is not.
        assert_eq!(balance(&mut conn), 1);
        // A redelivery of the processed message is still a duplicate once the trigger goes.
        db.connect().batch_execute("DROP TRIGGER swallow").unwrap();
        assert!(apply(&mut conn, &1).unwrap().is_duplicate());
        assert!(apply(&mut conn, &2).unwrap().is_processed());
        assert_eq!(balance(&mut conn), 2);
    }

    #[test]
    fn a_partial_or_expression_index_is_refused() {
        shape(
            "DROP INDEX ux_inbox_message_consumer; CREATE UNIQUE INDEX ux_inbox_message_consumer \
             ON inbox (message_id, consumer) WHERE processed_at IS NOT NULL",
            &["is partial"],
        );
        shape(
            "DROP INDEX ux_inbox_message_consumer; CREATE UNIQUE INDEX ux_inbox_message_consumer \
             ON inbox (message_id, consumer, lower(consumer))",
            &["(message_id, consumer, (expression))"],
        );
    }

    /// A consumer compared without regard to case (in the index): `Credit`'s message would
    /// be answered as a duplicate of `credit`'s. Refused.
    #[test]
    fn a_consumer_compared_without_case_is_refused() {
        shape(
            "DROP INDEX ux_inbox_message_consumer; CREATE UNIQUE INDEX ux_inbox_message_consumer \
             ON inbox (message_id, consumer COLLATE NOCASE)",
            &["the collation `NOCASE`"],
        );
    }

    #[test]
    fn a_view_in_the_tables_place_is_refused() {
        shape(
            "ALTER TABLE inbox RENAME TO inbox_rows; CREATE VIEW inbox AS SELECT * FROM inbox_rows",
            &["a view"],
        );
    }

    /// A temporary table of the name hides the real one from the connection that made it:
    /// its markers would be gone with the connection.
    #[test]
    fn a_temporary_table_that_shadows_the_inbox_is_refused() {
        let db = Db::new("shadowed");
        let mut conn = db.connect();
        conn.batch_execute(
            "CREATE TEMP TABLE inbox AS SELECT * FROM main.inbox WHERE 0; \
             CREATE UNIQUE INDEX temp.ux_inbox_message_consumer ON inbox (message_id, consumer)",
        )
        .unwrap();
        let text = refusal(apply(&mut conn, &1));
        assert!(text.contains("a temporary table `inbox`"), "{text}");
        assert_eq!(balance(&mut conn), 0);
    }

    /// A temporary table of the name created after the connection was checked: the
    /// handler's statements name the table the check found (`main.inbox`), so the markers
    /// stay where every connection sees them.
    #[test]
    fn a_temporary_table_created_after_the_check_takes_no_markers() {
        let db = Db::new("temp_after");
        let mut conn = db.connect();
        assert!(apply(&mut conn, &1).unwrap().is_processed());
        conn.batch_execute(
            "CREATE TEMP TABLE inbox AS SELECT * FROM main.inbox WHERE 0; \
             CREATE UNIQUE INDEX temp.ux_inbox_message_consumer ON inbox (message_id, consumer)",
        )
        .unwrap();
        assert!(apply(&mut conn, &2).unwrap().is_processed());
        assert!(apply(&mut db.connect(), &2).unwrap().is_duplicate());
        assert_eq!(balance(&mut conn), 2);
    }

    /// A database file the process may only read: refused by the server, routed to `Alert`
    /// (a deployment to fix), not dead-lettered.
    #[test]
    fn a_read_only_database_is_a_permission_fault() {
        let db = Db::new("read_only");
        let mut conn =
            Conn::establish(&format!("file:{}?mode=ro", db.url())).expect("open read-only");
        let error = inbox_error(apply(&mut conn, &1));
        assert_eq!(
            error.class(),
            inbox_diesel::ErrorClass::PermissionDenied,
            "{error:?}"
        );
        assert_eq!(error.action(), Action::Alert);
        assert_eq!(balance(&mut db.connect()), 0);
    }

    /// A key a sender chose is logged escaped and bounded: no forged lines, no terminal
    /// escapes, no 64 KiB line.
    #[test]
    fn a_hostile_key_is_escaped_in_debug() {
        let key = inbox_diesel::MessageKey::text(format!(
            "a\nERROR forged\u{1b}[31m{}",
            "x".repeat(60_000)
        ))
        .unwrap();
        let outcome: Outcome<()> = Outcome::Duplicate {
            consumer: inbox_diesel::Consumer::new("operator").unwrap(),
            key,
            stored: None,
        };
        let logged = format!("{outcome:?}");
        assert!(
            !logged.contains('\n') && !logged.contains('\u{1b}'),
            "{logged}"
        );
        assert!(logged.contains(r"a\nERROR forged\u{1b}[31m"), "{logged}");
        assert!(logged.len() < 400, "{} bytes", logged.len());
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use diesel::prelude::*;
    use inbox_diesel::{ErrorClass, idempotent};
    use inbox_tests::postgres::PgDb as Db;

    type Conn = diesel::PgConnection;

    include!("behaviour/operator_handlers.rs");

    #[idempotent(consumer = "operator", key = *id, table = "public.inbox")]
    fn apply_qualified(conn: &mut Conn, id: &u64) -> Result<(), AppError> {
        diesel::sql_query("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
            .execute(conn)?;
        Ok(())
    }

    #[idempotent(consumer = "operator", key = *id)]
    async fn apply_async(
        conn: &mut diesel_async::AsyncPgConnection,
        id: &u64,
    ) -> Result<(), AppError> {
        diesel_async::RunQueryDsl::execute(
            diesel::sql_query("UPDATE accounts SET balance = balance + 1 WHERE id = 1"),
            conn,
        )
        .await?;
        Ok(())
    }

    fn balance(conn: &mut Conn) -> i64 {
        inbox_tests::server::count(conn, "SELECT balance::int8 AS n FROM accounts WHERE id = 1")
    }

    fn shape(alter: &str, expected: &[&str]) {
        let db = Db::new(&next_name("shape"));
        refused(|| db.connect(), apply, balance, alter, expected);
    }

    #[test]
    fn triggers_rules_and_children_are_refused() {
        shape(
            "CREATE FUNCTION swallow() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN RETURN NULL; END $$; \
             CREATE TRIGGER swallow BEFORE INSERT ON inbox FOR EACH ROW EXECUTE FUNCTION swallow()",
            &[
                "`inbox` (`public.inbox` on this session)",
                "trigger `swallow`",
            ],
        );
        shape(
            "CREATE RULE swallow AS ON INSERT TO inbox DO INSTEAD NOTHING",
            &["rule `swallow`", "DROP RULE swallow ON inbox"],
        );
        shape(
            "CREATE TABLE inbox_2026 () INHERITS (inbox)",
            &["inheritance child `inbox_2026`"],
        );
    }

    /// A trigger created under a checked connection swallows the next insert: not a
    /// duplicate, refused once the table is checked again.
    #[test]
    fn an_insert_swallowed_under_a_checked_connection_is_not_a_duplicate() {
        let db = Db::new("swallowed");
        let mut conn = db.connect();
        assert!(apply(&mut conn, &1).unwrap().is_processed());
        db.connect()
            .batch_execute(
                "CREATE FUNCTION swallow() RETURNS trigger LANGUAGE plpgsql AS \
                 $$ BEGIN RETURN NULL; END $$; \
                 CREATE TRIGGER swallow BEFORE INSERT ON inbox FOR EACH ROW \
                 EXECUTE FUNCTION swallow()",
            )
            .unwrap();
        let text = refusal(apply(&mut conn, &2));
        assert!(text.contains("trigger `swallow`"), "{text}");
        assert_eq!(balance(&mut conn), 1);
    }

    #[test]
    fn unlogged_and_temporary_tables_are_refused() {
        shape(
            "ALTER TABLE inbox SET UNLOGGED",
            &["UNLOGGED", "SET LOGGED"],
        );
        let db = Db::new("temporary");
        let mut conn = db.connect();
        conn.batch_execute(
            "CREATE TEMP TABLE inbox (LIKE public.inbox INCLUDING ALL); \
             CREATE UNIQUE INDEX ux_inbox_message_consumer ON pg_temp.inbox (message_id, consumer)",
        )
        .unwrap();
        let text = refusal(apply(&mut conn, &1));
        assert!(text.contains("a temporary table"), "{text}");
    }

    /// A temporary table of the name, or a `search_path` changed, after the connection was
    /// checked: the handler's unqualified name means another table on this session now, so
    /// the session is checked again — and refused, as a fresh session like it would be —
    /// rather than given the markers of the table it names now, or of the one it named
    /// before (a schema per tenant: the first tenant's). Back as it was, it goes on; nothing
    /// is written to the other tables, nothing applied twice.
    #[test]
    fn the_checked_table_is_the_one_the_name_means() {
        let db = Db::new("pinned");
        let mut conn = db.connect();
        assert!(apply(&mut conn, &1).unwrap().is_processed());
        conn.batch_execute("CREATE TEMP TABLE inbox (LIKE public.inbox INCLUDING ALL)")
            .unwrap();
        let text = refusal(apply(&mut conn, &2));
        assert!(text.contains("a temporary table"), "{text}");
        conn.batch_execute("DROP TABLE pg_temp.inbox").unwrap();
        assert!(apply(&mut conn, &2).unwrap().is_processed());
        assert!(apply(&mut db.connect(), &2).unwrap().is_duplicate());
        conn.batch_execute(
            "CREATE SCHEMA shadow; CREATE TABLE shadow.inbox (LIKE public.inbox INCLUDING ALL); \
             SET search_path = shadow, public",
        )
        .unwrap();
        let text = refusal(apply(&mut conn, &3));
        assert!(text.contains("shadow"), "{text}");
        assert_eq!(
            inbox_tests::server::count(&mut conn, "SELECT count(*) AS n FROM shadow.inbox"),
            0
        );
        conn.batch_execute("DROP SCHEMA shadow CASCADE; SET search_path = public")
            .unwrap();
        assert!(apply(&mut conn, &2).unwrap().is_duplicate());
        assert!(apply(&mut conn, &3).unwrap().is_processed());
        assert_eq!(balance(&mut db.connect()), 3);
    }

    #[test]
    fn indexes_the_runtime_cannot_rely_on_are_refused() {
        let drop = "DROP INDEX ux_inbox_message_consumer; ";
        shape(
            &format!(
                "{drop}ALTER TABLE inbox ADD CONSTRAINT ux_inbox_message_consumer \
                 UNIQUE (message_id, consumer) DEFERRABLE INITIALLY IMMEDIATE"
            ),
            &["DEFERRABLE"],
        );
        shape(
            &format!(
                "{drop}CREATE UNIQUE INDEX ux_inbox_message_consumer ON inbox \
                 (message_id, consumer) WHERE processed_at IS NOT NULL"
            ),
            &["is partial"],
        );
        shape(
            &format!(
                "{drop}CREATE UNIQUE INDEX ux_inbox_message_consumer ON inbox \
                 (message_id, consumer, lower(consumer))"
            ),
            &["(message_id, consumer, (expression))"],
        );
        // A failed CREATE UNIQUE INDEX CONCURRENTLY leaves an invalid index behind.
        let db = Db::new("invalid_index");
        let mut admin = db.connect();
        admin
            .batch_execute(&format!(
                "{drop}INSERT INTO inbox (message_id, consumer) VALUES \
                 ('00000000-0000-0000-0000-000000000001', 'x'), \
                 ('00000000-0000-0000-0000-000000000001', 'x')"
            ))
            .unwrap();
        admin
            .batch_execute(
                "CREATE UNIQUE INDEX CONCURRENTLY ux_inbox_message_consumer \
                 ON inbox (message_id, consumer)",
            )
            .unwrap_err();
        let text = refusal(apply(&mut db.connect(), &1));
        assert!(text.contains("is invalid"), "{text}");
        // An index that also INCLUDEs a column is still the key: accepted.
        let db = Db::new("include");
        db.connect()
            .batch_execute(&format!(
                "{drop}CREATE UNIQUE INDEX ux_inbox_message_consumer ON inbox \
                 (message_id, consumer) INCLUDE (processed_at)"
            ))
            .unwrap();
        assert!(apply(&mut db.connect(), &1).unwrap().is_processed());
    }

    #[test]
    fn columns_that_cannot_hold_what_the_runtime_writes_are_refused() {
        shape(
            "ALTER TABLE inbox ALTER COLUMN claimed_until TYPE timestamp",
            &["`claimed_until` is timestamp without time zone", "UTC"],
        );
        shape(
            "ALTER TABLE inbox ADD COLUMN key_text varchar(20)",
            &["`key_text` is character varying(20)"],
        );
        shape(
            "ALTER TABLE inbox ALTER COLUMN consumer TYPE varchar(20)",
            &["`consumer` is character varying(20)"],
        );
        shape(
            "CREATE COLLATION ci (provider = icu, locale = 'und-u-ks-level2', \
             deterministic = false); \
             ALTER TABLE inbox ALTER COLUMN consumer TYPE text COLLATE ci",
            &["the collation `ci`"],
        );
    }

    /// A database in LATIN1 cannot hold every key's text: with `key_text` the check
    /// refuses it (a key outside LATIN1 would fail on every delivery); without, it is accepted.
    #[test]
    fn a_database_encoding_that_cannot_hold_keys_is_refused_with_key_text() {
        let db = Db::with_options(
            &next_name("latin1"),
            "ENCODING 'LATIN1' TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'",
        );
        let mut conn = db.connect();
        assert!(apply(&mut conn, &1).unwrap().is_processed());
        conn.batch_execute("ALTER TABLE inbox ADD COLUMN key_text text")
            .unwrap();
        let mut conn = db.connect();
        let text = refusal(apply(&mut conn, &2));
        assert!(
            text.contains("the database encoding LATIN1") && text.contains("UTF8 database"),
            "{text}"
        );
        assert_eq!(balance(&mut conn), 1, "the refused delivery's body ran");
    }

    /// Two schemas with a table of the name: which one an unqualified name means depends on
    /// each session's `search_path`. Refused; the qualified name is accepted.
    #[test]
    fn a_name_that_depends_on_the_search_path_is_refused() {
        let db = Db::new("search_path");
        db.connect()
            .batch_execute(
                "CREATE SCHEMA other; CREATE TABLE other.inbox (LIKE public.inbox INCLUDING ALL)",
            )
            .unwrap();
        let mut conn = db.connect();
        let text = refusal(apply(&mut conn, &1));
        assert!(
            text.contains("tables named `inbox` in the schemas") && text.contains("public.inbox"),
            "{text}"
        );
        assert!(apply_qualified(&mut conn, &1).unwrap().is_processed());
        conn.batch_execute("SET search_path = other").unwrap();
        assert!(apply_qualified(&mut conn, &1).unwrap().is_duplicate());
    }

    /// A schema per tenant, each with its inbox, and a role per tenant that may use its own
    /// schema only (its `search_path` that schema): an unqualified name can mean one table
    /// only for that role, and it is not refused for tables it cannot reach (an operator's
    /// trial: every delivery of such a role an alert). A role that may use two of them still
    /// is.
    #[test]
    fn tables_of_the_name_a_role_cannot_reach_are_not_counted() {
        let db = Db::new("tenant_roles");
        let tenant = format!("inbox_tenant_{}", std::process::id());
        let both = format!("inbox_both_{}", std::process::id());
        let admin = |sql: &str| {
            db.connect()
                .batch_execute(sql)
                .unwrap_or_else(|e| panic!("{sql}: {e}"))
        };
        let inbox =
            inbox_diesel::schema::postgres::create_table_sql(&inbox_diesel::InboxSchema::DEFAULT);
        admin(&format!(
            "REVOKE ALL ON SCHEMA public FROM PUBLIC;
             CREATE SCHEMA t1; SET search_path = t1; {inbox}; SET search_path = public;
             CREATE TABLE t1.accounts (LIKE public.accounts INCLUDING ALL);
             INSERT INTO t1.accounts VALUES (1, 0);
             CREATE ROLE {tenant} LOGIN; ALTER ROLE {tenant} SET search_path = t1;
             GRANT USAGE ON SCHEMA t1 TO {tenant};
             GRANT SELECT, INSERT, UPDATE ON t1.inbox, t1.accounts TO {tenant};
             GRANT USAGE ON ALL SEQUENCES IN SCHEMA t1 TO {tenant};
             CREATE ROLE {both} LOGIN IN ROLE {tenant}; ALTER ROLE {both} SET search_path = t1;
             GRANT USAGE ON SCHEMA public TO {both}"
        ));
        let mut conn = db.connect_as(&tenant);
        assert!(apply(&mut conn, &1).unwrap().is_processed());
        assert!(apply(&mut conn, &1).unwrap().is_duplicate());
        assert_eq!(balance(&mut conn), 1, "t1's account");
        let text = refusal(apply(&mut db.connect_as(&both), &2));
        assert!(
            text.contains("tables named `inbox` in the schemas"),
            "{text}"
        );
        // The fix names the table this session means, not the first of the others.
        assert!(text.contains("this session's is `t1.inbox`"), "{text}");
        for role in [&tenant, &both] {
            admin(&format!("DROP OWNED BY {role}; DROP ROLE {role}"));
        }
    }

    /// A role that may read the table but not insert: the check refuses before any
    /// delivery; a privilege revoked under a checked connection is a permission fault
    /// (`Alert`), not dead-lettered.
    #[test]
    fn privileges_are_checked_and_their_loss_is_a_permission_fault() {
        let db = Db::new("privileges");
        let role = Role::new(&db, "SELECT ON inbox, accounts");
        let text = refusal(apply(&mut db.connect_as(&role.0), &1));
        assert!(text.contains("no privilege INSERT"), "{text}");

        role.grant("INSERT ON inbox");
        let mut conn = db.connect_as(&role.0);
        role.grant("UPDATE ON accounts");
        assert!(apply(&mut conn, &1).unwrap().is_processed());
        // Claim mode also updates its claims.
        let sent = AtomicUsize::new(0);
        let text = refusal(send(&mut conn, &2, &sent, &|| ()));
        assert!(text.contains("UPDATE"), "{text}");
        assert_eq!(sent.load(Ordering::SeqCst), 0);

        role.revoke("INSERT ON inbox");
        let error = inbox_error(apply(&mut conn, &3));
        assert_eq!(error.class(), ErrorClass::PermissionDenied, "{error:?}");
        assert_eq!(error.action(), Action::Alert);
        // Its text alone names what was refused: an operator who logs `{e}` reads it.
        assert!(
            error
                .to_string()
                .ends_with(": permission denied for table inbox"),
            "{error}"
        );
        assert_eq!(balance(&mut db.connect()), 1);
    }

    /// The side effect ran, and then the stamp was refused: an error that says the effect
    /// happened (`Alert`), not a database error a pump would retry.
    #[test]
    fn a_stamp_refused_after_the_side_effect_says_the_effect_happened() {
        let db = Db::new("stamp_refused");
        let role = Role::new(&db, "SELECT, INSERT, UPDATE ON inbox");
        let mut conn = db.connect_as(&role.0);
        let sent = AtomicUsize::new(0);
        let outcome = send(&mut conn, &1, &sent, &|| role.revoke("UPDATE ON inbox"));
        match inbox_error(outcome) {
            error @ Error::EffectNotRecorded { attempt: 1, .. } => {
                assert_eq!(error.action(), Action::Alert);
                assert!(error.to_string().contains("side effect of attempt 1 ran"));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(sent.load(Ordering::SeqCst), 1);
    }

    /// A replica, a demoted primary, `default_transaction_read_only`: the session can only
    /// read. `Reconnect` (a fresh connection finds the writable primary), never dead-lettered
    /// — in transaction mode, claim mode and async.
    #[tokio::test]
    async fn a_read_only_session_is_reconnected_not_dead_lettered() {
        let db = Db::new("read_only");
        let mut conn = db.connect();
        conn.batch_execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
            .unwrap();
        let error = inbox_error(apply(&mut conn, &1));
        assert_eq!(error.class(), ErrorClass::ReadOnly, "{error:?}");
        assert_eq!(error.action(), Action::Reconnect);
        let sent = AtomicUsize::new(0);
        let error = inbox_error(send(&mut conn, &2, &sent, &|| ()));
        assert_eq!(error.action(), Action::Reconnect, "{error:?}");
        assert_eq!(sent.load(Ordering::SeqCst), 0);

        let mut conn = db.connect_async().await;
        diesel_async::SimpleAsyncConnection::batch_execute(
            &mut conn,
            "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY",
        )
        .await
        .unwrap();
        let error = inbox_error(apply_async(&mut conn, &3).await);
        assert_eq!(error.action(), Action::Reconnect, "{error:?}");
        assert_eq!(balance(&mut db.connect()), 0);
    }

    /// What a demoted primary's open sessions are: read-only.
    const DEMOTED: &str = "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY";
    /// The session's server process, which a new connection does not share.
    const PID: &str = "SELECT pg_backend_pid()::int8 AS n";

    /// An r2d2 pool of one whose session is made read-only: `deliver` answers `Reconnect`,
    /// the pool's next connection is another session, and `deliver` is processed there.
    fn discarded_by_a_pool_of_one(
        db: &Db,
        deliver: impl Fn(&mut Conn) -> Result<inbox_diesel::Outcome<()>, AppError>,
    ) {
        use diesel::r2d2::{ConnectionManager, Pool};
        let pool = Pool::builder()
            .max_size(1)
            .build(ConnectionManager::<Conn>::new(db.url()))
            .unwrap();
        let mut pooled = pool.get().unwrap();
        let demoted = inbox_tests::server::count(&mut *pooled, PID);
        pooled.batch_execute(DEMOTED).unwrap();
        let error = inbox_error(deliver(&mut pooled));
        assert_eq!(error.action(), Action::Reconnect, "{error:?}");
        drop(pooled);
        let mut pooled = pool.get().unwrap();
        assert_ne!(inbox_tests::server::count(&mut *pooled, PID), demoted);
        assert!(deliver(&mut pooled).unwrap().is_processed());
    }

    /// A primary demoted by a failover keeps its open sessions, read-only: a pool's
    /// connection answered `Reconnect` is discarded by the pool (r2d2, deadpool, bb8 each ask
    /// diesel whether it is broken), and the redelivery runs on a new session. Before, the
    /// pool handed the same session back to every redelivery until the broker's limit
    /// dead-lettered the message. Without a pool, the same connection runs the next
    /// delivery once its session can write again.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_read_only_session_is_discarded_by_its_pool() {
        use diesel_async::pooled_connection::AsyncDieselConnectionManager;
        type Manager = AsyncDieselConnectionManager<diesel_async::AsyncPgConnection>;
        let db = Db::new("read_only_pooled");

        discarded_by_a_pool_of_one(&db, |conn| apply(conn, &1));

        let deadpool =
            diesel_async::pooled_connection::deadpool::Pool::builder(Manager::new(db.url()))
                .max_size(1)
                .build()
                .unwrap();
        let bb8 = diesel_async::pooled_connection::bb8::Pool::builder()
            .max_size(1)
            .build(Manager::new(db.url()))
            .await
            .unwrap();
        for (n, pool) in [(2, "deadpool"), (3, "bb8")] {
            let mut checked_out = match pool {
                "deadpool" => Checkout::Deadpool(deadpool.get().await.unwrap()),
                _ => Checkout::Bb8(bb8.get().await.unwrap()),
            };
            let conn = checked_out.conn();
            let demoted = pid_async(conn).await;
            diesel_async::SimpleAsyncConnection::batch_execute(conn, DEMOTED)
                .await
                .unwrap();
            let error = inbox_error(apply_async(conn, &n).await);
            assert_eq!(error.action(), Action::Reconnect, "{pool}: {error:?}");
            drop(checked_out);
            let mut checked_out = match pool {
                "deadpool" => Checkout::Deadpool(deadpool.get().await.unwrap()),
                _ => Checkout::Bb8(bb8.get().await.unwrap()),
            };
            let conn = checked_out.conn();
            assert_ne!(pid_async(conn).await, demoted, "{pool}");
            assert!(
                apply_async(conn, &n).await.unwrap().is_processed(),
                "{pool}"
            );
        }

        let mut conn = db.connect();
        conn.batch_execute(DEMOTED).unwrap();
        let error = inbox_error(apply(&mut conn, &4));
        assert_eq!(error.action(), Action::Reconnect, "{error:?}");
        conn.batch_execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ WRITE")
            .unwrap();
        assert!(apply(&mut conn, &4).unwrap().is_processed());
        assert_eq!(balance(&mut conn), 4);
    }

    #[idempotent(consumer = "operator", key = *id, transaction = "caller")]
    fn apply_joined(conn: &mut Conn, id: &u64) -> Result<(), AppError> {
        diesel::sql_query("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
            .execute(conn)?;
        Ok(())
    }

    /// The same, for a handler in the application's transaction (`transaction = "caller"`):
    /// its savepoint rolled back, the connection is put in error — the application's rollback
    /// is refused by diesel and its error comes back — and the pool discards it, which ends
    /// that transaction with the session. Before, the pool handed the same read-only session
    /// back to every redelivery (an operator's trial: 127 of 200 dead-lettered). Without a
    /// pool, the next handler call rolls back what was left open and runs.
    #[test]
    fn a_read_only_session_under_the_callers_transaction_is_discarded_by_its_pool() {
        let db = Db::new("read_only_joined");
        let in_callers = |conn: &mut Conn, id: u64| {
            conn.transaction::<_, AppError, _>(|conn| apply_joined(conn, &id))
        };

        discarded_by_a_pool_of_one(&db, |conn| in_callers(conn, 1));

        let mut conn = db.connect();
        conn.batch_execute(DEMOTED).unwrap();
        let error = inbox_error(in_callers(&mut conn, 2));
        assert_eq!(error.action(), Action::Reconnect, "{error:?}");
        // The caller's transaction, left open by the refused rollback, is rolled back by the
        // next handler call: the session answers for itself (read-only), not as a handler
        // called inside a transaction.
        let error = inbox_error(apply(&mut conn, &2));
        assert_eq!(error.class(), ErrorClass::ReadOnly, "{error:?}");
        conn.batch_execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ WRITE")
            .unwrap();
        assert!(apply(&mut conn, &2).unwrap().is_processed());
        assert!(in_callers(&mut conn, 3).unwrap().is_processed());
        assert_eq!(balance(&mut conn), 3);
    }

    /// A connection checked out of one of diesel-async's pools.
    enum Checkout<'p> {
        Deadpool(
            diesel_async::pooled_connection::deadpool::Object<diesel_async::AsyncPgConnection>,
        ),
        Bb8(
            diesel_async::pooled_connection::bb8::PooledConnection<
                'p,
                diesel_async::AsyncPgConnection,
            >,
        ),
    }

    impl Checkout<'_> {
        fn conn(&mut self) -> &mut diesel_async::AsyncPgConnection {
            match self {
                Checkout::Deadpool(conn) => conn,
                Checkout::Bb8(conn) => conn,
            }
        }
    }

    async fn pid_async(conn: &mut diesel_async::AsyncPgConnection) -> i64 {
        #[derive(QueryableByName)]
        struct Pid {
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            n: i64,
        }
        let read = diesel::sql_query("SELECT pg_backend_pid()::int8 AS n");
        diesel_async::RunQueryDsl::get_result::<Pid>(read, conn)
            .await
            .unwrap()
            .n
    }

    /// A transaction-mode pooler's reset (`DISCARD ALL`) drops the statements the
    /// connection prepared: where the runtime's own statement was prepared (claim mode's),
    /// the connection stops caching statements and claims again — not a schema fault for
    /// ever, nor a reconnect. A transaction-mode handler's marker is prepared again where it
    /// is missing, in the round trip of its `BEGIN`.
    #[tokio::test]
    async fn prepared_statements_dropped_under_the_connection_mean_reconnect() {
        let db = Db::new("discard_all");
        let sent = AtomicUsize::new(0);
        let mut conn = db.connect();
        assert!(send(&mut conn, &1, &sent, &|| ()).unwrap().is_processed());
        conn.batch_execute("DISCARD ALL").unwrap();
        assert!(send(&mut conn, &2, &sent, &|| ()).unwrap().is_processed());
        assert!(send(&mut conn, &2, &sent, &|| ()).unwrap().is_duplicate());
        assert_eq!(sent.load(Ordering::SeqCst), 2);

        let mut conn = db.connect();
        assert!(apply(&mut conn, &11).unwrap().is_processed());
        conn.batch_execute("DISCARD ALL").unwrap();
        assert!(apply(&mut conn, &12).unwrap().is_processed());
        assert!(apply(&mut conn, &12).unwrap().is_duplicate());

        let mut conn = db.connect_async().await;
        assert!(apply_async(&mut conn, &13).await.unwrap().is_processed());
        diesel_async::SimpleAsyncConnection::batch_execute(&mut conn, "DEALLOCATE ALL")
            .await
            .unwrap();
        assert!(apply_async(&mut conn, &14).await.unwrap().is_processed());
        assert!(apply_async(&mut conn, &14).await.unwrap().is_duplicate());
        assert_eq!(balance(&mut db.connect()), 4);
    }

    /// A partitioned inbox: each partition's rows are the inbox's. A redelivery is a
    /// duplicate (the evidence is read through the partitioned table), and what the check
    /// refuses on the table it refuses on a partition: a trigger, an UNLOGGED partition.
    #[test]
    fn a_partitioned_inbox_works_and_its_partitions_are_checked() {
        let partitioned = "DROP TABLE inbox; \
             CREATE TABLE inbox (id BIGINT GENERATED ALWAYS AS IDENTITY, \
             message_id UUID NOT NULL, consumer TEXT COLLATE \"C\" NOT NULL, \
             received_at TIMESTAMPTZ NOT NULL DEFAULT now(), processed_at TIMESTAMPTZ, \
             claimed_until TIMESTAMPTZ, attempts INTEGER NOT NULL DEFAULT 1) \
             PARTITION BY LIST (consumer); \
             CREATE UNIQUE INDEX ux_inbox_message_consumer ON inbox (message_id, consumer); \
             CREATE TABLE inbox_operator PARTITION OF inbox FOR VALUES IN ('operator'); \
             CREATE TABLE inbox_default PARTITION OF inbox DEFAULT";
        let db = Db::new("partitioned");
        db.connect().batch_execute(partitioned).unwrap();
        let mut conn = db.connect();
        assert!(apply(&mut conn, &1).unwrap().is_processed());
        assert!(apply(&mut conn, &1).unwrap().is_duplicate());
        assert!(apply(&mut db.connect(), &1).unwrap().is_duplicate());
        assert_eq!(balance(&mut conn), 1);

        shape(
            &format!(
                "{partitioned}; CREATE FUNCTION forget() RETURNS trigger LANGUAGE plpgsql AS \
                 $$ BEGIN DELETE FROM inbox WHERE id = NEW.id; RETURN NULL; END $$; \
                 CREATE TRIGGER archive AFTER INSERT ON inbox_operator FOR EACH ROW \
                 EXECUTE FUNCTION forget()"
            ),
            &["trigger `archive` on `inbox_operator`"],
        );
        shape(
            &format!(
                "{partitioned}; CREATE UNLOGGED TABLE inbox_fast PARTITION OF inbox \
                 FOR VALUES IN ('fast')"
            ),
            &["UNLOGGED"],
        );
    }

    /// Another unique index that a marker can violate where the inbox's does not: refused.
    /// One that covers (message_id, consumer) cannot be violated alone: accepted.
    #[test]
    fn other_unique_indexes_are_refused_unless_they_cover_the_key() {
        shape(
            "CREATE UNIQUE INDEX ux_inbox_message_only ON inbox (message_id)",
            &["the unique index `ux_inbox_message_only (message_id)`"],
        );
        let db = Db::new("covering_unique");
        db.connect()
            .batch_execute(
                "CREATE UNIQUE INDEX ux_inbox_wide ON inbox (consumer, message_id, received_at)",
            )
            .unwrap();
        let mut conn = db.connect();
        assert!(apply(&mut conn, &1).unwrap().is_processed());
        assert!(apply(&mut conn, &1).unwrap().is_duplicate());
    }

    /// Another unique index on the key itself, older than the inbox's own once that is
    /// rebuilt (`REINDEX … CONCURRENTLY`, the fix the check gives for an invalid index):
    /// PostgreSQL reports a duplicate on whichever index it checks first, the older.
    #[test]
    fn a_twin_of_the_inbox_index_checked_first_still_answers_duplicate() {
        let db = Db::new("twin_unique");
        db.connect()
            .batch_execute("CREATE UNIQUE INDEX ux_inbox_twin ON inbox (message_id, consumer)")
            .unwrap();
        db.connect()
            .batch_execute("REINDEX INDEX CONCURRENTLY ux_inbox_message_consumer")
            .unwrap();
        let mut conn = db.connect();
        assert!(apply(&mut conn, &1).unwrap().is_processed());
        let again = apply(&mut conn, &1);
        assert!(
            matches!(&again, Ok(outcome) if outcome.is_duplicate()),
            "{again:?}"
        );
    }

    /// The unique index compares consumers with a nondeterministic collation (the column's
    /// own is "C"): refused, where it made a new consumer's every message an error.
    #[test]
    fn an_index_with_a_nondeterministic_collation_is_refused() {
        shape(
            "CREATE COLLATION ci (provider = icu, locale = 'und-u-ks-level2', \
             deterministic = false); DROP INDEX ux_inbox_message_consumer; \
             CREATE UNIQUE INDEX ux_inbox_message_consumer ON inbox (message_id, consumer COLLATE ci)",
            &["the collation `ci`"],
        );
    }

    /// The inbox table refuses the marker for a reason of its own — a column added without
    /// a default, a check, an exhausted sequence — which the check cannot foresee: a schema
    /// fault (`Alert`), never the message's dead letter.
    #[test]
    fn a_marker_the_table_refuses_is_a_schema_fault_not_a_dead_letter() {
        for alter in [
            "ALTER TABLE inbox ADD COLUMN tenant TEXT NOT NULL",
            "ALTER TABLE inbox ADD CONSTRAINT known CHECK (consumer IN ('credit'))",
            "ALTER SEQUENCE inbox_id_seq MAXVALUE 2; SELECT nextval('inbox_id_seq'); \
             SELECT nextval('inbox_id_seq')",
        ] {
            let db = Db::new(&next_name("refuses"));
            db.connect().batch_execute(alter).unwrap();
            let mut conn = db.connect();
            let error = inbox_error(apply(&mut conn, &1));
            assert_eq!(error.class(), ErrorClass::Schema, "{alter}: {error:?}");
            assert_eq!(error.action(), Action::Alert, "{alter}");
            assert_eq!(balance(&mut conn), 0);
        }
    }

    /// A session that commits without waiting for the WAL flush can lose an acknowledged
    /// message in a crash: refused.
    #[test]
    fn synchronous_commit_off_is_refused() {
        let db = Db::new("synchronous_commit");
        let mut conn = db.connect();
        conn.batch_execute("SET synchronous_commit = off").unwrap();
        let text = refusal(apply(&mut conn, &1));
        assert!(text.contains("synchronous_commit = off"), "{text}");
    }

    /// The consumers' role read-only by its settings on a primary (`ALTER ROLE … SET
    /// default_transaction_read_only = on`, an operator's trial): refused by the check as a
    /// deployment fault (`Alert`, and by `schema::verify` before a pump starts), not
    /// answered `Reconnect` on every delivery — every connection of the role gets the same.
    /// A database frozen for maintenance the same way (`ALTER DATABASE`) passes: the freeze
    /// ends, and a delivery meanwhile is `Reconnect`, which the pumps pause on.
    #[test]
    fn a_role_read_only_by_its_settings_on_a_primary_is_refused() {
        let db = Db::new("read_only_role");
        let role = Role::new(&db, "SELECT, INSERT, UPDATE ON inbox, accounts");
        role.admin(&format!(
            "ALTER ROLE {} SET default_transaction_read_only = on",
            role.0
        ));
        let mut conn = db.connect_as(&role.0);
        let verified = inbox_diesel::schema::verify(&mut conn, &inbox_diesel::InboxSchema::DEFAULT);
        let text = verified.expect_err("verify refuses it").to_string();
        assert!(text.contains("set for the role"), "{text}");
        let error = inbox_error(apply(&mut conn, &1));
        assert_eq!(error.action(), Action::Alert, "{error:?}");
        role.admin(&format!(
            "ALTER ROLE {} RESET default_transaction_read_only",
            role.0
        ));
        assert!(
            apply(&mut db.connect_as(&role.0), &1)
                .unwrap()
                .is_processed()
        );

        let frozen = Db::new("read_only_database");
        frozen
            .connect()
            .batch_execute(&format!(
                "ALTER DATABASE \"{}\" SET default_transaction_read_only = on",
                frozen.name()
            ))
            .unwrap();
        let error = inbox_error(apply(&mut frozen.connect(), &1));
        assert_eq!(error.action(), Action::Reconnect, "{error:?}");
        // A new session, set read-write for its statement, ends the freeze.
        let mut admin = frozen.connect();
        admin
            .batch_execute("SET default_transaction_read_only = off")
            .unwrap();
        admin
            .batch_execute(&format!(
                "ALTER DATABASE \"{}\" RESET default_transaction_read_only",
                frozen.name()
            ))
            .unwrap();
        assert!(apply(&mut frozen.connect(), &1).unwrap().is_processed());
    }

    /// Row-level security on the inbox, applied to the consumers' role (a policy by a
    /// setting, as a database shared by tenants has): the markers of other sessions are
    /// hidden from the role, so a duplicate's marker reads as absent. The startup check
    /// refuses it, naming it, before any delivery; the table's owner and a role that
    /// bypasses it are not under it.
    #[test]
    fn row_level_security_applied_to_the_consumers_is_refused() {
        let db = Db::new("row_security");
        let role = Role::new(&db, "SELECT, INSERT, UPDATE ON inbox, accounts");
        role.admin(
            "ALTER TABLE inbox ENABLE ROW LEVEL SECURITY; CREATE POLICY by_tenant ON inbox \
             USING (consumer = current_setting('app.consumer', true)) WITH CHECK (true)",
        );
        let mut conn = db.connect_as(&role.0);
        let verified = inbox_diesel::schema::verify(&mut conn, &inbox_diesel::InboxSchema::DEFAULT);
        let text = verified.expect_err("verify refuses it").to_string();
        assert!(text.contains("row-level security"), "{text}");
        let error = inbox_error(apply(&mut conn, &1));
        assert_eq!(error.action(), Action::Alert, "{error:?}");
        inbox_diesel::schema::verify(&mut db.connect(), &inbox_diesel::InboxSchema::DEFAULT)
            .expect("the owner is not under it");
        role.admin(&format!("ALTER ROLE {} BYPASSRLS", role.0));
        assert!(
            apply(&mut db.connect_as(&role.0), &1)
                .unwrap()
                .is_processed()
        );
    }

    /// The setting each delivery's transaction commits with, read in its body.
    #[idempotent(consumer = "durable", key = *id)]
    fn commit_setting(conn: &mut Conn, id: &u64) -> Result<String, AppError> {
        Ok(setting(conn))
    }

    #[idempotent(consumer = "durable", key = *id)]
    async fn commit_setting_async(
        conn: &mut diesel_async::AsyncPgConnection,
        id: &u64,
    ) -> Result<String, AppError> {
        let read = diesel::sql_query(Setting::READ);
        Ok(diesel_async::RunQueryDsl::get_result::<Setting>(read, conn)
            .await?
            .value)
    }

    /// The session's `synchronous_commit`.
    #[derive(QueryableByName)]
    struct Setting {
        #[diesel(sql_type = diesel::sql_types::Text)]
        value: String,
    }

    impl Setting {
        const READ: &str = "SELECT current_setting('synchronous_commit') AS value";
    }

    fn setting(conn: &mut Conn) -> String {
        diesel::sql_query(Setting::READ)
            .get_result::<Setting>(conn)
            .unwrap()
            .value
    }

    /// `synchronous_commit = off` set on a session after its startup check — by another
    /// user of a pooled connection, or by another client's `SET` on a transaction-mode
    /// pooler's server session — is not seen by the check, which is remembered: each
    /// handler transaction commits with `on` (a marker acknowledged and then lost in a
    /// crash would lose its message), and the session's own setting comes back after it.
    /// Other values are kept. Before, 1 to 3 of 21 acknowledged messages were gone after
    /// the server's crash.
    #[test]
    fn a_commit_without_flush_set_after_the_check_is_flushed() {
        let db = Db::new("synchronous_commit_later");
        let mut conn = db.connect();
        assert_eq!(
            commit_setting(&mut conn, &1).unwrap().processed(),
            Some("on".into())
        );
        conn.batch_execute("SET synchronous_commit = off").unwrap();
        assert_eq!(
            commit_setting(&mut conn, &2).unwrap().processed(),
            Some("on".into())
        );
        assert_eq!(setting(&mut conn), "off");
        conn.batch_execute("SET synchronous_commit = remote_apply")
            .unwrap();
        assert_eq!(
            commit_setting(&mut conn, &3).unwrap().processed(),
            Some("remote_apply".into())
        );
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn async_a_commit_without_flush_set_after_the_check_is_flushed() {
        use diesel_async::{AsyncConnection, SimpleAsyncConnection};
        let db = Db::new("synchronous_commit_later_async");
        let mut conn = diesel_async::AsyncPgConnection::establish(db.url())
            .await
            .unwrap();
        let first = commit_setting_async(&mut conn, &1).await.unwrap();
        assert_eq!(first.processed(), Some("on".into()));
        conn.batch_execute("SET synchronous_commit = off")
            .await
            .unwrap();
        let later = commit_setting_async(&mut conn, &2).await.unwrap();
        assert_eq!(later.processed(), Some("on".into()));
    }

    /// A `now()` of the application's earlier on the search path (a test clock) does not
    /// move the purge's cutoff.
    #[test]
    fn the_purge_cutoff_is_the_servers_clock() {
        let db = Db::new("purge_clock");
        let mut conn = db.connect();
        assert!(apply(&mut conn, &1).unwrap().is_processed());
        conn.batch_execute(
            "CREATE FUNCTION public.now() RETURNS timestamptz LANGUAGE sql \
             AS $$ SELECT pg_catalog.now() + interval '30 days' $$; \
             SET search_path = public, pg_catalog",
        )
        .unwrap();
        let report = inbox_diesel::purge::purge(
            &mut conn,
            &inbox_diesel::InboxSchema::DEFAULT,
            &inbox_diesel::purge::Purge::older_than(std::time::Duration::from_secs(7 * 86_400)),
        )
        .unwrap();
        assert_eq!(report.removed, 0);
    }

    /// A role made for one test, dropped after it.
    struct Role<'d>(String, &'d Db);

    impl<'d> Role<'d> {
        fn new(db: &'d Db, grants: &str) -> Self {
            static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let n = NEXT.fetch_add(1, Ordering::SeqCst);
            let role = Role(format!("inbox_role_{}_{n}", std::process::id()), db);
            role.admin(&format!(
                "CREATE ROLE {0} LOGIN; GRANT USAGE ON SCHEMA public TO {0}",
                role.0
            ));
            role.grant(grants);
            role
        }

        fn admin(&self, sql: &str) {
            self.1
                .connect()
                .batch_execute(sql)
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
        }

        fn grant(&self, what: &str) {
            self.admin(&format!("GRANT {what} TO {}", self.0));
        }

        fn revoke(&self, what: &str) {
            self.admin(&format!("REVOKE {what} FROM {}", self.0));
        }
    }

    impl Drop for Role<'_> {
        fn drop(&mut self) {
            let mut admin = self.1.connect();
            let _ = admin.batch_execute(&format!(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{0}'; \
                 DROP OWNED BY {0}",
                self.0
            ));
            let _ = admin.batch_execute(&format!("DROP ROLE {}", self.0));
        }
    }
}

#[cfg(feature = "mysql")]
mod mysql {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;
    use diesel::prelude::*;
    use inbox_diesel::purge::{Purge, purge};
    use inbox_diesel::{ErrorClass, InFlightOutcome, InboxSchema, idempotent};
    use inbox_tests::claim::Gate;
    use inbox_tests::mysql::MysqlDb as Db;

    type Conn = diesel::MysqlConnection;

    include!("behaviour/operator_handlers.rs");

    /// `apply` that first waits at `gate`, then fails when `fail`.
    #[idempotent(consumer = "operator", key = *id)]
    fn apply_gated(conn: &mut Conn, id: &u64, gate: &Gate, fail: bool) -> Result<(), AppError> {
        diesel::sql_query("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
            .execute(conn)?;
        gate.pass();
        if fail {
            return Err(AppError::Rejected);
        }
        Ok(())
    }

    #[idempotent(consumer = "operator", key = *id, precheck = true)]
    fn apply_prechecked(conn: &mut Conn, id: &u64) -> Result<(), AppError> {
        diesel::sql_query("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
            .execute(conn)?;
        Ok(())
    }

    fn balance(conn: &mut Conn) -> i64 {
        inbox_tests::server::count(
            conn,
            "SELECT CAST(balance AS SIGNED) AS n FROM accounts WHERE id = 1",
        )
    }

    fn markers(conn: &mut Conn) -> i64 {
        inbox_tests::server::count(conn, "SELECT COUNT(*) AS n FROM inbox")
    }

    fn shape(alter: &str, expected: &[&str]) {
        let db = Db::new(&next_name("shape"));
        refused(|| db.connect(), apply, balance, alter, expected);
    }

    /// Two sessions whose pools set different time zones: the lease is UTC on both, so the
    /// second sees the first's claim live and answers `InFlight` instead of taking it over
    /// and running the side effect again (which it did while leases were local times).
    #[test]
    fn a_live_claim_is_live_in_every_time_zone() {
        let db = Db::new("tz_claim");
        let gate = Gate::default();
        let sent = AtomicUsize::new(0);
        std::thread::scope(|s| {
            let first = s.spawn(|| {
                let mut conn = db.connect();
                conn.batch_execute("SET time_zone = '-10:00'").unwrap();
                send(&mut conn, &1, &sent, &|| gate.pass())
            });
            gate.wait_inside();
            let mut conn = db.connect();
            conn.batch_execute("SET time_zone = '+09:00'").unwrap();
            let second: InFlightOutcome<()> = send(&mut conn, &1, &sent, &|| ()).unwrap();
            assert!(second.is_in_flight(), "{second:?}");
            gate.open();
            assert!(first.join().unwrap().unwrap().is_processed());
        });
        assert_eq!(sent.load(Ordering::SeqCst), 1);
    }

    /// A marker written by a session twelve hours behind UTC is not older than an hour to a
    /// purge running in UTC (it was, and a redelivery applied the message again).
    #[test]
    fn the_purge_cutoff_is_the_same_in_every_time_zone() {
        let db = Db::new("tz_purge");
        let mut conn = db.connect();
        conn.batch_execute("SET time_zone = '-12:00'").unwrap();
        assert!(apply(&mut conn, &1).unwrap().is_processed());
        let mut purger = db.connect();
        purger.batch_execute("SET time_zone = '+13:00'").unwrap();
        let report = purge(
            &mut purger,
            &InboxSchema::DEFAULT,
            &Purge::older_than(Duration::from_secs(3600)),
        )
        .unwrap();
        assert_eq!(report.removed, 0);
        assert!(apply(&mut conn, &1).unwrap().is_duplicate());
        assert_eq!(balance(&mut conn), 1);
    }

    #[test]
    fn storage_engines_prefixes_triggers_and_views_are_refused() {
        shape(
            "ALTER TABLE inbox ENGINE = MyISAM",
            &["`inbox` (`", "the MyISAM storage engine", "ENGINE = InnoDB"],
        );
        shape(
            "ALTER TABLE inbox ENGINE = Aria",
            &["the Aria storage engine"],
        );
        shape(
            "ALTER TABLE inbox DROP INDEX ux_inbox_message_consumer, \
             ADD UNIQUE KEY ux_inbox_message_consumer (message_id(8), consumer(10))",
            &["on a prefix of `message_id(8)`"],
        );
        shape(
            "CREATE TRIGGER rewrite BEFORE INSERT ON inbox FOR EACH ROW \
             SET NEW.consumer = 'shared'",
            &["trigger `rewrite`"],
        );
        shape(
            "RENAME TABLE inbox TO inbox_rows; CREATE VIEW inbox AS SELECT * FROM inbox_rows",
            &["a view"],
        );
    }

    /// Inserts a member: a business table with a unique index of its own.
    #[idempotent(consumer = "operator", key = *id)]
    fn join(conn: &mut Conn, id: &u64, email: &str) -> Result<(), AppError> {
        diesel::sql_query("INSERT INTO members (email) VALUES (?)")
            .bind::<diesel::sql_types::Text, _>(email)
            .execute(conn)?;
        Ok(())
    }

    /// MariaDB's duplicate-key error names the index, not its table: a business table with a
    /// unique index named like the inbox's would have its violation taken for the inbox's
    /// duplicate, and the message acknowledged without its change. Refused by the check;
    /// renamed, the violation is the business constraint it is.
    #[test]
    fn an_index_named_like_the_inboxs_on_another_table_is_refused() {
        let db = Db::new("index_name");
        db.connect()
            .batch_execute(
                "CREATE TABLE members (id INT AUTO_INCREMENT PRIMARY KEY, \
                 email VARCHAR(100) NOT NULL, UNIQUE KEY ux_inbox_message_consumer (email)); \
                 INSERT INTO members (email) VALUES ('taken@example.com')",
            )
            .unwrap();
        let mut conn = db.connect();
        let text = refusal(join(&mut conn, &1, "taken@example.com"));
        assert!(
            text.contains(&format!(
                "`{}.members` has a unique index named `ux_inbox_message_consumer` too",
                db.name()
            )),
            "{text}"
        );
        assert_eq!(markers(&mut conn), 0);
        conn.batch_execute(
            "ALTER TABLE members RENAME INDEX ux_inbox_message_consumer TO ux_members_email",
        )
        .unwrap();
        let mut conn = db.connect();
        let error = match join(&mut conn, &1, "taken@example.com") {
            Err(AppError::Db(error)) => error,
            other => panic!("expected the business violation, got {other:?}"),
        };
        let class = inbox_diesel::classify(&error, &InboxSchema::DEFAULT);
        assert!(
            matches!(class, ErrorClass::UniqueViolation { .. }),
            "{class:?}"
        );
        assert_eq!(class.action(), Action::DeadLetter);
        assert_eq!(markers(&mut conn), 0);
        assert!(
            join(&mut conn, &2, "new@example.com")
                .unwrap()
                .is_processed()
        );
    }

    #[test]
    fn columns_that_cannot_hold_what_the_runtime_writes_are_refused() {
        shape(
            "ALTER TABLE inbox MODIFY claimed_until TIMESTAMP(6) NULL",
            &["`claimed_until` is timestamp(6)", "UTC"],
        );
        shape(
            "ALTER TABLE inbox MODIFY consumer VARCHAR(20) \
             CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL",
            &["`consumer` is varchar(20)"],
        );
        shape(
            "ALTER TABLE inbox MODIFY consumer VARCHAR(200) \
             CHARACTER SET latin1 COLLATE latin1_bin NOT NULL",
            &["`consumer` is varchar(200) collate latin1_bin"],
        );
        shape(
            "ALTER TABLE inbox MODIFY consumer VARCHAR(200) \
             CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL",
            &["column `consumer` allows NULL"],
        );
        shape(
            "ALTER TABLE inbox ADD COLUMN key_text MEDIUMTEXT CHARACTER SET latin1",
            &["`key_text` is mediumtext collate latin1"],
        );
        shape(
            "ALTER TABLE inbox ADD COLUMN key_text TEXT",
            &["`key_text` is text"],
        );
    }

    /// `autocommit = 0`, as some pools set it: transaction mode commits its own
    /// transaction; claim mode and the purge, whose statements each commit on their own,
    /// refuse the session before writing anything (their writes would never commit, and the
    /// claim would vanish after the side effect ran).
    #[test]
    fn autocommit_off_is_refused_where_statements_commit_on_their_own() {
        let db = Db::new("autocommit");
        let mut conn = db.connect();
        conn.batch_execute("SET autocommit = 0").unwrap();
        assert!(apply(&mut conn, &1).unwrap().is_processed());
        assert_eq!(
            markers(&mut db.connect()),
            1,
            "committed, seen by another session"
        );

        let sent = AtomicUsize::new(0);
        let error = inbox_error(send(&mut conn, &2, &sent, &|| ()));
        assert!(
            matches!(
                &error,
                Error::Session(inbox_diesel::SessionProblem::AutocommitOff { .. })
            ),
            "{error:?}"
        );
        assert_eq!(error.action(), Action::Alert);
        assert_eq!(sent.load(Ordering::SeqCst), 0);
        assert_eq!(
            markers(&mut conn),
            1,
            "nothing written, not even uncommitted"
        );

        db.seed_archive(5);
        let purged = purge(
            &mut conn,
            &InboxSchema::DEFAULT,
            &Purge::older_than(Duration::from_secs(3600)),
        )
        .unwrap_err();
        assert!(
            matches!(Error::from(purged), Error::Session(_)),
            "the purge refuses the session"
        );
        assert_eq!(markers(&mut db.connect()), 9);

        conn.batch_execute("SET autocommit = 1").unwrap();
        assert!(send(&mut conn, &2, &sent, &|| ()).unwrap().is_processed());
        assert_eq!(sent.load(Ordering::SeqCst), 1);
    }

    /// `precheck = true` on a session at READ UNCOMMITTED: another delivery's marker, not
    /// committed, is not read as done (the message was acknowledged, then lost when the
    /// first delivery rolled back). The transaction decides: it waits, and processes.
    #[test]
    fn a_precheck_does_not_read_an_uncommitted_marker() {
        let db = Db::new("read_uncommitted");
        let gate = Gate::default();
        std::thread::scope(|s| {
            let first = s.spawn(|| apply_gated(&mut db.connect(), &1, &gate, true));
            gate.wait_inside();
            let second = s.spawn(|| {
                let mut conn = db.connect();
                conn.batch_execute("SET SESSION TRANSACTION ISOLATION LEVEL READ UNCOMMITTED")
                    .unwrap();
                apply_prechecked(&mut conn, &1)
            });
            // Until it waits for the first's marker — or, read as done, has returned.
            inbox_tests::wait_until("the second delivery waits for the marker's lock", || {
                second.is_finished()
                    || inbox_tests::server::count(
                        &mut db.connect(),
                        "SELECT COUNT(*) AS n FROM information_schema.innodb_trx \
                         WHERE trx_state = 'LOCK WAIT'",
                    ) == 1
            });
            gate.open();
            assert!(matches!(first.join().unwrap(), Err(AppError::Rejected)));
            assert!(second.join().unwrap().unwrap().is_processed());
        });
        assert_eq!(balance(&mut db.connect()), 1);
    }

    #[idempotent(consumer = "operator", key = *id, precheck = true, on_locked = "in_flight")]
    fn apply_prechecked_in_flight(conn: &mut Conn, id: &u64) -> Result<(), AppError> {
        diesel::sql_query("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
            .execute(conn)?;
        Ok(())
    }

    /// `precheck = true` on a session with `autocommit` off: the precheck's read, which
    /// locks the marker it finds, would begin a transaction that kept that lock after the
    /// duplicate was answered — a purge, or any writer of the marker, waiting on it until
    /// the application's next commit. It reads nothing there (the transaction decides), and
    /// the duplicate leaves no lock.
    #[test]
    fn a_precheck_without_autocommit_leaves_no_lock_behind() {
        let db = Db::new("precheck_autocommit");
        let mut conn = db.connect();
        conn.batch_execute("SET autocommit = 0").unwrap();
        assert!(apply_prechecked(&mut conn, &1).unwrap().is_processed());
        assert!(apply_prechecked(&mut conn, &1).unwrap().is_duplicate());
        let mut other = db.connect();
        other
            .batch_execute("SET SESSION innodb_lock_wait_timeout = 1")
            .unwrap();
        other.batch_execute("DELETE FROM inbox").unwrap();
        assert_eq!(markers(&mut other), 0);
        assert_eq!(balance(&mut other), 1);
        // The session's own setting, as it was.
        assert_eq!(
            inbox_tests::server::count(&mut conn, "SELECT @@autocommit AS n"),
            0
        );
    }

    /// `precheck = true` with `on_locked = "in_flight"`: another delivery holding the
    /// marker uncommitted is answered `InFlight` at once — the precheck's locking read
    /// does not wait for it (the server's lock wait, 50 s by default), it fails and the
    /// transaction decides.
    #[test]
    fn a_precheck_with_in_flight_does_not_wait_for_the_marker() {
        let db = Db::new("precheck_in_flight");
        let gate = Gate::default();
        std::thread::scope(|s| {
            let first = s.spawn(|| apply_gated(&mut db.connect(), &1, &gate, false));
            gate.wait_inside();
            let second = s.spawn(|| apply_prechecked_in_flight(&mut db.connect(), &1));
            inbox_tests::wait_until("the second delivery answers", || second.is_finished());
            let second = second.join().unwrap().unwrap();
            gate.open();
            assert!(
                matches!(second, InFlightOutcome::InFlight { .. }),
                "{second:?}"
            );
            assert!(first.join().unwrap().unwrap().is_processed());
        });
        assert_eq!(balance(&mut db.connect()), 1);
    }

    /// A session whose `completion_type` ends it after each `COMMIT` (`RELEASE`, set by a
    /// pool's init) or chains another transaction to it (`CHAIN`): the handler's commit and
    /// rollback say what they do whatever it says — before, the commit ended the session,
    /// and the handler reported a failure for work that had committed, the connection gone.
    /// The session's setting is left as it was.
    #[test]
    fn completion_type_does_not_end_the_session_or_chain() {
        for completion in ["RELEASE", "CHAIN"] {
            let db = Db::new(&next_name("completion"));
            let mut conn = db.connect();
            conn.batch_execute(&format!("SET SESSION completion_type = '{completion}'"))
                .unwrap();
            assert!(apply(&mut conn, &1).unwrap().is_processed(), "{completion}");
            assert!(apply(&mut conn, &1).unwrap().is_duplicate(), "{completion}");
            assert!(apply(&mut conn, &2).unwrap().is_processed(), "{completion}");
            assert_eq!(balance(&mut db.connect()), 2, "{completion}");
            assert_eq!(markers(&mut db.connect()), 2, "{completion}");
            assert_eq!(
                inbox_tests::server::count(
                    &mut conn,
                    &format!("SELECT CAST(@@completion_type = '{completion}' AS SIGNED) AS n")
                ),
                1,
                "{completion}"
            );
        }
    }

    /// `USE other` after the check: the marker's insert names the table unqualified, and the
    /// session's mark names the database the check ran in, so the server refuses the insert
    /// into the other database's table — never checked, and here without a unique index —
    /// and the runtime checks that table on the session, and refuses it. No marker lands
    /// there; back in the checked database, the session goes on.
    #[test]
    fn another_database_on_a_checked_session_does_not_take_markers() {
        let (checked, other) = (Db::new("use_checked"), Db::new("use_other"));
        other
            .connect()
            .batch_execute("ALTER TABLE inbox DROP INDEX ux_inbox_message_consumer")
            .unwrap();
        let mut conn = checked.connect();
        assert!(apply(&mut conn, &1).unwrap().is_processed());
        conn.batch_execute(&format!("USE {}", other.name()))
            .unwrap();
        for id in [1, 2] {
            let text = refusal(apply(&mut conn, &id));
            assert!(text.contains("is missing"), "{text}");
        }
        assert_eq!(markers(&mut other.connect()), 0);
        conn.batch_execute(&format!("USE {}", checked.name()))
            .unwrap();
        assert!(apply(&mut conn, &1).unwrap().is_duplicate());
        assert!(apply(&mut conn, &2).unwrap().is_processed());
        assert!(apply(&mut conn, &2).unwrap().is_duplicate());
        assert_eq!(markers(&mut checked.connect()), 2);
        assert_eq!(markers(&mut other.connect()), 0);
        // A session whose database is the other one checks that table, and refuses it.
        let text = refusal(apply(&mut other.connect(), &3));
        assert!(text.contains("is missing"), "{text}");
    }

    /// `SET SESSION TRANSACTION READ ONLY` (and a server started `--read-only`, its
    /// neighbour): `Reconnect`, never dead-lettered.
    #[test]
    fn a_read_only_session_is_reconnected_not_dead_lettered() {
        let db = Db::new("read_only");
        let mut conn = db.connect();
        conn.batch_execute("SET SESSION TRANSACTION READ ONLY")
            .unwrap();
        let error = inbox_error(apply(&mut conn, &1));
        assert_eq!(error.class(), ErrorClass::ReadOnly, "{error:?}");
        assert_eq!(error.action(), Action::Reconnect);
        let sent = AtomicUsize::new(0);
        let error = inbox_error(send(&mut conn, &2, &sent, &|| ()));
        assert_eq!(error.action(), Action::Reconnect, "{error:?}");
        assert_eq!(sent.load(Ordering::SeqCst), 0);
        assert_eq!(markers(&mut db.connect()), 0);
    }

    /// A server made read-only (`read_only = 1`, as a demoted primary is during a
    /// failover): a checked session's next delivery is refused with 1290, answered
    /// `ReadOnly`/`Reconnect` (the pool's next connection may reach the new primary), never
    /// dead-lettered; nothing is written, and the delivery is applied once the server takes
    /// writes again. On a private server: the shared one is never made read-only.
    #[test]
    fn a_read_only_server_is_reconnected_not_dead_lettered() {
        use inbox_tests::server::Server as _;
        let server = inbox_tests::private::PrivateMariadb::start(&[]);
        let mut admin = server.admin();
        for statement in inbox_tests::mysql::Mysql::schema() {
            admin.batch_execute(&statement).unwrap();
        }
        admin.batch_execute("CREATE USER app@'127.0.0.1'").unwrap();
        admin
            .batch_execute("GRANT SELECT, INSERT, UPDATE, DELETE ON test.* TO app@'127.0.0.1'")
            .unwrap();
        let mut conn = Conn::establish(&server.url("app")).unwrap();
        assert!(apply(&mut conn, &1).unwrap().is_processed());
        admin.batch_execute("SET GLOBAL read_only = 1").unwrap();
        let error = inbox_error(apply(&mut conn, &2));
        assert!(
            inbox_tests::error_chain(&error).contains("read-only"),
            "{error:?}"
        );
        assert_eq!(error.class(), ErrorClass::ReadOnly, "{error:?}");
        assert_eq!(error.action(), Action::Reconnect);
        assert_eq!(balance(&mut admin), 1);
        assert_eq!(markers(&mut admin), 1);
        admin.batch_execute("SET GLOBAL read_only = 0").unwrap();
        let mut conn = Conn::establish(&server.url("app")).unwrap();
        assert!(apply(&mut conn, &2).unwrap().is_processed());
        assert!(apply(&mut conn, &1).unwrap().is_duplicate());
        assert_eq!(balance(&mut admin), 2);
    }

    /// A server that does not write its log at each commit
    /// (`innodb_flush_log_at_trx_commit = 0`): a crash of it loses commits it acknowledged —
    /// a trial lost 25 to 72 of 300 claims and stamps to one `kill -9`, and ran their side
    /// effects again. Refused by the check before any delivery, naming the setting; with it
    /// at 1 the same server processes. On a private server.
    #[test]
    fn a_server_that_does_not_flush_its_log_at_commit_is_refused() {
        use inbox_tests::server::Server as _;
        let server =
            inbox_tests::private::PrivateMariadb::start(&["--innodb-flush-log-at-trx-commit=0"]);
        let mut admin = server.admin();
        for statement in inbox_tests::mysql::Mysql::schema() {
            admin.batch_execute(&statement).unwrap();
        }
        let mut conn = Conn::establish(&server.url("root")).unwrap();
        let text = refusal(apply(&mut conn, &1));
        assert!(
            text.contains("innodb_flush_log_at_trx_commit = 0"),
            "{text}"
        );
        assert_eq!(markers(&mut admin), 0);
        admin
            .batch_execute("SET GLOBAL innodb_flush_log_at_trx_commit = 1")
            .unwrap();
        let mut conn = Conn::establish(&server.url("root")).unwrap();
        assert!(apply(&mut conn, &1).unwrap().is_processed());
        assert_eq!(balance(&mut admin), 1);
    }

    /// Privileges, asked of the server by the check (`EXPLAIN` of the handler's statements):
    /// a user that may read the inbox but not insert is refused before any delivery; one
    /// that may insert but not update, in claim mode (the stamp would fail after the side
    /// effect); a privilege revoked under a checked session is a permission fault (`Alert`).
    #[test]
    fn privileges_are_checked_and_their_loss_is_a_permission_fault() {
        let db = Db::new("privilege");
        let user = format!("inbox_app_{}", std::process::id());
        let admin = |sql: String| db.connect().batch_execute(&sql).unwrap();
        admin(format!(
            "CREATE USER IF NOT EXISTS '{user}'@'%'; GRANT SELECT ON {}.* TO '{user}'@'%'",
            db.name()
        ));
        let refused = refusal(apply(&mut db.connect_as(&user), &1));
        admin(format!(
            "GRANT INSERT ON {0}.inbox TO '{user}'@'%'; GRANT UPDATE ON {0}.accounts TO '{user}'@'%'",
            db.name()
        ));
        let mut conn = db.connect_as(&user);
        let processed = apply(&mut conn, &1);
        let sent = AtomicUsize::new(0);
        let claim_refused = refusal(send(&mut conn, &2, &sent, &|| ()));
        admin(format!(
            "REVOKE INSERT ON {}.inbox FROM '{user}'@'%'",
            db.name()
        ));
        let lost = inbox_error(apply(&mut conn, &3));
        admin(format!("DROP USER '{user}'@'%'"));

        assert!(refused.contains("no privilege INSERT"), "{refused}");
        assert!(processed.unwrap().is_processed());
        assert!(
            claim_refused.contains("no privilege UPDATE"),
            "{claim_refused}"
        );
        assert_eq!(sent.load(Ordering::SeqCst), 0);
        assert_eq!(lost.class(), ErrorClass::PermissionDenied, "{lost:?}");
        assert_eq!(lost.action(), Action::Alert);
        assert_eq!(markers(&mut db.connect()), 1);
    }

    /// A user that may insert and update markers but not read them is refused for want of
    /// SELECT — named as such: before, the check asked with one `INSERT … SELECT`, and the
    /// refusal named INSERT, which the user had.
    #[test]
    fn a_missing_select_is_named_select() {
        let db = Db::new("no_select");
        let user = format!("inbox_no_select_{}", std::process::id());
        let admin = |sql: String| db.connect().batch_execute(&sql).unwrap();
        admin(format!(
            "CREATE USER IF NOT EXISTS '{user}'@'%'; \
             GRANT INSERT, UPDATE ON {0}.inbox TO '{user}'@'%'; \
             GRANT SELECT, UPDATE ON {0}.accounts TO '{user}'@'%'",
            db.name()
        ));
        let refused = refusal(apply(&mut db.connect_as(&user), &1));
        let sent = AtomicUsize::new(0);
        let claim_refused = refusal(send(&mut db.connect_as(&user), &2, &sent, &|| ()));
        admin(format!("DROP USER '{user}'@'%'"));
        for refused in [refused, claim_refused] {
            assert!(refused.contains("no privilege SELECT"), "{refused}");
            assert!(
                !refused.contains("INSERT,") && !refused.contains("privilege INSERT"),
                "{refused}"
            );
        }
        assert_eq!(sent.load(Ordering::SeqCst), 0);
        assert_eq!(markers(&mut db.connect()), 0);
    }

    /// A primary key on (message_id, consumer), another unique index on message_id: MariaDB
    /// reports whichever index a duplicate meets first, and a redelivery would read as a
    /// business violation. Refused.
    #[test]
    fn other_unique_indexes_are_refused() {
        shape(
            "ALTER TABLE inbox MODIFY id BIGINT NOT NULL, DROP PRIMARY KEY, \
             ADD PRIMARY KEY (message_id, consumer), ADD UNIQUE KEY ux_id (id)",
            &["the unique index `PRIMARY (message_id, consumer)`"],
        );
        shape(
            "ALTER TABLE inbox ADD UNIQUE KEY ux_inbox_message_only (message_id)",
            &["the unique index `ux_inbox_message_only (message_id)`"],
        );
    }

    /// A column added without a default refuses every marker: a schema fault (`Alert`),
    /// not the message's dead letter.
    #[test]
    fn a_marker_the_table_refuses_is_a_schema_fault_not_a_dead_letter() {
        let db = Db::new("refuses");
        db.connect()
            .batch_execute("ALTER TABLE inbox ADD COLUMN tenant VARCHAR(20) NOT NULL")
            .unwrap();
        let mut conn = db.connect();
        let error = inbox_error(apply(&mut conn, &1));
        assert_eq!(error.class(), ErrorClass::Schema, "{error:?}");
        assert_eq!(error.action(), Action::Alert);
        let sent = AtomicUsize::new(0);
        let error = inbox_error(send(&mut conn, &2, &sent, &|| ()));
        assert_eq!(error.action(), Action::Alert, "{error:?}");
        assert_eq!(sent.load(Ordering::SeqCst), 0);
    }

    /// `SET timestamp = …` moves the session's clock, and with it leases and
    /// `processed_at`: a handler's session (at its check) and the purge's are refused before
    /// they write. (Set after a session's check it is not seen: the marker's insert does not
    /// read the clock, which would stop a lagging statement-based replica.)
    #[test]
    fn a_session_clock_that_is_set_is_refused() {
        let db = Db::new("session_clock");
        let mut conn = db.connect();
        conn.batch_execute("SET timestamp = UNIX_TIMESTAMP() - 30 * 86400")
            .unwrap();
        let text = refusal(apply(&mut conn, &1));
        assert!(text.contains("SET timestamp"), "{text}");
        let purged = purge(
            &mut conn,
            &InboxSchema::DEFAULT,
            &Purge::older_than(Duration::from_secs(3600)),
        )
        .unwrap_err();
        assert!(matches!(
            Error::from(purged),
            Error::Session(inbox_diesel::SessionProblem::ClockSet)
        ));
        assert_eq!(markers(&mut db.connect()), 0);
    }

    /// MariaDB's snapshot isolation (`innodb_snapshot_isolation`, the default from 11.6):
    /// a row the body read changed under it (1020). Retried in a fresh transaction, as a
    /// serialization failure is, and processed — not dead-lettered.
    #[test]
    fn a_snapshot_conflict_is_retried() {
        let db = Db::new("snapshot");
        let gate = Gate::default();
        let runs = AtomicUsize::new(0);
        std::thread::scope(|s| {
            let first = s.spawn(|| {
                let mut conn = db.connect();
                conn.batch_execute("SET SESSION innodb_snapshot_isolation = ON")
                    .unwrap();
                conn.batch_execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                    .unwrap();
                read_then_write(&mut conn, &1, &gate, &runs)
            });
            gate.wait_inside();
            db.connect()
                .batch_execute("UPDATE accounts SET balance = balance + 100 WHERE id = 1")
                .unwrap();
            gate.open();
            assert!(first.join().unwrap().unwrap().is_processed());
        });
        assert_eq!(runs.load(Ordering::SeqCst), 2, "retried once");
        assert_eq!(balance(&mut db.connect()), 101);
    }

    /// Reads the balance, waits at `gate` the first time, then writes it.
    #[idempotent(consumer = "operator", key = *id)]
    fn read_then_write(
        conn: &mut Conn,
        id: &u64,
        gate: &Gate,
        runs: &AtomicUsize,
    ) -> Result<(), AppError> {
        let read = balance(conn);
        if runs.fetch_add(1, Ordering::SeqCst) == 0 {
            gate.pass();
        }
        diesel::sql_query(format!(
            "UPDATE accounts SET balance = {} WHERE id = 1",
            read + 1
        ))
        .execute(conn)?;
        Ok(())
    }

    /// `sql_mode`s frameworks set, `EMPTY_STRING_IS_NULL` among them: the check reads the
    /// catalog (it dead-lettered every delivery) and the purge runs.
    #[test]
    fn sql_modes_do_not_change_what_the_runtime_reads() {
        let db = Db::new("sql_mode");
        let mut conn = db.connect();
        conn.batch_execute(
            "SET SESSION sql_mode = 'EMPTY_STRING_IS_NULL,PIPES_AS_CONCAT,ANSI_QUOTES,\
             NO_BACKSLASH_ESCAPES,STRICT_ALL_TABLES'",
        )
        .unwrap();
        assert!(apply(&mut conn, &1).unwrap().is_processed());
        assert!(apply(&mut conn, &1).unwrap().is_duplicate());
        let sent = AtomicUsize::new(0);
        assert!(send(&mut conn, &2, &sent, &|| ()).unwrap().is_processed());
        purge(
            &mut conn,
            &InboxSchema::DEFAULT,
            &Purge::older_than(Duration::from_secs(3600)),
        )
        .unwrap();
        assert_eq!(balance(&mut conn), 1);
    }
}
