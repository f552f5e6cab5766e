//! `application/problem+json` (RFC 9457) answers, and the error of a handler's body.

use axum::http::header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use inbox_diesel::HasDieselError;
use serde::Serialize;

/// An answer the layer gives in place of the handler's: a `problem+json` body (RFC 9457)
/// with the HTTP status's phrase as its title, a `detail` for people and a stable
/// `problem` member for programs.
///
/// | `problem` | status | when |
/// |---|---|---|
/// | `idempotency-key-missing` | 400 | the request has no `Idempotency-Key` header |
/// | `idempotency-key-invalid` | 400 | the header is empty, longer than [`MAX_KEY_LEN`](crate::MAX_KEY_LEN), not visible ASCII, or a malformed quoted string |
/// | `request-in-flight` | 409 | a request with the same key is being processed (with `Retry-After: 1`) |
/// | `request-done-without-response` | 409 | the key's request was processed by a handler that stores no response |
/// | `idempotency-key-reused` | 422 | the key was used on this route for a request with another path, query or body (on another route — another method or path pattern — it is another key) |
/// | `body-type-unsupported` | 415 | the body is declared neither `application/json` nor `application/x-www-form-urlencoded` |
/// | `body-malformed` | 400 | the body is not JSON |
/// | `body-invalid` | 422 | the body is JSON or a form, not the handler's payload |
/// | `principal-missing` | 500 | no [`Principal`](crate::Principal) in the request's extensions (logged) |
/// | `reply-too-large` | 500 | the reply the body returned is over [`MAX_STORED_RESULT_BYTES`](inbox_diesel::MAX_STORED_RESULT_BYTES) (1 MiB) as stored: nothing committed, every retry fails the same way — answer less (an id to fetch the rest by) (logged) |
/// | `body-unreadable` | the rejection's (413 over axum's `DefaultBodyLimit`) | the body could not be read |
/// | `internal` | 500 | the handler's transaction failed and rolled back (logged) |
/// | `unavailable` | 503 | the database was unreachable or busy past the handler's retries; a retry with the same key answers the request once |
#[derive(Debug, Clone)]
pub struct Problem {
    status: StatusCode,
    problem: &'static str,
    detail: String,
}

impl Problem {
    /// A problem of the application's own, for [`Error::Respond`]: `problem` is its stable
    /// name, `detail` what happened.
    pub fn new(status: StatusCode, problem: &'static str, detail: impl Into<String>) -> Self {
        Self {
            status,
            problem,
            detail: detail.into(),
        }
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The stable name of the problem (the table above).
    pub fn problem(&self) -> &'static str {
        self.problem
    }

    /// What happened, for people.
    pub fn detail(&self) -> &str {
        &self.detail
    }
}

#[derive(Serialize)]
struct Body<'a> {
    r#type: &'static str,
    title: &'static str,
    status: u16,
    detail: &'a str,
    problem: &'static str,
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let body = Body {
            r#type: "about:blank",
            title: self.status.canonical_reason().unwrap_or("Error"),
            status: self.status.as_u16(),
            detail: &self.detail,
            problem: self.problem,
        };
        let mut headers = HeaderMap::new();
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if self.problem == "request-in-flight" {
            headers.insert(RETRY_AFTER, HeaderValue::from_static("1"));
        }
        let body = serde_json::to_vec(&body).unwrap_or_default();
        (self.status, headers, body).into_response()
    }
}

