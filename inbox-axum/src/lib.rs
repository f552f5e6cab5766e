//! HTTP `Idempotency-Key` for axum 0.8, on [`inbox_diesel`]: a request's Diesel writes, its
//! key and the response it answered with commit in **one database transaction**.
//!
//! A client that retries a `POST` — after a timeout, a dropped connection, a 502 from a proxy
//! — sends the same `Idempotency-Key` (IETF httpapi,
//! `draft-ietf-httpapi-idempotency-key-header`). The route's handler extracts
//! [`Idempotent<T>`] and runs its work through [`Idempotent::run`]:
//!
//! - the first request runs the body, in a transaction that also inserts the inbox marker
//!   for the key (scoped by route and [`Principal`]), the request's fingerprint and the
//!   [`Reply`] the body returns; the client gets that reply;
//! - a retry after the commit gets the stored reply again, with `Idempotent-Replayed: true`,
//!   and the body does not run;
//! - a request with the same key while the first is uncommitted gets 409 at once (on
//!   PostgreSQL and MySQL/MariaDB, with a handler built with `in_flight_when_locked()`;
//!   SQLite runs one writer at a time, so there the second request waits and replays);
//! - the same key on the same route (method and path pattern) with another path, query or
//!   body gets 422 once the first has committed
//!   (while it is in flight, 409 like any request under the key: its fingerprint is not
//!   visible before its commit); a missing key 400; every refusal is an
//!   `application/problem+json` body ([`Problem`]).
//!
//! Keys are scoped by the route and the [`Principal`] the application's authentication puts
//! in the request's extensions; a route without one is refused, so that sharing keys between
//! clients is a choice ([`Principal::shared`]), not an accident.
//!
//! Nothing is kept beside the transaction — no cache, no second store — so a crash at any
//! point leaves the request either committed with its reply, which a retry replays, or not
//! at all, which a retry runs once. A duplicate is recognised by the inbox's own unique
//! index, as every `#[idempotent]` handler's is.
//!
//! The body is a closure written in [`guarded!`](inbox_diesel::guarded): the compile-time guard
//! of `#[idempotent]` refuses a connection or pool other than its transaction handed on in
//! it, and the run-time tripwire (`inbox_diesel::tripwire`) a pool checkout in the helpers it
//! calls.
//!
//! ```
//! use std::sync::LazyLock;
//!
//! use axum::Router;
//! use axum::extract::State;
//! use axum::http::StatusCode;
//! use axum::response::Response;
//! use axum::routing::post;
//! use diesel::prelude::*;
//! use diesel_async::RunQueryDsl;
//! use diesel_async::pooled_connection::AsyncDieselConnectionManager;
//! use diesel_async::pooled_connection::bb8::Pool;
//! use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
//! use inbox_axum::{Idempotent, Reply};
//! use inbox_diesel::guarded;
//! use inbox_diesel::handler::Handler;
//!
//! type Conn = SyncConnectionWrapper<SqliteConnection>;
//!
//! diesel::table! {
//!     payments (id) {
//!         id -> Integer,
//!         cents -> BigInt,
//!     }
//! }
//!
//! #[derive(serde::Deserialize)]
//! struct NewPayment {
//!     cents: i64,
//! }
//!
//! static PAYMENTS: LazyLock<Handler> =
//!     LazyLock::new(|| Handler::new("payments").expect("a valid consumer name"));
//!
//! async fn create(State(pool): State<Pool<Conn>>, request: Idempotent<NewPayment>) -> Response {
//!     let mut conn = match pool.get().await {
//!         Ok(conn) => conn,
//!         Err(e) => return inbox_axum::unavailable(e),
//!     };
//!     let cents = request.payload.cents;
//!     request
//!         .run(&mut *conn, &PAYMENTS, guarded!(async |tx: &mut Conn| {
//!             let id: i32 = diesel::insert_into(payments::table)
//!                 .values(payments::cents.eq(cents))
//!                 .returning(payments::id)
//!                 .get_result(tx)
//!                 .await?;
//!             Reply::json(StatusCode::CREATED, &serde_json::json!({ "id": id, "cents": cents }))
//!         }))
//!         .await
//! }
//!
//! fn router(pool: Pool<Conn>) -> Router {
//!     Router::new()
//!         .route("/payments", post(create))
//!         // No authentication here: every client's keys are in one scope, by choice.
//!         .layer(axum::Extension(inbox_axum::Principal::shared()))
//!         .with_state(pool)
//! }
//! # fn main() {}
//! ```
//!
//! An `#[idempotent]` handler the body calls on its transaction (a message applied by the
//! request) joins it when declared `transaction = "caller_or_own"`; a handler of the default
//! kind refuses to run inside it (`CalledInsideTransaction`, a 500).
//!
//! A synchronous diesel application runs the same with [`Idempotent::run_blocking`], inside
//! `spawn_blocking` (and turns the default feature `async` off).
//!
//! A route of another framework — actix-web, Rocket, warp, a plain `hyper` service — builds
//! the request with [`Incoming`] from what its framework hands over, with the same checks,
//! and sends the same answers.
//!
//! The inbox table needs the optional `result` and `fingerprint` columns:
//! `inbox-diesel migration generate --with result --with fingerprint` (or
//! [`inbox_diesel::schema::Backend::create_table_with_sql`]). Purge and
//! [`inbox_diesel::Retention`] remove stored replies with their keys: keep keys at least as
//! long as clients retry (Stripe keeps them 24 hours).

