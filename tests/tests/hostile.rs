//! What a sender or an operator can do to the inbox with its input, on a real database.

use diesel::prelude::*;
use inbox_diesel::{MessageKey, Outcome, idempotent};
use inbox_tests::sqlite::SqliteDb;

/// A handler keyed by a text id the sender chooses (an AMQP `message-id`).
#[idempotent(consumer = "orders", key = msg.id)]
fn on_order(conn: &mut SqliteConnection, msg: &Order) -> QueryResult<()> {
    diesel::sql_query("UPDATE accounts SET balance = balance + 1 WHERE id = 1").execute(conn)?;
    Ok(())
}

struct Order {
    id: String,
}

/// A sender who controls a text key sends, before a real message, the stored id of that
/// message's key as text. Were text read as a UUID, the forged message would take the real
/// message's marker and the real message would be dropped as a duplicate, never processed.
#[test]
fn a_forged_text_key_cannot_pre_empt_another_message() {
    let db = SqliteDb::new("forged_key");
    let mut conn = db.connect();
    let real = Order {
        id: "order-2".into(),
    };
    let stored = MessageKey::text(real.id.as_str()).unwrap().stored_id();
    for forged in [stored.to_string(), stored.simple().to_string()] {
        let forged = Order { id: forged };
        assert_eq!(
            on_order(&mut conn, &forged).unwrap(),
            Outcome::Processed(())
        );
    }
    assert_eq!(on_order(&mut conn, &real).unwrap(), Outcome::Processed(()));
    let balance: i64 = diesel::sql_query("SELECT balance AS n FROM accounts WHERE id = 1")
        .get_result::<Balance>(&mut conn)
        .unwrap()
        .n;
    assert_eq!(
        balance, 3,
        "both forgeries and the real message were applied, once each"
    );
}

#[derive(QueryableByName)]
struct Balance {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

/// Everything logged at INFO and above — spans and events, each field as `name=value` with
/// the value's `Display` where it has one, the way a plain-text log writes it.
struct Captured(std::sync::Mutex<String>);

static CAPTURED: Captured = Captured(std::sync::Mutex::new(String::new()));

struct Capture;

impl tracing::field::Visit for &Capture {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        let line = format!("{}={value} ", field.name());
        CAPTURED.0.lock().unwrap().push_str(&line);
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        let line = format!("{}={value:?} ", field.name());
        CAPTURED.0.lock().unwrap().push_str(&line);
    }
}

impl tracing::Subscriber for Capture {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        *metadata.level() <= tracing::Level::INFO
    }

    fn new_span(&self, span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        span.record(&mut &*self);
        CAPTURED.0.lock().unwrap().push('\n');
        tracing::span::Id::from_u64(1)
    }

    fn record(&self, _: &tracing::span::Id, values: &tracing::span::Record<'_>) {
        values.record(&mut &*self);
    }

    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}

    fn event(&self, event: &tracing::Event<'_>) {
        event.record(&mut &*self);
        CAPTURED.0.lock().unwrap().push('\n');
    }

    fn enter(&self, _: &tracing::span::Id) {}

    fn exit(&self, _: &tracing::span::Id) {}
}

/// A key is business data (an e-mail address) and may carry newlines and terminal escapes a
/// sender chose: at INFO the handler's span names the message by its stored id, so neither
/// the address nor a forged log line reaches a plain-text log.
#[test]
fn keys_stay_out_of_the_logs() {
    tracing::subscriber::set_global_default(Capture).unwrap();
    let db = SqliteDb::new("key_logs");
    let mut conn = db.connect();
    let hostile = Order {
        id: "ada@example.com\nINFO forged line\u{1b}[2J".into(),
    };
    assert!(on_order(&mut conn, &hostile).unwrap().is_processed());
    assert!(on_order(&mut conn, &hostile).unwrap().is_duplicate());
    let logged = CAPTURED.0.lock().unwrap().clone();
    let stored = MessageKey::text(hostile.id.as_str()).unwrap().stored_id();
    assert!(logged.contains(&stored.to_string()), "{logged}");
    for leaked in ["ada@example.com", "forged line", "\u{1b}"] {
        assert!(!logged.contains(leaked), "{leaked:?} in {logged}");
    }
}

/// Keys as real code has them: an ActivityPub id — a URL past a kilobyte — bytes, a
/// 128-bit integer. Each is processed once and recognised on redelivery.
#[test]
fn urls_bytes_and_wide_integers_are_keys() {
    #[idempotent(consumer = "activities", key = activity)]
    fn on_activity(conn: &mut SqliteConnection, activity: &url::Url) -> QueryResult<()> {
        diesel::sql_query("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
            .execute(conn)
            .map(drop)
    }
    #[idempotent(consumer = "blobs", key = digest)]
    fn on_blob(conn: &mut SqliteConnection, digest: &[u8; 32]) -> QueryResult<()> {
        diesel::sql_query("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
            .execute(conn)
            .map(drop)
    }
    #[idempotent(consumer = "ledger", key = *entry)]
    fn on_entry(conn: &mut SqliteConnection, entry: &u128) -> QueryResult<()> {
        diesel::sql_query("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
            .execute(conn)
            .map(drop)
    }

    let db = SqliteDb::new("key_kinds");
    let mut conn = db.connect();
    let activity = url::Url::parse(&format!(
        "https://example.social/objects/{}",
        "a".repeat(1_039)
    ))
    .unwrap();
    assert!(on_activity(&mut conn, &activity).unwrap().is_processed());
    assert!(on_activity(&mut conn, &activity).unwrap().is_duplicate());
    assert!(on_blob(&mut conn, &[7; 32]).unwrap().is_processed());
    assert!(on_blob(&mut conn, &[7; 32]).unwrap().is_duplicate());
    assert!(on_entry(&mut conn, &u128::MAX).unwrap().is_processed());
    assert!(on_entry(&mut conn, &u128::MAX).unwrap().is_duplicate());
    let balance: i64 = diesel::sql_query("SELECT balance AS n FROM accounts WHERE id = 1")
        .get_result::<Balance>(&mut conn)
        .unwrap()
        .n;
    assert_eq!(balance, 3);
}
