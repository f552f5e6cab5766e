//! The function API: what `#[idempotent]` does, for code that cannot carry the attribute — a
//! trait method, a framework's callback, a handler chosen at run time.
//!
//! A [`Handler`] holds what the attribute's options say; [`run_once`] (and, with the feature
//! `async`, `run_once_async`) runs a body once per message key and consumer, through the
//! same runtime the attribute's expansion calls: the marker first, in the body's transaction,
//! a duplicate recognised by the inbox's own unique index, transient failures retried.
//! Claim mode, for a side effect outside the database, is [`ClaimHandler`] and
//! [`claim_once`] (`claim_once_async`): the claim committed first, the body given no
//! connection, the stamp after it.
//!
//! The checks are the attribute's. The body is a closure written in
//! [`guarded!`](crate::guarded), which rewrites it as `#[idempotent]` rewrites a handler's
//! body, so a value it hands on that is a connection other than its transaction — a captured
//! pool, a second connection — fails to compile; the function API takes no other closure (its
//! bodies return [`Checked`], which only the macro builds). At run time, the
//! [`tripwire`](crate::tripwire) refuses a pool checkout inside the body, in a helper the
//! guard cannot see.

use std::marker::PhantomData;

use inbox_core::{ConsumerError, ErrorClass, HandlerOutcome, InboxSchema, ToMessageKey};

