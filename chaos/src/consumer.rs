//! A consumer process: deliveries in on standard input, answers out on standard output, each
//! acknowledgement written to this process's ack log and flushed to disk (`fsync`) before it
//! is sent. The handler is `#[idempotent]`: one effect row per message, in the inbox's
//! transaction, with the faults the orchestrator asks for in its body.

use std::fs::File;
use std::future::Future;
use std::io::{BufRead, Write};
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use diesel::prelude::*;
use inbox_diesel::idempotent;

use crate::protocol::{Answer, Backend, Delivery, Fault, Mode};

diesel::table! {
    /// The business effect: one row per applied delivery. No unique index: a message
    /// applied twice shows as two rows.
    effects (id) {
        id -> BigInt,
        message -> BigInt,
        delivery -> BigInt,
        consumer -> Text,
    }
}

diesel::table! {
    /// A few rows every transaction-mode body updates with `--hot`: on a Galera cluster, what
    /// makes another node's commit abort this one's transaction ([`crate::run`]).
    hot (id) {
        id -> Integer,
        n -> BigInt,
    }
}

/// The rows of [`hot`].
pub const HOT_ROWS: u64 = 3;

/// Whether the orchestrator ran with `--hot` (it sets this for its consumer processes).
pub const HOT_ENV: &str = "INBOX_CHAOS_HOT";

fn hot_rows() -> bool {
    static HOT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HOT.get_or_init(|| std::env::var_os(HOT_ENV).is_some())
}

/// With `--hot`: the hot row of `message`, and the body's pause after it, 0–3 ms (a window
/// in which another node's commit may abort this transaction).
fn hot_touch(message: u64) -> Option<(i32, Duration)> {
    hot_rows().then(|| {
        (
            (message % HOT_ROWS) as i32,
            Duration::from_micros(fastrand::u64(0..=3000)),
        )
    })
}

/// Why a delivery was not acknowledged.
#[derive(Debug)]
pub enum Failure {
    Inbox(inbox_diesel::Error),
    /// The orchestrator asked the body to fail.
    Injected,
}

impl From<inbox_diesel::Error> for Failure {
    fn from(e: inbox_diesel::Error) -> Self {
        Failure::Inbox(e)
    }
}

impl From<diesel::result::Error> for Failure {
    fn from(e: diesel::result::Error) -> Self {
        Failure::Inbox(e.into())
    }
}

/// The inbox's error it carries says where the diesel error is: a deadlock in a body is
/// retried in a fresh transaction, as in any handler.
impl inbox_diesel::HasDieselError for Failure {
    fn diesel_error(&self) -> Option<&diesel::result::Error> {
        match self {
            Failure::Inbox(e) => e.diesel_error(),
            Failure::Injected => None,
        }
    }

    fn record_attempts(&mut self, attempts: u32) {
        if let Failure::Inbox(e) = self {
            e.record_attempts(attempts);
        }
    }

    fn record_class(&mut self, class: inbox_diesel::ErrorClass, attempts: u32) {
        if let Failure::Inbox(e) = self {
            e.record_class(class, attempts);
        }
    }
}

impl Failure {
    fn class(&self) -> String {
        match self {
            Failure::Inbox(e) => e.class().label().to_owned(),
            Failure::Injected => "injected".to_owned(),
        }
    }

    /// Whether the connection may be unusable (lost, broken): it is established again.
    fn reconnect(&self) -> bool {
        matches!(self, Failure::Inbox(_))
    }
}

const SLOW: Duration = Duration::from_millis(20);

