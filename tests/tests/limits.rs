#![cfg(feature = "mysql")]
//! The server's limits: a private MariaDB with a small `max_allowed_packet` (16 KiB) and an
//! inbox that keeps each key's text. A statement larger than the packet makes the server drop
//! the connection, and a redelivery did the same, for ever: the runtime sizes its statements
//! from the limit the check read — a long key goes as a parameter, a batch of long keys in
//! more statements — and refuses a key that cannot fit, with an error that says so, before
//! anything is sent.

use diesel::connection::SimpleConnection;
use diesel::{Connection, MysqlConnection, RunQueryDsl};
use inbox_diesel::schema::Backend;
use inbox_diesel::{Action, Error, InboxSchema, KeyError, Outcome, idempotent};
use inbox_tests::private::PrivateMariadb;
use inbox_tests::server::count;

#[idempotent(consumer = "limits", key = key)]
fn apply(conn: &mut MysqlConnection, key: &str) -> Result<(), Error> {
    diesel::sql_query("UPDATE accounts SET balance = balance + 1 WHERE id = 1").execute(conn)?;
    Ok(())
}

#[idempotent(consumer = "limits", batch = keys, key = |key| key.as_str())]
fn apply_all(conn: &mut MysqlConnection, keys: &[String]) -> Result<usize, Error> {
    for _ in keys {
        diesel::sql_query("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
            .execute(conn)?;
    }
    Ok(keys.len())
}

/// A stored result the size the caller asks for.
#[idempotent(consumer = "results", key = key, store_result = true)]
fn answer(conn: &mut MysqlConnection, key: &str, size: usize) -> Result<String, Error> {
    let _ = conn;
    Ok("r".repeat(size))
}

/// Claim mode, with a side effect counted.
#[idempotent(consumer = "claims", key = key, mode = "claim")]
fn notify(
    conn: &mut MysqlConnection,
    key: &str,
    sent: &std::sync::atomic::AtomicUsize,
) -> Result<(), Error> {
    let _ = key;
    sent.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    Ok(())
}

/// A stored result and a claim-mode key too large for the packet: refused, said why, before
/// anything is sent (before, the server dropped the connection on every redelivery).
/// A private MariaDB whose packet is `packet` bytes, with the inbox `inbox` creates and
/// account 1; a connection to it.
fn server_with(packet: u32, inbox: &str) -> (PrivateMariadb, MysqlConnection) {
    let server = PrivateMariadb::start(&[&format!("--max-allowed-packet={packet}")]);
    let mut admin = server.admin();
    admin.batch_execute(inbox).unwrap();
    admin
        .batch_execute(
            "CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance BIGINT NOT NULL);
             INSERT INTO accounts VALUES (1, 0)",
        )
        .unwrap();
    let conn = MysqlConnection::establish(&server.url("root")).unwrap();
    (server, conn)
}

#[test]
fn results_and_claims_are_sized_too() {
    let server = PrivateMariadb::start(&["--max-allowed-packet=16384"]);
    let columns = inbox_diesel::schema::OptionalColumns {
        key_text: true,
        result: true,
        ..Default::default()
    };
    server
        .admin()
        .batch_execute(&Backend::Mysql.create_table_with_sql(&InboxSchema::DEFAULT, columns))
        .unwrap();
    let mut conn = MysqlConnection::establish(&server.url("root")).unwrap();
    assert_eq!(
        answer(&mut conn, "small", 1000).unwrap(),
        Outcome::Processed("r".repeat(1000))
    );
    let error = answer(&mut conn, "large", 17_000).unwrap_err();
    assert!(
        matches!(
            error,
            Error::StoredResult(inbox_diesel::StoredResultProblem::TooLarge { .. })
        ),
        "{error:?}"
    );
    assert_eq!(count(&mut conn, "SELECT count(*) AS n FROM inbox"), 1);

    let sent = std::sync::atomic::AtomicUsize::new(0);
    let long = "c".repeat(17_000);
    let error = notify(&mut conn, &long, &sent).unwrap_err();
    assert!(
        matches!(error, Error::InvalidKey(KeyError::TooLongForServer { .. })),
        "{error:?}"
    );
    assert_eq!(sent.load(std::sync::atomic::Ordering::SeqCst), 0);
    assert!(notify(&mut conn, "short", &sent).unwrap().is_processed());
}

#[test]
fn statements_are_sized_from_the_servers_packet_limit() {
    let (_server, mut conn) = server_with(
        16384,
        &Backend::Mysql.create_table_with_key_text_sql(&InboxSchema::DEFAULT),
    );

    // 10 KiB of key: in the transaction's first string, as hex, 20 KiB — too large; as the
    // prepared insert's parameter it fits.
    let ten = format!("ten-{}", "k".repeat(10 * 1024));
    assert_eq!(apply(&mut conn, &ten).unwrap(), Outcome::Processed(()));
    assert!(apply(&mut conn, &ten).unwrap().is_duplicate());

    // 20 KiB cannot fit at all: refused, said why, dead-lettered — and nothing sent.
    let twenty = "k".repeat(20 * 1024);
    let error = apply(&mut conn, &twenty).unwrap_err();
    assert!(
        matches!(
            error,
            Error::InvalidKey(KeyError::TooLongForServer {
                len: 20480,
                max_packet: 16384
            })
        ),
        "{error:?}"
    );
    assert_eq!(error.action(), Action::DeadLetter);
    let said = inbox_tests::error_chain(&error);
    assert!(said.contains("max_allowed_packet"), "{said}");

    // 40 keys of 1 KiB: more than a packet's worth in one multi-row insert; in several.
    let keys: Vec<String> = (0..40)
        .map(|n| format!("{n:04}{}", "b".repeat(1020)))
        .collect();
    let outcome = apply_all(&mut conn, &keys).unwrap();
    assert_eq!(outcome.processed.len(), 40, "{outcome:?}");
    let again = apply_all(&mut conn, &keys).unwrap();
    assert_eq!(again.duplicates.len(), 40, "{again:?}");

    // The same connection throughout: never dropped by the server.
    assert_eq!(
        count(&mut conn, "SELECT balance AS n FROM accounts WHERE id = 1"),
        41
    );
    assert_eq!(count(&mut conn, "SELECT count(*) AS n FROM inbox"), 41);
}

/// A batch redelivered with most of its messages done, on a server whose packet is 4 KiB: the
/// read of the duplicates' evidence goes in as many statements as the packet needs. Before,
/// it went in one, which the server answered by dropping the connection (`Got a packet
/// bigger than 'max_allowed_packet'`) on every redelivery: the batch's new messages were
/// never applied, and a broker's delivery limit dead-lettered them (an operator's trial:
/// 900 duplicates and 100 new).
#[test]
fn a_batch_of_duplicates_is_read_back_in_packets() {
    let (_server, mut conn) = server_with(
        4096,
        &Backend::Mysql.create_table_sql(&InboxSchema::DEFAULT),
    );
    let first: Vec<String> = (0..900).map(|n| format!("m-{n}")).collect();
    let outcome = apply_all(&mut conn, &first).unwrap();
    assert_eq!(outcome.processed.len(), 900, "{outcome:?}");
    let redelivered: Vec<String> = (0..1000).map(|n| format!("m-{n}")).collect();
    let outcome = apply_all(&mut conn, &redelivered).unwrap();
    assert_eq!(outcome.processed.len(), 100);
    assert_eq!(outcome.duplicates.len(), 900);
    assert_eq!(
        count(&mut conn, "SELECT balance AS n FROM accounts WHERE id = 1"),
        1000,
        "each message applied once"
    );
}