mod problem;
mod reply;
mod request;

use axum::http::HeaderValue;
use axum::http::header::HeaderName;
use axum::response::{IntoResponse, Response};
use inbox_diesel::StaleClaimOutcome;
use inbox_diesel::handler::{Checked, Handler, OnLocked};

pub use problem::{Error, Problem};
pub use reply::Reply;
pub use request::{
    Fingerprinting, IDEMPOTENCY_KEY, Idempotent, Incoming, MAX_KEY_LEN, MaybeIdempotent, Principal,
};

/// The header a replayed response carries: `Idempotent-Replayed: true` (Stripe's name for
/// it; the draft names none).
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// In the extensions of a response of [`Idempotent::run`] (never sent to the client): the
/// body ran in this call, and its work committed with the key. What follows a commit — a
/// job handed to a queue outside the database — goes where the response has it; a replay, a
/// refusal and a failure have none.
///
/// ```
/// use axum::response::{IntoResponse, Response};
///
/// fn after_commit(response: &Response) -> bool {
///     response.extensions().get::<inbox_axum::Processed>().is_some()
/// }
/// assert!(!after_commit(&"replayed".into_response()));
/// ```
///
/// A process that dies after the commit and before what follows leaves it undone, and the
/// client's retry is replayed: what must follow the commit at least once goes in the
/// transaction instead — a row the job runner reads, or the outbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Processed;

impl<T> Idempotent<T> {
    /// Runs `body` once for this request's key, in one transaction with the key, the
    /// request's fingerprint and the [`Reply`] it returns, and answers:
    ///
    /// | the key | the answer |
    /// |---|---|
    /// | new | the body's reply, committed with its work |
    /// | committed, same request | the stored reply, with `Idempotent-Replayed: true` |
    /// | committed, another request | 422 `idempotency-key-reused` |
    /// | in flight, any request (`Handler<AnswerInFlight>`) | 409 `request-in-flight`, `Retry-After: 1` |
    /// | the body fails | nothing committed; 500, or 503 for a database that was busy or gone; [`Error::Respond`]'s own answer |
    ///
    /// `handler` names the consumer the keys are stored under (one per API, or per
    /// resource) and its options: `Handler::new("payments")?.in_flight_when_locked()` answers
    /// a concurrent request 409 at once instead of waiting for the first to commit. The
    /// body may run more than once — each transient failure is retried in a fresh
    /// transaction — and the reply of the attempt that commits is the one stored.
    ///
    /// On diesel-async (feature `async`, on by default); a synchronous diesel connection
    /// runs the same through [`run_blocking`](Self::run_blocking).
    #[cfg(feature = "async")]
    pub async fn run<C, L, B>(
        &self,
        conn: &mut C,
        handler: &'static Handler<L>,
        body: B,
    ) -> Response
    where
        C: inbox_diesel::AsyncInboxConnection,
        L: OnLocked,
        B: Clone
            + for<'c> inbox_diesel::handler::AsyncBody<
                &'c mut C,
                Checked<Result<Reply, Error>>,
                Fut: Send,
            >,
    {
        let key = match self.message_key() {
            Ok(key) => key,
            Err(refused) => return self.answer(handler, Err(refused)),
        };
        let outcome = inbox_diesel::handler::run_once_stored_async(
            conn,
            handler,
            &key,
            Some(self.fingerprint()),
            body,
        )
        .await;
        self.answer(handler, outcome.map(Into::into))
    }