/// The handlers, sync and async, on one backend's connections. `$timeout`: statements that
/// end in a statement timeout on that backend, if it has one the body can set.
macro_rules! handlers {
    (
        $sync:ident, $Conn:ty, $async_fn:ident, $AsyncConn:ty, $timeout:expr,
        $claim:ident, $claim_async:ident, $any:ident, $any_async:ident
    ) => {
        #[idempotent(consumer = "chaos", key = *message)]
        pub fn $sync(
            conn: &mut $Conn,
            message: &u64,
            delivery: u64,
            name: &str,
            fault: Fault,
        ) -> Result<(), Failure> {
            diesel::insert_into(effects::table)
                .values((
                    effects::message.eq(*message as i64),
                    effects::delivery.eq(delivery as i64),
                    effects::consumer.eq(name),
                ))
                .execute(conn)?;
            if let Some((row, pause)) = hot_touch(*message) {
                diesel::update(hot::table.find(row))
                    .set(hot::n.eq(hot::n + 1))
                    .execute(conn)?;
                std::thread::sleep(pause);
            }
            match fault {
                Fault::Panic => panic!("chaos: a panic in the body"),
                Fault::Error => return Err(Failure::Injected),
                Fault::Slow | Fault::Cancel => std::thread::sleep(SLOW),
                Fault::Timeout => {
                    let statements: &[&str] = $timeout;
                    for sql in statements {
                        diesel::sql_query(*sql).execute(conn)?;
                    }
                }
                Fault::None => {}
            }
            Ok(())
        }

        /// Claim mode: the side effect is a line in this process's side-effect log.
        #[idempotent(consumer = "chaos-claim", key = *message, mode = "claim", lease_ms = 1000)]
        pub fn $claim(
            conn: &mut $Conn,
            message: &u64,
            fault: Fault,
            side: &SideEffects,
        ) -> Result<(), Failure> {
            side.start(*message);
            match fault {
                Fault::Panic => panic!("chaos: a panic in the body"),
                Fault::Error => {
                    side.end(*message, "err");
                    return Err(Failure::Injected);
                }
                Fault::Slow | Fault::Cancel | Fault::Timeout => std::thread::sleep(SLOW),
                Fault::None => {}
            }
            side.end(*message, "ok");
            Ok(())
        }

        #[idempotent(consumer = "chaos-claim", key = *message, mode = "claim", lease_ms = 1000)]
        pub async fn $claim_async(
            conn: &mut $AsyncConn,
            message: &u64,
            fault: Fault,
            side: &SideEffects,
        ) -> Result<(), Failure> {
            side.start(*message);
            match fault {
                Fault::Panic => panic!("chaos: a panic in the body"),
                Fault::Error => {
                    side.end(*message, "err");
                    return Err(Failure::Injected);
                }
                Fault::Slow | Fault::Cancel | Fault::Timeout => tokio::time::sleep(SLOW).await,
                Fault::None => {}
            }
            side.end(*message, "ok");
            Ok(())
        }

        /// Odd messages to the claim-mode handler, even ones to the transaction's.
        pub fn $any(
            conn: &mut $Conn,
            d: &Delivery,
            name: &str,
            side: &SideEffects,
        ) -> Result<&'static str, Failure> {
            match d.message % 2 {
                1 => $claim(conn, &d.message, d.fault, side)
                    .map(|o| settled(o.is_processed(), o.is_in_flight())),
                _ => $sync(conn, &d.message, d.id, name, d.fault)
                    .map(|o| settled(o.is_processed(), false)),
            }
        }

        pub fn $any_async<'a>(
            conn: &'a mut $AsyncConn,
            d: &'a Delivery,
            name: &'a str,
            side: &'a SideEffects,
        ) -> Pin<Box<dyn Future<Output = Result<&'static str, Failure>> + Send + 'a>> {
            Box::pin(async move {
                match d.message % 2 {
                    1 => $claim_async(conn, &d.message, d.fault, side)
                        .await
                        .map(|o| settled(o.is_processed(), o.is_in_flight())),
                    _ => $async_fn(conn, &d.message, d.id, name, d.fault)
                        .await
                        .map(|o| settled(o.is_processed(), false)),
                }
            })
        }

        #[idempotent(consumer = "chaos", key = *message)]
        pub async fn $async_fn(
            conn: &mut $AsyncConn,
            message: &u64,
            delivery: u64,
            name: &str,
            fault: Fault,
        ) -> Result<(), Failure> {
            let insert = diesel::insert_into(effects::table).values((
                effects::message.eq(*message as i64),
                effects::delivery.eq(delivery as i64),
                effects::consumer.eq(name),
            ));
            diesel_async::RunQueryDsl::execute(insert, conn).await?;
            if let Some((row, pause)) = hot_touch(*message) {
                let touch = diesel::update(hot::table.find(row)).set(hot::n.eq(hot::n + 1));
                diesel_async::RunQueryDsl::execute(touch, conn).await?;
                tokio::time::sleep(pause).await;
            }
            match fault {
                Fault::Panic => panic!("chaos: a panic in the body"),
                Fault::Error => return Err(Failure::Injected),
                Fault::Slow | Fault::Cancel => tokio::time::sleep(SLOW).await,
                Fault::Timeout => {
                    let statements: &[&str] = $timeout;
                    for sql in statements {
                        diesel_async::RunQueryDsl::execute(diesel::sql_query(*sql), conn).await?;
                    }
                }
                Fault::None => {}
            }
            Ok(())
        }
    };
}

