//! Claim mode: acquire the claim (each statement committing on its own), run the body
//! outside any transaction, stamp the claim completed — or release it.

use std::time::{Duration, Instant};

use diesel::QueryResult;
use diesel::result::Error as DieselError;
use inbox_core::{ErrorClass, HandlerOutcome, MessageKey, RetryDecision};

use crate::dialect::claim::{ClaimAnswer, ClaimState, ClaimStep};
use crate::dialect::layout::Layout;
use crate::runtime::checked::{
    forget_check, needs_recheck, rechecked_layout, schema_checked, statement_lost,
};
use crate::runtime::claim::ClaimSpec;
use crate::runtime::failure::{Failure, discard, give_up, take_back};
use crate::runtime::steps::{Body, Panicked, Steps, is_stopped, run_body, stopped};
use crate::runtime::stored::{Fingerprint, Remembered, kept_columns, read_kept, stored_value};
use crate::runtime::transaction::swallowed;
use crate::spec::HandlerSpec;
use crate::telemetry;
use crate::{Error, NoConnection, classify};

/// Runs `body` in claim mode: its side effect cannot join a transaction, so the inbox row is
/// claimed and committed before it, and stamped after it.
///
/// 1. claim: insert a live claim (attempt 1) unless a row exists; if one does, read it —
///    completed → `Duplicate`; live → `InFlight`; released by a failed attempt → take it over;
///    expired → report it (`StaleClaim`) when the outcome type can say so (`on_expired =
///    "report"` returns [`StaleClaimOutcome`](inbox_core::StaleClaimOutcome)), else take it over. A takeover is a
///    compare-and-set on the attempt counter: of concurrent deliveries, one wins, the others
///    read the row again and find it live;
/// 2. run the body, outside any transaction;
/// 3. `Ok` → stamp `processed_at` where the counter is still this attempt's: 0 rows means
///    the claim was taken over, and this attempt does not stamp (`Error::ClaimLost`);
///    `Err` → release the claim for a redelivery to retry, return the body's error.
///
/// Transient database errors in steps 1 and 3 are retried as `spec.retry` says; the body is
/// not: the broker's redelivery retries it, after the release.
pub(crate) async fn drive_claim<S, T, E, B, A>(
    mut steps: S,
    spec: &'static HandlerSpec,
    claim: ClaimSpec,
    key: MessageKey,
    mut body: B,
    remembered: Remembered<T>,
    inbox_error: fn(Error) -> E,
) -> Result<A, E>
where
    S: Steps,
    B: Body<S::Conn, Result<T, E>>,
    A: HandlerOutcome<T, InFlightWitness = ()>,
{
    let (holding, remembered) =
        match claim_started(&mut steps, spec, claim, &key, remembered, inbox_error).await? {
            Started::Answered(answer) => return Ok(answer),
            Started::Holding(holding, remembered) => (holding, remembered),
        };
    let net = steps.net();
    let ran = run_body(spec, &mut body, steps.conn(), None, net).await;
    claim_finished(&mut steps, spec, holding, key, ran, remembered, inbox_error).await
}

/// What phase 1 of claim mode left: the answer, without a claim (a duplicate, a claim in
/// flight, a stale claim reported), or the claim this delivery holds.
pub(crate) enum Started<A, T> {
    Answered(A),
    Holding(Holding, Remembered<T>),
}

/// The claim a delivery holds while its body runs: its attempt, and the table's layout as
/// the claim found it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Holding {
    attempt: u32,
    layout: Layout,
    run: &'static HandlerSpec,
    /// Whether the claim's connection had the net ([`tripwire::net`](crate::tripwire::net)).
    netted: bool,
    /// When the claim's lease ends at the latest: its lease from before the claim was sent.
    lease_ends: Instant,
    /// The claim's lease.
    lease_ms: u64,
}

