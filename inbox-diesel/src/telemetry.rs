//! Traces and metrics of handler runs, in the OpenTelemetry messaging conventions.
//!
//! **Spans.** Each handler run is one span in the [OpenTelemetry semantic conventions for
//! messaging spans, v1.40.0][semconv] (status: Development), with these attributes:
//!
//! | attribute | value |
//! |---|---|
//! | span name (`otel.name`) | `process {destination}` under a pump's [`process_span`]; `process` when the handler is called directly |
//! | `otel.kind` | `consumer` |
//! | `messaging.operation.name`, `messaging.operation.type` | `process` |
//! | `messaging.system`, `messaging.destination.name` | what the pump passed to [`process_span`] (`rabbitmq` and the queue, `nats` and the subject or stream) |
//! | `messaging.consumer.group.name` | the handler's consumer (`credit`) |
//! | `messaging.message.id` | the broker's id of the message, recorded by the pump: RabbitMQ's `message_id`, NATS's `Nats-Msg-Id` (else the stream sequence), Kafka's `message-id` header, SQS's `MessageId` |
//! | `inbox.stored_id` | the **stored id** (a UUID) the inbox's row has: never the raw key, which can be business data |
//! | `messaging.rabbitmq.destination.routing_key` | the routing key a RabbitMQ delivery was published with |
//! | `messaging.destination.partition.id`, `messaging.kafka.offset` | a Kafka record's partition and offset |
//! | `messaging.batch.message_count` | the number of messages of a batch handler |
//! | `inbox.outcome` | `processed`, `duplicate`, `in_flight`, `stale_claim` or `failed` |
//! | `inbox.attempt` | transactions run (marker mode: 1 + the retries of transient failures); the claim's attempt (claim mode) |
//! | `inbox.delivery_count` | the broker's delivery count, under a pump's span |
//! | `inbox.settlement` | how the pump settled the delivery: `ack`, `retry`, `dead_letter`, `halt` ([`record_settlement`]) |
//! | `error.type`, `otel.status_code` | on failure: the [`ErrorClass`] label (`transient`, `read_only`, …) or `handler` for the handler's own error, and `ERROR` |
//!
//! The spans are [`tracing`] spans: with [`tracing-opentelemetry`] as a layer they become
//! OpenTelemetry spans with those attributes; with a plain `fmt` subscriber they are the
//! context of the runtime's log lines. A message pump opens [`process_span`] around the
//! handler; the runtime then records into that span instead of opening one of its own, so
//! that a delivery is one span.
//!
//! **Metrics** (feature `metrics`), through the [`metrics`] facade — any exporter (Prometheus,
//! OpenTelemetry, StatsD) installed as the recorder receives them:
//!
//! | series | kind | labels |
//! |---|---|---|
//! | `messaging.process.duration` | histogram, seconds | `messaging.consumer.group.name`, `inbox.outcome` |
//! | `messaging.client.consumed.messages` | counter (messages) | `messaging.consumer.group.name` |
//! | `inbox.outcomes` | counter (runs) | `messaging.consumer.group.name`, `inbox.outcome`, `error.type` (on `failed`) |
//! | `inbox.retries` | counter (transactions retried in the run) | `messaging.consumer.group.name`, `error.type` |
//! | `inbox.stale_claims` | counter (claims whose lease ended without completion) | `messaging.consumer.group.name`, `inbox.action` (`taken_over`, `reported`) |
//! | `inbox.purged` | counter (rows) | `inbox.table` |
//! | `inbox.settlements` | counter (deliveries a pump settled) | `messaging.system`, `inbox.settlement` (`ack`, `retry`, `dead_letter`, `halt`) |
//!
//! [semconv]: https://opentelemetry.io/docs/specs/semconv/messaging/messaging-spans/
//! [`tracing-opentelemetry`]: https://docs.rs/tracing-opentelemetry
//! [`metrics`]: https://docs.rs/metrics
//! [`ErrorClass`]: crate::ErrorClass

use inbox_core::{BatchOutcome, ErrorClass, HandlerOutcome, MessageKey};
use tracing::Span;
use tracing::field::Empty;

use crate::spec::HandlerSpec;

/// The version of the OpenTelemetry semantic conventions the spans and metrics follow.
pub const SEMCONV_VERSION: &str = "1.40.0";

