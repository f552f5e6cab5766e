// The optional `key_text` column, on one backend: included by `key_text.rs` into a module
// that names `Db` (the fixture), `Conn`, `AsyncConn` and `id_literal` (the stored id as an
// SQL literal of the backend's `message_id` type).

use diesel::connection::SimpleConnection;
use diesel::sql_types::{Nullable, Text};
use diesel::{QueryResult, RunQueryDsl};
use inbox_diesel::{InboxConnection, InboxSchema, MessageKey, ToMessageKey, idempotent};
use inbox_tests::{AppError, Uuid};

#[idempotent(consumer = "activities", key = id.as_str())]
fn by_text(conn: &mut Conn, id: &String) -> QueryResult<()> {
    conn.batch_execute("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
}

#[idempotent(consumer = "sequence", key = *n)]
fn by_integer(conn: &mut Conn, n: &u128) -> QueryResult<()> {
    conn.batch_execute("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
}

#[idempotent(consumer = "blobs", key = bytes.as_slice())]
fn by_bytes(conn: &mut Conn, bytes: &Vec<u8>) -> QueryResult<()> {
    conn.batch_execute("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
}

#[idempotent(consumer = "records", key = (topic.as_str(), *partition, *offset))]
fn by_record(conn: &mut Conn, topic: &String, partition: &i32, offset: &i64) -> QueryResult<()> {
    conn.batch_execute("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
}

#[idempotent(consumer = "orders", key = *id)]
fn by_uuid(conn: &mut Conn, id: &Uuid) -> QueryResult<()> {
    conn.batch_execute("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
}

#[idempotent(consumer = "activities-batch", batch = ids, key = |id| id.as_str())]
fn batch(conn: &mut Conn, ids: &[String]) -> QueryResult<()> {
    conn.batch_execute("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
}

#[idempotent(consumer = "mail", key = id.as_str(), mode = "claim")]
fn mailed(
    conn: &mut Conn,
    id: &String,
    sent: &std::sync::atomic::AtomicUsize,
) -> Result<(), AppError> {
    sent.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    Ok(())
}

#[idempotent(consumer = "activities-async", key = id.as_str())]
async fn by_text_async(conn: &mut AsyncConn, id: &String) -> QueryResult<()> {
    use diesel_async::SimpleAsyncConnection;
    conn.batch_execute("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
        .await
}

#[idempotent(consumer = "activities-async-batch", batch = ids, key = |id| id.as_str())]
async fn batch_async(conn: &mut AsyncConn, ids: &[String]) -> QueryResult<()> {
    use diesel_async::SimpleAsyncConnection;
    conn.batch_execute("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
        .await
}

#[derive(diesel::QueryableByName)]
struct KeyText {
    #[diesel(sql_type = Nullable<Text>)]
    key_text: Option<String>,
}

/// The `key_text` of the row of `key` and `consumer`; `None` when there is no such row,
/// `Some(None)` when its `key_text` is NULL.
fn stored_text(conn: &mut Conn, consumer: &str, key: impl ToMessageKey) -> Option<Option<String>> {
    let id = key.to_message_key().unwrap().stored_id();
    let rows: Vec<KeyText> = diesel::sql_query(format!(
        "SELECT key_text FROM inbox WHERE message_id = {} AND consumer = '{consumer}'",
        id_literal(id)
    ))
    .load(conn)
    .unwrap();
    assert!(rows.len() <= 1);
    rows.into_iter().next().map(|row| row.key_text)
}

fn balance(conn: &mut Conn) -> i64 {
    #[derive(diesel::QueryableByName)]
    struct Balance {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        balance: i64,
    }
    diesel::sql_query("SELECT balance FROM accounts WHERE id = 1")
        .get_result::<Balance>(conn)
        .unwrap()
        .balance
}

fn add_key_text(db: &Db) {
    let backend = <Conn as InboxConnection>::BACKEND;
    db.connect()
        .batch_execute(&backend.add_key_text_sql(&InboxSchema::DEFAULT))
        .unwrap();
}

/// Every kind of key is kept as the text `Display` gives it, in transaction, batch and
/// claim mode, beside the stored id it was derived to — and a redelivery is still a
/// duplicate that writes nothing.
#[test]
fn every_kind_of_key_is_kept_as_its_text() {
    let db = Db::new("key_text_kinds");
    add_key_text(&db);
    let mut conn = db.connect();

    let url = format!(
        "https://example.social/users/zoë/statuses/{}",
        "9".repeat(1_000)
    );
    let wide = u128::MAX;
    let bytes = vec![0xde, 0xad, 0x00, 0xbe, 0xef];
    let topic = "payments".to_owned();
    let order = Uuid::from_u128(0x7f1c_6b52_4d5e_4c1e_9a56_1b0e_4c1d_2f3a);
    for first in [true, false] {
        assert_eq!(by_text(&mut conn, &url).unwrap().is_processed(), first);
        assert_eq!(by_integer(&mut conn, &wide).unwrap().is_processed(), first);
        assert_eq!(by_integer(&mut conn, &42).unwrap().is_processed(), first);
        assert_eq!(by_bytes(&mut conn, &bytes).unwrap().is_processed(), first);
        let record = by_record(&mut conn, &topic, &3, &1_234).unwrap();
        assert_eq!(record.is_processed(), first);
        assert_eq!(by_uuid(&mut conn, &order).unwrap().is_processed(), first);
    }
    assert_eq!(balance(&mut conn), 6, "each message once");

    let expected: [(&str, MessageKey, &str); 6] = [
        ("activities", url.to_message_key().unwrap(), url.as_str()),
        (
            "sequence",
            wide.to_message_key().unwrap(),
            "340282366920938463463374607431768211455",
        ),
        ("sequence", 42_u128.to_message_key().unwrap(), "42"),
        (
            "blobs",
            bytes.as_slice().to_message_key().unwrap(),
            "dead00beef",
        ),
        (
            "records",
            ("payments", 3, 1_234_i64).to_message_key().unwrap(),
            "payments/3@1234",
        ),
        (
            "orders",
            order.to_message_key().unwrap(),
            "7f1c6b52-4d5e-4c1e-9a56-1b0e4c1d2f3a",
        ),
    ];
    for (consumer, key, text) in expected {
        assert_eq!(key.to_string(), text);
        assert_eq!(
            stored_text(&mut conn, consumer, key),
            Some(Some(text.to_owned())),
            "{consumer}"
        );
    }

    // A NUL a sender put in a text key, which PostgreSQL's text cannot hold, is written as
    // U+FFFD: the message is processed all the same.
    let nul = "a\0b".to_owned();
    assert!(by_text(&mut conn, &nul).unwrap().is_processed());
    assert!(by_text(&mut conn, &nul).unwrap().is_duplicate());
    assert_eq!(
        stored_text(&mut conn, "activities", nul.as_str()),
        Some(Some("a\u{fffd}b".to_owned()))
    );

    // A batch: each new message's own text, a repeated key once, a redelivered one untouched.
    let ids: Vec<String> = ["a", "b", "a", "c"].map(String::from).to_vec();
    assert_eq!(batch(&mut conn, &ids).unwrap().processed, [0, 1, 3]);
    let again: Vec<String> = ["c", "d"].map(String::from).to_vec();
    assert_eq!(batch(&mut conn, &again).unwrap().processed, [1]);
    for id in ["a", "b", "c", "d"] {
        assert_eq!(
            stored_text(&mut conn, "activities-batch", id),
            Some(Some(id.to_owned()))
        );
    }

    // Claim mode: the claim's insert carries the text; the stamp keeps it.
    let sent = std::sync::atomic::AtomicUsize::new(0);
    assert!(
        mailed(&mut conn, &"welcome-7".to_owned(), &sent)
            .unwrap()
            .is_processed()
    );
    assert!(
        mailed(&mut conn, &"welcome-7".to_owned(), &sent)
            .unwrap()
            .is_duplicate()
    );
    assert_eq!(sent.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(
        stored_text(&mut conn, "mail", "welcome-7"),
        Some(Some("welcome-7".to_owned()))
    );
}

/// The async runtime writes the column too (its own statements on PostgreSQL and MySQL).
#[test]
fn the_async_runtime_keeps_the_text() {
    let db = Db::new("key_text_async");
    add_key_text(&db);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut conn = db.connect_async().await;
        let id = "https://example.social/a/1".to_owned();
        assert!(by_text_async(&mut conn, &id).await.unwrap().is_processed());
        assert!(by_text_async(&mut conn, &id).await.unwrap().is_duplicate());
        let ids: Vec<String> = ["x", "y"].map(String::from).to_vec();
        assert_eq!(
            batch_async(&mut conn, &ids).await.unwrap().processed,
            [0, 1]
        );
    });
    let mut conn = db.connect();
    assert_eq!(
        stored_text(&mut conn, "activities-async", "https://example.social/a/1"),
        Some(Some("https://example.social/a/1".to_owned()))
    );
    for id in ["x", "y"] {
        assert_eq!(
            stored_text(&mut conn, "activities-async-batch", id),
            Some(Some(id.to_owned()))
        );
    }
    assert_eq!(balance(&mut conn), 2);
}

/// A table without the column is the default: markers go in without it. Once the column
/// is added, a connection that checks the table afresh fills it.
#[test]
fn a_column_added_later_is_filled_by_the_next_connection() {
    let db = Db::new("key_text_added");
    let mut before = db.connect();
    assert!(
        by_text(&mut before, &"first".to_owned())
            .unwrap()
            .is_processed()
    );
    add_key_text(&db);
    let mut after = db.connect();
    assert!(
        by_text(&mut after, &"second".to_owned())
            .unwrap()
            .is_processed()
    );
    assert_eq!(stored_text(&mut after, "activities", "first"), Some(None));
    assert_eq!(
        stored_text(&mut after, "activities", "second"),
        Some(Some("second".to_owned()))
    );
}

/// The column dropped under a connection that wrote it: that connection's next claim fails
/// on the missing column, the runtime checks the table again and the delivery goes in
/// without it. Nothing is lost or applied twice.
#[test]
fn a_dropped_column_is_noticed_and_the_delivery_goes_in() {
    let db = Db::new("key_text_dropped");
    add_key_text(&db);
    let mut conn = db.connect();
    assert!(
        by_text(&mut conn, &"before".to_owned())
            .unwrap()
            .is_processed()
    );
    let backend = <Conn as InboxConnection>::BACKEND;
    db.connect()
        .batch_execute(&backend.drop_key_text_sql(&InboxSchema::DEFAULT))
        .unwrap();

    assert!(
        by_text(&mut conn, &"after".to_owned())
            .unwrap()
            .is_processed()
    );
    assert!(
        by_text(&mut conn, &"after".to_owned())
            .unwrap()
            .is_duplicate()
    );
    assert_eq!(balance(&mut conn), 2);
}

/// A consumer name that would end a string literal, a dollar quote or an identifier.
const HOSTILE_CONSUMER: &str = "it's \"all\"; -- \\ $$ $inbox$ ü`";

#[idempotent(consumer = "it's \"all\"; -- \\ $$ $inbox$ ü`", key = id.as_str())]
fn hostile(conn: &mut Conn, id: &String) -> QueryResult<()> {
    conn.batch_execute("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
}

#[idempotent(consumer = "it's \"all\"; -- \\ $$ $inbox$ ü`", key = id.as_str())]
async fn hostile_async(conn: &mut AsyncConn, id: &String) -> QueryResult<()> {
    use diesel_async::SimpleAsyncConnection;
    conn.batch_execute("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
        .await
}

/// The marker's statement carries the consumer and the key's text as literals (PostgreSQL,
/// MySQL): quotes, backslashes, dollar quotes, comments and NUL in either come back byte for
/// byte, a redelivery is a duplicate, and nothing else runs — sync and async.
#[test]
fn quotes_and_escapes_in_the_consumer_and_the_key_come_back_byte_for_byte() {
    #[derive(diesel::QueryableByName)]
    struct Row {
        #[diesel(sql_type = Text)]
        consumer: String,
        #[diesel(sql_type = Nullable<Text>)]
        key_text: Option<String>,
    }
    let db = Db::new("key_text_hostile");
    add_key_text(&db);
    let keys = [
        "it's",
        "\\'; DROP TABLE inbox; --",
        "$$ $inbox$ \"q\" `b` */ /*",
        "zoë\u{0}日本",
    ];
    let mut conn = db.connect();
    for key in keys {
        assert!(hostile(&mut conn, &key.to_owned()).unwrap().is_processed());
        assert!(hostile(&mut conn, &key.to_owned()).unwrap().is_duplicate());
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut conn = db.connect_async().await;
        for key in keys {
            let async_key = format!("{key} async");
            assert!(
                hostile_async(&mut conn, &async_key)
                    .await
                    .unwrap()
                    .is_processed()
            );
            assert!(
                hostile_async(&mut conn, &async_key)
                    .await
                    .unwrap()
                    .is_duplicate()
            );
            assert!(
                hostile_async(&mut conn, &key.to_owned())
                    .await
                    .unwrap()
                    .is_duplicate()
            );
        }
    });
    let rows: Vec<Row> = diesel::sql_query("SELECT consumer, key_text FROM inbox")
        .load(&mut conn)
        .unwrap();
    let mut texts: Vec<String> = rows
        .iter()
        .map(|row| {
            assert_eq!(row.consumer, HOSTILE_CONSUMER);
            row.key_text.clone().unwrap()
        })
        .collect();
    texts.sort();
    let mut expected: Vec<String> = keys
        .iter()
        .flat_map(|key| [key.to_string(), format!("{key} async")])
        .map(|text| text.replace('\0', "\u{fffd}"))
        .collect();
    expected.sort();
    assert_eq!(texts, expected);
    assert_eq!(balance(&mut conn), 8);
}
