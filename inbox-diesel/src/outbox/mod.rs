//! The transactional outbox: messages a handler publishes are rows written in its own
//! transaction, delivered downstream afterwards by a relay (`outbox::relay`, feature `async`).
//!
//! Without an outbox, a handler that calls a broker is a dual write: the call runs again on
//! every redelivery, or is lost when the transaction rolls back. With one, the message is a
//! row committed with the business change and the inbox marker — all three or none — and a
//! relay publishes the committed rows, marking each sent.
//!
//! ```
//! # #[cfg(feature = "sqlite")] {
//! use diesel::connection::SimpleConnection;
//! use diesel::prelude::*;
//! use inbox_diesel::outbox::{Message, Outbox};
//! use inbox_diesel::{InboxSchema, idempotent, schema};
//!
//! static OUTBOX: Outbox = Outbox::new("outbox");
//!
//! #[idempotent(consumer = "orders", key = *order)]
//! fn place(conn: &mut SqliteConnection, order: &u64) -> QueryResult<()> {
//!     diesel::sql_query("UPDATE stock SET n = n - 1").execute(conn)?;
//!     // Written in this transaction; sent by the relay once it commits.
//!     OUTBOX.publish(conn, Message::new("orders.placed", format!("{order}")).key("eu"))?;
//!     Ok(())
//! }
//!
//! let mut conn = SqliteConnection::establish(":memory:")?;
//! conn.batch_execute(&schema::sqlite::create_table_sql(&InboxSchema::DEFAULT))?;
//! conn.batch_execute(&OUTBOX.create_table_sql(schema::Backend::Sqlite))?;
//! conn.batch_execute("CREATE TABLE stock (n INTEGER); INSERT INTO stock VALUES (10)")?;
//! assert!(place(&mut conn, &7)?.is_processed());
//! assert!(place(&mut conn, &7)?.is_duplicate()); // publishes nothing new
//! # }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! **Ids.** Each message's id is derived from the inbox key, the consumer and the message's
//! position among those the body published: a body run again after a transient failure
//! publishes the same ids, and a relay that sends a message twice (it crashed between the
//! publish and the mark) sends the same id twice, which a downstream inbox — or the broker's
//! own deduplication (JetStream `Nats-Msg-Id`) — recognises. A duplicate delivery does not
//! run the body, and publishes nothing. In a batch handler the ids derive from every key of
//! the batch; give a message an id of its own with [`Message::id`] where a message should
//! keep its id across batches of other compositions.
//!
//! **Refused early.** What the sink cannot carry — a payload over its size limit, a
//! destination or key it refuses — is refused by [`Outbox::publish`] inside the handler's
//! transaction, before any SQL, with the reason ([`OutboxProblem`]), rather than found by the
//! relay after the commit. Set the sink's [`Limits`] on the [`Outbox`].
//!
//! **Table.** One row per message:
//!
//! | column | PostgreSQL | MySQL, MariaDB | SQLite | |
//! |---|---|---|---|---|
//! | `seq` | `BIGINT GENERATED ALWAYS AS IDENTITY` primary key | `BIGINT AUTO_INCREMENT` primary key | `INTEGER PRIMARY KEY` | the order of appends |
//! | `id` | `UUID`, unique | `CHAR(36)`, unique | `TEXT`, unique | the message id |
//! | `destination` | `TEXT` | `VARCHAR(255)` | `TEXT` | queue, routing key or subject |
//! | `ordering_key` | `TEXT` | `VARCHAR(255)` | `TEXT` | messages of one destination and key are sent in order; `''`: no order |
//! | `headers` | `TEXT` | `TEXT` | `TEXT` | a JSON object of strings |
//! | `payload` | `BYTEA` | `LONGBLOB` | `BLOB` | |
//! | `created_at`, `claimed_until`, `sent_at`, `parked_at` | `TIMESTAMPTZ` | `DATETIME(6)`, UTC | `TIMESTAMP` | the relay's state |
//! | `claimed_by` | `TEXT` | `CHAR(36)` | `TEXT` | the relay round holding the row |
//! | `attempts`, `last_error` | | | | failed sends; the last failure, for an operator |
//!
//! With change data capture the relay is not needed: Debezium's outbox event router reads
//! this table with `table.field.event.id=id`, `table.field.event.key=ordering_key`,
//! `table.field.event.payload=payload` and `route.by.field=destination` (its default column
//! names, `aggregatetype`/`aggregateid`/`type`, are settings, not a layout to copy; the names
//! here say what the relay does with them).

