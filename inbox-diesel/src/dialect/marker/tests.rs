use diesel::backend::Backend;
use inbox_core::InboxSchema;
use uuid::Uuid;

use super::{ClaimMarker, ClaimMarkers, Dialect};
use crate::dialect::sql_text as sql;

/// The marker inserts of backend `DB`, one key's and a batch's, without and with the
/// keys' texts.
fn rendered<DB>() -> Vec<String>
where
    DB: Dialect + Default + Backend<QueryBuilder: Default>,
    str: diesel::serialize::ToSql<diesel::sql_types::Text, DB>,
{
    let schema = InboxSchema::new("billing.inbox", "ux_billing").unwrap();
    let ids = [Uuid::nil(), Uuid::max()];
    let texts = [String::from("a"), String::from("b")];
    let mut all = Vec::new();
    for text in [None, Some("a")] {
        all.push(sql(&ClaimMarker::<DB>::new(
            &schema, "c", &ids[0], text, None,
        )));
    }
    for texts in [None, Some(&texts[..])] {
        all.push(sql(&ClaimMarkers::<DB, DB::IdSql>::new(
            &schema, "c", &ids, texts, None,
        )));
    }
    all
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_literals_cannot_end_early() {
    assert_eq!(
        super::hex_text("a'é"),
        "convert_from(decode('6127c3a9', 'hex'), 'UTF8')"
    );
    assert_eq!(
        super::quoted_table("billing.in\"box", '"'),
        "\"billing\".\"in\"\"box\""
    );
}

#[cfg(feature = "mysql")]
#[test]
fn mysql_literals_cannot_end_early() {
    assert_eq!(
        super::utf8mb4_text("a'é"),
        "CONVERT(X'6127c3a9' USING utf8mb4)"
    );
    assert_eq!(super::hex_literal("X'", &[0, 0xab, 0x10], "'"), "X'00ab10'");
    assert_eq!(
        super::quoted_table("billing.in`box", '`'),
        "`billing`.`in``box`"
    );
}

#[test]
fn marker_inserts_sql() {
    #[cfg(feature = "postgres")]
    assert_eq!(
        rendered::<diesel::pg::Pg>(),
        [
            "INSERT INTO \"billing\".\"inbox\" (message_id, consumer, received_at, processed_at) \
             VALUES ($1, $2, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP) ON CONFLICT (message_id, \
             consumer) DO NOTHING RETURNING CAST(1 AS BIGINT)",
            "INSERT INTO \"billing\".\"inbox\" (message_id, consumer, key_text, received_at, \
             processed_at) VALUES ($1, $2, $3, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP) ON \
             CONFLICT (message_id, consumer) DO NOTHING RETURNING CAST(1 AS BIGINT)",
            "INSERT INTO \"billing\".\"inbox\" (message_id, consumer, received_at, processed_at) \
             VALUES ($1, $2, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP), ($3, $4, \
             CURRENT_TIMESTAMP, CURRENT_TIMESTAMP) ON CONFLICT (message_id, consumer) DO \
             NOTHING RETURNING message_id",
            "INSERT INTO \"billing\".\"inbox\" (message_id, consumer, key_text, received_at, \
             processed_at) VALUES ($1, $2, $3, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP), ($4, \
             $5, $6, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP) ON CONFLICT (message_id, consumer) \
             DO NOTHING RETURNING message_id",
        ]
    );
    #[cfg(feature = "mysql")]
    {
        type Mysql = diesel::mysql::Mysql;
        assert_eq!(
            rendered::<Mysql>(),
            [
                "INSERT INTO `billing`.`inbox` (message_id, consumer, received_at, \
                 processed_at) VALUES (?, ?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))",
                "INSERT INTO `billing`.`inbox` (message_id, consumer, key_text, received_at, \
                 processed_at) VALUES (?, ?, ?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))",
                "INSERT INTO `billing`.`inbox` (message_id, consumer, received_at, \
                 processed_at) VALUES (?, ?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6)), (?, ?, \
                 UTC_TIMESTAMP(6), UTC_TIMESTAMP(6)) ON CONFLICT (message_id, consumer) DO \
                 NOTHING RETURNING message_id",
                "INSERT INTO `billing`.`inbox` (message_id, consumer, key_text, received_at, \
                 processed_at) VALUES (?, ?, ?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6)), (?, ?, \
                 ?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6)) ON CONFLICT (message_id, consumer) DO \
                 NOTHING RETURNING message_id",
            ]
        );
        let schema = InboxSchema::new("billing.inbox", "ux_billing").unwrap();
        let ids = [Uuid::nil(), Uuid::max()];
        let texts = [String::from("a"), String::from("b")];
        let all_or_none = [None, Some(&texts[..])].map(|texts| {
            sql(&ClaimMarkers::<Mysql, ()>::new(&schema, "c", &ids, texts, None).all_or_none(true))
        });
        assert_eq!(
            all_or_none,
            [
                "SET STATEMENT sql_mode = 'STRICT_ALL_TABLES' FOR INSERT INTO \
                 `billing`.`inbox` (message_id, consumer, received_at, processed_at) VALUES \
                 (?, ?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6)), (?, ?, UTC_TIMESTAMP(6), \
                 UTC_TIMESTAMP(6))",
                "SET STATEMENT sql_mode = 'STRICT_ALL_TABLES' FOR INSERT INTO \
                 `billing`.`inbox` (message_id, consumer, key_text, received_at, \
                 processed_at) VALUES (?, ?, ?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6)), (?, ?, \
                 ?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))",
            ]
        );
    }
}
