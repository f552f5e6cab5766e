// The outbox and its relay on one backend: included by `outbox.rs` into each backend's
// module, which names `Db`, `Conn`, `AsyncConn`, `BACKEND` and `connect_async`.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use inbox_diesel::outbox::relay::{Outgoing, Relay, Sink, SinkError};
use inbox_diesel::outbox::{Message, Outbox, OutboxProblem};
use inbox_diesel::{Error, idempotent};
use inbox_tests::AppError;

static OUTBOX: Outbox = Outbox::new("outbox");

/// What the downstream side received, in the order it received it, and what the sink does.
#[derive(Clone, Default)]
struct Downstream {
    received: Arc<Mutex<Vec<Outgoing>>>,
    /// Ids the broker refuses, every time.
    poison: Arc<Mutex<HashSet<inbox_diesel::Uuid>>>,
    /// The broker is down.
    down: Arc<AtomicBool>,
    /// Sends refused while it was down.
    refused: Arc<std::sync::atomic::AtomicUsize>,
}

impl Sink for Downstream {
    fn send(&mut self, message: &Outgoing) -> impl Future<Output = Result<(), SinkError>> + Send {
        let outcome = if self.down.load(Ordering::SeqCst) {
            self.refused.fetch_add(1, Ordering::SeqCst);
            Err(SinkError::Unavailable("connection refused".into()))
        } else if self.poison.lock().unwrap().contains(&message.id) {
            Err(SinkError::Rejected(
                "message too large for the server".into(),
            ))
        } else {
            self.received.lock().unwrap().push(message.clone());
            Ok(())
        };
        async move { outcome }
    }
}

impl Downstream {
    fn ids(&self) -> Vec<inbox_diesel::Uuid> {
        self.received.lock().unwrap().iter().map(|m| m.id).collect()
    }
}

/// A credit that publishes `n` events, the first two under the order's key.
#[idempotent(consumer = "orders", key = *id)]
fn place(conn: &mut Conn, id: &u64, n: u32, fail: bool) -> Result<(), AppError> {
    diesel::sql_query("UPDATE accounts SET balance = balance + 1 WHERE id = 1").execute(conn)?;
    for at in 0..n {
        let key = if at < 2 {
            format!("order-{id}")
        } else {
            String::new()
        };
        OUTBOX.publish(
            conn,
            Message::new("orders", format!("{id}/{at}"))
                .key(key)
                .header("order", id.to_string()),
        )?;
    }
    if fail {
        return Err(AppError::Rejected);
    }
    Ok(())
}

/// Publishes a message of `len` payload bytes to `destination`.
#[idempotent(consumer = "sized", key = *id)]
fn publish_sized(conn: &mut Conn, id: &u64, destination: &str, len: usize) -> Result<(), AppError> {
    diesel::sql_query("UPDATE accounts SET balance = balance + 1 WHERE id = 1").execute(conn)?;
    OUTBOX
        .limits(inbox_diesel::outbox::Limits {
            max_payload: 1024,
            ..inbox_diesel::outbox::Limits::TABLE
        })
        .publish(conn, Message::new(destination, vec![7; len]))?;
    Ok(())
}

/// The outbox's table, created as a service does at every start: twice, the second a no-op
/// (`IF NOT EXISTS`).
fn setup(db: &Db) {
    for _ in 0..2 {
        db.connect()
            .batch_execute(&OUTBOX.create_table_sql(BACKEND))
            .unwrap();
    }
}

