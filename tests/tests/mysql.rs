//! The backend suite on MySQL/MariaDB: what every backend must pass, what servers with row
//! locks show (the lock wait on a uniquely keyed insert, a deadlock retried), and the
//! server's own messages. Needs `INBOX_TEST_MYSQL`.

type Db = inbox_tests::mysql::MysqlDb;
type DbConnection = diesel::MysqlConnection;

include!("behaviour/transaction.rs");
/// The batch form.
mod batch_form {
    type Db = inbox_tests::mysql::MysqlDb;

    include!("behaviour/batch.rs");
}
/// Get-or-create.
mod get_or_create {
    type Db = inbox_tests::mysql::MysqlDb;
    type Conn = diesel::MysqlConnection;
    const TABLES: &str = inbox_tests::unique::MYSQL_TABLES;
    const SETUP: &str = "SELECT 1";
    const PK: &str = "PRIMARY";
    const HANDLE: &str = "ux_signups_handle";

    include!("behaviour/unique.rs");
}
include!("behaviour/server.rs");
/// `transaction = "caller"`: a job runner's transaction joined.
mod joined {
    type Db = inbox_tests::mysql::MysqlDb;
    type DbConnection = diesel::MysqlConnection;
    /// The next job, skipping those another worker holds (where the backend can).
    const TAKE_JOB: &str =
        "SELECT id, message FROM jobs ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED";

    include!("behaviour/joined.rs");
}
/// `inbox_diesel::testing`, as a user's suite uses it.
mod testing_kit {
    type Db = inbox_tests::mysql::MysqlDb;
    type DbConnection = diesel::MysqlConnection;
    /// Locks account 1 until the transaction ends.
    const LOCK_ROW: &str = "SELECT balance FROM accounts WHERE id = 1 FOR UPDATE";

    include!("behaviour/testing.rs");
}
/// An application's enum of connections (diesel's `MultiConnection`) as the handler's.
mod multi_connection {
    type Db = inbox_tests::mysql::MysqlDb;
    const TABLES: &str = inbox_tests::unique::MYSQL_TABLES;
    const SETUP: &str = "SELECT 1";

    include!("behaviour/multi.rs");
}
/// Composite keys: a tuple of parameters, a `format!` with inline arguments.
mod composite {
    type Db = inbox_tests::mysql::MysqlDb;
    type DbConnection = diesel::MysqlConnection;

    include!("behaviour/composite.rs");
}
/// Stored results: a duplicate answers with the value its first delivery stored.
mod stored {
    type Db = inbox_tests::mysql::MysqlDb;
    type DbConnection = diesel::MysqlConnection;
    const BACKEND: inbox_diesel::schema::Backend = inbox_diesel::schema::Backend::Mysql;

    include!("behaviour/stored.rs");

    #[test]
    fn a_snapshot_older_than_the_markers_commit_reads_the_stored_result() {
        a_snapshot_older_than_the_markers_commit_reads_the_result();
    }
}
/// Claim mode, sync.
mod claim_mode {
    use inbox_diesel::schema::mysql::inbox;

    type Db = inbox_tests::mysql::MysqlDb;
    type DbConnection = diesel::MysqlConnection;
    /// Makes inserts into the inbox wait until the transaction ends (no index serves `consumer` alone: the scan locks every gap, the one past the last row too).
    const HOLD_INBOX_INSERTS: &str =
        "SELECT message_id FROM inbox WHERE consumer = 'email' FOR UPDATE";

    include!("behaviour/claim.rs");
}

use diesel::connection::SimpleConnection;
use inbox_diesel::{InboxSchema, TransientKind, classify};
use inbox_tests::mysql::MysqlDb;

