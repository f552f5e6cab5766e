//! Claim mode through the function API: what `#[idempotent(mode = "claim")]` does, for a
//! side effect outside the database in code that cannot carry the attribute — a job
//! runner's trait method whose pool lives in its context, a callback chosen at run time.

use std::marker::PhantomData;
use std::time::Duration;

use inbox_core::{ConsumerError, InboxSchema, ToMessageKey};

use super::Checked;
use crate::backends::HandlerConnection;
use crate::error::Error;
use crate::guard::NoConnection;
use crate::pool::{ClaimPool, ClaimTarget};
use crate::runtime::call::Call;
use crate::runtime::claim::ClaimSpec;
use crate::runtime::stored::Remembered;
use crate::spec::HandlerSpec;

/// What a claim-mode handler's options say (`#[idempotent(mode = "claim", …)]`), for
/// [`claim_once`] and `claim_once_async`: its consumer, its table, its lease, and what a
/// delivery does with a claim whose lease ended without completion.
///
/// `X` is that last choice, and so the outcome type: [`TakeOver`] (the default, `on_expired
/// = "take_over"`) runs the side effect again and returns
/// [`InFlightOutcome`](crate::InFlightOutcome); [`ReportExpired`]
/// ([`ClaimHandler::report_expired`], `on_expired = "report"`) returns
/// [`StaleClaimOutcome`](crate::StaleClaimOutcome) instead.
#[derive(Debug)]
pub struct ClaimHandler<X: OnExpired = TakeOver> {
    spec: HandlerSpec,
    claim: ClaimSpec,
    on_expired: PhantomData<X>,
}

impl<X: OnExpired> Clone for ClaimHandler<X> {
    fn clone(&self) -> Self {
        ClaimHandler {
            spec: self.spec.clone(),
            claim: self.claim,
            on_expired: PhantomData,
        }
    }
}

settings! {
    /// What a delivery does with a claim whose lease ended without completion: the type
    /// parameter of [`ClaimHandler`], which picks the outcome type. Sealed.
    OnExpired: inbox_core::HandlerOutcome<T, InFlightWitness = ()>;
    /// `on_expired = "take_over"`: run the side effect again; returns
    /// [`InFlightOutcome`](crate::InFlightOutcome).
    TakeOver => inbox_core::InFlightOutcome<T>;
    /// `on_expired = "report"`: leave the claim for reconciliation; returns
    /// [`StaleClaimOutcome`](crate::StaleClaimOutcome).
    ReportExpired => inbox_core::StaleClaimOutcome<T>;
}

impl ClaimHandler {
    /// A claim-mode handler of consumer `consumer`, with the attribute's defaults: the
    /// default inbox table, a lease of one minute, an expired claim taken over.
    ///
    /// # Errors
    /// The rules of `#[idempotent(consumer = …)]`, checked here at run time.
    pub fn new(consumer: impl Into<String>) -> Result<Self, ConsumerError> {
        Ok(Self {
            // A transaction-mode handler's settings, whose transaction settings claim mode
            // does not use.
            spec: super::Handler::new(consumer)?.spec,
            claim: ClaimSpec {
                lease_ms: ClaimSpec::DEFAULT_LEASE_MS,
            },
            on_expired: PhantomData,
        })
    }

    /// `on_expired = "report"`: a delivery that finds a claim whose lease ended without
    /// completion returns [`StaleClaim`](crate::StaleClaimOutcome::StaleClaim) instead of
    /// running the side effect again (e-mail, payments: where a second run is worse than
    /// a reconciliation).
    pub fn report_expired(self) -> ClaimHandler<ReportExpired> {
        ClaimHandler {
            spec: self.spec,
            claim: self.claim,
            on_expired: PhantomData,
        }
    }
}

impl<X: OnExpired> ClaimHandler<X> {
    /// How long a claim stays live (`lease_ms`): above the side effect's longest run. One
    /// outside 100 ms to 30 days is [`Error::InvalidLease`] at each call, before any SQL.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.claim.lease_ms = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX);
        self
    }

    /// The inbox table and its unique index (`schema = …`).
    pub fn schema(mut self, schema: InboxSchema) -> Self {
        self.spec.schema = schema;
        self
    }

    /// Retries of transient failures of the claim's own statements (`retries = n`); the
    /// body is never retried here — the broker's redelivery retries it.
    pub fn retries(mut self, retries: u32) -> Self {
        self.spec.retry = inbox_core::RetryPolicy::new(retries);
        self
    }

    /// The handler's consumer.
    pub fn consumer(&self) -> &str {
        self.spec.consumer.as_str()
    }
}

