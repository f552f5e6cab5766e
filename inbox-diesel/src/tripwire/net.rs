//! The net under every diesel connection: a write on any connection but the handler's own
//! transaction, stopped before it reaches the server.
//!
//! The compile-time guard sees the handler's body; the pool wrappers see checkouts through
//! the pools they wrap. What neither sees — a helper's own body that establishes a
//! connection, a function passed as a value, a trait object holding a checkout, a pool
//! without a wrapper — reaches the server through a diesel connection all the same, and
//! every diesel connection (diesel ≥ 2.2, diesel-async ≥ 0.5) reports each statement to its
//! [`Instrumentation`] before it sends it. [`install`] makes [`Net`] the instrumentation of
//! every connection established afterwards; while a handler's body runs, the `Net` of any
//! other connection stops a write (`INSERT`, `UPDATE`, `DELETE`, DDL, …) before it is sent:
//! the body stops, the handler's transaction rolls back, and the handler returns
//! [`Error::WriteOutsideTransaction`](crate::Error::WriteOutsideTransaction). Reads on other
//! connections go through: handlers read through their context's pool.
//!
//! ```
//! # #[cfg(feature = "sqlite")] {
//! use diesel::connection::SimpleConnection;
//! use diesel::prelude::*;
//! use inbox_diesel::{Error, InboxSchema, idempotent, schema};
//!
//! // First thing at startup, before any connection or pool is made.
//! inbox_diesel::tripwire::net::install()?;
//!
//! let dir = tempfile::tempdir()?;
//! let url = dir.path().join("app.db").display().to_string();
//! let mut conn = SqliteConnection::establish(&url)?;
//! conn.batch_execute(&schema::sqlite::create_table_sql(&InboxSchema::DEFAULT))?;
//! conn.batch_execute("CREATE TABLE audit (what TEXT)")?;
//!
//! /// Somewhere in a helper, out of the compiler's sight: a connection of its own.
//! fn audit(url: &str) -> QueryResult<usize> {
//!     let mut other = SqliteConnection::establish(url).expect("open");
//!     diesel::sql_query("INSERT INTO audit VALUES ('credit')").execute(&mut other)
//! }
//!
//! #[idempotent(consumer = "credit", key = *id)]
//! fn credit(conn: &mut SqliteConnection, id: &u64, url: &str) -> Result<(), Error> {
//!     audit(url)?;
//!     Ok(())
//! }
//!
//! let refused = credit(&mut conn, &1, &url).unwrap_err();
//! assert!(matches!(refused, Error::WriteOutsideTransaction { .. }));
//! # }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! **Limits.** The net sees the statements of the thread (a `fn` handler) or the future (an
//! `async fn` handler) that runs the body, as the pool tripwire does: work handed to
//! `std::thread::spawn` or `tokio::spawn`, and statements a `SyncConnectionWrapper` runs on
//! its blocking thread, are not seen — unless the wrapper's spawner is `net::Blocking`, which
//! takes the mark there. It sees connections established after [`install`]: a
//! pool that opened its connections before, or a connection given its own instrumentation
//! with `set_instrumentation`, has none — give those [`Net::around`] of the instrumentation
//! they had. A statement that writes through a function (`SELECT archive_row(…)`) reads as
//! a read. What a write is, is decided by each statement's first keyword, in a batch of several
//! too (and for `WITH`, by the keywords of its body; for `EXPLAIN ANALYZE`, which runs its
//! statement, by that statement's; a `SELECT … INTO` writes).
//!
//! The stop is an unwind from the statement to the handler's body. A helper on the way that
//! catches it (`catch_unwind`) does not make the handler succeed: the stop is raised again
//! when the body ends. What the unwind passes through is left as an unwind leaves it: a
//! `std::sync::Mutex` held across the write is poisoned, and a transaction opened by a
//! helper on its own connection stays open there (diesel does not roll back on an unwind)
//! until the connection is dropped.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::future::Future;
use std::pin::pin;
use std::task::Poll;

use diesel::connection::{Instrumentation, InstrumentationEvent};

use super::inside_handler;

