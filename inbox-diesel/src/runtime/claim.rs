//! Claim mode's lease and expiry policy, and its steps run on any connection (the
//! statements are `dialect::claim`'s).

use diesel::QueryResult;
use inbox_core::{InboxSchema, MessageKey};

use crate::dialect::claim::{ClaimAnswer, ClaimSql, ClaimStep, read_answer};
use crate::io::Io;

/// What to do with a claim whose lease ended without the work being stamped complete
/// (`on_expired = "…"` in claim mode).
///
/// Such a claim's attempt crashed or hung somewhere around its side effect: before it, during
/// it, or after it and before the stamp. Nobody can know which without asking the system the
/// side effect went to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnExpired {
    /// `"take_over"`: the next delivery takes the claim over (a compare-and-set on its attempt
    /// counter, so exactly one of several concurrent deliveries wins) and runs the side effect
    /// again. Right when the downstream system deduplicates by the key you pass it — a
    /// payment provider's idempotency key, a blob name derived from the key.
    #[default]
    TakeOver,
    /// `"report"`: the claim is left as it is and each delivery returns
    /// [`Outcome::StaleClaim`](crate::Outcome::StaleClaim) without running the body, for a
    /// person or a reconciliation job to resolve. Right when running the side effect twice
    /// is worse than running it late.
    Report,
}

/// A claim-mode handler's lease and expiry policy.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimSpec {
    /// How long a claim stays live, in milliseconds.
    pub lease_ms: u64,
    /// What a delivery does with an expired claim.
    pub on_expired: OnExpired,
}

impl ClaimSpec {
    /// The default lease: one minute.
    pub const DEFAULT_LEASE_MS: u64 = 60_000;
}

/// Runs one claim-mode statement, committed on its own.
pub(crate) async fn step<S: Io>(
    io: &mut S,
    schema: &InboxSchema,
    consumer: &str,
    key: &MessageKey,
    step: ClaimStep,
) -> QueryResult<ClaimAnswer> {
    match step {
        ClaimStep::Read => Ok(read_answer(
            io.read_claim(ClaimSql::read(schema, consumer, key)).await?,
        )),
        ClaimStep::Insert { .. } => {
            let inserted = io
                .execute_claim(ClaimSql::new(schema, consumer, key, step))
                .await;
            crate::dialect::marker::inserted_unless_duplicate(inserted, schema)
                .map(ClaimAnswer::Rows)
        }
        _ => io
            .execute_claim(ClaimSql::new(schema, consumer, key, step))
            .await
            .map(ClaimAnswer::Rows),
    }
}
