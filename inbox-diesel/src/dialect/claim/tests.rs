use diesel::backend::Backend;
use inbox_core::{InboxSchema, MessageKey};

use super::{ClaimRead, ClaimSql, ClaimStep, Dialect, Layout};
use crate::dialect::sql_text as sql;

/// Every claim statement of backend `DB`, as the SQL text sent (the binds left out); one
/// that a precheck or `latest` leaves as it is, once.
fn rendered<DB>() -> Vec<String>
where
    DB: Dialect + Default + Backend<QueryBuilder: Default>,
{
    let schema = InboxSchema::new("billing.inbox", "ux_billing").unwrap();
    let key = MessageKey::integer(1);
    let ids = [key.stored_id()];
    let mariadb = Layout {
        mariadb: true,
        ..Layout::default()
    };
    let mut all = Vec::new();
    for (committed_only, nowait) in [(None, false), (Some(Layout::default()), true)] {
        all.push(sql(&ClaimSql::<DB>::read(
            &schema,
            "c",
            &key,
            committed_only,
            nowait,
        )));
    }
    all.push(sql(&ClaimSql::<DB>::read(
        &schema,
        "c",
        &key,
        Some(mariadb),
        false,
    )));
    for latest in [false, true] {
        all.push(sql(&ClaimRead::<DB>::present(&schema, "c", &ids, latest)));
    }
    for step in [
        ClaimStep::Insert {
            lease_ms: 5,
            layout: Layout::default(),
            fingerprint: None,
        },
        ClaimStep::TakeOver {
            seen: 1,
            lease_ms: 5,
            expired: true,
        },
        ClaimStep::Stamp { attempt: 1 },
        ClaimStep::Release { attempt: 1 },
    ] {
        all.push(sql(&ClaimSql::<DB>::new(&schema, "c", &key, step)));
    }
    all.dedup();
    all
}

