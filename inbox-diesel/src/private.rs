//! What the expansion of `#[idempotent]` names: `inbox_diesel::__private`. Not a public API.

/// The compile-time guard's probes (see `guard.rs`).
pub mod guard {
    pub use crate::guard::{Asked, ClaimModeHasNoConnection, Probe, levels, query_type, vet};
}
pub use crate::backends::{Visit, variant_replaced};
pub use crate::handler::{checked, checked_call, checked_future};
#[cfg(feature = "async")]
pub use crate::runtime::asynchronous::{
    AsyncBody, run_async, run_batch_async, run_claim_async, run_joined_async,
    run_joined_or_own_async,
};
pub use crate::runtime::batch::NewMessages;
pub use crate::runtime::call::Call;
pub use crate::runtime::claim::ClaimSpec;
pub use crate::runtime::stored::{Remembered, Store};
pub use crate::runtime::sync::{run, run_batch, run_claim, run_joined, run_joined_or_own};
pub use crate::spec::HandlerSpec;
pub use crate::{
    __inbox_error_class as error_class, __inbox_no_connection as no_connection,
    __inbox_vet_checkout as vet_checkout, __inbox_vet_claim as vet_claim,
    __inbox_vet_read as vet_read, __inbox_vet_shadowed as vet_shadowed,
    __inbox_vet_spawn as vet_spawn, __inbox_vet_transaction as vet,
};
pub use inbox_core::{Consumer, ErrorClass, InboxSchema, KeyError, MessageKey, RetryPolicy};

use crate::classify;

/// A handler's declared return type: a `Result` whose error type can carry the inbox's
/// own failures. The expansion passes `<R as HandlerResult>::inbox_error`, spanned at the
/// return type, so that an error type without `From<inbox_diesel::Error>` is reported
/// once, there.
#[diagnostic::on_unimplemented(
    message = "an #[idempotent] handler must return a `Result`, and `{Self}` is not one",
    label = "not a `Result<T, E>` whose `E` takes `inbox_diesel::Error` (`From`)",
    note = "e.g. `-> Result<Receipt, AppError>` with `impl From<inbox_diesel::Error> for AppError`, or `-> QueryResult<Receipt>`; the handler then returns `Result<Outcome<Receipt>, AppError>`"
)]
pub trait HandlerResult {
    /// The body's value, `T`: what the outcome carries.
    type Ok;
    type Error;
    fn inbox_error(error: crate::Error) -> Self::Error;
}

impl<T, E: From<crate::Error>> HandlerResult for Result<T, E> {
    type Ok = T;
    type Error = E;
    fn inbox_error(error: crate::Error) -> E {
        E::from(error)
    }
}

/// `batch = msgs`: the messages as a slice, whether `msgs` is a slice, a `Vec` or a
/// reference to either (a function, so that the user's `&[T]` is not re-sliced in their
/// code, which clippy would flag).
pub fn messages<T, M: AsRef<[T]> + ?Sized>(messages: &M) -> &[T] {
    messages.as_ref()
}

/// `batch = msgs, key = |msg| …`: the key of each message of the batch.
pub fn batch_keys<'m, T, K, F>(all: &'m [T], key: F) -> Result<Vec<MessageKey>, KeyError>
where
    F: Fn(&'m T) -> K,
    K: inbox_core::ToMessageKey,
{
    all.iter()
        .map(|message| key(message).to_message_key())
        .collect()
}

/// `key = <expr>` is evaluated as `message_key(&(<expr>))`: borrowed, so a `String`
/// field is not moved out of the message.
pub fn message_key<K: inbox_core::ToMessageKey + ?Sized>(key: &K) -> Result<MessageKey, KeyError> {
    key.to_message_key()
}

/// Finds the diesel error in a body's `Err`, whatever the handler's error type, so that a
/// transient failure inside the body is retried. Resolved at the expansion site, where
/// the error type is concrete, by autoref specialisation: `(&&&Probe(&result))` picks
/// the first of these impls that applies.
pub struct Probe<'r, R>(pub &'r R);

/// The body's error is a diesel error.
pub trait ProbeDiesel {
    fn inbox_error_class(&self, schema: &InboxSchema) -> Option<ErrorClass>;
}

impl<T> ProbeDiesel for &&&Probe<'_, Result<T, diesel::result::Error>> {
    fn inbox_error_class(&self, schema: &InboxSchema) -> Option<ErrorClass> {
        self.0.as_ref().err().map(|e| classify(e, schema))
    }
}

/// The body's error says where its diesel error is ([`HasDieselError`](crate::HasDieselError);
/// `anyhow::Error` with the feature `anyhow`).
pub trait ProbeHasDieselError {
    fn inbox_error_class(&self, schema: &InboxSchema) -> Option<ErrorClass>;
}

impl<T, E: crate::HasDieselError> ProbeHasDieselError for &&Probe<'_, Result<T, E>> {
    fn inbox_error_class(&self, schema: &InboxSchema) -> Option<ErrorClass> {
        let error = self.0.as_ref().err()?;
        Some(
            error
                .diesel_error()
                .map_or(ErrorClass::Other, |e| classify(e, schema)),
        )
    }
}

/// The body's error is a `std::error::Error`: look for a diesel (or inbox) error along
/// its `source()` chain.
pub trait ProbeSourceChain {
    fn inbox_error_class(&self, schema: &InboxSchema) -> Option<ErrorClass>;
}