/// Phase 1 of claim mode ([`drive_claim`]): the claim, committed on its own.
pub(crate) async fn claim_started<S, T, E, A>(
    steps: &mut S,
    spec: &'static HandlerSpec,
    claim: ClaimSpec,
    key: &MessageKey,
    remembered: Remembered<T>,
    inbox_error: fn(Error) -> E,
) -> Result<Started<A, T>, E>
where
    S: Steps,
    A: HandlerOutcome<T, InFlightWitness = ()>,
{
    tracing::debug!(key = ?key, "handling message");
    // A lease given as an expression (a setting), checked before anything runs; a literal
    // was checked at compile time.
    if !claim.valid() {
        return Err(inbox_error(Error::InvalidLease {
            lease_ms: claim.lease_ms,
        }));
    }
    take_back(steps).await;
    let (mut layout, mut run) = schema_checked(steps, spec, true, inbox_error).await?;
    kept_columns(spec, layout, &remembered, inbox_error)?;
    let (mut retries, mut rechecked, mut uncached) = (0, false, false);
    let (attempt, sent) = loop {
        let sent = Instant::now();
        let acquired = acquire(
            steps,
            run,
            claim,
            layout,
            key,
            A::STALE_CLAIM,
            remembered.fingerprint,
        )
        .await;
        match acquired {
            Ok(Acquired::Reused) => {
                tracing::warn!(
                    outcome = "key_reused",
                    "the key's claim is of a request with another fingerprint; body not run"
                );
                telemetry::failed(spec, ErrorClass::Other.label());
                return Err(inbox_error(Error::KeyReused {
                    consumer: spec.consumer.clone(),
                    key: key.clone(),
                }));
            }
            Ok(Acquired::Attempt(attempt)) => break (attempt, sent),
            Ok(Acquired::Completed) => {
                tracing::info!(outcome = "duplicate", "work completed before; body not run");
                let stored = match remembered.store {
                    Some(_) => {
                        let kept =
                            read_kept(steps, run, key, &remembered, false, inbox_error).await?;
                        stored_value(run, key, kept, remembered, inbox_error)?
                    }
                    None => None,
                };
                return Ok(Started::Answered(A::from_duplicate(
                    spec.consumer.clone(),
                    key.clone(),
                    stored,
                )));
            }
            Ok(Acquired::Live(lease_left)) => {
                tracing::info!(
                    outcome = "in_flight",
                    lease_left_ms = lease_left.map(|left| left.as_millis() as u64),
                    "claimed by a live delivery; body not run"
                );
                return Ok(Started::Answered(A::from_in_flight(
                    spec.consumer.clone(),
                    key.clone(),
                    lease_left,
                    (),
                )));
            }
            Ok(Acquired::Stale(attempts, witness)) => {
                telemetry::stale_claim(spec, "reported");
                tracing::warn!(
                    outcome = "stale_claim",
                    attempts,
                    "a claim's lease ended without completion; left for reconciliation"
                );
                return Ok(Started::Answered(A::from_stale_claim(
                    spec.consumer.clone(),
                    key.clone(),
                    attempts,
                    witness,
                )));
            }
            Err(e) if !rechecked && needs_recheck(&e, spec) => {
                rechecked = true;
                (layout, run) = rechecked_layout(steps, spec, true, inbox_error).await?;
            }
            // A prepared statement lost or clashing behind a transaction-mode pooler: as in
            // transaction mode, the connection stops caching them, once, and claims again.
            Err(e) if !uncached && statement_lost(steps, &e, spec) => uncached = true,
            Err(e) => wait_or_give_up(steps, spec, e, &mut retries, inbox_error).await?,
        }
    };

    tracing::debug!(attempt, "claimed; running the body");
    crash_point!(AfterClaim);
    telemetry::attempt(attempt);
    let netted = steps.net().is_some();
    Ok(Started::Holding(
        Holding {
            attempt,
            layout,
            run,
            netted,
            lease_ends: sent + Duration::from_millis(claim.lease_ms),
            lease_ms: claim.lease_ms,
        },
        remembered,
    ))
}

