//! The relay: publishes the outbox's committed rows through a [`Sink`] and marks each sent.
//!
//! Each round is three short steps, each its own statement and transaction:
//!
//! 1. **claim** up to `batch` rows that are unsent, not parked and not claimed by a live
//!    relay, oldest first — of a destination and key, only rows from its oldest unsent one
//!    on (so that rows of one key are never out in two relays at once) — by writing a lease
//!    and this round's token on them (PostgreSQL, MariaDB ≥ 10.6 and MySQL 8: `FOR UPDATE
//!    SKIP LOCKED`, so that relays side by side claim different rows without waiting;
//!    SQLite: its one writer), and reading them back from the same statement;
//! 2. **send** them through the sink, in order;
//! 3. **mark** the rows the sink took `sent_at`, in one statement at the end of the round,
//!    where the token is still this round's.
//!
//! **What is guaranteed.** Every committed message is published at least once, with its id:
//! a relay killed between a send and the round's mark leaves a claim whose lease ends, and
//! a later round sends the round's messages again, with the same ids — a downstream inbox
//! (or JetStream's deduplication window) drops the second. Messages of one destination and
//! ordering key are published in the order they were written: a relay sends a key's claimed
//! rows in order and stops at the first it could not send, and no other relay claims that
//! key's rows until they are marked sent. Messages with the empty key (`''`) have no order
//! among themselves. A relay that outlives its lease (paused, cut off from the database) may
//! send messages another relay sends again, and then the two interleave them: the lease
//! should be well above the time the sink takes for a batch.
//!
//! **Failures.** A sink that is [`SinkError::Unavailable`] (the broker down, a connection
//! lost) hands the round's rows back unclaimed and the relay waits, doubling its pause up to
//! a limit, without counting an attempt against any message. A message the sink
//! [`SinkError::Rejected`] (too large for the server's actual limit, an unroutable
//! destination) has its attempt counted and is tried again after a pause; after
//! `max_attempts` it is **parked**: `parked_at` and `last_error` say why, it is never
//! purged, and the messages behind it *of the same destination and key* wait — their order
//! forbids sending them first — until an operator deletes the parked row or clears its
//! `parked_at` and its `attempts` (kept, the next refusal parks it again at once). Messages
//! of other keys go on.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use diesel::QueryResult;
use diesel::sql_types::{BigInt, Binary, Integer, Text};
use uuid::Uuid;

use super::Outbox;
use crate::dialect::{Dialect, Sql};
use crate::io::{Awaiting, Io};

/// A message the relay hands to its sink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    /// Its position in the outbox.
    pub seq: i64,
    /// Its id: send it as the broker's message id (AMQP `message_id`, `Nats-Msg-Id`).
    pub id: Uuid,
    /// Where to.
    pub destination: String,
    /// Its ordering key (`""`: none).
    pub key: String,
    /// Its headers.
    pub headers: Vec<(String, String)>,
    /// Its payload.
    pub payload: Vec<u8>,
    /// The sends the sink rejected before this one.
    pub attempts: u32,
}

/// Why a sink did not publish a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SinkError {
    /// The broker cannot be reached now: no attempt is counted, and the relay pauses.
    Unavailable(String),
    /// The broker refused this message: its attempt is counted, and after the relay's
    /// `max_attempts` it is parked.
    Rejected(String),
}

impl fmt::Display for SinkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SinkError::Unavailable(why) => write!(f, "the broker is unavailable: {why}"),
            SinkError::Rejected(why) => write!(f, "the broker rejected the message: {why}"),
        }
    }
}

impl std::error::Error for SinkError {}

/// Where the relay publishes: a broker client, confirmed. `send` returns once the broker has
/// the message (a publisher confirm, a JetStream ack): the row is marked sent after it.
pub trait Sink {
    /// Publishes one message.
    fn send(&mut self, message: &Outgoing) -> impl Future<Output = Result<(), SinkError>> + Send;
}

/// What one round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Round {
    /// Rows claimed.
    pub claimed: usize,
    /// Messages sent and marked sent.
    pub sent: usize,
    /// Messages sent whose mark found the claim taken over (sent again by another round).
    pub sent_unmarked: usize,
    /// Messages the sink rejected (their attempt counted).
    pub rejected: usize,
    /// Of those, parked now.
    pub parked: usize,
    /// Whether the sink was unavailable (the remaining rows handed back).
    pub unavailable: bool,
}