/// The `n` of a `SELECT … AS n`.
fn count(conn: &mut Conn, sql: &str) -> i64 {
    #[derive(QueryableByName)]
    struct N {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    diesel::sql_query(sql)
        .get_result::<N>(conn)
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .n
}

/// The most attempts any row has had.
fn max_attempts(conn: &mut Conn) -> i64 {
    count(
        conn,
        &format!("SELECT CAST(coalesce(max(attempts), 0) AS {INT8}) AS n FROM outbox"),
    )
}

/// The outbox's message ids, in the order they were written.
fn outbox_ids(db: &Db) -> Vec<inbox_diesel::Uuid> {
    #[derive(QueryableByName)]
    struct Id {
        #[diesel(sql_type = diesel::sql_types::Text)]
        id: String,
    }
    let sql = match BACKEND {
        inbox_diesel::schema::Backend::Postgres => {
            "SELECT CAST(id AS text) AS id FROM outbox ORDER BY seq"
        }
        _ => "SELECT id FROM outbox ORDER BY seq",
    };
    diesel::sql_query(sql)
        .load::<Id>(&mut db.connect())
        .unwrap()
        .into_iter()
        .map(|row| inbox_diesel::Uuid::parse_str(&row.id).unwrap())
        .collect()
}

fn rows(db: &Db) -> i64 {
    count(&mut db.connect(), "SELECT count(*) AS n FROM outbox")
}

fn balance(db: &Db) -> i64 {
    count(
        &mut db.connect(),
        "SELECT balance AS n FROM accounts WHERE id = 1",
    )
}

/// The rows a handler publishes are written in its transaction, with ids derived from the
/// delivery: a duplicate writes nothing, a failed body nothing, and a redelivery after a
/// failure the same ids.
#[test]
fn published_messages_commit_with_the_handler() {
    let db = Db::new("outbox_commit");
    setup(&db);
    let mut conn = db.connect();
    assert!(matches!(
        place(&mut conn, &1, 3, true),
        Err(AppError::Rejected)
    ));
    assert_eq!(rows(&db), 0, "a failed body published");
    assert!(place(&mut conn, &1, 3, false).unwrap().is_processed());
    assert!(place(&mut conn, &1, 3, false).unwrap().is_duplicate());
    assert_eq!(rows(&db), 3);
    assert_eq!(balance(&db), 1);

    // The same delivery in another database publishes the same ids.
    let other = Db::new("outbox_commit_again");
    setup(&other);
    assert!(
        place(&mut other.connect(), &1, 3, false)
            .unwrap()
            .is_processed()
    );
    assert_eq!(outbox_ids(&db), outbox_ids(&other));
    assert_eq!(outbox_ids(&db).iter().collect::<HashSet<_>>().len(), 3);
}

/// What the sink cannot carry is refused inside the handler, before any SQL: the handler's
/// work rolls back, and the error says what and why; `publish` outside a handler is misuse.
#[test]
fn what_the_sink_cannot_carry_is_refused_at_append() {
    let db = Db::new("outbox_refused");
    setup(&db);
    let mut conn = db.connect();
    let refused = |result: Result<inbox_diesel::Outcome<()>, AppError>| match result {
        Err(AppError::Db(error)) => Error::from(error),
        other => panic!("expected a refusal, got {other:?}"),
    };
    let error = refused(publish_sized(&mut conn, &1, "orders", 2048));
    assert!(
        error
            .to_string()
            .contains("a payload of 2048 bytes cannot be sent: the sink takes at most 1024 bytes"),
        "{error}"
    );
    assert_eq!(error.action(), inbox_diesel::Action::DeadLetter);
    let error = refused(publish_sized(&mut conn, &2, "", 10));
    assert!(error.to_string().contains("it is empty"), "{error}");
    let error = refused(publish_sized(&mut conn, &3, &"q".repeat(300), 10));
    assert!(error.to_string().contains("300 bytes, over 255"), "{error}");
    assert_eq!(rows(&db), 0);
    assert_eq!(balance(&db), 0, "a refused handler's work committed");
    assert!(
        publish_sized(&mut conn, &4, "orders", 1024)
            .unwrap()
            .is_processed()
    );

    let outside = OUTBOX.publish(&mut conn, Message::new("orders", "x"));
    let error = Error::from(outside.unwrap_err());
    assert!(
        matches!(error, Error::Outbox(OutboxProblem::OutsideHandler)),
        "{error:?}"
    );
    assert_eq!(error.action(), inbox_diesel::Action::Alert);
    assert_eq!(rows(&db), 1);
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn keyed_orders(db: &Db, orders: u64) {
    let mut conn = db.connect();
    for id in 1..=orders {
        assert!(place(&mut conn, &id, 3, false).unwrap().is_processed());
    }
}

/// Received per key, in order: (destination, key) → payloads.
fn by_key(received: &[Outgoing]) -> HashMap<String, Vec<String>> {
    let mut keys: HashMap<String, Vec<String>> = HashMap::new();
    for message in received.iter().filter(|m| !m.key.is_empty()) {
        keys.entry(message.key.clone())
            .or_default()
            .push(String::from_utf8(message.payload.clone()).unwrap());
    }
    keys
}

/// A relay sends every row once, with its id, headers and payload, keys in order, and marks
/// each sent: the next round finds nothing.
#[test]
fn the_relay_sends_each_message_once_in_order() {
    let db = Db::new("outbox_relay");
    setup(&db);
    keyed_orders(&db, 20);
    let downstream = Downstream::default();
    runtime().block_on(async {
        let mut conn = connect_url(db.url()).await;
        let relay = Relay::new(OUTBOX).batch(7);
        let mut sink = downstream.clone();
        let mut rounds = 0;
        while relay.run_once(&mut conn, &mut sink).await.unwrap().claimed > 0 {
            rounds += 1;
            assert!(rounds < 100);
        }
    });
    let received = downstream.received.lock().unwrap().clone();
    assert_eq!(received.len(), 60);
    assert_eq!(downstream.ids().iter().collect::<HashSet<_>>().len(), 60);
    for (key, payloads) in by_key(&received) {
        let id = key.trim_start_matches("order-");
        assert_eq!(payloads, [format!("{id}/0"), format!("{id}/1")], "{key}");
    }
    let first = &received[0];
    assert_eq!(first.headers, [("order".to_owned(), "1".to_owned())]);
    assert_eq!(
        count(
            &mut db.connect(),
            "SELECT count(*) AS n FROM outbox WHERE sent_at IS NULL"
        ),
        0
    );
}

/// Four relays side by side, each on its own connection, started together: every message
/// is sent exactly once, and the messages of each key in order.
#[test]
fn relays_side_by_side_send_each_message_once() {
    let db = Db::new("outbox_relays");
    setup(&db);
    keyed_orders(&db, 60);
    let downstream = Downstream::default();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let barrier = Arc::new(tokio::sync::Barrier::new(4));
        let mut relays = Vec::new();
        for _ in 0..4 {
            let barrier = barrier.clone();
            let mut sink = downstream.clone();
            let url = db.url().to_owned();
            relays.push(tokio::spawn(async move {
                let mut conn = connect_url(&url).await;
                let relay = Relay::new(OUTBOX).batch(5);
                barrier.wait().await;
                let mut idle = 0;
                while idle < 3 {
                    let round = relay.run_once(&mut conn, &mut sink).await.unwrap();
                    if round.claimed == 0 {
                        idle += 1;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    } else {
                        idle = 0;
                    }
                }
            }));
        }
        for relay in relays {
            relay.await.unwrap();
        }
    });
    let received = downstream.received.lock().unwrap().clone();
    let ids = downstream.ids();
    assert_eq!(ids.len(), 180, "sent more than once or not at all");
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), 180);
    for (key, payloads) in by_key(&received) {
        let id = key.trim_start_matches("order-");
        assert_eq!(
            payloads,
            [format!("{id}/0"), format!("{id}/1")],
            "{key} out of order"
        );
    }
}

