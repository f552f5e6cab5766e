//! Helpers for testing your own handlers against what a broker and a crash really do: the
//! same message delivered twice, several copies at once from several connections, a process
//! that dies after its handler's body ran but before the commit (or, in claim mode, between
//! the claim and the side effect), and a lock held by another connection. Turn on the
//! feature `testing` in your `[dev-dependencies]`.
//!
//! Every helper runs your handler as you call it — `|conn| credit(conn, &msg)` — on real
//! connections; what it checks is what is in your database afterwards ([`count`],
//! [`assert_once`]). A race is real: each copy runs on its own connection and thread, and
//! all of them are released together by a barrier just before the call. A crash is one as
//! the database sees it: the handler stops at the chosen point and its connection is closed
//! without another statement, so whatever it had not committed is rolled back by the server.
//!
//! ```
//! use diesel::prelude::*;
//! use diesel::connection::SimpleConnection;
//! use inbox_diesel::testing::{self, Crash};
//! use inbox_diesel::{Error, idempotent};
//!
//! #[idempotent(consumer = "credit", key = *id)]
//! fn credit(conn: &mut SqliteConnection, id: &u64) -> Result<(), Error> {
//!     diesel::sql_query("INSERT INTO credits (message) VALUES (?)")
//!         .bind::<diesel::sql_types::BigInt, _>(*id as i64)
//!         .execute(conn)?;
//!     Ok(())
//! }
//!
//! # let dir = tempfile::tempdir().unwrap();
//! # let url = dir.path().join("credits.sqlite").display().to_string();
//! let connect = || {
//!     let mut conn = SqliteConnection::establish(&url).unwrap();
//!     conn.batch_execute("PRAGMA busy_timeout = 10000").unwrap();
//!     conn
//! };
//! # let mut setup = connect();
//! # setup.batch_execute("PRAGMA journal_mode = WAL; CREATE TABLE credits (message BIGINT NOT NULL)").unwrap();
//! # setup.batch_execute(&inbox_diesel::schema::sqlite::create_table_sql(&inbox_diesel::InboxSchema::DEFAULT)).unwrap();
//! // Eight copies of message 1 at once, each from its own connection.
//! let mut connections: Vec<_> = (0..8).map(|_| connect()).collect();
//! let answers = testing::race(&mut connections, |conn| credit(conn, &1));
//! assert_eq!(answers.iter().filter(|a| a.as_ref().unwrap().is_processed()).count(), 1);
//! testing::assert_once(&mut connect(), "SELECT count(*) FROM credits WHERE message = 1");
//!
//! // Message 2: the consumer dies after the body ran, before the commit; the broker
//! // delivers it again.
//! testing::crash(connect(), Crash::BeforeCommit, |conn| credit(conn, &2));
//! assert_eq!(testing::count(&mut connect(), "SELECT count(*) FROM credits WHERE message = 2"), 0);
//! assert!(credit(&mut connect(), &2).unwrap().is_processed());
//! testing::assert_once(&mut connect(), "SELECT count(*) FROM credits WHERE message = 2");
//! ```
//!
//! The crash points are reached by the runtime of `#[idempotent]` (and of the function API)
//! only while a [`crash`] or [`crash_async`] call runs the handler, on that thread or during
//! that future's polls; elsewhere they cost one thread-local read. Work the call hands to
//! another thread or task (`std::thread::spawn`, `tokio::spawn`: a job runner's task per
//! job) runs without the plan: crash the spawned work itself — call [`crash_async`] inside
//! the task — or run the job on the calling task in the test.

use std::any::Any;
use std::cell::Cell;
use std::panic::AssertUnwindSafe;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use diesel::connection::Connection;
use diesel::sql_types::BigInt;
use inbox_core::InboxSchema;