    /// [`run`](Self::run) on a synchronous diesel connection (`PgConnection`,
    /// `MysqlConnection`, `SqliteConnection`, an r2d2 checkout): the same transaction, the
    /// same answers. It blocks while the transaction runs, so call it where blocking is
    /// allowed — inside `tokio::task::spawn_blocking`, with the connection checked out
    /// there:
    ///
    /// ```
    /// use std::sync::LazyLock;
    ///
    /// use axum::Router;
    /// use axum::extract::State;
    /// use axum::http::StatusCode;
    /// use axum::response::{IntoResponse, Response};
    /// use axum::routing::post;
    /// use diesel::prelude::*;
    /// use diesel::r2d2::{ConnectionManager, Pool};
    /// use inbox_axum::{Idempotent, Reply};
    /// use inbox_diesel::guarded;
    /// use inbox_diesel::handler::Handler;
    ///
    /// diesel::table! {
    ///     payments (id) {
    ///         id -> Integer,
    ///         cents -> BigInt,
    ///     }
    /// }
    ///
    /// #[derive(serde::Deserialize)]
    /// struct NewPayment {
    ///     cents: i64,
    /// }
    ///
    /// static PAYMENTS: LazyLock<Handler> =
    ///     LazyLock::new(|| Handler::new("payments").expect("a valid consumer name"));
    ///
    /// type DbPool = Pool<ConnectionManager<SqliteConnection>>;
    ///
    /// async fn create(State(pool): State<DbPool>, request: Idempotent<NewPayment>) -> Response {
    ///     tokio::task::spawn_blocking(move || {
    ///         let mut conn = match pool.get() {
    ///             Ok(conn) => conn,
    ///             Err(e) => return inbox_axum::unavailable(e),
    ///         };
    ///         let cents = request.payload.cents;
    ///         request.run_blocking(&mut *conn, &PAYMENTS, guarded!(|tx: &mut SqliteConnection| {
    ///             let id: i32 = diesel::insert_into(payments::table)
    ///                 .values(payments::cents.eq(cents))
    ///                 .returning(payments::id)
    ///                 .get_result(tx)?;
    ///             Reply::json(StatusCode::CREATED, &serde_json::json!({ "id": id, "cents": cents }))
    ///         }))
    ///     })
    ///     .await
    ///     // A panic in the task: the transaction rolled back, and a retry would panic again.
    ///     .unwrap_or_else(|e| inbox_axum::Error::internal(e).into_response())
    /// }
    ///
    /// fn router(pool: DbPool) -> Router {
    ///     Router::new()
    ///         .route("/payments", post(create))
    ///         .layer(axum::Extension(inbox_axum::Principal::shared()))
    ///         .with_state(pool)
    /// }
    /// # fn main() {}
    /// ```
    pub fn run_blocking<C, L, B>(
        &self,
        conn: &mut C,
        handler: &'static Handler<L>,
        body: B,
    ) -> Response
    where
        C: inbox_diesel::InboxConnection,
        L: OnLocked,
        B: FnMut(&mut C) -> Checked<Result<Reply, Error>>,
    {
        let key = match self.message_key() {
            Ok(key) => key,
            Err(refused) => return self.answer(handler, Err(refused)),
        };
        let outcome = inbox_diesel::handler::run_once_stored(
            conn,
            handler,
            &key,
            Some(self.fingerprint()),
            body,
        );
        self.answer(handler, outcome.map(Into::into))
    }