/// Phase 2 of claim mode on a pool: the body, run with no connection checked out. Every
/// write it sends on a connection with the net escapes; where the net is installed and the
/// claim's connection had none, the body is refused ([`Error::NetMissing`]), as on one
/// connection.
pub(crate) async fn run_detached<T, E, B>(
    spec: &'static HandlerSpec,
    holding: &Holding,
    body: &mut B,
) -> Result<Result<T, E>, Panicked>
where
    B: Body<NoConnection, Result<T, E>>,
{
    /// No net's address: the body has no connection of its own to write on.
    const NO_CONNECTION: usize = 0;
    let net = holding.netted.then_some(NO_CONNECTION);
    run_body(spec, body, &mut NoConnection::new(), None, net).await
}

/// The release of claim mode on a pool after a body that failed or was stopped, which got
/// no usable connection (`source`: the pool's checkout, or the connection's preparation):
/// the claim stays until its lease ends, and the body answers as
/// it would have. (A body that succeeded is stamped, never released.)
pub(crate) fn claim_unsettled<T, E, A>(
    spec: &'static HandlerSpec,
    holding: Holding,
    ran: Result<Result<T, E>, Panicked>,
    source: crate::pool::CheckoutFailure,
    inbox_error: fn(Error) -> E,
) -> Result<A, E> {
    let attempt = holding.attempt;
    match ran {
        Ok(Ok(_)) => unreachable!("a body that succeeded is stamped, not released"),
        Ok(Err(e)) => {
            tracing::error!(
                outcome = "failed",
                attempt,
                error = %source,
                "handler returned an error; no connection of the pool could release its claim"
            );
            telemetry::failed(spec, telemetry::error_type(None));
            Err(e)
        }
        Err(Panicked(payload)) if is_stopped(&*payload) => {
            tracing::error!(error = %source, "no connection of the pool could release the claim of a stopped body");
            telemetry::failed(spec, ErrorClass::Misuse.label());
            Err(inbox_error(stopped(payload)))
        }
        Err(Panicked(payload)) => {
            tracing::error!(
                outcome = "panicked",
                attempt,
                "the handler's body panicked; its claim stays until the lease ends"
            );
            std::panic::resume_unwind(payload)
        }
    }
}

/// A checkout for a claim-mode handler's claim failed: nothing ran.
pub(crate) fn claim_not_started<E>(
    spec: &'static HandlerSpec,
    source: crate::pool::CheckoutFailure,
    inbox_error: fn(Error) -> E,
) -> E {
    tracing::warn!(error = %source, "the pool gave the claim no connection; nothing ran");
    telemetry::failed(spec, ErrorClass::ConnectionLost.label());
    inbox_error(Error::Checkout {
        after_effect: None,
        source,
    })
}

/// How many checkouts the release of a claim made on a pool is given (after that, the claim
/// is left to its lease).
pub(crate) const RELEASE_CHECKOUTS: u32 = 3;

/// Before phase 3 on a connection checked out for it: a connection a cancelled delivery
/// left in error is taken back, and the connection is prepared as phase 1 prepares its own
/// (no transaction open, SQLite's busy timeout).
pub(crate) async fn prepared_for_stamp<S: Steps>(
    steps: &mut S,
    holding: &Holding,
) -> QueryResult<()> {
    take_back(steps).await;
    steps.prepare_claim(holding.run).await
}

