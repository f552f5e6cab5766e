//! Acquiring the claim: its insert, the read of a row that is there, the takeover of a
//! released or expired one, and the waits and retries between them.

use super::*;

/// How phase 1 of claim mode ended.
pub(in crate::runtime) enum Acquired<W> {
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
pub(in crate::runtime) async fn acquire<S: Steps, W: Copy>(
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
                give_back(steps, spec, key, 1).await?;
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
        };
        let sent = Instant::now();
        if steps.claim_step(spec, key, take_over).await?.changed() {
            if claim.too_late(sent) {
                give_back(steps, spec, key, seen + 1).await?;
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
pub(in crate::runtime) async fn give_back<S: Steps>(
    steps: &mut S,
    spec: &'static HandlerSpec,
    key: &MessageKey,
    attempt: u32,
) -> QueryResult<()> {
    tracing::warn!(
        attempt,
        "the claim took over a quarter of its lease to commit; released, claimed again"
    );
    steps
        .claim_step(spec, key, ClaimStep::Release { attempt })
        .await
        .map(drop)
}

/// Waits before retrying a database error of claim mode, or returns it as the handler's error
/// when it is not transient or the retries are used up.
pub(in crate::runtime) async fn wait_or_give_up<S: Steps, E>(
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
pub(super) fn unread(spec: &HandlerSpec, error: &DieselError, retries: u32) -> Option<Duration> {
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
pub(in crate::runtime) fn retry_after(
    spec: &HandlerSpec,
    error: &DieselError,
    retries: u32,
) -> Option<Duration> {
    let class = classify(error, &spec.schema);
    match spec.retry.decide(&class, retries, fastrand::f64()) {
        RetryDecision::Retry { after } => {
            telemetry::retried(spec, &class);
            warn_retrying(&class, retries, after, "transient failure; retrying");
            Some(after)
        }
        RetryDecision::GiveUp => None,
    }
}

/// Logs that a statement of claim mode failed with `class` and is tried again `after` a
/// pause: the `retries + 1`th retry.
pub(super) fn warn_retrying(class: &ErrorClass, retries: u32, after: Duration, message: &str) {
    tracing::warn!(
        class = %class,
        retry = retries + 1,
        after_ms = after.as_millis() as u64,
        "{message}"
    );
}
