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