/// Publishes message `at` of a run of `n` under `key`.
#[idempotent(consumer = "bursts", key = *id)]
fn burst(conn: &mut Conn, id: &u64, key: &str, n: u32) -> Result<(), AppError> {
    diesel::sql_query("UPDATE accounts SET balance = balance + 1 WHERE id = 1").execute(conn)?;
    for at in 0..n {
        OUTBOX.publish(
            conn,
            Message::new("bursts", format!("{id}/{at}")).key(key.to_owned()),
        )?;
    }
    Ok(())
}

/// A sink that takes its time — so that relays side by side overlap — and refuses the first
/// attempt of every fifth message.
#[derive(Clone, Default)]
struct Unsteady(Downstream);

impl Sink for Unsteady {
    fn send(&mut self, message: &Outgoing) -> impl Future<Output = Result<(), SinkError>> + Send {
        let refuse = message.attempts == 0 && message.seq % 5 == 0;
        let outcome = match refuse {
            true => Err(SinkError::Rejected("the broker is busy".into())),
            false => Ok(()),
        };
        let mut sink = self.0.clone();
        let message = message.clone();
        async move {
            tokio::time::sleep(Duration::from_micros(200 * (message.seq as u64 % 4))).await;
            match outcome {
                Ok(()) => sink.send(&message).await,
                refused => refused,
            }
        }
    }
}