/// The span of one delivery, for a message pump to run the handler in: named
/// `process {destination}`, with `messaging.system` and `messaging.destination.name` set,
/// and the attributes the runtime records (the consumer, the stored id, the outcome, the
/// attempt, `error.type`) declared for it to fill.
///
/// ```
/// use inbox_diesel::telemetry::process_span;
/// use tracing::Instrument;
///
/// # async fn handle() {}
/// # async fn pump() {
/// let span = process_span("rabbitmq", "credits", 1);
/// handle().instrument(span).await;
/// # }
/// ```
pub fn process_span(system: &'static str, destination: &str, delivery_count: u32) -> Span {
    tracing::info_span!(
        "process",
        otel.name = format!("process {destination}"),
        otel.kind = "consumer",
        otel.status_code = Empty,
        messaging.system = system,
        messaging.operation.name = "process",
        messaging.operation.type = "process",
        messaging.destination.name = destination,
        messaging.consumer.group.name = Empty,
        messaging.message.id = Empty,
        messaging.batch.message_count = Empty,
        messaging.rabbitmq.destination.routing_key = Empty,
        messaging.destination.partition.id = Empty,
        messaging.kafka.offset = Empty,
        inbox.stored_id = Empty,
        inbox.delivery_count = i64::from(delivery_count),
        inbox.outcome = Empty,
        inbox.attempt = Empty,
        inbox.settlement = Empty,
        error.type = Empty,
    )
}

/// Tells a pump's [`Outage`](crate::Outage) how the delivery it let through settled, and
/// logs, in the delivery's span, a pause that settlement began. A panic (`panicked`) is the
/// handler's, not the database's: it neither closes the gate nor counts towards closing it,
/// and is told as a settlement that is no database failure (a dead letter's), which opens it.
pub fn record_outage(
    span: &Span,
    outage: &inbox_core::Outage,
    settlement: inbox_core::Settlement,
    panicked: bool,
) {
    let seen = match panicked {
        true => inbox_core::Settlement::DeadLetter,
        false => settlement,
    };
    if let Some(pause) = outage.settled(seen) {
        span.in_scope(|| {
            tracing::warn!(
                pause_ms = u64::try_from(pause.as_millis()).unwrap_or(u64::MAX),
                in_a_row = outage.in_a_row(),
                "the database failed deliveries in a row (a connection needed, or a \
                 transient failure past the handler's retries, as a table lock gives); no \
                 handler starts until the pause has passed, then one tries"
            );
        });
    }
}

/// An error that ends a request or a delivery without reaching the application's code — a
/// pump that dead-letters or halts on a handler's answer, an HTTP request answered 500 —
/// where no [`tracing`] subscriber is installed to show the event the crate emits for it:
/// written to standard error, once per occurrence, so that it is never silent. With any
/// subscriber (global, or scoped to the thread) nothing is written here; the event is the
/// record. For the integration crates (`inbox-lapin`, `inbox-nats`, `inbox-axum`).
pub fn unseen(what: std::fmt::Arguments<'_>) {
    let silent = tracing::dispatcher::get_default(|dispatch| {
        dispatch.is::<tracing::subscriber::NoSubscriber>()
    });
    if silent {
        eprintln!(
            "inbox: {what} (no tracing subscriber is installed: install one to see this as an event, with its span)"
        );
    }
}

/// The text of `error` and of each of its sources, `: `-separated, for [`unseen`].
pub fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        // A cause whose words the error before it says already (an inbox database error
        // says the server's message) is not said twice.
        let words = cause.to_string();
        if !text.ends_with(&words) {
            text.push_str(": ");
            text.push_str(&words);
        }
        source = cause.source();
    }
    text
}

/// Records on a delivery's span ([`process_span`]) how the pump settled it: `ack`, `retry`,
/// `dead_letter` or `halt` ([`Settlement::as_str`](crate::Settlement::as_str)).
///
/// A delivery dead-lettered (never delivered again) is also logged as a warning in the span,
/// and with the feature `metrics` each settlement is counted in `inbox.settlements`, labelled
/// `messaging.system` and `inbox.settlement`: dead letters can be alerted on apart from
/// retries.
pub fn record_settlement(span: &Span, system: &'static str, settlement: inbox_core::Settlement) {
    record(span, "inbox.settlement", settlement.as_str());
    if settlement == inbox_core::Settlement::DeadLetter {
        span.in_scope(|| {
            tracing::warn!(
                settlement = settlement.as_str(),
                "the delivery is dead-lettered: it will not be delivered to this consumer again"
            );
        });
    }
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "inbox.settlements",
        "messaging.system" => system,
        "inbox.settlement" => settlement.as_str(),
    )
    .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = system;
}