use std::cell::Cell;
use std::future::Future;
use std::pin::pin;

use diesel::QueryResult;
use uuid::Uuid;

use crate::dialect::{Backend, Dialect, Sql};
use crate::io::{Blocking, Io, complete_now};

#[cfg(feature = "async")]
pub mod relay;

pub use crate::error::outbox::OutboxProblem;

/// What a sink can carry: checked by [`Outbox::publish`] before the row is written.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The largest payload, in bytes.
    pub max_payload: usize,
    /// The longest destination, in bytes.
    pub max_destination: usize,
    /// The longest ordering key, in bytes.
    pub max_key: usize,
    /// The destinations the sink accepts: `Err` with the reason otherwise.
    pub destination: fn(&str) -> Result<(), &'static str>,
    /// The headers (name, value) the sink accepts: `Err` with the reason otherwise.
    pub header: fn(&str, &str) -> Result<(), &'static str>,
}

impl Limits {
    /// No sink's limits but the table's: 255-byte destinations and keys, 64 MiB payloads.
    pub const TABLE: Limits = Limits {
        max_payload: 64 << 20,
        max_destination: 255,
        max_key: 255,
        destination: non_empty,
        header: any_header,
    };
}

fn any_header(_: &str, _: &str) -> Result<(), &'static str> {
    Ok(())
}

fn non_empty(destination: &str) -> Result<(), &'static str> {
    if destination.is_empty() {
        Err("it is empty")
    } else {
        Ok(())
    }
}

/// A message to publish: where to, in which order, its headers and payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    destination: String,
    key: String,
    headers: Vec<(String, String)>,
    payload: Vec<u8>,
    id: Option<Uuid>,
}

impl Message {
    /// A message to `destination` (a queue or routing key, a subject) with `payload`.
    pub fn new(destination: impl Into<String>, payload: impl Into<Vec<u8>>) -> Self {
        Self {
            destination: destination.into(),
            key: String::new(),
            headers: Vec::new(),
            payload: payload.into(),
            id: None,
        }
    }

    /// The ordering key: messages of one destination and key are sent in the order they
    /// were published (`outbox::relay` states the exact guarantee).
    pub fn key(self, key: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            ..self
        }
    }

    /// Adds a header.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// The message's id, instead of the one derived from the delivery and the position.
    pub fn id(self, id: Uuid) -> Self {
        Self {
            id: Some(id),
            ..self
        }
    }
}

/// An outbox table and the limits of the sink its relay publishes to.
#[derive(Debug, Clone, Copy)]
pub struct Outbox {
    table: &'static str,
    limits: Limits,
    notify: bool,
}

impl Outbox {
    /// The outbox in `table` (optionally `schema.table`), with [`Limits::TABLE`].
    ///
    /// # Panics
    /// At compile time in a `static`, when `table` is not one or two identifiers of ASCII
    /// letters, digits and `_` of at most 63 bytes.
    pub const fn new(table: &'static str) -> Self {
        assert!(
            valid_table(table.as_bytes()),
            "an outbox table name is one or two identifiers (ASCII letters, digits, `_`) of at most 63 bytes"
        );
        Self {
            table,
            limits: Limits::TABLE,
            notify: false,
        }
    }

    /// The sink's limits (each broker crate exports its own, `inbox_lapin::outbox::LIMITS`,
    /// `inbox_nats::outbox::LIMITS`).
    pub const fn limits(self, limits: Limits) -> Self {
        Self { limits, ..self }
    }

    /// PostgreSQL: each publish also sends `NOTIFY` on [`channel`](Self::channel), delivered
    /// when the handler's transaction commits, and a relay on an `AsyncPgConnection` wakes on
    /// it instead of waiting out its idle pause — a hint: the relay still polls, and a lost
    /// notification only delays a message. The other backends have no such signal, and ignore
    /// it. `NOTIFY` serialises the commits that send it on a server-wide lock: leave it off
    /// where many handlers commit at once and the idle pause is short enough.
    pub const fn notify_on_commit(self) -> Self {
        Self {
            notify: true,
            ..self
        }
    }