/// Phase 2 and 3 of claim mode ([`drive_claim`]): what the body `ran` to, settled on the
/// claim `holding` — released after an error, stamped after success — on `steps`, the
/// connection of the claim or another one.
pub(crate) async fn claim_finished<S, T, E, A>(
    steps: &mut S,
    spec: &'static HandlerSpec,
    holding: Holding,
    key: MessageKey,
    ran: Result<Result<T, E>, Panicked>,
    remembered: Remembered<T>,
    inbox_error: fn(Error) -> E,
) -> Result<A, E>
where
    S: Steps,
    A: HandlerOutcome<T, InFlightWitness = ()>,
{
    let Holding {
        attempt,
        run,
        layout,
        ..
    } = holding;
    let result = match ran {
        Ok(result) => result,
        Err(Panicked(payload)) if is_stopped(&*payload) => {
            if let Err(error) = steps
                .claim_step(
                    run,
                    &key,
                    ClaimStep::Release {
                        attempt,
                        english: layout.english,
                    },
                )
                .await
            {
                tracing::error!(error = %error, "releasing the claim of a stopped body failed");
            }
            telemetry::failed(spec, ErrorClass::Misuse.label());
            return Err(inbox_error(stopped(payload)));
        }
        // No transaction is open while a claim-mode body runs. A panic leaves the outcome of
        // the side effect unknown, as a crash does, and is left as one: the claim stays
        // until its lease ends, then is taken over or reported, as the outcome type says.
        Err(Panicked(payload)) => {
            tracing::error!(
                outcome = "panicked",
                attempt,
                "the handler's body panicked; its claim stays until the lease ends"
            );
            std::panic::resume_unwind(payload)
        }
    };
    let value = match result {
        Ok(value) => value,
        Err(e) => {
            match steps
                .claim_step(
                    run,
                    &key,
                    ClaimStep::Release {
                        attempt,
                        english: layout.english,
                    },
                )
                .await
            {
                Ok(answer) if answer.changed() => {
                    tracing::debug!(
                        outcome = "failed",
                        attempt,
                        "handler returned an error; claim released"
                    )
                }
                Ok(_) => tracing::warn!(
                    outcome = "failed",
                    attempt,
                    "handler returned an error; its claim had been taken over"
                ),
                // The claim stays until its lease ends; then it is reclaimed or reported.
                Err(error) => tracing::error!(
                    outcome = "failed",
                    attempt,
                    error = %error,
                    "handler returned an error; releasing its claim failed"
                ),
            }
            telemetry::failed(spec, telemetry::error_type(None));
            return Err(e);
        }
    };

    let mut stamp = ToStamp::before_stamp(&value, &holding, remembered);
    match claim_stamped(
        steps,
        spec,
        &holding,
        &key,
        value,
        &mut stamp,
        inbox_error,
        None,
    )
    .await
    {
        Ok(answer) => Ok(answer),
        Err(Unstamped::Failed(e)) => Err(e),
        Err(Unstamped::Lost { .. }) => unreachable!("on its own connection, a stamp is not lost"),
    }
}

/// What a stamp writes besides `processed_at`: the result, written where the claim is still
/// this attempt's, just before the stamp. A result that cannot be stored does not stop the
/// stamp — the side effect happened — and is reported after it.
pub(crate) struct ToStamp {
    stored: Option<String>,
    unstorable: Option<Error>,
}

impl ToStamp {
    /// What the stamp of `value` writes; then the test kit's crash point before the stamp.
    pub(crate) fn before_stamp<T>(value: &T, holding: &Holding, remembered: Remembered<T>) -> Self {
        let stamp = Self::new(value, holding.layout, remembered);
        crash_point!(BeforeStamp);
        stamp
    }

    fn new<T>(value: &T, layout: Layout, remembered: Remembered<T>) -> Self {
        match remembered.store.map(|store| store.encode(value, layout)) {
            None => ToStamp {
                stored: None,
                unstorable: None,
            },
            Some(Ok(text)) => ToStamp {
                stored: Some(text),
                unstorable: None,
            },
            Some(Err(problem)) => ToStamp {
                stored: None,
                unstorable: Some(problem),
            },
        }
    }
}

/// A stamp not written: a failure that is the answer, or (on a pool) a connection lost,
/// whose stamp another connection tries.
pub(crate) enum Unstamped<T, E> {
    Failed(E),
    Lost { value: T, error: DieselError },
}