/// Why a handler's body failed: its transaction rolls back, nothing is stored under the
/// key, and a retry of the request runs the body again.
///
/// A refusal that should be the request's final answer — a payment declined, an account
/// unknown — is not an error: return it as a [`Reply`](crate::Reply) with its status, and
/// it is stored and replayed like a success.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// A statement failed. A transient failure (a deadlock, a serialization failure, a lost
    /// connection) is retried in a fresh transaction, as the handler's `retries` say.
    Database(diesel::result::Error),
    /// The inbox refused the request or failed: its key was used for another request
    /// ([`inbox_diesel::Error::KeyReused`]), its stored response did not read back, or the
    /// inbox's own statements failed.
    Inbox(inbox_diesel::Error),
    /// Anything else the body failed with: answered 500, logged. A diesel error along its
    /// `source()` chain is found, and a transient one retried and answered as such.
    Internal(Box<dyn std::error::Error + Send + Sync>),
    /// An answer that is not the request's final one — 423 while a resource is locked, 503
    /// while a dependency is down: sent as it is, nothing committed or stored, and a retry
    /// runs the body again.
    Respond(Problem),
}

/// The answer to the client, for an error met outside [`Idempotent::run`]'s body (a
/// `spawn_blocking` task that panicked around [`Idempotent::run_blocking`]: 500, logged —
/// not [`unavailable`](crate::unavailable)'s 503, which says the request did not run).
///
/// [`Idempotent::run`]: crate::Idempotent::run
/// [`Idempotent::run_blocking`]: crate::Idempotent::run_blocking
impl axum::response::IntoResponse for Error {
    fn into_response(self) -> axum::response::Response {
        let problem = self.problem();
        if problem.status().is_server_error() {
            tracing::error!(
                error = &self as &dyn std::error::Error,
                "an idempotent request failed"
            );
            inbox_diesel::telemetry::unseen(format_args!(
                "a request failed, answered {}: {}",
                problem.status(),
                inbox_diesel::telemetry::chain(&self)
            ));
        }
        problem.into_response()
    }
}

impl Error {
    /// An error of the body's own, answered 500 and logged.
    pub fn internal(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Error::Internal(error.into())
    }

    /// The answer to the client.
    pub(crate) fn problem(&self) -> Problem {
        use inbox_diesel::Error as Inbox;
        match self {
            Error::Inbox(Inbox::KeyReused { .. }) => Problem::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "idempotency-key-reused",
                "this Idempotency-Key was used on this route for a request with another path, \
                 query or body; send a new key for a new request",
            ),
            Error::Inbox(Inbox::StoredResult(inbox_diesel::StoredResultProblem::TooLarge {
                bytes,
                limit,
            })) => Problem::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "reply-too-large",
                format!(
                    "the reply is {bytes} bytes, over the {limit} a key's stored reply may \
                     hold; nothing was committed, and a retry fails the same way (logged)"
                ),
            ),
            Error::Inbox(Inbox::InvalidKey(e)) => Problem::new(
                StatusCode::BAD_REQUEST,
                "idempotency-key-invalid",
                format!("the Idempotency-Key cannot be used: {e}"),
            ),
            _ if self.is_transient() => Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "the database could not be reached or was busy; retry the request with the \
                 same key, which answers it once whether or not this attempt committed",
            ),
            Error::Respond(problem) => problem.clone(),
            _ => Problem::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "the request could not be completed; the server logged why",
            ),
        }
    }

    /// A failure worth retrying later or on a new connection: a transient one that outlasted
    /// the handler's retries, a lost connection, a server that became read-only.
    fn is_transient(&self) -> bool {
        let class = match self {
            Error::Inbox(error) => error.class(),
            Error::Respond(_) => return false,
            _ => match self.diesel_error() {
                Some(error) => inbox_diesel::classify(error, &inbox_diesel::InboxSchema::DEFAULT),
                None => return false,
            },
        };
        matches!(
            class.action(),
            inbox_diesel::Action::RetryLater | inbox_diesel::Action::Reconnect
        )
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Database(e) => write!(f, "a statement of the handler failed: {e}"),
            Error::Inbox(e) => write!(f, "{e}"),
            Error::Internal(e) => write!(f, "the handler failed: {e}"),
            Error::Respond(problem) => write!(
                f,
                "the handler answered {} {}: {}",
                problem.status(),
                problem.problem(),
                problem.detail()
            ),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Database(e) => Some(e),
            Error::Inbox(e) => Some(e),
            Error::Internal(e) => Some(&**e),
            Error::Respond(_) => None,
        }
    }
}