/// A relay's settings.
#[derive(Debug, Clone, Copy)]
pub struct Relay {
    outbox: Outbox,
    batch: u32,
    lease: Duration,
    max_attempts: u32,
    idle: Duration,
    backoff: (Duration, Duration),
}

impl Relay {
    /// The crash point ([`crate::crash_point`], `Crash::At(Relay::SENT)` in the test kit,
    /// `inbox_diesel::testing`) the relay reaches after each message the sink took, before the
    /// round marks them sent: a relay that dies there has them sent again once their lease
    /// ends — every message the sink took in that round, up to `batch`. A sink that cannot
    /// pass the outbox id on as an idempotency key (plain SMTP) sends those again:
    /// `Relay::batch(1)` narrows the window to one message.
    pub const SENT: &'static str = "outbox-relay-sent";

    /// A relay of `outbox`: batches of 100, a 30 s lease, parked after 10 rejections, a
    /// 200 ms pause when there is nothing to send, 100 ms to 30 s when the sink is down.
    pub const fn new(outbox: Outbox) -> Self {
        Self {
            outbox,
            batch: 100,
            lease: Duration::from_secs(30),
            max_attempts: 10,
            idle: Duration::from_millis(200),
            backoff: (Duration::from_millis(100), Duration::from_secs(30)),
        }
    }

    /// Rows claimed per round (at least 1).
    pub const fn batch(self, batch: u32) -> Self {
        Self {
            batch: if batch == 0 { 1 } else { batch },
            ..self
        }
    }

    /// How long a claim holds its rows: above the sink's longest send of a batch.
    pub const fn lease(self, lease: Duration) -> Self {
        Self { lease, ..self }
    }

    /// Rejections before a message is parked (at least 1).
    pub const fn max_attempts(self, max_attempts: u32) -> Self {
        Self {
            max_attempts: if max_attempts == 0 { 1 } else { max_attempts },
            ..self
        }
    }

    /// The pause when a round found nothing to send.
    pub const fn idle(self, idle: Duration) -> Self {
        Self { idle, ..self }
    }

    /// The first and the longest pause while the sink is unavailable.
    pub const fn backoff(self, first: Duration, max: Duration) -> Self {
        Self {
            backoff: (first, max),
            ..self
        }
    }

    /// Runs rounds until `shutdown` completes: pausing when there was nothing to send, or
    /// while the sink is unavailable. The round in progress when `shutdown` completes is
    /// finished first.
    ///
    /// # Errors
    /// A database error: the connection may be broken — run the relay again on a new one
    /// (the rows this round claimed are claimed again when their lease ends).
    pub async fn run<C, S, F>(&self, conn: &mut C, sink: &mut S, shutdown: F) -> QueryResult<Report>
    where
        C: crate::backends::AsyncInboxConnection + 'static,
        S: Sink,
        F: Future<Output = ()>,
    {
        self.run_counted(conn, sink, shutdown, &Counts::default())
            .await
    }