    /// The channel of [`notify_on_commit`](Self::notify_on_commit): `outbox:` and the table.
    pub fn channel(&self) -> String {
        format!("outbox:{}", self.table)
    }

    /// The table's name.
    pub const fn table(&self) -> &'static str {
        self.table
    }

    /// Writes `message` to the outbox on the handler's connection, in its transaction.
    ///
    /// # Errors
    /// A database error; or, before any SQL, diesel's `QueryBuilderError` carrying
    /// [`Error::Outbox`](crate::Error::Outbox) when the message is refused or `publish` is
    /// not in a handler's body ([`OutboxProblem`]; `inbox_diesel::Error::from` takes it out).
    pub fn publish<C: crate::backends::HandlerConnection>(
        &self,
        conn: &mut C,
        message: Message,
    ) -> QueryResult<Uuid> {
        struct Publish<'o>(&'o Outbox, Message);
        impl crate::backends::OnBackend for Publish<'_> {
            type Output = QueryResult<Uuid>;
            fn run<C: crate::backends::InboxConnection>(self, conn: &mut C) -> Self::Output {
                complete_now(self.0.append(&mut Blocking(conn), self.1))
            }
        }
        crate::backends::on_backend(conn, Publish(self, message))
    }

    /// [`publish`](Self::publish) on a diesel-async connection.
    ///
    /// # Errors
    /// As [`publish`](Self::publish).
    #[cfg(feature = "async")]
    pub async fn publish_async<C: crate::backends::AsyncInboxConnection>(
        &self,
        conn: &mut C,
        message: Message,
    ) -> QueryResult<Uuid> {
        self.append(&mut crate::io::Awaiting(conn), message).await
    }

    async fn append<S: Io>(&self, io: &mut S, message: Message) -> QueryResult<Uuid> {
        self.check(&message).map_err(refused)?;
        let in_transaction = matches!(
            io.transaction_status(),
            diesel::connection::TransactionManagerStatus::Valid(status)
                if status.transaction_depth().is_some()
        );
        let Some(origin) = RUN.get().filter(|_| in_transaction) else {
            return Err(refused(OutboxProblem::OutsideHandler));
        };
        let position = origin.next;
        RUN.set(Some(Origin {
            next: position + 1,
            ..origin
        }));
        let id = message
            .id
            .unwrap_or_else(|| message_id(origin.seed.origin(), position));
        let table = S::Backend::BACKEND.quote_table(self.table);
        let headers = headers_json(&message.headers);
        let notify = self.notify && S::Backend::NOTIFIES;
        let sql = S::Backend::outbox_insert_sql(&table, notify);
        let mut sql = Sql::new(sql)
            .cached()
            .bind_text(id.to_string())
            .bind_text(message.destination)
            .bind_text(message.key)
            .bind_text(headers)
            .bind_bytes(message.payload);
        if notify {
            sql = sql.bind_text(self.channel());
        }
        io.execute(&sql).await?;
        Ok(id)
    }

    /// The message against the limits and the table's columns.
    fn check(&self, message: &Message) -> Result<(), OutboxProblem> {
        let limits = &self.limits;
        let refuse = |what: String, why: String| Err(OutboxProblem::Refused { what, why });
        if message.payload.len() > limits.max_payload {
            return refuse(
                format!("a payload of {} bytes", message.payload.len()),
                format!("the sink takes at most {} bytes", limits.max_payload),
            );
        }
        let shown = |text: &str| format!("{:?}", text.chars().take(64).collect::<String>());
        // The sink's limit, and the table's 255 bytes.
        let fits = |what: &str, text: &str, max: usize| {
            let max = max.min(255);
            match text.len() > max {
                true => refuse(
                    format!("{what} {}…", shown(text)),
                    format!("it has {} bytes, over {max}", text.len()),
                ),
                false => Ok(()),
            }
        };
        fits(
            "the destination",
            &message.destination,
            limits.max_destination,
        )?;
        if let Err(why) = (limits.destination)(&message.destination) {
            return refuse(
                format!("the destination {}", shown(&message.destination)),
                why.to_owned(),
            );
        }
        for (name, value) in &message.headers {
            if let Err(why) = (limits.header)(name, value) {
                return refuse(format!("the header {}", shown(name)), why.to_owned());
            }
        }
        fits("the ordering key", &message.key, limits.max_key)
    }

    /// The statements creating the table and its indexes on `backend`, each idempotent
    /// (`IF NOT EXISTS`): run at every start, they leave an existing table as it is.
    pub fn create_table_sql(&self, backend: Backend) -> String {
        backend.outbox_create_sql(self.table)
    }
}