/// Records `value` on `span` — unless no subscriber wants the span: a disabled span still
/// looks each field up by name, a cost on every delivery of a process without tracing.
fn record(span: &Span, field: &str, value: impl tracing::Value) {
    if !span.is_disabled() {
        span.record(field, value);
    }
}

/// Whether `span` is a delivery's span ([`process_span`], or the runtime's own).
fn is_process_span(span: &Span) -> bool {
    span.field("inbox.outcome").is_some() && span.field("messaging.operation.type").is_some()
}

/// One handler run: its span, and (feature `metrics`) when it started.
pub(crate) struct Run {
    /// The span the runtime records into.
    span: Span,
    /// Whether `span` is the runtime's own (to enter) or a pump's, already entered.
    own: bool,
    consumer: &'static str,
    #[cfg(feature = "metrics")]
    started: std::time::Instant,
}

impl Run {
    /// A run of one message.
    pub(crate) fn message(spec: &'static HandlerSpec, key: &MessageKey, claim: bool) -> Self {
        let run = Self::start(spec, claim);
        record(
            &run.span,
            "inbox.stored_id",
            tracing::field::display(key.stored_id()),
        );
        #[cfg(feature = "metrics")]
        consumed(run.consumer, 1);
        run
    }

    /// A run of a batch of `len` messages.
    pub(crate) fn batch(spec: &'static HandlerSpec, len: usize) -> Self {
        let run = Self::start(spec, false);
        record(
            &run.span,
            "messaging.batch.message_count",
            i64::try_from(len).unwrap_or(i64::MAX),
        );
        #[cfg(feature = "metrics")]
        consumed(run.consumer, len as u64);
        run
    }

    /// A run refused before it began: its key is invalid. Returns `error`.
    pub(crate) fn invalid_key<E>(spec: &'static HandlerSpec, error: E) -> E {
        let run = Self::start(spec, false);
        fail(&run.span, spec, "invalid_key");
        run.end("failed");
        error
    }

    fn start(spec: &'static HandlerSpec, claim: bool) -> Self {
        let consumer = spec.consumer.as_str();
        let current = Span::current();
        let (span, own) = if is_process_span(&current) {
            (current, false)
        } else {
            let span = tracing::info_span!(
                "inbox",
                otel.name = "process",
                otel.kind = "consumer",
                otel.status_code = Empty,
                messaging.operation.name = "process",
                messaging.operation.type = "process",
                messaging.consumer.group.name = Empty,
                messaging.batch.message_count = Empty,
                inbox.stored_id = Empty,
                inbox.mode = if claim { "claim" } else { "marker" },
                inbox.outcome = Empty,
                inbox.attempt = Empty,
                error.type = Empty,
            );
            (span, true)
        };
        record(&span, "messaging.consumer.group.name", consumer);
        Self {
            span,
            own,
            consumer,
            #[cfg(feature = "metrics")]
            started: std::time::Instant::now(),
        }
    }

    /// The span to run the driver in: the runtime's own, or none when a pump's span is
    /// already the current one (the driver's records then reach it as `Span::current()`).
    pub(crate) fn instrument_span(&self) -> Span {
        if self.own {
            self.span.clone()
        } else {
            Span::none()
        }
    }

    /// Records how a single message's run ended.
    pub(crate) fn finish<T, A: HandlerOutcome<T>, E>(self, result: &Result<A, E>) {
        let outcome = match result {
            Ok(outcome) => outcome.label(),
            Err(_) => "failed",
        };
        self.end(outcome);
    }

    /// Records how a batch's run ended.
    pub(crate) fn finish_batch<T, E>(self, result: &Result<BatchOutcome<T>, E>) {
        let outcome = match result {
            Ok(batch) if batch.value.is_some() => "processed",
            Ok(_) => "duplicate",
            Err(_) => "failed",
        };
        self.end(outcome);
    }