/// The instrumentation that stops writes outside the handler's transaction: install it with
/// [`install`], or give a connection one with [`Net::around`] its own instrumentation.
#[derive(Default)]
pub struct Net {
    inner: Option<Box<dyn Instrumentation>>,
}

impl fmt::Debug for Net {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Net")
            .field("around", &self.inner.is_some())
            .finish()
    }
}

impl Net {
    /// A net with no other instrumentation.
    pub fn new() -> Self {
        Self::default()
    }

    /// A net that passes every event on to `inner` (a logger, a tracer): for a connection
    /// that has an instrumentation of its own (`conn.set_instrumentation(Net::around(…))`).
    pub fn around(inner: impl Instrumentation) -> Self {
        Self {
            inner: Some(Box::new(inner)),
        }
    }

    /// The address this net is known by while its connection runs a handler.
    pub(crate) fn id(instrumentation: &mut dyn Instrumentation) -> Option<usize> {
        instrumentation
            .downcast_ref::<Net>()
            .map(|net| std::ptr::from_ref(net) as usize)
    }
}

impl Instrumentation for Net {
    fn on_connection_event(&mut self, event: InstrumentationEvent<'_>) {
        if let InstrumentationEvent::StartQuery { query, .. } = &event
            && let Some(inside) = inside_handler()
            && HANDLER_NET.get() != Some(std::ptr::from_ref(self) as usize)
        {
            let text = query.to_string();
            let statement = text.split("-- binds:").next().unwrap_or_default().trim();
            if writes(statement) {
                let escaped = Escaped {
                    consumer: inside.consumer(),
                    statement: statement.chars().take(120).collect(),
                };
                tracing::error!(consumer = escaped.consumer, "{escaped}");
                // Kept for the body's end too: code between here and the body that catches
                // the unwind (`catch_unwind` in a helper) does not make the handler succeed.
                STOPPED.with_borrow_mut(|stopped| {
                    stopped.get_or_insert_with(|| escaped.clone());
                });
                // Not `panic!`: the hook would report a panic the runtime turns into an
                // error. The runtime catches this payload at the body and rolls back.
                std::panic::resume_unwind(Box::new(escaped));
            }
        }
        if let Some(inner) = &mut self.inner {
            inner.on_connection_event(event);
        }
    }
}

/// Makes [`Net`] the instrumentation of every diesel connection established from now on
/// (diesel's `set_default_instrumentation`, which diesel-async's connections read too).
/// Call it at startup, before the pools open their connections.
///
/// # Errors
/// diesel's, when its global setting is poisoned.
pub fn install() -> diesel::QueryResult<()> {
    diesel::connection::set_default_instrumentation(|| Some(Box::new(Net::new())))?;
    INSTALLED.store(true, std::sync::atomic::Ordering::Relaxed);
    Ok(())
}

/// [`install`], with the application's own default instrumentation (a query logger, a
/// tracer) inside the net, which passes every event on to it: what to call instead of both
/// `install()` and diesel's `set_default_instrumentation(yours)`, which after `install()`
/// would replace the net for every connection opened since ([`NetMissing`]). `yours` is
/// what `set_default_instrumentation` takes.
///
/// ```no_run
/// use diesel::connection::{Instrumentation, InstrumentationEvent};
/// use inbox_diesel::tripwire::net;
///
/// struct QueryLog;
///
/// impl Instrumentation for QueryLog {
///     fn on_connection_event(&mut self, event: InstrumentationEvent<'_>) {
///         if let InstrumentationEvent::StartQuery { query, .. } = event {
///             println!("{query}");
///         }
///     }
/// }
///
/// net::install_around(|| Some(Box::new(QueryLog)))?;
/// # Ok::<(), diesel::result::Error>(())
/// ```
///
/// # Errors
/// diesel's, when its global setting is poisoned.
pub fn install_around(yours: fn() -> Option<Box<dyn Instrumentation>>) -> diesel::QueryResult<()> {
    *AROUND.write().unwrap_or_else(|e| e.into_inner()) = Some(yours);
    diesel::connection::set_default_instrumentation(|| {
        let yours = *AROUND.read().unwrap_or_else(|e| e.into_inner());
        Some(Box::new(Net {
            inner: yours.and_then(|yours| yours()),
        }))
    })?;
    INSTALLED.store(true, std::sync::atomic::Ordering::Relaxed);
    Ok(())
}