handlers!(
    apply_sqlite,
    diesel::SqliteConnection,
    apply_sqlite_async,
    diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>,
    &[],
    claim_sqlite,
    claim_sqlite_async,
    any_sqlite,
    any_sqlite_async
);

#[cfg(feature = "postgres")]
handlers!(
    apply_postgres,
    diesel::PgConnection,
    apply_postgres_async,
    diesel_async::AsyncPgConnection,
    &["SET LOCAL statement_timeout = 5", "SELECT pg_sleep(0.05)"],
    claim_postgres,
    claim_postgres_async,
    any_postgres,
    any_postgres_async
);

#[cfg(feature = "mysql")]
handlers!(
    apply_mysql,
    diesel::MysqlConnection,
    apply_mysql_async,
    diesel_async::AsyncMysqlConnection,
    &[],
    claim_mysql,
    claim_mysql_async,
    any_mysql,
    any_mysql_async
);

/// The handler as it is often written by hand, for the check's negative control: look for
/// an earlier effect, then write one; no inbox, no transaction around the two.
macro_rules! naive {
    ($name:ident, $Conn:ty) => {
        pub fn $name(
            conn: &mut $Conn,
            d: &Delivery,
            name: &str,
            _: &SideEffects,
        ) -> Result<&'static str, Failure> {
            let seen: i64 = effects::table
                .filter(effects::message.eq(d.message as i64))
                .count()
                .get_result(conn)?;
            if seen > 0 {
                return Ok("duplicate");
            }
            diesel::insert_into(effects::table)
                .values((
                    effects::message.eq(d.message as i64),
                    effects::delivery.eq(d.id as i64),
                    effects::consumer.eq(name),
                ))
                .execute(conn)?;
            match d.fault {
                Fault::Panic => panic!("chaos: a panic in the body"),
                Fault::Error => Err(Failure::Injected),
                _ => Ok("processed"),
            }
        }
    };
}

naive!(naive_sqlite, diesel::SqliteConnection);
#[cfg(feature = "postgres")]
naive!(naive_postgres, diesel::PgConnection);
#[cfg(feature = "mysql")]
naive!(naive_mysql, diesel::MysqlConnection);

/// A handler's answer, as the orchestrator hears it.
fn settled(processed: bool, in_flight: bool) -> &'static str {
    match (processed, in_flight) {
        (true, _) => "processed",
        (false, true) => "in_flight",
        (false, false) => "duplicate",
    }
}

/// Claim mode's side effect, and what the checker needs to judge it: `S <message> <ns>`
/// when it starts (the side effect itself), `E <message> ok|err <ns>` when the body ends,
/// `T <message> <ns>` once the handler returned `Processed` (the claim stamped complete).
/// Each line on disk (`fsync`) before the body goes on.
pub struct SideEffects(Mutex<File>);

impl SideEffects {
    fn open(dir: &Path, name: &str) -> std::io::Result<Self> {
        let path = dir.join(format!("{name}-{}.effects", std::process::id()));
        Ok(SideEffects(Mutex::new(
            File::options().create(true).append(true).open(path)?,
        )))
    }

