//! Idempotent message handlers on Diesel.
//!
//! Brokers deliver at least once: a message can arrive twice, and the second copy can land
//! on another instance while the first is still being processed. `#[idempotent]` makes a
//! handler apply each message once by letting the database decide: it writes an inbox marker
//! — a row keyed by `(message_id, consumer)` under a unique index — in the **same
//! transaction** as the handler's work, **before** that work, and recognises a duplicate by a
//! conflict on that index and on no other.
//!
//! ```
//! use diesel::connection::SimpleConnection;
//! use diesel::prelude::*;
//! use inbox_diesel::{idempotent, InboxSchema, Outcome, Uuid};
//!
//! diesel::table! {
//!     accounts (id) {
//!         id -> Integer,
//!         balance -> BigInt,
//!     }
//! }
//!
//! struct CreditRequested {
//!     message_id: Uuid,
//!     account: i32,
//!     amount: i64,
//! }
//!
//! #[idempotent(consumer = "credit", key = msg.message_id)]
//! fn on_credit(conn: &mut SqliteConnection, msg: &CreditRequested) -> QueryResult<i64> {
//!     diesel::update(accounts::table.find(msg.account))
//!         .set(accounts::balance.eq(accounts::balance + msg.amount))
//!         .execute(conn)?;
//!     accounts::table.find(msg.account).select(accounts::balance).first(conn)
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut conn = SqliteConnection::establish(":memory:")?;
//! conn.batch_execute(&inbox_diesel::schema::sqlite::create_table_sql(&InboxSchema::DEFAULT))?;
//! conn.batch_execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance BIGINT NOT NULL);
//!                     INSERT INTO accounts VALUES (1, 0);")?;
//!
//! let msg = CreditRequested { message_id: Uuid::from_u128(1), account: 1, amount: 100 };
//! assert_eq!(on_credit(&mut conn, &msg)?, Outcome::Processed(100));
//! // The redelivery is recognised; the body does not run again.
//! assert!(on_credit(&mut conn, &msg)?.is_duplicate());
//! # Ok(())
//! # }
//! ```
//!
//! # What the database guarantees
//!
//! - **Once.** Of any number of concurrent deliveries of one message to one consumer, exactly
//!   one commits its work. The others wait on the unique index while the first is in flight,
//!   then see its marker and return [`Outcome::Duplicate`] without running the body; if the
//!   first rolls back instead, the next one processes the message.
//! - **All or nothing.** The marker commits with the body's writes or not at all: a body that
//!   returns `Err` leaves no marker, so the redelivery processes the message.
//! - **No false duplicates.** Only a conflict on the inbox's own unique index means
//!   "already processed" ([`classify`]); a business unique violation in the body is returned
//!   as the error it is.
//! - **No false successes.** On PostgreSQL, a body that swallows a database error and
//!   returns `Ok` gets [`Error::TransactionAborted`], never `Processed`: the server had
//!   already thrown the transaction away. MariaDB throws a transaction away only on a
//!   deadlock or a Galera abort; a body that swallows that error and goes on gets the same,
//!   and its writes after it are rolled back rather than committed on their own. (MySQL
//!   does not detect it: propagate database errors with `?`.)
//! - **Retries.** Serialization failures, deadlocks and a busy SQLite database are retried in
//!   a fresh transaction (`retries = n`, default 3) — also when the body returns them, if its
//!   error type is a diesel error or an error whose `source()` chain holds one.
//!
//! # What it does not cover
//!
//! - Work outside the transaction: a write on *another* connection, an e-mail, an HTTP call
//!   commits or happens on its own, whatever the inbox decides. The compiler refuses the
//!   writes on another connection it can see in the body, and a guarded pool ([`tripwire`])
//!   a checkout made anywhere under the body. For side effects that cannot join a
//!   transaction, see [claim mode](#claim-mode-side-effects-outside-the-database).
//! - Markers removed too early: a redelivery after its marker is deleted is processed again.
//! - Error messages: where diesel reports no code (a deadlock on PostgreSQL, a timeout, a
//!   busy SQLite database) the class is read from the server's English message text. The
//!   startup check sets each PostgreSQL, MySQL and MariaDB session's messages to English
//!   (PostgreSQL: where the role may; otherwise the check refuses with the fix), and a
//!   MariaDB deadlock, written in the server's own language whatever the session says, is
//!   known by the transaction the server ended. The README's "Deployments" says what was
//!   tested.
//!
//! # Async handlers
//!
//! With the feature `async`, `#[idempotent]` also takes an `async fn` on diesel-async 0.9:
//! `&mut AsyncPgConnection` (with `postgres`) or `&mut SyncConnectionWrapper<SqliteConnection>`
//! (with `sqlite`). Pooled connections from diesel-async's deadpool, bb8 or mobc support are
//! passed as `&mut pooled`. The transaction, the SQL, the classification and the compile-time
//! check are the same as for a `fn`; call diesel-async's `RunQueryDsl` in the body.
//!
//! ```
//! # #[cfg(feature = "async")] {
//! use diesel::{ExpressionMethods, QueryDsl};
//! use diesel_async::RunQueryDsl;
//! use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
//! use inbox_diesel::{Uuid, idempotent};
//!
//! diesel::table! {
//!     accounts (id) {
//!         id -> Integer,
//!         balance -> BigInt,
//!     }
//! }
//!
//! struct CreditRequested { message_id: Uuid, account: i32, amount: i64 }
//!
//! #[idempotent(consumer = "credit", key = msg.message_id)]
//! async fn on_credit(
//!     conn: &mut SyncConnectionWrapper<diesel::SqliteConnection>,
//!     msg: &CreditRequested,
//! ) -> diesel::QueryResult<()> {
//!     diesel::update(accounts::table.find(msg.account))
//!         .set(accounts::balance.eq(accounts::balance + msg.amount))
//!         .execute(conn)
//!         .await?;
//!     Ok(())
//! }
//! # }
//! ```
//!
//! The body of an async handler may run more than once (retries), so each attempt runs a
//! copy of it: it may read its parameters but not mutate them, and its future must be `Send`.
//! A handler whose future is dropped mid-body commits nothing; what happens to its
//! connection depends on the pool (see `AsyncInboxConnection`).
//!
//! # Batches
//!
//! Consumers that receive messages in batches — a Kafka poll, up to 10 SQS messages, a
//! JetStream fetch — claim the whole batch in one transaction and commit once:
//!
//! ```
//! use diesel::connection::SimpleConnection;
//! use diesel::prelude::*;
//! use inbox_diesel::{idempotent, InboxSchema, Uuid};
//!
//! diesel::table! {
//!     accounts (id) {
//!         id -> Integer,
//!         balance -> BigInt,
//!     }
//! }
//!
//! struct CreditRequested { message_id: Uuid, account: i32, amount: i64 }
//!
//! #[idempotent(consumer = "credit", batch = msgs, key = |msg| msg.message_id)]
//! fn on_credits(conn: &mut SqliteConnection, msgs: &[CreditRequested]) -> QueryResult<usize> {
//!     // `msgs` holds only the messages that are new.
//!     for msg in msgs {
//!         diesel::update(accounts::table.find(msg.account))
//!             .set(accounts::balance.eq(accounts::balance + msg.amount))
//!             .execute(conn)?;
//!     }
//!     Ok(msgs.len())
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut conn = SqliteConnection::establish(":memory:")?;
//! conn.batch_execute(&inbox_diesel::schema::sqlite::create_table_sql(&InboxSchema::DEFAULT))?;
//! conn.batch_execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance BIGINT NOT NULL);
//!                     INSERT INTO accounts VALUES (1, 0);")?;
//! let credit = |n| CreditRequested { message_id: Uuid::from_u128(n), account: 1, amount: 10 };
//!
//! let first = on_credits(&mut conn, &[credit(1), credit(2)])?;
//! assert_eq!((first.value, first.processed), (Some(2), vec![0, 1]));
//! // 2 is a duplicate, and so is the second 3 of the same batch.
//! let second = on_credits(&mut conn, &[credit(2), credit(3), credit(3)])?;
//! assert_eq!((second.processed, second.duplicates), (vec![1], vec![0, 2]));
//! # Ok(())
//! # }
//! ```
//!
//! One statement inserts the markers of up to 5 000 messages (`INSERT … VALUES (…), (…) ON
//! CONFLICT DO NOTHING RETURNING message_id` on PostgreSQL and SQLite — a larger batch takes
//! several, inside the same transaction, so batches of any size work; on MySQL and MariaDB,
//! which return no rows from an insert, a multi-row insert of up to 500 markers — fewer where
//! the server's `max_allowed_packet` takes fewer — and, where a duplicate is among them, one
//! insert per message, inside the same transaction); keys repeated inside
//! the batch are collapsed first, and the keys are inserted in a fixed order, so that two
//! batches sharing keys do not deadlock on their markers. The body runs once with the new messages; `Err`
//! rolls the whole batch back. [`BatchOutcome`] names each message by its position.
//!
//! # Claim mode: side effects outside the database
//!
//! An e-mail, a card charge, a blob upload cannot roll back with a transaction. With
//! `mode = "claim"` the handler runs in three steps, each committed on its own:
//!
//! 1. **claim** — insert the inbox row with `processed_at` NULL and a lease
//!    (`claimed_until`, `lease_ms` from now). A row that exists decides instead: completed →
//!    `Duplicate`; claimed under a live lease → `InFlight`; released by a failed attempt →
//!    taken over; lease ended without completion → taken over (`on_expired = "take_over"`,
//!    the default), or reported as `StaleClaim` (`on_expired = "report"`);
//!    A claim that took over a quarter of `lease_ms` to commit is released and claimed
//!    again: the body starts only with three quarters of its lease ahead;
//! 2. **the body** — the side effect, outside any transaction. Pass the message key downstream
//!    as the provider's idempotency key: it is the same on every attempt;
//! 3. **stamp** — set `processed_at`; or, when the body returned `Err`, release the claim so
//!    that a redelivery runs it again at once.
//!
//! ```
//! use diesel::connection::SimpleConnection;
//! use diesel::prelude::*;
//! use inbox_diesel::{idempotent, InFlightOutcome, InboxSchema, Uuid};
//!
//! struct SignedUp { signup_id: Uuid, email: String }
//!
//! /// A provider that deduplicates by the key it is given.
//! struct Mailer { sent: std::cell::RefCell<Vec<String>> }
//!
//! impl Mailer {
//!     fn send(&self, to: &str, idempotency_key: &str) -> std::io::Result<()> {
//!         self.sent.borrow_mut().push(format!("{to} ({idempotency_key})"));
//!         Ok(())
//!     }
//! }
//!
//! #[idempotent(consumer = "welcome-mail", key = msg.signup_id, mode = "claim", lease_ms = 30_000)]
//! fn send_welcome(
//!     conn: &mut SqliteConnection,
//!     mailer: &Mailer,
//!     msg: &SignedUp,
//! ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//!     mailer.send(&msg.email, &msg.signup_id.to_string())?;
//!     Ok(())
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let mut conn = SqliteConnection::establish(":memory:")?;
//! conn.batch_execute(&inbox_diesel::schema::sqlite::create_table_sql(&InboxSchema::DEFAULT))?;
//! let mailer = Mailer { sent: Default::default() };
//! let msg = SignedUp { signup_id: Uuid::from_u128(7), email: "ada@example.com".into() };
//!
//! assert_eq!(send_welcome(&mut conn, &mailer, &msg)?, InFlightOutcome::Processed(()));
//! assert!(send_welcome(&mut conn, &mailer, &msg)?.is_duplicate());
//! assert_eq!(mailer.sent.borrow().len(), 1);
//! # Ok(())
//! # }
//! ```
//!
//! A claim-mode handler returns [`InFlightOutcome<T>`] — [`StaleClaimOutcome<T>`] with
//! `on_expired = "report"` — in place of `T`: only the answers it can give.
//!
//! What claim mode guarantees:
//!
//! - of concurrent deliveries, one runs the side effect; the others return `InFlight` (do not
//!   acknowledge: requeue with a delay) or, once the work is stamped, `Duplicate`. `InFlight`
//!   says how long the claim holds yet (`lease_left`): a message found held again is worth
//!   redelivering only after that ([`Settlement::Held`], [`Redelivery::delay_of`]);
//! - a body that returns `Err` releases its claim, and the redelivery retries at once; each
//!   claim counts its attempts (the `attempts` column);
//! - a delivery whose lease ended and whose claim another delivery took over never stamps it:
//!   the takeover is a compare-and-set on the attempt counter, the stamp names its attempt,
//!   and the late delivery gets [`Error::ClaimLost`];
//! - leases are compared on the database's clock, never the instances'.
//!
//! What it does not: a crash, a lost connection or a hang past the lease **between the side
//! effect and the stamp** leaves a claim whose outcome is unknown: nobody can know whether
//! the side effect ran without asking the system it went to. Under `on_expired =
//! "take_over"` the next delivery after the lease takes the claim over (a compare-and-set on
//! its attempt counter: one of several concurrent deliveries wins) and runs the side effect
//! again — right when the provider deduplicates by the key you pass it; under `on_expired =
//! "report"` each delivery returns `StaleClaim` without running the body — right when
//! running the side effect twice is worse than running it late — and
//! [`purge::stale_claims`] lists such claims for reconciliation. A body that outlives its lease can run beside its successor: set
//! `lease_ms` above the side effect's longest run. The body does not reach the database: it
//! is given [`NoConnection`] in place of the handler's connection, and the compiler refuses
//! any other connection in it. The handler must be called outside any open transaction (it
//! returns [`Error::CalledInsideTransaction`] otherwise).
//!
//! # Get-or-create on business keys
//!
//! The same race, outside the inbox: "is this e-mail taken? no — insert it". [`unique`]
//! resolves it on the business table's own unique index, recognised by name like the inbox's:
//! a one-statement upsert that returns the id, an insert that re-reads the winner's row on
//! *this* index's violation (in a savepoint inside a larger transaction), an insert that does
//! nothing on a duplicate, a key lock for creations in several statements, and the batch forms.
//!
//! # Backends
//!
//! | feature | connection | needs |
//! |---|---|---|
//! | `sqlite` | `SqliteConnection`; with `async`, `SyncConnectionWrapper<SqliteConnection>` | nothing: SQLite is compiled in |
//! | `postgres` | `PgConnection`; with `async`, `AsyncPgConnection` | libpq (Debian: `libpq-dev`) for `PgConnection` |
//! | `mysql` | `MysqlConnection`; with `async`, `AsyncMysqlConnection` | libmysqlclient (Debian: `default-libmysqlclient-dev`) for `MysqlConnection` |
//!
//! None is on by default: a library on diesel turns on no backend of diesel's that the
//! application did not ask for (one it did not would change what the application's own
//! backend-generic code compiles to). The inbox table must exist: see [`schema`].
#![warn(missing_docs)]
// Built with no backend (none of `sqlite`, `postgres`, `mysql`: the default), the crate
// still compiles — a crate that names the backend only in its own
// dependency on diesel builds it so for a moment — but the backends' statements have no
// caller.
#![cfg_attr(
    not(any(feature = "sqlite", feature = "postgres", feature = "mysql")),
    allow(dead_code, unused_imports)
)]

