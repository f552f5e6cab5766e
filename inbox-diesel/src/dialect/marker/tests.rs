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

/// A PostgreSQL handler's settings, on the table `billing.inbox`.
#[cfg(feature = "postgres")]
static SPEC: crate::spec::HandlerSpec = crate::spec::HandlerSpec {
    consumer: inbox_core::Consumer::from_validated("credit"),
    schema: InboxSchema::new_unchecked("billing.inbox", "ux_billing"),
    retry: inbox_core::RetryPolicy::new(3),
    isolation: inbox_core::Isolation::ServerDefault,
    sqlite_busy_timeout_ms: crate::spec::HandlerSpec::SQLITE_BUSY_TIMEOUT_MS,
    precheck: false,
    idle_in_transaction_ms: 0,
    in_flight_when_locked: false,
};

/// What `prepared` (a new session's preparation) and `begin` (each message's start) send
/// after what every marker sends alike: the rollback, English where allowed and the checks
/// after `BEGIN` prepared; `BEGIN` and the checks' `EXECUTE`.
#[cfg(feature = "postgres")]
fn started<'s>(marker: &super::PgMarker, prepared: &'s str, begin: &'s str) -> (&'s str, &'s str) {
    let checks = crate::spec::HandlerSpec::postgres_begin_checks(SPEC.idle_in_transaction_ms);
    assert_eq!(checks, crate::spec::HandlerSpec::POSTGRES_OURS);
    let name = marker.checks_name();
    let dropped = |name: &str| {
        format!(
            "BEGIN EXECUTE 'DEALLOCATE {name}'; EXCEPTION WHEN invalid_sql_statement_name THEN \
             NULL; END; "
        )
    };
    let prepared = prepared
        .strip_prefix(&format!(
            "ROLLBACK; {}; COMMIT; DO $inbox$ BEGIN {}{}{}END $inbox$; PREPARE {name} AS {checks}; ",
            super::ENGLISH_WHERE_ALLOWED,
            dropped(&name),
            dropped(&marker.name),
            dropped(&marker.seen_name()),
        ))
        .unwrap();
    let none_open = crate::spec::HandlerSpec::POSTGRES_NONE_OPEN;
    let begin = begin
        .strip_prefix(&format!("BEGIN; {none_open}; EXECUTE {name}"))
        .unwrap();
    (prepared, begin)
}