/// Phase 3 of claim mode after a body's success: the stamp, where the claim is still this
/// attempt's. `elsewhere`: the stamp may go to another connection (a pool's), so that a
/// connection lost or refused for writes (`Reconnect`) ends this try as
/// [`Unstamped::Lost`] instead of the effect's loss; the connection is prepared first, as a
/// fresh one.
#[allow(
    clippy::too_many_arguments,
    reason = "the claim, the value and what goes with it, each its own argument"
)]
pub(crate) async fn claim_stamped<S, T, E, A>(
    steps: &mut S,
    spec: &'static HandlerSpec,
    holding: &Holding,
    key: &MessageKey,
    value: T,
    stamp: &mut ToStamp,
    inbox_error: fn(Error) -> E,
    elsewhere: Option<Elsewhere>,
) -> Result<A, Unstamped<T, E>>
where
    S: Steps,
    A: HandlerOutcome<T, InFlightWitness = ()>,
{
    let (attempt, run, layout) = (holding.attempt, holding.run, holding.layout);
    let (mut retries, mut lost) = (0, 0);
    let prepared = match elsewhere {
        Some(_) => prepared_for_stamp(steps, holding).await,
        None => Ok(()),
    };
    let mut prepared = Some(prepared);
    // A try after a connection was lost under the stamp: its answer may have been lost
    // with the connection after the stamp committed.
    let after_loss = matches!(elsewhere, Some(Elsewhere { after_loss: true }));
    loop {
        let stamped = match prepared.take() {
            Some(Err(e)) => Err(e),
            _ => match &stamp.stored {
                Some(text) => match steps
                    .store_result(run, key, text.clone(), None, Some(attempt))
                    .await
                {
                    Ok(_) => {
                        steps
                            .claim_step(
                                run,
                                key,
                                ClaimStep::Stamp {
                                    attempt,
                                    english: layout.english,
                                },
                            )
                            .await
                    }
                    Err(e) => Err(e),
                },
                None => {
                    steps
                        .claim_step(
                            run,
                            key,
                            ClaimStep::Stamp {
                                attempt,
                                english: layout.english,
                            },
                        )
                        .await
                }
            },
        };
        // No row stamped after a lost answer: the stamp that was lost may be this attempt's
        // own, committed — the row completed at this attempt says so, and is its answer.
        let stamped = match stamped {
            Ok(answer) if after_loss && !answer.changed() => {
                match steps.claim_step(run, key, ClaimStep::Read).await {
                    Ok(ClaimAnswer::Read(Some((ClaimState::Completed, seen, _))))
                        if seen == attempt =>
                    {
                        tracing::info!(attempt, "the stamp whose answer was lost had committed");
                        Ok(ClaimAnswer::Rows(1))
                    }
                    Ok(_) => Ok(answer),
                    Err(e) => Err(e),
                }
            }
            other => other,
        };
        match stamped {
            Ok(answer) if answer.changed() => {
                tracing::debug!(outcome = "processed", attempt, "stamped complete");
                if let Some(problem) = stamp.unstorable.take() {
                    tracing::error!(
                        error = %problem,
                        attempt,
                        "the side effect ran and its claim is stamped, but its result is not stored"
                    );
                    telemetry::failed(spec, problem.class().label());
                    return Err(Unstamped::Failed(inbox_error(problem)));
                }
                return Ok(A::from_processed(value));
            }
            Ok(_) => {
                tracing::error!(
                    outcome = "claim_lost",
                    attempt,
                    "the side effect ran, but the claim had been taken over: not stamped"
                );
                telemetry::failed(spec, ErrorClass::ClaimLost.label());
                return Err(Unstamped::Failed(inbox_error(Error::ClaimLost { attempt })));
            }
            // The side effect ran: a statement lost behind a pooler must not leave it
            // unrecorded. The cache off, diesel-async's driver still names what it prepares:
            // a few more tries, on another server connection each.
            Err(e) if lost < 3 && statement_lost(steps, &e, spec) => lost += 1,
            Err(e) => match retry_after(spec, &e, retries).or_else(|| unread(spec, &e, retries)) {
                Some(after) => {
                    retries += 1;
                    steps.pause(after).await;
                }
                // On a pool, another connection: this one is gone, refuses writes, or
                // answers what the runtime cannot read — a server in another language, whose
                // session a transaction-mode pooler handed this statement without the
                // English the check set on another (an operator's trial: a French server's
                // statement timeout on the stamp, given up at once, ran effects twice).
                None if elsewhere.is_some() => {
                    tracing::warn!(
                        attempt,
                        error = %e,
                        "stamping the claim failed on its connection; trying another of the pool"
                    );
                    // Not back into the pool for the next try to take again.
                    steps.discard();
                    return Err(Unstamped::Lost { value, error: e });
                }
                // The effect happened: an error of its own, which says so, rather than the
                // database's, which a pump would retry or dead-letter.
                None => {
                    tracing::error!(
                        outcome = "effect_not_recorded",
                        attempt,
                        error = %e,
                        "the side effect ran, but stamping its claim complete failed"
                    );
                    telemetry::failed(spec, ErrorClass::EffectNotRecorded.label());
                    return Err(Unstamped::Failed(inbox_error(Error::EffectNotRecorded {
                        attempt,
                        attempts: retries + 1,
                        source: e,
                    })));
                }
            },
        }
    }
}

