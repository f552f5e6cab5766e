//! What the broker adapters cost: messages per second through `inbox_lapin::Pump` and
//! `inbox_nats::Pump` against the same `#[idempotent]` handler called directly on the same
//! deliveries by the broker's own client, at several prefetch / `max_ack_pending` values, and
//! the memory the consumer holds per delivery in flight.
//!
//! ```text
//! cargo run --release --example broker_bench                  # effects in SQLite
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \
//!     cargo run --release --example broker_bench --features inbox-broker-examples/postgres
//! cargo run --release --example broker_bench -- --messages 10000 --rounds 3 \
//!     --prefetch 1,4,16,64,256 --in-flight 1000 --connections 16 --only nats
//! cargo run --release --example broker_bench -- --no-database
//! ```
//!
//! The brokers are `AMQP_URL` (by default `amqp://guest:guest@127.0.0.1:5672/%2f`) and
//! `NATS_URL` (by default `nats://127.0.0.1:4222`, with JetStream).
//!
//! **Throughput.** Each run publishes `--messages` messages (a 100-byte payload and an id of
//! their own) to a fresh RabbitMQ quorum queue or JetStream stream, and waits for the broker
//! to confirm them all, before any consumer starts: publishing is not measured. A consumer
//! then applies each message with one `#[idempotent]` handler — an `effects` row and the
//! inbox marker in one transaction — on a fresh database (an SQLite file in WAL with
//! `synchronous = NORMAL`, or a schema of its own on PostgreSQL), through a bb8 pool of
//! `min(prefetch, --connections)` connections (by default 1 on SQLite, 16 on PostgreSQL).
//! With `--no-database` the handler only notes the message's id in memory: what the broker,
//! its client and the adapter allow without a database. The clock runs from the subscription
//! until the last message's handler answers. The variants:
//!
//! - RabbitMQ, `direct`: lapin's `basic_qos(prefetch)` and `basic_consume` with manual acks,
//!   up to `prefetch` handlers at once, `basic.ack` after each answer; `Pump`: the same
//!   through `Pump::new().prefetch(prefetch)`, `subscribe` and `run`.
//! - JetStream, `direct, ack`: a durable pull consumer with explicit acks and
//!   `max_ack_pending`, read with async-nats' `stream().max_messages_per_batch(n)`, up to `n`
//!   handlers at once, `ack()` (not confirmed) after each (pull requests expire after 1 s:
//!   see `DIRECT_PULL_EXPIRES`); `direct, double_ack`: the same, acknowledged with
//!   `double_ack()`, which waits for the server's confirmation as the pump does; `Pump`:
//!   `Pump::new().max_ack_pending(n)`, `consumer` and `run`.
//!
//! Every run, of every variant, gets its own queue or stream and its own database; the
//! rounds repeat the whole sweep, each round in another order of the variants, and the
//! tables show each cell's median and the ratio of the pump to the direct consumer measured
//! in the same round (median, and the rounds' range). After each run the bench checks that
//! the broker holds nothing unacknowledged and that every message has exactly one effect row;
//! the exit code is non-zero if any run fails that.
//!
//! **Memory.** `--in-flight K` messages are published, then a consumer with prefetch /
//! `max_ack_pending` K takes them all into handlers that hold their delivery and wait until
//! all K have arrived. The bytes the process has allocated (counted by this binary's global
//! allocator) while they wait, less those before the consumer started, divided by K, is the
//! consumer's memory per delivery in flight: the delivery itself (100-byte payload), the
//! broker client's buffers, the handler's future and what the adapter keeps beside it. The
//! handler's own work (a database connection, the transaction) is not in it: it is the same
//! whoever calls the handler. Measured `--rounds` times for each variant (median);
//! `--prefetch none` measures the memory alone.

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::fmt;
use std::process::ExitCode;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::pull::Config as PullConfig;
use async_nats::jetstream::consumer::{AckPolicy, PullConsumer};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::{self, AckKind};
use diesel::{AggregateExpressionMethods, ExpressionMethods, QueryDsl};
use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use diesel_async::pooled_connection::bb8::Pool;
use diesel_async::{AsyncConnection, SimpleAsyncConnection};
use futures_util::StreamExt;
use inbox_broker_examples::store::Failure;
use inbox_broker_examples::without_password;
use inbox_diesel::{InboxSchema, KeyError, MessageKey, Outcome, broker, idempotent};
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use tokio::sync::{Notify, Semaphore};

/// The measurement tool for memory per delivery in flight: every allocation of the process
/// goes through `System`, and this wrapper keeps the bytes and blocks currently allocated.
/// It counts exactly what the consumer's code asks for — the broker client's buffers, the
/// deliveries, the futures — where the resident set size would add the allocator's
/// fragmentation and its per-thread caches, which move by more than the 1 000 deliveries
/// weigh. Its two relaxed atomic additions per allocation cost every variant alike.
struct Counting;

