//! Where an application's error keeps the diesel error the runtime reads (`HasDieselError`),
//! and what class the runtime gives a diesel error (`classify`).

use super::*;

/// An error type that can say which diesel error, if any, it carries: what the runtime looks
/// for in a body's `Err` to retry a transient failure (a serialization failure, a deadlock, a
/// lock timeout) in a fresh transaction.
///
/// The runtime finds the diesel error by itself when the body's error type is
/// `diesel::result::Error`, or a `std::error::Error` with the diesel error on its `source()`
/// chain. An error type that is neither — one built on `anyhow::Error`, which implements
/// `std::error::Error` only through `Deref`, an enum of the application's failures without
/// an `Error` impl — implements this trait, or its failures are never retried; `#[idempotent]`
/// warns at the return type of a handler whose error type is such (`deprecated`, naming this
/// trait). With the feature `anyhow`, `anyhow::Error` implements it, searching its chain, and
/// so do boxed errors (`Box<dyn Error + Send + Sync>`), searching theirs.
///
/// ```
/// use inbox_diesel::HasDieselError;
///
/// /// An application error built on anyhow, with a blanket `From`.
/// #[derive(Debug)]
/// pub struct AppError(anyhow::Error);
///
/// impl<E: Into<anyhow::Error>> From<E> for AppError {
///     fn from(error: E) -> Self {
///         AppError(error.into())
///     }
/// }
///
/// impl HasDieselError for AppError {
///     fn diesel_error(&self) -> Option<&diesel::result::Error> {
///         self.0.chain().find_map(|cause| cause.downcast_ref())
///     }
/// }
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not say where its diesel error is: the function API reads it through `HasDieselError`",
    label = "the body's error type",
    note = "implement it, returning the diesel error the type carries, so that a deadlock or a lost connection is retried and routed — for a type with its causes on `source()`: `impl inbox_diesel::HasDieselError for {Self} {{ fn diesel_error(&self) -> Option<&diesel::result::Error> {{ inbox_diesel::find_diesel_error(self) }} }}`",
    note = "`#[idempotent]` reads a diesel error on `source()` by itself; `anyhow::Error` implements it with the feature `anyhow`"
)]
pub trait HasDieselError {
    /// The diesel error this error carries, if any.
    fn diesel_error(&self) -> Option<&diesel::result::Error>;

    /// Records how many attempts the runtime made before it handed this error back: a
    /// transient failure of the body is retried in fresh transactions, and the error of the
    /// last attempt is returned. [`Error`] keeps the count
    /// ([`Error::attempts`](crate::Error::attempts)), as it does for a failure of the
    /// runtime's own statements, so that both agree; an `anyhow::Error` keeps it in the
    /// inbox error it carries. By default, nothing.
    fn record_attempts(&mut self, attempts: u32) {
        let _ = attempts;
    }

    /// Records what the runtime decided this error is, where that differs from what the
    /// error reads as: a MariaDB deadlock written in the server's own language, which its
    /// text protocol gives no code for, is known by the transaction the server ended, and
    /// retried as one — when the retries run out, the error handed back says `Deadlock`
    /// (`RetryLater`) to whoever classifies it, not `Other` (`DeadLetter`). A diesel error
    /// and [`Error`] keep it; an `anyhow::Error` in the one of them it
    /// carries. By default, nothing.
    fn record_class(&mut self, class: inbox_core::ErrorClass, attempts: u32) {
        let _ = (class, attempts);
    }
}

/// [`HasDieselError::record_attempts`] and [`HasDieselError::record_class`] of an error type
/// that erases the error it holds (`anyhow::Error`, a boxed `dyn Error`): handed on to the
/// inbox or diesel error it holds, found by its `downcast_mut`.
macro_rules! record_in_erased_error {
    () => {
        fn record_attempts(&mut self, attempts: u32) {
            if let Some(error) = self.downcast_mut::<crate::error::Error>() {
                error.record_attempts(attempts);
            }
        }

        fn record_class(&mut self, class: inbox_core::ErrorClass, attempts: u32) {
            if let Some(error) = self.downcast_mut::<crate::error::Error>() {
                error.record_class(class, attempts);
            } else if let Some(error) = self.downcast_mut::<diesel::result::Error>() {
                error.record_class(class, attempts);
            }
        }
    };
}

#[cfg(feature = "anyhow")]
impl HasDieselError for anyhow::Error {
    fn diesel_error(&self) -> Option<&diesel::result::Error> {
        self.chain().find_map(|cause| cause.downcast_ref())
    }

    record_in_erased_error!();
}