/// Where a [`crash`] stops the handler: the process dies there, and its connection with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Crash {
    /// The body ran and returned `Ok`; its transaction (with the inbox marker) is not
    /// committed. The redelivery must apply the message. In the caller's transaction
    /// (`transaction = "caller"`, or `"caller_or_own"` called inside one): the handler's
    /// savepoint is released and the work waits in the caller's transaction, which the
    /// crash ends uncommitted — the job runner dies between the handler and its commit.
    BeforeCommit,
    /// The transaction committed, but the caller never learns it (the acknowledgement is
    /// lost). The redelivery must be a duplicate. Not reached in the caller's transaction,
    /// whose commit is the caller's: put a [`crash_point`](crate::crash_point) of your own
    /// after that commit and crash [`At`](Crash::At) it.
    AfterCommit,
    /// Claim mode: the claim is committed, the body — the side effect — has not started. The
    /// claim stays until its lease ends, then the message is taken over (or reported).
    AfterClaim,
    /// Claim mode: the body — the side effect — ran and returned `Ok`; the claim is not
    /// stamped complete. The side effect happened once; what a redelivery does depends on
    /// the lease and the outcome type, as for any crash there.
    BeforeStamp,
    /// A point of the application's own, where its code calls
    /// [`crash_point(name)`](crate::crash_point): between two e-mails of one job, between a
    /// job's effect and its row's deletion — inside a handler's body or around it, sync or
    /// async.
    At(&'static str),
    /// The `n`-th time (counting from 1) the application's point `name` is reached during
    /// the call: in a job that loops over messages, the crash after the second e-mail.
    AtHit(&'static str, u32),
}

/// What [`crash`] reports: the point was reached, and the connection closed there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Crashed(pub Crash);

thread_local! {
    static PLAN: Cell<Option<Crash>> = const { Cell::new(None) };
    /// How many times the planned [`Crash::AtHit`] point was reached so far.
    static HITS: Cell<u32> = const { Cell::new(0) };
}

/// Called by the runtime at each crash point: unwinds with [`Crashed`] when the running
/// [`crash`] asked for this one. Not a panic: no panic hook reports it.
pub(crate) fn reached(point: Crash) {
    let planned = match (PLAN.get(), point) {
        (Some(plan), point) if plan == point => plan,
        (Some(plan @ Crash::AtHit(name, n)), Crash::At(reached)) if name == reached => {
            let hits = HITS.get() + 1;
            HITS.set(hits);
            if hits < n {
                return;
            }
            plan
        }
        _ => return,
    };
    PLAN.set(None);
    std::panic::resume_unwind(Box::new(Crashed(planned)));
}

/// Puts back the plan (and its count of hits) that was set before, when the call or poll
/// ends (or unwinds).
struct Restore(Option<Crash>, u32);

impl Drop for Restore {
    fn drop(&mut self) {
        PLAN.set(self.0);
        HITS.set(self.1);
    }
}

/// What a call of the handler under a crash plan came to: the crash at `at`, or a panic
/// (the handler returned, or panicked, before it).
fn crashed<R>(result: Result<R, Box<dyn Any + Send>>, at: Crash) -> Crashed {
    let payload = match result {
        Ok(_) if matches!(at, Crash::At(_) | Crash::AtHit(..)) => panic!(
            "the call returned without reaching {at:?}: no `crash_point` of that name was \
             called on this thread (or, async, in this future's polls)"
        ),
        Ok(_) if at == Crash::AfterCommit => panic!(
            "the handler returned without reaching {at:?}: it was a duplicate, failed, runs in \
             claim mode, or joined the caller's transaction — whose commit is the caller's: \
             call `crash_point(\"…\")` after that commit and crash `At` it"
        ),
        Ok(_) => panic!(
            "the handler returned without reaching {at:?}: it was a duplicate, failed, or \
             runs in the other mode (claim mode's points are `AfterClaim` and `BeforeStamp`, \
             a transaction's `BeforeCommit` and `AfterCommit`)"
        ),
        Err(payload) => payload,
    };
    match payload.downcast::<Crashed>() {
        Ok(crashed) => *crashed,
        Err(payload) => {
            tracing::error!(point = ?at, "the handler panicked before the crash point");
            std::panic::resume_unwind(payload)
        }
    }
}

/// `query` as a statement whose one column is `n` (`count(*)` is a BIGINT on every backend).
fn counting(query: &str) -> diesel::query_builder::SqlQuery {
    diesel::sql_query(format!("SELECT ({query}) AS n"))
}

/// The answer of [`assert_once`] and its async twin.
#[track_caller]
fn exactly_one(n: i64, query: &str) {
    assert_eq!(n, 1, "expected exactly one effect, `{query}` counts {n}");
}

/// Runs `deliver` on `conn` and makes the process "die" at `at`: the handler stops there,
/// and `conn` is dropped — closed without a rollback or any other statement, as a killed
/// process leaves it. Whatever was not committed is rolled back by the server. Give it a
/// connection of its own (`establish`), not a pool's checkout: a checkout dropped goes back
/// to its pool, its transaction open, instead of closing.
///
/// # Panics
/// If the handler returned without reaching `at` (the message was a duplicate, the body
/// returned an error, `at` belongs to the other mode), or panicked before it.
pub fn crash<C, R>(conn: C, at: Crash, deliver: impl FnOnce(&mut C) -> R) -> Crashed {
    let mut conn = conn;
    let crashed = crash_during(at, || deliver(&mut conn));
    // The connection goes as it is: open transaction and all.
    drop(conn);
    crashed
}

/// [`crash`] for code that takes its connection itself — a web handler or a job runner that
/// checks one out of its pool, a service function given the pool: `run` is called with the
/// plan set, and stops at `at` as the process would die there. What it holds is dropped as
/// the crash unwinds: a connection checked out of an r2d2, bb8 or deadpool pool with a
/// transaction open is discarded by the pool, not handed out again, and the server rolls
/// back what it had not committed.
///
/// ```
/// # use diesel::prelude::*;
/// # use diesel::connection::SimpleConnection;
/// use inbox_diesel::testing::{self, Crash};
/// # #[inbox_diesel::idempotent(consumer = "credit", key = *id)]
/// # fn credit(conn: &mut SqliteConnection, id: &u64) -> Result<(), inbox_diesel::Error> {
/// #     diesel::sql_query("INSERT INTO credits VALUES (?)").bind::<diesel::sql_types::BigInt, _>(*id as i64).execute(conn)?;
/// #     Ok(())
/// # }
/// # let dir = tempfile::tempdir().unwrap();
/// # let url = dir.path().join("credits.sqlite").display().to_string();
/// let connect = || SqliteConnection::establish(&url).unwrap();
/// # connect().batch_execute(&format!("CREATE TABLE credits (message BIGINT NOT NULL); {}", inbox_diesel::schema::sqlite::create_table_sql(&inbox_diesel::InboxSchema::DEFAULT))).unwrap();
/// // The service as the application has it: it takes its own connection (from its pool).
/// let on_credit = |id: u64| credit(&mut connect(), &id);
/// testing::crash_during(Crash::BeforeCommit, || on_credit(1));
/// assert_eq!(testing::count(&mut connect(), "SELECT count(*) FROM credits"), 0);
/// assert!(on_credit(1).unwrap().is_processed());
/// ```
///
/// # Panics
/// As [`crash`].
pub fn crash_during<R>(at: Crash, run: impl FnOnce() -> R) -> Crashed {
    let _restore = Restore(PLAN.replace(Some(at)), HITS.replace(0));
    let result = std::panic::catch_unwind(AssertUnwindSafe(run));
    crashed(result, at)
}

/// Delivers one message twice, one delivery after the other, on one connection: the
/// broker's redelivery after a lost acknowledgement. Returns both answers.
pub fn twice<C, R>(conn: &mut C, mut deliver: impl FnMut(&mut C) -> R) -> [R; 2] {
    let first = deliver(conn);
    let second = deliver(conn);
    [first, second]
}

/// Delivers one message once per connection, all at the same moment: each delivery on its
/// own thread with its own connection, released together by a barrier just before `deliver`
/// is called. Returns the answers in the order of `connections`, which stay open for the
/// next round: a race is won or lost by chance, so a test runs many rounds.
///
/// # Panics
/// If a delivery panics (the panic is passed on).
pub fn race<C, R>(connections: &mut [C], deliver: impl Fn(&mut C) -> R + Sync) -> Vec<R>
where
    C: Send,
    R: Send,
{
    let barrier = Barrier::new(connections.len());
    let (barrier, deliver) = (&barrier, &deliver);
    std::thread::scope(|scope| {
        let copies: Vec<_> = connections
            .iter_mut()
            .map(|conn| {
                scope.spawn(move || {
                    barrier.wait();
                    deliver(conn)
                })
            })
            .collect();
        copies
            .into_iter()
            .map(|copy| copy.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

/// What [`while_locked`] saw.
#[derive(Debug)]
pub struct Locked<R> {
    /// The handler's answer.
    pub answer: R,
    /// How long the handler took, from its call to its answer.
    pub took: Duration,
}

/// Runs `deliver` on `conn` while `holder` holds the locks that `lock` takes: `holder`
/// opens a transaction, runs `lock` (`SELECT … FOR UPDATE`, `LOCK TABLES …`, or on SQLite
/// any write, which takes the database's one write lock), then the handler is called on
/// this thread; `holder` rolls back after `hold`. Shows whether the handler waits,
/// answers `InFlight`, or fails as a busy database, and that nothing is half-applied.
///
/// # Panics
/// If `holder` cannot open its transaction or run `lock`.
pub fn while_locked<H, C, R>(
    holder: &mut H,
    lock: &str,
    hold: Duration,
    conn: &mut C,
    deliver: impl FnOnce(&mut C) -> R,
) -> Locked<R>
where
    H: Connection + Send,
{
    let locked = Barrier::new(2);
    std::thread::scope(|scope| {
        let locked = &locked;
        let holding = scope.spawn(move || {
            let held = holder.transaction::<(), diesel::result::Error, _>(|holder| {
                holder.batch_execute(lock)?;
                locked.wait();
                std::thread::sleep(hold);
                Err(diesel::result::Error::RollbackTransaction)
            });
            match held {
                Err(diesel::result::Error::RollbackTransaction) => {}
                other => panic!("the holder could not take the lock with {lock:?}: {other:?}"),
            }
        });
        locked.wait();
        let started = Instant::now();
        let answer = deliver(conn);
        let took = started.elapsed();
        holding
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        Locked { answer, took }
    })
}

/// Ends the lease of every claim still open in `schema`'s table (claim mode), as if it had
/// run out: the next delivery of such a message takes the claim over (or, with
/// `StaleClaimOutcome`, reports it) without the test waiting for the lease. For the
/// crash windows of claim mode: [`crash`] at [`Crash::AfterClaim`] or
/// [`Crash::BeforeStamp`], then this, then the redelivery.
///
/// ```
/// # use diesel::prelude::*;
/// # use diesel::connection::SimpleConnection;
/// use inbox_diesel::testing::{self, Crash};
/// use inbox_diesel::{InboxSchema, idempotent};
///
/// #[idempotent(consumer = "mail", key = *id, mode = "claim")]
/// fn send(conn: &mut SqliteConnection, id: &u64, sent: &std::cell::Cell<u32>) -> Result<(), inbox_diesel::Error> {
///     sent.set(sent.get() + 1);
///     Ok(())
/// }
///
/// # let dir = tempfile::tempdir().unwrap();
/// # let url = dir.path().join("mail.sqlite").display().to_string();
/// # let connect = || SqliteConnection::establish(&url).unwrap();
/// # connect().batch_execute(&inbox_diesel::schema::sqlite::create_table_sql(&InboxSchema::DEFAULT)).unwrap();
/// let sent = std::cell::Cell::new(0);
/// // The consumer dies after its claim, before the e-mail.
/// testing::crash(connect(), Crash::AfterClaim, |conn| send(conn, &1, &sent));
/// // The redelivery waits out the lease — here, at once.
/// testing::end_leases(&mut connect(), &InboxSchema::DEFAULT);
/// assert!(send(&mut connect(), &1, &sent).unwrap().is_processed());
/// assert_eq!(sent.get(), 1);
/// ```
///
/// # Panics
/// If the statement fails (no such table).
pub fn end_leases<C: crate::backends::HandlerConnection>(conn: &mut C, schema: &InboxSchema) {
    struct EndLeases<'s>(&'s InboxSchema);
    impl crate::backends::OnBackend for EndLeases<'_> {
        type Output = ();
        fn run<C: crate::backends::InboxConnection>(self, conn: &mut C) {
            let sql = crate::dialect::clock::end_leases(C::BACKEND, self.0);
            conn.batch_execute(&sql)
                .unwrap_or_else(|e| panic!("`{sql}` failed: {e}"));
        }
    }
    crate::backends::on_backend(conn, EndLeases(schema));
}

/// Moves every marker of `schema`'s table `by` into the past — when it was received,
/// when it was processed, until when it is claimed — as if that long had passed since:
/// a purge's retention, or a lease, tested without waiting. The database's clock is not
/// touched; only the markers' times are.
///
/// # Panics
/// If the statement fails (no such table).
pub fn pass_time<C: crate::backends::HandlerConnection>(
    conn: &mut C,
    schema: &InboxSchema,
    by: Duration,
) {
    struct PassTime<'s>(&'s InboxSchema, Duration);
    impl crate::backends::OnBackend for PassTime<'_> {
        type Output = ();
        fn run<C: crate::backends::InboxConnection>(self, conn: &mut C) {
            let sql = crate::dialect::clock::pass_time(C::BACKEND, self.0, self.1);
            conn.batch_execute(&sql)
                .unwrap_or_else(|e| panic!("`{sql}` failed: {e}"));
        }
    }
    crate::backends::on_backend(conn, PassTime(schema, by));
}

/// The row [`count`] reads: `SELECT (…) AS n`.
#[derive(Debug, diesel::QueryableByName)]
pub struct Count {
    /// The number.
    #[diesel(sql_type = BigInt)]
    pub n: i64,
}

/// The number `query` returns: a statement that selects one row of one integer column
/// (`SELECT count(*) FROM credits WHERE message = 'm1'`), on any backend.
///
/// # Panics
/// If the query fails, or returns no row.
pub fn count<C>(conn: &mut C, query: &str) -> i64
where
    C: Connection,
    diesel::query_builder::SqlQuery: diesel::query_dsl::LoadQuery<'static, C, Count>,
{
    use diesel::RunQueryDsl;
    counting(query)
        .get_result::<Count>(conn)
        .unwrap_or_else(|e| panic!("`{query}` failed: {e}"))
        .n
}

/// Asserts that `query` counts exactly one effect.
///
/// # Panics
/// If it counts another number, or fails.
#[track_caller]
pub fn assert_once<C>(conn: &mut C, query: &str)
where
    C: Connection,
    diesel::query_builder::SqlQuery: diesel::query_dsl::LoadQuery<'static, C, Count>,
{
    exactly_one(count(conn, query), query);
}

/// The async helpers: [`crash_async`], [`race_async`], [`count_async`],
/// [`assert_once_async`] for handlers on diesel-async connections.
#[cfg(feature = "async")]
mod asynchronous {
    use std::future::Future;
    use std::panic::AssertUnwindSafe;
    use std::pin::{Pin, pin};
    use std::task::Poll;

    use diesel_async::AsyncConnection;

    use super::{Count, Crash, Crashed, HITS, PLAN, Restore, crashed};

    /// [`crash`](super::crash) for an `async fn` handler: the plan is set during each poll
    /// of the handler's future, on whichever thread polls it.
    ///
    /// # Panics
    /// As [`crash`](super::crash).
    pub async fn crash_async<C, R>(
        conn: C,
        at: Crash,
        deliver: impl AsyncFnOnce(&mut C) -> R,
    ) -> Crashed {
        let mut conn = conn;
        let crashed = crash_during_async(at, deliver(&mut conn)).await;
        drop(conn);
        crashed
    }

    /// [`crash_during`](super::crash_during) for a future — an async service that checks
    /// its own connection out of a bb8 or deadpool pool: the plan is set during each of its
    /// polls, and what it holds is dropped as the crash unwinds.
    ///
    /// # Panics
    /// As [`crash`](super::crash).
    pub async fn crash_during_async<F: Future>(at: Crash, run: F) -> Crashed {
        let result = {
            let mut future = pin!(run);
            // The point's hits are counted across the future's polls.
            let mut hits = 0;
            std::future::poll_fn(|cx| {
                let _restore = Restore(PLAN.replace(Some(at)), HITS.replace(hits));
                let polled =
                    std::panic::catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx)));
                hits = HITS.get();
                match polled {
                    Ok(Poll::Ready(_)) => Poll::Ready(Ok(())),
                    Ok(Poll::Pending) => Poll::Pending,
                    Err(payload) => Poll::Ready(Err(payload)),
                }
            })
            .await
        };
        crashed(result, at)
    }

    /// [`race`](super::race) for an `async fn` handler: one future per connection, polled
    /// together on the calling task, released by a barrier just before `deliver` is called.
    /// The database sees the copies overlap as it would from separate processes: each is on
    /// its own connection, and each waits on the server, not on the others.
    pub async fn race_async<C, R>(
        connections: &mut [C],
        deliver: impl AsyncFn(&mut C) -> R,
    ) -> Vec<R> {
        let barrier = tokio::sync::Barrier::new(connections.len());
        let (barrier, deliver) = (&barrier, &deliver);
        let mut copies: Vec<Pin<Box<dyn Future<Output = R> + '_>>> = connections
            .iter_mut()
            .map(|conn| -> Pin<Box<dyn Future<Output = R> + '_>> {
                Box::pin(async move {
                    barrier.wait().await;
                    deliver(conn).await
                })
            })
            .collect();
        let mut answers: Vec<Option<R>> = copies.iter().map(|_| None).collect();
        std::future::poll_fn(|cx| {
            for (copy, answer) in copies.iter_mut().zip(answers.iter_mut()) {
                if answer.is_none()
                    && let Poll::Ready(value) = copy.as_mut().poll(cx)
                {
                    *answer = Some(value);
                }
            }
            match answers.iter().all(Option::is_some) {
                true => Poll::Ready(()),
                false => Poll::Pending,
            }
        })
        .await;
        answers.into_iter().map(|a| a.expect("all ready")).collect()
    }

    /// [`count`](super::count) on a diesel-async connection.
    ///
    /// # Panics
    /// As [`count`](super::count).
    pub async fn count_async<C>(conn: &mut C, query: &str) -> i64
    where
        C: AsyncConnection,
        diesel::query_builder::SqlQuery: for<'q> diesel_async::methods::LoadQuery<'q, C, Count>,
    {
        use diesel_async::RunQueryDsl;
        super::counting(query)
            .get_result::<Count>(conn)
            .await
            .unwrap_or_else(|e| panic!("`{query}` failed: {e}"))
            .n
    }

    /// [`end_leases`](super::end_leases) on a diesel-async connection.
    ///
    /// # Panics
    /// As [`end_leases`](super::end_leases).
    pub async fn end_leases_async<C: crate::backends::AsyncInboxConnection>(
        conn: &mut C,
        schema: &inbox_core::InboxSchema,
    ) {
        let sql = crate::dialect::clock::end_leases(C::BACKEND, schema);
        diesel_async::SimpleAsyncConnection::batch_execute(conn, &sql)
            .await
            .unwrap_or_else(|e| panic!("`{sql}` failed: {e}"));
    }

    /// [`pass_time`](super::pass_time) on a diesel-async connection.
    ///
    /// # Panics
    /// As [`pass_time`](super::pass_time).
    pub async fn pass_time_async<C: crate::backends::AsyncInboxConnection>(
        conn: &mut C,
        schema: &inbox_core::InboxSchema,
        by: std::time::Duration,
    ) {
        let sql = crate::dialect::clock::pass_time(C::BACKEND, schema, by);
        diesel_async::SimpleAsyncConnection::batch_execute(conn, &sql)
            .await
            .unwrap_or_else(|e| panic!("`{sql}` failed: {e}"));
    }

    /// [`assert_once`](super::assert_once) on a diesel-async connection.
    ///
    /// # Panics
    /// As [`assert_once`](super::assert_once).
    pub async fn assert_once_async<C>(conn: &mut C, query: &str)
    where
        C: AsyncConnection,
        diesel::query_builder::SqlQuery: for<'q> diesel_async::methods::LoadQuery<'q, C, Count>,
    {
        super::exactly_one(count_async(conn, query).await, query);
    }
}

#[cfg(feature = "async")]
pub use asynchronous::{
    assert_once_async, count_async, crash_async, crash_during_async, end_leases_async,
    pass_time_async, race_async,
};