    /// As [`run`](Self::run), adding each round to `counts` as it ends: what the relay did
    /// so far, for a health check or a metrics exporter to read while it runs — and after it
    /// failed, when `run` returns no report.
    ///
    /// ```no_run
    /// # use inbox_diesel::outbox::{Outbox, relay::{Counts, Relay, Sink}};
    /// # async fn relay(
    /// #     conn: &mut diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>,
    /// #     sink: &mut impl Sink,
    /// # ) -> diesel::QueryResult<()> {
    /// static OUTBOX: Outbox = Outbox::new("outbox");
    /// let counts = std::sync::Arc::new(Counts::default());
    /// let seen = counts.clone();
    /// // Elsewhere: a health endpoint, a gauge.
    /// tokio::spawn(async move { println!("sent so far: {}", seen.report().sent) });
    /// Relay::new(OUTBOX)
    ///     .run_counted(conn, sink, std::future::pending(), &counts)
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`run`](Self::run).
    pub async fn run_counted<C, S, F>(
        &self,
        conn: &mut C,
        sink: &mut S,
        shutdown: F,
        counts: &Counts,
    ) -> QueryResult<Report>
    where
        C: crate::backends::AsyncInboxConnection + 'static,
        S: Sink,
        F: Future<Output = ()>,
    {
        let mut shutdown = std::pin::pin!(shutdown);
        let mut report = Report::default();
        let mut pause = self.backoff.0;
        let listening = self.listen(conn).await?;
        loop {
            let round = self.run_once(conn, sink).await?;
            report.add(&round);
            counts.add(&round);
            let wait = if round.unavailable {
                let wait = pause;
                pause = (pause * 2).min(self.backoff.1);
                tracing::warn!(
                    pause_ms = wait.as_millis() as u64,
                    "outbox relay: the sink is unavailable; pausing"
                );
                Some(wait)
            } else {
                pause = self.backoff.0;
                match round.claimed {
                    0 if self.claimable(&mut Awaiting(&mut *conn)).await? => {
                        Some(Duration::from_millis(fastrand::u64(1..=10)).min(self.idle))
                    }
                    0 => Some(self.idle),
                    _ => None,
                }
            };
            let stop = match wait {
                Some(wait) if listening && !round.unavailable => {
                    woken_unless(conn, &mut shutdown, wait).await
                }
                Some(wait) => sleep_unless(&mut shutdown, wait).await,
                None => is_ready(&mut shutdown).await,
            };
            if stop {
                return Ok(report);
            }
        }
    }

    /// PostgreSQL, an outbox that notifies on commit, an `AsyncPgConnection`: `LISTEN` on its
    /// channel; whether the relay listens.
    async fn listen<C: crate::backends::AsyncInboxConnection + 'static>(
        &self,
        conn: &mut C,
    ) -> QueryResult<bool> {
        #[cfg(feature = "postgres")]
        if self.outbox.notify
            && let Some(pg) =
                (conn as &mut dyn std::any::Any).downcast_mut::<diesel_async::AsyncPgConnection>()
        {
            let channel = self.outbox.channel().replace('"', "\"\"");
            diesel_async::SimpleAsyncConnection::batch_execute(
                pg,
                &format!("LISTEN \"{channel}\""),
            )
            .await?;
            return Ok(true);
        }
        let _ = conn;
        Ok(false)
    }

    /// One round: claim, send, mark.
    ///
    /// # Errors
    /// A database error (see [`run`](Self::run)).
    pub async fn run_once<C, S>(&self, conn: &mut C, sink: &mut S) -> QueryResult<Round>
    where
        C: crate::backends::AsyncInboxConnection,
        S: Sink,
    {
        let io = &mut Awaiting(conn);
        crate::io::refuse_open_transaction(io.transaction_status())?;
        let token = Uuid::from_u128(fastrand::u128(..)).to_string();
        // SQLite's claim takes the database's one write lock even when it finds nothing, and
        // handlers committing meanwhile wait for it (`busy_timeout`): a read first, which
        // takes no lock, so that an idle relay polling often does not hold up the writers.
        if <C::Backend as Dialect>::SINGLE_WRITER && !self.claimable(io).await? {
            return Ok(Round::default());
        }
        let claimed = self.claim(io, &token).await?;
        let mut round = Round {
            claimed: claimed.len(),
            ..Round::default()
        };
        // The keys whose message was not sent in this round: the ones behind it wait.
        let mut held: Vec<(String, String)> = Vec::new();
        // The messages the sink took, marked sent together at the end of the round.
        let mut sent = Vec::with_capacity(claimed.len());
        let mut rows = claimed.into_iter();
        for message in rows.by_ref() {
            if !message.key.is_empty()
                && held
                    .iter()
                    .any(|(d, k)| *d == message.destination && *k == message.key)
            {
                self.release(io, &message, &token).await?;
                continue;
            }
            match sink.send(&message).await {
                Ok(()) => {
                    sent.push(message.seq);
                    crate::crash::crash_point(Self::SENT);
                }
                Err(SinkError::Rejected(why)) => {
                    round.rejected += 1;
                    let parked = message.attempts + 1 >= self.max_attempts;
                    round.parked += usize::from(parked);
                    tracing::warn!(
                        message_id = %message.id,
                        destination = %message.destination,
                        attempt = message.attempts + 1,
                        parked,
                        error = %why,
                        "outbox relay: the sink rejected a message"
                    );
                    self.reject(io, &message, &token, &why, parked).await?;
                    held.push((message.destination, message.key));
                }
                Err(SinkError::Unavailable(why)) => {
                    tracing::warn!(error = %why, "outbox relay: the sink is unavailable");
                    round.unavailable = true;
                    self.release(io, &message, &token).await?;
                    break;
                }
            }
        }
        let marked = self.mark_sent(io, &sent, &token).await?;
        round.sent = marked;
        round.sent_unmarked = sent.len() - marked.min(sent.len());
        for message in rows {
            self.release(io, &message, &token).await?;
        }
        Ok(round)
    }

    /// Step 1: claims the round's rows; returns them in order.
    ///
    /// The candidates are the oldest `batch` rows that are free (unsent, not parked, not
    /// claimed by a live relay) and whose key is free too: the oldest unsent row of their
    /// destination and key is free (a claimed, paused or parked one holds the rows behind
    /// it, which are passed over, not taken into the batch). PostgreSQL, MariaDB ≥ 10.6 and
    /// MySQL 8 lock them `FOR UPDATE SKIP LOCKED`, so that relays side by side take different
    /// candidates without waiting; SQLite has one writer. Of the candidates, a row is claimed
    /// when every unsent row before it of its destination and key is a candidate too: a
    /// relay takes a key's rows from its oldest on, as many as the batch holds, and another
    /// relay takes none of that key's rows until they are marked sent. (A candidate whose key
    /// another relay is claiming at the same moment is left for a later round.)
    ///
    /// The claim returns the rows it took (PostgreSQL and SQLite: `UPDATE … RETURNING`;
    /// MySQL and MariaDB: a `SELECT` of the locked rows, in the claim's transaction).
    async fn claim<S: Io>(&self, io: &mut S, token: &str) -> QueryResult<Vec<Outgoing>> {
        let backend = S::Backend::BACKEND;
        let table = backend.quote_table(self.outbox.table);
        // The lease from the moment each row is claimed where the server can tell, not from
        // the statement's start — a claim that takes seconds (a long backlog under one key, a
        // table not yet analysed) would otherwise hand out rows whose lease had already run,
        // for another relay to claim while this one sends them.
        let (until_before, until_after) = S::Backend::LEASE_PER_ROW;
        let candidates = self.candidates::<S::Backend>(self.batch, true);
        // A candidate `c` of `candidates` whose unsent predecessors of its key are all
        // candidates (`within`: the candidates' seqs). Both lookups of a key's rows are
        // ordered as the `unsent` index is, so that they walk it from the key's oldest row
        // and stop at the first that answers.
        let whole_prefix = |within: &str| {
            format!(
                "(c.ordering_key = '' OR (SELECT e.seq FROM {table} e \
                 WHERE e.destination = c.destination AND e.ordering_key = c.ordering_key \
                 AND e.sent_at IS NULL AND e.seq < c.seq AND e.seq NOT IN ({within}) \
                 ORDER BY e.destination, e.ordering_key, e.seq LIMIT 1) IS NULL)"
            )
        };
        let free = format!("sent_at IS NULL AND {}", free::<S::Backend>(""));
        let lease_ms = i64::try_from(self.lease.as_millis()).unwrap_or(i64::MAX);
        let lease = |sql: String| Sql::new(sql).bind_i64(lease_ms).bind_text(token);
        let columns = |alias: &str| {
            let id = S::Backend::outbox_id_text(&format!("{alias}id"));
            format!(
                "{alias}seq, {id} AS id, {alias}destination, {alias}ordering_key, \
                 {alias}headers, {alias}payload, {alias}attempts"
            )
        };
        let mut rows: Vec<ClaimedRow> = match S::Backend::UPDATES_FROM_OWN_SUBQUERY {
            true => {
                let (p1, p2) = (backend.placeholder(1), backend.placeholder(2));
                let sql = format!(
                    "WITH c AS ({candidates}) \
                     UPDATE {table} SET claimed_until = {until_before}{p1}{until_after}, \
                     claimed_by = {p2} WHERE seq IN (SELECT c.seq FROM c WHERE {claimable}) \
                     AND {free} RETURNING {columns}",
                    claimable = whole_prefix("SELECT seq FROM c"),
                    columns = columns(""),
                );
                io.load(&lease(sql)).await?
            }
            // MySQL and MariaDB refuse the table in a subquery of its own UPDATE: the
            // candidates are read and locked first, then the claimable ones read whole, then
            // claimed by their `seq`, in one transaction.
            false => {
                io.execute(&Sql::new("START TRANSACTION")).await?;
                let claimed = async {
                    let seqs: Vec<Seq> = io.load(&Sql::new(candidates)).await?;
                    if seqs.is_empty() {
                        io.execute(&Sql::new("COMMIT")).await?;
                        return Ok(Vec::new());
                    }
                    let within = seq_list(seqs.iter().map(|row| row.seq));
                    let rows: Vec<ClaimedRow> = io
                        .load(&Sql::new(format!(
                            "SELECT {columns} FROM {table} c WHERE c.seq IN ({within}) \
                             AND {claimable}",
                            columns = columns("c."),
                            claimable = whole_prefix(&within),
                        )))
                        .await?;
                    if !rows.is_empty() {
                        let sql = format!(
                            "UPDATE {table} SET claimed_until = {until_before}?{until_after}, \
                             claimed_by = ? WHERE seq IN ({list}) AND {free}",
                            list = seq_list(rows.iter().map(|row| row.seq)),
                        );
                        io.execute(&lease(sql)).await?;
                    }
                    io.execute(&Sql::new("COMMIT")).await?;
                    Ok::<_, diesel::result::Error>(rows)
                }
                .await;
                if claimed.is_err() {
                    let _ = io.execute(&Sql::new("ROLLBACK")).await;
                }
                claimed?
            }
        };
        rows.sort_by_key(|row| row.seq);
        Ok(rows.into_iter().map(Outgoing::from).collect())
    }

    /// The claim's candidates (see [`claim`](Self::claim)): the oldest `limit` free rows
    /// whose key is free, locked `FOR UPDATE SKIP LOCKED` when `lock` (and the backend has
    /// it).
    fn candidates<D: Dialect>(&self, limit: u32, lock: bool) -> String {
        let backend = D::BACKEND;
        let table = backend.quote_table(self.outbox.table);
        let free = free::<D>;
        let lock = match lock {
            true => D::SKIP_LOCKED,
            false => "",
        };
        format!(
            "SELECT o.seq, o.destination, o.ordering_key FROM {table} o \
             WHERE o.sent_at IS NULL AND {free_o} AND (o.ordering_key = '' OR \
             (SELECT {free_f} FROM {table} f WHERE f.destination = o.destination \
             AND f.ordering_key = o.ordering_key AND f.sent_at IS NULL \
             ORDER BY f.destination, f.ordering_key, f.seq LIMIT 1)) \
             ORDER BY o.seq LIMIT {limit}{lock}",
            free_o = free("o."),
            free_f = free("f."),
        )
    }

    /// Whether a round could claim something now: after a round that claimed nothing while
    /// candidates were there — another relay was claiming the same keys at that moment —
    /// the relay tries again after a short pause instead of its idle one.
    async fn claimable<S: Io>(&self, io: &mut S) -> QueryResult<bool> {
        let rows: Vec<Seq> = io
            .load(&Sql::new(self.candidates::<S::Backend>(1, false)))
            .await?;
        Ok(!rows.is_empty())
    }

    /// Step 3: marks the messages at `seqs` sent, in one statement; how many were still this
    /// round's (the others' claims were taken over: another round sends them again).
    async fn mark_sent<S: Io>(&self, io: &mut S, seqs: &[i64], token: &str) -> QueryResult<usize> {
        if seqs.is_empty() {
            return Ok(0);
        }
        let backend = S::Backend::BACKEND;
        let sql = format!(
            "UPDATE {table} SET sent_at = {now}, claimed_until = NULL, claimed_by = NULL \
             WHERE seq IN ({list}) AND claimed_by = {p1}",
            table = backend.quote_table(self.outbox.table),
            now = S::Backend::LEASE_NOW,
            list = seq_list(seqs.iter().copied()),
            p1 = backend.placeholder(1),
        );
        io.execute(&Sql::new(sql).bind_text(token)).await
    }

    /// Counts a rejection; parks the message, or holds it back for a pause.
    async fn reject<S: Io>(
        &self,
        io: &mut S,
        message: &Outgoing,
        token: &str,
        why: &str,
        parked: bool,
    ) -> QueryResult<()> {
        let backend = S::Backend::BACKEND;
        let (until_before, until_after) = S::Backend::LEASE_UNTIL;
        let pause_ms = i64::try_from(
            (self.backoff.0 * 2u32.saturating_pow(message.attempts.min(16)))
                .min(self.backoff.1)
                .as_millis(),
        )
        .unwrap_or(i64::MAX);
        let parked_at = if parked {
            S::Backend::LEASE_NOW
        } else {
            "NULL"
        };
        let sql = format!(
            "UPDATE {table} SET attempts = attempts + 1, last_error = {p1}, \
             parked_at = {parked_at}, claimed_by = NULL, \
             claimed_until = {until_before}{p2}{until_after} \
             WHERE seq = {p3} AND claimed_by = {p4}",
            table = backend.quote_table(self.outbox.table),
            p1 = backend.placeholder(1),
            p2 = backend.placeholder(2),
            p3 = backend.placeholder(3),
            p4 = backend.placeholder(4),
        );
        let why: String = why.chars().take(2000).collect();
        io.execute(
            &Sql::new(sql)
                .bind_text(why)
                .bind_i64(pause_ms)
                .bind_i64(message.seq)
                .bind_text(token),
        )
        .await?;
        Ok(())
    }

    /// Hands a claimed row back unsent, for the next round.
    async fn release<S: Io>(&self, io: &mut S, message: &Outgoing, token: &str) -> QueryResult<()> {
        let backend = S::Backend::BACKEND;
        let sql = format!(
            "UPDATE {table} SET claimed_until = NULL, claimed_by = NULL \
             WHERE seq = {p1} AND claimed_by = {p2}",
            table = backend.quote_table(self.outbox.table),
            p1 = backend.placeholder(1),
            p2 = backend.placeholder(2),
        );
        io.execute(&Sql::new(sql).bind_i64(message.seq).bind_text(token))
            .await?;
        Ok(())
    }
}

