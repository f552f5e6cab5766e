//! Traces and metrics of real handler runs on SQLite: spans exported through
//! `tracing-opentelemetry` to the OpenTelemetry SDK's in-memory exporter, with the messaging
//! conventions' attributes asserted; metrics captured by `metrics-util`'s debugging recorder.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use diesel::SqliteConnection;
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use inbox_diesel::telemetry::process_span;
use inbox_diesel::{InboxSchema, MessageKey, idempotent};
use inbox_tests::AppError;
use inbox_tests::sqlite::SqliteDb as Db;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use opentelemetry::trace::{SpanKind, Status, TracerProvider as _};
use opentelemetry::{KeyValue, Value};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use tracing_subscriber::layer::SubscriberExt;

#[idempotent(consumer = "telemetry", key = *id)]
fn credit(conn: &mut SqliteConnection, id: &u64, fail: bool) -> Result<(), AppError> {
    diesel::sql_query("UPDATE accounts SET balance = balance + 1 WHERE id = 1").execute(conn)?;
    if fail {
        return Err(AppError::Rejected);
    }
    Ok(())
}

/// `credit` that does not wait for another writer: a busy database is retried at once.
#[idempotent(consumer = "telemetry", key = *id, busy_timeout_ms = 0, retries = 20)]
fn credit_impatient(conn: &mut SqliteConnection, id: &u64) -> Result<(), AppError> {
    diesel::sql_query("UPDATE accounts SET balance = balance + 1 WHERE id = 1").execute(conn)?;
    Ok(())
}

#[idempotent(consumer = "telemetry-emails", key = email)]
fn welcome(conn: &mut SqliteConnection, email: &str) -> Result<(), AppError> {
    diesel::sql_query("UPDATE accounts SET balance = balance + 1 WHERE id = 2").execute(conn)?;
    Ok(())
}

#[idempotent(consumer = "telemetry-batch", batch = ids, key = |id| *id)]
fn credit_all(conn: &mut SqliteConnection, ids: &[u64]) -> Result<(), AppError> {
    for _ in ids {
        diesel::sql_query("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
            .execute(conn)?;
    }
    Ok(())
}

#[idempotent(consumer = "telemetry-mail", key = *id, mode = "claim")]
fn send(
    conn: &mut SqliteConnection,
    id: &u64,
    sent: &AtomicUsize,
    crash: bool,
) -> Result<(), AppError> {
    if crash {
        panic!("the process dies around the side effect");
    }
    sent.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

/// Runs `f` with a subscriber that exports every span to memory; returns the spans.
fn traced(f: impl FnOnce()) -> Vec<SpanData> {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("inbox-tests")));
    tracing::subscriber::with_default(subscriber, f);
    provider.force_flush().unwrap();
    exporter.get_finished_spans().unwrap()
}

fn attributes(span: &SpanData) -> HashMap<String, Value> {
    span.attributes
        .iter()
        .map(|KeyValue { key, value, .. }| (key.to_string(), value.clone()))
        .collect()
}

fn text(attributes: &HashMap<String, Value>, key: &str) -> String {
    match attributes.get(key) {
        Some(value) => value.as_str().into_owned(),
        None => panic!("no attribute {key} in {attributes:?}"),
    }
}

fn int(attributes: &HashMap<String, Value>, key: &str) -> i64 {
    match attributes.get(key) {
        Some(Value::I64(n)) => *n,
        other => panic!("attribute {key} is {other:?} in {attributes:?}"),
    }
}

/// A handler called directly: one span named `process`, a consumer span, with the
/// conventions' attributes and the outcome; the stored id as `inbox.stored_id` (the broker's
/// id, `messaging.message.id`, is a pump's to record).
#[test]
fn a_direct_run_is_one_consumer_span_with_the_conventions_attributes() {
    let db = Db::new("telemetry");
    let mut conn = db.connect();
    let spans = traced(|| {
        assert!(credit(&mut conn, &7, false).unwrap().is_processed());
        assert!(credit(&mut conn, &7, false).unwrap().is_duplicate());
    });
    assert_eq!(spans.len(), 2, "{spans:#?}");
    let stored = MessageKey::from(7u64).stored_id().to_string();
    for (span, outcome) in spans.iter().zip(["processed", "duplicate"]) {
        assert_eq!(span.name, "process");
        assert_eq!(span.span_kind, SpanKind::Consumer);
        assert_eq!(span.status, Status::Unset);
        let attributes = attributes(span);
        assert_eq!(text(&attributes, "messaging.operation.name"), "process");
        assert_eq!(text(&attributes, "messaging.operation.type"), "process");
        assert_eq!(
            text(&attributes, "messaging.consumer.group.name"),
            "telemetry"
        );
        assert_eq!(text(&attributes, "inbox.stored_id"), stored);
        assert!(
            !attributes.contains_key("messaging.message.id"),
            "{attributes:?}"
        );
        assert_eq!(text(&attributes, "inbox.outcome"), outcome);
        assert_eq!(text(&attributes, "inbox.mode"), "marker");
        assert_eq!(int(&attributes, "inbox.attempt"), 1);
        assert!(!attributes.contains_key("error.type"), "{attributes:?}");
        assert!(
            !attributes.contains_key("messaging.system"),
            "{attributes:?}"
        );
    }
}