/// Runs `body` in claim mode once per message key and consumer, on a sync connection
/// (`&mut conn`) or a pool (`&pool`, whose claim and stamp each take a connection of their
/// own while the body holds none): what a `#[idempotent(mode = "claim")]` `fn` does. The
/// claim commits before the body runs, the stamp after it returns `Ok`; a body's `Err`
/// releases the claim for a redelivery. The body is a closure without parameters written
/// in [`guarded!`](crate::guarded) — it has no connection, and a value it hands on that is
/// one, or a pool, fails to compile — and it runs at most once per call: it may consume
/// what it captured.
///
/// ```
/// use std::sync::LazyLock;
/// use std::time::Duration;
/// use diesel::connection::SimpleConnection;
/// use diesel::prelude::*;
/// use inbox_diesel::handler::{ClaimHandler, claim_once};
/// use inbox_diesel::{InboxSchema, guarded};
///
/// static CONFIRMATION: LazyLock<ClaimHandler> = LazyLock::new(|| {
///     ClaimHandler::new("confirmation-mail").unwrap().lease(Duration::from_secs(30))
/// });
///
/// /// A job of a job runner: its pool lives in the runner's context.
/// struct Context {
///     sent: std::cell::RefCell<Vec<String>>,
/// }
///
/// trait Job {
///     fn run(&self, ctx: &Context, conn: &mut SqliteConnection) -> Result<(), inbox_diesel::Error>;
/// }
///
/// struct SendConfirmation {
///     user_id: i64,
///     token: String,
/// }
///
/// impl Job for SendConfirmation {
///     fn run(&self, ctx: &Context, conn: &mut SqliteConnection) -> Result<(), inbox_diesel::Error> {
///         let key = (self.user_id, self.token.as_str());
///         let sent = claim_once(conn, &CONFIRMATION, &key, guarded!(|| {
///             ctx.sent.borrow_mut().push(format!("mail to user {}", self.user_id));
///             Ok::<_, inbox_diesel::Error>(())
///         }))?;
///         if sent.is_in_flight() {
///             // Another runner holds the claim: run the job again later.
///         }
///         Ok(())
///     }
/// }
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// conn.batch_execute(&inbox_diesel::schema::sqlite::create_table_sql(&InboxSchema::DEFAULT))?;
/// let ctx = Context { sent: Default::default() };
/// let job = SendConfirmation { user_id: 7, token: "t-1".into() };
/// job.run(&ctx, &mut conn)?;
/// job.run(&ctx, &mut conn)?; // run twice: mailed once
/// assert_eq!(ctx.sent.borrow().len(), 1);
/// # Ok(())
/// # }
/// ```
///
/// # Errors
/// The body's error (its claim released), or the inbox's (through `E: From<Error>`):
/// [`Error::EffectNotRecorded`] when the body ran but its stamp could not be written.
pub fn claim_once<H, K, T, E, B, X>(
    conn: H,
    handler: &'static ClaimHandler<X>,
    key: &K,
    body: B,
) -> Result<X::Outcome<T>, E>
where
    H: ClaimTarget,
    H::Connection: HandlerConnection,
    H::Pool: ClaimPool<Connection = H::Connection>,
    K: ToMessageKey + ?Sized,
    B: FnOnce() -> Checked<Result<T, E>>,
    E: From<Error>,
    X: OnExpired,
{
    let body = move |_: &mut NoConnection| body().into_inner();
    let call = Call::new(&handler.spec, key, body, (), Remembered::nothing());
    crate::runtime::sync::run_claim(conn, handler.claim, call)
}

/// [`claim_once`] on a diesel-async connection or pool; the body is an async closure
/// without parameters, `guarded!(async || …)`.
///
/// # Errors
/// As [`claim_once`].
#[cfg(feature = "async")]
pub async fn claim_once_async<H, K, T, E, B, F, X>(
    mut conn: H,
    handler: &'static ClaimHandler<X>,
    key: &K,
    body: B,
) -> Result<X::Outcome<T>, E>
where
    H: ClaimTarget,
    H::Connection: crate::backends::AsyncInboxConnection,
    H::Pool: crate::pool::AsyncClaimPool<Connection = H::Connection>,
    K: ToMessageKey + ?Sized,
    B: FnOnce() -> F,
    F: Future<Output = Checked<Result<T, E>>>,
    E: From<Error>,
    X: OnExpired,
{
    let call = Call::new(
        &handler.spec,
        key,
        Once(Some(body)),
        (),
        Remembered::nothing(),
    );
    crate::runtime::asynchronous::run_claim_on(conn.__inbox_claim_target(), handler.claim, call)
        .await
}

/// A claim-mode body of the function API: given no connection, called once.
#[cfg(feature = "async")]
struct Once<B>(Option<B>);

#[cfg(feature = "async")]
impl<C, R, B, F> crate::runtime::steps::Body<C, R> for Once<B>
where
    B: FnOnce() -> F,
    F: Future<Output = Checked<R>>,
{
    async fn call(&mut self, _: &mut C) -> R {
        let body = self.0.take().expect("a claim-mode body runs once");
        body().await.into_inner()
    }
}
