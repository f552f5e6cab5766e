//! The pump and the outbox's sink against a real SQS-compatible server and a real SQLite
//! inbox. Each test starts a server of its own — moto's `moto_server` (`INBOX_TEST_MOTO`,
//! else `moto_server` on the PATH; `.ci/run` installs it) on a private port — and kills it at
//! the end. A missing server fails the suite.

use std::collections::BTreeMap;
use std::future::Future;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use aws_sdk_sqs::Client;
use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_sqs::types::{Message, MessageAttributeValue, QueueAttributeName};
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use inbox_diesel::{InboxSchema, MessageKey, Outcome, Redelivery, Settlement, idempotent};
use inbox_sqs::{
    DEAD_LETTER_QUEUE, DEAD_LETTER_REASON, MESSAGE_ID, Pump, Stopped, key, receive_count,
};

/// The server binary: `INBOX_TEST_MOTO`, else `moto_server` on the PATH.
fn moto() -> String {
    let program = std::env::var("INBOX_TEST_MOTO").unwrap_or_else(|_| "moto_server".to_owned());
    match Command::new(&program).arg("--help").output() {
        Ok(output) if output.status.success() => program,
        found => panic!(
            "the SQS-compatible server `{program}` cannot run ({found:?}): set INBOX_TEST_MOTO \
             to moto's moto_server (`.ci/run` installs it)"
        ),
    }
}

/// A server of the test's own, killed when dropped.
struct Server {
    child: Child,
    client: Client,
}

impl Server {
    async fn start() -> Self {
        let program = moto();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(program)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let endpoint = format!("http://127.0.0.1:{port}");
        let config = aws_sdk_sqs::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .endpoint_url(&endpoint)
            .credentials_provider(Credentials::new("test", "test", None, None, "tests"))
            .build();
        let server = Self {
            child,
            client: Client::from_conf(config),
        };
        let started = Instant::now();
        while server.client.list_queues().send().await.is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "moto_server did not answer at {endpoint} within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        server
    }