/// What [`Outbox::purge`] removed, and what it left for an operator.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct OutboxPurge {
    /// Sent rows removed.
    pub removed: u64,
    /// Short `DELETE`s run.
    pub batches: u32,
    /// Parked rows, never removed by a purge: delete them, or clear `parked_at` and
    /// `attempts` to send them again, once their cause is known.
    pub parked: u64,
}

impl Outbox {
    /// Removes the rows sent more than `older_than` ago, `batch` rows per `DELETE` (each its
    /// own transaction, oldest first through the index on `sent_at`), until none is left;
    /// unsent and parked rows are never removed. Run it on a connection of its own, outside
    /// any transaction, on a schedule; with change data capture, the rows can go as soon as
    /// they are sent.
    ///
    /// # Errors
    /// A database error, or diesel's `AlreadyInTransaction` inside a transaction.
    pub fn purge<C: crate::backends::HandlerConnection>(
        &self,
        conn: &mut C,
        older_than: std::time::Duration,
        batch: u32,
    ) -> QueryResult<OutboxPurge> {
        struct Purge<'o>(&'o Outbox, std::time::Duration, u32);
        impl crate::backends::OnBackend for Purge<'_> {
            type Output = QueryResult<OutboxPurge>;
            fn run<C: crate::backends::InboxConnection>(self, conn: &mut C) -> Self::Output {
                complete_now(self.0.purge_batches(&mut Blocking(conn), self.1, self.2))
            }
        }
        crate::backends::on_backend(conn, Purge(self, older_than, batch))
    }

    /// [`purge`](Self::purge) on a diesel-async connection.
    ///
    /// # Errors
    /// As [`purge`](Self::purge).
    #[cfg(feature = "async")]
    pub async fn purge_async<C: crate::backends::AsyncInboxConnection>(
        &self,
        conn: &mut C,
        older_than: std::time::Duration,
        batch: u32,
    ) -> QueryResult<OutboxPurge> {
        self.purge_batches(&mut crate::io::Awaiting(conn), older_than, batch)
            .await
    }

    async fn purge_batches<S: Io>(
        &self,
        io: &mut S,
        older_than: std::time::Duration,
        batch: u32,
    ) -> QueryResult<OutboxPurge> {
        crate::io::refuse_open_transaction(io.transaction_status())?;
        let table = S::Backend::BACKEND.quote_table(self.table);
        let batch = batch.max(1);
        let sql = S::Backend::outbox_purge_sql(&table, batch);
        let age_ms = i64::try_from(older_than.as_millis()).unwrap_or(i64::MAX / 2);
        let mut report = OutboxPurge::default();
        loop {
            let removed = io.execute(&Sql::new(sql.clone()).bind_i64(-age_ms)).await?;
            report.batches += 1;
            report.removed += removed as u64;
            if removed < batch as usize {
                break;
            }
        }
        #[derive(diesel::QueryableByName)]
        struct N {
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            n: i64,
        }
        let parked: Vec<N> = io
            .load(&Sql::new(format!(
                "SELECT count(*) AS n FROM {table} WHERE parked_at IS NOT NULL"
            )))
            .await?;
        report.parked = parked.first().map_or(0, |row| row.n.max(0) as u64);
        if report.parked > 0 {
            tracing::warn!(
                table = self.table,
                parked = report.parked,
                "outbox: parked messages wait for an operator"
            );
        }
        Ok(report)
    }
}

const fn valid_table(name: &[u8]) -> bool {
    let (mut at, mut part, mut parts) = (0, 0, 1);
    while at < name.len() {
        let byte = name[at];
        if byte == b'.' {
            if part == 0 || parts == 2 {
                return false;
            }
            parts += 1;
            part = 0;
        } else if byte.is_ascii_alphanumeric() || byte == b'_' {
            part += 1;
            if part > 63 {
                return false;
            }
        } else {
            return false;
        }
        at += 1;
    }
    part > 0
}

