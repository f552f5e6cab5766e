//! The pump against a real RabbitMQ (`INBOX_TEST_AMQP`, by default the local broker with
//! guest/guest) and a real SQLite inbox: every message applied once though published twice,
//! each settlement done by the broker, a graceful shutdown that loses nothing. Each test
//! declares queues of its own and deletes them. An unreachable broker fails the suite.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use inbox_diesel::{
    Action, InboxSchema, MessageKey, Outcome, Redelivery, Settle, Settlement, idempotent,
};
use inbox_lapin::{Pump, Stopped, key};
use lapin::options::{BasicPublishOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};

fn broker_url() -> String {
    std::env::var("INBOX_TEST_AMQP")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
}

async fn channel() -> (Connection, Channel) {
    let url = broker_url();
    let connection = Connection::connect(&url, ConnectionProperties::default())
        .await
        .unwrap_or_else(|e| panic!("RabbitMQ is not reachable at {url} (INBOX_TEST_AMQP): {e}"));
    let channel = connection.create_channel().await.unwrap();
    (connection, channel)
}

/// A quorum queue (delivery counts, a delivery limit) with a dead-letter queue, both named
/// for the test and the process.
struct Queues {
    name: String,
    dead: String,
}

impl Queues {
    async fn declare(channel: &Channel, test: &str) -> Self {
        Self::declare_with_limit(channel, test, 10).await
    }

    /// A quorum queue whose `x-delivery-limit` is `limit`.
    async fn declare_with_limit(channel: &Channel, test: &str, limit: i32) -> Self {
        let name = format!("inbox-lapin-{test}-{}", std::process::id());
        let dead = format!("{name}-dead");
        let durable = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        channel
            .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
            .await
            .unwrap();
        channel
            .queue_delete(dead.as_str().into(), QueueDeleteOptions::default())
            .await
            .unwrap();
        channel
            .queue_declare(dead.as_str().into(), durable, FieldTable::default())
            .await
            .unwrap();
        let mut arguments = FieldTable::default();
        arguments.insert(
            "x-queue-type".into(),
            AMQPValue::LongString("quorum".into()),
        );
        arguments.insert("x-delivery-limit".into(), AMQPValue::LongInt(limit));
        arguments.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString("".into()),
        );
        arguments.insert(
            "x-dead-letter-routing-key".into(),
            AMQPValue::LongString(dead.as_str().into()),
        );
        channel
            .queue_declare(name.as_str().into(), durable, arguments)
            .await
            .unwrap();
        Self { name, dead }
    }

    async fn publish(&self, channel: &Channel, message_id: Option<&str>, body: &str) {
        let mut properties = BasicProperties::default();
        if let Some(id) = message_id {
            properties = properties.with_message_id(id.into());
        }
        channel
            .basic_publish(
                "".into(),
                self.name.as_str().into(),
                BasicPublishOptions::default(),
                body.as_bytes(),
                properties,
            )
            .await
            .unwrap()
            .await
            .unwrap();
    }

    async fn depth(&self, channel: &Channel, queue: &str) -> u32 {
        channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap()
            .message_count()
    }

    async fn delete(self, channel: &Channel) {
        for queue in [&self.name, &self.dead] {
            let _ = channel
                .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                .await;
        }
    }
}

/// The business side: an SQLite file with the inbox and one row per applied message.
struct Store {
    _dir: tempfile::TempDir,
    url: String,
}

impl Store {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let url = dir.path().join("effects.sqlite").display().to_string();
        let mut conn = <SqliteConnection as diesel::Connection>::establish(&url).unwrap();
        conn.batch_execute(&inbox_diesel::schema::sqlite::create_table_sql(
            &InboxSchema::DEFAULT,
        ))
        .unwrap();
        conn.batch_execute("CREATE TABLE effects (message TEXT NOT NULL)")
            .unwrap();
        Self { _dir: dir, url }
    }

    fn connect(&self) -> SqliteConnection {
        <SqliteConnection as diesel::Connection>::establish(&self.url).unwrap()
    }

    /// How many times each message was applied, by message.
    fn effects(&self) -> Vec<(String, i64)> {
        #[derive(QueryableByName)]
        struct Row {
            #[diesel(sql_type = diesel::sql_types::Text)]
            message: String,
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            n: i64,
        }
        diesel::sql_query(
            "SELECT message, count(*) AS n FROM effects GROUP BY message ORDER BY message",
        )
        .load::<Row>(&mut self.connect())
        .unwrap()
        .into_iter()
        .map(|row| (row.message, row.n))
        .collect()
    }
}

#[idempotent(consumer = "credits", key = key)]
fn apply(
    conn: &mut SqliteConnection,
    key: &MessageKey,
    body: &str,
) -> Result<(), inbox_diesel::Error> {
    diesel::sql_query("INSERT INTO effects (message) VALUES (?)")
        .bind::<diesel::sql_types::Text, _>(body)
        .execute(conn)?;
    Ok(())
}

/// The handler as a pump calls it: the key off the delivery (a missing one is the inbox's
/// invalid key), the effect in SQLite.
fn handle(
    store: &Store,
    delivery: &lapin::message::Delivery,
) -> Result<Outcome<()>, inbox_diesel::Error> {
    let key = key(delivery).map_err(inbox_diesel::Error::InvalidKey)?;
    let body = String::from_utf8_lossy(&delivery.data).into_owned();
    apply(&mut store.connect(), &key, &body)
}