extern crate self as inbox_diesel;

// The layers, bottom up; arrows run down only, and no two modules import each other:
// values every layer names (`value`, `spec`, `classify`, `tripwire`'s net), then `error`
// (with the check's and the outbox's refusals, `error::schema`, `error::outbox`) and
// `dialect` (SQL text, which backend); `io` (one interface over sync and async
// connections); `backends` (each backend's SQL, catalog, session and connections), the test
// kit's crash points (`testing`, `crash`); `schema` (DDL, the startup check, migrations), `outbox`, `purge`; `runtime`
// (what a read of markers found and what a duplicate is answered on, the steps, the check's
// cache, failures, stored results, batches, transaction and claim mode, then the sync and
// async entry points); `handler` and `unique` on top; `__private`, what the expansion names.
mod backends;
mod classify;
mod crash;
mod dialect;
mod error;
mod guard;
pub mod handler;
mod io;
pub mod outbox;
pub mod pool;
#[cfg(feature = "async")]
pub mod pump;
pub mod purge;
mod runtime;
pub mod schema;
mod spec;
pub mod telemetry;
#[cfg(feature = "testing")]
pub mod testing;
mod value;

pub mod tripwire;
pub mod unique;

#[doc(hidden)]
#[path = "private.rs"]
pub mod __private;

