//! Why a message was not written to the outbox: named by [`Error`](super::Error) and
//! re-exported by [`outbox`](crate::outbox).

use std::fmt;

/// Why a message was not written to the outbox.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum OutboxProblem {
    /// `publish` was called outside the body of an `#[idempotent]` handler (or in a claim-mode
    /// body), or on a connection without an open transaction: the row would commit on its
    /// own, whatever happened to the handler's work.
    OutsideHandler,
    /// The message is larger than the sink carries, or its destination or key is refused.
    Refused {
        /// What was refused.
        what: String,
        /// Why.
        why: String,
    },
}

impl fmt::Display for OutboxProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OutboxProblem::OutsideHandler => f.write_str(
                "outbox: a message is published inside the body of an #[idempotent] handler, \
                 on its connection, so that it commits with the handler's work; here there is \
                 no such body (or no transaction on the connection)",
            ),
            OutboxProblem::Refused { what, why } => {
                write!(f, "outbox: {what} cannot be sent: {why}")
            }
        }
    }
}