/// Under a pump's span (`process_span`), the runtime records into it: one span per
/// delivery, named `process {destination}`, with the pump's and the runtime's attributes.
#[test]
fn under_a_pumps_span_a_delivery_is_one_span() {
    let db = Db::new("telemetry");
    let mut conn = db.connect();
    let spans = traced(|| {
        process_span("rabbitmq", "credits", 3).in_scope(|| {
            assert!(credit(&mut conn, &8, false).unwrap().is_processed());
        });
    });
    assert_eq!(spans.len(), 1, "{spans:#?}");
    let span = &spans[0];
    assert_eq!(span.name, "process credits");
    assert_eq!(span.span_kind, SpanKind::Consumer);
    let attributes = attributes(span);
    assert_eq!(text(&attributes, "messaging.system"), "rabbitmq");
    assert_eq!(text(&attributes, "messaging.destination.name"), "credits");
    assert_eq!(text(&attributes, "messaging.operation.type"), "process");
    assert_eq!(
        text(&attributes, "messaging.consumer.group.name"),
        "telemetry"
    );
    assert_eq!(
        text(&attributes, "inbox.stored_id"),
        MessageKey::from(8u64).stored_id().to_string()
    );
    assert_eq!(int(&attributes, "inbox.delivery_count"), 3);
    assert_eq!(text(&attributes, "inbox.outcome"), "processed");
}

#[idempotent(consumer = "telemetry-async", key = *id)]
async fn credit_async(
    conn: &mut diesel_async::sync_connection_wrapper::SyncConnectionWrapper<SqliteConnection>,
    id: &u64,
) -> Result<(), AppError> {
    diesel_async::RunQueryDsl::execute(
        diesel::sql_query("UPDATE accounts SET balance = balance + 1 WHERE id = 1"),
        conn,
    )
    .await?;
    Ok(())
}

/// The same for an `async fn` handler awaited in a pump's span (`Instrument`): one span
/// per delivery, whichever thread polls it.
#[test]
fn an_async_run_in_a_pumps_span_is_one_span() {
    use tracing::Instrument;
    let db = Db::new("telemetry");
    let spans = traced(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let mut conn = db.connect_async().await;
            for id in [1, 1] {
                let _ = credit_async(&mut conn, &id)
                    .instrument(process_span("nats", "orders", 1))
                    .await
                    .unwrap();
            }
        });
    });
    assert_eq!(spans.len(), 2, "{spans:#?}");
    for (span, outcome) in spans.iter().zip(["processed", "duplicate"]) {
        assert_eq!(span.name, "process orders");
        let attributes = attributes(span);
        assert_eq!(text(&attributes, "messaging.system"), "nats");
        assert_eq!(
            text(&attributes, "messaging.consumer.group.name"),
            "telemetry-async"
        );
        assert_eq!(text(&attributes, "inbox.outcome"), outcome);
    }
}

/// A failure sets `error.type` (the handler's own error; the class of an inbox fault) and
/// the span's status.
#[test]
fn a_failure_has_an_error_type_and_an_error_status() {
    let db = Db::new("telemetry");
    let mut conn = db.connect();
    let spans = traced(|| {
        assert!(matches!(
            credit(&mut conn, &9, true),
            Err(AppError::Rejected)
        ));
    });
    let attributes_of_handler_error = attributes(&spans[0]);
    assert_eq!(text(&attributes_of_handler_error, "error.type"), "handler");
    assert_eq!(
        text(&attributes_of_handler_error, "inbox.outcome"),
        "failed"
    );
    assert!(
        matches!(spans[0].status, Status::Error { .. }),
        "{:?}",
        spans[0].status
    );

    db.connect().batch_execute("DROP TABLE inbox").unwrap();
    let mut conn = db.connect();
    let spans = traced(|| {
        assert!(credit(&mut conn, &9, false).is_err());
    });
    let attributes = attributes(&spans[0]);
    assert_eq!(text(&attributes, "error.type"), "schema");
    assert_eq!(text(&attributes, "inbox.outcome"), "failed");
    assert!(matches!(spans[0].status, Status::Error { .. }));
}

