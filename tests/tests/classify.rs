//! `classify` against real SQLite errors and recorded MySQL 8 / MariaDB messages.

use diesel::connection::SimpleConnection;
use diesel::result::{DatabaseErrorKind, Error};
use diesel::{Connection, RunQueryDsl, SqliteConnection};
use inbox_diesel::{ErrorClass, InboxSchema, TransientKind, classify};
use inbox_tests::sqlite::SqliteDb;

fn sqlite_error(conn: &mut SqliteConnection, sql: &str) -> Error {
    diesel::sql_query(sql).execute(conn).expect_err(sql)
}

#[test]
fn sqlite_inbox_duplicate_and_business_violations() {
    let db = SqliteDb::new("classify");
    let mut conn = db.connect();
    let marker = "INSERT INTO inbox (message_id, consumer) VALUES (x'00112233445566778899aabbccddeeff', 'credit')";
    conn.batch_execute(marker).unwrap();
    let schema = InboxSchema::DEFAULT;

    assert_eq!(
        classify(&sqlite_error(&mut conn, marker), &schema),
        ErrorClass::InboxDuplicate
    );

    conn.batch_execute("INSERT INTO users (id, email) VALUES (1, 'a@example.com')")
        .unwrap();
    assert_eq!(
        classify(
            &sqlite_error(
                &mut conn,
                "INSERT INTO users (id, email) VALUES (2, 'a@example.com')"
            ),
            &schema
        ),
        ErrorClass::UniqueViolation {
            constraint: Some("users.email".into())
        }
    );
    // A primary key is a unique violation too, and not the inbox's.
    assert_eq!(
        classify(
            &sqlite_error(
                &mut conn,
                "INSERT INTO users (id, email) VALUES (1, 'b@example.com')"
            ),
            &schema
        ),
        ErrorClass::UniqueViolation {
            constraint: Some("users.id".into())
        }
    );
    let inbox_pk =
        "INSERT INTO inbox (id, message_id, consumer) SELECT id, x'ff', 'other' FROM inbox";
    assert_eq!(
        classify(&sqlite_error(&mut conn, inbox_pk), &schema),
        ErrorClass::UniqueViolation {
            constraint: Some("inbox.id".into())
        }
    );
    // Another table with the inbox's columns is not the inbox.
    conn.batch_execute(
        "CREATE TABLE archive (message_id BLOB, consumer TEXT);
         CREATE UNIQUE INDEX ux_archive ON archive (message_id, consumer);
         INSERT INTO archive VALUES (x'01', 'credit');",
    )
    .unwrap();
    assert!(matches!(
        classify(
            &sqlite_error(&mut conn, "INSERT INTO archive VALUES (x'01', 'credit')"),
            &schema
        ),
        ErrorClass::UniqueViolation { .. }
    ));
}

#[test]
fn sqlite_busy_is_transient() {
    let db = SqliteDb::new("busy");
    let mut holder = db.connect();
    holder.batch_execute("BEGIN IMMEDIATE").unwrap();
    let mut other = db.connect();
    other.batch_execute("PRAGMA busy_timeout = 0").unwrap();
    let busy = other.batch_execute("BEGIN IMMEDIATE").unwrap_err();
    assert_eq!(
        classify(&busy, &InboxSchema::DEFAULT),
        ErrorClass::Transient(TransientKind::Busy),
        "{busy:?}"
    );
    holder.batch_execute("ROLLBACK").unwrap();
}

#[test]
fn sqlite_custom_table_names() {
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    let schema = InboxSchema::new("events_inbox", "ux_events").unwrap();
    conn.batch_execute(&inbox_diesel::schema::sqlite::create_table_sql(&schema))
        .unwrap();
    let marker = "INSERT INTO events_inbox (message_id, consumer) VALUES (x'01', 'c')";
    conn.batch_execute(marker).unwrap();
    let error = sqlite_error(&mut conn, marker);
    assert_eq!(classify(&error, &schema), ErrorClass::InboxDuplicate);
    assert!(matches!(
        classify(&error, &InboxSchema::DEFAULT),
        ErrorClass::UniqueViolation { .. }
    ));
}

fn recorded(message: &str) -> Error {
    Error::DatabaseError(
        DatabaseErrorKind::UniqueViolation,
        Box::new(message.to_owned()),
    )
}

/// Messages as MySQL 8.0.19+ writes them (error 1062, key qualified with the table).
#[test]
fn recorded_mysql8_messages() {
    let schema = InboxSchema::DEFAULT;
    assert_eq!(
        classify(
            &recorded(
                "Duplicate entry '\u{1}\u{2}\u{3}-credit' for key 'inbox.ux_inbox_message_consumer'"
            ),
            &schema
        ),
        ErrorClass::InboxDuplicate
    );
    assert_eq!(
        classify(
            &recorded("Duplicate entry 'a@example.com' for key 'users.ux_users_email'"),
            &schema
        ),
        ErrorClass::UniqueViolation {
            constraint: Some("users.ux_users_email".into())
        }
    );
    assert_eq!(
        classify(
            &recorded("Duplicate entry '17' for key 'inbox.PRIMARY'"),
            &schema
        ),
        ErrorClass::UniqueViolation {
            constraint: Some("PRIMARY".into())
        }
    );
}

/// Messages as MariaDB (and MySQL before 8.0.19) writes them: the key unqualified, the
/// value cut at 64 characters and not escaped.
#[test]
fn recorded_mariadb_messages() {
    let schema = InboxSchema::DEFAULT;
    assert_eq!(
        classify(
            &recorded(
                "Duplicate entry 'O'Brien's order-credit' for key 'ux_inbox_message_consumer'"
            ),
            &schema
        ),
        ErrorClass::InboxDuplicate
    );
    let cut = format!(
        "Duplicate entry '{}...' for key 'ux_users_email'",
        "x".repeat(61)
    );
    assert_eq!(
        classify(&recorded(&cut), &schema),
        ErrorClass::UniqueViolation {
            constraint: Some("ux_users_email".into())
        }
    );
    let deadlock = Error::DatabaseError(
        DatabaseErrorKind::Unknown,
        Box::new("Deadlock found when trying to get lock; try restarting transaction".to_owned()),
    );
    assert_eq!(
        classify(&deadlock, &schema),
        ErrorClass::Transient(TransientKind::Deadlock)
    );
    let timeout = Error::DatabaseError(
        DatabaseErrorKind::Unknown,
        Box::new("Lock wait timeout exceeded; try restarting transaction".to_owned()),
    );
    assert_eq!(
        classify(&timeout, &schema),
        ErrorClass::Transient(TransientKind::LockWaitTimeout)
    );
}