/// What diesel's `set_default_instrumentation` takes: a default instrumentation's maker.
type Maker = fn() -> Option<Box<dyn Instrumentation>>;

/// The application's default instrumentation that [`install_around`] puts inside the net.
static AROUND: std::sync::RwLock<Option<Maker>> = std::sync::RwLock::new(None);

/// [`install`] was called: from then on a handler's own connection without a [`Net`] is
/// refused ([`NetMissing`]).
static INSTALLED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// A handler whose own connection has no [`Net`], in a process that [`install`]ed it: the
/// application's own `set_default_instrumentation` after `install()` replaced it for every
/// connection opened since (a query logger's), or the connection was opened before
/// `install()`. Writes on other connections would not be stopped, without a word; what the
/// runtime turns into [`Error::NetMissing`](crate::Error::NetMissing), before the body runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetMissing {
    /// The handler whose connection has no net.
    pub consumer: &'static str,
}

impl fmt::Display for NetMissing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the run-time net was installed (`tripwire::net::install`), but the connection of \
             the #[idempotent] handler `{}` has no `Net`: a `set_default_instrumentation` of \
             the application's after `install()` replaced it for every connection opened \
             since (call `tripwire::net::install_around(yours)` instead of both), or the connection \
             was opened before `install()`; a write on another connection would not be \
             stopped. Nothing ran",
            self.consumer
        )
    }
}

impl std::error::Error for NetMissing {}

/// A write on another connection, stopped: what the runtime turns into
/// [`Error::WriteOutsideTransaction`](crate::Error::WriteOutsideTransaction).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Escaped {
    /// The handler whose body ran the write.
    pub consumer: &'static str,
    /// The statement, cut at 120 characters.
    pub statement: String,
}

impl fmt::Display for Escaped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a write on a connection that is not the #[idempotent] handler `{}`'s transaction \
             was stopped before it was sent (`{}`): it would commit on its own, whatever the \
             inbox decides, and a redelivery would apply it again. Pass the handler's \
             connection to the code that writes; if the write must commit on its own, say so \
             with `inbox_diesel::tripwire::allow_outside_transaction(\"why\", || …)` \
             (`allow_outside_transaction_async(\"why\", future)` for a future)",
            self.consumer, self.statement
        )
    }
}

impl std::error::Error for Escaped {}

thread_local! {
    /// The net of the handler's own connection, while its body runs on this thread.
    static HANDLER_NET: Cell<Option<usize>> = const { Cell::new(None) };
    /// The first write stopped during the current poll of a handler's body.
    static STOPPED: RefCell<Option<Escaped>> = const { RefCell::new(None) };
}

/// Puts back what `HANDLER_NET` held before a poll.
struct Restore(Option<usize>);

impl Drop for Restore {
    fn drop(&mut self) {
        HANDLER_NET.set(self.0);
    }
}

/// Forgets a stop recorded during a poll that unwinds: the unwind carries it.
struct Forget;

impl Drop for Forget {
    fn drop(&mut self) {
        STOPPED.take();
        super::REFUSED.take();
    }
}