/// What a relay did until it stopped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Report {
    /// Rounds run.
    pub rounds: u64,
    /// Messages the sink took: marked sent, or found taken over at the mark (sent again by
    /// another relay, so counted by both: the sum over relays can exceed the rows).
    pub sent: u64,
    /// Messages rejected by the sink (attempts counted).
    pub rejected: u64,
    /// Messages parked.
    pub parked: u64,
}

/// What a relay has done so far, updated as each round ends ([`Relay::run_counted`]);
/// readable from any thread while the relay runs.
#[derive(Debug, Default)]
pub struct Counts {
    rounds: std::sync::atomic::AtomicU64,
    sent: std::sync::atomic::AtomicU64,
    rejected: std::sync::atomic::AtomicU64,
    parked: std::sync::atomic::AtomicU64,
}

impl Counts {
    /// The counts now, as a [`Report`].
    pub fn report(&self) -> Report {
        use std::sync::atomic::Ordering::Relaxed;
        Report {
            rounds: self.rounds.load(Relaxed),
            sent: self.sent.load(Relaxed),
            rejected: self.rejected.load(Relaxed),
            parked: self.parked.load(Relaxed),
        }
    }

    fn add(&self, round: &Round) {
        use std::sync::atomic::Ordering::Relaxed;
        let mut one = Report::default();
        one.add(round);
        self.rounds.fetch_add(one.rounds, Relaxed);
        self.sent.fetch_add(one.sent, Relaxed);
        self.rejected.fetch_add(one.rejected, Relaxed);
        self.parked.fetch_add(one.parked, Relaxed);
    }
}