impl From<diesel::result::Error> for Error {
    fn from(error: diesel::result::Error) -> Self {
        Error::Database(error)
    }
}

impl From<inbox_diesel::Error> for Error {
    fn from(error: inbox_diesel::Error) -> Self {
        Error::Inbox(error)
    }
}

/// With the feature `anyhow`: a body's `anyhow::Error` as the error it carries — a diesel
/// error ([`Error::Database`]: a deadlock is retried, then answered 503) or the inbox's
/// ([`Error::Inbox`]), found through any `.context(…)` around it — or else
/// [`Error::Internal`]. An `anyhow::Error` boxed as a `dyn Error` hides what it carries from
/// a walk along `source()`: convert it with `?` or `Error::from`, not [`Error::internal`].
///
/// ```
/// use anyhow::Context;
/// use diesel::result::{DatabaseErrorKind, Error as DieselError};
///
/// let deadlock = DieselError::DatabaseError(
///     DatabaseErrorKind::SerializationFailure,
///     Box::new("deadlock detected".to_string()),
/// );
/// let error = inbox_axum::Error::from(anyhow::Error::from(deadlock).context("voting"));
/// assert!(matches!(error, inbox_axum::Error::Database(_)));
/// ```
#[cfg(feature = "anyhow")]
impl From<anyhow::Error> for Error {
    fn from(error: anyhow::Error) -> Self {
        let error = match error.downcast::<diesel::result::Error>() {
            Ok(diesel) => return Error::Database(diesel),
            Err(error) => error,
        };
        match error.downcast::<inbox_diesel::Error>() {
            Ok(inbox) => Error::Inbox(inbox),
            Err(error) => Error::Internal(error.into()),
        }
    }
}

/// With the feature `eyre`: a body's `eyre::Report` as the error it carries, as the
/// conversion from `anyhow::Error` does — a diesel error
/// ([`Error::Database`]), the inbox's ([`Error::Inbox`]), or else [`Error::Internal`]. An
/// application error built on a report (`struct AppError(eyre::Report)`) converts through
/// its report.
///
/// ```
/// use diesel::result::{DatabaseErrorKind, Error as DieselError};
/// use eyre::WrapErr;
///
/// let deadlock = DieselError::DatabaseError(
///     DatabaseErrorKind::SerializationFailure,
///     Box::new("deadlock detected".to_string()),
/// );
/// let report = Err::<(), _>(deadlock).wrap_err("posting a status").unwrap_err();
/// let error = inbox_axum::Error::from(report);
/// assert!(matches!(error, inbox_axum::Error::Database(_)));
/// ```
#[cfg(feature = "eyre")]
impl From<eyre::Report> for Error {
    fn from(report: eyre::Report) -> Self {
        let report = match report.downcast::<diesel::result::Error>() {
            Ok(diesel) => return Error::Database(diesel),
            Err(report) => report,
        };
        match report.downcast::<inbox_diesel::Error>() {
            Ok(inbox) => Error::Inbox(inbox),
            Err(report) => Error::Internal(report.into()),
        }
    }
}

impl HasDieselError for Error {
    fn diesel_error(&self) -> Option<&diesel::result::Error> {
        match self {
            Error::Database(e) => Some(e),
            Error::Inbox(e) => e.diesel_error(),
            Error::Respond(_) => None,
            Error::Internal(e) => {
                let mut next: Option<&(dyn std::error::Error + 'static)> = Some(&**e);
                while let Some(error) = next {
                    if let Some(diesel) = error.downcast_ref::<diesel::result::Error>() {
                        return Some(diesel);
                    }
                    next = error.source();
                }
                None
            }
        }
    }
}
