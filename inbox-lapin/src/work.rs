//! One delivery from its arrival to its settlement: the handler run through
//! `inbox_diesel::pump` (a stranger's redelivery alone), the settlement sent after a retry's
//! delay; and a delivery handed back unstarted.

use inbox_diesel::pump::{Done, Sent};

use super::*;

/// What every delivery's run shares.
pub(crate) struct Shared<'a, H> {
    pub(crate) pump: &'a Pump,
    pub(crate) handler: &'a H,
    pub(crate) queue: &'a str,
    pub(crate) outage: &'a Outage,
    pub(crate) stopping: &'a tokio::sync::watch::Receiver<bool>,
    pub(crate) window: &'a std::sync::Mutex<Window>,
    /// Handlers hold it shared; a stranger's redelivery alone ([`Pump::slow_start`]).
    /// tokio's lock is fair: a stranger waiting for it holds back the handlers after it.
    pub(crate) lane: &'a tokio::sync::RwLock<()>,
}

pub(crate) async fn work<H, F, A>(shared: &Shared<'_, H>, arrived: Arrived) -> Done<lapin::Acker>
where
    H: Fn(Delivery) -> F,
    F: Future<Output = A>,
    A: Settle + std::fmt::Debug,
{
    let Arrived {
        delivery,
        stranger,
        identity,
    } = arrived;
    let Shared {
        pump,
        handler,
        queue,
        outage,
        stopping,
        window,
        lane,
    } = *shared;
    let acker = delivery.acker.clone();
    let count = delivery_count(&delivery);
    let span = process_span("rabbitmq", queue, count);
    if let Some(id) = delivery.properties.message_id() {
        span.record("messaging.message.id", id.as_str());
    }
    span.record(
        "messaging.rabbitmq.destination.routing_key",
        delivery.routing_key.as_str(),
    );
    let in_hand = InHand {
        span: &span,
        system: "rabbitmq",
        noun: "delivery",
        progress_every: None,
    };
    // A stranger's redelivery runs alone, once the handlers in hand have answered: if it is
    // what killed a process, it dies alone.
    let alone = stranger && pump.slow_start;
    let processed = process(
        in_hand,
        outage,
        stopping,
        || async {},
        || async {
            let (shared, alone) = match alone {
                true => (None, Some(lane.write().await)),
                false => (Some(lane.read().await), None),
            };
            let answer = handler(delivery).await;
            drop((shared, alone));
            answer
        },
    )
    .await;
    let settlement = match processed {
        // Handed back unstarted: the pump stopped while it waited at the gate (not requeued
        // during the outage, which a quorum queue counts against its `x-delivery-limit` on
        // every turn of a long one).
        Processed::Unstarted => {
            let retry = Settlement::Retry { reconnect: false };
            record_settlement(&span, "rabbitmq", retry);
            let sent = settle(&acker, retry, Duration::ZERO, stopping.clone())
                .instrument(span)
                .await;
            lock(window).handed_back(identity);
            return Done::Settled {
                settlement: retry,
                sent,
                handed_back: None,
            };
        }
        Processed::Panicked { settlement } | Processed::Answered { settlement, .. } => settlement,
        // Back to the queue once the pump stopped taking deliveries, for when the deployment
        // is fixed.
        Processed::Halted { answer, .. } => {
            return Done::Halting {
                answer,
                back: acker,
            };
        }
    };
    let delay = pump.redelivery.delay_of(settlement, count);
    {
        let mut window = lock(window);
        if !matches!(settlement, Settlement::Ack | Settlement::DeadLetter) {
            window.handed_back(identity);
        }
        let held = matches!(
            settlement,
            Settlement::Retry { .. } | Settlement::Held { .. }
        ) && !delay.is_zero();
        window.answered(stranger, held);
    }
    // While a stranger waits or runs alone, the others' settlements wait too: each would free
    // a prefetch slot, and the broker would fill it with a delivery that dies with the
    // stranger if it kills the process.
    if !stranger {
        drop(lane.read().await);
    }
    let sent = settle(&acker, settlement, delay, stopping.clone())
        .instrument(span)
        .await;
    Done::Settled {
        settlement,
        sent,
        handed_back: None,
    }
}

/// Hands a delivery back to the queue unstarted (`basic.nack` with requeue): one the channel
/// had buffered when the pump stopped, or (`halted`) one whose answer halted the pump. A
/// halting one the channel cannot take stops the pump as a failed settlement would; one that
/// was never started is redelivered with the channel's end either way.
pub(crate) async fn give_back(acker: lapin::Acker, halted: bool) -> Done<lapin::Acker> {
    let sent = requeue(&acker).await;
    let sent = match sent {
        Sent::Failed(_) if !halted => Sent::Unconfirmed,
        sent => sent,
    };
    Done::Returned { halted, sent }
}

async fn requeue(acker: &lapin::Acker) -> Sent {
    sent(
        acker
            .nack(BasicNackOptions {
                requeue: true,
                ..BasicNackOptions::default()
            })
            .await,
    )
}

/// Settles one delivery. A retry waits out its delay before the requeue — or less, when the
/// pump stops meanwhile (`stopping`): a shutdown does not wait for it.
pub(crate) async fn settle(
    acker: &lapin::Acker,
    settlement: Settlement,
    delay: Duration,
    mut stopping: tokio::sync::watch::Receiver<bool>,
) -> Sent {
    match settlement {
        Settlement::Ack => sent(acker.ack(BasicAckOptions::default()).await),
        Settlement::Retry { .. } | Settlement::Held { .. } => {
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                _ = stopping.wait_for(|stopping| *stopping) => {}
            }
            requeue(acker).await
        }
        Settlement::DeadLetter => sent(acker.reject(BasicRejectOptions { requeue: false }).await),
        // Back to the queue, for when the deployment is fixed; and `Settlement` is
        // non-exhaustive: what a later version adds is not acknowledged blindly.
        _ => requeue(acker).await,
    }
}

/// Whether the broker was sent a settlement. One the channel could no longer send (closed or
/// failed since the delivery: lapin answers `false`) never reaches it — the broker delivers
/// the message again — and the channel's failure stops the pump.
fn sent(result: lapin::Result<bool>) -> Sent {
    match result {
        Ok(true) => Sent::Confirmed,
        Ok(false) => {
            let why = "the channel closed before the delivery was settled; the broker delivers \
                       it again";
            tracing::warn!("{why}");
            Sent::Failed(why.to_owned())
        }
        Err(e) => Sent::Failed(e.to_string()),
    }
}