/// Runs `body` with `net` known as the handler's own connection during each of its polls.
/// A write stopped in the body stops the body, even if the unwind was caught on its way
/// (a helper's `catch_unwind`, a framework's panic guard): when the body ends after a stop,
/// the stop is raised again there, for the runtime to roll back. So does a checkout a
/// guarded pool refused ([`refuse_checkout`](super::refuse_checkout)), whatever the body
/// made of the refusal.
pub(crate) async fn handled_on<F: Future>(net: Option<usize>, body: F) -> F::Output {
    let mut body = pin!(body);
    let mut stopped = None;
    let mut refused = None;
    let missing = net.is_none() && INSTALLED.load(std::sync::atomic::Ordering::Relaxed);
    std::future::poll_fn(move |cx| {
        if missing {
            let consumer = inside_handler().map_or("", |inside| inside.consumer());
            std::panic::resume_unwind(Box::new(NetMissing { consumer }));
        }
        let _restore = Restore(HANDLER_NET.replace(net));
        let _forget = Forget;
        let poll = body.as_mut().poll(cx);
        if let Some(escaped) = STOPPED.take() {
            stopped.get_or_insert(escaped);
        }
        if let Some(inside) = super::REFUSED.take() {
            refused.get_or_insert(inside);
        }
        match (poll, stopped.take(), refused.take()) {
            (Poll::Ready(_), Some(escaped), _) => std::panic::resume_unwind(Box::new(escaped)),
            (Poll::Ready(_), None, Some(inside)) => std::panic::resume_unwind(Box::new(inside)),
            (poll, kept, kept_refusal) => {
                stopped = kept;
                refused = kept_refusal;
                poll
            }
        }
    })
    .await
}

/// The net on diesel-async's `SyncConnectionWrapper`, whose statements run on a blocking
/// thread: a [`SpawnBlocking`](diesel_async::sync_connection_wrapper::SpawnBlocking) that
/// takes the handler's mark there, so that a write on such a connection — while a handler's
/// body runs, other than the handler's — is stopped like any other. Name it as the second
/// parameter of the application's other wrapped connections (a helper's own, a pool's):
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::SqliteConnection;
/// use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
/// use inbox_diesel::tripwire::net::Blocking;
///
/// type AuditConnection = SyncConnectionWrapper<SqliteConnection, Blocking>;
/// # }
/// ```
///
/// The handler's own connection is the plain `SyncConnectionWrapper<SqliteConnection>`.
/// With diesel-async's default spawner the net does not see a wrapped connection's
/// statements. Dropped while its statement runs (a cancelled handler), it waits for the
/// statement to end, as diesel-async's own does.
#[cfg(all(feature = "async", feature = "sqlite"))]
#[derive(Debug, Clone)]
pub struct Blocking(tokio::runtime::Handle);

#[cfg(all(feature = "async", feature = "sqlite"))]
impl diesel_async::sync_connection_wrapper::SpawnBlocking for Blocking {
    fn spawn_blocking<'a, R>(
        &mut self,
        task: impl FnOnce() -> R + Send + 'static,
    ) -> std::pin::Pin<
        Box<
            dyn Future<Output = Result<R, Box<dyn std::error::Error + Send + Sync + 'static>>>
                + Send
                + 'a,
        >,
    >
    where
        R: Send + 'static,
    {
        let (consumer, net) = (super::current_mark(), HANDLER_NET.get());
        let running = Running {
            task: Some(self.0.spawn_blocking(move || {
                let _restore = Restore(HANDLER_NET.replace(net));
                let result = super::with_mark(consumer, || {
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(task))
                });
                STOPPED.take();
                result
            })),
            handle: self.0.clone(),
        };
        Box::pin(async move {
            match running.await {
                Ok(Ok(value)) => Ok(value),
                // A stopped write (or a panic) goes on where the statement was awaited, in
                // the body's poll, as it would from a statement run in place.
                Ok(Err(payload)) => std::panic::resume_unwind(payload),
                Err(join) => Err(Box::new(join) as Box<dyn std::error::Error + Send + Sync>),
            }
        })
    }

    fn get_runtime() -> Self {
        Blocking(tokio::runtime::Handle::current())
    }
}

/// A statement on its blocking thread; dropped early, it waits for the statement to end.
#[cfg(all(feature = "async", feature = "sqlite"))]
struct Running<R> {
    task: Option<tokio::task::JoinHandle<R>>,
    handle: tokio::runtime::Handle,
}

#[cfg(all(feature = "async", feature = "sqlite"))]
impl<R> Future for Running<R> {
    type Output = Result<R, tokio::task::JoinError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<Self::Output> {
        let task = self.task.as_mut().expect("polled after its end");
        let done = std::pin::Pin::new(task).poll(cx);
        if done.is_ready() {
            self.task = None;
        }
        done
    }
}