/// The last of a pool's tries to stamp a claim failed (`last`) and the lease is over: the
/// effect is not recorded — [`Error::EffectNotRecorded`] after a lost connection,
/// [`Error::Checkout`] after a pool that gave none.
pub(crate) fn stamp_given_up<E>(
    spec: &'static HandlerSpec,
    holding: &Holding,
    last: StampFailure,
    tries: u32,
    inbox_error: fn(Error) -> E,
) -> E {
    let attempt = holding.attempt;
    tracing::error!(
        outcome = "effect_not_recorded",
        attempt,
        tries,
        "the side effect ran, but no connection of the pool stamped its claim in time"
    );
    telemetry::failed(spec, ErrorClass::EffectNotRecorded.label());
    inbox_error(match last {
        StampFailure::Database(source) => Error::EffectNotRecorded {
            attempt,
            attempts: tries,
            source,
        },
        StampFailure::Checkout(source) => Error::Checkout {
            after_effect: Some(attempt),
            source,
        },
    })
}

/// A stamp on a pool's connection, which may be another than the claim's
/// ([`claim_stamped`]): `after_loss` when a try before it lost its connection.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Elsewhere {
    pub(crate) after_loss: bool,
}

/// Why a pool's try to stamp a claim failed.
pub(crate) enum StampFailure {
    Database(DieselError),
    Checkout(crate::pool::CheckoutFailure),
}

/// How long a pool's stamp keeps trying: for a lease past the claim's lease — a stamp
/// after the lease still completes the work unless a delivery took the claim over, which
/// its compare-and-set then tells (`ClaimLost`) —, at least three tries. After a checkout
/// the pool refused (it waited as long as it is set to) the next try comes at once, not to
/// leave the pool's queue to new claims; after a lost connection, from 50 ms, doubling, up
/// to a second (a server restarting).
pub(crate) struct StampTries {
    until: Instant,
    pause: Duration,
    tries: u32,
    lost: bool,
}

impl StampTries {
    pub(crate) fn new(holding: &Holding) -> Self {
        StampTries {
            until: holding.lease_ends + Duration::from_millis(holding.lease_ms),
            pause: Duration::from_millis(50),
            tries: 0,
            lost: false,
        }
    }