/// Three hot keys, twenty messages each, written in runs that span batches; four relays side
/// by side, with a sink that refuses some first attempts. Every message arrives once, and
/// each key's in the order written: a relay takes a key's rows from its oldest unsent on,
/// stops at a refused one, and no other relay takes that key meanwhile.
#[test]
fn hot_keys_stay_in_order_across_relays_and_refusals() {
    let db = Db::new("outbox_hot_keys");
    setup(&db);
    {
        let mut conn = db.connect();
        for id in 0..30u64 {
            let key = format!("hot-{}", id % 3);
            assert!(burst(&mut conn, &id, &key, 2).unwrap().is_processed());
        }
    }
    let downstream = Downstream::default();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let barrier = Arc::new(tokio::sync::Barrier::new(4));
        let mut relays = Vec::new();
        for _ in 0..4 {
            let barrier = barrier.clone();
            let mut sink = Unsteady(downstream.clone());
            let url = db.url().to_owned();
            relays.push(tokio::spawn(async move {
                let mut conn = connect_url(&url).await;
                let relay = Relay::new(OUTBOX)
                    .batch(7)
                    .backoff(Duration::from_millis(5), Duration::from_millis(20));
                barrier.wait().await;
                let mut idle = 0;
                while idle < 10 {
                    let round = relay.run_once(&mut conn, &mut sink).await.unwrap();
                    assert_eq!(round.parked, 0);
                    if round.claimed == 0 {
                        idle += 1;
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    } else {
                        idle = 0;
                    }
                }
            }));
        }
        for relay in relays {
            relay.await.unwrap();
        }
    });
    let received = downstream.received.lock().unwrap().clone();
    assert_eq!(received.len(), 60, "sent more than once or not at all");
    let keys = by_key(&received);
    assert_eq!(keys.len(), 3);
    for (key, payloads) in keys {
        let k: u64 = key.trim_start_matches("hot-").parse().unwrap();
        let written: Vec<String> = (0..30u64)
            .filter(|id| id % 3 == k)
            .flat_map(|id| [format!("{id}/0"), format!("{id}/1")])
            .collect();
        assert_eq!(payloads, written, "{key} out of order");
    }
}

/// A message the broker keeps refusing is parked after `max_attempts`, with its error; the
/// message behind it under the same key waits, the other keys go on; cleared by an operator,
/// the key resumes in order.
#[test]
fn a_poison_message_is_parked_and_holds_only_its_key() {
    let db = Db::new("outbox_poison");
    setup(&db);
    keyed_orders(&db, 3);
    let downstream = Downstream::default();
    // The first message of order 2.
    let poison = {
        let mut sink = downstream.clone();
        let mut all = Vec::new();
        runtime().block_on(async {
            // Read the rows without sending: a relay whose sink is down claims and hands back.
            let mut conn = connect_url(db.url()).await;
            sink.down.store(true, Ordering::SeqCst);
            Relay::new(OUTBOX)
                .run_once(&mut conn, &mut sink)
                .await
                .unwrap();
            sink.down.store(false, Ordering::SeqCst);
        });
        let mut conn = db.connect();
        all.extend(outbox_ids(&db));
        assert_eq!(
            max_attempts(&mut conn),
            0,
            "an unavailable broker counted attempts"
        );
        all[3]
    };
    downstream.poison.lock().unwrap().insert(poison);
    runtime().block_on(async {
        let mut conn = connect_url(db.url()).await;
        let relay = Relay::new(OUTBOX)
            .max_attempts(3)
            .backoff(Duration::from_millis(1), Duration::from_millis(5));
        let mut sink = downstream.clone();
        let mut parked = 0;
        for _ in 0..50 {
            parked += relay.run_once(&mut conn, &mut sink).await.unwrap().parked;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(parked, 1);
    });
    let received = downstream.received.lock().unwrap().clone();
    let keys = by_key(&received);
    assert_eq!(keys["order-1"], ["1/0", "1/1"]);
    assert_eq!(keys["order-3"], ["3/0", "3/1"]);
    assert!(
        !keys.contains_key("order-2"),
        "sent past a parked message: {keys:?}"
    );
    assert_eq!(
        received.len(),
        7,
        "the keyless messages of order 2 wait for nothing"
    );
    let mut conn = db.connect();
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM outbox WHERE parked_at IS NOT NULL \
             AND attempts = 3 AND last_error LIKE '%too large%'"
        ),
        1
    );
    // An operator fixes the broker's limit and clears the mark: order 2 goes, in order.
    downstream.poison.lock().unwrap().clear();
    conn.batch_execute("UPDATE outbox SET parked_at = NULL, claimed_until = NULL")
        .unwrap();
    runtime().block_on(async {
        let mut conn = connect_url(db.url()).await;
        let relay = Relay::new(OUTBOX);
        let mut sink = downstream.clone();
        while relay.run_once(&mut conn, &mut sink).await.unwrap().claimed > 0 {}
    });
    let keys = by_key(&downstream.received.lock().unwrap());
    assert_eq!(keys["order-2"], ["2/0", "2/1"]);
}