/// Makes a diesel handler idempotent: its work commits once per message key and consumer.
///
/// ```text
/// #[idempotent(consumer = "credit", key = msg.message_id)]
/// fn on_credit(conn: &mut PgConnection, msg: &CreditRequested) -> Result<Receipt, AppError> { … }
/// // becomes
/// fn on_credit(conn: &mut PgConnection, msg: &CreditRequested) -> Result<Outcome<Receipt>, AppError>
/// ```
///
/// The body runs inside a transaction that first writes the inbox marker for
/// `(key, consumer)`; a delivery whose marker already exists returns
/// [`Outcome::Duplicate`] without running the body. See the [crate documentation](crate) for
/// the guarantees.
///
/// # Options
///
/// | option | value | default |
/// |---|---|---|
/// | `consumer` | string literal: the handler's name, stored in the marker; non-empty, ≤ 200 bytes, no control characters (checked at compile time) | required |
/// | `key` | an expression over the parameters whose type implements [`ToMessageKey`] (`Uuid`, text, bytes, integers up to `u128`, `url::Url` with the feature `url`, a tuple of those — a composite key, `key = (version_id, email)`, each part borrowed —, `format!` with inline arguments); borrowed, not moved; an empty key or one over 64 KiB is an error before any SQL | required |
/// | `conn` | the name of the connection parameter (in claim mode, a `&` pool's: [`pool`]) | the one `&mut …Connection` parameter; in claim mode without one, the one `&…Pool<…>` parameter |
/// | `retries` | integer: retries of transient failures, each in a fresh transaction | `3` |
/// | `isolation` | `"read committed"`, `"repeatable read"` or `"serializable"` (PostgreSQL, MySQL, MariaDB; SQLite is always serializable) | the server's default |
/// | `table` | string literal: the inbox table, optionally qualified (`"billing.inbox"`) | `"inbox"` |
/// | `constraint` | string literal: the unique index on `(message_id, consumer)` | `"ux_inbox_message_consumer"` |
/// | `schema` | a path to the application's `const` [`InboxSchema`], named once for every handler (`pub const INBOX: InboxSchema = InboxSchema::named("billing_inbox", "ux_billing_inbox");`, checked where the constant is evaluated); in place of `table` and `constraint`, not with them | — |
/// | `on_locked` | `"wait"`, or `"in_flight"`: a delivery that finds another one holding the message's marker, uncommitted, answers `InFlight` at once (nack it with a delay; the handler returns [`InFlightOutcome`]) instead of waiting for the other's outcome while holding a pooled connection — for small pools, where waiting duplicates can starve the delivery in flight. The cost: one more round trip per message (PostgreSQL: resetting `lock_timeout` for the body; MySQL and MariaDB: `innodb_lock_wait_timeout`, whose shortest wait is one second, set and put back), and a redelivery instead of a quick duplicate. Transaction mode, one message; SQLite, which locks the whole database rather than the marker, ignores it | `"wait"` |
/// | `idle_in_transaction_ms` | integer, 0 to 2 147 483 647: the server ends a session whose handler transaction sits idle this long, which bounds the marker lock a handler cancelled mid-body leaves on a pooled connection; a body that awaits something else than the database for longer must raise it; 0 for no bound. The smaller of this and the session's own setting holds (a role's tighter bound stays). PostgreSQL: `idle_in_transaction_session_timeout` for the transaction (`set_config(…, true)`), in the `BEGIN`'s round trip. MariaDB: `idle_transaction_timeout`, in whole seconds (rounded up), set with `START TRANSACTION` and put back after the transaction — one more round trip per message. MySQL has no such setting: there, use bb8, which closes a connection that comes back inside a transaction | `10000` |
/// | `busy_timeout_ms` | integer, 0 to 2 147 483 647: how long a SQLite handler waits for another writer before `SQLITE_BUSY` (then retried); the handler sets it on its connection | `5000` |
/// | `precheck` | `true`: before opening the transaction, look for a completed marker with one autocommitted read, and return `Duplicate` without a transaction when it is there. It pays when at least about half the deliveries are redeliveries (BENCHMARKS.md: 1.3–1.7× the throughput at 80 %) and costs 7–12 % of it when none are | `false` |
/// | `mode` | `"transaction"`, or `"claim"` for a side effect outside the database ([claim mode](crate#claim-mode-side-effects-outside-the-database)) | `"transaction"` |
/// | `lease_ms` | claim mode: integer, 100 to 2 592 000 000 (30 days): how long a claim stays live, in milliseconds; above the body's longest run (a claim whose own insert takes over a quarter of it is given back and taken again, so it must outlast that statement too). A literal is checked at compile time; any other expression of type `u64` — a setting, `lease_ms = settings.process_timeout_ms` — is evaluated at each call, before the body's closure takes the parameters, and one outside the range is [`Error::InvalidLease`] before any SQL | `60000` |
/// | `batch` | the parameter holding a batch of messages (`msgs: &[Msg]` or a `Vec`); `key` is then a closure from one message to its key (`key = \|msg\| msg.id`), and the function returns [`BatchOutcome<T>`] | none |
/// | `store_result` | `true`: the body's `Ok` value is kept with the marker as JSON (serde), in the same transaction (claim mode: with the stamp), and a later delivery answers `Duplicate { stored: Some(value), .. }` — the original answer to a retried request or redelivered command. Needs the table's `result` column (`--with result`; a table without it is refused before anything is written) and `T: Serialize + DeserializeOwned`; at most [`MAX_STORED_RESULT_BYTES`] of JSON ([`Error::StoredResult`] beyond). One message, not a batch | `false` |
/// | `fingerprint` | an expression of bytes (`AsRef<[u8]>`: the request's body, a canonical encoding of the fields that make it this request): its SHA-256 digest ([`Fingerprint`]) is written with the marker, and a later delivery of the key with another digest is [`Error::KeyReused`] — neither processed nor a duplicate — also when it lost the race to the first (it waits for the first's commit, then compares) and, in claim mode, while the first is in flight. Needs the table's `fingerprint` column (`--with fingerprint`). One message, not a batch | none |
/// | `transaction` | `"own"`, or `"caller"`: the marker and the body join the transaction the caller opened with `conn.transaction(…)` — a job runner's, holding the job's row — in a savepoint of it, and commit with the caller's own writes or roll back with them. `Processed` then means written, for the caller to commit; a marker that exists answers `Duplicate` (another delivery's uncommitted one is waited for); a body's `Err` rolls back to the savepoint only; nothing is retried (a deadlock has ended the caller's transaction: the caller runs it again); no transaction open is [`Error::NoTransactionToJoin`]. `store_result` and `fingerprint` are kept with the marker in the savepoint, and a duplicate reads them at what committed last. Not with claim mode, `batch`, `retries`, `isolation`, `precheck`, `idle_in_transaction_ms`, `on_locked` or `busy_timeout_ms` (each refused at compile time, saying why) | `"own"` |
/// | `on_expired` | claim mode: `"take_over"` or `"report"`, what a delivery does with a claim whose lease ended without completion: run the side effect again, or return `StaleClaim` ([`StaleClaimOutcome`]) | `"take_over"` |
///
/// # Every statement runs in the handler's transaction
///
/// Diesel runs a statement at once on the connection it is given. A write on another
/// connection — a pool checkout, a connection established in the handler, a global behind a
/// mutex, a field of a context struct, a second parameter — commits on its own, whatever the
/// inbox decides: the duplicate is recognised and the money moves twice. So the body may not
/// hand on a connection other than the handler's transaction, and the compiler decides what
/// is a connection:
///
/// - every value the body hands on — a call's argument, a method's receiver, a struct, tuple
///   or array element, the right side of an assignment, an argument of a macro that parses as
///   an expression — and every parameter besides the connection (at the top of the body,
///   where a connection is refused and a pool is not: it may be a replica's; then again
///   wherever it is handed on) is asked, at its type,
///   whether it runs SQL (diesel's `SimpleConnection` or diesel-async's
///   `SimpleAsyncConnection`, owned, borrowed, pooled, boxed, behind a guard or a `Deref`,
///   within five dereferences) or is a pool of diesel connections, also behind a `Deref`
///   such as a `LazyLock` (r2d2 with the `r2d2` feature, diesel-async's deadpool and bb8
///   with `deadpool` and `bb8`). A static is asked like any value wherever it is handed
///   on — `POOL.bump()`, `audit!(POOL)`, `db::POOL` — known by its upper-case name;
/// - if it is, and it is not the handler's transaction, the build fails at that value, with
///   a message that says why the write would happen twice and how to fix it; a value of any
///   other type is never called a connection, and a pool of anything else (an r2d2 pool of
///   cache clients, a deadpool pool of broker channels) is never called a connection pool;
/// - **what only leaves the body or is only printed**: the value an `Err(…)` carries, and
///   the arguments of a formatting or logging macro (`format!`, `println!`, `assert_eq!`,
///   `tracing`'s `info!` …) are not asked — their types may be settled only by a later
///   line — though what they compute is;
/// - **reads on another connection** compile when the type says they are reads: a query
///   that diesel's query builder made a `SELECT` (its query is diesel's
///   [`SelectQuery`](diesel::query_builder::SelectQuery): a table, `filter`, `select`,
///   `order`, joins, `count`, `into_boxed`, `for_update` …) run by `load`, `get_result`,
///   `get_results` or `first` on a replica's checkout, sync or async. SQL text
///   (`sql_query`, even a `SELECT`), `execute`, `load_iter` and a `UNION` are not told apart
///   from writes and are refused there. A pool's checkout (`pool.get()`) runs no statement
///   and compiles; what it gives is asked wherever it is handed on. (A `SELECT` calling a
///   function that writes is a `SELECT` to the type: the [`tripwire::net`] lets reads
///   through too);
/// - **a value erased on its way**: a connection coerced by a typed `let` or an `as` cast to
///   a trait object (`let s: &mut dyn Store = &mut checkout;`) is asked at its own type,
///   before the coercion; a `&dyn Any` or `&mut dyn Any` handed on is refused, whatever it
///   holds, since a helper may downcast it to a connection;
/// - **a spawned thread or task**: a closure or an `async` block handed to a `spawn`,
///   `spawn_blocking` or `spawn_local` (`std::thread`, a thread scope, `tokio`, a
///   `JoinSet`…) may capture no connection or pool, even one it only reads with: neither the
///   transaction nor the run-time net follows it there;
/// - the transaction is the connection parameter and what is bound from it, followed as Rust
///   scopes names: `let` (typed or not), `if let`, `while let`, `match`, `let … else`, tuples,
///   structs (`..base` included) and `Some`/`Ok` taken apart, `&mut *conn`, branches that all
///   give it, the parameter of a closure handed to `transaction`, `immediate_transaction`,
///   `exclusive_transaction` or `build_transaction().run` on it, and the parameter of a
///   closure that the body only ever calls (what it is called with is asked at the call). A
///   binding that shadows the connection's name is a new value, judged by its own type, and
///   the message says so. A mutable `Option`, tuple or struct holding the transaction stays
///   the transaction only while nothing replaces it whole; a name handed bare to a macro of
///   the application's own is no longer taken for the transaction after it (the macro may
///   bind it anew).
///
/// In claim mode there is no transaction: the body is given [`NoConnection`] in place of the
/// connection — a type with no methods and no diesel impls — and every value it hands on is
/// asked with claim mode's message.
///
/// The questions cost nothing at run time: each wraps its value in an `#[inline(always)]`
/// function that returns it, beside a closure that is never called.
///
/// What the compiler is not shown, and how to close it:
///
/// - **a helper's own body**: a helper that reaches a pool or a global connection itself runs
///   its statements there. Write helpers that take the connection
///   (`fn add(conn: &mut PgConnection, …)`): the compiler then refuses to hand them anything
///   but a connection, and the guard refuses any connection but the transaction. A pool that
///   must be reachable in handlers' code can refuse checkouts at run time: see
///   [`tripwire`];
/// - **a function passed as a value** (`.map(add_one)`), **trait objects and function
///   pointers**: the callee calls them with values the guard does not see. Pass a closure
///   (`.map(|c| add_one(c))`): its parameter is asked. A connection coerced to a trait
///   object of the application's at a call (`helper(&mut checkout)` where `helper` takes
///   `&mut dyn Store`) is asked as the trait object, since the question takes the type the
///   call expects; the net stops its writes;
/// - **work a spawned thread or task reaches by itself** — a helper that checks out of a
///   global pool, a struct holding a pool captured whole: the capture is not a pool by its
///   type, and the net does not follow the mark to another thread;
/// - **expansions of macros defined elsewhere**: their arguments are asked — an expression as
///   a value, and in a piece that is not an expression (`audit!(db: "x")`) every name of the
///   body's; a name bound in the macro's own statement (a `let` chain, a `match` guard) is
///   asked in a block just before the macro; the blocks in a piece (`tokio::select!` arms
///   without commas) and a `matches!` pattern's guard are the body's code — but what the
///   macro does with them is not seen. A `const` or `static` of the body is checked like it;
///   A `macro_rules!` defined inside the handler is the handler's code, and its rules are
///   checked like the body — except a rule whose expansion repeats (`$(…)*`), which does not
///   parse as Rust until it is called;
/// - **a value that holds a connection or a pool** (`Option<&mut PgConnection>`,
///   `Arc<Mutex<…>>`, a `Vec` of checkouts, an application's own pool-or-connection enum
///   such as Lemmy's `DbPool`) handed to a helper — an application built on such a type
///   must install the [`tripwire::net`]: a question about a container whose content is
///   not inferred yet where it is handed on (`Vec::new()` filled later) cannot be told from
///   one about a container of connections, so containers are not looked into; the
///   [`tripwire::net`] stops the helper's write at run time. Nor is another connection
///   swapped into the transaction's place through a container (`slice::from_mut(conn)
///   .swap_with_slice(…)`, `RefCell::swap` of a wrapper, raw pointers);
/// - **a handler parameter of a generic type bounded only by the application's own trait**
///   (`w: &mut W where W: AuditSink`): the guard cannot say whether the caller's type is a
///   connection, as with trait objects; the net stops its writes;
/// - **a nested `fn` item** in the body is its own world, like a helper;
/// - **a macro's argument indexed by a call** (`audit!(conns[next()])`): asking about it
///   before the macro would run the index where the macro may not. (A method's receiver so
///   indexed is asked: `conns[next()].execute(…)` computes `next()` once, then asks.)
///
/// What is refused although it is correct, and how to write it instead:
///
/// - **the transaction reached through something the tracking does not follow** — a call
///   (`my_reborrow(conn)`), a collection (`vec![&mut *conn]`), the parameter of a closure
///   handed to a function of your own (`with_retry(conn, |c| …)`) or kept in a struct field
///   or a `Box<dyn Fn…>`, a mutable wrapper of it borrowed whole (`helper(&mut tx)`) or
///   refilled, an `Option` of it that another branch makes `None`: pass the connection
///   parameter itself (`&mut *tx`), let the helper take the connection and call the closure
///   with it, keep `fn` items rather than boxed closures, or make the other branch return.
///   Followed, and so never refused: `Some`, `Ok` and tuple-struct newtypes of it (`Tx(conn)`,
///   used as `&mut *tx`); `RefCell::new`, `Mutex::new`, `Box::new` and the like of it, and
///   what their accessors give back (`borrow_mut()`, `lock()`, `as_deref_mut()`,
///   `unwrap()`, `take()`); an `if` or `match` whose other arms `return`, `break` or panic;
///   a closure returned from a block, an `if` or a `match` and only called afterwards (its
///   parameters are asked at the calls), or handed to the transaction's own `transaction`
///   (`let work = |c| …; conn.transaction(work)`: a savepoint on the handler's connection);
/// - **a value whose type is only settled by a later statement**
///   (`let n = Default::default(); show(&n); let _: i64 = n;`) may be reported as `_`:
///   annotate it where it is bound.
///
/// When a statement must commit on its own — an audit trail that records attempts, rolled
/// back or not — say so on the statement (or on a block of them):
///
/// ```
/// # use diesel::prelude::*;
/// # use diesel::connection::SimpleConnection;
/// # use inbox_diesel::idempotent;
/// # struct Msg { id: u64 }
/// # fn audit_db() -> QueryResult<SqliteConnection> { unimplemented!() }
/// #[idempotent(consumer = "credit", key = msg.id)]
/// fn on_credit(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
///     #[inbox::outside_transaction("the audit trail must record rolled-back attempts too")]
///     audit_db()?.batch_execute("INSERT INTO audit (what) VALUES ('credit attempted')")?;
///     conn.batch_execute("UPDATE accounts SET balance = balance + 10 WHERE id = 1")
/// }
/// ```
///
/// The attribute needs a reason and is removed by the macro; `grep -rn outside_transaction`
/// finds every exception. The risk is exactly the one the rule prevents: that statement runs
/// once per *delivery*, not once per message, and it stays committed when the handler's
/// transaction rolls back.
///
/// What the compiler cannot see — a helper that checks a connection out of a pool inside its
/// own body — the runtime stops at the pool: while the body runs, the thread (or the
/// handler's future) is marked with the handler's consumer, and the guarded pools of
/// [`tripwire`] (features `r2d2`, `deadpool`, `bb8`) refuse a checkout under that mark with
/// an error, before the helper can write. The run-time exception is
/// `tripwire::allow_outside_transaction("why", || …)`.
///
/// # Requirements
///
/// - The function is a `fn` or an `async fn` (not `const`) returning a `Result`:
///   `Result<T, E>`, or an alias such as `QueryResult<T>` or `anyhow::Result<T>`, or one
///   that names no value type (`type EmptyResult = ApiResult<()>`). The
///   function then returns the same `Result` with the outcome type of its mode in place of
///   `T`: [`Outcome<T>`]; [`InFlightOutcome<T>`] with `on_locked = "in_flight"` and in claim
///   mode; [`StaleClaimOutcome<T>`] with `on_expired = "report"`; [`BatchOutcome<T>`] for a
///   batch. Each holds only the answers its handler can give.
/// - `E: From<inbox_diesel::Error>`, for failures of the inbox itself (an invalid key, a
///   failed commit, an aborted transaction). `diesel::result::Error` qualifies.
/// - The connection parameter is `&mut SqliteConnection`, `&mut PgConnection` or
///   `&mut MysqlConnection` ([`InboxConnection`]), or for an `async fn`
///   `&mut AsyncPgConnection`, `&mut AsyncMysqlConnection` or
///   `&mut SyncConnectionWrapper<SqliteConnection>` (`AsyncInboxConnection`, feature
///   `async`); pass a pooled connection as `&mut pooled`. A type alias works when the
///   connection is the handler's only `&mut` parameter; otherwise name it with `conn = …`.
///   An application on several backends through one type — diesel's `MultiConnection`
///   enum, as Vaultwarden's `DbConnInner` — derives [`MultiConnection`] beside diesel's and
///   declares `&mut` the enum (sync handlers). Models that take a trait object of the
///   application's (`&mut dyn Db`) hide the connection from the guard: install the
///   [`tripwire::net`].
/// - The body may run more than once when a transient failure is retried, so it must not
///   consume its parameters, and an async body must not mutate them either.
/// - Call the handler outside any open transaction on that connection.
/// - In claim mode, the body runs once per delivery (no in-process retry): a body error
///   releases the claim for the broker's redelivery.
///
/// ```
/// use diesel::prelude::*;
/// use inbox_diesel::{idempotent, Outcome};
///
/// #[derive(Debug)]
/// enum AppError {
///     Db(diesel::result::Error),
///     Inbox(inbox_diesel::Error),
/// }
/// impl From<diesel::result::Error> for AppError {
///     fn from(e: diesel::result::Error) -> Self { AppError::Db(e) }
/// }
/// impl From<inbox_diesel::Error> for AppError {
///     fn from(e: inbox_diesel::Error) -> Self { AppError::Inbox(e) }
/// }
///
/// struct Shipment { order: String, partition: i32, offset: i64 }
///
/// #[idempotent(consumer = "ship", key = ("orders", msg.partition, msg.offset), retries = 5)]
/// fn on_shipment(db: &mut SqliteConnection, msg: &Shipment) -> Result<(), AppError> {
///     diesel::sql_query("UPDATE orders SET shipped = 1 WHERE id = ?")
///         .bind::<diesel::sql_types::Text, _>(&msg.order)
///         .execute(db)?;
///     Ok(())
/// }
/// ```
#[doc(inline)]
pub use inbox_macros::idempotent;