/// A problem as the `QueryResult` error `publish` returns.
fn refused(problem: OutboxProblem) -> diesel::result::Error {
    diesel::result::Error::QueryBuilderError(Box::new(crate::error::Error::Outbox(problem)))
}

/// The headers as a JSON object of strings.
fn headers_json(headers: &[(String, String)]) -> String {
    let object: serde_json::Map<String, serde_json::Value> = headers
        .iter()
        .map(|(name, value)| (name.clone(), serde_json::Value::String(value.clone())))
        .collect();
    serde_json::Value::Object(object).to_string()
}

/// The namespace of outbox ids (UUID v5).
const NAMESPACE: Uuid = Uuid::from_u128(0x6f75_7462_6f78_4000_8000_696e_626f_7821);

/// What the origin of a run's messages is derived from, computed when the body first
/// publishes (most bodies publish nothing, and pay nothing).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Seed {
    /// One message: its stored id and the consumer.
    Key(Uuid, &'static str),
    /// A batch: its origin, derived from all its keys.
    Origin(Uuid),
}

impl Seed {
    fn origin(self) -> Uuid {
        match self {
            Seed::Key(id, consumer) => origin([id], consumer),
            Seed::Origin(origin) => origin,
        }
    }
}

/// The origin of the messages a handler run publishes: its key and consumer.
pub(crate) fn origin(stored_ids: impl IntoIterator<Item = Uuid>, consumer: &str) -> Uuid {
    let mut name = Vec::with_capacity(16 + consumer.len() + 1);
    for id in stored_ids {
        name.extend_from_slice(id.as_bytes());
    }
    name.push(0);
    name.extend_from_slice(consumer.as_bytes());
    Uuid::new_v5(&NAMESPACE, &name)
}

/// The id of the message at `position` among those a run of `origin` published.
fn message_id(origin: Uuid, position: u32) -> Uuid {
    let mut name = [0; 20];
    name[..16].copy_from_slice(origin.as_bytes());
    name[16..].copy_from_slice(&position.to_be_bytes());
    Uuid::new_v5(&NAMESPACE, &name)
}

#[derive(Debug, Clone, Copy)]
struct Origin {
    seed: Seed,
    next: u32,
}

thread_local! {
    /// The handler run whose body this thread is polling, and the position of the next
    /// message it publishes.
    static RUN: Cell<Option<Origin>> = const { Cell::new(None) };
}

/// Puts back what `RUN` held before a poll, keeping the position the poll reached.
struct Restore<'p> {
    previous: Option<Origin>,
    next: &'p mut u32,
}

impl Drop for Restore<'_> {
    fn drop(&mut self) {
        if let Some(origin) = RUN.replace(self.previous) {
            *self.next = origin.next;
        }
    }
}

/// Runs `body` with its run's origin set during each of its polls (as the tripwire's mark):
/// `publish` numbers the messages from 0 in each attempt, so that a body run again after a
/// transient failure publishes the same ids.
pub(crate) async fn originating<F: Future>(origin: Option<Seed>, body: F) -> F::Output {
    let mut body = pin!(body);
    let mut next = 0;
    std::future::poll_fn(move |cx| {
        let previous = RUN.replace(origin.map(|seed| Origin { seed, next }));
        let _restore = Restore {
            previous,
            next: &mut next,
        };
        body.as_mut().poll(cx)
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_stable_and_distinct_by_position() {
        let origin = origin([Uuid::nil()], "orders");
        assert_eq!(message_id(origin, 0), message_id(origin, 0));
        assert_ne!(message_id(origin, 0), message_id(origin, 1));
        assert_ne!(
            message_id(origin, 0),
            message_id(super::origin([Uuid::nil()], "billing"), 0)
        );
    }

    #[test]
    fn table_names_are_checked() {
        assert!(valid_table(b"outbox"));
        assert!(valid_table(b"app.outbox"));
        assert!(!valid_table(b""));
        assert!(!valid_table(b"a.b.c"));
        assert!(!valid_table(b"out box"));
        assert!(!valid_table(b".outbox"));
    }
}