/// The broker down: nothing is lost or counted against the messages; the relay pauses and
/// sends everything once the broker is back.
#[test]
fn a_broker_outage_pauses_the_relay_and_loses_nothing() {
    let db = Db::new("outbox_outage");
    setup(&db);
    keyed_orders(&db, 5);
    let downstream = Downstream::default();
    downstream.down.store(true, Ordering::SeqCst);
    let counts = inbox_diesel::outbox::relay::Counts::default();
    let report = runtime().block_on(async {
        let mut conn = connect_url(db.url()).await;
        let relay = Relay::new(OUTBOX)
            .idle(Duration::from_millis(5))
            .backoff(Duration::from_millis(5), Duration::from_millis(40));
        let mut sink = downstream.clone();
        let down = downstream.down.clone();
        let refused = downstream.refused.clone();
        let received = downstream.received.clone();
        let counts = &counts;
        // Up again after three rounds met it down, however slow the machine; the counts
        // are read while the relay runs, not only once it stopped.
        let stop = async move {
            while refused.load(Ordering::SeqCst) < 3 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let during = counts.report();
            assert!(during.rounds >= 1 && during.sent == 0, "{during:?}");
            down.store(false, Ordering::SeqCst);
            while counts.report().sent < 15 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            assert_eq!(received.lock().unwrap().len(), 15);
        };
        relay
            .run_counted(&mut conn, &mut sink, stop, counts)
            .await
            .unwrap()
    });
    assert_eq!(counts.report(), report);
    assert_eq!(report.sent, 15, "{report:?}");
    assert_eq!(report.rejected, 0);
    assert!(report.rounds > 3, "{report:?}");
    assert_eq!(downstream.ids().iter().collect::<HashSet<_>>().len(), 15);
    let mut conn = db.connect();
    assert_eq!(max_attempts(&mut conn), 0);
}

/// A relay that stops between the send and the mark (its future dropped mid-round, as a
/// killed process leaves it) leaves a claim; when the lease ends the message is sent again
/// with the same id — which a downstream inbox drops — and then marked.
#[test]
fn a_send_whose_mark_was_lost_is_sent_again_with_its_id() {
    let db = Db::new("outbox_lost_mark");
    setup(&db);
    keyed_orders(&db, 1);
    let downstream = Downstream::default();

    /// Sends, then never returns: the relay never gets to mark.
    struct Hangs(Downstream);
    impl Sink for Hangs {
        fn send(
            &mut self,
            message: &Outgoing,
        ) -> impl Future<Output = Result<(), SinkError>> + Send {
            self.0.received.lock().unwrap().push(message.clone());
            std::future::pending()
        }
    }

    runtime().block_on(async {
        let mut conn = connect_url(db.url()).await;
        let relay = Relay::new(OUTBOX).lease(Duration::from_millis(300));
        let mut hangs = Hangs(downstream.clone());
        let cut = tokio::time::timeout(
            Duration::from_millis(50),
            relay.run_once(&mut conn, &mut hangs),
        )
        .await;
        assert!(cut.is_err());
        drop(conn);
        let mut conn = connect_url(db.url()).await;
        let mut sink = downstream.clone();
        // Within the lease: held by the lost round, not sent again.
        assert_eq!(
            relay.run_once(&mut conn, &mut sink).await.unwrap().claimed,
            0
        );
        tokio::time::sleep(Duration::from_millis(400)).await;
        while relay.run_once(&mut conn, &mut sink).await.unwrap().claimed > 0 {}
    });
    let ids = downstream.ids();
    assert_eq!(ids.len(), 4, "{ids:?}");
    assert_eq!(ids[0], ids[1], "the message sent again under another id");
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), 3);
    assert_eq!(
        count(
            &mut db.connect(),
            "SELECT count(*) AS n FROM outbox WHERE sent_at IS NULL"
        ),
        0
    );
}