/// The compile-time guard of `#[idempotent]`, on a closure: the body given to the function API
/// ([`handler::run_once`], [`handler::run_once_stored`] and their async forms) and to the
/// integrations built on it.
///
/// The closure's first parameter is the transaction. Every value the body hands on — a
/// captured pool or connection, one established in the body, a parameter besides the
/// transaction — is asked at its type whether it is a diesel connection or a pool, as in an
/// `#[idempotent]` body, and one that is fails to compile: a write through it would commit
/// on its own, outside the inbox transaction. `#[inbox::outside_transaction("why")]` marks a
/// statement that must. The closure returns its value as a [`handler::Checked`], which has no
/// public constructor and which the function API requires, so a body written without the
/// guard is refused by the compiler, not by review.
///
/// ```
/// use std::sync::LazyLock;
/// use diesel::connection::SimpleConnection;
/// use diesel::prelude::*;
/// use inbox_diesel::handler::{Handler, run_once};
/// use inbox_diesel::{InboxSchema, guarded};
///
/// static LIKES: LazyLock<Handler> = LazyLock::new(|| Handler::new("likes").unwrap());
///
/// fn like(conn: &mut SqliteConnection, post: i32, id: &str) -> QueryResult<bool> {
///     let outcome = run_once(conn, &LIKES, id, guarded!(|tx| {
///         diesel::sql_query("UPDATE posts SET likes = likes + 1 WHERE id = ?")
///             .bind::<diesel::sql_types::Integer, _>(post)
///             .execute(tx)
///     }))?;
///     Ok(outcome.is_processed())
/// }
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let mut conn = SqliteConnection::establish(":memory:")?;
/// # conn.batch_execute(&inbox_diesel::schema::sqlite::create_table_sql(&InboxSchema::DEFAULT))?;
/// # conn.batch_execute("CREATE TABLE posts (id INTEGER, likes INTEGER); INSERT INTO posts VALUES (1, 0);")?;
/// assert!(like(&mut conn, 1, "like-7")?);
/// assert!(!like(&mut conn, 1, "like-7")?);
/// # Ok(())
/// # }
/// ```
///
/// A connection the body was not given is refused at compile time:
///
/// ```compile_fail
/// use std::sync::LazyLock;
/// use diesel::prelude::*;
/// use inbox_diesel::handler::{Handler, run_once};
/// use inbox_diesel::guarded;
///
/// static LIKES: LazyLock<Handler> = LazyLock::new(|| Handler::new("likes").unwrap());
///
/// fn like(conn: &mut SqliteConnection, audit: &mut SqliteConnection, id: &str) -> QueryResult<()> {
///     run_once(conn, &LIKES, id, guarded!(|tx| {
///         // Commits on its own: a redelivery would audit the like twice.
///         diesel::sql_query("INSERT INTO audit VALUES ('like')").execute(audit)?;
///         diesel::sql_query("UPDATE posts SET likes = likes + 1").execute(tx)
///     }))?;
///     Ok(())
/// }
/// ```
#[doc(inline)]
pub use inbox_macros::guarded;

