//! The stamp of a claim whose body returned: the stored result with it, tried again on an
//! error it cannot read or on another connection of the pool, and what is left when it fails.

use super::*;

/// The stamp of a claim whose body returned, and what it writes besides `processed_at`: the
/// result, written where the claim is still this attempt's, just before the stamp. A result
/// that cannot be stored does not stop the stamp — the side effect happened — and is
/// reported after it.
pub(crate) struct ToStamp<'k, E> {
    spec: &'static HandlerSpec,
    holding: Holding,
    key: &'k MessageKey,
    inbox_error: fn(Error) -> E,
    stored: Option<String>,
    unstorable: Option<Error>,
}

impl<'k, E> ToStamp<'k, E> {
    /// What the stamp of `value` on the claim `holding` of `key` writes; then the test kit's
    /// crash point before the stamp.
    pub(crate) fn before_stamp<T>(
        spec: &'static HandlerSpec,
        holding: &Holding,
        key: &'k MessageKey,
        value: &T,
        remembered: Remembered<T>,
        inbox_error: fn(Error) -> E,
    ) -> Self {
        let (stored, unstorable) = match remembered
            .store
            .map(|store| store.encode(value, holding.layout))
        {
            None => (None, None),
            Some(Ok(text)) => (Some(text), None),
            Some(Err(problem)) => (None, Some(problem)),
        };
        let stamp = ToStamp {
            spec,
            holding: *holding,
            key,
            inbox_error,
            stored,
            unstorable,
        };
        crash_point!(BeforeStamp);
        stamp
    }
}

/// A stamp not written: a failure that is the answer, or (on a pool) a connection lost,
/// whose stamp another connection tries.
pub(crate) enum Unstamped<T, E> {
    Failed(E),
    Lost { value: T, error: DieselError },
}

/// Phase 3 of claim mode after a body's success: the stamp of `value`, where the claim is
/// still this attempt's. `elsewhere`: the stamp may go to another connection (a pool's), so
/// that a connection lost or refused for writes (`Reconnect`) ends this try as
/// [`Unstamped::Lost`] instead of the effect's loss; the connection is prepared first, as a
/// fresh one.
pub(crate) async fn claim_stamped<S, T, E, A>(
    steps: &mut S,
    stamp: &mut ToStamp<'_, E>,
    value: T,
    elsewhere: Option<Elsewhere>,
) -> Result<A, Unstamped<T, E>>
where
    S: Steps,
    A: HandlerOutcome<T, InFlightWitness = ()>,
{
    let (spec, holding, key, inbox_error) =
        (stamp.spec, stamp.holding, stamp.key, stamp.inbox_error);
    let (attempt, run) = (holding.attempt, holding.run);
    let (mut retries, mut lost) = (0, 0);
    let prepared = match elsewhere {
        Some(_) => prepared_for_stamp(steps, &holding).await,
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
                            .claim_step(run, key, ClaimStep::Stamp { attempt })
                            .await
                    }
                    Err(e) => Err(e),
                },
                None => {
                    steps
                        .claim_step(run, key, ClaimStep::Stamp { attempt })
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
            Err(e) => match stamp_retry(spec, &holding, &e, retries) {
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

/// The pause before a stamp is tried again on its connection after `error`, or `None` to
/// give up there. The side effect ran: a stamp given up leaves it unrecorded, and once the
/// lease ends a redelivery takes the claim over and runs it again (an operator's trial: a
/// migration's table lock outlasting a role's `lock_timeout` through the four tries of
/// `retries`, two e-mails for one message). So a transient failure, or one the runtime
/// cannot read, is tried again past the handler's retries for as long as a pool's stamp
/// keeps trying ([`StampTries`]: until the lease has passed once more), from 50 ms, doubling,
/// up to a second; a stamp after the lease still completes the claim unless a delivery took
/// it over, which its compare-and-set tells.
fn stamp_retry(
    spec: &'static HandlerSpec,
    holding: &Holding,
    error: &DieselError,
    retries: u32,
) -> Option<Duration> {
    if let Some(after) = retry_after(spec, error, retries).or_else(|| unread(spec, error, retries))
    {
        return Some(after);
    }
    let class = classify(error, &spec.schema);
    let transient = class == ErrorClass::Other || class.action() == inbox_core::Action::RetryLater;
    let until = holding.lease_ends + Duration::from_millis(holding.lease_ms);
    if !transient || Instant::now() >= until {
        return None;
    }
    let after = Duration::from_millis(50 << retries.min(5)).min(Duration::from_secs(1));
    warn_retrying(
        &class,
        retries,
        after,
        "stamping the claim failed; trying again while the claim's time lasts",
    );
    Some(after)
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