/// A relay that dies within a round, after its sink took the round's second message
/// (`Crash::AtHit(Relay::SENT, 2)`), marked nothing: once the lease ends, every message the
/// sink took in that round is sent again, with its id — two at the default batch, one at
/// `batch(1)` — and nothing is lost.
#[test]
fn a_relay_that_dies_within_its_round_sends_the_round_again() {
    use inbox_diesel::testing::{Crash, crash_during_async};
    for (batch, again) in [(100, 2), (1, 1)] {
        let db = Db::new(&format!("outbox_relay_crash_{batch}"));
        setup(&db);
        keyed_orders(&db, 2);
        let downstream = Downstream::default();
        runtime().block_on(async {
            let relay = Relay::new(OUTBOX)
                .batch(batch)
                .lease(Duration::from_millis(300));
            let mut conn = connect_url(db.url()).await;
            let mut sink = downstream.clone();
            crash_during_async(Crash::AtHit(Relay::SENT, 2), async {
                while relay.run_once(&mut conn, &mut sink).await.unwrap().claimed > 0 {}
            })
            .await;
            drop(conn);
            tokio::time::sleep(Duration::from_millis(400)).await;
            let mut conn = connect_url(db.url()).await;
            while relay.run_once(&mut conn, &mut sink).await.unwrap().claimed > 0 {}
        });
        let ids = downstream.ids();
        let distinct = ids.iter().collect::<HashSet<_>>().len();
        assert_eq!(
            (ids.len(), distinct),
            (6 + again, 6),
            "batch {batch}: {ids:?}"
        );
        assert_eq!(
            count(
                &mut db.connect(),
                "SELECT count(*) AS n FROM outbox WHERE sent_at IS NULL"
            ),
            0
        );
    }
}

/// The purge removes sent rows older than the age, in short batches, and never an unsent or
/// a parked one.
#[test]
fn the_purge_removes_sent_rows_only() {
    let db = Db::new("outbox_purge");
    setup(&db);
    keyed_orders(&db, 4);
    let downstream = Downstream::default();
    let poison = {
        // The keyless message of order 4: nothing waits behind it.
        *outbox_ids(&db).last().unwrap()
    };
    downstream.poison.lock().unwrap().insert(poison);
    runtime().block_on(async {
        let mut conn = connect_url(db.url()).await;
        let relay = Relay::new(OUTBOX).max_attempts(1).batch(5);
        let mut sink = downstream.clone();
        while relay.run_once(&mut conn, &mut sink).await.unwrap().claimed > 0 {}
    });
    assert_eq!(downstream.ids().len(), 11);
    let mut conn = db.connect();
    // Keeps everything younger than an hour.
    let kept = OUTBOX
        .purge(&mut conn, Duration::from_secs(3600), 3)
        .unwrap();
    assert_eq!((kept.removed, kept.parked), (0, 1));
    std::thread::sleep(Duration::from_millis(20));
    let purged = OUTBOX
        .purge(&mut conn, Duration::from_millis(1), 3)
        .unwrap();
    assert_eq!(purged.removed, 11, "{purged:?}");
    assert_eq!(purged.batches, 4, "{purged:?}");
    assert_eq!(purged.parked, 1);
    assert_eq!(rows(&db), 1, "the parked row went");
}