    /// The response to what the handler's run came to.
    fn answer<L: OnLocked>(
        &self,
        handler: &'static Handler<L>,
        outcome: Result<StaleClaimOutcome<Reply>, Error>,
    ) -> Response {
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(error) => {
                let problem = error.problem();
                if problem.status().is_server_error() {
                    tracing::error!(
                        route = self.route(),
                        consumer = handler.consumer(),
                        error = &error as &dyn std::error::Error,
                        "an idempotent request failed; nothing was committed"
                    );
                    inbox_diesel::telemetry::unseen(format_args!(
                        "an idempotent request to {} failed; nothing was committed: {}",
                        self.route(),
                        inbox_diesel::telemetry::chain(&error)
                    ));
                }
                return problem.into_response();
            }
        };
        match outcome {
            StaleClaimOutcome::Processed(reply) => {
                let mut response = reply.into_response();
                response.extensions_mut().insert(Processed);
                response
            }
            StaleClaimOutcome::Duplicate {
                stored: Some(reply),
                ..
            } => {
                let mut response = reply.into_response();
                response
                    .headers_mut()
                    .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
                response
            }
            StaleClaimOutcome::Duplicate { stored: None, .. } => Problem::new(
                axum::http::StatusCode::CONFLICT,
                "request-done-without-response",
                "a request with this Idempotency-Key was processed by a handler that keeps no \
                 response; it is not processed again",
            )
            .into_response(),
            // A claim-mode handler's outcomes; `run` is transaction mode, where the claim
            // and the work commit together, but the enum is the most general one.
            StaleClaimOutcome::InFlight { .. } | StaleClaimOutcome::StaleClaim { .. } => {
                Problem::new(
                    axum::http::StatusCode::CONFLICT,
                    "request-in-flight",
                    "a request with this Idempotency-Key is being processed; retry it later \
                     with the same key to get its response",
                )
                .into_response()
            }
        }
    }
}

/// The `http` crate (1.x) that inbox-axum's requests and answers are built on, as axum
/// re-exports it: a route of another framework names [`http::StatusCode`] for a [`Reply`]
/// through it, without a dependency on axum of its own.
pub use axum::http;

/// An answer taken apart for another framework (actix-web, Rocket, warp, a `hyper`
/// service): its status, its headers as names and bytes, and its body — the parts every
/// framework builds its own response from, whichever version of `http` it is on.
///
/// ```
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// use inbox_axum::{Answer, Incoming};
///
/// let refused = Incoming::new("POST", "/payments", "/payments")
///     .idempotent::<serde_json::Value>(b"{}")
///     .unwrap_err(); // no Idempotency-Key
/// let answer = Answer::of(refused).await?;
/// assert_eq!(answer.status, 400);
/// assert!(answer.headers.iter().any(|(name, value)| {
///     name == "content-type" && value.as_slice() == b"application/problem+json"
/// }));
/// # Ok(())
/// # }
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(example()).unwrap();
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Answer {
    /// The status code.
    pub status: u16,
    /// The headers, in order, a name as many times as it has values.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body.
    pub body: bytes::Bytes,
}

impl Answer {
    /// The parts of `response`: an answer of [`Idempotent::run`], a refusal of
    /// [`Incoming`] ([`Problem`]), [`unavailable`], or any other response.
    ///
    /// # Errors
    /// The body could not be read: never for inbox-axum's own answers, which are built in
    /// memory; a streaming body of the application's may fail.
    pub async fn of(response: impl IntoResponse) -> Result<Self, axum::Error> {
        let (parts, body) = response.into_response().into_parts();
        let body = axum::body::to_bytes(body, usize::MAX).await?;
        Ok(Answer {
            status: parts.status.as_u16(),
            headers: parts
                .headers
                .iter()
                .map(|(name, value)| (name.as_str().to_owned(), value.as_bytes().to_vec()))
                .collect(),
            body,
        })
    }
}

/// 503 `unavailable`, for a handler that could not get a connection (a pool timeout): the
/// request did not run, and a retry with the same key runs it once.
pub fn unavailable(error: impl std::fmt::Display) -> Response {
    tracing::warn!(%error, "no database connection for an idempotent request");
    Problem::new(
        axum::http::StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        "no database connection was free; the request did not run — retry it with the same key",
    )
    .into_response()
}