/// PostgreSQL: the marker's prepared statement, its name and what each message sends, for a
/// table with and without `key_text`, with and without the check's mark and English.
#[cfg(feature = "postgres")]
#[test]
fn postgres_marker_statements() {
    use crate::dialect::layout::{DatabaseMark, Layout};
    let key = inbox_core::MessageKey::uuid(Uuid::nil());
    let marked = Layout {
        key_text: true,
        english: true,
        database_mark: DatabaseMark::postgres("5 16384", "billing.inbox"),
        ..Layout::default()
    };
    let sent = [Layout::default(), marked].map(|layout| {
        let marker = super::PgMarker::of(&SPEC, layout, super::Keeps::default());
        let begin = marker.begin(&SPEC, &key);
        let prepared = marker.prepared_and("…");
        let (prepared, begin) = started(&marker, &prepared, &begin);
        [prepared.to_owned(), begin.to_owned()]
    });
    assert_eq!(
        sent,
        [
            [
                "PREPARE inbox_marker_f44f46b3547d52e3824a3d371c3903e9 (uuid, text) AS WITH marker \
                 AS (INSERT INTO \"billing\".\"inbox\" (message_id, consumer, received_at, \
                 processed_at) VALUES ($1, $2, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP) RETURNING 1), \
                 arbiter AS (INSERT INTO \"billing\".\"inbox\" (message_id, consumer) SELECT \
                 message_id, consumer FROM \"billing\".\"inbox\" WHERE false ON CONFLICT \
                 (message_id, consumer) DO NOTHING) SELECT CASE count(*) WHEN 1 THEN 1 ELSE \
                 CAST('inbox: the marker insert wrote ' || count(*) || ' rows' AS integer) END FROM \
                 marker; …",
                "; EXECUTE \
                 inbox_marker_f44f46b3547d52e3824a3d371c3903e9('00000000-0000-0000-0000-000000000000', \
                 convert_from(decode('637265646974', 'hex'), 'UTF8'))",
            ],
            [
                "PREPARE inbox_marker_855bb4d07f8a50a7ad95ad731978c6cb (uuid, text, text) AS WITH \
                 marker AS (INSERT INTO \"billing\".\"inbox\" (message_id, consumer, key_text, \
                 received_at, processed_at) VALUES ($1, CASE WHEN \
                 to_regclass('\"billing\".\"inbox\"') = CAST(16384 AS oid) AND (SELECT oid FROM \
                 pg_database WHERE datname = current_database()) = CAST(5 AS oid) THEN $2 END, $3, \
                 CURRENT_TIMESTAMP, CURRENT_TIMESTAMP) RETURNING 1), arbiter AS (INSERT INTO \
                 \"billing\".\"inbox\" (message_id, consumer) SELECT message_id, consumer FROM \
                 \"billing\".\"inbox\" WHERE false ON CONFLICT (message_id, consumer) DO NOTHING) \
                 SELECT CASE count(*) WHEN 1 THEN 1 ELSE CAST('inbox: the marker insert wrote ' || \
                 count(*) || ' rows' AS integer) END FROM marker; …",
                "; SET LOCAL lc_messages = 'C'; EXECUTE \
                 inbox_marker_855bb4d07f8a50a7ad95ad731978c6cb('00000000-0000-0000-0000-000000000000', \
                 convert_from(decode('637265646974', 'hex'), 'UTF8'), \
                 convert_from(decode('30303030303030302d303030302d303030302d303030302d303030303030303030303030', \
                 'hex'), 'UTF8'))",
            ],
        ]
    );
}

/// PostgreSQL: a marker that keeps a result and a fingerprint — its look and its insert as
/// prepared, what the start sends (the key's lock, then the look) and what the commit sends.
#[cfg(feature = "postgres")]
#[test]
fn postgres_deferred_marker_statements() {
    use crate::dialect::layout::Layout;
    let key = inbox_core::MessageKey::uuid(Uuid::nil());
    let keeps = super::Keeps {
        result: true,
        fingerprint: true,
    };
    let marker = super::PgMarker::of(&SPEC, Layout::default(), keeps);
    let begin = marker.begin(&SPEC, &key);
    let prepared = marker.prepared_and("…");
    let commit = marker.commit(
        &SPEC,
        &key,
        super::MarkerValues {
            result: Some("{}"),
            fingerprint: Some(&[0xab, 0x01]),
        },
    );
    let (prepared, begin) = started(&marker, &prepared, &begin);
    let name = "d162468db568531d90baf0ec8b32f117";
    assert_eq!(
        [prepared, begin, &commit],
        [
            &*format!(
                "PREPARE inbox_marker_{name} (uuid, text, text, bytea) AS WITH marker AS (INSERT \
                 INTO \"billing\".\"inbox\" (message_id, consumer, result, fingerprint, received_at, \
                 processed_at) VALUES ($1, $2, CAST($3 AS jsonb), $4, CURRENT_TIMESTAMP, \
                 CURRENT_TIMESTAMP) RETURNING 1), arbiter AS (INSERT INTO \"billing\".\"inbox\" (message_id, \
                 consumer) SELECT message_id, consumer FROM \"billing\".\"inbox\" WHERE false ON CONFLICT \
                 (message_id, consumer) DO NOTHING) SELECT CASE count(*) WHEN 1 THEN 1 ELSE \
                 CAST('inbox: the marker insert wrote ' || count(*) || ' rows' AS integer) END \
                 FROM marker; PREPARE inbox_seen_{name} (uuid, text) AS SELECT CAST('inbox: the \
                 marker exists for ' || consumer AS integer) FROM \"billing\".\"inbox\" WHERE message_id = $1 \
                 AND consumer = $2; …"
            ),
            &*format!(
                "; SELECT pg_advisory_xact_lock(1537477763832577989); EXECUTE \
                 inbox_seen_{name}('00000000-0000-0000-0000-000000000000', \
                 convert_from(decode('637265646974', 'hex'), 'UTF8'))"
            ),
            &*format!(
                "{}; EXECUTE inbox_marker_{name}('00000000-0000-0000-0000-000000000000', \
                 convert_from(decode('637265646974', 'hex'), 'UTF8'), \
                 convert_from(decode('7b7d', 'hex'), 'UTF8'), decode('ab01', 'hex')); COMMIT",
                crate::spec::HandlerSpec::POSTGRES_STILL_OURS
            ),
        ]
    );
}