impl Report {
    fn add(&mut self, round: &Round) {
        self.rounds += 1;
        self.sent += (round.sent + round.sent_unmarked) as u64;
        self.rejected += round.rejected as u64;
        self.parked += round.parked as u64;
    }
}

/// Whether `future` is complete now, without waiting for it.
async fn is_ready<F: Future<Output = ()>>(future: &mut std::pin::Pin<&mut F>) -> bool {
    std::future::poll_fn(|cx| std::task::Poll::Ready(future.as_mut().poll(cx).is_ready())).await
}

/// Waits `pause`, or less if a notification arrives on `conn` (an `AsyncPgConnection` that
/// listens) or `stop` completes first: whether `stop` did.
async fn woken_unless<C: 'static, F: Future<Output = ()>>(
    conn: &mut C,
    stop: &mut std::pin::Pin<&mut F>,
    pause: Duration,
) -> bool {
    #[cfg(feature = "postgres")]
    if let Some(pg) =
        (conn as &mut dyn std::any::Any).downcast_mut::<diesel_async::AsyncPgConnection>()
    {
        use futures_core::Stream;
        let mut notified = std::pin::pin!(pg.notifications_stream());
        let mut sleep = std::pin::pin!(tokio::time::sleep(pause));
        return std::future::poll_fn(|cx| {
            if stop.as_mut().poll(cx).is_ready() {
                return std::task::Poll::Ready(true);
            }
            if notified.as_mut().poll_next(cx).is_ready() || sleep.as_mut().poll(cx).is_ready() {
                return std::task::Poll::Ready(false);
            }
            std::task::Poll::Pending
        })
        .await;
    }
    let _ = conn;
    sleep_unless(stop, pause).await
}