/// A key that is business data (an e-mail address) never reaches an attribute: the span
/// carries the stored id.
#[test]
fn the_raw_key_is_never_an_attribute() {
    let db = Db::new("telemetry");
    let mut conn = db.connect();
    let spans = traced(|| {
        assert!(
            welcome(&mut conn, "alice@example.com")
                .unwrap()
                .is_processed()
        );
    });
    let attributes = attributes(&spans[0]);
    for (key, value) in &attributes {
        assert!(
            !value.as_str().contains("alice"),
            "{key} = {value:?} carries the raw key"
        );
    }
    let stored = MessageKey::try_from("alice@example.com")
        .unwrap()
        .stored_id()
        .to_string();
    assert_eq!(text(&attributes, "inbox.stored_id"), stored);
}

/// A batch: `messaging.batch.message_count`, no single message id.
#[test]
fn a_batch_has_its_message_count() {
    let db = Db::new("telemetry");
    let mut conn = db.connect();
    let spans = traced(|| {
        let outcome = credit_all(&mut conn, &[1, 2, 3]).unwrap();
        assert_eq!(outcome.processed.len(), 3);
    });
    let attributes = attributes(&spans[0]);
    assert_eq!(int(&attributes, "messaging.batch.message_count"), 3);
    assert_eq!(text(&attributes, "inbox.outcome"), "processed");
    assert!(!attributes.contains_key("inbox.stored_id"));
}

/// Claim mode: the claim's attempt; a claim taken over after its lease ended is attempt 2.
#[test]
fn claim_mode_records_the_claims_attempt() {
    let db = Db::new("telemetry");
    let mut conn = db.connect();
    let sent = AtomicUsize::new(0);
    let crashed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = send(&mut conn, &5, &sent, true);
    }));
    assert!(crashed.is_err());
    expire_claims(&db);
    let spans = traced(|| {
        assert!(send(&mut conn, &5, &sent, false).unwrap().is_processed());
    });
    let attributes = attributes(&spans[0]);
    assert_eq!(text(&attributes, "inbox.mode"), "claim");
    assert_eq!(int(&attributes, "inbox.attempt"), 2);
    assert_eq!(text(&attributes, "inbox.outcome"), "processed");
    assert_eq!(sent.load(Ordering::SeqCst), 1);
}

fn expire_claims(db: &Db) {
    db.connect()
        .batch_execute(
            "UPDATE inbox SET claimed_until = '2000-01-01 00:00:00.000' \
             WHERE processed_at IS NULL",
        )
        .unwrap();
}

/// The series a run records, by name and labels.
type Series = HashMap<(String, Vec<(String, String)>), DebugValue>;

/// Runs `f` with a recorder of this thread's metrics; returns what it recorded.
fn measured(f: impl FnOnce()) -> Series {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, f);
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let mut labels: Vec<(String, String)> = key
                .key()
                .labels()
                .map(|label| (label.key().to_owned(), label.value().to_owned()))
                .collect();
            labels.sort();
            ((key.key().name().to_owned(), labels), value)
        })
        .collect()
}

fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut labels: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    labels.sort();
    labels
}

fn counter(series: &Series, name: &str, pairs: &[(&str, &str)]) -> u64 {
    match series.get(&(name.to_owned(), labels(pairs))) {
        Some(DebugValue::Counter(n)) => *n,
        other => panic!(
            "{name} {pairs:?} is {other:?}; recorded: {:#?}",
            series.keys()
        ),
    }
}

fn samples(series: &Series, name: &str, pairs: &[(&str, &str)]) -> usize {
    match series.get(&(name.to_owned(), labels(pairs))) {
        Some(DebugValue::Histogram(samples)) => samples.len(),
        other => panic!(
            "{name} {pairs:?} is {other:?}; recorded: {:#?}",
            series.keys()
        ),
    }
}

const GROUP: &str = "messaging.consumer.group.name";