static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);
static LIVE_BLOCKS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to `System` with its arguments unchanged; the counters
// are only read by the bench.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc`, passed on.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed);
            LIVE_BLOCKS.fetch_add(1, Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc_zeroed`, passed on.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed);
            LIVE_BLOCKS.fetch_add(1, Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract for `dealloc`, passed on.
        unsafe { System.dealloc(ptr, layout) };
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        LIVE_BLOCKS.fetch_sub(1, Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract for `realloc`, passed on.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            LIVE_BYTES.fetch_add(new_size, Ordering::Relaxed);
            LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        new
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The bytes and blocks allocated now.
fn allocated() -> (usize, usize) {
    (
        LIVE_BYTES.load(Ordering::Relaxed),
        LIVE_BLOCKS.load(Ordering::Relaxed),
    )
}

/// Every message's payload: its size is the one the memory figures are stated for.
static PAYLOAD: [u8; 100] = [b'.'; 100];

diesel::table! {
    /// One row per applied message: a message applied twice shows as two rows.
    effects (message) {
        message -> Text,
    }
}

/// No key: a message applied twice must be able to leave two rows.
const EFFECTS_TABLE: &str = "CREATE TABLE effects (message VARCHAR(64) NOT NULL)";

mod sqlite {
    use diesel::{ConnectionError, SqliteConnection};
    use diesel_async::RunQueryDsl;
    use diesel_async::pooled_connection::ManagerConfig;
    use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;

    use super::*;

    pub(super) type Conn = SyncConnectionWrapper<SqliteConnection>;

    /// The handler every variant calls: the effect and the marker in one transaction.
    #[idempotent(consumer = "broker-bench", key = key)]
    async fn apply(
        conn: &mut Conn,
        key: &MessageKey,
        message: &str,
    ) -> Result<(), inbox_diesel::Error> {
        diesel::insert_into(effects::table)
            .values(effects::message.eq(message))
            .execute(conn)
            .await?;
        Ok(())
    }

    pub(super) async fn handle(
        pool: &Pool<Conn>,
        key: &MessageKey,
        message: &str,
    ) -> Result<Outcome<()>, Failure> {
        let mut conn = pool.get().await.map_err(|e| Failure::Pool(e.to_string()))?;
        Ok(apply(&mut conn, key, message).await?)
    }

    /// A new database file at `path` — WAL, the inbox and `effects` — and a pool on it.
    pub(super) async fn fresh(path: &str, connections: u32) -> Result<Pool<Conn>, String> {
        let mut conn = Conn::establish(path)
            .await
            .map_err(|e| format!("create {path}: {e}"))?;
        for statement in [
            "PRAGMA journal_mode = WAL",
            &inbox_diesel::schema::sqlite::create_table_sql(&InboxSchema::DEFAULT),
            EFFECTS_TABLE,
        ] {
            conn.batch_execute(statement)
                .await
                .map_err(|e| format!("set up {path}: {e}"))?;
        }
        // As the inbox's own benchmarks run SQLite: WAL with `synchronous = NORMAL`, which
        // syncs at checkpoints rather than at every commit (a per-connection setting).
        let mut config = ManagerConfig::<Conn>::default();
        config.custom_setup = Box::new(|url| {
            let url = url.to_owned();
            Box::pin(async move {
                let mut conn = Conn::establish(&url).await?;
                conn.batch_execute("PRAGMA synchronous = NORMAL")
                    .await
                    .map_err(ConnectionError::CouldntSetupConfiguration)?;
                Ok(conn)
            })
        });
        let manager = AsyncDieselConnectionManager::new_with_config(path, config);
        pool(manager, connections).await
    }

    pub(super) async fn effects(pool: &Pool<Conn>) -> Result<(i64, i64), String> {
        let mut conn = pool.get().await.map_err(|e| e.to_string())?;
        count_effects(&mut conn).await
    }

    async fn count_effects(conn: &mut Conn) -> Result<(i64, i64), String> {
        let rows = effects::table.count().get_result(conn).await;
        let distinct = effects::table
            .select(diesel::dsl::count(effects::message).aggregate_distinct())
            .get_result(conn)
            .await;
        rows.and_then(|rows| distinct.map(|distinct| (rows, distinct)))
            .map_err(|e| format!("count the effects: {e}"))
    }

    async fn pool(
        manager: AsyncDieselConnectionManager<Conn>,
        connections: u32,
    ) -> Result<Pool<Conn>, String> {
        Pool::builder()
            .max_size(connections)
            .min_idle(Some(connections))
            .test_on_check_out(false)
            .build(manager)
            .await
            .map_err(|e| format!("connect: {e}"))
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use diesel_async::RunQueryDsl;

    use super::*;

    pub(super) type Conn = diesel_async::AsyncPgConnection;

    /// The schema each run creates afresh.
    const SCHEMA: &str = "inbox_broker_bench";

    /// The handler every variant calls: the effect and the marker in one transaction.
    #[idempotent(consumer = "broker-bench", key = key)]
    async fn apply(
        conn: &mut Conn,
        key: &MessageKey,
        message: &str,
    ) -> Result<(), inbox_diesel::Error> {
        diesel::insert_into(effects::table)
            .values(effects::message.eq(message))
            .execute(conn)
            .await?;
        Ok(())
    }

    pub(super) async fn handle(
        pool: &Pool<Conn>,
        key: &MessageKey,
        message: &str,
    ) -> Result<Outcome<()>, Failure> {
        let mut conn = pool.get().await.map_err(|e| Failure::Pool(e.to_string()))?;
        Ok(apply(&mut conn, key, message).await?)
    }

    /// The schema `inbox_broker_bench` dropped and created again with the inbox and
    /// `effects`, and a pool whose connections use it.
    pub(super) async fn fresh(url: &str, connections: u32) -> Result<Pool<Conn>, String> {
        let shown = without_password(url);
        let mut conn = Conn::establish(url)
            .await
            .map_err(|e| format!("connect to {shown}: {e}"))?;
        conn.batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {SCHEMA} CASCADE; CREATE SCHEMA {SCHEMA};"
        ))
        .await
        .map_err(|e| format!("create the schema {SCHEMA} on {shown}: {e}"))?;
        let url = format!(
            "{url}{}options=-csearch_path%3D{SCHEMA}",
            if url.contains('?') { '&' } else { '?' }
        );
        let mut conn = Conn::establish(&url)
            .await
            .map_err(|e| format!("connect to {shown}: {e}"))?;
        for statement in [
            &inbox_diesel::schema::postgres::create_table_sql(&InboxSchema::DEFAULT),
            EFFECTS_TABLE,
        ] {
            conn.batch_execute(statement)
                .await
                .map_err(|e| format!("set up {shown}: {e}"))?;
        }
        Pool::builder()
            .max_size(connections)
            .min_idle(Some(connections))
            .test_on_check_out(false)
            .build(AsyncDieselConnectionManager::new(url))
            .await
            .map_err(|e| format!("connect to {shown}: {e}"))
    }

    pub(super) async fn effects(pool: &Pool<Conn>) -> Result<(i64, i64), String> {
        let mut conn = pool.get().await.map_err(|e| e.to_string())?;
        let rows = effects::table.count().get_result(&mut conn).await;
        let distinct = effects::table
            .select(diesel::dsl::count(effects::message).aggregate_distinct())
            .get_result(&mut conn)
            .await;
        rows.and_then(|rows| distinct.map(|distinct| (rows, distinct)))
            .map_err(|e| format!("count the effects: {e}"))
    }
}

/// Where the runs keep their effects: `DATABASE_URL`, or SQLite files in a temporary
/// directory; with `--no-database`, nowhere.
enum Target {
    Sqlite(tempfile::TempDir),
    #[cfg(feature = "postgres")]
    Postgres(String),
    /// The handler only notes the message's id in memory: the ceiling that the broker, its
    /// client and the adapter allow.
    Memory,
}

impl Target {
    fn from_env(no_database: bool) -> Result<Self, String> {
        if no_database {
            return Ok(Target::Memory);
        }
        let url = std::env::var("DATABASE_URL").unwrap_or_default();
        if url.is_empty() {
            let dir = tempfile::tempdir().map_err(|e| format!("a temporary directory: {e}"))?;
            return Ok(Target::Sqlite(dir));
        }
        #[cfg(feature = "postgres")]
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(Target::Postgres(url));
        }
        Err(format!(
            "DATABASE_URL={}: the bench runs on SQLite (DATABASE_URL unset) or PostgreSQL \
             (postgres://…, built with `--features inbox-broker-examples/postgres`)",
            without_password(&url)
        ))
    }

    fn describe(&self) -> String {
        match self {
            Target::Sqlite(dir) => format!(
                "SQLite (bundled, WAL), a new file per run in {}",
                dir.path().display()
            ),
            #[cfg(feature = "postgres")]
            Target::Postgres(url) => format!(
                "PostgreSQL {}, schema inbox_broker_bench created afresh per run",
                without_password(url)
            ),
            Target::Memory => "no database: the handler notes the message's id in memory and \
                               answers Processed"
                .to_owned(),
        }
    }

    /// The pool size when `--connections` is not given: SQLite takes one writer at a time,
    /// so more connections would only wait on its lock.
    fn default_connections(&self) -> u32 {
        match self {
            Target::Sqlite(_) => 1,
            #[cfg(feature = "postgres")]
            Target::Postgres(_) => 16,
            Target::Memory => 1,
        }
    }

    /// A database of its own for run `run`: the inbox and `effects`, empty.
    async fn fresh(&self, run: usize, connections: u32) -> Result<Database, String> {
        match self {
            Target::Sqlite(dir) => {
                let path = dir.path().join(format!("run-{run}.sqlite"));
                let pool = sqlite::fresh(&path.display().to_string(), connections).await?;
                Ok(Database::Sqlite(pool, path))
            }
            #[cfg(feature = "postgres")]
            Target::Postgres(url) => {
                Ok(Database::Postgres(postgres::fresh(url, connections).await?))
            }
            Target::Memory => Ok(Database::Memory(Mutex::default())),
        }
    }
}

/// One run's database.
enum Database {
    Sqlite(Pool<sqlite::Conn>, std::path::PathBuf),
    #[cfg(feature = "postgres")]
    Postgres(Pool<postgres::Conn>),
    /// The ids of the messages handled.
    Memory(Mutex<Vec<String>>),
}

impl Database {
    async fn apply(&self, key: &MessageKey, message: &str) -> Result<Outcome<()>, Failure> {
        match self {
            Database::Sqlite(pool, _) => sqlite::handle(pool, key, message).await,
            #[cfg(feature = "postgres")]
            Database::Postgres(pool) => postgres::handle(pool, key, message).await,
            Database::Memory(handled) => {
                handled
                    .lock()
                    .expect("not poisoned")
                    .push(message.to_owned());
                Ok(Outcome::Processed(()))
            }
        }
    }

    /// The effect rows, and the messages they are for.
    async fn effects(&self) -> Result<(i64, i64), String> {
        match self {
            Database::Sqlite(pool, _) => sqlite::effects(pool).await,
            #[cfg(feature = "postgres")]
            Database::Postgres(pool) => postgres::effects(pool).await,
            Database::Memory(handled) => {
                let handled = handled.lock().expect("not poisoned");
                let distinct: std::collections::BTreeSet<&String> = handled.iter().collect();
                Ok((handled.len() as i64, distinct.len() as i64))
            }
        }
    }

    /// Closes the pool; an SQLite file is removed with its WAL.
    fn discard(self) {
        if let Database::Sqlite(pool, path) = self {
            drop(pool);
            for suffix in ["", "-wal", "-shm"] {
                let mut file = path.clone().into_os_string();
                file.push(suffix);
                let _ = std::fs::remove_file(file);
            }
        }
    }
}

/// What one run's handlers answered, and when the last message was answered.
struct Tally {
    expected: u64,
    answered: AtomicU64,
    duplicates: AtomicU64,
    failed: AtomicU64,
    last: Mutex<Option<Instant>>,
    all_answered: Notify,
}

impl Tally {
    fn new(expected: usize) -> Self {
        Self {
            expected: expected as u64,
            answered: AtomicU64::new(0),
            duplicates: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            last: Mutex::new(None),
            all_answered: Notify::new(),
        }
    }

    /// The handler for one delivery, whoever calls it; the answer is counted.
    async fn handle(
        &self,
        database: &Database,
        key: Result<MessageKey, KeyError>,
        id: &str,
    ) -> Result<Outcome<()>, Failure> {
        let answer = match key {
            Ok(key) => database.apply(&key, id).await,
            Err(invalid) => Err(Failure::from(inbox_diesel::Error::InvalidKey(invalid))),
        };
        match &answer {
            Ok(outcome) => {
                if outcome.is_duplicate() {
                    self.duplicates.fetch_add(1, Ordering::Relaxed);
                }
                if self.answered.fetch_add(1, Ordering::Relaxed) + 1 == self.expected {
                    *self.last.lock().expect("not poisoned") = Some(Instant::now());
                    self.all_answered.notify_one();
                }
            }
            Err(e) => {
                if self.failed.fetch_add(1, Ordering::Relaxed) == 0 {
                    eprintln!("  a handler failed (further failures are counted): {e}");
                }
            }
        }
        answer
    }

    /// Completes once every message of the run has been answered.
    async fn finished(&self) {
        self.all_answered.notified().await;
    }

    fn last(&self) -> Option<Instant> {
        *self.last.lock().expect("not poisoned")
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Broker {
    RabbitMq,
    Nats,
}

impl fmt::Display for Broker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Broker::RabbitMq => "RabbitMQ",
            Broker::Nats => "JetStream",
        })
    }
}

impl Broker {
    /// The variants measured for this broker.
    fn variants(self) -> &'static [Variant] {
        match self {
            Broker::RabbitMq => &[Variant::Direct, Variant::Pump],
            Broker::Nats => &[Variant::Direct, Variant::DirectConfirmed, Variant::Pump],
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Variant {
    /// The broker's client, the handler, an acknowledgement sent without waiting for more.
    Direct,
    /// JetStream only: as `Direct`, with the acknowledgement confirmed by the server.
    DirectConfirmed,
    /// The adapter's pump.
    Pump,
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Variant::Direct => "direct",
            Variant::DirectConfirmed => "direct, double_ack",
            Variant::Pump => "Pump",
        })
    }
}

/// One timed run: from the subscription to the last answer, and from the last answer until
/// the consumer had stopped.
#[derive(Debug, Clone, Copy)]
struct Timing {
    consuming: Duration,
    stopping: Duration,
}

/// Why a run does not count: the consumer failed, or a message was not applied exactly once.
type RunError = String;

// ---------------------------------------------------------------------------------------
// RabbitMQ

struct Rabbit {
    url: String,
    /// Declares, publishes, checks and deletes: never the measured consumer's connection.
    admin: Connection,
    channel: Channel,
}

impl Rabbit {
    async fn connect(url: String) -> Result<Self, String> {
        let admin = rabbit_connection(&url).await?;
        let channel = admin
            .create_channel()
            .await
            .map_err(|e| format!("open a channel: {e}"))?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| format!("publisher confirms: {e}"))?;
        Ok(Self {
            url,
            admin,
            channel,
        })
    }

    /// A quorum queue of its own for run `run`, holding `ids`, each confirmed by the broker.
    async fn prepare(&self, run: usize, ids: &[String]) -> Result<String, String> {
        let queue = format!("inbox-broker-bench-{}-{run}", std::process::id());
        let mut arguments = FieldTable::default();
        arguments.insert(
            "x-queue-type".into(),
            AMQPValue::LongString("quorum".into()),
        );
        // A queue a run abandons (the bench interrupted) goes after 10 minutes unused.
        arguments.insert("x-expires".into(), AMQPValue::LongInt(600_000));
        let durable = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        self.channel
            .queue_declare(queue.as_str().into(), durable, arguments)
            .await
            .map_err(|e| format!("declare the queue {queue}: {e}"))?;
        let mut confirms = Vec::with_capacity(ids.len());
        for id in ids {
            confirms.push(
                self.channel
                    .basic_publish(
                        "".into(),
                        queue.as_str().into(),
                        BasicPublishOptions::default(),
                        &PAYLOAD,
                        BasicProperties::default()
                            .with_message_id(id.as_str().into())
                            .with_delivery_mode(2),
                    )
                    .await
                    .map_err(|e| format!("publish {id}: {e}"))?,
            );
        }
        for confirm in confirms {
            let confirmation = confirm.await.map_err(|e| format!("publish: {e}"))?;
            if !confirmation.is_ack() {
                return Err(format!("the broker refused a message: {confirmation:?}"));
            }
        }
        Ok(queue)
    }

    /// Messages in `queue` not acknowledged: once the consumer's channel is closed, the
    /// broker has put back what it had delivered and not been acknowledged.
    async fn left(&self, queue: &str) -> Result<u64, String> {
        let passive = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        self.channel
            .queue_declare(queue.into(), passive, FieldTable::default())
            .await
            .map(|queue| u64::from(queue.message_count()))
            .map_err(|e| format!("ask for the length of {queue}: {e}"))
    }

    async fn delete(&self, queue: &str) {
        if let Err(e) = self
            .channel
            .queue_delete(queue.into(), QueueDeleteOptions::default())
            .await
        {
            eprintln!("delete the queue {queue}: {e}");
        }
    }

    async fn close(self) {
        let _ = self.admin.close(200, "done".into()).await;
    }

    /// One throughput run of `variant` on `queue`.
    async fn consume(
        &self,
        queue: &str,
        variant: Variant,
        prefetch: u16,
        database: &Database,
        tally: &Tally,
    ) -> Result<Timing, RunError> {
        let connection = rabbit_connection(&self.url).await?;
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| format!("open a channel: {e}"))?;
        let start = Instant::now();
        match variant {
            Variant::Direct => {
                channel
                    .basic_qos(prefetch, BasicQosOptions::default())
                    .await
                    .map_err(|e| format!("basic.qos: {e}"))?;
                let consumer = channel
                    .basic_consume(
                        queue.into(),
                        "bench-direct".into(),
                        BasicConsumeOptions::default(),
                        FieldTable::default(),
                    )
                    .await
                    .map_err(|e| format!("consume {queue}: {e}"))?;
                consumer
                    .take_until(tally.finished())
                    .for_each_concurrent(usize::from(prefetch), |delivery| async move {
                        let Ok(delivery) = delivery else {
                            return;
                        };
                        let id = delivery.properties.message_id().as_ref();
                        let id = id.map(|id| id.as_str());
                        let answer = tally
                            .handle(database, broker::amqp(id), id.unwrap_or_default())
                            .await;
                        let settled = match answer {
                            Ok(_) => delivery.acker.ack(BasicAckOptions::default()).await,
                            Err(_) => {
                                let requeue = BasicNackOptions {
                                    requeue: true,
                                    ..BasicNackOptions::default()
                                };
                                delivery.acker.nack(requeue).await
                            }
                        };
                        if let Err(e) = settled {
                            eprintln!("  settling a delivery failed: {e}");
                        }
                    })
                    .await;
            }
            Variant::Pump => {
                let pump = inbox_lapin::Pump::new().prefetch(prefetch);
                let consumer = pump
                    .subscribe(&channel, queue, "bench-pump")
                    .await
                    .map_err(|e| format!("consume {queue}: {e}"))?;
                pump.run(
                    &channel,
                    consumer,
                    tally.finished(),
                    |delivery| async move {
                        let id = delivery.properties.message_id().as_ref();
                        let id = id.map_or("", |id| id.as_str());
                        tally
                            .handle(database, inbox_lapin::key(&delivery), id)
                            .await
                    },
                )
                .await
                .map_err(|stopped| stopped.to_string())?;
            }
            Variant::DirectConfirmed => {
                unreachable!("RabbitMQ's acknowledgements are not confirmed")
            }
        }
        let stopped = Instant::now();
        let _ = channel.close(200, "done".into()).await;
        let _ = connection.close(200, "done".into()).await;
        timing(start, tally, stopped)
    }

    /// The allocated bytes per delivery held in flight by `variant`, `in_flight` at once.
    async fn memory(&self, run: usize, variant: Variant, in_flight: u16) -> Result<Held, String> {
        let ids = message_ids(run, usize::from(in_flight));
        let queue = self.prepare(run, &ids).await?;
        let connection = rabbit_connection(&self.url).await?;
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| format!("open a channel: {e}"))?;
        let gate = Gate::new(usize::from(in_flight));
        let gate = &gate;
        tokio::time::sleep(SETTLE).await;
        let before = allocated();
        let consume = async {
            match variant {
                Variant::Pump => {
                    let pump = inbox_lapin::Pump::new().prefetch(in_flight);
                    let consumer = pump
                        .subscribe(&channel, &queue, "bench-pump")
                        .await
                        .map_err(|e| format!("consume {queue}: {e}"))?;
                    pump.run(&channel, consumer, gate.all_done(), |delivery| async move {
                        gate.hold(&delivery.data).await;
                        Ok::<_, Failure>(Outcome::Processed(()))
                    })
                    .await
                    .map_err(|stopped| stopped.to_string())?;
                }
                _ => {
                    channel
                        .basic_qos(in_flight, BasicQosOptions::default())
                        .await
                        .map_err(|e| format!("basic.qos: {e}"))?;
                    let consumer = channel
                        .basic_consume(
                            queue.as_str().into(),
                            "bench-direct".into(),
                            BasicConsumeOptions::default(),
                            FieldTable::default(),
                        )
                        .await
                        .map_err(|e| format!("consume {queue}: {e}"))?;
                    consumer
                        .take_until(gate.all_done())
                        .for_each_concurrent(usize::from(in_flight), |delivery| async move {
                            let Ok(delivery) = delivery else {
                                return;
                            };
                            gate.hold(&delivery.data).await;
                            let _ = delivery.acker.ack(BasicAckOptions::default()).await;
                        })
                        .await;
                }
            }
            Ok::<(), String>(())
        };
        let (consumed, held) = tokio::join!(consume, gate.measure());
        consumed?;
        let _ = channel.close(200, "done".into()).await;
        let _ = connection.close(200, "done".into()).await;
        let left = self.left(&queue).await?;
        self.delete(&queue).await;
        if left != 0 {
            return Err(format!("{left} messages were left unacknowledged"));
        }
        Ok(Held::between(before, held, in_flight))
    }
}

async fn rabbit_connection(url: &str) -> Result<Connection, String> {
    let shown = without_password(url);
    match tokio::time::timeout(
        Duration::from_secs(10),
        Connection::connect(url, ConnectionProperties::default()),
    )
    .await
    {
        Ok(Ok(connection)) => Ok(connection),
        Ok(Err(e)) => Err(format!(
            "RabbitMQ is not reachable at {shown} (set AMQP_URL to change it): {e}"
        )),
        Err(_) => Err(format!("RabbitMQ at {shown} did not answer within 10 s")),
    }
}

// ---------------------------------------------------------------------------------------
// JetStream

struct Nats {
    url: String,
    /// Creates streams, publishes, checks and deletes: never the measured consumer's client.
    admin: jetstream::Context,
    version: String,
}

/// The durable consumer's name in every run's stream.
const DURABLE: &str = "bench";

/// How long the direct variants' pull requests wait on the server. async-nats' pull stream
/// counts a request's messages when the task that sent it reports back; a message that
/// overtakes that report is counted against nothing, the request stays counted as pending,
/// and no new request goes out until the stream's timer gives it up, `expires` + 5 s later
/// (30 s + 5 s by default). At `max_ack_pending` 1 with unconfirmed acks that happens every
/// few hundred messages; a short expiry bounds each stall to about 6 s.
const DIRECT_PULL_EXPIRES: Duration = Duration::from_secs(1);

impl Nats {
    async fn connect(url: String) -> Result<Self, String> {
        let client = nats_client(&url).await?;
        let version = client.server_info().version;
        Ok(Self {
            url,
            admin: jetstream::new(client),
            version,
        })
    }

    /// A stream of its own for run `run` (file storage), holding `ids` (each its
    /// `Nats-Msg-Id`), each confirmed by the server.
    async fn prepare(&self, run: usize, ids: &[String]) -> Result<String, String> {
        let stream = format!("INBOX_BENCH_{}_{run}", std::process::id());
        let subject = format!("inbox-bench.{}.{run}", std::process::id());
        self.admin
            .create_stream(jetstream::stream::Config {
                name: stream.clone(),
                subjects: vec![subject.clone()],
                max_age: Duration::from_secs(600),
                ..jetstream::stream::Config::default()
            })
            .await
            .map_err(|e| format!("create the stream {stream}: {e}"))?;
        // Confirmations awaited a thousand at a time: async-nats lets a context have only so
        // many unconfirmed publishes (5 000 by default) before `send_publish` waits.
        for chunk in ids.chunks(1000) {
            let mut confirms = Vec::with_capacity(chunk.len());
            for id in chunk {
                let message = PublishMessage::build()
                    .payload(PAYLOAD[..].into())
                    .message_id(id);
                confirms.push(
                    self.admin
                        .send_publish(subject.clone(), message)
                        .await
                        .map_err(|e| format!("publish {id}: {e}"))?,
                );
            }
            for confirm in confirms {
                confirm.await.map_err(|e| format!("publish: {e}"))?;
            }
        }
        Ok(stream)
    }

    /// The consumer's messages not yet acknowledged, delivered or not, once the server has
    /// processed the acknowledgements on their way (waits up to 5 s for the count to reach 0).
    async fn left(&self, stream: &str) -> Result<u64, String> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let consumer: PullConsumer = self
                .admin
                .get_consumer_from_stream(DURABLE, stream)
                .await
                .map_err(|e| format!("find the consumer of {stream}: {e}"))?;
            let info = consumer
                .get_info()
                .await
                .map_err(|e| format!("ask for the consumer of {stream}: {e}"))?;
            let left = info.num_pending + info.num_ack_pending as u64;
            if left == 0 || Instant::now() >= deadline {
                return Ok(left);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn delete(&self, stream: &str) {
        if let Err(e) = self.admin.delete_stream(stream).await {
            eprintln!("delete the stream {stream}: {e}");
        }
    }

    /// The consumer the direct variants read: what `Pump::consumer` creates, written out.
    async fn direct_consumer(
        jetstream: &jetstream::Context,
        stream: &str,
        max_ack_pending: usize,
    ) -> Result<PullConsumer, String> {
        jetstream
            .create_consumer_on_stream(
                PullConfig {
                    durable_name: Some(DURABLE.to_owned()),
                    ack_policy: AckPolicy::Explicit,
                    ack_wait: Duration::from_secs(30),
                    max_deliver: 10,
                    max_ack_pending: max_ack_pending as i64,
                    ..PullConfig::default()
                },
                stream,
            )
            .await
            .map_err(|e| format!("create the consumer on {stream}: {e}"))
    }

    /// One throughput run of `variant` on `stream`.
    async fn consume(
        &self,
        stream: &str,
        variant: Variant,
        max_ack_pending: usize,
        database: &Database,
        tally: &Tally,
    ) -> Result<Timing, RunError> {
        let client = nats_client(&self.url).await?;
        let jetstream = jetstream::new(client.clone());
        let (start, stopped) = match variant {
            Variant::Direct | Variant::DirectConfirmed => {
                let consumer = Self::direct_consumer(&jetstream, stream, max_ack_pending).await?;
                let start = Instant::now();
                let messages = consumer
                    .stream()
                    .max_messages_per_batch(max_ack_pending)
                    .expires(DIRECT_PULL_EXPIRES)
                    .messages()
                    .await
                    .map_err(|e| format!("pull from {stream}: {e}"))?;
                messages
                    .take_until(tally.finished())
                    .for_each_concurrent(max_ack_pending, |message| async move {
                        let Ok(message) = message else {
                            return;
                        };
                        let id = message
                            .headers
                            .as_ref()
                            .and_then(|headers| headers.get(async_nats::header::NATS_MESSAGE_ID))
                            .map(|id| id.as_str());
                        let key = match message.info() {
                            Ok(info) => broker::jetstream(
                                id,
                                info.stream,
                                info.stream_sequence,
                                info.published.unix_timestamp_nanos(),
                            ),
                            Err(_) => Err(KeyError::Missing {
                                field: "JetStream metadata",
                            }),
                        };
                        let answer = tally.handle(database, key, id.unwrap_or_default()).await;
                        let settled = match (answer, variant) {
                            (Ok(_), Variant::DirectConfirmed) => message.double_ack().await,
                            (Ok(_), _) => message.ack().await,
                            (Err(_), _) => message.ack_with(AckKind::Nak(None)).await,
                        };
                        if let Err(e) = settled {
                            eprintln!("  settling a message failed: {e}");
                        }
                    })
                    .await;
                (start, Instant::now())
            }
            Variant::Pump => {
                let pump = inbox_nats::Pump::new().max_ack_pending(max_ack_pending);
                let consumer = pump
                    .consumer(&jetstream, stream, DURABLE)
                    .await
                    .map_err(|e| format!("create the consumer on {stream}: {e}"))?;
                let start = Instant::now();
                pump.run(
                    &jetstream,
                    &consumer,
                    tally.finished(),
                    |message| async move {
                        let id = message
                            .headers
                            .as_ref()
                            .and_then(|headers| headers.get(async_nats::header::NATS_MESSAGE_ID))
                            .map_or("", |id| id.as_str());
                        tally.handle(database, inbox_nats::key(&message), id).await
                    },
                )
                .await
                .map_err(|stopped| stopped.to_string())?;
                (start, Instant::now())
            }
        };
        // Acknowledgements sent without a confirmation are on their way: flushed before the
        // check counts what the server still holds.
        let _ = client.flush().await;
        drop(client);
        timing(start, tally, stopped)
    }

    /// The allocated bytes per message held in flight by `variant`, `in_flight` at once.
    async fn memory(&self, run: usize, variant: Variant, in_flight: usize) -> Result<Held, String> {
        let ids = message_ids(run, in_flight);
        let stream = self.prepare(run, &ids).await?;
        let client = nats_client(&self.url).await?;
        let jetstream = jetstream::new(client.clone());
        let pump = inbox_nats::Pump::new().max_ack_pending(in_flight);
        let consumer = match variant {
            Variant::Pump => pump
                .consumer(&jetstream, &stream, DURABLE)
                .await
                .map_err(|e| format!("create the consumer on {stream}: {e}"))?,
            _ => Self::direct_consumer(&jetstream, &stream, in_flight).await?,
        };
        let gate = Gate::new(in_flight);
        let gate = &gate;
        tokio::time::sleep(SETTLE).await;
        let before = allocated();
        let consume = async {
            match variant {
                Variant::Pump => {
                    pump.run(
                        &jetstream,
                        &consumer,
                        gate.all_done(),
                        |message| async move {
                            gate.hold(&message.payload).await;
                            Ok::<_, Failure>(Outcome::Processed(()))
                        },
                    )
                    .await
                    .map_err(|stopped| stopped.to_string())?;
                }
                _ => {
                    let messages = consumer
                        .stream()
                        .max_messages_per_batch(in_flight)
                        .expires(DIRECT_PULL_EXPIRES)
                        .messages()
                        .await
                        .map_err(|e| format!("pull from {stream}: {e}"))?;
                    messages
                        .take_until(gate.all_done())
                        .for_each_concurrent(in_flight, |message| async move {
                            let Ok(message) = message else {
                                return;
                            };
                            gate.hold(&message.payload).await;
                            let _ = message.ack().await;
                        })
                        .await;
                }
            }
            Ok::<(), String>(())
        };
        let (consumed, held) = tokio::join!(consume, gate.measure());
        consumed?;
        drop(consumer);
        let _ = client.flush().await;
        drop(client);
        let left = self.left(&stream).await?;
        self.delete(&stream).await;
        if left != 0 {
            return Err(format!("{left} messages were left unacknowledged"));
        }
        Ok(Held::between(before, held, in_flight as u16))
    }
}

async fn nats_client(url: &str) -> Result<async_nats::Client, String> {
    let client = tokio::time::timeout(
        Duration::from_secs(10),
        async_nats::ConnectOptions::new().connect(url),
    )
    .await
    .map_err(|_| format!("NATS at {url} did not answer within 10 s"))?
    .map_err(|e| format!("NATS is not reachable at {url} (set NATS_URL to change it): {e}"))?;
    if !client.server_info().jetstream {
        return Err(format!("the NATS server at {url} runs without JetStream"));
    }
    Ok(client)
}

// ---------------------------------------------------------------------------------------
// Memory

/// How long the process is left alone before and while the deliveries are held: the
/// broker clients' reads and the runtime's timers settle.
const SETTLE: Duration = Duration::from_millis(300);

/// Holds every handler until `in_flight` of them wait, measures, then lets them all go.
struct Gate {
    in_flight: usize,
    entered: AtomicUsize,
    done: AtomicUsize,
    all_in: Notify,
    all_done: Notify,
    release: Semaphore,
}

impl Gate {
    fn new(in_flight: usize) -> Self {
        Self {
            in_flight,
            entered: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            all_in: Notify::new(),
            all_done: Notify::new(),
            release: Semaphore::new(0),
        }
    }

    /// A handler's body: waits, holding its delivery's payload, until every delivery is in.
    async fn hold(&self, payload: &[u8]) {
        if self.entered.fetch_add(1, Ordering::SeqCst) + 1 == self.in_flight {
            self.all_in.notify_one();
        }
        drop(self.release.acquire().await);
        std::hint::black_box(payload);
        if self.done.fetch_add(1, Ordering::SeqCst) + 1 == self.in_flight {
            self.all_done.notify_one();
        }
    }

    async fn all_done(&self) {
        self.all_done.notified().await;
    }

    /// The allocation counters once every delivery is held, then the handlers released.
    async fn measure(&self) -> (usize, usize) {
        self.all_in.notified().await;
        tokio::time::sleep(SETTLE).await;
        let held = allocated();
        self.release.add_permits(self.in_flight);
        held
    }
}

/// What the consumer held per delivery in flight.
#[derive(Debug, Clone, Copy)]
struct Held {
    bytes: f64,
    blocks: f64,
}

impl Held {
    fn between(before: (usize, usize), held: (usize, usize), in_flight: u16) -> Self {
        let per = |after: usize, before: usize| {
            after.wrapping_sub(before) as isize as f64 / f64::from(in_flight)
        };
        Self {
            bytes: per(held.0, before.0),
            blocks: per(held.1, before.1),
        }
    }
}

// ---------------------------------------------------------------------------------------
// The sweep

fn message_ids(run: usize, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("r{run}-m{i:06}")).collect()
}

fn timing(start: Instant, tally: &Tally, stopped: Instant) -> Result<Timing, RunError> {
    let last = tally.last().ok_or_else(|| {
        format!(
            "the consumer stopped after {} of {} answers",
            tally.answered.load(Ordering::Relaxed),
            tally.expected
        )
    })?;
    Ok(Timing {
        consuming: last - start,
        stopping: stopped.saturating_duration_since(last),
    })
}

struct Options {
    messages: usize,
    rounds: usize,
    prefetch: Vec<u16>,
    in_flight: u16,
    connections: Option<u32>,
    only: Option<Broker>,
    no_database: bool,
}

impl Options {
    fn parse() -> Result<Self, String> {
        let mut options = Self {
            messages: 10_000,
            rounds: 3,
            prefetch: vec![1, 4, 16, 64, 256],
            in_flight: 1000,
            connections: None,
            only: None,
            no_database: false,
        };
        let mut arguments = std::env::args().skip(1);
        while let Some(flag) = arguments.next() {
            let mut value = || {
                arguments
                    .next()
                    .ok_or_else(|| format!("{flag} needs a value"))
            };
            let bad = |e: std::num::ParseIntError| format!("{flag}: {e}");
            match flag.as_str() {
                "--messages" => options.messages = value()?.parse().map_err(bad)?,
                "--rounds" => options.rounds = value()?.parse().map_err(bad)?,
                "--prefetch" => {
                    // `--prefetch none`: the memory measurement alone.
                    options.prefetch = match value()?.as_str() {
                        "none" => Vec::new(),
                        list => list
                            .split(',')
                            .map(|n| n.trim().parse().map_err(bad))
                            .collect::<Result<_, _>>()?,
                    };
                }
                "--in-flight" => options.in_flight = value()?.parse().map_err(bad)?,
                "--connections" => options.connections = Some(value()?.parse().map_err(bad)?),
                "--no-database" => options.no_database = true,
                "--only" => {
                    options.only = Some(match value()?.as_str() {
                        "rabbitmq" => Broker::RabbitMq,
                        "nats" => Broker::Nats,
                        other => return Err(format!("--only {other}: rabbitmq or nats")),
                    });
                }
                other => {
                    return Err(format!(
                        "unknown argument {other}; usage: broker_bench [--messages N] \
                         [--rounds R] [--prefetch 1,4,16,64,256|none] [--in-flight K (0: no memory \
                         measurement)] [--connections C] [--only rabbitmq|nats] [--no-database]"
                    ));
                }
            }
        }
        if options.messages == 0 || options.rounds == 0 || options.prefetch.contains(&0) {
            return Err("--messages, --rounds and every --prefetch must be at least 1".into());
        }
        Ok(options)
    }

    fn brokers(&self) -> Vec<Broker> {
        match self.only {
            Some(broker) => vec![broker],
            None => vec![Broker::RabbitMq, Broker::Nats],
        }
    }
}

/// Rates by (broker, prefetch, variant), one per round.
type Rates = BTreeMap<(Broker, u16, Variant), Vec<f64>>;

struct Bench {
    options: Options,
    target: Target,
    connections: u32,
    rabbit: Option<Rabbit>,
    nats: Option<Nats>,
    runs: usize,
    failures: Vec<String>,
}

impl Bench {
    /// One throughput run: a fresh queue or stream and database, the consumer, the checks.
    async fn run(&mut self, broker: Broker, variant: Variant, prefetch: u16) -> Option<Timing> {
        self.runs += 1;
        let run = self.runs;
        let label = format!("{broker} {variant}, prefetch {prefetch}");
        // A safety net beyond the consumer's own limit (`measure`): publishing or a check
        // that hangs ends the run as a failure, not the bench.
        let limit =
            Duration::from_secs(180) + Duration::from_millis(30) * self.options.messages as u32;
        let outcome = tokio::time::timeout(limit, self.measure(run, broker, variant, prefetch))
            .await
            .unwrap_or_else(|_| Err(format!("not done after {} s", limit.as_secs())));
        match outcome {
            Ok(timing) => {
                eprintln!(
                    "  {label}: {:.0} msgs/s ({:.2} s; stopped {} ms after the last answer)",
                    rate(self.options.messages, timing),
                    timing.consuming.as_secs_f64(),
                    timing.stopping.as_millis()
                );
                Some(timing)
            }
            Err(e) => {
                eprintln!("  {label}: FAILED: {e}");
                self.failures.push(format!("{label}: {e}"));
                None
            }
        }
    }

    async fn measure(
        &self,
        run: usize,
        broker: Broker,
        variant: Variant,
        prefetch: u16,
    ) -> Result<Timing, String> {
        let n = self.options.messages;
        let ids = message_ids(run, n);
        let connections = self.connections.min(u32::from(prefetch));
        let database = self.target.fresh(run, connections).await?;
        let tally = Tally::new(n);
        // Generous: the slowest cell (prefetch 1) runs at a few hundred messages per second.
        let limit = Duration::from_secs(60) + Duration::from_millis(20) * n as u32;
        let (timing, left) = match broker {
            Broker::RabbitMq => {
                let rabbit = self.rabbit.as_ref().expect("connected");
                let queue = rabbit.prepare(run, &ids).await?;
                let consumed = tokio::time::timeout(
                    limit,
                    rabbit.consume(&queue, variant, prefetch, &database, &tally),
                )
                .await
                .unwrap_or_else(|_| Err(format!("not done after {} s", limit.as_secs())));
                let left = rabbit.left(&queue).await;
                rabbit.delete(&queue).await;
                (consumed, left)
            }
            Broker::Nats => {
                let nats = self.nats.as_ref().expect("connected");
                let stream = nats.prepare(run, &ids).await?;
                let consumed = tokio::time::timeout(
                    limit,
                    nats.consume(&stream, variant, usize::from(prefetch), &database, &tally),
                )
                .await
                .unwrap_or_else(|_| Err(format!("not done after {} s", limit.as_secs())));
                let left = nats.left(&stream).await;
                nats.delete(&stream).await;
                (consumed, left)
            }
        };
        let timing = timing?;
        let left = left?;
        let (rows, distinct) = database.effects().await?;
        database.discard();
        let (duplicates, failed) = (
            tally.duplicates.load(Ordering::Relaxed),
            tally.failed.load(Ordering::Relaxed),
        );
        if left != 0 || rows != n as i64 || distinct != n as i64 {
            return Err(format!(
                "{n} messages: {rows} effect rows for {distinct} messages, {left} left \
                 unacknowledged on the broker ({duplicates} duplicates, {failed} failures)"
            ));
        }
        if duplicates != 0 || failed != 0 {
            eprintln!(
                "  (every message applied once; {duplicates} duplicates, {failed} failures on the way)"
            );
        }
        Ok(timing)
    }

    async fn memory(&mut self, broker: Broker, variant: Variant) -> Option<Held> {
        self.runs += 1;
        let run = self.runs;
        let k = self.options.in_flight;
        let held = match broker {
            Broker::RabbitMq => {
                let rabbit = self.rabbit.as_ref().expect("connected");
                rabbit.memory(run, variant, k).await
            }
            Broker::Nats => {
                let nats = self.nats.as_ref().expect("connected");
                nats.memory(run, variant, usize::from(k)).await
            }
        };
        match held {
            Ok(held) => {
                eprintln!(
                    "  {broker} {variant}, {k} in flight: {:.0} bytes, {:.1} allocations per delivery",
                    held.bytes, held.blocks
                );
                Some(held)
            }
            Err(e) => {
                eprintln!("  {broker} {variant}, {k} in flight: FAILED: {e}");
                self.failures
                    .push(format!("memory, {broker} {variant}: {e}"));
                None
            }
        }
    }
}

fn rate(messages: usize, timing: Timing) -> f64 {
    messages as f64 / timing.consuming.as_secs_f64()
}

fn median(values: &[f64]) -> Option<f64> {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => None,
        n if n % 2 == 1 => Some(sorted[n / 2]),
        n => Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2.0),
    }
}

/// `median (min–max)` of the per-round ratios `numerator / denominator`.
fn ratio(rates: &Rates, broker: Broker, prefetch: u16, over: (Variant, Variant)) -> String {
    let (Some(top), Some(bottom)) = (
        rates.get(&(broker, prefetch, over.0)),
        rates.get(&(broker, prefetch, over.1)),
    ) else {
        return "–".into();
    };
    let ratios: Vec<f64> = top
        .iter()
        .zip(bottom)
        .map(|(top, bottom)| top / bottom)
        .filter(|r| r.is_finite())
        .collect();
    let Some(mid) = median(&ratios) else {
        return "–".into();
    };
    let low = ratios.iter().copied().fold(f64::INFINITY, f64::min);
    let high = ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if ratios.len() > 1 {
        format!("{mid:.2} ({low:.2}–{high:.2})")
    } else {
        format!("{mid:.2}")
    }
}

fn cell(rates: &Rates, key: (Broker, u16, Variant)) -> String {
    rates
        .get(&key)
        .and_then(|values| median(values))
        .map_or_else(|| "–".into(), |rate| format!("{rate:.0}/s"))
}

#[tokio::main]
async fn main() -> ExitCode {
    match bench().await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn bench() -> Result<ExitCode, String> {
    let options = Options::parse()?;
    let target = Target::from_env(options.no_database)?;
    let connections = options
        .connections
        .unwrap_or_else(|| target.default_connections());
    let brokers = options.brokers();
    let amqp = inbox_broker_examples::amqp_url();
    let nats_url = inbox_broker_examples::nats_url();
    let rabbit = match brokers.contains(&Broker::RabbitMq) {
        true => Some(Rabbit::connect(amqp.clone()).await?),
        false => None,
    };
    let nats = match brokers.contains(&Broker::Nats) {
        true => Some(Nats::connect(nats_url.clone()).await?),
        false => None,
    };
    println!("effects in {}", target.describe());
    if rabbit.is_some() {
        println!(
            "RabbitMQ {}, a quorum queue per run",
            without_password(&amqp)
        );
    }
    if let Some(nats) = &nats {
        println!(
            "NATS {} {nats_url}, a JetStream stream (file storage) per run",
            nats.version
        );
    }
    println!(
        "{} messages per run, payload {} bytes; {} rounds; pool of min(prefetch, {connections}) \
         connections",
        options.messages,
        PAYLOAD.len(),
        options.rounds
    );
    let mut bench = Bench {
        options,
        target,
        connections,
        rabbit,
        nats,
        runs: 0,
        failures: Vec::new(),
    };

    let mut rates = Rates::new();
    let mut stops: BTreeMap<(Broker, Variant), Vec<f64>> = BTreeMap::new();
    let prefetches = bench.options.prefetch.clone();
    for round in 0..bench.options.rounds {
        eprintln!("round {} of {}", round + 1, bench.options.rounds);
        for &prefetch in &prefetches {
            for &broker in &brokers {
                // Each round in another order, so that no variant always runs first.
                let mut variants = broker.variants().to_vec();
                let turn = round % variants.len();
                variants.rotate_left(turn);
                for variant in variants {
                    let timing = bench.run(broker, variant, prefetch).await;
                    let rate = timing.map_or(f64::NAN, |t| rate(bench.options.messages, t));
                    rates
                        .entry((broker, prefetch, variant))
                        .or_default()
                        .push(rate);
                    if let Some(timing) = timing {
                        stops
                            .entry((broker, variant))
                            .or_default()
                            .push(timing.stopping.as_secs_f64() * 1000.0);
                    }
                }
            }
        }
    }

    let mut memory: BTreeMap<(Broker, Variant), Vec<Held>> = BTreeMap::new();
    if bench.options.in_flight > 0 {
        // Repeated as the throughput is: the broker client's buffers grow by steps, and
        // where a step falls moves a little from one run to the next.
        for round in 0..bench.options.rounds {
            eprintln!(
                "memory, {} deliveries in flight, round {} of {}",
                bench.options.in_flight,
                round + 1,
                bench.options.rounds
            );
            for &broker in &brokers {
                for &variant in broker.variants() {
                    if variant == Variant::DirectConfirmed {
                        continue;
                    }
                    if let Some(held) = bench.memory(broker, variant).await {
                        memory.entry((broker, variant)).or_default().push(held);
                    }
                }
            }
        }
    }
    if let Some(rabbit) = bench.rabbit.take() {
        rabbit.close().await;
    }

    println!();
    for &broker in brokers.iter().filter(|_| !prefetches.is_empty()) {
        let setting = match broker {
            Broker::RabbitMq => "prefetch",
            Broker::Nats => "max_ack_pending",
        };
        println!(
            "{broker}: messages per second, median of {} rounds; Pump / direct per round, \
             median (range)\n",
            bench.options.rounds
        );
        match broker {
            Broker::RabbitMq => {
                println!("| {setting} | direct | Pump | Pump / direct |");
                println!("|---:|---:|---:|---:|");
            }
            Broker::Nats => {
                println!(
                    "| {setting} | direct, ack | direct, double_ack | Pump | Pump / ack | \
                     Pump / double_ack |"
                );
                println!("|---:|---:|---:|---:|---:|---:|");
            }
        }
        for &prefetch in &prefetches {
            let mut row = format!("| {prefetch} |");
            for &variant in broker.variants() {
                row += &format!(" {} |", cell(&rates, (broker, prefetch, variant)));
            }
            row += &format!(
                " {} |",
                ratio(&rates, broker, prefetch, (Variant::Pump, Variant::Direct))
            );
            if broker == Broker::Nats {
                row += &format!(
                    " {} |",
                    ratio(
                        &rates,
                        broker,
                        prefetch,
                        (Variant::Pump, Variant::DirectConfirmed)
                    )
                );
            }
            println!("{row}");
        }
        let stopping: Vec<String> = broker
            .variants()
            .iter()
            .filter_map(|variant| {
                let median = median(stops.get(&(broker, *variant))?)?;
                Some(format!("{variant} {median:.0} ms"))
            })
            .collect();
        println!(
            "\nfrom the last answer until the consumer had stopped (median over all runs): {}\n",
            stopping.join(", ")
        );
    }
    if !memory.is_empty() {
        println!(
            "memory per delivery in flight, {} held at once (prefetch / max_ack_pending {0}), \
             payload {} bytes; median of {} rounds (range of the bytes)\n",
            bench.options.in_flight,
            PAYLOAD.len(),
            bench.options.rounds
        );
        println!("| adapter | direct | Pump | Pump − direct |");
        println!("|---|---:|---:|---:|");
        for &broker in &brokers {
            let median_of = |variant| {
                let helds = memory.get(&(broker, variant))?;
                let bytes: Vec<f64> = helds.iter().map(|held| held.bytes).collect();
                let blocks: Vec<f64> = helds.iter().map(|held| held.blocks).collect();
                let low = bytes.iter().copied().fold(f64::INFINITY, f64::min);
                let high = bytes.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let held = Held {
                    bytes: median(&bytes)?,
                    blocks: median(&blocks)?,
                };
                Some((held, low, high))
            };
            let show = |held: Option<(Held, f64, f64)>| {
                held.map_or_else(
                    || "–".to_owned(),
                    |(held, low, high)| {
                        format!(
                            "{:.0} B ({low:.0}–{high:.0}), {:.1} allocations",
                            held.bytes, held.blocks
                        )
                    },
                )
            };
            let direct = median_of(Variant::Direct);
            let pump = median_of(Variant::Pump);
            let difference = match (direct.map(|held| held.0), pump.map(|held| held.0)) {
                (Some(direct), Some(pump)) => format!(
                    "{:+.0} B ({:+.1} allocations)",
                    pump.bytes - direct.bytes,
                    pump.blocks - direct.blocks
                ),
                _ => "–".to_owned(),
            };
            println!(
                "| {broker} | {} | {} | {difference} |",
                show(direct),
                show(pump)
            );
        }
        println!();
    }
    if bench.failures.is_empty() {
        println!("every run applied every message exactly once and left nothing unacknowledged");
        Ok(ExitCode::SUCCESS)
    } else {
        println!("{} runs FAILED:", bench.failures.len());
        for failure in &bench.failures {
            println!("  {failure}");
        }
        Ok(ExitCode::FAILURE)
    }
}
