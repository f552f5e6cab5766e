//! One handler call as the runtime takes it ([`Call`]).

use std::future::Future;
use std::marker::PhantomData;

use inbox_core::{HandlerOutcome, KeyError, MessageKey, ToMessageKey};
use tracing::Instrument;

use crate::error::Error;
use crate::guard::NoConnection;
use crate::runtime::steps::Body;
use crate::runtime::stored::Remembered;
use crate::runtime::transaction::Handling;
use crate::spec::HandlerSpec;
use crate::telemetry::Run;

/// A call whose key was checked: the key, and how the runtime handles its message.
pub(crate) type Keyed<T, E, B, P, W> = (MessageKey, Handling<T, E, B, P, W>);

/// One message's call of a handler: what the runtime needs besides the connection, as the
/// expansion of `#[idempotent]` and the function API write it.
pub struct Call<A, T, E, B, P = ()> {
    /// The outcome type the caller answers in (`Outcome`, `InFlightOutcome`, …).
    pub outcome: PhantomData<A>,
    /// The handler's settings.
    pub spec: &'static HandlerSpec,
    /// The message's key, or why it has none.
    pub key: Result<MessageKey, KeyError>,
    /// The handler's body.
    pub body: B,
    /// How the body's error is classified for retries (transaction mode); `()` in claim mode,
    /// whose body is not retried.
    pub probe: P,
    /// What the marker keeps: the stored result's codec and the request's fingerprint.
    pub remembered: Remembered<T>,
    /// The inbox's error as the handler's error type.
    pub inbox_error: fn(Error) -> E,
}

impl<A, T, E: From<Error>, B, P> Call<A, T, E, B, P> {
    /// A call of the function API: `key`'s message, the inbox's error as `E` through `From`.
    pub(crate) fn new<K: ToMessageKey + ?Sized>(
        spec: &'static HandlerSpec,
        key: &K,
        body: B,
        probe: P,
        remembered: Remembered<T>,
    ) -> Self {
        Call {
            outcome: PhantomData,
            spec,
            key: key.to_message_key(),
            body,
            probe,
            remembered,
            inbox_error: E::from,
        }
    }
}

impl<A, T, E, B, P> Call<A, T, E, B, P> {
    /// The same call with its body wrapped as the runtime runs it.
    pub(crate) fn with_body<W>(self, wrap: impl FnOnce(B) -> W) -> Call<A, T, E, W, P> {
        Call {
            outcome: self.outcome,
            spec: self.spec,
            key: self.key,
            body: wrap(self.body),
            probe: self.probe,
            remembered: self.remembered,
            inbox_error: self.inbox_error,
        }
    }

    /// The call's key, checked — an invalid one is the caller's error, and a run that never
    /// started — and how the runtime handles the message: `in_flight`, what a delivery
    /// that finds another's claim in flight answers (transaction mode's `on_locked`).
    pub(crate) fn keyed<W>(self, in_flight: Option<W>) -> Result<Keyed<T, E, B, P, W>, E> {
        let key = checked_key(self.spec, self.key, self.inbox_error)?;
        let handling = Handling {
            spec: self.spec,
            body: self.body,
            probe: self.probe,
            in_flight,
            remembered: self.remembered,
            inbox_error: self.inbox_error,
        };
        Ok((key, handling))
    }
}

/// A message's key (or a batch's keys), checked: an invalid one is the caller's error, in
/// its error type, and a run that never started.
pub(crate) fn checked_key<K, E>(
    spec: &'static HandlerSpec,
    key: Result<K, KeyError>,
    inbox_error: fn(Error) -> E,
) -> Result<K, E> {
    key.map_err(|e| Run::invalid_key(spec, inbox_error(Error::InvalidKey(e))))
}

/// A claim-mode body as the runtime calls it: given no connection, whatever the connection
/// it is asked with.
pub(crate) struct WithoutConnection<B>(pub(crate) B);

impl<C, R, B: Body<NoConnection, R>> Body<C, R> for WithoutConnection<B> {
    async fn call(&mut self, _: &mut C) -> R {
        self.0.call(&mut NoConnection::new()).await
    }
}

/// A claim-mode run of `key`'s message: `drive` (the claim, the body, the stamp or the
/// release) in the run's span, and how it ended recorded.
pub(crate) async fn claimed<T, A, E, F>(
    spec: &'static HandlerSpec,
    key: MessageKey,
    drive: impl FnOnce(MessageKey) -> F,
) -> Result<A, E>
where
    A: HandlerOutcome<T>,
    F: Future<Output = Result<A, E>>,
{
    let run = Run::message(spec, &key, true);
    let result = drive(key).instrument(run.instrument_span()).await;
    run.finish(&result);
    result
}