/// Outcomes by consumer and kind, the duration histogram, messages consumed.
#[test]
fn runs_are_counted_by_outcome_and_timed() {
    let db = Db::new("telemetry");
    let mut conn = db.connect();
    let series = measured(|| {
        let _ = credit(&mut conn, &1, false).unwrap();
        let _ = credit(&mut conn, &1, false).unwrap();
        let _ = credit(&mut conn, &2, false).unwrap();
        credit(&mut conn, &3, true).unwrap_err();
        let _ = credit_all(&mut conn, &[10, 11, 12, 13]).unwrap();
    });
    let processed = [(GROUP, "telemetry"), ("inbox.outcome", "processed")];
    assert_eq!(counter(&series, "inbox.outcomes", &processed), 2);
    assert_eq!(
        counter(
            &series,
            "inbox.outcomes",
            &[(GROUP, "telemetry"), ("inbox.outcome", "duplicate")]
        ),
        1
    );
    assert_eq!(
        counter(
            &series,
            "inbox.outcomes",
            &[
                (GROUP, "telemetry"),
                ("inbox.outcome", "failed"),
                ("error.type", "handler")
            ]
        ),
        1
    );
    assert_eq!(
        samples(&series, "messaging.process.duration", &processed),
        2
    );
    assert_eq!(
        samples(
            &series,
            "messaging.process.duration",
            &[(GROUP, "telemetry"), ("inbox.outcome", "failed")]
        ),
        1
    );
    assert_eq!(
        counter(
            &series,
            "messaging.client.consumed.messages",
            &[(GROUP, "telemetry")]
        ),
        4
    );
    assert_eq!(
        counter(
            &series,
            "messaging.client.consumed.messages",
            &[(GROUP, "telemetry-batch")]
        ),
        4
    );
}

/// A transaction retried after a busy database counts under its class; the run then
/// succeeds.
#[test]
fn retries_are_counted_by_class() {
    let db = Db::new("telemetry");
    let mut conn = db.connect();
    let mut holder = db.connect();
    holder.batch_execute("BEGIN IMMEDIATE").unwrap();
    let release = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        holder.batch_execute("COMMIT").unwrap();
    });
    let series = measured(|| {
        assert!(credit_impatient(&mut conn, &1).unwrap().is_processed());
    });
    release.join().unwrap();
    let retries = counter(
        &series,
        "inbox.retries",
        &[(GROUP, "telemetry"), ("error.type", "transient")],
    );
    assert!(retries >= 1, "{retries}");
}

/// A claim whose lease ended without completion, taken over; rows removed by a purge.
#[test]
fn stale_claims_and_purged_rows_are_counted() {
    let db = Db::new("telemetry");
    let mut conn = db.connect();
    let sent = AtomicUsize::new(0);
    let crashed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = send(&mut conn, &5, &sent, true);
    }));
    assert!(crashed.is_err());
    expire_claims(&db);
    db.seed_archive(6);
    let series = measured(|| {
        assert!(send(&mut conn, &5, &sent, false).unwrap().is_processed());
        let report = inbox_diesel::purge::purge(
            &mut conn,
            &InboxSchema::DEFAULT,
            &inbox_diesel::purge::Purge::older_than(Duration::from_secs(86_400)),
        )
        .unwrap();
        assert_eq!(report.removed, 6);
    });
    assert_eq!(
        counter(
            &series,
            "inbox.stale_claims",
            &[(GROUP, "telemetry-mail"), ("inbox.action", "taken_over")]
        ),
        1
    );
    assert_eq!(
        counter(&series, "inbox.purged", &[("inbox.table", "inbox")]),
        6
    );
}

/// The series as a Prometheus exporter renders them (the names the README lists).
#[test]
fn a_prometheus_exporter_renders_the_series() {
    let db = Db::new("telemetry");
    let mut conn = db.connect();
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        inbox_diesel::telemetry::describe_metrics();
        let _ = credit(&mut conn, &1, false).unwrap();
        let _ = credit(&mut conn, &1, false).unwrap();
    });
    let text = handle.render();
    for series in [
        "# TYPE messaging_process_duration summary",
        "messaging_process_duration_count{messaging_consumer_group_name=\"telemetry\",inbox_outcome=\"processed\"} 1",
        "# TYPE messaging_client_consumed_messages counter",
        "messaging_client_consumed_messages{messaging_consumer_group_name=\"telemetry\"} 2",
        "inbox_outcomes{messaging_consumer_group_name=\"telemetry\",inbox_outcome=\"duplicate\"} 1",
    ] {
        assert!(text.contains(series), "missing {series} in\n{text}");
    }
}

/// A pump's settlements are counted by system and kind: a dead letter apart from a retry.
#[test]
fn settlements_are_counted_by_kind() {
    use inbox_diesel::Settlement;
    use inbox_diesel::telemetry::record_settlement;
    let series = measured(|| {
        let span = process_span("rabbitmq", "credits", 1);
        record_settlement(&span, "rabbitmq", Settlement::DeadLetter);
        record_settlement(&span, "rabbitmq", Settlement::Retry { reconnect: false });
        record_settlement(&span, "rabbitmq", Settlement::Retry { reconnect: true });
    });
    let of = |settlement| {
        counter(
            &series,
            "inbox.settlements",
            &[
                ("messaging.system", "rabbitmq"),
                ("inbox.settlement", settlement),
            ],
        )
    };
    assert_eq!(of("dead_letter"), 1);
    assert_eq!(of("retry"), 2);
}