    fn line(&self, text: std::fmt::Arguments<'_>) {
        let mut file = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        writeln!(file, "{text} {now}").expect("write the side-effect log");
        file.sync_data().expect("fsync the side-effect log");
    }

    pub fn start(&self, message: u64) {
        self.line(format_args!("S {message}"));
    }

    pub fn end(&self, message: u64, how: &str) {
        self.line(format_args!("E {message} {how}"));
    }

    fn stamped(&self, message: u64) {
        self.line(format_args!("T {message}"));
    }
}

/// The ack log: one line per acknowledgement, on disk before the broker hears of it.
struct AckLog(Mutex<File>);

impl AckLog {
    fn open(dir: &Path, name: &str) -> std::io::Result<Self> {
        let path = dir.join(format!("{name}-{}.acks", std::process::id()));
        Ok(AckLog(Mutex::new(
            File::options().create(true).append(true).open(path)?,
        )))
    }

    fn write(&self, delivery: &Delivery, outcome: &str) {
        let mut file = self.0.lock().unwrap_or_else(|p| p.into_inner());
        writeln!(file, "{} {} {outcome}", delivery.id, delivery.message)
            .expect("write the ack log");
        file.sync_data().expect("fsync the ack log");
    }
}

fn say(answer: Answer) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{answer}").expect("write to the orchestrator");
    out.flush().expect("flush to the orchestrator");
}

fn answer(
    log: &AckLog,
    side: &SideEffects,
    delivery: &Delivery,
    result: std::thread::Result<Result<&'static str, Failure>>,
) -> bool {
    match result {
        Ok(Ok("in_flight")) => {
            // Another delivery holds the claim: redelivered a little later.
            std::thread::sleep(Duration::from_millis(50));
            say(Answer::Nack {
                delivery: delivery.id,
                class: "in_flight".to_owned(),
            });
            false
        }
        Ok(Ok(outcome)) => {
            if outcome == "processed" && delivery.message % 2 == 1 {
                side.stamped(delivery.message);
            }
            log.write(delivery, outcome);
            say(Answer::Ack {
                delivery: delivery.id,
                outcome: outcome.to_owned(),
            });
            false
        }
        Ok(Err(failure)) => {
            // The classes the runtime names are expected here; an unclassified error is
            // shown, for the run's reader to judge (every error with INBOX_CHAOS_ERRORS set).
            if let Failure::Inbox(e) = &failure
                && (e.class() == inbox_diesel::ErrorClass::Other
                    || std::env::var_os("INBOX_CHAOS_ERRORS").is_some())
            {
                eprintln!("consumer: delivery {}: {e}: {e:?}", delivery.id);
            }
            say(Answer::Nack {
                delivery: delivery.id,
                class: failure.class(),
            });
            failure.reconnect()
        }
        Err(_) => {
            say(Answer::Nack {
                delivery: delivery.id,
                class: "panic".to_owned(),
            });
            false
        }
    }
}

/// The deliveries read from standard input, for the workers to take; closed at its end.
fn deliveries() -> mpsc::Receiver<Delivery> {
    let (send, receive) = mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            match line.parse::<Delivery>() {
                Ok(delivery) => {
                    if send.send(delivery).is_err() {
                        break;
                    }
                }
                Err(e) => eprintln!("consumer: {e}"),
            }
        }
    });
    receive
}