#[cfg(all(feature = "async", feature = "sqlite"))]
impl<R> Drop for Running<R> {
    fn drop(&mut self) {
        if let Some(task) = self.task.take()
            && !task.is_finished()
        {
            tokio::task::block_in_place(|| {
                let _ = self.handle.block_on(task);
            });
        }
    }
}

/// Whether `text` writes: any of its statements (separated by `;` outside quotes and
/// comments) does, by its first keyword; a `WITH` when its body has a data-changing keyword,
/// an `EXPLAIN ANALYZE` (which runs its statement) when its statement does, a `SELECT … INTO`
/// (PostgreSQL's `CREATE TABLE … AS`).
pub(crate) fn writes(text: &str) -> bool {
    statements(text).iter().any(|words| statement_writes(words))
}

fn statement_writes(words: &[String]) -> bool {
    const CHANGING: [&str; 6] = ["INSERT", "UPDATE", "DELETE", "MERGE", "REPLACE", "UPSERT"];
    let Some(first) = words.first() else {
        return false;
    };
    let has = |word: &str| words.iter().any(|w| w == word);
    match first.as_str() {
        "WITH" => words.iter().any(|word| CHANGING.contains(&word.as_str())),
        "EXPLAIN" if has("ANALYZE") || has("ANALYSE") => {
            let statement = words
                .iter()
                .position(|w| {
                    !matches!(
                        w.as_str(),
                        "EXPLAIN"
                            | "ANALYZE"
                            | "ANALYSE"
                            | "VERBOSE"
                            | "FORMAT"
                            | "TRUE"
                            | "FALSE"
                            | "ON"
                            | "OFF"
                            | "JSON"
                            | "TEXT"
                            | "XML"
                            | "YAML"
                            | "TREE"
                            | "TRADITIONAL"
                            | "BUFFERS"
                            | "COSTS"
                            | "SETTINGS"
                            | "WAL"
                            | "TIMING"
                            | "SUMMARY"
                            | "MEMORY"
                            | "SERIALIZE"
                    )
                })
                .map_or(&words[..0], |at| &words[at..]);
            statement_writes(statement)
        }
        "SELECT" => has("INTO"),
        "VALUES" | "TABLE" | "SHOW" | "EXPLAIN" | "DESCRIBE" | "DESC" | "PRAGMA" | "SET"
        | "RESET" | "BEGIN" | "START" | "COMMIT" | "ROLLBACK" | "SAVEPOINT" | "RELEASE"
        | "PREPARE" | "DEALLOCATE" | "DISCARD" | "LISTEN" | "UNLISTEN" | "USE" | "FETCH"
        | "CLOSE" | "DECLARE" | "MOVE" | "END" | "ABORT" => false,
        _ => true,
    }
}

