//! The pump against a real NATS server with JetStream (`INBOX_TEST_NATS`, by default the
//! local server at nats://127.0.0.1:4222) and a real SQLite inbox: every message applied once
//! though published twice, each settlement done by the server, progress reports that keep a
//! long handler's message from a second consumer, a graceful shutdown that loses nothing.
//! Each test creates a stream and a consumer of its own and deletes them. An unreachable
//! server fails the suite.

use std::future::Future;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::{AckPolicy, PullConsumer, pull};
use async_nats::jetstream::{self, Context, stream};
use async_nats::{ConnectOptions, HeaderMap};
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use futures_util::StreamExt;
use inbox_diesel::{
    Action, InboxSchema, MessageKey, Outcome, Redelivery, Settle, Settlement, idempotent,
};
use inbox_nats::{Pump, Stopped, Unreachable, delivery_count, key};

fn server_url() -> String {
    std::env::var("INBOX_TEST_NATS").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned())
}

async fn connect() -> Context {
    let url = server_url();
    match inbox_nats::connect(&url, ConnectOptions::new()).await {
        Ok(jetstream) => jetstream,
        Err(e) => {
            let cause = std::error::Error::source(&e)
                .map(|cause| format!(": {cause}"))
                .unwrap_or_default();
            panic!("NATS with JetStream is not reachable at {url} (INBOX_TEST_NATS): {e}{cause}")
        }
    }
}

/// Fails the test when `future` takes longer than `limit`, rather than hanging the suite.
async fn within<T>(limit: Duration, what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(limit, future)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within {limit:?}"))
}

/// A stream of the test's own, named for the test and the process, in memory, taking the
/// subjects `<name>.>`.
struct Stream {
    jetstream: Context,
    name: String,
}

impl Stream {
    async fn create(test: &str, duplicate_window: Duration) -> Self {
        let jetstream = connect().await;
        let name = format!("inbox-nats-{test}-{}", std::process::id());
        let _ = jetstream.delete_stream(&name).await;
        jetstream
            .create_stream(stream::Config {
                name: name.clone(),
                subjects: vec![format!("{name}.>")],
                storage: stream::StorageType::Memory,
                duplicate_window,
                ..stream::Config::default()
            })
            .await
            .unwrap();
        Self { jetstream, name }
    }

    /// Publishes `body`, with `Nats-Msg-Id` set to `msg_id` if given; the server's answer.
    async fn publish(&self, msg_id: Option<&str>, body: &str) -> jetstream::publish::PublishAck {
        let mut headers = HeaderMap::new();
        if let Some(id) = msg_id {
            headers.insert(async_nats::header::NATS_MESSAGE_ID, id);
        }
        self.jetstream
            .publish_with_headers(
                format!("{}.credits", self.name),
                headers,
                body.to_owned().into(),
            )
            .await
            .unwrap()
            .await
            .unwrap()
    }

    async fn consumer(&self, pump: &Pump, durable: &str) -> PullConsumer {
        pump.consumer(&self.jetstream, &self.name, durable)
            .await
            .unwrap()
    }

    async fn messages(&self) -> u64 {
        let stream = self.jetstream.get_stream(&self.name).await.unwrap();
        stream.get_info().await.unwrap().state.messages
    }

    async fn consumer_info(&self, durable: &str) -> jetstream::consumer::Info {
        let stream = self.jetstream.get_stream(&self.name).await.unwrap();
        stream.consumer_info(durable).await.unwrap().clone()
    }