/// `classify` against errors raised by this server: its 1062 messages name the key without
/// the table (MariaDB) and carry the 16 raw bytes of the message id.
#[test]
fn classify_real_server_errors() {
    let db = MysqlDb::new("classify_real_errors");
    let mut conn = db.connect();
    let schema = InboxSchema::DEFAULT;
    // A message id with a quote and the text of a key clause in its bytes.
    let marker =
        "INSERT INTO inbox (message_id, consumer) VALUES (x'27666f72206b65792027787827', 'credit')";
    conn.batch_execute(marker).unwrap();
    let duplicate = conn.batch_execute(marker).unwrap_err();
    assert_eq!(
        classify(&duplicate, &schema),
        ErrorClass::InboxDuplicate,
        "{duplicate}"
    );

    conn.batch_execute("INSERT INTO users (email) VALUES ('a@example.com')")
        .unwrap();
    let business = conn
        .batch_execute("INSERT INTO users (email) VALUES ('a@example.com')")
        .unwrap_err();
    assert_eq!(
        classify(&business, &schema),
        ErrorClass::UniqueViolation {
            constraint: Some("ux_users_email".into())
        },
        "{business}"
    );
    let primary = conn
        .batch_execute("INSERT INTO accounts (id, balance) VALUES (1, 0)")
        .unwrap_err();
    assert_eq!(
        classify(&primary, &schema),
        ErrorClass::UniqueViolation {
            constraint: Some("PRIMARY".into())
        },
        "{primary}"
    );

    // A lock wait that times out (1205).
    let mut holder = db.connect();
    holder.batch_execute("START TRANSACTION").unwrap();
    holder
        .batch_execute("UPDATE accounts SET balance = 1 WHERE id = 2")
        .unwrap();
    conn.batch_execute("SET SESSION innodb_lock_wait_timeout = 1")
        .unwrap();
    let timeout = conn
        .batch_execute("UPDATE accounts SET balance = 2 WHERE id = 2")
        .unwrap_err();
    holder.batch_execute("ROLLBACK").unwrap();
    assert_eq!(
        classify(&timeout, &schema),
        ErrorClass::Transient(TransientKind::LockWaitTimeout),
        "{timeout}"
    );
}

/// MySQL has no `RETURNING`: the multi-row upsert is refused before any SQL, with the way out.
#[test]
fn upsert_all_is_refused_on_mysql() {
    use diesel::connection::SimpleConnection;
    use inbox_diesel::unique::{self, UniqueError};
    use inbox_tests::unique::{MYSQL_TABLES, SIGNUPS_EMAIL, signups};

    let db = MysqlDb::new("unique_upsert_all");
    let mut conn = db.connect();
    conn.batch_execute(MYSQL_TABLES).unwrap();
    let rows = vec![(
        signups::email.eq("ada@example.com"),
        signups::handle.eq("ada"),
    )];
    let refused = unique::upsert_all(
        &mut conn,
        &SIGNUPS_EMAIL,
        &rows,
        |rows| diesel::insert_into(signups::table).values(rows),
        signups::id,
    );
    assert!(
        matches!(&refused, Err(UniqueError::Unsupported { what }) if what.contains("per row")),
        "{refused:?}"
    );
    let stored: i64 = signups::table.count().get_result(&mut conn).unwrap();
    assert_eq!(stored, 0);
}

/// MySQL's key lock belongs to the session: inside a transaction it would be released before
/// the commit, so it is refused there.
#[test]
fn the_key_lock_is_refused_inside_a_transaction() {
    use inbox_diesel::unique::{self, UniqueError};

    let db = MysqlDb::new("unique_lock_nested");
    let mut conn = db.connect();
    let result =
        conn.transaction(|c| unique::serialize_on(c, "tenant:acme", |_| Ok::<_, UniqueError>(())));
    assert!(
        matches!(
            &result,
            Err(UniqueError::Database(
                diesel::result::Error::AlreadyInTransaction
            ))
        ),
        "{result:?}"
    );
    let outside = unique::serialize_on(&mut conn, "tenant:acme", |_| Ok::<_, UniqueError>(7));
    assert_eq!(outside.unwrap(), 7);
}

/// A delivery handler for the drift tests: one credit row per run of the body.
#[inbox_diesel::idempotent(consumer = "credit", key = msg.id)]
fn credit_once(
    conn: &mut diesel::MysqlConnection,
    msg: &inbox_tests::Credit,
) -> diesel::QueryResult<()> {
    use diesel::{ExpressionMethods, RunQueryDsl};
    use inbox_tests::credits;
    diesel::insert_into(credits::table)
        .values((
            credits::message.eq(msg.id.to_string()),
            credits::account.eq(msg.account),
            credits::amount.eq(msg.amount),
        ))
        .execute(conn)?;
    Ok(())
}