/// Runs the consumer until its standard input closes and what it holds is answered.
pub fn run(
    backend: Backend,
    mode: Mode,
    url: &str,
    name: &str,
    log_dir: &Path,
    workers: usize,
    naive: bool,
) {
    // The body's own panics are expected: they are answered as nacks, not printed. Any
    // other is shown.
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let injected = info
            .payload()
            .downcast_ref::<&str>()
            .is_some_and(|m| m.starts_with("chaos:"));
        if !injected {
            default(info);
        }
    }));
    let log = Arc::new(AckLog::open(log_dir, name).expect("open the ack log"));
    let side = Arc::new(SideEffects::open(log_dir, name).expect("open the side-effect log"));
    let logs = (log, side);
    say(Answer::Ready);
    match (backend, mode) {
        (Backend::Sqlite, _) if naive => {
            run_sync(url, name, workers, logs, connect_sqlite, naive_sqlite)
        }
        #[cfg(feature = "postgres")]
        (Backend::Postgres | Backend::Failover | Backend::FailoverSync, _) if naive => run_sync(
            url,
            name,
            workers,
            logs,
            connect::<diesel::PgConnection>,
            naive_postgres,
        ),
        #[cfg(feature = "mysql")]
        (Backend::Mysql | Backend::Galera, _) if naive => run_sync(
            url,
            name,
            workers,
            logs,
            connect::<diesel::MysqlConnection>,
            naive_mysql,
        ),
        (Backend::Sqlite, Mode::Sync) => {
            run_sync(url, name, workers, logs, connect_sqlite, any_sqlite)
        }
        (Backend::Sqlite, Mode::Async) => run_async(
            url,
            name,
            workers,
            logs,
            connect_sqlite_async,
            any_sqlite_async,
        ),
        #[cfg(feature = "postgres")]
        (Backend::Postgres | Backend::Failover | Backend::FailoverSync, Mode::Sync) => run_sync(
            url,
            name,
            workers,
            logs,
            connect::<diesel::PgConnection>,
            any_postgres,
        ),
        #[cfg(feature = "postgres")]
        (Backend::Postgres | Backend::Failover | Backend::FailoverSync, Mode::Async) => run_async(
            url,
            name,
            workers,
            logs,
            connect_async::<diesel_async::AsyncPgConnection>,
            any_postgres_async,
        ),
        #[cfg(feature = "mysql")]
        (Backend::Mysql | Backend::Galera, Mode::Sync) => run_sync(
            url,
            name,
            workers,
            logs,
            connect::<diesel::MysqlConnection>,
            any_mysql,
        ),
        #[cfg(feature = "mysql")]
        (Backend::Mysql | Backend::Galera, Mode::Async) => run_async(
            url,
            name,
            workers,
            logs,
            connect_async::<diesel_async::AsyncMysqlConnection>,
            any_mysql_async,
        ),
        #[allow(unreachable_patterns)]
        (backend, _) => panic!("this build has no {backend:?} backend: build with its feature"),
    }
}

type Logs = (Arc<AckLog>, Arc<SideEffects>);

fn connect_sqlite(url: &str) -> Result<diesel::SqliteConnection, String> {
    let mut conn = diesel::SqliteConnection::establish(url).map_err(|e| e.to_string())?;
    diesel::connection::SimpleConnection::batch_execute(&mut conn, "PRAGMA busy_timeout = 10000")
        .map_err(|e| e.to_string())?;
    Ok(conn)
}

#[allow(dead_code)]
fn connect<C: diesel::Connection>(url: &str) -> Result<C, String> {
    C::establish(url).map_err(|e| e.to_string())
}

async fn connect_sqlite_async(
    url: String,
) -> Result<
    diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>,
    String,
> {
    let conn = connect_sqlite(&url)?;
    Ok(diesel_async::sync_connection_wrapper::SyncConnectionWrapper::new(conn))
}

#[allow(dead_code)]
async fn connect_async<C: diesel_async::AsyncConnection>(url: String) -> Result<C, String> {
    C::establish(&url).await.map_err(|e| e.to_string())
}

type SyncApply<C> = fn(&mut C, &Delivery, &str, &SideEffects) -> Result<&'static str, Failure>;