/// An application's enum of connections — diesel's `MultiConnection`, one type for several
/// backends, chosen by the URL at startup — as the connection of a sync `#[idempotent]`
/// handler and of [`handler::run_once`]: derive it beside diesel's.
///
/// ```
/// use diesel::connection::SimpleConnection;
/// use diesel::prelude::*;
/// use inbox_diesel::{InboxSchema, idempotent};
///
/// #[derive(diesel::MultiConnection, inbox_diesel::MultiConnection)]
/// enum Db {
///     Sqlite(SqliteConnection),
///     // Pg(PgConnection), Mysql(MysqlConnection), as the application's features enable
/// }
///
/// diesel::table! {
///     likes (post) {
///         post -> Integer,
///         count -> Integer,
///     }
/// }
///
/// #[idempotent(consumer = "likes", key = like_id)]
/// fn like(conn: &mut Db, like_id: &str, post: i32) -> QueryResult<()> {
///     // The DSL on the enum, as the rest of the application writes it: in the handler's
///     // transaction, with the marker.
///     diesel::update(likes::table.find(post))
///         .set(likes::count.eq(likes::count + 1))
///         .execute(conn)?;
///     Ok(())
/// }
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut conn = Db::establish(":memory:")?;
/// # let Db::Sqlite(sqlite) = &mut conn;
/// # sqlite.batch_execute(&inbox_diesel::schema::sqlite::create_table_sql(&InboxSchema::DEFAULT))?;
/// # sqlite.batch_execute("CREATE TABLE likes (post INTEGER PRIMARY KEY, count INTEGER); INSERT INTO likes VALUES (1, 0);")?;
/// assert!(like(&mut conn, "like-7", 1)?.is_processed());
/// assert!(like(&mut conn, "like-7", 1)?.is_duplicate());
/// # Ok(())
/// # }
/// ```
///
/// The runtime runs its own statements on the variant the enum holds, with that backend's
/// SQL and error codes; the body is given the enum, and diesel's `MultiConnection` hands its
/// transactions to the variant, so a nested `conn.transaction(…)` in the body is a savepoint
/// of the handler's transaction. Each variant holds one connection whose backend is a
/// feature of inbox-diesel (one that is not is refused at compile time, at the variant).
/// The body must not replace the enum's variant: the transaction would go with the
/// connection, and the handler panics rather than run on another.
///
/// The startup check ([`schema::verify`]), the purge, [`outbox::Outbox::publish`] and the
/// test kit take the enum too; get-or-create ([`unique`]) takes the variant's connection
/// (`match conn { Db::Sqlite(c) => …, … }`, which the guard follows in a body: each variant
/// holds the handler's connection). Sync only: diesel-async has no `MultiConnection`.
#[doc(inline)]
pub use inbox_macros::MultiConnection;

#[cfg(feature = "async")]
pub use backends::AsyncInboxConnection;
pub use backends::{HandlerConnection, InboxConnection};
pub use crash::crash_point;
pub use error::classify;
pub use error::{Error, SessionProblem, StoredResultProblem};
pub use error::{HasDieselError, find_diesel_error};
pub use guard::NoConnection;
pub use inbox_core::{
    Action, BatchOutcome, Consumer, ConsumerError, ErrorClass, Gate, HandlerOutcome,
    IdentifierError, InFlightOutcome, InboxSchema, Isolation, KeyError, KeyPart, MessageKey,
    Outage, Outcome, Redelivery, Retention, RetryDecision, RetryPolicy, Scoped, Settle, Settlement,
    StaleClaimOutcome, ToKeyPart, ToMessageKey, TransientKind, broker,
};
pub use schema::migration;
pub use uuid::Uuid;
pub use value::{Fingerprint, MAX_STORED_RESULT_BYTES};