/// Waits `pause`, or less if `stop` completes first: whether it did.
async fn sleep_unless<F: Future<Output = ()>>(
    stop: &mut std::pin::Pin<&mut F>,
    pause: Duration,
) -> bool {
    let mut sleep = std::pin::pin!(tokio::time::sleep(pause));
    std::future::poll_fn(|cx| {
        if stop.as_mut().poll(cx).is_ready() {
            return std::task::Poll::Ready(true);
        }
        sleep.as_mut().poll(cx).map(|()| false)
    })
    .await
}

/// Where a row (its columns prefixed by `alias`) is free to claim: not parked, and not
/// claimed by a live relay (a paused rejection counts as claimed).
fn free<D: Dialect>(alias: &str) -> String {
    format!(
        "{alias}parked_at IS NULL AND ({alias}claimed_until IS NULL \
         OR {alias}claimed_until < {now})",
        now = D::LEASE_NOW
    )
}

/// `seqs` as a list for `IN (…)`: integers, never text from a row.
fn seq_list(seqs: impl Iterator<Item = i64>) -> String {
    seqs.map(|seq| seq.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

#[derive(diesel::QueryableByName)]
struct Seq {
    #[diesel(sql_type = BigInt)]
    seq: i64,
}

#[derive(diesel::QueryableByName)]
struct ClaimedRow {
    #[diesel(sql_type = BigInt)]
    seq: i64,
    #[diesel(sql_type = Text)]
    id: String,
    #[diesel(sql_type = Text)]
    destination: String,
    #[diesel(sql_type = Text)]
    ordering_key: String,
    #[diesel(sql_type = Text)]
    headers: String,
    #[diesel(sql_type = Binary)]
    payload: Vec<u8>,
    #[diesel(sql_type = Integer)]
    attempts: i32,
}

impl From<ClaimedRow> for Outgoing {
    fn from(row: ClaimedRow) -> Self {
        let headers = match serde_json::from_str::<serde_json::Value>(&row.headers) {
            Ok(serde_json::Value::Object(object)) => object
                .into_iter()
                .map(|(name, value)| match value {
                    serde_json::Value::String(text) => (name, text),
                    other => (name, other.to_string()),
                })
                .collect(),
            _ => Vec::new(),
        };
        Self {
            seq: row.seq,
            id: Uuid::parse_str(row.id.trim()).unwrap_or_default(),
            destination: row.destination,
            key: row.ordering_key,
            headers,
            payload: row.payload,
            attempts: u32::try_from(row.attempts).unwrap_or(0),
        }
    }
}
