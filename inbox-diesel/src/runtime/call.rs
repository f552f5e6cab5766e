//! One handler call as the runtime takes it ([`Call`]).

use std::marker::PhantomData;

use inbox_core::{KeyError, MessageKey};

use crate::error::Error;
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

impl<A, T, E, B, P> Call<A, T, E, B, P> {
    /// The same call with its body wrapped as the runtime runs it.
    pub(crate) fn with_body<W>(self, wrap: impl FnOnce(B) -> W) -> Call<A, T, E, W, P> {
        let Call {
            outcome,
            spec,
            key,
            body,
            probe,
            remembered,
            inbox_error,
        } = self;
        Call {
            outcome,
            spec,
            key,
            body: wrap(body),
            probe,
            remembered,
            inbox_error,
        }
    }

    /// The call's key, checked — an invalid one is the caller's error, and a run that never
    /// started — and how the runtime handles the message: `in_flight`, what a delivery
    /// that finds another's claim in flight answers (transaction mode's `on_locked`).
    pub(crate) fn keyed<W>(self, in_flight: Option<W>) -> Result<Keyed<T, E, B, P, W>, E> {
        let Call {
            spec,
            key,
            body,
            probe,
            remembered,
            inbox_error,
            ..
        } = self;
        let key = key.map_err(|e| Run::invalid_key(spec, inbox_error(Error::InvalidKey(e))))?;
        let handling = Handling {
            spec,
            body,
            probe,
            in_flight,
            remembered,
            inbox_error,
        };
        Ok((key, handling))
    }
}