    fn end(self, outcome: &'static str) {
        record(&self.span, "inbox.outcome", outcome);
        #[cfg(feature = "metrics")]
        {
            let seconds = self.started.elapsed().as_secs_f64();
            metrics::histogram!(
                "messaging.process.duration",
                "messaging.consumer.group.name" => self.consumer,
                "inbox.outcome" => outcome,
            )
            .record(seconds);
            if outcome != "failed" {
                metrics::counter!(
                    "inbox.outcomes",
                    "messaging.consumer.group.name" => self.consumer,
                    "inbox.outcome" => outcome,
                )
                .increment(1);
            }
        }
        #[cfg(not(feature = "metrics"))]
        let _ = self.consumer;
    }
}

/// The `error.type` of a failure: the inbox's class of it, `handler` for the handler's own
/// error (`None`).
pub(crate) fn error_type(class: Option<&ErrorClass>) -> &'static str {
    class.map_or("handler", ErrorClass::label)
}

/// The run in the current span failed, with this [`error_type`].
pub(crate) fn failed(spec: &HandlerSpec, label: &'static str) {
    fail(&Span::current(), spec, label);
}

fn fail(span: &Span, spec: &HandlerSpec, label: &'static str) {
    record(span, "error.type", label);
    record(span, "otel.status_code", "ERROR");
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "inbox.outcomes",
        "messaging.consumer.group.name" => spec.consumer.as_str().to_owned(),
        "inbox.outcome" => "failed",
        "error.type" => label,
    )
    .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = spec;
}

/// The run in the current span made `attempt` attempts (marker mode: transactions; claim
/// mode: the claim's attempt).
pub(crate) fn attempt(attempt: u32) {
    // As i64: OpenTelemetry attributes have no unsigned integers.
    record(&Span::current(), "inbox.attempt", i64::from(attempt));
}

/// A transaction of the run is retried after a failure of `class`.
pub(crate) fn retried(spec: &HandlerSpec, class: &ErrorClass) {
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "inbox.retries",
        "messaging.consumer.group.name" => spec.consumer.as_str().to_owned(),
        "error.type" => class.label(),
    )
    .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (spec, class);
}

/// A claim whose lease ended without completion was taken over (`taken_over`) or reported
/// (`reported`).
pub(crate) fn stale_claim(spec: &HandlerSpec, action: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "inbox.stale_claims",
        "messaging.consumer.group.name" => spec.consumer.as_str().to_owned(),
        "inbox.action" => action,
    )
    .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (spec, action);
}

/// A purge removed `rows` rows from `table`.
pub(crate) fn purged(table: &str, rows: u64) {
    #[cfg(feature = "metrics")]
    metrics::counter!("inbox.purged", "inbox.table" => table.to_owned()).increment(rows);
    #[cfg(not(feature = "metrics"))]
    let _ = (table, rows);
}

#[cfg(feature = "metrics")]
fn consumed(consumer: &'static str, messages: u64) {
    metrics::counter!(
        "messaging.client.consumed.messages",
        "messaging.consumer.group.name" => consumer,
    )
    .increment(messages);
}

/// Describes the series to the installed recorder (units and help texts, which a
/// Prometheus exporter prints as `# HELP` and `# TYPE`). Call it once after installing the
/// recorder; the series are recorded without it.
#[cfg(feature = "metrics")]
pub fn describe_metrics() {
    use metrics::{Unit, describe_counter, describe_histogram};
    describe_histogram!(
        "messaging.process.duration",
        Unit::Seconds,
        "Duration of one handler run: check, transaction, body and commit"
    );
    describe_counter!(
        "messaging.client.consumed.messages",
        Unit::Count,
        "Messages handed to inbox handlers"
    );
    describe_counter!(
        "inbox.outcomes",
        Unit::Count,
        "Handler runs by outcome (processed, duplicate, in_flight, stale_claim, failed)"
    );
    describe_counter!(
        "inbox.retries",
        Unit::Count,
        "Transactions retried within a run, by the class of the failure"
    );
    describe_counter!(
        "inbox.stale_claims",
        Unit::Count,
        "Claims whose lease ended without completion, taken over or reported"
    );
    describe_counter!("inbox.purged", Unit::Count, "Inbox rows removed by purges");
    describe_counter!(
        "inbox.settlements",
        Unit::Count,
        "Deliveries a message pump settled, by settlement (ack, retry, dead_letter, halt)"
    );
}