/// Establishes a connection, again and again while the server is away (a crash, a restart).
/// `url` may list several servers, separated by spaces (a cluster's nodes): the first that
/// answers is taken, from the first.
fn established<C>(url: &str, connect: fn(&str) -> Result<C, String>) -> C {
    loop {
        for url in url.split(' ') {
            if let Ok(conn) = connect(url) {
                return conn;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn run_sync<C: Send + 'static>(
    url: &str,
    name: &str,
    workers: usize,
    (log, side): Logs,
    connect: fn(&str) -> Result<C, String>,
    apply: SyncApply<C>,
) {
    let deliveries = Arc::new(Mutex::new(deliveries()));
    std::thread::scope(|scope| {
        for _ in 0..workers {
            let (deliveries, log, side) = (deliveries.clone(), log.clone(), side.clone());
            scope.spawn(move || {
                let mut conn = established(url, connect);
                loop {
                    let next = deliveries.lock().unwrap_or_else(|p| p.into_inner()).recv();
                    let Ok(delivery) = next else { break };
                    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        apply(&mut conn, &delivery, name, &side)
                    }));
                    if answer(&log, &side, &delivery, result) {
                        conn = established(url, connect);
                    }
                }
            });
        }
    });
}

type AsyncApply<C> =
    for<'a> fn(
        &'a mut C,
        &'a Delivery,
        &'a str,
        &'a SideEffects,
    ) -> Pin<Box<dyn Future<Output = Result<&'static str, Failure>> + Send + 'a>>;

fn run_async<C, F>(
    url: &str,
    name: &str,
    workers: usize,
    (log, side): Logs,
    connect: fn(String) -> F,
    apply: AsyncApply<C>,
) where
    C: Send + 'static,
    F: Future<Output = Result<C, String>> + Send + 'static,
{
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let deliveries = Arc::new(Mutex::new(deliveries()));
    runtime.block_on(async {
        let mut tasks = Vec::new();
        for worker in 0..workers {
            let (deliveries, log, side) = (deliveries.clone(), log.clone(), side.clone());
            let (url, name) = (url.to_owned(), name.to_owned());
            tasks.push(tokio::spawn(async move {
                let established = async || loop {
                    for url in url.split(' ') {
                        if let Ok(conn) = connect(url.to_owned()).await {
                            return conn;
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                };
                let mut conn = established().await;
                let mut rng =
                    fastrand::Rng::with_seed(worker as u64 ^ u64::from(std::process::id()));
                loop {
                    let receiver = deliveries.clone();
                    let next = tokio::task::spawn_blocking(move || {
                        receiver.lock().unwrap_or_else(|p| p.into_inner()).recv()
                    })
                    .await
                    .expect("the reader");
                    let Ok(delivery) = next else { break };
                    let call = apply(&mut conn, &delivery, &name, &side);
                    let result = match delivery.fault {
                        // Cut off mid-call, as a request timeout or a shutdown does.
                        Fault::Cancel => {
                            let limit = Duration::from_millis(rng.u64(1..15));
                            match tokio::time::timeout(limit, CatchUnwind(call)).await {
                                Ok(result) => result,
                                Err(_) => {
                                    say(Answer::Nack {
                                        delivery: delivery.id,
                                        class: "cancelled".to_owned(),
                                    });
                                    // Cut off mid-transaction, the connection is in no state
                                    // to go on: a pool would discard it too.
                                    conn = established().await;
                                    continue;
                                }
                            }
                        }
                        _ => CatchUnwind(call).await,
                    };
                    if answer(&log, &side, &delivery, result) {
                        conn = established().await;
                    }
                }
            }));
        }
        for task in tasks {
            task.await.expect("a worker");
        }
    });
}

/// A future whose panic is returned, as `catch_unwind` does for a call.
struct CatchUnwind<F>(F);

impl<F: Future + Unpin> Future for CatchUnwind<F> {
    type Output = std::thread::Result<F::Output>;

    fn poll(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let inner = &mut self.0;
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            Pin::new(&mut *inner).poll(cx)
        })) {
            Ok(std::task::Poll::Pending) => std::task::Poll::Pending,
            Ok(std::task::Poll::Ready(value)) => std::task::Poll::Ready(Ok(value)),
            Err(payload) => std::task::Poll::Ready(Err(payload)),
        }
    }
}