/// A handler's type parameter ([`OnLocked`], [`OnExpired`]): the sealed trait, its outcome
/// type bound by `$bound`, and its values, each an uninhabited type and the outcome type it
/// picks.
macro_rules! settings {
    (
        $(#[$trait_doc:meta])*
        $setting:ident: $bound:path;
        $($(#[$doc:meta])* $name:ident => $outcome:ty;)+
    ) => {
        $(#[$trait_doc])*
        pub trait $setting: sealed::Sealed {
            /// The outcome type of a handler with this setting.
            type Outcome<T>: $bound;
        }

        $(
            $(#[$doc])*
            #[derive(Debug)]
            pub enum $name {}

            impl $setting for $name {
                type Outcome<T> = $outcome;
            }
        )+

        mod sealed {
            pub trait Sealed {}
            $(impl Sealed for super::$name {})+
        }
    };
}

mod claim;

use crate::backends::HandlerConnection;
use crate::classify;
use crate::error::Error;
use crate::error::HasDieselError;
#[cfg(feature = "async")]
pub use crate::runtime::asynchronous::AsyncBody;
use crate::runtime::call::Call;
use crate::runtime::stored::{Remembered, Store};
use crate::spec::HandlerSpec;
#[cfg(feature = "async")]
pub use claim::claim_once_async;
pub use claim::{ClaimHandler, OnExpired, ReportExpired, TakeOver, claim_once};
use inbox_core::Isolation;

/// A handler's settings: its consumer name and the attribute's other options. Build it once,
/// in a `static` — the runtime keeps a reference to it while it runs:
///
/// ```
/// use std::sync::LazyLock;
/// use inbox_diesel::handler::Handler;
///
/// static CREDIT: LazyLock<Handler> =
///     LazyLock::new(|| Handler::new("credit").expect("a valid consumer name").retries(5));
/// ```
///
/// `L` says what a delivery does when another holds the message's marker, and so which
/// outcome type [`run_once`] returns: [`Wait`] (the default) returns [`Outcome`](crate::Outcome),
/// [`AnswerInFlight`] ([`Handler::in_flight_when_locked`]) returns
/// [`InFlightOutcome`](crate::InFlightOutcome).
#[derive(Debug)]
pub struct Handler<L: OnLocked = Wait> {
    spec: HandlerSpec,
    on_locked: PhantomData<L>,
}

/// One handler's settings as the start of another's: `CREDIT.clone().retries(5)`.
impl<L: OnLocked> Clone for Handler<L> {
    fn clone(&self) -> Self {
        Handler {
            spec: self.spec.clone(),
            on_locked: PhantomData,
        }
    }
}

settings! {
    /// What a delivery does when another one holds the message's marker, uncommitted: the type
    /// parameter of [`Handler`], which picks the outcome type of [`run_once`]. Sealed.
    OnLocked: HandlerOutcome<T>;
    /// `on_locked = "wait"`: wait for the other delivery's outcome; [`run_once`] returns
    /// [`Outcome`](crate::Outcome).
    Wait => inbox_core::Outcome<T>;
    /// `on_locked = "in_flight"`: answer `InFlight` at once; [`run_once`] returns
    /// [`InFlightOutcome`](crate::InFlightOutcome).
    AnswerInFlight => inbox_core::InFlightOutcome<T>;
}

impl Handler {
    /// A handler of consumer `consumer`, with the attribute's defaults: the default inbox
    /// table, 3 retries, the server's isolation level.
    ///
    /// # Errors
    /// The rules of `#[idempotent(consumer = …)]`, checked here at run time.
    pub fn new(consumer: impl Into<String>) -> Result<Self, ConsumerError> {
        Ok(Self {
            spec: HandlerSpec {
                consumer: inbox_core::Consumer::new(consumer.into())?,
                schema: InboxSchema::DEFAULT,
                retry: inbox_core::RetryPolicy::default(),
                isolation: Isolation::ServerDefault,
                sqlite_busy_timeout_ms: HandlerSpec::SQLITE_BUSY_TIMEOUT_MS,
                precheck: false,
                idle_in_transaction_ms: HandlerSpec::IDLE_IN_TRANSACTION_MS,
                in_flight_when_locked: false,
            },
            on_locked: PhantomData,
        })
    }

    /// `on_locked = "in_flight"`: a delivery that finds another one holding the message's
    /// marker, uncommitted, answers `InFlight` at once instead of waiting for it (PostgreSQL,
    /// MySQL, MariaDB), so [`run_once`] returns [`InFlightOutcome`](crate::InFlightOutcome).
    pub fn in_flight_when_locked(self) -> Handler<AnswerInFlight> {
        Handler {
            spec: HandlerSpec {
                in_flight_when_locked: true,
                ..self.spec
            },
            on_locked: PhantomData,
        }
    }
}

impl<L: OnLocked> Handler<L> {
    /// Retries of transient failures, each in a fresh transaction (`retries = n`).
    pub fn retries(mut self, retries: u32) -> Self {
        self.spec.retry = inbox_core::RetryPolicy::new(retries);
        self
    }

    /// The inbox table and its unique index (`table = …, constraint = …`).
    pub fn schema(mut self, schema: InboxSchema) -> Self {
        self.spec.schema = schema;
        self
    }

    /// The transaction's isolation level (`isolation = …`).
    pub fn isolation(mut self, isolation: Isolation) -> Self {
        self.spec.isolation = isolation;
        self
    }

    /// How long a SQLite handler waits for another writer (`busy_timeout_ms = …`), at most
    /// `i32::MAX` milliseconds.
    pub fn sqlite_busy_timeout_ms(mut self, ms: u32) -> Self {
        self.spec.sqlite_busy_timeout_ms = ms.min(i32::MAX as u32);
        self
    }

    /// PostgreSQL: how long the handler's transaction may sit idle before the server ends the
    /// session (`idle_in_transaction_ms = …`); 0 for no bound.
    pub fn idle_in_transaction_ms(mut self, ms: u32) -> Self {
        self.spec.idle_in_transaction_ms = ms.min(i32::MAX as u32);
        self
    }

    /// The consumer name.
    pub fn consumer(&self) -> &str {
        self.spec.consumer.as_str()
    }
}

/// A body's value, from a closure checked by [`guarded!`](crate::guarded): the function API
/// takes bodies that return it, and it has no public constructor — the macro's expansion
/// builds it through `inbox_diesel::__private`, which is not an API — so a closure written
/// without the guard is refused by the type checker. (Code that names `__private`, or
/// wraps a guarded closure in one of its own, is past what the types can stop.)
#[derive(Debug)]
#[must_use]
pub struct Checked<R>(R);

impl<R> Checked<R> {
    fn into_inner(self) -> R {
        self.0
    }
}

/// What `guarded!`'s expansion wraps a body's value in. Not a public API.
#[doc(hidden)]
#[inline(always)]
pub fn checked<R>(value: R) -> Checked<R> {
    Checked(value)
}

/// `guarded!`'s expansion of a sync body: the body, in a closure called at once. Not a
/// public API.
#[doc(hidden)]
#[inline(always)]
pub fn checked_call<R>(body: impl FnOnce() -> R) -> Checked<R> {
    Checked(body())
}

/// `guarded!`'s expansion of an async body: the body, in an async block awaited at once.
/// Not a public API.
#[doc(hidden)]
pub async fn checked_future<R, F: std::future::Future<Output = R>>(body: F) -> Checked<R> {
    Checked(body.await)
}

/// How the body's error is read for retries: through [`HasDieselError`].
/// How a body's result is classed for retries, as the runtime asks it ([`error_class`]).
trait Probe<T, E>: Fn(&mut Result<T, E>, u32, Option<ErrorClass>) -> Option<ErrorClass> {}

impl<T, E, F> Probe<T, E> for F where
    F: Fn(&mut Result<T, E>, u32, Option<ErrorClass>) -> Option<ErrorClass>
{
}

/// One call of a function-API handler as the runtime takes it: its key, its body, what its
/// marker keeps, its failures classified for retries ([`error_class`]) and the inbox's error
/// as `E`.
fn call<L, K, T, E, B>(
    handler: &'static Handler<L>,
    key: &K,
    body: B,
    remembered: Remembered<T>,
) -> Call<L::Outcome<T>, T, E, B, impl Probe<T, E>>
where
    L: OnLocked,
    K: ToMessageKey + ?Sized,
    E: From<Error> + HasDieselError,
{
    let spec = &handler.spec;
    Call::new(spec, key, body, error_class(&spec.schema), remembered)
}

/// A sync body of the function API, its value unwrapped from its [`Checked`].
fn unchecked<C, R>(mut body: impl FnMut(&mut C) -> Checked<R>) -> impl FnMut(&mut C) -> R {
    move |tx| body(tx).into_inner()
}

fn error_class<T, E: HasDieselError>(
    schema: &InboxSchema,
) -> impl Fn(&mut Result<T, E>, u32, Option<ErrorClass>) -> Option<ErrorClass> + '_ {
    move |result, attempts, decided| {
        let error = result.as_mut().err()?;
        error.record_attempts(attempts);
        if let Some(class) = decided {
            error.record_class(class, attempts);
        }
        Some(
            error
                .diesel_error()
                .map_or(ErrorClass::Other, |e| classify(e, schema)),
        )
    }
}

/// Runs `body` once per message key and consumer, on a sync connection: what a
/// `#[idempotent]` `fn` does. The body is a closure written in [`guarded!`](crate::guarded),
/// given the transaction.
///
/// The body's error type says where its diesel error is ([`HasDieselError`]; implemented for
/// diesel's error, the inbox's, and `anyhow::Error` with the feature `anyhow`), so that a
/// transient failure in it is retried; it takes the inbox's own failures through `From`.
///
/// ```
/// use std::sync::LazyLock;
/// use diesel::connection::SimpleConnection;
/// use diesel::prelude::*;
/// use inbox_diesel::handler::{Handler, run_once};
/// use inbox_diesel::{InboxSchema, Outcome, guarded};
///
/// static CREDIT: LazyLock<Handler> = LazyLock::new(|| Handler::new("credit").unwrap());
///
/// /// An activity handler as a trait method, without a connection parameter of its own.
/// trait Activity {
///     fn id(&self) -> &str;
///     fn apply(&self, conn: &mut SqliteConnection) -> QueryResult<()>;
/// }
///
/// struct Like(String);
///
/// impl Activity for Like {
///     fn id(&self) -> &str {
///         &self.0
///     }
///     fn apply(&self, conn: &mut SqliteConnection) -> QueryResult<()> {
///         conn.batch_execute("UPDATE posts SET likes = likes + 1")
///     }
/// }
///
/// fn receive(conn: &mut SqliteConnection, activity: &dyn Activity) -> QueryResult<Outcome<()>> {
///     run_once(conn, &CREDIT, activity.id(), guarded!(|tx| activity.apply(tx)))
/// }
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// conn.batch_execute(&inbox_diesel::schema::sqlite::create_table_sql(&InboxSchema::DEFAULT))?;
/// conn.batch_execute("CREATE TABLE posts (likes INTEGER); INSERT INTO posts VALUES (0);")?;
/// let like = Like("https://example.social/likes/1".into());
/// assert!(receive(&mut conn, &like)?.is_processed());
/// assert!(receive(&mut conn, &like)?.is_duplicate());
/// # Ok(())
/// # }
/// ```
///
/// # Errors
/// The body's error, or the inbox's (through `E: From<Error>`).
pub fn run_once<C, K, T, E, B, L: OnLocked>(
    conn: &mut C,
    handler: &'static Handler<L>,
    key: &K,
    body: B,
) -> Result<L::Outcome<T>, E>
where
    C: HandlerConnection,
    K: ToMessageKey + ?Sized,
    B: FnMut(&mut C) -> Checked<Result<T, E>>,
    E: From<Error> + HasDieselError,
{
    crate::runtime::sync::run(
        conn,
        call(handler, key, unchecked(body), Remembered::nothing()),
    )
}

/// [`run_once`] for a body whose `Ok` value is kept with the marker, in the same transaction
/// (`#[idempotent(store_result = true)]`): a later delivery of the message gets it back in
/// `Duplicate { stored: Some(value), .. }` — the original answer to a retried request. The
/// value is stored as JSON (serde) in the table's `result` column, which the handler
/// requires (`inbox-diesel migration generate --with result`); at most
/// [`MAX_STORED_RESULT_BYTES`](crate::MAX_STORED_RESULT_BYTES) of it. With a
/// `fingerprint` (`fingerprint = …`), the key's marker keeps the request's digest, and a
/// delivery of the key with another one is [`Error::KeyReused`]; that needs the table's
/// `fingerprint` column.
///
/// ```
/// use std::sync::LazyLock;
/// use diesel::connection::SimpleConnection;
/// use diesel::prelude::*;
/// use inbox_diesel::handler::{Handler, run_once_stored};
/// use inbox_diesel::{InboxSchema, Outcome, guarded};
///
/// static PAY: LazyLock<Handler> = LazyLock::new(|| Handler::new("payments").unwrap());
///
/// fn pay(conn: &mut SqliteConnection, request: &str, cents: i64) -> QueryResult<Outcome<i64>> {
///     run_once_stored(conn, &PAY, request, None, guarded!(|tx| {
///         diesel::sql_query("INSERT INTO payments (cents) VALUES (?)")
///             .bind::<diesel::sql_types::BigInt, _>(cents)
///             .execute(tx)?;
///         // The payment's id: the answer a retry of the request gets again.
///         diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>("last_insert_rowid()"))
///             .get_result(tx)
///     }))
/// }
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// let schema = inbox_diesel::schema::Backend::Sqlite;
/// conn.batch_execute(&schema.create_table_with_result_sql(&InboxSchema::DEFAULT))?;
/// conn.batch_execute("CREATE TABLE payments (id INTEGER PRIMARY KEY, cents BIGINT)")?;
/// assert_eq!(pay(&mut conn, "req-1", 500)?, Outcome::Processed(1));
/// // The retry does not pay again, and answers with the first payment's id.
/// assert!(matches!(pay(&mut conn, "req-1", 500)?, Outcome::Duplicate { stored: Some(1), .. }));
/// # Ok(())
/// # }
/// ```
///
/// # Errors
/// As [`run_once`]; [`Error::StoredResult`] when the value cannot be stored or a stored one
/// does not read as `T`; [`Error::KeyReused`] for another request under the key;
/// [`Error::Schema`] when the table has no `result` column (or, with a fingerprint, no
/// `fingerprint` column).
pub fn run_once_stored<C, K, T, E, B, L: OnLocked>(
    conn: &mut C,
    handler: &'static Handler<L>,
    key: &K,
    fingerprint: Option<crate::value::Fingerprint>,
    body: B,
) -> Result<L::Outcome<T>, E>
where
    C: HandlerConnection,
    K: ToMessageKey + ?Sized,
    T: serde::Serialize + serde::de::DeserializeOwned,
    B: FnMut(&mut C) -> Checked<Result<T, E>>,
    E: From<Error> + HasDieselError,
{
    let remembered = Remembered::new(Some(Store::json()), fingerprint);
    crate::runtime::sync::run(conn, call(handler, key, unchecked(body), remembered))
}

/// Runs `body` once per message key and consumer, on a diesel-async connection: what a
/// `#[idempotent]` `async fn` does. The body is an async closure written in
/// [`guarded!`](crate::guarded) (`guarded!(async |tx| …)`), given the transaction; like the
/// attribute's, it may run more than once (retries), so it is cloned per attempt.
///
/// # Errors
/// The body's error, or the inbox's (through `E: From<Error>`).
#[cfg(feature = "async")]
pub async fn run_once_async<C, K, T, E, B, L: OnLocked>(
    conn: &mut C,
    handler: &'static Handler<L>,
    key: &K,
    body: B,
) -> Result<L::Outcome<T>, E>
where
    C: crate::backends::AsyncInboxConnection,
    K: ToMessageKey + ?Sized,
    B: Clone + for<'c> AsyncBody<&'c mut C, Checked<Result<T, E>>, Fut: Send>,
    E: From<Error> + HasDieselError,
{
    let call = call(handler, key, CheckedBody(body), Remembered::nothing());
    crate::runtime::asynchronous::run_async_body(conn, call).await
}

/// [`run_once_stored`] on a diesel-async connection.
///
/// # Errors
/// As [`run_once_stored`].
#[cfg(feature = "async")]
pub async fn run_once_stored_async<C, K, T, E, B, L: OnLocked>(
    conn: &mut C,
    handler: &'static Handler<L>,
    key: &K,
    fingerprint: Option<crate::value::Fingerprint>,
    body: B,
) -> Result<L::Outcome<T>, E>
where
    C: crate::backends::AsyncInboxConnection,
    K: ToMessageKey + ?Sized,
    T: serde::Serialize + serde::de::DeserializeOwned,
    B: Clone + for<'c> AsyncBody<&'c mut C, Checked<Result<T, E>>, Fut: Send>,
    E: From<Error> + HasDieselError,
{
    let remembered = Remembered::new(Some(Store::json()), fingerprint);
    let call = call(handler, key, CheckedBody(body), remembered);
    crate::runtime::asynchronous::run_async_body(conn, call).await
}

impl HasDieselError for diesel::result::Error {
    fn diesel_error(&self) -> Option<&diesel::result::Error> {
        Some(self)
    }

    /// Carried inside the diesel error as the inbox's error of that class
    /// (`From<Error> for diesel::result::Error`), which [`classify`] reads.
    fn record_class(&mut self, class: ErrorClass, attempts: u32) {
        let source = std::mem::replace(self, diesel::result::Error::NotFound);
        *self = Error::Database {
            class,
            attempts,
            source,
        }
        .into();
    }
}

impl HasDieselError for Error {
    fn diesel_error(&self) -> Option<&diesel::result::Error> {
        match self {
            Error::Database { source, .. } => Some(source),
            _ => None,
        }
    }

    fn record_attempts(&mut self, made: u32) {
        if let Error::Database { attempts, .. } | Error::EffectNotRecorded { attempts, .. } = self {
            *attempts = made;
        }
    }

    fn record_class(&mut self, decided: ErrorClass, _attempts: u32) {
        if let Error::Database { class, .. } = self {
            *class = decided;
        }
    }
}

/// An async body checked by `guarded!`: each attempt runs a clone of it, as the attribute's
/// expansion does, and unwraps its value.
#[cfg(feature = "async")]
struct CheckedBody<B>(B);

#[cfg(feature = "async")]
impl<C, R, B> crate::runtime::steps::Body<C, R> for CheckedBody<B>
where
    B: Clone + for<'c> AsyncBody<&'c mut C, Checked<R>, Fut: Send>,
{
    async fn call(&mut self, conn: &mut C) -> R {
        (self.0.clone())(conn).await.into_inner()
    }
}