    /// Counts a try that failed (`failure`); the pause before the next one, `None` when
    /// the time is over (after at least three tries).
    pub(crate) fn failed(&mut self, failure: &StampFailure) -> Option<Duration> {
        self.tries += 1;
        if self.tries >= 3 && Instant::now() >= self.until {
            return None;
        }
        match failure {
            StampFailure::Checkout(_) => Some(Duration::from_millis(1)),
            StampFailure::Database(_) => {
                self.lost = true;
                let pause = self.pause;
                self.pause = (self.pause * 2).min(Duration::from_secs(1));
                Some(pause)
            }
        }
    }

    /// What the next try is: after a lost connection or not.
    pub(crate) fn elsewhere(&self) -> Elsewhere {
        Elsewhere {
            after_loss: self.lost,
        }
    }

    pub(crate) fn tries(&self) -> u32 {
        self.tries
    }
}

/// How phase 1 of claim mode ended.
pub(super) enum Acquired<W> {
    /// This delivery holds the claim of this attempt.
    Attempt(u32),
    Completed,
    /// Held by another delivery, for this long yet (`None`: not read).
    Live(Option<Duration>),
    /// Expired, and reported rather than taken over (after this many attempts).
    Stale(u32, W),
    /// The claim (of any state) was made for a request with another fingerprint.
    Reused,
}

/// Phase 1 of claim mode; each statement commits on its own. `report` is the outcome type's
/// witness that it can answer `StaleClaim`: with one, an expired claim is reported; without,
/// it is taken over.
pub(super) async fn acquire<S: Steps, W: Copy>(
    steps: &mut S,
    spec: &'static HandlerSpec,
    claim: ClaimSpec,
    layout: Layout,
    key: &MessageKey,
    report: Option<W>,
    fingerprint: Option<Fingerprint>,
) -> QueryResult<Acquired<W>> {
    /// Rounds of insert, read and takeover. Each round that does not decide saw the row
    /// change under it (taken over, or removed); a third in a row means deliveries of the
    /// same message keep racing, and the one reporting `Live` lets the broker retry later.
    const ROUNDS: usize = 3;
    steps.prepare_claim(spec).await?;
    // Rounds whose insert wrote nothing and whose read found nothing: a claim removed in
    // between once, perhaps; every round, the table swallows the insert (a trigger or rule
    // added since the check) — a schema fault, never `InFlight` for ever.
    let mut vanished = 0;
    for _ in 0..ROUNDS {
        let insert = ClaimStep::Insert {
            lease_ms: claim.lease_ms,
            layout,
            fingerprint,
        };
        let sent = Instant::now();
        if steps.claim_step(spec, key, insert).await?.changed() {
            if claim.too_late(sent) {
                give_back(steps, spec, key, 1, layout).await?;
                continue;
            }
            return Ok(Acquired::Attempt(1));
        }
        let ClaimAnswer::Read(row) = steps.claim_step(spec, key, ClaimStep::Read).await? else {
            unreachable!("a read answers with the row")
        };
        let (state, seen, lease_left) = match row {
            Some(row) => row,
            // Removed between the insert and the read: insert again.
            None => {
                vanished += 1;
                continue;
            }
        };
        // The claim of another request under this key: refused whatever its state, in flight
        // or done (the claim's insert wrote its fingerprint).
        if fingerprint.is_some()
            && steps
                .read_kept(spec, key, (false, true), false)
                .await?
                .reused_by(fingerprint)
        {
            return Ok(Acquired::Reused);
        }
        let expired = match (state, report) {
            (ClaimState::Completed, _) => return Ok(Acquired::Completed),
            (ClaimState::Live, _) => return Ok(Acquired::Live(Some(lease_left))),
            (ClaimState::Expired, Some(witness)) => return Ok(Acquired::Stale(seen, witness)),
            (ClaimState::Expired, None) => true,
            (ClaimState::Released, _) => false,
            // A plain read never answers it; were it to, waiting is safe.
            (ClaimState::Unread, _) => return Ok(Acquired::Live(None)),
        };
        let take_over = ClaimStep::TakeOver {
            seen,
            lease_ms: claim.lease_ms,
            expired,
            english: layout.english,
        };
        let sent = Instant::now();
        if steps.claim_step(spec, key, take_over).await?.changed() {
            if claim.too_late(sent) {
                give_back(steps, spec, key, seen + 1, layout).await?;
                continue;
            }
            if expired {
                telemetry::stale_claim(spec, "taken_over");
                tracing::warn!(
                    attempt = seen + 1,
                    "took over a claim whose lease had ended without completion"
                );
            }
            return Ok(Acquired::Attempt(seen + 1));
        }
    }
    if vanished == ROUNDS {
        tracing::error!("every claim insert wrote no row, and no claim is there");
        return Err(swallowed(spec));
    }
    Ok(Acquired::Live(Some(Duration::from_millis(claim.lease_ms))))
}