    /// A queue named `name` (FIFO if it ends in `.fifo`) with its dead-letter queue
    /// `<name>-dead` and a redrive policy of `max_receive_count`; its URL.
    async fn queue(&self, name: &str, visibility: u32, max_receive_count: u32) -> String {
        let fifo = name.ends_with(".fifo");
        let dead = match name.strip_suffix(".fifo") {
            Some(stem) => format!("{stem}-dead.fifo"),
            None => format!("{name}-dead"),
        };
        let dead_url = self.create(&dead, fifo, &[]).await;
        let arn = self
            .client
            .get_queue_attributes()
            .queue_url(&dead_url)
            .attribute_names(QueueAttributeName::QueueArn)
            .send()
            .await
            .unwrap()
            .attributes
            .unwrap()[&QueueAttributeName::QueueArn]
            .clone();
        let policy =
            format!(r#"{{"deadLetterTargetArn":"{arn}","maxReceiveCount":"{max_receive_count}"}}"#);
        self.create(
            name,
            fifo,
            &[
                (
                    QueueAttributeName::VisibilityTimeout,
                    visibility.to_string(),
                ),
                (QueueAttributeName::RedrivePolicy, policy),
            ],
        )
        .await
    }

    async fn create(
        &self,
        name: &str,
        fifo: bool,
        attributes: &[(QueueAttributeName, String)],
    ) -> String {
        let mut request = self.client.create_queue().queue_name(name);
        if fifo {
            request = request.attributes(QueueAttributeName::FifoQueue, "true");
        }
        for (attribute, value) in attributes {
            request = request.attributes(attribute.clone(), value);
        }
        request.send().await.unwrap().queue_url.unwrap()
    }

    /// Sends `body` with a `message-id` attribute if given (and a group on FIFO queues).
    async fn send(&self, url: &str, id: Option<&str>, body: &str, group: Option<&str>) {
        let mut request = self.client.send_message().queue_url(url).message_body(body);
        if let Some(id) = id {
            request = request.message_attributes(MESSAGE_ID, text(id));
        }
        if let Some(group) = group {
            // Each send a new deduplication id: a producer's retry after the five minutes.
            request = request
                .message_group_id(group)
                .message_deduplication_id(format!("{body}-{}", fastrand::u64(..)));
        }
        request.send().await.unwrap();
    }

    /// Messages in the queue: visible, and in flight.
    async fn depth(&self, url: &str) -> (u64, u64) {
        let attributes = self
            .client
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(QueueAttributeName::All)
            .send()
            .await
            .unwrap()
            .attributes
            .unwrap();
        let n = |name| attributes[&name].parse::<u64>().unwrap();
        (
            n(QueueAttributeName::ApproximateNumberOfMessages),
            n(QueueAttributeName::ApproximateNumberOfMessagesNotVisible),
        )
    }

    /// The messages of the queue at `url`, received until `n` came.
    async fn drain(&self, url: &str, n: usize) -> Vec<Message> {
        let mut messages = Vec::new();
        within(Duration::from_secs(30), "draining", async {
            while messages.len() < n {
                let output = self
                    .client
                    .receive_message()
                    .queue_url(url)
                    .max_number_of_messages(10)
                    .wait_time_seconds(1)
                    .message_attribute_names("All")
                    .send()
                    .await
                    .unwrap();
                messages.extend(output.messages.unwrap_or_default());
            }
        })
        .await;
        messages
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn text(value: &str) -> MessageAttributeValue {
    MessageAttributeValue::builder()
        .data_type("String")
        .string_value(value)
        .build()
        .unwrap()
}

fn attribute(message: &Message, name: &str) -> Option<String> {
    message
        .message_attributes()?
        .get(name)?
        .string_value()
        .map(str::to_owned)
}

/// Fails the test when `future` takes longer than `limit`, rather than hanging the suite.
async fn within<T>(limit: Duration, what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(limit, future)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within {limit:?}"))
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

    fn effects(&self) -> BTreeMap<String, i64> {
        #[derive(QueryableByName)]
        struct Row {
            #[diesel(sql_type = diesel::sql_types::Text)]
            message: String,
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            n: i64,
        }
        diesel::sql_query("SELECT message, count(*) AS n FROM effects GROUP BY message")
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

fn handle(store: &Store, message: &Message) -> Result<Outcome<()>, inbox_diesel::Error> {
    let key = key(message).map_err(inbox_diesel::Error::InvalidKey)?;
    apply(
        &mut store.connect(),
        &key,
        message.body().unwrap_or_default(),
    )
}

async fn counted(counter: &AtomicU32, n: u32) {
    while counter.load(Ordering::SeqCst) < n {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Every message sent twice with one `message-id` (a sender's retry: SQS gives the copy a
/// new `MessageId`): each applied once, every copy deleted, the queue empty.
#[tokio::test]
async fn each_message_sent_twice_is_applied_once_and_deleted() {
    let server = Server::start().await;
    let url = server.queue("credits", 30, 5).await;
    for _ in 0..2 {
        for n in 0..15 {
            let id = format!("m{n:02}");
            server.send(&url, Some(&id), &id, None).await;
        }
    }
    let store = Store::new();
    let pump = Pump::new().wait_time(Duration::from_secs(1));
    let queue = pump.queue(&server.client, &url).await.unwrap();
    let answered = AtomicU32::new(0);
    let report = within(
        Duration::from_secs(60),
        "the pump",
        pump.run(&server.client, &queue, counted(&answered, 30), |message| {
            let answer = handle(&store, &message);
            answered.fetch_add(1, Ordering::SeqCst);
            async move { answer }
        }),
    )
    .await
    .unwrap();
    assert_eq!(report.acked, 30, "{report:?}");
    let effects = store.effects();
    assert_eq!(effects.len(), 15);
    assert!(effects.values().all(|n| *n == 1), "{effects:?}");
    assert_eq!(server.depth(&url).await, (0, 0));
}

/// A handler that runs three times the queue's visibility timeout keeps its message: a
/// second consumer, receiving all along, never gets it.
#[tokio::test]
async fn visibility_is_extended_while_a_handler_runs() {
    let server = Server::start().await;
    let url = server.queue("slow", 2, 5).await;
    server.send(&url, Some("long"), "long", None).await;
    let store = Store::new();
    let pump = Pump::new().wait_time(Duration::from_secs(1));
    let queue = pump.queue(&server.client, &url).await.unwrap();
    let runs = AtomicU32::new(0);
    let done = AtomicU32::new(0);
    let consumer = |message: Message| {
        let (store, runs, done) = (&store, &runs, &done);
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_secs(6)).await;
            let answer = handle(store, &message);
            done.fetch_add(1, Ordering::SeqCst);
            answer
        }
    };
    let (first, second) = within(Duration::from_secs(60), "both consumers", async {
        tokio::join!(
            pump.run(&server.client, &queue, counted(&done, 1), consumer),
            pump.run(&server.client, &queue, counted(&done, 1), consumer),
        )
    })
    .await;
    let (first, second) = (first.unwrap(), second.unwrap());
    assert_eq!(runs.load(Ordering::SeqCst), 1, "{first:?} {second:?}");
    assert_eq!(first.acked + second.acked, 1);
    assert_eq!(server.depth(&url).await, (0, 0));
}

/// A transient failure makes the message visible again after the redelivery's delay; its
/// receive count goes up with each delivery, and the third is applied.
#[tokio::test]
async fn a_retried_message_comes_back_with_its_receive_count() {
    let server = Server::start().await;
    let url = server.queue("retries", 30, 5).await;
    server.send(&url, Some("r"), "r", None).await;
    let store = Store::new();
    let pump = Pump::new()
        .wait_time(Duration::from_secs(1))
        .redelivery(Redelivery::exponential(
            Duration::from_secs(1),
            Duration::from_secs(1),
        ));
    let queue = pump.queue(&server.client, &url).await.unwrap();
    let counts = Mutex::new(Vec::new());
    let answered = AtomicU32::new(0);
    let report = within(
        Duration::from_secs(60),
        "the pump",
        pump.run(&server.client, &queue, counted(&answered, 1), |message| {
            let count = receive_count(&message);
            counts.lock().unwrap().push(count);
            let answer = if count < 3 {
                Err(Settlement::Retry { reconnect: false })
            } else {
                answered.fetch_add(1, Ordering::SeqCst);
                handle(&store, &message).map_err(|e| inbox_diesel::Settle::settlement(&e))
            };
            async move { answer }
        }),
    )
    .await
    .unwrap();
    assert_eq!(counts.into_inner().unwrap(), [1, 2, 3]);
    assert_eq!((report.retried, report.acked), (2, 1), "{report:?}");
    assert_eq!(store.effects().len(), 1);
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
    Ok(())
}

/// A business constraint's dead letter goes to the redrive policy's queue at once, with the
/// message's attributes and where it came from and why; the original is deleted.
#[tokio::test]
async fn a_business_constraint_goes_to_the_dead_letter_queue_at_once() {
    let server = Server::start().await;
    let url = server.queue("payments", 30, 5).await;
    server.send(&url, Some("p1"), "r1", None).await;
    server.send(&url, Some("p2"), "r1", None).await;
    let store = Store::new();
    let pump = Pump::new().max_in_hand(1).wait_time(Duration::from_secs(1));
    let queue = pump.queue(&server.client, &url).await.unwrap();
    let answered = AtomicU32::new(0);
    let report = within(
        Duration::from_secs(60),
        "the pump",
        pump.run(&server.client, &queue, counted(&answered, 2), |message| {
            let answer = key(&message)
                .map_err(inbox_diesel::Error::InvalidKey)
                .and_then(|key| {
                    pay(
                        &mut store.connect(),
                        &key,
                        message.body().unwrap_or_default(),
                    )
                });
            answered.fetch_add(1, Ordering::SeqCst);
            async move { answer }
        }),
    )
    .await
    .unwrap();
    assert_eq!((report.acked, report.dead_lettered), (1, 1), "{report:?}");
    let dead = server.drain(queue.dead_letter_url(), 1).await;
    assert_eq!(attribute(&dead[0], MESSAGE_ID).as_deref(), Some("p2"));
    assert_eq!(
        attribute(&dead[0], DEAD_LETTER_QUEUE).as_deref(),
        Some("payments")
    );
    let reason = attribute(&dead[0], DEAD_LETTER_REASON).unwrap();
    assert!(reason.contains("UniqueViolation"), "{reason}");
    assert_eq!(server.depth(&url).await, (0, 0));
}

/// A message retried at every delivery is moved to the dead-letter queue by SQS itself
/// after the redrive policy's `maxReceiveCount`: the pump's retries are bounded by it.
#[tokio::test]
async fn retries_end_at_the_redrive_policys_max_receive_count() {
    let server = Server::start().await;
    let url = server.queue("poison", 30, 2).await;
    server.send(&url, Some("poison"), "poison", None).await;
    let pump = Pump::new()
        .wait_time(Duration::from_secs(1))
        .redelivery(Redelivery::exponential(
            Duration::from_secs(1),
            Duration::from_secs(1),
        ));
    let queue = pump.queue(&server.client, &url).await.unwrap();
    assert_eq!(queue.max_receive_count(), 2);
    let runs = AtomicU32::new(0);
    let moved = async {
        let dead = server.drain(queue.dead_letter_url(), 1).await;
        assert_eq!(dead[0].body(), Some("poison"));
    };
    let report = within(
        Duration::from_secs(60),
        "the pump",
        pump.run(&server.client, &queue, moved, |_message| {
            runs.fetch_add(1, Ordering::SeqCst);
            async { Err::<Outcome<()>, _>(Settlement::Retry { reconnect: false }) }
        }),
    )
    .await
    .unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 2, "{report:?}");
}

/// On a FIFO queue, a group's messages run one after the other in order, groups beside each
/// other; a retried message keeps its group's later messages behind it.
#[tokio::test]
async fn a_fifo_groups_messages_run_in_order_even_across_a_retry() {
    let server = Server::start().await;
    let url = server.queue("orders.fifo", 30, 5).await;
    for n in 0..5 {
        for group in ["a", "b"] {
            let id = format!("{group}{n}");
            server.send(&url, Some(&id), &id, Some(group)).await;
        }
    }
    let store = Store::new();
    let pump = Pump::new()
        .wait_time(Duration::from_secs(1))
        .redelivery(Redelivery::exponential(
            Duration::from_secs(1),
            Duration::from_secs(1),
        ));
    let queue = pump.queue(&server.client, &url).await.unwrap();
    assert!(queue.is_fifo());
    let runs = Mutex::new(Vec::new());
    let counts = Mutex::new(Vec::new());
    let answered = AtomicU32::new(0);
    within(
        Duration::from_secs(60),
        "the pump",
        pump.run(&server.client, &queue, counted(&answered, 10), |message| {
            let body = message.body().unwrap_or_default().to_owned();
            runs.lock().unwrap().push(body.clone());
            counts
                .lock()
                .unwrap()
                .push((body.clone(), receive_count(&message)));
            let answer = if body == "a1" && receive_count(&message) == 1 {
                Err(Settlement::Retry { reconnect: false })
            } else {
                answered.fetch_add(1, Ordering::SeqCst);
                handle(&store, &message).map_err(|e| inbox_diesel::Settle::settlement(&e))
            };
            async move { answer }
        }),
    )
    .await
    .unwrap();
    let runs = runs.into_inner().unwrap();
    for group in ["a", "b"] {
        let order: Vec<&str> = runs
            .iter()
            .filter(|body| body.starts_with(group))
            .map(String::as_str)
            .collect();
        let expected: Vec<String> = match group {
            "a" => ["a0", "a1", "a1", "a2", "a3", "a4"]
                .map(str::to_owned)
                .to_vec(),
            _ => (0..5).map(|n| format!("b{n}")).collect(),
        };
        assert_eq!(order, expected, "group {group}: {runs:?}");
    }
    // Retried in place: the messages behind `a1` were not received again with it, and `a1`'s
    // second run counts its first.
    let counts = counts.into_inner().unwrap();
    for (body, count) in &counts {
        let expected = if body == "a1" && counts.iter().filter(|(b, _)| b == "a1").count() > 1 {
            count
        } else {
            &1
        };
        assert_eq!(count, expected, "{counts:?}");
    }
    assert!(counts.contains(&("a1".to_owned(), 2)), "{counts:?}");
    let effects = store.effects();
    assert_eq!(effects.len(), 10);
    assert!(effects.values().all(|n| *n == 1), "{effects:?}");
}

/// A FIFO group's messages held behind a handler that runs three times the visibility
/// timeout stay invisible with it: a second consumer, receiving all along, gets none of
/// them, and each runs once, in order, after it.
#[tokio::test]
async fn a_fifo_groups_messages_wait_invisible_behind_a_long_handler() {
    let server = Server::start().await;
    let url = server.queue("long.fifo", 2, 5).await;
    for n in 0..3 {
        let id = format!("g{n}");
        server.send(&url, Some(&id), &id, Some("g")).await;
    }
    let store = Store::new();
    let pump = Pump::new().wait_time(Duration::from_secs(1));
    let queue = pump.queue(&server.client, &url).await.unwrap();
    let runs = Mutex::new(Vec::new());
    let done = AtomicU32::new(0);
    let consumer = |message: Message| {
        let (store, runs, done) = (&store, &runs, &done);
        async move {
            let body = message.body().unwrap_or_default().to_owned();
            runs.lock()
                .unwrap()
                .push((body.clone(), receive_count(&message)));
            if body == "g0" {
                tokio::time::sleep(Duration::from_secs(6)).await;
            }
            let answer = handle(store, &message);
            done.fetch_add(1, Ordering::SeqCst);
            answer
        }
    };
    within(Duration::from_secs(60), "both consumers", async {
        let (first, second) = tokio::join!(
            pump.run(&server.client, &queue, counted(&done, 3), consumer),
            pump.run(&server.client, &queue, counted(&done, 3), consumer),
        );
        first.unwrap();
        second.unwrap();
    })
    .await;
    assert_eq!(
        runs.into_inner().unwrap(),
        [
            ("g0".to_owned(), 1),
            ("g1".to_owned(), 1),
            ("g2".to_owned(), 1)
        ]
    );
    assert_eq!(server.depth(&url).await, (0, 0));
}

/// A halting answer stops the pump and makes its message visible again at once: it is
/// still in the queue, for a pump after the fix.
#[tokio::test]
async fn a_halt_leaves_the_message_in_the_queue() {
    let server = Server::start().await;
    let url = server.queue("halts", 30, 5).await;
    server.send(&url, Some("h"), "h", None).await;
    let pump = Pump::new().wait_time(Duration::from_secs(1));
    let queue = pump.queue(&server.client, &url).await.unwrap();
    let stopped = within(
        Duration::from_secs(60),
        "the pump",
        pump.run(
            &server.client,
            &queue,
            std::future::pending(),
            |_message| async { Err::<Outcome<()>, _>(Settlement::Halt) },
        ),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(stopped, Stopped::Halted { report, .. } if report.halted == 1),
        "{stopped:?}"
    );
    assert_eq!(server.depth(&url).await, (1, 0));
}

/// A queue without a redrive policy is refused before anything is received.
#[tokio::test]
async fn a_queue_without_a_redrive_policy_is_refused() {
    let server = Server::start().await;
    let url = server.create("bare", false, &[]).await;
    let refused = Pump::new().queue(&server.client, &url).await.unwrap_err();
    assert!(
        refused.to_string().contains("no redrive policy"),
        "{refused}"
    );
}

mod outbox {
    use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
    use inbox_diesel::outbox::relay::Relay;
    use inbox_diesel::outbox::{Message as Outgoing, Outbox};
    use inbox_sqs::outbox::{LIMITS, OutboxSink};

    use super::*;

    static OUTBOX: Outbox = Outbox::new("outbox").limits(LIMITS);

    #[idempotent(consumer = "orders", key = key)]
    fn place(
        conn: &mut SqliteConnection,
        key: &MessageKey,
        order: &str,
    ) -> Result<(), inbox_diesel::Error> {
        for at in 0..3 {
            OUTBOX.publish(
                conn,
                Outgoing::new("events.fifo", format!("{order} event {at}"))
                    .key(order)
                    .header("at", at.to_string()),
            )?;
            OUTBOX.publish(conn, Outgoing::new("audit", format!("{order} audit {at}")))?;
        }
        Ok(())
    }

    /// The relay sends each row with its id as the `message-id` attribute; to a FIFO queue
    /// with its ordering key as the group and its id as the deduplication id, so that a
    /// relay sending the rows again (it stopped before marking them) is dropped by SQS; to
    /// a standard queue the copies arrive, and the consumer's inbox answers them
    /// `Duplicate`.
    #[tokio::test]
    async fn the_outbox_sink_sends_each_row_with_its_id() {
        let server = Server::start().await;
        let events = server.queue("events.fifo", 30, 5).await;
        let audit = server.queue("audit", 30, 5).await;
        let upstream = Store::new();
        upstream
            .connect()
            .batch_execute(&OUTBOX.create_table_sql(inbox_diesel::schema::Backend::Sqlite))
            .unwrap();
        for order in ["order-1", "order-2"] {
            let _ = place(
                &mut upstream.connect(),
                &MessageKey::text(order).unwrap(),
                order,
            )
            .unwrap();
        }
        let mut sink = OutboxSink::new(server.client.clone());
        let mut conn = SyncConnectionWrapper::new(upstream.connect());
        let relay = Relay::new(OUTBOX);
        assert_eq!(relay.run_once(&mut conn, &mut sink).await.unwrap().sent, 12);
        upstream
            .connect()
            .batch_execute("UPDATE outbox SET sent_at = NULL")
            .unwrap();
        assert_eq!(relay.run_once(&mut conn, &mut sink).await.unwrap().sent, 12);
        // SQS dropped the FIFO copies; the standard queue holds both.
        assert_eq!(server.depth(&events).await, (6, 0));
        assert_eq!(server.depth(&audit).await, (12, 0));

        let downstream = Store::new();
        let pump = Pump::new().wait_time(Duration::from_secs(1));
        for (url, copies) in [(&events, 6), (&audit, 12)] {
            let queue = pump.queue(&server.client, url).await.unwrap();
            let answered = AtomicU32::new(0);
            let order = Mutex::new(Vec::new());
            within(
                Duration::from_secs(60),
                "the pump",
                pump.run(
                    &server.client,
                    &queue,
                    counted(&answered, copies),
                    |message| {
                        assert!(attribute(&message, MESSAGE_ID).is_some());
                        order
                            .lock()
                            .unwrap()
                            .push(message.body().unwrap_or_default().to_owned());
                        let answer = handle(&downstream, &message);
                        answered.fetch_add(1, Ordering::SeqCst);
                        async move { answer }
                    },
                ),
            )
            .await
            .unwrap();
            if queue.is_fifo() {
                let order = order.into_inner().unwrap();
                for key in ["order-1", "order-2"] {
                    let of_key: Vec<&String> =
                        order.iter().filter(|b| b.starts_with(key)).collect();
                    let expected: Vec<String> =
                        (0..3).map(|at| format!("{key} event {at}")).collect();
                    assert_eq!(of_key, expected.iter().collect::<Vec<_>>());
                }
            }
        }
        let effects = downstream.effects();
        assert_eq!(effects.len(), 12);
        assert!(effects.values().all(|n| *n == 1), "{effects:?}");
    }
}