/// The statements of `text`, each as its words in upper case: what is inside quotes
/// (`'…'`, `"…"`, `` `…` ``, `$tag$…$tag$`) and comments (`-- …`, `# …` is not one, `/* … */`,
/// nested) is no word, and a `;` inside them ends no statement.
fn statements(text: &str) -> Vec<Vec<String>> {
    let chars: Vec<char> = text.chars().collect();
    let mut statements = vec![Vec::new()];
    let mut word = String::new();
    let mut at = 0;
    let end_word = |word: &mut String, statements: &mut Vec<Vec<String>>| {
        if !word.is_empty() {
            let done = std::mem::take(word).to_ascii_uppercase();
            statements.last_mut().expect("one at least").push(done);
        }
    };
    while at < chars.len() {
        let c = chars[at];
        let next = chars.get(at + 1).copied();
        match c {
            '\'' | '"' | '`' => {
                end_word(&mut word, &mut statements);
                at += 1;
                while at < chars.len() {
                    match chars[at] {
                        // MySQL's backslash escape; harmless elsewhere.
                        '\\' if c == '\'' => at += 2,
                        q if q == c && chars.get(at + 1) == Some(&c) => at += 2,
                        q if q == c => break,
                        _ => at += 1,
                    }
                }
                at += 1;
            }
            '-' if next == Some('-') => {
                end_word(&mut word, &mut statements);
                while at < chars.len() && chars[at] != '\n' {
                    at += 1;
                }
            }
            '/' if next == Some('*') => {
                end_word(&mut word, &mut statements);
                let mut depth = 0;
                while at < chars.len() {
                    if chars[at] == '/' && chars.get(at + 1) == Some(&'*') {
                        depth += 1;
                        at += 2;
                    } else if chars[at] == '*' && chars.get(at + 1) == Some(&'/') {
                        depth -= 1;
                        at += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        at += 1;
                    }
                }
            }
            // `$tag$ … $tag$` (PostgreSQL); `$1` is a parameter.
            '$' if word.is_empty() && !next.is_some_and(|n| n.is_ascii_digit()) => {
                let tag_end = chars[at + 1..]
                    .iter()
                    .position(|&t| t == '$')
                    .map(|p| at + 1 + p)
                    .filter(|&e| {
                        chars[at + 1..e]
                            .iter()
                            .all(|&t| t.is_alphanumeric() || t == '_')
                    });
                match tag_end {
                    Some(tag_end) => {
                        let tag: Vec<char> = chars[at..=tag_end].to_vec();
                        at = tag_end + 1;
                        while at < chars.len() && !chars[at..].starts_with(&tag) {
                            at += 1;
                        }
                        at += tag.len();
                    }
                    None => at += 1,
                }
            }
            ';' => {
                end_word(&mut word, &mut statements);
                statements.push(Vec::new());
                at += 1;
            }
            c if c.is_alphanumeric() || c == '_' => {
                word.push(c);
                at += 1;
            }
            _ => {
                end_word(&mut word, &mut statements);
                at += 1;
            }
        }
    }
    end_word(&mut word, &mut statements);
    statements
}

#[cfg(test)]
mod tests {
    use super::writes;

    #[test]
    fn writes_are_told_from_reads() {
        for write in [
            "INSERT INTO audit VALUES (1)",
            "  update accounts set n = 1",
            "DELETE FROM x",
            "WITH moved AS (DELETE FROM a RETURNING *) SELECT * FROM moved",
            "CREATE TABLE t (a int)",
            "TRUNCATE t",
            "CALL archive()",
            "COPY t FROM STDIN",
            "REPLACE INTO t VALUES (1)",
            "/* audit */ INSERT INTO audit VALUES (1)",
            "-- a note\nDELETE FROM x",
            // A batch writes when any of its statements does.
            "BEGIN; INSERT INTO t VALUES ('escaped'); COMMIT;",
            "PRAGMA foreign_keys = ON; INSERT INTO t VALUES (1)",
            "SELECT '--'; INSERT INTO t VALUES (1)",
            "SELECT ';' AS x; DELETE FROM t",
            "SELECT $$;$$; UPDATE t SET a = 1",
            "SELECT $body$ ' $body$; UPDATE t SET a = 1",
            "/* a /* nested */ comment */ INSERT INTO t VALUES (1)",
            "SELECT 'it''s'; DELETE FROM t",
            // Runs its statement.
            "EXPLAIN ANALYZE INSERT INTO t VALUES (1)",
            "EXPLAIN (ANALYZE, FORMAT JSON) DELETE FROM t",
            // PostgreSQL's CREATE TABLE AS.
            "SELECT * INTO t_copy FROM t",
            "DO $$ BEGIN INSERT INTO t VALUES (1); END $$",
        ] {
            assert!(writes(write), "{write}");
        }
        for read in [
            "SELECT 1",
            "select * from accounts where id = $1",
            "WITH x AS (SELECT 1) SELECT * FROM x",
            "SHOW search_path",
            "BEGIN",
            "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE",
            "",
            "PRAGMA busy_timeout = 5000",
            "/* report */ SELECT count(*) FROM orders",
            "-- a note\nSELECT 1",
            "SELECT 'INSERT INTO t'; SELECT 2",
            "SELECT $1, $2",
            "EXPLAIN INSERT INTO t VALUES (1)",
            "EXPLAIN ANALYZE SELECT 1",
            "SELECT \"delete\" FROM t; -- ; DELETE FROM t",
            "BEGIN; SELECT 1; COMMIT",
        ] {
            assert!(!writes(read), "{read}");
        }
    }
}
