//! The backend suite on MySQL/MariaDB: what every backend must pass, what servers with row
//! locks show (the lock wait on a uniquely keyed insert, a deadlock retried), and the
//! server's own messages. Needs `INBOX_TEST_MYSQL`.

inbox_tests::suite!(inbox_tests::mysql::MysqlDb, diesel::MysqlConnection);
inbox_tests::batch_suite!(inbox_tests::mysql::MysqlDb);
inbox_tests::unique_suite!(
    inbox_tests::mysql::MysqlDb,
    diesel::MysqlConnection,
    inbox_tests::unique::MYSQL_TABLES,
    "SELECT 1",
    pk = "PRIMARY",
    handle = "ux_signups_handle"
);
inbox_tests::server_suite!(inbox_tests::mysql::MysqlDb);
inbox_tests::claim_suite!(inbox_tests::mysql::MysqlDb, diesel::MysqlConnection, mysql);

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