/// Releases the claim of `attempt`, won too late to run the body under it
/// ([`ClaimSpec::too_late`]): the next round takes it over again with a whole lease, unless
/// another delivery's takeover was faster.
pub(super) async fn give_back<S: Steps>(
    steps: &mut S,
    spec: &'static HandlerSpec,
    key: &MessageKey,
    attempt: u32,
    layout: Layout,
) -> QueryResult<()> {
    tracing::warn!(
        attempt,
        "the claim took over a quarter of its lease to commit; released, claimed again"
    );
    steps
        .claim_step(
            spec,
            key,
            ClaimStep::Release {
                attempt,
                english: layout.english,
            },
        )
        .await
        .map(drop)
}

/// Waits before retrying a database error of claim mode, or returns it as the handler's error
/// when it is not transient or the retries are used up.
pub(super) async fn wait_or_give_up<S: Steps, E>(
    steps: &mut S,
    spec: &HandlerSpec,
    error: DieselError,
    retries: &mut u32,
    inbox_error: fn(Error) -> E,
) -> Result<(), E> {
    match retry_after(spec, &error, *retries) {
        Some(after) => {
            *retries += 1;
            steps.pause(after).await;
            Ok(())
        }
        None => {
            let class = classify(&error, &spec.schema);
            if class == ErrorClass::Schema {
                forget_check(steps, spec);
            }
            discard(steps, Some(&class));
            let failure = Failure::<(), E>::Database(error);
            Err(give_up(
                spec,
                failure,
                Some(class),
                *retries + 1,
                inbox_error,
            ))
        }
    }
}

/// The pause before trying a stamp again after an error the runtime cannot read
/// ([`ErrorClass::Other`]: a server's message in another language, a driver's own text), as
/// many times as a transient failure is retried: the side effect ran, and what failed may
/// well be transient. `None` for any other error, or once the retries are used.
fn unread(spec: &HandlerSpec, error: &DieselError, retries: u32) -> Option<Duration> {
    let class = classify(error, &spec.schema);
    if class != ErrorClass::Other || retries >= spec.retry.max_retries().max(3) {
        return None;
    }
    let after = Duration::from_millis(50 << retries.min(5));
    tracing::warn!(
        error = %error,
        retry = retries + 1,
        after_ms = after.as_millis() as u64,
        "stamping the claim failed with an error not recognised; trying again"
    );
    Some(after)
}

/// The pause before retrying a database error of claim mode, or `None` to give up.
pub(super) fn retry_after(
    spec: &HandlerSpec,
    error: &DieselError,
    retries: u32,
) -> Option<Duration> {
    let class = classify(error, &spec.schema);
    match spec.retry.decide(&class, retries, fastrand::f64()) {
        RetryDecision::Retry { after } => {
            telemetry::retried(spec, &class);
            tracing::warn!(
                class = %class,
                retry = retries + 1,
                after_ms = after.as_millis() as u64,
                "transient failure; retrying"
            );
            Some(after)
        }
        RetryDecision::GiveUp => None,
    }
}
