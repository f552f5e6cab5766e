//! Claim mode's lease and expiry policy, and its steps run on any connection (the
//! statements are `dialect::claim`'s).

use diesel::QueryResult;
use inbox_core::{InboxSchema, MessageKey};

use crate::backends::autocommit_on;
use crate::dialect::Sql;
use crate::dialect::claim::{ClaimAnswer, ClaimSql, ClaimStep, read_answer};
use crate::io::Io;
use crate::runtime::evidence::refused_marker;
use crate::runtime::found::Presence;

/// A claim-mode handler's lease. What a delivery does with an expired claim is in the
/// handler's outcome type: reported if it can hold `StaleClaim` (`on_expired = "report"`),
/// else taken over.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimSpec {
    /// How long a claim stays live, in milliseconds.
    pub lease_ms: u64,
}

impl ClaimSpec {
    /// The default lease: one minute.
    pub const DEFAULT_LEASE_MS: u64 = 60_000;
    /// The shortest lease: a claim whose insert takes more than a quarter of its lease is
    /// given back ([`too_late`](Self::too_late)), so a shorter one would never start the body.
    pub const MIN_LEASE_MS: u64 = 100;
    /// The longest lease, 30 days: far beyond any side effect, and far inside every
    /// backend's timestamp arithmetic.
    pub const MAX_LEASE_MS: u64 = 30 * 24 * 60 * 60 * 1000;

    /// Whether the lease is one a claim can hold ([`Error::InvalidLease`](crate::Error)
    /// otherwise).
    pub(crate) fn valid(self) -> bool {
        (Self::MIN_LEASE_MS..=Self::MAX_LEASE_MS).contains(&self.lease_ms)
    }

    /// Whether a claim whose statement was sent at `sent` came back too late for its body to
    /// run under it: the database started the lease no earlier than `sent`, and the body
    /// starts only with at least three quarters of it ahead. A claim that a stalled commit
    /// held back (a Galera cluster evicting a node, a synchronous standby away, a lock wait)
    /// could otherwise start its body with its lease already over, beside the delivery that
    /// took it over.
    pub(crate) fn too_late(self, sent: std::time::Instant) -> bool {
        sent.elapsed() > std::time::Duration::from_millis(self.lease_ms / 4)
    }
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
            io.read_claim(ClaimSql::read(schema, consumer, key, None, false))
                .await?,
        )),
        ClaimStep::Precheck { layout, nowait } => Ok(read_answer(
            io.read_claim(ClaimSql::read(schema, consumer, key, Some(layout), nowait))
                .await?,
        )),
        ClaimStep::Insert {
            layout, lease_ms, ..
        } => {
            // Too long for the server's packet (MySQL, MariaDB): refused before it is sent,
            // as the transaction mode's marker is.
            #[cfg(feature = "mysql")]
            if layout.key_text {
                let text = crate::dialect::layout::key_text(key);
                crate::dialect::marker::marker_fits(consumer, Some(&text), layout)?;
            }
            let keep = <S::Backend as crate::dialect::Dialect>::keep_session(kept_for_ms(lease_ms));
            match <S::Backend as crate::dialect::Dialect>::OPEN_TRANSACTION_PROBE {
                // The same round trip keeps the session through the lease.
                Some(probe) => {
                    let probe = match keep {
                        Some(keep) => format!("{probe}; {keep}"),
                        None => probe.to_owned(),
                    };
                    match io.batch(&probe).await {
                        Err(e) if crate::dialect::open_transaction(&e) => {
                            return Err(crate::error::Error::CalledInsideTransaction.into());
                        }
                        other => other?,
                    }
                }
                None => {
                    if let Some(keep) = keep {
                        io.execute(&Sql::new(keep)).await?;
                    }
                }
            }
            let inserted = io
                .execute_claim(ClaimSql::new(schema, consumer, key, step))
                .await;
            if let Err(e) = &inserted
                && crate::dialect::claim::autocommit_off(e)
            {
                // MariaDB: autocommit on, so the insert met a transaction left open.
                if layout.mariadb && autocommit_on(io).await.unwrap_or(false) {
                    return Err(crate::error::Error::CalledInsideTransaction.into());
                }
                return Err(crate::error::Error::Session(
                    crate::error::SessionProblem::AutocommitOff {
                        needed_by: "claim mode",
                    },
                )
                .into());
            }
            crate::dialect::marker::inserted_unless_duplicate(inserted, schema)
                .map(ClaimAnswer::Rows)
                .map_err(|e| refused_marker(e, schema))
        }
        ClaimStep::TakeOver { .. } => io
            .execute_claim(ClaimSql::new(schema, consumer, key, step))
            .await
            .map(ClaimAnswer::Rows)
            .map_err(|e| refused_marker(e, schema)),
        _ => io
            .execute_claim(ClaimSql::new(schema, consumer, key, step))
            .await
            .map(ClaimAnswer::Rows),
    }
}

/// How many of `ids` have a marker for `consumer`: the evidence that an insert which wrote
/// nothing, or was refused by an index of the inbox's name, met a duplicate
/// ([`ClaimSql::present`]). On MySQL and MariaDB too: their error names the index but, on
/// MariaDB, no table, and an index redefined under that name since the check (on
/// `message_id` alone) refuses another consumer's new message the same way.
pub(crate) async fn present<S: Io>(
    io: &mut S,
    schema: &InboxSchema,
    consumer: &str,
    ids: &[uuid::Uuid],
    latest: bool,
) -> QueryResult<Presence> {
    if ids.is_empty() {
        return Ok(Presence::default());
    }
    let rows = io
        .read_claim(ClaimSql::present(schema, consumer, ids, latest))
        .await?;
    let count = |n: i64| usize::try_from(n).unwrap_or(0);
    Ok(rows
        .first()
        .map_or_else(Presence::default, |&(present, completed, live)| Presence {
            present: count(present),
            completed: count(completed),
            live_claims: count(live),
        }))
}

/// How long claim mode needs the server to keep a session that sends nothing: the side
/// effect runs between the claim and the stamp with the session idle, outside any
/// transaction, for up to its lease — and a minute more for the stamp
/// ([`Dialect::keep_session`](crate::dialect::Dialect::keep_session)).
fn kept_for_ms(lease_ms: u64) -> u64 {
    lease_ms.saturating_add(60_000)
}

/// MariaDB, inside the handler's transaction after a failure: whether the transaction is
/// no longer the one the handler began — a deadlock or a Galera abort rolled it back (or a
/// statement that commits implicitly ended it). Its savepoint
/// ([`HandlerSpec::MARIADB_OURS`](crate::spec::HandlerSpec::MARIADB_OURS)) lives only in
/// that transaction: releasing it fails in any other — also where, `autocommit` being off,
/// the body's statements after the error opened another (`@@in_transaction` is 1 again
/// there). `false` where it is still the handler's (the savepoint released: the rollback
/// follows) or the connection was lost.
pub(crate) async fn ended_by_server<S: Io>(io: &mut S) -> bool {
    match io.batch("RELEASE SAVEPOINT inbox_transaction").await {
        Ok(()) => false,
        Err(e) => {
            let lost = matches!(
                crate::classify::class_of(&e, &inbox_core::InboxSchema::DEFAULT),
                inbox_core::ErrorClass::ConnectionLost
            );
            tracing::debug!(error = %e, lost, "the handler's savepoint is gone");
            !lost
        }
    }
}