/// The inbox table drifted: its unique index dropped, recreated non-unique under the same
/// name, or recreated unique under another name. A plain `INSERT` of the marker succeeds twice
/// on MariaDB without the unique index, so two deliveries one after the other would both run
/// the body; the runtime refuses to process instead, naming what is wrong, and no credit is
/// written.
#[test]
fn a_drifted_inbox_table_is_refused_not_doubled() {
    use inbox_diesel::schema::SchemaProblem;
    let drifts: [(&str, &str); 3] = [
        (
            "dropped",
            "ALTER TABLE inbox DROP INDEX ux_inbox_message_consumer",
        ),
        (
            "not_unique",
            "ALTER TABLE inbox DROP INDEX ux_inbox_message_consumer, \
             ADD INDEX ux_inbox_message_consumer (message_id, consumer)",
        ),
        (
            "renamed",
            "ALTER TABLE inbox RENAME INDEX ux_inbox_message_consumer TO ux_inbox_key",
        ),
    ];
    for (drift, sql) in drifts {
        let db = MysqlDb::new(&format!("drift_{drift}"));
        let mut conn = db.connect();
        conn.batch_execute(sql).unwrap();
        let msg = inbox_tests::Credit::new(1);
        for delivery in 1..=2 {
            let refused = credit_once(&mut conn, &msg).unwrap_err();
            // A `QueryResult` handler carries the inbox's own errors inside diesel's.
            let diesel::result::Error::QueryBuilderError(inbox) = refused else {
                panic!("{drift}, delivery {delivery}: {refused:?}")
            };
            let problem = match inbox.downcast::<inbox_diesel::Error>().map(|e| *e) {
                Ok(inbox_diesel::Error::Schema(inbox_diesel::schema::SchemaError::Mismatch {
                    problems,
                    ..
                })) => problems,
                other => panic!("{drift}, delivery {delivery}: {other:?}"),
            };
            assert!(
                matches!(
                    problem.as_slice(),
                    [SchemaProblem::MissingUniqueIndex { .. }
                        | SchemaProblem::IndexNotUnique { .. }]
                ),
                "{drift}: {problem:?}"
            );
        }
        let credits = inbox_tests::server::count(&mut conn, "SELECT COUNT(*) AS n FROM credits");
        assert_eq!(credits, 0, "{drift}: no delivery ran the body");
    }
}

/// MariaDB compares index names without regard to case: an inbox index created as
/// `UX_INBOX_MESSAGE_CONSUMER` passes the schema check, and so a redelivery must be
/// recognised as the duplicate it is — not fail for ever as a business violation.
#[test]
fn an_upper_case_inbox_index_recognises_duplicates() {
    let db = MysqlDb::new("upper_case_index");
    let mut conn = db.connect();
    conn.batch_execute(
        "ALTER TABLE inbox RENAME INDEX ux_inbox_message_consumer TO UX_INBOX_MESSAGE_CONSUMER",
    )
    .unwrap();
    let msg = inbox_tests::Credit::new(1);
    assert!(credit_once(&mut conn, &msg).unwrap().is_processed());
    assert!(credit_once(&mut conn, &msg).unwrap().is_duplicate());
    let credits = inbox_tests::server::count(&mut conn, "SELECT COUNT(*) AS n FROM credits");
    assert_eq!(credits, 1);
}

/// A consumer column in a case-insensitive collation would let `Credit` share the markers of
/// `credit`: the schema check refuses it, naming the collation it relies on.
#[test]
fn a_case_insensitive_consumer_column_is_refused() {
    let db = MysqlDb::new("consumer_collation");
    let mut conn = db.connect();
    conn.batch_execute(
        "ALTER TABLE inbox MODIFY consumer VARCHAR(200) CHARACTER SET utf8mb4 \
         COLLATE utf8mb4_general_ci NOT NULL",
    )
    .unwrap();
    let error = inbox_diesel::schema::verify(&mut conn, &InboxSchema::DEFAULT).unwrap_err();
    assert!(error.to_string().contains("utf8mb4_general_ci"), "{error}");
    assert!(credit_once(&mut conn, &inbox_tests::Credit::new(1)).is_err());
}

/// `autocommit` off on the session — a pool's connection setup, or the server's
/// `autocommit = 0` (an operator's trial): claim mode commits its claim and its stamp each
/// on its own, so the startup check told of claim handlers refuses it, naming autocommit and
/// the fix, where before the first delivery found it (an alert that halts a pump);
/// transaction mode, whose statements commit together, is not refused.
#[test]
fn autocommit_off_is_refused_at_startup_for_claim_mode() {
    use inbox_diesel::schema::{self, Needs};
    let db = MysqlDb::new("autocommit_claim");
    let mut conn = db.connect();
    conn.batch_execute("SET SESSION autocommit = 0").unwrap();
    schema::verify(&mut conn, &InboxSchema::DEFAULT).unwrap();
    let refusal = schema::verify_for(&mut conn, &InboxSchema::DEFAULT, Needs::default().claim())
        .unwrap_err()
        .to_string();
    assert!(refusal.contains("autocommit is off"), "{refusal}");
    conn.batch_execute("SET SESSION autocommit = 1").unwrap();
    schema::verify_for(&mut conn, &InboxSchema::DEFAULT, Needs::default().claim()).unwrap();
}