impl<T, E: std::error::Error + 'static> ProbeSourceChain for &Probe<'_, Result<T, E>> {
    fn inbox_error_class(&self, schema: &InboxSchema) -> Option<ErrorClass> {
        let mut next: Option<&(dyn std::error::Error + 'static)> = Some(self.0.as_ref().err()?);
        while let Some(error) = next {
            if let Some(diesel) = error.downcast_ref::<diesel::result::Error>() {
                return Some(classify(diesel, schema));
            }
            if let Some(inbox) = error.downcast_ref::<crate::Error>() {
                return Some(inbox.class());
            }
            next = error.source();
        }
        None
    }
}

/// Tells a body's `Err` how many attempts were made
/// ([`HasDieselError::record_attempts`](crate::HasDieselError::record_attempts)), where its
/// type can keep the count: resolved by autoref like [`Probe`], `(&&Record(…)).…`.
pub struct Record<'r, R>(
    pub std::cell::RefCell<&'r mut R>,
    pub u32,
    pub Option<ErrorClass>,
);

/// The body's error keeps the count.
pub trait RecordHasDieselError {
    fn inbox_record_attempts(&self);
}

impl<T, E: crate::HasDieselError> RecordHasDieselError for &Record<'_, Result<T, E>> {
    fn inbox_record_attempts(&self) {
        if let Err(error) = &mut **self.0.borrow_mut() {
            error.record_attempts(self.1);
            if let Some(class) = &self.2 {
                error.record_class(class.clone(), self.1);
            }
        }
    }
}

/// Any other error type: nothing to record in.
pub trait RecordAny {
    fn inbox_record_attempts(&self);
}

impl<R> RecordAny for Record<'_, R> {
    fn inbox_record_attempts(&self) {}
}

/// Any other error type: opaque, never retried.
pub trait ProbeOpaque {
    fn inbox_error_class(&self, schema: &InboxSchema) -> Option<ErrorClass>;
}

impl<R> ProbeOpaque for Probe<'_, R> {
    fn inbox_error_class(&self, _: &InboxSchema) -> Option<ErrorClass> {
        None
    }
}

/// Whether the runtime can find a diesel error in a body's error type: resolved by autoref
/// at the expansion site like [`Probe`],
/// `error_is_readable((&&&&Readable::<Result<T, E>>::NEW).inbox_readable())`. An error type
/// none of the probes reads resolves to [`ReadOpaque`], whose method is deprecated: the
/// handler compiles, with a warning at its return type that says what to do.
pub struct Readable<R>(std::marker::PhantomData<R>);

impl<R> Readable<R> {
    pub const NEW: Self = Readable(std::marker::PhantomData);
}

/// What every probe answers: the warning, where there is one, is the deprecation.
pub struct Read;

pub trait ReadDiesel {
    fn inbox_readable(&self) -> Read {
        Read
    }
}
impl<T> ReadDiesel for &&&&Readable<Result<T, diesel::result::Error>> {}

pub trait ReadHasDieselError {
    fn inbox_readable(&self) -> Read {
        Read
    }
}
impl<T, E: crate::HasDieselError> ReadHasDieselError for &&&Readable<Result<T, E>> {}

pub trait ReadSourceChain {
    fn inbox_readable(&self) -> Read {
        Read
    }
}
impl<T, E: std::error::Error + 'static> ReadSourceChain for &&Readable<Result<T, E>> {}

/// A `Result` whose error takes the inbox's errors and none of the above: warned about.
pub trait ReadOpaque {
    #[deprecated(
        note = "the runtime cannot find a diesel error in this handler's error type: a deadlock, a serialization failure or a lost connection inside the body is handed back as it is, not retried in a fresh transaction. Return `diesel::result::Error`, `inbox_diesel::Error`, `Box<dyn Error + Send + Sync>`, `anyhow::Error` (feature `anyhow`) or a type that implements `std::error::Error` with the diesel error on its `source()` chain — or implement `inbox_diesel::HasDieselError` for it, returning the diesel error it carries"
    )]
    fn inbox_readable(&self) -> Read {
        Read
    }
}
impl<T, E: From<crate::Error>> ReadOpaque for &Readable<Result<T, E>> {}

/// Any other return type: refused by [`HandlerResult`], not here.
pub trait ReadOther {
    fn inbox_readable(&self) -> Read {
        Read
    }
}
impl<R> ReadOther for Readable<R> {}

pub fn error_is_readable(_: Read) {}

/// `error_class!(ReturnType, SPEC)`: the closure that classifies a body's `Err` for the retry
/// loop, resolved by `__private::Probe` at the expansion site, where the error type is known.
#[doc(hidden)]
#[macro_export]
macro_rules! __inbox_error_class {
    ($ret:ty, $spec:ident) => {
        |__inbox_result: &mut $ret,
         __inbox_attempts: u32,
         __inbox_decided: ::std::option::Option<$crate::ErrorClass>| {
            #[allow(unused_imports)]
            use $crate::__private::{
                ProbeDiesel as _, ProbeHasDieselError as _, ProbeOpaque as _,
                ProbeSourceChain as _, RecordAny as _, RecordHasDieselError as _,
            };
            (&&$crate::__private::Record(
                ::std::cell::RefCell::new(&mut *__inbox_result),
                __inbox_attempts,
                __inbox_decided,
            ))
                .inbox_record_attempts();
            (&&&&$crate::__private::Probe(&*__inbox_result)).inbox_error_class(&$spec.schema)
        }
    };
}