/// PostgreSQL: a thread keeps each marker, by the table and all of the layout its statement is
/// written from, and hands out the one written afresh. That the key holds all the statement
/// is written from is the compiler's part (`PgMarker::new` reads nothing but a `PgMarkerOf`);
/// `postgres_marker_statements` pins what is written.
#[cfg(feature = "postgres")]
#[test]
fn postgres_markers_are_kept() {
    use super::{Keeps, PgMarker, PgMarkerOf};
    use crate::dialect::layout::{DatabaseMark, Layout};
    use std::rc::Rc;
    let on = |table, index| crate::spec::HandlerSpec {
        schema: InboxSchema::new_unchecked(table, index),
        ..SPEC.clone()
    };
    let (billing, orders) = (
        on("billing.kept", "ux_billing"),
        on("orders.kept", "ux_orders"),
    );
    let marked = Layout {
        database_mark: DatabaseMark::postgres("5 16384", "billing.kept"),
        ..Layout::default()
    };
    let other_database = Layout {
        database_mark: DatabaseMark::postgres("6 16384", "billing.kept"),
        ..Layout::default()
    };
    let layouts = [
        Layout::default(),
        Layout {
            key_text: true,
            ..Layout::default()
        },
        Layout {
            english: true,
            ..Layout::default()
        },
        marked,
        other_database,
    ];
    let nothing = Keeps::default();
    let mut names = Vec::new();
    for schema in [&billing, &orders] {
        for layout in layouts {
            let kept = PgMarker::of(schema, layout, nothing);
            // The same inputs: the same marker, not another one.
            assert!(Rc::ptr_eq(&kept, &PgMarker::of(schema, layout, nothing)));
            // What is kept is what would be written afresh.
            let fresh = PgMarker::new(PgMarkerOf::new(schema, layout, nothing));
            assert_eq!(
                (
                    &kept.name,
                    &kept.types,
                    &kept.statement,
                    kept.key_text,
                    kept.english,
                    &kept.seen,
                    &kept.checks
                ),
                (
                    &fresh.name,
                    &fresh.types,
                    &fresh.statement,
                    fresh.key_text,
                    fresh.english,
                    &fresh.seen,
                    &fresh.checks
                )
            );
            names.push(kept.name.clone());
        }
    }
    // What the marker keeps is part of its statement and its name.
    let keeps = [(true, false), (false, true), (true, true)].map(|(result, fingerprint)| {
        PgMarker::of(
            &billing,
            Layout::default(),
            Keeps {
                result,
                fingerprint,
            },
        )
        .name
        .clone()
    });
    assert!(!keeps.contains(&names[0]) && keeps[0] != keeps[1] && keeps[1] != keeps[2]);
    // Parts of the layout the statement does not depend on share the marker.
    let claimable = Layout {
        result: true,
        fingerprint: true,
        max_packet: 1 << 20,
        ..Layout::default()
    };
    assert!(Rc::ptr_eq(
        &PgMarker::of(&billing, Layout::default(), nothing),
        &PgMarker::of(&billing, claimable, nothing)
    ));
    // `english` changes what each message sends, not the statement.
    assert_eq!(names[0], names[2]);
    names.remove(2);
    names.remove(layouts.len() + 1);
    let mut distinct = names.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), names.len(), "{names:?}");
}