#[test]
fn claim_statements_sql() {
    #[cfg(feature = "postgres")]
    assert_eq!(
        rendered::<diesel::pg::Pg>(),
        [
            "SELECT CAST(CASE WHEN processed_at IS NOT NULL THEN 0 WHEN claimed_until IS NULL \
             THEN 1 WHEN claimed_until > CURRENT_TIMESTAMP THEN 2 ELSE 3 END AS BIGINT), \
             CAST(attempts AS BIGINT), CAST(CASE WHEN claimed_until > CURRENT_TIMESTAMP THEN \
             EXTRACT(EPOCH FROM claimed_until - CURRENT_TIMESTAMP) * 1000 ELSE 0 END AS BIGINT) \
             FROM \"billing\".\"inbox\" WHERE message_id = $1 AND consumer = $2",
            "SELECT CAST(count(*) AS BIGINT), CAST(count(processed_at) AS BIGINT), \
             CAST(count(CASE WHEN processed_at IS NULL AND claimed_until > CURRENT_TIMESTAMP THEN \
             1 END) AS BIGINT) FROM \"billing\".\"inbox\" WHERE consumer = $1 AND message_id IN ($2)",
            "INSERT INTO \"billing\".\"inbox\" (message_id, consumer, received_at, claimed_until, \
             attempts) VALUES ($1, $2, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP + $3 * INTERVAL '1 \
             millisecond', 1) ON CONFLICT (message_id, consumer) DO NOTHING",
            "UPDATE \"billing\".\"inbox\" SET claimed_until = CURRENT_TIMESTAMP + $1 * INTERVAL '1 \
             millisecond', attempts = attempts + 1 WHERE message_id = $2 AND consumer = $3 AND \
             attempts = $4 AND processed_at IS NULL AND (claimed_until IS NULL OR claimed_until \
             <= CURRENT_TIMESTAMP)",
            "UPDATE \"billing\".\"inbox\" SET processed_at = CURRENT_TIMESTAMP, claimed_until = NULL \
             WHERE message_id = $1 AND consumer = $2 AND attempts = $3 AND processed_at IS NULL",
            "UPDATE \"billing\".\"inbox\" SET claimed_until = NULL WHERE message_id = $1 AND consumer \
             = $2 AND attempts = $3 AND processed_at IS NULL",
        ]
    );

    #[cfg(feature = "mysql")]
    assert_eq!(
        rendered::<diesel::mysql::Mysql>(),
        [
            "SELECT CAST(CASE WHEN processed_at IS NOT NULL THEN 0 WHEN claimed_until IS NULL \
             THEN 1 WHEN claimed_until > UTC_TIMESTAMP(6) THEN 2 ELSE 3 END AS SIGNED), \
             CAST(attempts AS SIGNED), CAST(CASE WHEN claimed_until > UTC_TIMESTAMP(6) THEN \
             TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), claimed_until) DIV 1000 ELSE 0 END AS \
             SIGNED) FROM `billing`.`inbox` WHERE message_id = ? AND consumer = ?",
            "SELECT CAST(CASE WHEN @@SESSION.transaction_isolation = 'READ-UNCOMMITTED' THEN 4 \
             WHEN processed_at IS NOT NULL THEN 0 WHEN claimed_until IS NULL THEN 1 WHEN \
             claimed_until > UTC_TIMESTAMP(6) THEN 2 ELSE 3 END AS SIGNED), CAST(attempts AS \
             SIGNED), CAST(CASE WHEN claimed_until > UTC_TIMESTAMP(6) THEN \
             TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), claimed_until) DIV 1000 ELSE 0 END AS \
             SIGNED) FROM `billing`.`inbox` WHERE message_id = ? AND consumer = ? AND \
             @@autocommit = 1 FOR SHARE NOWAIT",
            "SELECT CAST(CASE WHEN @@SESSION.tx_isolation = 'READ-UNCOMMITTED' THEN 4 WHEN \
             processed_at IS NOT NULL THEN 0 WHEN claimed_until IS NULL THEN 1 WHEN claimed_until \
             > UTC_TIMESTAMP(6) THEN 2 ELSE 3 END AS SIGNED), CAST(attempts AS SIGNED), CAST(CASE \
             WHEN claimed_until > UTC_TIMESTAMP(6) THEN TIMESTAMPDIFF(MICROSECOND, \
             UTC_TIMESTAMP(6), claimed_until) DIV 1000 ELSE 0 END AS SIGNED) FROM \
             `billing`.`inbox` WHERE message_id = ? AND consumer = ? AND @@autocommit = 1 LOCK IN \
             SHARE MODE",
            "SELECT CAST(count(*) AS SIGNED), CAST(count(processed_at) AS SIGNED), \
             CAST(count(CASE WHEN processed_at IS NULL AND claimed_until > UTC_TIMESTAMP(6) THEN \
             1 END) AS SIGNED) FROM `billing`.`inbox` WHERE consumer = ? AND message_id IN (?)",
            "SELECT CAST(count(*) AS SIGNED), CAST(count(processed_at) AS SIGNED), \
             CAST(count(CASE WHEN processed_at IS NULL AND claimed_until > UTC_TIMESTAMP(6) THEN \
             1 END) AS SIGNED) FROM `billing`.`inbox` WHERE consumer = ? AND message_id IN (?) \
             LOCK IN SHARE MODE",
            "INSERT INTO `billing`.`inbox` (message_id, consumer, received_at, claimed_until, \
             attempts) VALUES (?, ?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL (? * 1000) \
             MICROSECOND, 1)",
            "UPDATE `billing`.`inbox` SET claimed_until = UTC_TIMESTAMP(6) + INTERVAL (? * 1000) \
             MICROSECOND, attempts = attempts + 1 WHERE message_id = ? AND consumer = ? AND \
             attempts = ? AND processed_at IS NULL AND (claimed_until IS NULL OR claimed_until <= \
             UTC_TIMESTAMP(6))",
            "UPDATE `billing`.`inbox` SET processed_at = UTC_TIMESTAMP(6), claimed_until = NULL \
             WHERE message_id = ? AND consumer = ? AND attempts = ? AND processed_at IS NULL",
            "UPDATE `billing`.`inbox` SET claimed_until = NULL WHERE message_id = ? AND consumer \
             = ? AND attempts = ? AND processed_at IS NULL",
        ]
    );

    #[cfg(feature = "sqlite")]
    assert_eq!(
        rendered::<diesel::sqlite::Sqlite>(),
        [
            "SELECT CAST(CASE WHEN processed_at IS NOT NULL THEN 0 WHEN claimed_until IS NULL \
             THEN 1 WHEN claimed_until > strftime('%Y-%m-%d %H:%M:%f', 'now') THEN 2 ELSE 3 END \
             AS BIGINT), CAST(attempts AS BIGINT), CAST(CASE WHEN claimed_until > \
             strftime('%Y-%m-%d %H:%M:%f', 'now') THEN (julianday(claimed_until) - \
             julianday('now')) * 86400000.0 ELSE 0 END AS BIGINT) FROM `billing`.`inbox` WHERE \
             message_id = ? AND consumer = ?",
            "SELECT CAST(count(*) AS BIGINT), CAST(count(processed_at) AS BIGINT), \
             CAST(count(CASE WHEN processed_at IS NULL AND claimed_until > strftime('%Y-%m-%d \
             %H:%M:%f', 'now') THEN 1 END) AS BIGINT) FROM `billing`.`inbox` WHERE consumer = ? \
             AND message_id IN (?)",
            "INSERT INTO `billing`.`inbox` (message_id, consumer, received_at, claimed_until, \
             attempts) VALUES (?, ?, CURRENT_TIMESTAMP, strftime('%Y-%m-%d %H:%M:%f', 'now', (? / \
             1000.0) || ' seconds'), 1) ON CONFLICT (message_id, consumer) DO NOTHING",
            "UPDATE `billing`.`inbox` SET claimed_until = strftime('%Y-%m-%d %H:%M:%f', 'now', (? \
             / 1000.0) || ' seconds'), attempts = attempts + 1 WHERE message_id = ? AND consumer \
             = ? AND attempts = ? AND processed_at IS NULL AND (claimed_until IS NULL OR \
             claimed_until <= strftime('%Y-%m-%d %H:%M:%f', 'now'))",
            "UPDATE `billing`.`inbox` SET processed_at = CURRENT_TIMESTAMP, claimed_until = NULL \
             WHERE message_id = ? AND consumer = ? AND attempts = ? AND processed_at IS NULL",
            "UPDATE `billing`.`inbox` SET claimed_until = NULL WHERE message_id = ? AND consumer \
             = ? AND attempts = ? AND processed_at IS NULL",
        ]
    );
}