    async fn delete(self) {
        let _ = self.jetstream.delete_stream(&self.name).await;
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
        conn.batch_execute(
            "CREATE TABLE effects (message TEXT NOT NULL);
             CREATE TABLE payments (reference TEXT NOT NULL UNIQUE);",
        )
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

    /// Resolves once `n` distinct messages were applied.
    async fn applied(&self, n: usize) {
        while self.effects().len() < n {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
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

/// A payment whose reference must be new: `payments.reference` is unique.
#[idempotent(consumer = "payments", key = key)]
fn pay(
    conn: &mut SqliteConnection,
    key: &MessageKey,
    reference: &str,
) -> Result<(), inbox_diesel::Error> {
    diesel::sql_query("INSERT INTO payments (reference) VALUES (?)")
        .bind::<diesel::sql_types::Text, _>(reference)
        .execute(conn)?;
    diesel::sql_query("INSERT INTO effects (message) VALUES (?)")
        .bind::<diesel::sql_types::Text, _>(reference)
        .execute(conn)?;
    Ok(())
}

/// The handler as a pump calls it: the key off the message, the effect in SQLite.
fn handle(store: &Store, message: &jetstream::Message) -> Result<Outcome<()>, inbox_diesel::Error> {
    let key = key(message).map_err(inbox_diesel::Error::InvalidKey)?;
    let body = String::from_utf8_lossy(&message.payload).into_owned();
    apply(&mut store.connect(), &key, &body)
}

/// A future that resolves once `counter` reaches `n`.
async fn counted(counter: &AtomicU32, n: u32) {
    while counter.load(Ordering::SeqCst) < n {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Every message published twice by a publisher whose retry came after the stream's
/// duplicate window (the window is JetStream's own deduplication by `Nats-Msg-Id`, which
/// catches a retry inside it): the stream holds both copies, and the inbox applies each
/// message once; every delivery is acknowledged and nothing is left pending.
#[tokio::test]
async fn each_message_published_twice_is_applied_once() {
    let stream = Stream::create("twice", Duration::from_secs(1)).await;
    for n in 0..20 {
        let id = format!("m{n:02}");
        assert!(!stream.publish(Some(&id), &id).await.duplicate);
        if n == 0 {
            // Inside the window JetStream drops the copy itself.
            assert!(stream.publish(Some(&id), &id).await.duplicate);
        }
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for n in 0..20 {
        let id = format!("m{n:02}");
        assert!(!stream.publish(Some(&id), &id).await.duplicate);
    }
    assert_eq!(stream.messages().await, 40);

    let store = Store::new();
    let pump = Pump::new().max_ack_pending(8);
    let consumer = stream.consumer(&pump, "twice").await;
    let answered = AtomicU32::new(0);
    let report = within(
        Duration::from_secs(30),
        "the pump",
        pump.run(
            &stream.jetstream,
            &consumer,
            counted(&answered, 40),
            |message| {
                let answer = handle(&store, &message);
                answered.fetch_add(1, Ordering::SeqCst);
                async move { answer }
            },
        ),
    )
    .await
    .unwrap();
    assert_eq!(report.acked, 40, "{report:?}");
    let effects = store.effects();
    assert_eq!(effects.len(), 20);
    assert!(effects.iter().all(|(_, n)| *n == 1), "{effects:?}");
    let info = stream.consumer_info("twice").await;
    assert_eq!((info.num_pending, info.num_ack_pending), (0, 0), "{info:?}");
    stream.delete().await;
}

/// The key is the publisher's `Nats-Msg-Id` when it set one, else the stream, the message's
/// stream sequence and the time the stream stored it — never anything the consumer makes up.
#[tokio::test]
async fn a_message_is_keyed_by_its_msg_id_else_its_stream_sequence() {
    let stream = Stream::create("keys", Duration::from_secs(120)).await;
    let anonymous = stream.publish(None, "anonymous").await.sequence;
    let stored = {
        let stream = stream.jetstream.get_stream(&stream.name).await.unwrap();
        stream.get_raw_message(anonymous).await.unwrap().time
    };
    stream.publish(Some("order-7"), "named").await;
    let pump = Pump::new();
    let consumer = stream.consumer(&pump, "keys").await;
    let keys = Mutex::new(Vec::new());
    let seen = AtomicU32::new(0);
    let report = within(
        Duration::from_secs(30),
        "the pump",
        pump.run(&stream.jetstream, &consumer, counted(&seen, 2), |message| {
            keys.lock().unwrap().push((
                String::from_utf8_lossy(&message.payload).into_owned(),
                key(&message).unwrap(),
                delivery_count(&message),
            ));
            seen.fetch_add(1, Ordering::SeqCst);
            async { Ok::<Outcome<()>, Action>(Outcome::Processed(())) }
        }),
    )
    .await
    .unwrap();
    assert_eq!(report.acked, 2, "{report:?}");
    let mut keys = keys.into_inner().unwrap();
    keys.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        keys,
        [
            (
                "anonymous".to_owned(),
                inbox_diesel::broker::jetstream(
                    None,
                    &stream.name,
                    anonymous,
                    stored.unix_timestamp_nanos()
                )
                .unwrap(),
                1
            ),
            ("named".to_owned(), MessageKey::text("order-7").unwrap(), 1),
        ]
    );
    stream.delete().await;
}

/// A stream deleted and created again under its name (a redeploy, a cleared environment),
/// its publishers setting no `Nats-Msg-Id`: the new stream numbers from 1 again, and its
/// messages met the old stream's markers — answered `Duplicate` and acknowledged, never
/// applied. The time the stream stored each message tells them apart.
#[tokio::test]
async fn a_stream_created_again_under_its_name_is_new_messages() {
    let store = Store::new();
    for round in 0..2 {
        let stream = Stream::create("again", Duration::from_secs(120)).await;
        for n in 0..3 {
            stream.publish(None, &format!("round{round}-m{n}")).await;
        }
        let pump = Pump::new();
        let consumer = stream.consumer(&pump, "again").await;
        let answered = AtomicU32::new(0);
        let report = within(
            Duration::from_secs(30),
            "the pump",
            pump.run(
                &stream.jetstream,
                &consumer,
                counted(&answered, 3),
                |message| {
                    let answer = handle(&store, &message);
                    answered.fetch_add(1, Ordering::SeqCst);
                    async move { answer }
                },
            ),
        )
        .await
        .unwrap();
        assert_eq!(report.acked, 3, "{report:?}");
        stream.delete().await;
    }
    let effects = store.effects();
    assert_eq!(
        effects.len(),
        6,
        "both streams' messages applied: {effects:?}"
    );
    assert!(effects.iter().all(|(_, n)| *n == 1), "{effects:?}");
}

/// A transient failure is handed back with the redelivery delay (JetStream waits it out),
/// counted in the message's `delivered`, and processed on a later delivery.
#[tokio::test]
async fn a_transient_failure_is_retried_after_a_delay() {
    let stream = Stream::create("retry", Duration::from_secs(120)).await;
    stream.publish(Some("flaky"), "flaky").await;
    let store = Store::new();
    let pump = Pump::new().redelivery(Redelivery::exponential(
        Duration::from_millis(200),
        Duration::from_secs(1),
    ));
    let consumer = stream.consumer(&pump, "retry").await;
    let deliveries = AtomicU32::new(0);
    let counts = Mutex::new(Vec::new());
    let started = Instant::now();
    let report = within(
        Duration::from_secs(30),
        "the pump",
        pump.run(&stream.jetstream, &consumer, store.applied(1), |message| {
            counts.lock().unwrap().push(delivery_count(&message));
            let answer: Result<Outcome<()>, Action> =
                match deliveries.fetch_add(1, Ordering::SeqCst) {
                    0 | 1 => Err(Action::RetryLater),
                    _ => handle(&store, &message).map_err(|e| e.action()),
                };
            async move { answer }
        }),
    )
    .await
    .unwrap();
    assert_eq!((report.retried, report.acked), (2, 1), "{report:?}");
    assert_eq!(*counts.lock().unwrap(), [1, 2, 3]);
    // 200 ms after the first delivery, 400 ms after the second.
    assert!(started.elapsed() >= Duration::from_millis(600));
    assert_eq!(store.effects(), [("flaky".to_owned(), 1)]);
    stream.delete().await;
}

/// How many of 9 messages — the first of which takes a second — were answered while that
/// first one ran, on a new consumer of `pump`.
async fn answered_beside_a_slow_first(test: &str, pump: Pump) -> u32 {
    let stream = Stream::create(test, Duration::from_secs(120)).await;
    for n in 0..9 {
        stream
            .publish(Some(&format!("m{n}")), &format!("m{n}"))
            .await;
    }
    let store = Store::new();
    let consumer = stream.consumer(&pump, test).await;
    let (answered, beside) = (AtomicU32::new(0), AtomicU32::new(0));
    let first = std::sync::atomic::AtomicBool::new(true);
    within(
        Duration::from_secs(30),
        "the pump",
        pump.run(&stream.jetstream, &consumer, store.applied(9), |message| {
            let slow = first.swap(false, Ordering::SeqCst);
            let (answered, beside) = (&answered, &beside);
            let answer = handle(&store, &message).map_err(|e| e.action());
            async move {
                if slow {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    beside.store(answered.load(Ordering::SeqCst), Ordering::SeqCst);
                }
                answered.fetch_add(1, Ordering::SeqCst);
                answer
            }
        }),
    )
    .await
    .unwrap();
    stream.delete().await;
    beside.load(Ordering::SeqCst)
}

/// A first handler that is slow holds a slow-starting pump (its window is one) for as long as
/// it runs; `slow_start(false)` takes `max_ack_pending` from the start, and the others run
/// beside it (an operator's trial: no healthy message answered while a nine-second first
/// handler ran).
#[tokio::test]
async fn a_slow_first_handler_holds_a_slow_start_only() {
    let pump = Pump::new().max_ack_pending(8);
    assert_eq!(answered_beside_a_slow_first("slow-start", pump).await, 0);
    let wide = answered_beside_a_slow_first("wide-start", pump.slow_start(false)).await;
    assert!(wide >= 7, "{wide} answered beside the slow one");
}

/// A message that breaks a business constraint (a payment reference already taken) is
/// terminated: the server says so in its advisory, and never delivers it again, also not
/// after `ack_wait`; the other message is processed.
#[tokio::test]
async fn a_business_constraint_terminates_the_message() {
    let stream = Stream::create("term", Duration::from_secs(120)).await;
    let store = Store::new();
    store
        .connect()
        .batch_execute("INSERT INTO payments (reference) VALUES ('taken')")
        .unwrap();
    let pump = Pump::new().ack_wait(Duration::from_secs(1));
    let consumer = stream.consumer(&pump, "term").await;
    let mut advisories = stream
        .jetstream
        .client()
        .subscribe(format!(
            "$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.{}.term",
            stream.name
        ))
        .await
        .unwrap();
    let taken = stream.publish(Some("p1"), "taken").await.sequence;
    stream.publish(Some("p2"), "fresh").await;
    let answered = AtomicU32::new(0);
    let pay_handler = |message: jetstream::Message| {
        let answer = key(&message)
            .map_err(inbox_diesel::Error::InvalidKey)
            .and_then(|key| {
                pay(
                    &mut store.connect(),
                    &key,
                    &String::from_utf8_lossy(&message.payload),
                )
            });
        if let Err(e) = &answer {
            assert_eq!(e.settlement(), Settlement::DeadLetter, "{e}");
        }
        answered.fetch_add(1, Ordering::SeqCst);
        async move { answer }
    };
    let report = within(
        Duration::from_secs(30),
        "the pump",
        pump.run(
            &stream.jetstream,
            &consumer,
            counted(&answered, 2),
            pay_handler,
        ),
    )
    .await
    .unwrap();
    assert_eq!((report.acked, report.dead_lettered), (1, 1), "{report:?}");
    assert_eq!(store.effects(), [("fresh".to_owned(), 1)]);

    let advisory = within(Duration::from_secs(5), "the advisory", advisories.next())
        .await
        .unwrap();
    let advisory = String::from_utf8_lossy(&advisory.payload).into_owned();
    assert!(
        advisory.contains(&format!("\"stream_seq\":{taken},")),
        "{advisory}"
    );

    // Three times ack_wait later, nothing came back.
    let redelivered = AtomicU32::new(0);
    let report = within(
        Duration::from_secs(30),
        "the second pump",
        pump.run(
            &stream.jetstream,
            &consumer,
            tokio::time::sleep(Duration::from_secs(3)),
            |_message| {
                redelivered.fetch_add(1, Ordering::SeqCst);
                async { Ok::<Outcome<()>, Action>(Outcome::Processed(())) }
            },
        ),
    )
    .await
    .unwrap();
    assert_eq!(redelivered.load(Ordering::SeqCst), 0, "{report:?}");
    let info = stream.consumer_info("term").await;
    assert_eq!(
        (info.num_pending, info.num_ack_pending, info.num_redelivered),
        (0, 0, 0),
        "{info:?}"
    );
    stream.delete().await;
}

/// A deployment fault halts the pump; its message goes back unprocessed, at once, and a new
/// pump, once the fault is fixed, gets it again and processes it.
#[tokio::test]
async fn a_deployment_fault_halts_and_the_message_is_redelivered() {
    let stream = Stream::create("halt", Duration::from_secs(120)).await;
    let one = stream.publish(Some("one"), "one").await.sequence;
    let store = Store::new();
    store.connect().batch_execute("DROP TABLE inbox").unwrap();
    let pump = Pump::new();
    let consumer = stream.consumer(&pump, "halt").await;
    let stopped = within(
        Duration::from_secs(30),
        "the pump",
        pump.run(
            &stream.jetstream,
            &consumer,
            std::future::pending(),
            |message| {
                let answer = handle(&store, &message);
                async move { answer }
            },
        ),
    )
    .await
    .unwrap_err();
    match &stopped {
        Stopped::Halted { answer, report } => {
            assert!(answer.contains("Schema"), "{answer}");
            assert_eq!(report.halted, 1, "{report:?}");
        }
        other => panic!("{other:?}"),
    }
    assert!(store.effects().is_empty());

    // The fault fixed: the message is there at once (ack_wait is 30 s).
    store
        .connect()
        .batch_execute(&inbox_diesel::schema::sqlite::create_table_sql(
            &InboxSchema::DEFAULT,
        ))
        .unwrap();
    let sequences = Mutex::new(Vec::new());
    let report = within(
        Duration::from_secs(10),
        "the second pump",
        pump.run(&stream.jetstream, &consumer, store.applied(1), |message| {
            sequences
                .lock()
                .unwrap()
                .push(message.info().unwrap().stream_sequence);
            let answer = handle(&store, &message);
            async move { answer }
        }),
    )
    .await
    .unwrap();
    assert_eq!(report.acked, 1, "{report:?}");
    assert_eq!(*sequences.lock().unwrap(), [one]);
    assert_eq!(store.effects(), [("one".to_owned(), 1)]);
    stream.delete().await;
}

/// Runs two pumps on one durable consumer whose `ack_wait` is 1 s, with a handler that takes
/// 3 s; returns each call's delivery count and how many deliveries the consumer made.
async fn long_handler_beside_a_second_consumer(test: &str, pump: Pump) -> (Vec<u32>, u64) {
    let stream = Stream::create(test, Duration::from_secs(120)).await;
    stream.publish(Some("long"), "long").await;
    let store = Store::new();
    let first = stream.consumer(&pump, test).await;
    let second = stream.consumer(&pump, test).await;
    let calls = Mutex::new(Vec::new());
    let handler = |message: jetstream::Message| {
        calls.lock().unwrap().push(delivery_count(&message));
        let store = &store;
        async move {
            tokio::time::sleep(Duration::from_secs(3)).await;
            handle(store, &message)
        }
    };
    // Until the message was applied, and another ack_wait after that.
    let done = || async {
        store.applied(1).await;
        tokio::time::sleep(Duration::from_millis(1500)).await;
    };
    let (a, b) = within(Duration::from_secs(30), "the pumps", async {
        tokio::join!(
            pump.run(&stream.jetstream, &first, done(), handler),
            pump.run(&stream.jetstream, &second, done(), handler),
        )
    })
    .await;
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(store.effects(), [("long".to_owned(), 1)]);
    let calls = calls.into_inner().unwrap();
    assert_eq!((a.acked + b.acked) as usize, calls.len(), "{a:?} {b:?}");
    let info = stream.consumer_info(test).await;
    assert_eq!((info.num_pending, info.num_ack_pending), (0, 0), "{info:?}");
    stream.delete().await;
    (calls, info.delivered.consumer_sequence)
}

/// A handler that runs three times the consumer's `ack_wait`: the pump's progress reports
/// keep the message from the second consumer waiting beside it; it is delivered once.
#[tokio::test]
async fn progress_keeps_a_long_handlers_message_from_a_second_consumer() {
    let pump = Pump::new().ack_wait(Duration::from_secs(1));
    let (calls, deliveries) = long_handler_beside_a_second_consumer("progress", pump).await;
    assert_eq!((calls, deliveries), (vec![1], 1));
}

/// The same without progress reports in time: JetStream delivers the message again while
/// the first handler runs — the case the reports prevent (and the inbox still applies it
/// once).
#[tokio::test]
async fn without_progress_the_message_is_delivered_again_while_its_handler_runs() {
    let pump = Pump::new()
        .ack_wait(Duration::from_secs(1))
        .progress_every(Duration::from_secs(60));
    let (calls, deliveries) = long_handler_beside_a_second_consumer("no-progress", pump).await;
    assert!(calls.len() >= 2 && calls[..2] == [1, 2], "{calls:?}");
    assert_eq!(deliveries, calls.len() as u64);
}

/// A shutdown while handlers run: those in hand finish and are acknowledged, nothing is left
/// waiting for `ack_wait`, and a new pump processes the rest at once: every message exactly
/// once across the stop and the restart.
#[tokio::test]
async fn a_shutdown_loses_nothing() {
    let stream = Stream::create("shutdown", Duration::from_secs(120)).await;
    for n in 0..30 {
        let id = format!("s{n:02}");
        stream.publish(Some(&id), &id).await;
    }
    let store = Store::new();
    let pump = Pump::new().max_ack_pending(4);
    let consumer = stream.consumer(&pump, "shutdown").await;
    let inside = tokio::sync::Notify::new();
    let started = AtomicU32::new(0);
    let report = within(
        Duration::from_secs(30),
        "the pump",
        pump.run(&stream.jetstream, &consumer, inside.notified(), |message| {
            let first = started.fetch_add(1, Ordering::SeqCst) == 0;
            let (store, inside) = (&store, &inside);
            async move {
                if first {
                    // The shutdown comes while this handler is in hand.
                    inside.notify_one();
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                handle(store, &message)
            }
        }),
    )
    .await
    .unwrap();
    let processed = store.effects();
    assert!(!processed.is_empty());
    assert!(processed.len() < 30, "{processed:?}");
    assert!(processed.iter().all(|(_, n)| *n == 1));
    assert_eq!(report.acked as usize, processed.len(), "{report:?}");
    // Pending acknowledgement: only what was handed back unstarted, until it is redelivered.
    let info = stream.consumer_info("shutdown").await;
    assert_eq!(
        info.num_ack_pending as u64, report.returned_unstarted,
        "{info:?} {report:?}"
    );

    let report = within(
        Duration::from_secs(10),
        "the second pump",
        pump.run(&stream.jetstream, &consumer, store.applied(30), |message| {
            let answer = handle(&store, &message);
            async move { answer }
        }),
    )
    .await
    .unwrap();
    assert_eq!(report.acked as usize, 30 - processed.len(), "{report:?}");
    let effects = store.effects();
    assert_eq!(effects.len(), 30);
    assert!(effects.iter().all(|(_, n)| *n == 1), "{effects:?}");
    stream.delete().await;
}

/// Messages published while the pump waits for them, the shutdown coming as the last is
/// stored: what arrives as the pump stops goes back unstarted, at once (the new pump has
/// 10 s, the consumer's `ack_wait` is 30 s), and a new pump processes it; every message
/// exactly once.
#[tokio::test]
async fn messages_arriving_as_the_pump_stops_go_back_at_once() {
    let stream = Stream::create("arriving", Duration::from_secs(120)).await;
    let store = Store::new();
    let pump = Pump::new();
    let consumer = stream.consumer(&pump, "arriving").await;
    let publish = async {
        // The pump's pull request is waiting by now.
        tokio::time::sleep(Duration::from_millis(300)).await;
        for n in 0..10 {
            let id = format!("a{n}");
            stream.publish(Some(&id), &id).await;
        }
    };
    let report = within(
        Duration::from_secs(30),
        "the pump",
        pump.run(&stream.jetstream, &consumer, publish, |message| {
            let store = &store;
            async move {
                tokio::time::sleep(Duration::from_millis(200)).await;
                handle(store, &message)
            }
        }),
    )
    .await
    .unwrap();
    let processed = store.effects().len();
    assert_eq!(report.acked as usize, processed, "{report:?}");
    let report = within(
        Duration::from_secs(10),
        "the second pump",
        pump.run(&stream.jetstream, &consumer, store.applied(10), |message| {
            let answer = handle(&store, &message);
            async move { answer }
        }),
    )
    .await
    .unwrap();
    assert_eq!(report.acked as usize, 10 - processed, "{report:?}");
    let effects = store.effects();
    assert_eq!(effects.len(), 10);
    assert!(effects.iter().all(|(_, n)| *n == 1), "{effects:?}");
    stream.delete().await;
}

/// The consumer deleted on the server: the pump says so rather than report a shutdown
/// nobody asked for.
#[tokio::test]
async fn a_deleted_consumer_stops_the_pump() {
    let stream = Stream::create("deleted", Duration::from_secs(120)).await;
    let pump = Pump::new();
    let consumer = stream.consumer(&pump, "deleted").await;
    let admin = connect().await;
    let name = stream.name.clone();
    let deleter = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        admin
            .delete_consumer_from_stream("deleted", &name)
            .await
            .unwrap();
    });
    let stopped = within(
        Duration::from_secs(30),
        "the pump",
        pump.run(
            &stream.jetstream,
            &consumer,
            std::future::pending(),
            |_message| async { Ok::<Outcome<()>, Action>(Outcome::Processed(())) },
        ),
    )
    .await
    .unwrap_err();
    assert!(matches!(stopped, Stopped::Deleted { .. }), "{stopped:?}");
    deleter.await.unwrap();
    stream.delete().await;
}

/// A consumer that acknowledges with `AckPolicy::All` would have one handler's ack settle
/// messages other handlers still hold: refused before anything is pulled.
#[tokio::test]
async fn a_consumer_acknowledging_all_is_refused() {
    let stream = Stream::create("ack-all", Duration::from_secs(120)).await;
    let pump = Pump::new();
    let consumer: PullConsumer = stream
        .jetstream
        .create_consumer_on_stream(
            pull::Config {
                ack_policy: AckPolicy::All,
                ..pump.consumer_config("ack-all")
            },
            &stream.name,
        )
        .await
        .unwrap();
    let stopped = pump
        .run(
            &stream.jetstream,
            &consumer,
            std::future::pending(),
            |_message| async { Ok::<Outcome<()>, Action>(Outcome::Processed(())) },
        )
        .await
        .unwrap_err();
    assert!(
        stopped.to_string().contains("AckPolicy::Explicit"),
        "{stopped}"
    );
    stream.delete().await;
}

/// A server that does not answer: the error names the address it was asked at.
#[tokio::test]
async fn an_unreachable_server_is_named_in_the_error() {
    let started = Instant::now();
    let error = inbox_nats::connect("nats://127.0.0.1:1", ConnectOptions::new())
        .await
        .unwrap_err();
    assert!(matches!(error, Unreachable::Server { .. }), "{error:?}");
    assert_eq!(
        error.to_string(),
        "cannot connect to the NATS server at nats://127.0.0.1:1"
    );
    let cause = std::error::Error::source(&error).unwrap().to_string();
    assert!(cause.contains("refused"), "{cause}");
    assert!(started.elapsed() < Duration::from_secs(10));
}

/// Each message is one span in the OpenTelemetry messaging conventions, exported through
/// `tracing-opentelemetry`: `process {stream}`, the system, the stream, the delivery count,
/// the consumer, the stored id, the outcome and the settlement.
#[tokio::test]
async fn each_message_is_one_process_span() {
    use opentelemetry::trace::{SpanKind, TracerProvider as _};
    use tracing_subscriber::layer::SubscriberExt;

    let exporter = opentelemetry_sdk::trace::InMemorySpanExporter::default();
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("inbox-nats")));
    let _default = tracing::subscriber::set_default(subscriber);

    let stream = Stream::create("spans", Duration::from_secs(1)).await;
    stream.publish(Some("s1"), "s1").await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    stream.publish(Some("s1"), "s1").await;
    let store = Store::new();
    let pump = Pump::new().max_ack_pending(1);
    let consumer = stream.consumer(&pump, "spans").await;
    let answered = AtomicU32::new(0);
    let report = within(
        Duration::from_secs(30),
        "the pump",
        pump.run(
            &stream.jetstream,
            &consumer,
            counted(&answered, 2),
            |message| {
                let answer = handle(&store, &message);
                answered.fetch_add(1, Ordering::SeqCst);
                async move { answer }
            },
        ),
    )
    .await
    .unwrap();
    assert_eq!(report.acked, 2, "{report:?}");
    let name = stream.name.clone();
    stream.delete().await;
    provider.force_flush().unwrap();

    let spans: Vec<_> = exporter
        .get_finished_spans()
        .unwrap()
        .into_iter()
        .filter(|span| span.name.starts_with("process"))
        .collect();
    assert_eq!(spans.len(), 2, "{spans:#?}");
    let stored = MessageKey::text("s1").unwrap().stored_id().to_string();
    let mut outcomes = Vec::new();
    for span in &spans {
        assert_eq!(span.name, format!("process {name}"));
        assert_eq!(span.span_kind, SpanKind::Consumer);
        let attribute = |key: &str| {
            span.attributes
                .iter()
                .find(|kv| kv.key.as_str() == key)
                .map(|kv| kv.value.as_str().into_owned())
                .unwrap_or_else(|| panic!("no {key} in {:?}", span.attributes))
        };
        assert_eq!(attribute("messaging.system"), "nats");
        assert_eq!(attribute("messaging.destination.name"), name);
        assert_eq!(attribute("messaging.consumer.group.name"), "credits");
        // The broker's id as the conventions name it, the inbox's row's beside it.
        assert_eq!(attribute("messaging.message.id"), "s1");
        assert_eq!(attribute("inbox.stored_id"), stored);
        assert_eq!(attribute("inbox.delivery_count"), "1");
        assert_eq!(attribute("inbox.settlement"), "ack");
        outcomes.push(attribute("inbox.outcome"));
    }
    outcomes.sort();
    assert_eq!(outcomes, ["duplicate", "processed"]);
}

/// The outbox's side: a SQLite database whose handler publishes, relayed to JetStream.
mod outbox {
    use super::*;
    use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
    use inbox_diesel::outbox::relay::Relay;
    use inbox_diesel::outbox::{Message, Outbox};
    use inbox_nats::outbox::{LIMITS, OutboxSink};

    static OUTBOX: Outbox = Outbox::new("outbox").limits(LIMITS);

    /// Publishes `n` messages to `subject`, the business change beside them.
    #[idempotent(consumer = "orders", key = key)]
    fn place(
        conn: &mut SqliteConnection,
        key: &MessageKey,
        subject: &str,
        n: u32,
    ) -> Result<(), inbox_diesel::Error> {
        diesel::sql_query("INSERT INTO effects (message) VALUES ('placed')").execute(conn)?;
        for at in 0..n {
            OUTBOX.publish(
                conn,
                Message::new(subject, format!("event {at}")).header("at", at.to_string()),
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

    fn outbox_ids(store: &Store) -> Vec<String> {
        #[derive(QueryableByName)]
        struct Id {
            #[diesel(sql_type = diesel::sql_types::Text)]
            id: String,
        }
        diesel::sql_query("SELECT id FROM outbox ORDER BY seq")
            .load::<Id>(&mut store.connect())
            .unwrap()
            .into_iter()
            .map(|row| row.id)
            .collect()
    }

    /// Relayed with the stream's acknowledgement, each message keyed downstream by its outbox
    /// id; sent again after a lost mark, JetStream keeps one copy (the same `Nats-Msg-Id`
    /// inside its window), and a downstream inbox applies each once.
    #[tokio::test]
    async fn relayed_messages_reach_the_stream_once_with_their_ids() {
        let stream = Stream::create("outbox", Duration::from_secs(120)).await;
        let subject = format!("{}.credits", stream.name);
        let upstream = store();
        let key = MessageKey::text("order-1").unwrap();
        assert!(
            place(&mut upstream.connect(), &key, &subject, 3)
                .unwrap()
                .is_processed()
        );
        assert!(
            place(&mut upstream.connect(), &key, &subject, 3)
                .unwrap()
                .is_duplicate()
        );
        let mut sink = OutboxSink::new(stream.jetstream.clone());
        let mut conn = SyncConnectionWrapper::new(upstream.connect());
        let relay = Relay::new(OUTBOX);
        assert_eq!(relay.run_once(&mut conn, &mut sink).await.unwrap().sent, 3);
        // As if the relay had stopped before its marks: the same messages go again.
        upstream
            .connect()
            .batch_execute("UPDATE outbox SET sent_at = NULL")
            .unwrap();
        assert_eq!(relay.run_once(&mut conn, &mut sink).await.unwrap().sent, 3);
        assert_eq!(stream.messages().await, 3);

        let downstream = Store::new();
        let pump = Pump::new();
        let consumer = stream.consumer(&pump, "outbox").await;
        let seen = Mutex::new(Vec::new());
        let answered = AtomicU32::new(0);
        within(
            Duration::from_secs(30),
            "the pump",
            pump.run(
                &stream.jetstream,
                &consumer,
                counted(&answered, 3),
                |message| {
                    let id = message
                        .headers
                        .as_ref()
                        .and_then(|h| h.get("Nats-Msg-Id"))
                        .map(|v| v.to_string())
                        .unwrap_or_default();
                    seen.lock().unwrap().push(id);
                    let answer = handle(&downstream, &message);
                    answered.fetch_add(1, Ordering::SeqCst);
                    async move { answer }
                },
            ),
        )
        .await
        .unwrap();
        assert_eq!(*seen.lock().unwrap(), outbox_ids(&upstream));
        let effects = downstream.effects();
        assert_eq!(effects.len(), 3, "{effects:?}");
        assert!(effects.iter().all(|(_, n)| *n == 1));
        stream.delete().await;
    }

    /// A subject no stream takes: rejected by the server, parked after the relay's attempts
    /// with the reason, not lost.
    #[tokio::test]
    async fn a_subject_no_stream_takes_is_parked() {
        let upstream = store();
        let key = MessageKey::text("order-2").unwrap();
        let nowhere = format!("inbox-nats-nowhere-{}.x", std::process::id());
        assert!(
            place(&mut upstream.connect(), &key, &nowhere, 1)
                .unwrap()
                .is_processed()
        );
        let mut sink = OutboxSink::new(connect().await);
        let mut conn = SyncConnectionWrapper::new(upstream.connect());
        let relay = Relay::new(OUTBOX)
            .max_attempts(2)
            .backoff(Duration::from_millis(1), Duration::from_millis(1));
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
        .get_result(&mut upstream.connect())
        .unwrap();
        assert!(row.last_error.contains("no stream"), "{}", row.last_error);
    }

    /// What NATS cannot carry is refused in the handler, before any SQL: its work rolls back.
    #[test]
    fn what_nats_cannot_carry_is_refused_in_the_handler() {
        #[idempotent(consumer = "orders", key = key)]
        fn publish(
            conn: &mut SqliteConnection,
            key: &MessageKey,
            message: &Message,
        ) -> Result<(), inbox_diesel::Error> {
            diesel::sql_query("INSERT INTO effects (message) VALUES ('placed')").execute(conn)?;
            OUTBOX.publish(conn, message.clone())?;
            Ok(())
        }
        let upstream = store();
        let key = MessageKey::text("order-3").unwrap();
        for (message, why) in [
            (Message::new("orders.*", "x"), "without wildcards"),
            (
                Message::new("orders", "x").header("a b", "x"),
                "without `:` or spaces",
            ),
            (
                Message::new("orders", vec![0; (1 << 20) + 1]),
                "at most 1048576 bytes",
            ),
        ] {
            let error = publish(&mut upstream.connect(), &key, &message).unwrap_err();
            assert!(error.to_string().contains(why), "{error}");
            assert_eq!(error.action(), Action::DeadLetter);
        }
        assert!(upstream.effects().is_empty());
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

/// A handler that panics on one message settles that message only: the pump goes on with
/// the others, the panicking one is handed back (`Nak`, its transaction rolled back as the
/// panic unwound) and applied once when it comes again — none terminated.
#[tokio::test]
async fn a_panicking_handler_settles_its_own_message_only() {
    let stream = Stream::create("panic", Duration::from_secs(120)).await;
    for body in ["a", "poison", "b", "c"] {
        stream.publish(Some(body), body).await;
    }
    let store = Store::new();
    let pump = Pump::new().redelivery(Redelivery::exponential(
        Duration::from_millis(100),
        Duration::from_millis(100),
    ));
    let consumer = stream.consumer(&pump, "panic").await;
    let panics = AtomicU32::new(0);
    let report = within(
        Duration::from_secs(30),
        "the pump",
        pump.run(&stream.jetstream, &consumer, store.applied(4), |message| {
            let key = key(&message).unwrap();
            let body = String::from_utf8_lossy(&message.payload).into_owned();
            let answer = apply_or_panic(&mut store.connect(), &key, &body, &panics);
            async move { answer }
        }),
    )
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
    stream.delete().await;
}

/// A NATS server of the test's own — the machine's `nats-server`, JetStream on a temporary
/// directory (file storage), a free port — which a test kills and starts again: the server's
/// crash provoked for real, the shared server untouched.
mod private_server {
    use super::*;
    use std::process::{Child, Command, Stdio};

    struct Server {
        dir: tempfile::TempDir,
        port: u16,
        child: Option<Child>,
    }

    impl Server {
        fn new() -> Self {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let mut server = Self {
                dir: tempfile::tempdir().unwrap(),
                port,
                child: None,
            };
            server.start();
            server
        }

        fn url(&self) -> String {
            format!("nats://127.0.0.1:{}", self.port)
        }

        /// Starts the server on its directory and port; waits until it takes connections.
        fn start(&mut self) {
            let dir = self.dir.path();
            let log = std::fs::File::create(dir.join("server.log")).unwrap();
            let child = Command::new("nats-server")
                .args([
                    "-a",
                    "127.0.0.1",
                    "-p",
                    &self.port.to_string(),
                    "-js",
                    "-sd",
                ])
                .arg(dir.join("jetstream"))
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap_or_else(|e| panic!("nats-server (the machine's NATS) cannot start: {e}"));
            self.child = Some(child);
            let deadline = Instant::now() + Duration::from_secs(30);
            while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
                let exited = self.child.as_mut().unwrap().try_wait().unwrap();
                if exited.is_some() || Instant::now() > deadline {
                    let log = std::fs::read_to_string(dir.join("server.log")).unwrap_or_default();
                    panic!("the private NATS server did not start ({exited:?}):\n{log}");
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }

        /// `SIGKILL`, as a crash or a power cut ends it.
        fn kill(&mut self) {
            if let Some(mut child) = self.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }

    impl Drop for Server {
        fn drop(&mut self) {
            self.kill();
        }
    }

    /// The server killed while a handler holds a committed message, before its
    /// acknowledgement, and started again a second later: the same pump carries on over
    /// async-nats' reconnection — the acknowledgement sent once it is back, or the message
    /// redelivered after `ack_wait` and answered `Duplicate` — and the messages no handler
    /// had taken are processed; each applied once, none lost.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_server_killed_before_the_ack_loses_nothing() {
        let mut server = Server::new();
        let jetstream = inbox_nats::connect(&server.url(), ConnectOptions::new())
            .await
            .unwrap();
        let name = "inbox-nats-killed";
        jetstream
            .create_stream(stream::Config {
                name: name.to_owned(),
                subjects: vec![format!("{name}.>")],
                storage: stream::StorageType::File,
                ..stream::Config::default()
            })
            .await
            .unwrap();
        for body in ["a", "b", "c"] {
            let mut headers = HeaderMap::new();
            headers.insert(async_nats::header::NATS_MESSAGE_ID, body);
            // Awaited twice: the server stored it.
            jetstream
                .publish_with_headers(format!("{name}.credits"), headers, body.into())
                .await
                .unwrap()
                .await
                .unwrap();
        }
        let store = Store::new();
        let pump = Pump::new()
            .max_ack_pending(1)
            .ack_wait(Duration::from_secs(2));
        let consumer = pump.consumer(&jetstream, name, "killed").await.unwrap();
        let answers = Mutex::new(Vec::new());
        let first = AtomicU32::new(0);
        let server = Mutex::new(&mut server);
        // Until every message is applied and the consumer holds none unacknowledged, then an
        // `ack_wait` more, for a redelivery to show.
        let settled = async {
            store.applied(3).await;
            loop {
                let info = async {
                    let stream = jetstream.get_stream(name).await.ok()?;
                    stream.consumer_info("killed").await.ok()
                };
                if let Some(info) = info.await
                    && info.num_ack_pending == 0
                    && info.num_pending == 0
                {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            tokio::time::sleep(Duration::from_secs(3)).await;
        };
        let report = within(
            Duration::from_secs(90),
            "the pump",
            pump.run(&jetstream, &consumer, settled, |message| {
                let answer = handle(&store, &message);
                let said = match &answer {
                    Ok(outcome) if outcome.is_processed() => "processed".to_owned(),
                    Ok(outcome) if outcome.is_duplicate() => "duplicate".to_owned(),
                    other => format!("{other:?}"),
                };
                let body = String::from_utf8_lossy(&message.payload).into_owned();
                answers.lock().unwrap().push(format!("{body}: {said}"));
                let crash = first.fetch_add(1, Ordering::SeqCst) == 0;
                let server = &server;
                async move {
                    if crash {
                        // Committed; the server dies before the acknowledgement, and is back
                        // a second later.
                        server.lock().unwrap().kill();
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        server.lock().unwrap().start();
                    }
                    answer
                }
            }),
        )
        .await
        .unwrap();
        let answers = answers.lock().unwrap().clone();
        assert_eq!(
            store.effects(),
            [("a", 1), ("b", 1), ("c", 1)].map(|(m, n)| (m.to_owned(), n)),
            "{answers:?} {report:?}"
        );
        // `a`'s acknowledgement reaches the server after the reconnection, or — counted
        // unconfirmed — it is redelivered and answered `Duplicate`.
        let redelivered = usize::from(answers.contains(&"a: duplicate".to_owned()));
        assert_eq!(answers.len(), 3 + redelivered, "{answers:?} {report:?}");
        assert!(
            answers
                .iter()
                .all(|a| a.ends_with(": processed") || a == "a: duplicate"),
            "{answers:?}"
        );
        assert_eq!(
            report.acked as usize,
            3 + redelivered - report.unconfirmed as usize,
            "{report:?}"
        );
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
/// 3 s lease. The message comes back under `max_deliver` 3 and short delays (100 ms,
/// 200 ms): every delivery before the lease ends answers `InFlight`, which used to spend
/// the three deliveries in half a second — the message then never came back and its side
/// effect never ran. The second delivery is `Nak`ed until the lease has ended
/// (`Settlement::Held`), and the third takes the claim over and sends once.
#[tokio::test]
async fn a_crashed_claim_is_waited_out_within_max_deliver() {
    // A subscriber of this thread's, as `each_message_is_one_process_span` has: without
    // one, that test, run beside this one, saw none of its process spans (three runs of
    // three; tracing caches whether a callsite is enabled, process-wide).
    let _default = tracing::subscriber::set_default(tracing_subscriber::registry());
    let stream = Stream::create("held", Duration::from_secs(120)).await;
    let store = Store::new();
    let sent = AtomicU32::new(0);
    let crashed = MessageKey::text("crashed").unwrap();
    inbox_diesel::testing::crash(
        store.connect(),
        inbox_diesel::testing::Crash::AfterClaim,
        |conn| mail(conn, &crashed, &sent),
    );
    assert_eq!(sent.load(Ordering::SeqCst), 0);
    stream.publish(Some("crashed"), "crashed").await;
    let pump = Pump::new()
        .max_deliver(3)
        .redelivery(Redelivery::exponential(
            Duration::from_millis(100),
            Duration::from_millis(200),
        ));
    let consumer = stream.consumer(&pump, "held").await;
    let counts = Mutex::new(Vec::new());
    let done = counted(&sent, 1);
    let report = within(
        Duration::from_secs(15),
        "the message's side effect",
        pump.run(&stream.jetstream, &consumer, done, |message| {
            counts.lock().unwrap().push(delivery_count(&message));
            let answer = mail(&mut store.connect(), &key(&message).unwrap(), &sent);
            async move { answer }
        }),
    )
    .await
    .unwrap();
    assert_eq!(sent.load(Ordering::SeqCst), 1, "{report:?}");
    assert_eq!((report.retried, report.acked), (2, 1), "{report:?}");
    assert_eq!(*counts.lock().unwrap(), [1, 2, 3]);
    stream.delete().await;
}

/// A message that takes the process down — a build with `panic = "abort"`, an
/// out-of-memory kill — takes every message in hand with it, and JetStream counts a
/// delivery of each. Here the process's death is the pump's future dropped the moment the
/// poison message's handler starts: nothing is acknowledged or handed back, as nothing is
/// when a process dies, and JetStream delivers what was in hand again after `ack_wait`.
/// A supervisor starts the consumer again, five times. With `max_deliver` 3, the poison
/// message is delivered three times and never again; the 19 others are each applied once —
/// where a pump that started each run at full width (8 at once) took the same neighbours
/// down with the poison message on every run, until their deliveries ran out.
#[tokio::test]
async fn a_message_that_kills_the_process_dies_alone_after_a_restart() {
    let stream = Stream::create("deaths", Duration::from_secs(120)).await;
    for n in 0..20 {
        let id = format!("d{n:02}");
        stream.publish(Some(&id), &id).await;
    }
    let store = Store::new();
    let pump = Pump::new()
        .max_ack_pending(8)
        .max_deliver(3)
        .ack_wait(Duration::from_secs(1));
    let consumer = stream.consumer(&pump, "deaths").await;
    let poison_deliveries = AtomicU32::new(0);
    let mut deaths = 0;
    for _ in 0..6 {
        let poisoned = tokio::sync::Notify::new();
        let run = pump.run(&stream.jetstream, &consumer, store.applied(19), |message| {
            let poison = key(&message).unwrap() == MessageKey::text("d03").unwrap();
            if poison {
                poison_deliveries.fetch_add(1, Ordering::SeqCst);
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
                handle(store, &message)
            }
        });
        tokio::select! {
            report = run => {
                report.unwrap();
                break;
            }
            () = poisoned.notified() => deaths += 1,
            // Neither done nor dead: what is missing is never delivered again.
            () = tokio::time::sleep(Duration::from_secs(10)) => break,
        }
        // The supervisor's restart, after JetStream's `ack_wait` gave back what was in hand.
        tokio::time::sleep(Duration::from_millis(1_200)).await;
    }
    let effects = store.effects();
    assert_eq!(effects.len(), 19, "{effects:?}");
    assert!(effects.iter().all(|(_, n)| *n == 1), "{effects:?}");
    assert_eq!(deaths, 3);
    assert_eq!(poison_deliveries.load(Ordering::SeqCst), 3);
    stream.delete().await;
}