/// The diesel error along `error`'s `source()` chain (`error` itself included, and an
/// inbox [`Error`](crate::Error)'s on the way): what an application's error type that keeps
/// its causes on `source()` returns for [`HasDieselError::diesel_error`], as `#[idempotent]`
/// reads it by itself.
///
/// ```
/// use inbox_diesel::{HasDieselError, find_diesel_error};
///
/// #[derive(Debug)]
/// pub enum AppError {
///     Db(diesel::result::Error),
///     Rejected,
/// }
///
/// impl std::fmt::Display for AppError {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
///         f.write_str("app error")
///     }
/// }
///
/// impl std::error::Error for AppError {
///     fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
///         match self {
///             AppError::Db(e) => Some(e),
///             AppError::Rejected => None,
///         }
///     }
/// }
///
/// impl HasDieselError for AppError {
///     fn diesel_error(&self) -> Option<&diesel::result::Error> {
///         find_diesel_error(self)
///     }
/// }
///
/// assert!(AppError::Db(diesel::result::Error::NotFound).diesel_error().is_some());
/// assert!(AppError::Rejected.diesel_error().is_none());
/// ```
pub fn find_diesel_error<'e>(
    error: &'e (dyn std::error::Error + 'static),
) -> Option<&'e diesel::result::Error> {
    let mut next = Some(error);
    while let Some(error) = next {
        if let Some(diesel) = error.downcast_ref::<diesel::result::Error>() {
            return Some(diesel);
        }
        if let Some(diesel) = error
            .downcast_ref::<crate::error::Error>()
            .and_then(HasDieselError::diesel_error)
        {
            return Some(diesel);
        }
        next = error.source();
    }
    None
}

/// A boxed error (`Box<dyn std::error::Error + Send + Sync>`, the error type of many
/// applications and of `?` on anything): the diesel error is looked for along its `source()`
/// chain, an inbox error's included. A box does not implement `std::error::Error` itself, so
/// without this a deadlock in a body returning one would never be retried.
macro_rules! boxed_errors {
    ($($bounds:tt)*) => {
        impl HasDieselError for Box<dyn std::error::Error $($bounds)* + 'static> {
            fn diesel_error(&self) -> Option<&diesel::result::Error> {
                find_diesel_error(&**self)
            }

            record_in_erased_error!();
        }
    };
}
boxed_errors!();
boxed_errors!(+ Send);
boxed_errors!(+ Send + Sync);

/// What a diesel error means for an idempotent handler whose inbox is `schema`.
///
/// This is the classification the runtime itself uses: a unique violation is an
/// [`ErrorClass::InboxDuplicate`] only when it is a violation of the inbox's own unique index
/// (by constraint name and table on PostgreSQL, by key name on MySQL/MariaDB — and table, where
/// MySQL ≥ 8.0.19 qualifies the key with it —, by table and columns on SQLite); any other
/// unique violation is a business error that keeps its name.
///
/// Route a handler's failures on what the runtime decided, not on this function: a duplicate
/// comes back as [`Outcome::Duplicate`](crate::Outcome::Duplicate), never as an error, and the
/// inbox's own failures carry their class ([`Error::class`](crate::Error::class)) — also inside
/// the diesel error a handler returning `QueryResult` gets them in, which this function reads. An error the
/// handler's body returned is the body's: the message was not processed, whatever its class.
/// Servers name tables without their schema, and MariaDB names none at all: there, a unique
/// index of another table that carries the inbox index's name (a copy made with
/// `CREATE TABLE … LIKE inbox`) reads as the inbox's. Give each inbox's unique index a name no
/// other table uses (`constraint = "…"`) where tables are copied.
///
/// ```
/// use diesel::result::{DatabaseErrorKind, Error};
/// use inbox_diesel::{classify, ErrorClass, InboxSchema};
///
/// let sqlite = Error::DatabaseError(
///     DatabaseErrorKind::UniqueViolation,
///     Box::new(String::from("UNIQUE constraint failed: accounts.email")),
/// );
/// assert_eq!(
///     classify(&sqlite, &InboxSchema::DEFAULT),
///     ErrorClass::UniqueViolation { constraint: Some("accounts.email".into()) }
/// );
/// ```
pub fn classify(error: &diesel::result::Error, schema: &inbox_core::InboxSchema) -> ErrorClass {
    match error {
        // The inbox's own failure, as a handler returning `QueryResult` gets it: its class.
        diesel::result::Error::QueryBuilderError(inner) => match inner.downcast_ref::<Error>() {
            Some(inbox) => inbox.class(),
            None => ErrorClass::Other,
        },
        other => crate::classify::class_of(other, schema),
    }
}