/// Every message published twice, as a publisher's retry does: each applied once, every
/// delivery acknowledged, the queue empty.
#[tokio::test]
async fn each_message_published_twice_is_applied_once() {
    let (_connection, channel) = channel().await;
    let queues = Queues::declare(&channel, "twice").await;
    for n in 0..20 {
        let id = format!("m{n:02}");
        queues.publish(&channel, Some(&id), &id).await;
        queues.publish(&channel, Some(&id), &id).await;
    }
    let store = Store::new();
    let pump = Pump::new().prefetch(8);
    let consumer = pump
        .subscribe(&channel, &queues.name, "twice")
        .await
        .unwrap();
    let acked = Arc::new(AtomicU32::new(0));
    let done = {
        let acked = acked.clone();
        async move {
            while acked.load(Ordering::SeqCst) < 40 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    let report = pump
        .run(&channel, consumer, done, |delivery| {
            let answer = handle(&store, &delivery);
            acked.fetch_add(1, Ordering::SeqCst);
            async move { answer }
        })
        .await
        .unwrap();
    assert_eq!(report.acked, 40, "{report:?}");
    let effects = store.effects();
    assert_eq!(effects.len(), 20);
    assert!(effects.iter().all(|(_, n)| *n == 1), "{effects:?}");
    assert_eq!(queues.depth(&channel, &queues.name).await, 0);
    queues.delete(&channel).await;
}

/// A message whose publisher set no `message_id` is refused (never given an id by the
/// consumer) and dead-lettered; the others are processed.
#[tokio::test]
async fn a_message_without_an_id_is_dead_lettered() {
    let (_connection, channel) = channel().await;
    let queues = Queues::declare(&channel, "no-id").await;
    queues.publish(&channel, None, "anonymous").await;
    queues.publish(&channel, Some("named"), "named").await;
    let store = Store::new();
    let pump = Pump::new();
    let consumer = pump
        .subscribe(&channel, &queues.name, "no-id")
        .await
        .unwrap();
    let seen = Arc::new(AtomicU32::new(0));
    let done = {
        let seen = seen.clone();
        async move {
            while seen.load(Ordering::SeqCst) < 2 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    let report = pump
        .run(&channel, consumer, done, |delivery| {
            let answer = handle(&store, &delivery);
            if let Err(e) = &answer {
                assert_eq!(e.settlement(), Settlement::DeadLetter);
                assert!(e.to_string().contains("invalid message key"));
            }
            seen.fetch_add(1, Ordering::SeqCst);
            async move { answer }
        })
        .await
        .unwrap();
    assert_eq!((report.acked, report.dead_lettered), (1, 1), "{report:?}");
    assert_eq!(store.effects(), [("named".to_owned(), 1)]);
    wait_for_depth(&queues, &channel, &queues.dead, 1).await;
    assert_eq!(queues.depth(&channel, &queues.name).await, 0);
    queues.delete(&channel).await;
}

/// A transient failure is requeued after the redelivery delay, counted by the quorum
/// queue, and processed on a later delivery.
#[tokio::test]
async fn a_transient_failure_is_retried_after_a_delay() {
    let (_connection, channel) = channel().await;
    let queues = Queues::declare(&channel, "retry").await;
    queues.publish(&channel, Some("flaky"), "flaky").await;
    let store = Store::new();
    let pump = Pump::new().redelivery(Redelivery::exponential(
        Duration::from_millis(200),
        Duration::from_secs(1),
    ));
    let consumer = pump
        .subscribe(&channel, &queues.name, "retry")
        .await
        .unwrap();
    let deliveries = Arc::new(AtomicU32::new(0));
    let counts = std::sync::Mutex::new(Vec::new());
    let done = {
        let store = &store;
        async move {
            while store.effects().is_empty() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let started = std::time::Instant::now();
    let report = pump
        .run(&channel, consumer, done, |delivery| {
            counts
                .lock()
                .unwrap()
                .push(inbox_lapin::delivery_count(&delivery));
            let answer: Result<Outcome<()>, Action> =
                match deliveries.fetch_add(1, Ordering::SeqCst) {
                    0 | 1 => Err(Action::RetryLater),
                    _ => handle(&store, &delivery).map_err(|e| e.action()),
                };
            async move { answer }
        })
        .await
        .unwrap();
    assert_eq!((report.retried, report.acked), (2, 1), "{report:?}");
    assert_eq!(*counts.lock().unwrap(), [1, 2, 3]);
    // 200 ms after the first delivery, 400 ms after the second.
    assert!(started.elapsed() >= Duration::from_millis(600));
    assert_eq!(store.effects(), [("flaky".to_owned(), 1)]);
    queues.delete(&channel).await;
}

/// A deployment fault halts the pump: that message goes back to the queue, unprocessed,
/// for when the fault is fixed.
#[tokio::test]
async fn a_deployment_fault_halts_and_keeps_the_message() {
    let (_connection, channel) = channel().await;
    let queues = Queues::declare(&channel, "halt").await;
    queues.publish(&channel, Some("one"), "one").await;
    let store = Store::new();
    store.connect().batch_execute("DROP TABLE inbox").unwrap();
    let pump = Pump::new();
    let consumer = pump
        .subscribe(&channel, &queues.name, "halt")
        .await
        .unwrap();
    let stopped = pump
        .run(&channel, consumer, std::future::pending(), |delivery| {
            let answer = handle(&store, &delivery);
            async move { answer }
        })
        .await
        .unwrap_err();
    match &stopped {
        Stopped::Halted { answer, report } => {
            assert!(answer.contains("Schema"), "{answer}");
            assert_eq!(report.halted, 1);
        }
        other => panic!("{other:?}"),
    }
    assert!(store.effects_table_is_empty());
    wait_for_depth(&queues, &channel, &queues.name, 1).await;
    queues.delete(&channel).await;
}

/// A shutdown while a handler runs: the handler finishes and its delivery is acknowledged;
/// what the channel had buffered goes back to the queue; nothing is lost.
#[tokio::test]
async fn a_shutdown_finishes_the_deliveries_in_hand() {
    let (_connection, channel) = channel().await;
    let queues = Queues::declare(&channel, "shutdown").await;
    for n in 0..10 {
        let id = format!("s{n}");
        queues.publish(&channel, Some(&id), &id).await;
    }
    let store = Store::new();
    let pump = Pump::new().prefetch(4);
    let consumer = pump
        .subscribe(&channel, &queues.name, "shutdown")
        .await
        .unwrap();
    let inside = Arc::new(tokio::sync::Notify::new());
    let shutdown = {
        let inside = inside.clone();
        async move { inside.notified().await }
    };
    let started = AtomicU32::new(0);
    let report = pump
        .run(&channel, consumer, shutdown, |delivery| {
            let first = started.fetch_add(1, Ordering::SeqCst) == 0;
            let inside = inside.clone();
            let store = &store;
            async move {
                if first {
                    // The shutdown comes while this handler is in hand.
                    inside.notify_one();
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                handle(store, &delivery)
            }
        })
        .await
        .unwrap();
    let processed = store.effects();
    assert!(!processed.is_empty());
    assert!(processed.iter().all(|(_, n)| *n == 1));
    assert_eq!(report.acked as usize, processed.len(), "{report:?}");
    wait_for_depth(&queues, &channel, &queues.name, 10 - processed.len() as u32).await;
    queues.delete(&channel).await;
}

impl Store {
    fn effects_table_is_empty(&self) -> bool {
        self.effects().is_empty()
    }
}

/// Waits until `queue` holds `n` messages (a settlement reaches the queue asynchronously).
async fn wait_for_depth(queues: &Queues, channel: &Channel, queue: &str, n: u32) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let depth = queues.depth(channel, queue).await;
        if depth == n {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{queue} holds {depth} messages, expected {n}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A shutdown while a retried delivery waits out its delay: requeued at once, not after
/// the delay.
#[tokio::test]
async fn a_shutdown_cuts_a_retry_delay_short() {
    let (_connection, channel) = channel().await;
    let queues = Queues::declare(&channel, "retry-shutdown").await;
    queues.publish(&channel, Some("slow"), "slow").await;
    let pump = Pump::new().redelivery(Redelivery::exponential(
        Duration::from_secs(60),
        Duration::from_secs(60),
    ));
    let consumer = pump
        .subscribe(&channel, &queues.name, "retry-shutdown")
        .await
        .unwrap();
    let answered = Arc::new(tokio::sync::Notify::new());
    let shutdown = {
        let answered = answered.clone();
        async move {
            answered.notified().await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let started = std::time::Instant::now();
    let report = pump
        .run(&channel, consumer, shutdown, |_delivery| {
            answered.notify_one();
            async { Err::<Outcome<()>, Action>(Action::RetryLater) }
        })
        .await
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(report.retried, 1, "{report:?}");
    wait_for_depth(&queues, &channel, &queues.name, 1).await;
    queues.delete(&channel).await;
}

/// The broker ends the consumer (its queue deleted): the pump says so rather than report a
/// shutdown nobody asked for.
#[tokio::test]
async fn a_consumer_the_broker_ends_stops_the_pump() {
    let (_connection, channel) = channel().await;
    let queues = Queues::declare(&channel, "deleted").await;
    let pump = Pump::new();
    let consumer = pump
        .subscribe(&channel, &queues.name, "deleted")
        .await
        .unwrap();
    let (_admin, admin) = self::channel().await;
    let name = queues.name.clone();
    let deleter = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        admin
            .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
            .await
            .unwrap();
    });
    let stopped = pump
        .run(
            &channel,
            consumer,
            std::future::pending(),
            |_delivery| async { Ok::<Outcome<()>, Action>(Outcome::Processed(())) },
        )
        .await
        .unwrap_err();
    assert!(matches!(stopped, Stopped::Cancelled { .. }), "{stopped:?}");
    deleter.await.unwrap();
    queues.delete(&channel).await;
}

/// Each delivery is one span in the OpenTelemetry messaging conventions, exported through
/// `tracing-opentelemetry`: `process {queue}`, the system, the queue, the delivery count,
/// the consumer, the stored id, the handler's outcome and the pump's settlement.
#[tokio::test]
async fn each_delivery_is_one_process_span() {
    use opentelemetry::trace::{SpanKind, TracerProvider as _};
    use tracing_subscriber::layer::SubscriberExt;

    let exporter = opentelemetry_sdk::trace::InMemorySpanExporter::default();
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("inbox-lapin")));
    let _default = tracing::subscriber::set_default(subscriber);

    let (_connection, channel) = channel().await;
    let queues = Queues::declare(&channel, "spans").await;
    queues.publish(&channel, Some("s1"), "s1").await;
    queues.publish(&channel, Some("s1"), "s1").await;
    let store = Store::new();
    let pump = Pump::new().prefetch(1);
    let consumer = pump
        .subscribe(&channel, &queues.name, "spans")
        .await
        .unwrap();
    let seen = Arc::new(AtomicU32::new(0));
    let done = {
        let seen = seen.clone();
        async move {
            while seen.load(Ordering::SeqCst) < 2 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    let report = pump
        .run(&channel, consumer, done, |delivery| {
            let answer = handle(&store, &delivery);
            seen.fetch_add(1, Ordering::SeqCst);
            async move { answer }
        })
        .await
        .unwrap();
    assert_eq!(report.acked, 2, "{report:?}");
    let queue = queues.name.clone();
    queues.delete(&channel).await;
    provider.force_flush().unwrap();

    let spans: Vec<_> = exporter
        .get_finished_spans()
        .unwrap()
        .into_iter()
        .filter(|span| span.name.starts_with("process"))
        .collect();
    assert_eq!(spans.len(), 2, "{spans:#?}");
    let stored = inbox_diesel::MessageKey::try_from("s1")
        .unwrap()
        .stored_id()
        .to_string();
    let mut outcomes = Vec::new();
    for span in &spans {
        assert_eq!(span.name, format!("process {queue}"));
        assert_eq!(span.span_kind, SpanKind::Consumer);
        let attribute = |key: &str| {
            span.attributes
                .iter()
                .find(|kv| kv.key.as_str() == key)
                .map(|kv| kv.value.as_str().into_owned())
                .unwrap_or_else(|| panic!("no {key} in {:?}", span.attributes))
        };
        assert_eq!(attribute("messaging.system"), "rabbitmq");
        assert_eq!(attribute("messaging.destination.name"), queue);
        assert_eq!(attribute("messaging.operation.type"), "process");
        assert_eq!(attribute("messaging.consumer.group.name"), "credits");
        // The broker's id as the conventions name it, the inbox's row's beside it.
        assert_eq!(attribute("messaging.message.id"), "s1");
        assert_eq!(attribute("inbox.stored_id"), stored);
        assert_eq!(
            attribute("messaging.rabbitmq.destination.routing_key"),
            queue
        );
        assert_eq!(attribute("inbox.delivery_count"), "1");
        assert_eq!(attribute("inbox.settlement"), "ack");
        outcomes.push(attribute("inbox.outcome"));
    }
    outcomes.sort();
    assert_eq!(outcomes, ["duplicate", "processed"]);
}

/// The outbox's side: a SQLite database whose handler publishes, relayed to RabbitMQ.
mod outbox {
    use super::*;
    use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
    use inbox_diesel::outbox::relay::Relay;
    use inbox_diesel::outbox::{Message, Outbox};
    use inbox_lapin::outbox::{LIMITS, OutboxSink};
    use lapin::options::BasicGetOptions;

    static OUTBOX: Outbox = Outbox::new("outbox").limits(LIMITS);

    /// Publishes `n` messages to `queue`, the business change beside them.
    #[idempotent(consumer = "orders", key = key)]
    fn place(
        conn: &mut SqliteConnection,
        key: &MessageKey,
        queue: &str,
        n: u32,
    ) -> Result<(), inbox_diesel::Error> {
        diesel::sql_query("INSERT INTO effects (message) VALUES ('placed')").execute(conn)?;
        for at in 0..n {
            OUTBOX.publish(
                conn,
                Message::new(queue, format!("event {at}")).header("at", at.to_string()),
            )?;
        }
        Ok(())
    }

    fn store() -> Store {
        let store = Store::new();
        store
            .connect()
            .batch_execute(&OUTBOX.create_table_sql(inbox_diesel::schema::Backend::Sqlite))
            .unwrap();
        store
    }

    async fn relay_conn(store: &Store) -> SyncConnectionWrapper<SqliteConnection> {
        SyncConnectionWrapper::new(store.connect())
    }

    /// A relay that parks a message after two refusals and pauses a millisecond: the
    /// refusal tests' rounds follow one another at once.
    fn quick_relay() -> Relay {
        Relay::new(OUTBOX)
            .max_attempts(2)
            .backoff(Duration::from_millis(1), Duration::from_millis(1))
    }

    /// Every message on the queue now: (message_id, body, header `at`).
    async fn drain(channel: &Channel, queue: &str) -> Vec<(String, String, String)> {
        let mut messages = Vec::new();
        while let Some(message) = channel
            .basic_get(queue.into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
        {
            let delivery = &message.delivery;
            let at = delivery
                .properties
                .headers()
                .as_ref()
                .and_then(|h| h.inner().get("at").cloned())
                .map(|v| match v {
                    AMQPValue::LongString(s) => s.to_string(),
                    other => format!("{other:?}"),
                })
                .unwrap_or_default();
            messages.push((
                delivery
                    .properties
                    .message_id()
                    .as_ref()
                    .map(|id| id.to_string())
                    .unwrap_or_default(),
                String::from_utf8_lossy(&delivery.data).into_owned(),
                at,
            ));
        }
        messages
    }

    /// Published in the handler, relayed with confirms: each message on the queue once, its
    /// outbox id as `message_id` (the key a downstream pump reads), its headers; a
    /// duplicate delivery of the handler publishes nothing.
    #[tokio::test]
    async fn relayed_messages_reach_the_queue_once_with_their_ids() {
        let (_connection, channel) = channel().await;
        let queues = Queues::declare(&channel, "outbox").await;
        let store = store();
        let key = MessageKey::text("order-1").unwrap();
        assert!(
            place(&mut store.connect(), &key, &queues.name, 3)
                .unwrap()
                .is_processed()
        );
        assert!(
            place(&mut store.connect(), &key, &queues.name, 3)
                .unwrap()
                .is_duplicate()
        );
        let mut sink = OutboxSink::new(broker_url(), "");
        let mut conn = relay_conn(&store).await;
        let relay = Relay::new(OUTBOX);
        let round = relay.run_once(&mut conn, &mut sink).await.unwrap();
        assert_eq!(round.sent, 3, "{round:?}");
        assert_eq!(
            relay.run_once(&mut conn, &mut sink).await.unwrap().claimed,
            0
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        let messages = drain(&channel, &queues.name).await;
        assert_eq!(messages.len(), 3, "{messages:?}");
        for (at, (id, body, header)) in messages.iter().enumerate() {
            assert!(inbox_diesel::Uuid::parse_str(id).is_ok(), "{id}");
            assert_eq!(body, &format!("event {at}"));
            assert_eq!(header, &at.to_string());
        }
        queues.delete(&channel).await;
    }

    /// A destination no queue is bound for: the broker returns the message (mandatory), the
    /// sink rejects it, and the relay parks it after its attempts — not dropped silently.
    #[tokio::test]
    async fn an_unroutable_message_is_parked_not_lost() {
        let store = store();
        let key = MessageKey::text("order-2").unwrap();
        let nowhere = format!("inbox-lapin-nowhere-{}", std::process::id());
        assert!(
            place(&mut store.connect(), &key, &nowhere, 1)
                .unwrap()
                .is_processed()
        );
        let mut sink = OutboxSink::new(broker_url(), "");
        let mut conn = relay_conn(&store).await;
        let relay = quick_relay();
        let mut parked = 0;
        for _ in 0..20 {
            parked += relay.run_once(&mut conn, &mut sink).await.unwrap().parked;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(parked, 1);
        #[derive(QueryableByName)]
        struct Parked {
            #[diesel(sql_type = diesel::sql_types::Text)]
            last_error: String,
        }
        let row: Parked = diesel::sql_query(
            "SELECT last_error FROM outbox WHERE parked_at IS NOT NULL AND attempts = 2",
        )
        .get_result(&mut store.connect())
        .unwrap();
        assert!(row.last_error.contains("unroutable"), "{}", row.last_error);
    }

    /// A queue full for a while (`x-max-length` 1, `x-overflow = reject-publish`): the broker
    /// answers the relay's publishes with negative confirms. The relay pauses on them — none
    /// counted as an attempt, none parked however long it lasts (`max_attempts` 2) — and
    /// sends each message once the queue has room again.
    #[tokio::test]
    async fn a_full_queue_pauses_the_relay_and_parks_nothing() {
        let (_connection, channel) = channel().await;
        let full = format!("inbox-lapin-full-{}", std::process::id());
        channel
            .queue_delete(full.as_str().into(), QueueDeleteOptions::default())
            .await
            .unwrap();
        let mut arguments = FieldTable::default();
        arguments.insert("x-max-length".into(), AMQPValue::LongInt(1));
        arguments.insert(
            "x-overflow".into(),
            AMQPValue::LongString("reject-publish".into()),
        );
        channel
            .queue_declare(
                full.as_str().into(),
                QueueDeclareOptions::default(),
                arguments,
            )
            .await
            .unwrap();
        let store = store();
        let key = MessageKey::text("order-full").unwrap();
        assert!(
            place(&mut store.connect(), &key, &full, 3)
                .unwrap()
                .is_processed()
        );
        let mut sink = OutboxSink::new(broker_url(), "");
        let mut conn = relay_conn(&store).await;
        let relay = quick_relay();
        let mut received = Vec::new();
        let (mut parked, mut rejected, mut unavailable) = (0, 0, 0);
        for round in 0..40 {
            let report = relay.run_once(&mut conn, &mut sink).await.unwrap();
            parked += report.parked;
            rejected += report.rejected;
            unavailable += usize::from(report.unavailable);
            // Full for the first ten rounds; then the consumer takes what is there.
            if round >= 10 {
                received.extend(drain(&channel, &full).await);
            }
            if received.len() == 3 {
                break;
            }
        }
        assert_eq!((parked, rejected), (0, 0));
        assert!(unavailable >= 9, "{unavailable}");
        let bodies: Vec<_> = received.iter().map(|(_, body, _)| body.as_str()).collect();
        assert_eq!(bodies, ["event 0", "event 1", "event 2"]);
        let _ = channel
            .queue_delete(full.as_str().into(), QueueDeleteOptions::default())
            .await;
    }

    /// A TCP relay to the broker that can be cut: the network between the outbox relay and
    /// RabbitMQ failing for real.
    struct Cut {
        port: u16,
        open: Arc<std::sync::atomic::AtomicBool>,
        links: Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    }

    impl Cut {
        async fn start() -> Self {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let port = listener.local_addr().unwrap().port();
            let open = Arc::new(std::sync::atomic::AtomicBool::new(true));
            let links = Arc::new(std::sync::Mutex::new(Vec::new()));
            let (accepting, linked) = (open.clone(), links.clone());
            tokio::spawn(async move {
                while let Ok((mut inbound, _)) = listener.accept().await {
                    if !accepting.load(Ordering::SeqCst) {
                        continue; // dropped: refused as a cut link refuses
                    }
                    let link = tokio::spawn(async move {
                        if let Ok(mut upstream) =
                            tokio::net::TcpStream::connect("127.0.0.1:5672").await
                        {
                            let _ =
                                tokio::io::copy_bidirectional(&mut inbound, &mut upstream).await;
                        }
                    });
                    linked.lock().unwrap().push(link);
                }
            });
            Self { port, open, links }
        }

        fn url(&self) -> String {
            format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
        }

        fn cut(&self) {
            self.open.store(false, Ordering::SeqCst);
            for link in self.links.lock().unwrap().drain(..) {
                link.abort();
            }
        }

        fn mend(&self) {
            self.open.store(true, Ordering::SeqCst);
        }
    }

    /// The link to the broker cut while messages wait: the relay pauses without counting
    /// attempts, reconnects once the link is back, and every message arrives once.
    #[tokio::test]
    async fn a_cut_link_to_the_broker_pauses_the_relay_and_loses_nothing() {
        let (_connection, channel) = channel().await;
        let queues = Queues::declare(&channel, "outbox-cut").await;
        let store = store();
        let cut = Cut::start().await;
        let mut sink = OutboxSink::new(cut.url(), "");
        let mut conn = relay_conn(&store).await;
        let relay = Relay::new(OUTBOX)
            .idle(Duration::from_millis(10))
            .backoff(Duration::from_millis(20), Duration::from_millis(100));
        // Connected and sending, then the link is cut under the open connection.
        let first = MessageKey::text("order-3").unwrap();
        assert!(
            place(&mut store.connect(), &first, &queues.name, 2)
                .unwrap()
                .is_processed()
        );
        assert_eq!(relay.run_once(&mut conn, &mut sink).await.unwrap().sent, 2);
        cut.cut();
        let second = MessageKey::text("order-4").unwrap();
        assert!(
            place(&mut store.connect(), &second, &queues.name, 5)
                .unwrap()
                .is_processed()
        );
        let round = relay.run_once(&mut conn, &mut sink).await.unwrap();
        assert!(round.unavailable && round.sent == 0, "{round:?}");
        let stop = async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            cut.mend();
            tokio::time::sleep(Duration::from_millis(700)).await;
        };
        let report = relay.run(&mut conn, &mut sink, stop).await.unwrap();
        assert_eq!(report.sent, 5, "{report:?}");
        assert_eq!(report.rejected, 0);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let messages = drain(&channel, &queues.name).await;
        let ids: std::collections::HashSet<_> = messages.iter().map(|m| m.0.clone()).collect();
        assert_eq!(messages.len(), 7, "{messages:?}");
        assert_eq!(ids.len(), 7);
        queues.delete(&channel).await;
    }
}

/// `apply`, but the body panics — after its effect, inside the transaction — on the first
/// delivery of `poison`.
#[idempotent(consumer = "credits", key = key)]
fn apply_or_panic(
    conn: &mut SqliteConnection,
    key: &MessageKey,
    body: &str,
    panics: &AtomicU32,
) -> Result<(), inbox_diesel::Error> {
    diesel::sql_query("INSERT INTO effects (message) VALUES (?)")
        .bind::<diesel::sql_types::Text, _>(body)
        .execute(conn)?;
    if body == "poison" && panics.fetch_add(1, Ordering::SeqCst) == 0 {
        panic!("the handler's own bug, on {body}");
    }
    Ok(())
}

/// A handler that panics on one message settles that delivery only: the pump goes on with
/// the messages that came with it, the panicking one is handed back (its transaction rolled
/// back as the panic unwound) and applied once when it is redelivered — none dead-lettered.
#[tokio::test]
async fn a_panicking_handler_settles_its_own_delivery_only() {
    let (_connection, channel) = channel().await;
    let queues = Queues::declare(&channel, "panic").await;
    for body in ["a", "poison", "b", "c"] {
        queues.publish(&channel, Some(body), body).await;
    }
    let store = Store::new();
    let pump = Pump::new().prefetch(4).redelivery(Redelivery::exponential(
        Duration::from_millis(100),
        Duration::from_millis(100),
    ));
    let consumer = pump
        .subscribe(&channel, &queues.name, "panic")
        .await
        .unwrap();
    let panics = AtomicU32::new(0);
    let done = {
        let store = &store;
        async move {
            while store.effects().len() < 4 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let report = pump
        .run(&channel, consumer, done, |delivery| {
            let key = key(&delivery).unwrap();
            let body = String::from_utf8_lossy(&delivery.data).into_owned();
            let answer = apply_or_panic(&mut store.connect(), &key, &body, &panics);
            async move { answer }
        })
        .await
        .unwrap();
    assert_eq!(panics.load(Ordering::SeqCst), 2, "poison ran twice");
    assert_eq!(
        (report.acked, report.retried, report.dead_lettered),
        (4, 1, 0),
        "{report:?}"
    );
    assert_eq!(
        store.effects(),
        [("a", 1), ("b", 1), ("c", 1), ("poison", 1)].map(|(m, n)| (m.to_owned(), n))
    );
    assert_eq!(queues.depth(&channel, &queues.dead).await, 0);
    queues.delete(&channel).await;
}

/// 20 messages, one of which kills the process that handles it (a build with
/// `panic = "abort"`, an out-of-memory kill): the process's death is its pump dropped and
/// its connection closed the moment the poison's handler starts, nothing acknowledged or
/// handed back. A supervisor starts it again, up to six times; the queue's delivery limit
/// is 2 (three deliveries). Returns how many times each message was applied, how many
/// times the process died, and how many messages were dead-lettered.
async fn deaths(slow_start: bool, test: &str) -> (Vec<(String, i64)>, u32, u32) {
    let (_connection, admin) = channel().await;
    let queues = Queues::declare_with_limit(&admin, test, 2).await;
    for n in 0..20 {
        let id = format!("d{n:02}");
        queues.publish(&admin, Some(&id), &id).await;
    }
    let store = Store::new();
    let pump = Pump::new().prefetch(8).slow_start(slow_start);
    let mut deaths = 0;
    for _ in 0..6 {
        // A process of its own: its own connection, closed when it dies.
        let (process, process_channel) = channel().await;
        let consumer = pump
            .subscribe(&process_channel, &queues.name, test)
            .await
            .unwrap();
        let poisoned = tokio::sync::Notify::new();
        let done = {
            let store = &store;
            async move {
                while store.effects().len() < 19 {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        };
        let run = pump.run(&process_channel, consumer, done, |delivery| {
            let poison = key(&delivery).unwrap() == MessageKey::text("d03").unwrap();
            if poison {
                poisoned.notify_one();
            }
            let store = &store;
            async move {
                if poison {
                    std::future::pending::<()>().await;
                }
                // A handler that takes a moment, as real ones do: in hand when the
                // process dies.
                tokio::time::sleep(Duration::from_millis(50)).await;
                handle(store, &delivery)
            }
        });
        let died = tokio::select! {
            report = run => {
                report.unwrap();
                false
            }
            () = poisoned.notified() => true,
            // Neither done nor dead: what is missing is never delivered again.
            () = tokio::time::sleep(Duration::from_secs(10)) => false,
        };
        // The process ends: the broker takes back what it had in hand.
        let _ = process.close(0, "the process died".into()).await;
        if !died {
            break;
        }
        deaths += 1;
    }
    let dead = queues.depth(&admin, &queues.dead).await;
    queues.delete(&admin).await;
    (store.effects(), deaths, dead)
}

/// Narrow after each start, the message that killed the process comes back alone and dies
/// alone, until its deliveries run out: the 19 others are applied once each, none
/// dead-lettered. At full width from the start (`slow_start(false)`), each restart's death
/// takes the messages the broker sent with the poison down with it, and some of them run
/// out of deliveries unprocessed.
#[tokio::test]
async fn a_message_that_kills_the_process_dies_alone_after_a_restart() {
    let (effects, died, dead) = deaths(true, "deaths").await;
    assert_eq!(effects.len(), 19, "{effects:?}");
    assert!(effects.iter().all(|(_, n)| *n == 1), "{effects:?}");
    assert!(effects.iter().all(|(m, _)| m != "d03"), "{effects:?}");
    assert_eq!((died, dead), (3, 1));
    let (effects, _, dead) = deaths(false, "deaths-wide").await;
    assert!(
        effects.len() < 19 && dead > 1,
        "at full width the poison takes others with it: {effects:?}, {dead} dead-lettered"
    );
    assert!(effects.iter().all(|(_, n)| *n == 1), "{effects:?}");
}

/// A pump at full width meets a stranger's redelivery — a message another process had in
/// hand when it died. The stranger waits, unstarted, until the handlers in hand have
/// answered, and runs alone: no other handler starts until it has answered. Every message
/// is applied once.
#[tokio::test]
async fn a_strangers_redelivery_runs_alone() {
    let (_connection, channel) = channel().await;
    let queues = Queues::declare(&channel, "stranger").await;
    queues.publish(&channel, Some("s"), "s").await;
    // Another process takes the stranger and dies with it in hand.
    let (other, other_channel) = self::channel().await;
    let mut other_consumer = Pump::new()
        .prefetch(1)
        .slow_start(false)
        .subscribe(&other_channel, &queues.name, "other")
        .await
        .unwrap();
    let held = futures_util::StreamExt::next(&mut other_consumer)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(held.data, b"s");
    // It takes nothing more; what it holds stays unacknowledged until it dies.
    other_channel
        .basic_cancel("other".into(), Default::default())
        .await
        .unwrap();
    for n in 0..20 {
        let id = format!("f{n:02}");
        queues.publish(&channel, Some(&id), &id).await;
    }
    let store = Store::new();
    let pump = Pump::new().prefetch(4);
    let consumer = pump
        .subscribe(&channel, &queues.name, "stranger")
        .await
        .unwrap();
    let running = AtomicU32::new(0);
    let beside_the_stranger = AtomicU32::new(0);
    let stranger_running = std::sync::atomic::AtomicBool::new(false);
    let widened = tokio::sync::Notify::new();
    let done = {
        let (store, widened) = (&store, &widened);
        async move {
            // Once the pump runs four at once, the other process dies.
            widened.notified().await;
            other.close(0, "the process died".into()).await.unwrap();
            while store.effects().len() < 21 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let report = pump
        .run(&channel, consumer, done, |delivery| {
            let stranger = delivery.data == b"s";
            let (running, beside, stranger_running, widened, store) = (
                &running,
                &beside_the_stranger,
                &stranger_running,
                &widened,
                &store,
            );
            async move {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                if stranger {
                    assert_eq!(inbox_lapin::delivery_count(&delivery), 2);
                    stranger_running.store(true, Ordering::SeqCst);
                    beside.fetch_add(now - 1, Ordering::SeqCst);
                } else if stranger_running.load(Ordering::SeqCst) {
                    beside.fetch_add(1, Ordering::SeqCst);
                }
                if now == 4 {
                    widened.notify_one();
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                if stranger {
                    beside.fetch_add(running.load(Ordering::SeqCst) - 1, Ordering::SeqCst);
                    stranger_running.store(false, Ordering::SeqCst);
                }
                running.fetch_sub(1, Ordering::SeqCst);
                handle(store, &delivery)
            }
        })
        .await
        .unwrap();
    assert_eq!(beside_the_stranger.load(Ordering::SeqCst), 0, "{report:?}");
    let effects = store.effects();
    assert_eq!(effects.len(), 21, "{effects:?}");
    assert!(effects.iter().all(|(_, n)| *n == 1), "{effects:?}");
    assert_eq!((report.acked, report.retried), (21, 0), "{report:?}");
    queues.delete(&channel).await;
}

/// A RabbitMQ node of the test's own — the machine's `rabbitmq-server`, a temporary
/// directory, free ports, a consumer timeout of a second — which a test may kill and start
/// again: the broker's faults provoked for real, the shared broker untouched.
mod private_broker {
    use super::*;
    use std::os::unix::process::CommandExt;
    use std::process::{Child, Command, Stdio};

    /// A node killed with `SIGKILL` when dropped.
    struct Node {
        dir: tempfile::TempDir,
        name: String,
        amqp: u16,
        dist: u16,
        child: Option<Child>,
    }

    fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    impl Node {
        fn new(test: &str) -> Self {
            let dir = tempfile::tempdir().unwrap();
            // The broker closes a channel whose delivery stays unacknowledged for a second,
            // checked every 200 ms (the defaults: 30 minutes, every minute).
            std::fs::write(
                dir.path().join("advanced.config"),
                "[{rabbit, [{consumer_timeout, 1000}, {channel_tick_interval, 200}, \
                 {loopback_users, []}]}].",
            )
            .unwrap();
            std::fs::write(dir.path().join("enabled_plugins"), "[].").unwrap();
            let mut node = Self {
                name: format!("inbox-lapin-{test}-{}@localhost", std::process::id()),
                amqp: free_port(),
                dist: free_port(),
                dir,
                child: None,
            };
            node.start();
            node
        }

        fn url(&self) -> String {
            format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.amqp)
        }

        /// Starts the node on its directory, ports and name, and waits until it accepts a
        /// connection.
        fn start(&mut self) {
            let dir = self.dir.path();
            let log = std::fs::File::create(dir.join("out.log")).unwrap();
            // The server itself: the wrapper on `PATH` (Debian's `/usr/sbin/rabbitmq-server`)
            // runs it as the `rabbitmq` user, who may not write the test's directory.
            let server = ["/usr/lib/rabbitmq/bin/rabbitmq-server"]
                .into_iter()
                .find(|path| std::path::Path::new(path).exists())
                .unwrap_or("rabbitmq-server");
            let child = Command::new(server)
                .env("HOME", dir)
                .env("RABBITMQ_NODENAME", &self.name)
                .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
                .env("RABBITMQ_NODE_PORT", self.amqp.to_string())
                .env("RABBITMQ_DIST_PORT", self.dist.to_string())
                .env("RABBITMQ_MNESIA_BASE", dir.join("mnesia"))
                .env("RABBITMQ_LOG_BASE", dir.join("log"))
                .env("RABBITMQ_CONFIG_FILE", dir.join("rabbitmq"))
                .env("RABBITMQ_ADVANCED_CONFIG_FILE", dir.join("advanced.config"))
                .env("RABBITMQ_ENABLED_PLUGINS_FILE", dir.join("enabled_plugins"))
                .process_group(0)
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap_or_else(|e| {
                    panic!("rabbitmq-server (the machine's RabbitMQ) cannot start: {e}")
                });
            self.child = Some(child);
            let deadline = std::time::Instant::now() + Duration::from_secs(90);
            while std::net::TcpStream::connect(("127.0.0.1", self.amqp)).is_err() {
                let exited = self.child.as_mut().unwrap().try_wait().unwrap();
                if exited.is_some() || std::time::Instant::now() > deadline {
                    let out = std::fs::read_to_string(dir.join("out.log")).unwrap_or_default();
                    panic!("the private RabbitMQ did not start ({exited:?}):\n{out}");
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }

        /// What the node logged.
        fn log(&self) -> String {
            let log = self
                .dir
                .path()
                .join("log")
                .join(format!("{}.log", self.name));
            std::fs::read_to_string(&log).unwrap_or_else(|e| format!("{}: {e}", log.display()))
        }

        /// Has the node write its metadata log (Mnesia's) to disk. The log is written
        /// asynchronously: a durable queue declared a moment before a `SIGKILL` was gone when
        /// the node came back, on a loaded machine — the broker's own window, not the pump's.
        fn sync_metadata(&self) {
            let ctl = ["/usr/lib/rabbitmq/bin/rabbitmqctl"]
                .into_iter()
                .find(|path| std::path::Path::new(path).exists())
                .unwrap_or("rabbitmqctl");
            let out = Command::new(ctl)
                .env("HOME", self.dir.path())
                .args(["-n", &self.name, "eval", "mnesia:sync_log()."])
                .output()
                .unwrap_or_else(|e| panic!("rabbitmqctl cannot run: {e}"));
            assert!(
                out.status.success() && String::from_utf8_lossy(&out.stdout).contains("ok"),
                "mnesia:sync_log() on the private node: {out:?}"
            );
        }

        /// Kills every process of the node at once, as a crash or a power cut does.
        fn kill(&mut self) {
            if let Some(mut child) = self.child.take() {
                let group = format!("-{}", child.id());
                let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
                let _ = child.wait();
            }
        }

        async fn channel(&self) -> (Connection, Channel) {
            let connection = Connection::connect(&self.url(), ConnectionProperties::default())
                .await
                .unwrap();
            let channel = connection.create_channel().await.unwrap();
            (connection, channel)
        }
    }

    /// `body: processed` or `body: duplicate`, as the handler answered the delivery.
    fn said(
        delivery: &lapin::message::Delivery,
        answer: &Result<Outcome<()>, inbox_diesel::Error>,
    ) -> String {
        let body = String::from_utf8_lossy(&delivery.data);
        match answer {
            Ok(outcome) if outcome.is_processed() => format!("{body}: processed"),
            Ok(outcome) if outcome.is_duplicate() => format!("{body}: duplicate"),
            other => format!("{body}: {other:?}"),
        }
    }

    impl Drop for Node {
        fn drop(&mut self) {
            self.kill();
        }
    }

    /// Runs `pump` on `channel` until `n` deliveries are answered, as a service restarts its
    /// pump after a broker's failure; returns the report and what the handler said of each.
    async fn redeliver(
        pump: &Pump,
        channel: &Channel,
        consumer: lapin::Consumer,
        store: &Store,
        n: usize,
    ) -> (inbox_lapin::Report, Vec<String>) {
        let answers = std::sync::Mutex::new(Vec::new());
        let done = async {
            while answers.lock().unwrap().len() < n {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        let report = pump
            .run(channel, consumer, done, |delivery| {
                let answer = handle(store, &delivery);
                answers.lock().unwrap().push(said(&delivery, &answer));
                async move { answer }
            })
            .await
            .unwrap();
        (report, answers.into_inner().unwrap())
    }

    /// A handler whose effect commits, then runs past the broker's consumer timeout before
    /// the pump acknowledges: the broker closes the channel and the pump stops with the
    /// channel's failure. Delivered again on a new channel, the message is a duplicate —
    /// acknowledged, applied once.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_handler_outliving_the_consumer_timeout_is_applied_once() {
        let node = Node::new("timeout");
        let (_connection, channel) = node.channel().await;
        let queues = Queues::declare(&channel, "consumer-timeout").await;
        queues.publish(&channel, Some("slow"), "slow").await;
        let store = Store::new();
        let pump = Pump::new();
        let consumer = pump
            .subscribe(&channel, &queues.name, "timeout")
            .await
            .unwrap();
        let stopped = pump
            .run(&channel, consumer, std::future::pending(), |delivery| {
                let answer = handle(&store, &delivery);
                async move {
                    tokio::time::sleep(Duration::from_secs(3)).await;
                    answer
                }
            })
            .await
            .unwrap_err();
        assert!(
            matches!(&stopped, Stopped::Broker { failure, report }
                if failure.contains("timed out") && report.unsettled == 1 && report.acked == 0),
            "{stopped:?}"
        );
        assert_eq!(store.effects(), [("slow".to_owned(), 1)]);

        let (_connection, channel) = node.channel().await;
        let consumer = pump
            .subscribe(&channel, &queues.name, "timeout")
            .await
            .unwrap();
        let (report, answers) = redeliver(&pump, &channel, consumer, &store, 1).await;
        assert_eq!(report.acked, 1, "{report:?}");
        assert_eq!(answers, ["slow: duplicate"]);
        assert_eq!(store.effects(), [("slow".to_owned(), 1)]);
        assert_eq!(queues.depth(&channel, &queues.name).await, 0);
    }

    /// The broker killed while a handler holds a committed delivery, before its
    /// acknowledgement: the pump stops with the connection's failure. Started again, the
    /// broker redelivers it (a duplicate, acknowledged) and the messages no handler had
    /// taken; each is applied once, none lost. A durable classic queue with persistent
    /// messages: a single node's quorum queue killed this way may elect no leader when it
    /// starts again (RabbitMQ 3.10 here; rabbitmq-server#10070), the broker's own fault.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_broker_killed_before_the_ack_loses_nothing() {
        let mut node = Node::new("killed");
        let (connection, channel) = node.channel().await;
        let queue = format!("inbox-lapin-killed-{}", std::process::id());
        let durable = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        channel
            .queue_declare(queue.as_str().into(), durable, FieldTable::default())
            .await
            .unwrap();
        node.sync_metadata();
        // Confirmed: the broker answers once the persistent message is on its disk (without
        // confirms, messages it had not written yet were gone after the kill).
        channel
            .confirm_select(lapin::options::ConfirmSelectOptions::default())
            .await
            .unwrap();
        for body in ["a", "b", "c"] {
            let confirm = channel
                .basic_publish(
                    "".into(),
                    queue.as_str().into(),
                    BasicPublishOptions::default(),
                    body.as_bytes(),
                    BasicProperties::default()
                        .with_message_id(body.into())
                        .with_delivery_mode(2),
                )
                .await
                .unwrap()
                .await
                .unwrap();
            assert!(confirm.is_ack(), "{confirm:?}");
        }
        let store = Store::new();
        let pump = Pump::new().prefetch(1);
        let consumer = pump.subscribe(&channel, &queue, "killed").await.unwrap();
        let (committed, mut commit) = tokio::sync::mpsc::unbounded_channel();
        let running = pump.run(&channel, consumer, std::future::pending(), |delivery| {
            let answer = handle(&store, &delivery);
            let _ = committed.send(());
            async move {
                tokio::time::sleep(Duration::from_secs(2)).await;
                answer
            }
        });
        let kill = async {
            commit.recv().await.unwrap();
            node.kill();
        };
        let (stopped, ()) = tokio::join!(running, kill);
        let stopped = stopped.unwrap_err();
        assert!(
            matches!(stopped, Stopped::Broker { report, .. }
                if report.unsettled == 1 && report.acked == 0),
            "{stopped:?}"
        );
        assert_eq!(store.effects(), [("a".to_owned(), 1)]);
        drop((channel, connection));
        node.start();
        // As a service restarts its pump: until the node, recovering, takes a consumer again.
        let started = std::time::Instant::now();
        let (_connection, channel, consumer) = loop {
            let (connection, channel) = node.channel().await;
            match pump.subscribe(&channel, &queue, "killed").await {
                Ok(consumer) => break (connection, channel, consumer),
                Err(e) if started.elapsed() < Duration::from_secs(60) => {
                    eprintln!("the queue takes no consumer yet: {e}");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => panic!(
                    "the queue took no consumer in a minute: {e}\n{}",
                    node.log()
                ),
            }
        };
        let (report, answers) = redeliver(&pump, &channel, consumer, &store, 3).await;
        assert_eq!(report.acked, 3, "{report:?}");
        assert_eq!(answers, ["a: duplicate", "b: processed", "c: processed"]);
        assert_eq!(
            store.effects(),
            [("a", 1), ("b", 1), ("c", 1)].map(|(m, n)| (m.to_owned(), n))
        );
        let depth = channel
            .queue_declare(
                queue.as_str().into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap()
            .message_count();
        assert_eq!(depth, 0);
    }
}

/// A claim-mode handler whose side effect (`sent`) runs outside any transaction, with a
/// lease of 3 s.
#[idempotent(consumer = "mails", key = key, mode = "claim", lease_ms = 3000)]
fn mail(
    conn: &mut SqliteConnection,
    key: &MessageKey,
    sent: &AtomicU32,
) -> Result<(), inbox_diesel::Error> {
    sent.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

/// A process claimed a message and died before its side effect: the claim holds for its
/// 3 s lease. The message comes back under a delivery limit of 2 (three deliveries) and
/// short delays (100 ms, 200 ms): every delivery before the lease ends answers `InFlight`,
/// which used to spend the limit in half a second and dead-letter the message with its
/// side effect never run. The pump holds the second delivery until the lease has ended
/// (`Settlement::Held`), and the third takes the claim over and sends once.
#[tokio::test]
async fn a_crashed_claim_is_waited_out_within_the_delivery_limit() {
    // A subscriber of this thread's, as `each_delivery_is_one_process_span` has: tracing
    // caches whether a callsite is enabled process-wide, and inbox-nats' twin of this test
    // without one hid the span test's spans run beside it.
    let _default = tracing::subscriber::set_default(tracing_subscriber::registry());
    let (_connection, channel) = channel().await;
    let queues = Queues::declare_with_limit(&channel, "held", 2).await;
    let store = Store::new();
    let sent = AtomicU32::new(0);
    let crashed = MessageKey::text("crashed").unwrap();
    inbox_diesel::testing::crash(
        store.connect(),
        inbox_diesel::testing::Crash::AfterClaim,
        |conn| mail(conn, &crashed, &sent),
    );
    assert_eq!(sent.load(Ordering::SeqCst), 0);
    queues.publish(&channel, Some("crashed"), "crashed").await;
    let pump = Pump::new().redelivery(Redelivery::exponential(
        Duration::from_millis(100),
        Duration::from_millis(200),
    ));
    let consumer = pump
        .subscribe(&channel, &queues.name, "held")
        .await
        .unwrap();
    let counts = std::sync::Mutex::new(Vec::new());
    let done = {
        let (sent, queues, channel) = (&sent, &queues, &channel);
        async move {
            // Sent, or dead-lettered.
            while sent.load(Ordering::SeqCst) == 0 && queues.depth(channel, &queues.dead).await == 0
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let report = pump
        .run(&channel, consumer, done, |delivery| {
            counts
                .lock()
                .unwrap()
                .push(inbox_lapin::delivery_count(&delivery));
            let answer = mail(&mut store.connect(), &key(&delivery).unwrap(), &sent);
            async move { answer }
        })
        .await
        .unwrap();
    assert_eq!(sent.load(Ordering::SeqCst), 1, "{report:?}");
    assert_eq!((report.retried, report.acked), (2, 1), "{report:?}");
    assert_eq!(*counts.lock().unwrap(), [1, 2, 3]);
    assert_eq!(queues.depth(&channel, &queues.dead).await, 0);
    queues.delete(&channel).await;
}

/// The topology the docs recommend, declared by `Topology`: a message the handler
/// dead-letters and one retried past its delivery limit both reach the dead-letter queue; a
/// second declaration of the same topology is a no-op; and a limit whose retries an outage
/// would outlast is declared all the same (with a warning).
#[tokio::test]
async fn the_declared_topology_bounds_deliveries_and_keeps_dead_letters() {
    use inbox_lapin::Topology;
    let (_connection, channel) = channel().await;
    let name = format!("inbox-lapin-topology-{}", std::process::id());
    let topology = Topology::new(name.as_str()).delivery_limit(2);
    for queue in [topology.queue(), topology.dead()] {
        channel
            .queue_delete(queue.into(), QueueDeleteOptions::default())
            .await
            .unwrap();
    }
    let pump = Pump::new().redelivery(Redelivery::exponential(
        Duration::from_millis(10),
        Duration::from_millis(20),
    ));
    topology.declare(&channel, &pump).await.unwrap();
    topology.declare(&channel, &pump).await.unwrap();
    let queues = Queues {
        name: topology.queue().to_owned(),
        dead: topology.dead().to_owned(),
    };
    queues.publish(&channel, Some("refused"), "refused").await;
    queues.publish(&channel, Some("poison"), "poison").await;
    let consumer = pump
        .subscribe(&channel, &queues.name, "topology")
        .await
        .unwrap();
    let poison_runs = Arc::new(AtomicU32::new(0));
    let dead = async {
        wait_for_depth(&queues, &channel, &queues.dead, 2).await;
    };
    let report = pump
        .run(&channel, consumer, dead, |delivery| {
            let settlement = match key(&delivery).unwrap() {
                k if k == MessageKey::text("refused").unwrap() => Settlement::DeadLetter,
                _ => {
                    poison_runs.fetch_add(1, Ordering::SeqCst);
                    Settlement::Retry { reconnect: false }
                }
            };
            async move { Err::<Outcome<()>, _>(settlement) }
        })
        .await
        .unwrap();
    assert_eq!(report.dead_lettered, 1, "{report:?}");
    // A delivery limit of 2: the first delivery and two returns.
    assert!(
        (2..=3).contains(&poison_runs.load(Ordering::SeqCst)),
        "{poison_runs:?}"
    );
    assert_eq!(queues.depth(&channel, &queues.name).await, 0);
    queues.delete(&channel).await;
}
