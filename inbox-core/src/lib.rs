//! The vocabulary shared by the `inbox` crates, free of any database driver.
//!
//! Users depend on `inbox-diesel`, which re-exports everything here. This crate holds the
//! pieces that do not depend on how SQL is executed:
//!
//! - [`MessageKey`]: the deduplication key of a message, with a length limit checked before
//!   any SQL runs, and the 128-bit id it is stored under;
//! - [`Consumer`]: the validated name of the handler that consumes a message;
//! - [`Outcome`], [`InFlightOutcome`], [`StaleClaimOutcome`] and [`BatchOutcome`]: what an
//!   idempotent handler reports to the message pump, each mode the type that holds only
//!   what it can answer;
//! - [`Isolation`]: the isolation level of a handler's transaction;
//! - [`ErrorClass`] and [`server_message`]: how a database error is read;
//! - [`RetryPolicy`]: which failures are retried and after how long;
//! - [`Retention`]: how long a marker must outlive its message's last possible delivery;
//! - [`Settlement`] and [`Settle`]: how a message pump settles a delivery with its broker,
//!   for every outcome and every failure, and [`Redelivery`], how long a retried message
//!   waits;
//! - [`broker`]: each broker's message id as a key, its redelivery settings as a retention.
//!
//! ```
//! use inbox_core::{Consumer, MessageKey, Outcome};
//!
//! let key = MessageKey::kafka("payments", 3, 1_204)?;
//! let consumer = Consumer::new("credit")?;
//! let outcome: Outcome<u32> = Outcome::Duplicate { consumer, key, stored: None };
//! assert!(outcome.should_ack());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![warn(missing_docs)]

pub mod broker;
mod class;
mod consumer;
mod ident;
mod isolation;
mod key;
mod outage;
mod outcome;
mod retention;
mod retry;
pub mod server_message;
mod settle;

pub use class::{Action, ErrorClass, TransientKind};
pub use consumer::{Consumer, ConsumerError};
pub use ident::{IdentifierError, InboxSchema};
pub use isolation::Isolation;
pub use key::{KeyError, KeyPart, MessageKey, Scoped, ToKeyPart, ToMessageKey};
pub use outage::{Gate, Outage};
pub use outcome::{BatchOutcome, HandlerOutcome, InFlightOutcome, Outcome, StaleClaimOutcome};
pub use retention::Retention;
pub use retry::{RetryDecision, RetryPolicy};
pub use settle::{Redelivery, Settle, Settlement};
