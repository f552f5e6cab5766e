//! One delivery from the moment a pump holds it to the handler's settlement ([`process`]).

use std::fmt::Debug;
use std::future::Future;
use std::time::Duration;

use futures_util::FutureExt;
use inbox_core::{Gate, Outage, Settle, Settlement};
use tokio::time::Instant;
use tracing::{Instrument, Span};

use crate::telemetry::{record_outage, record_settlement, unseen};

/// One delivery in a pump's hands, as [`process`] needs to know it.
#[derive(Debug, Clone, Copy)]
pub struct InHand<'a> {
    /// The span of its processing ([`process_span`](crate::telemetry::process_span)).
    pub span: &'a Span,
    /// The broker, as `messaging.system` names it: `"rabbitmq"`, `"nats"`.
    pub system: &'static str,
    /// What the broker calls one, for the messages that say what became of it:
    /// `"delivery"`, `"message"`.
    pub noun: &'static str,
    /// How often the broker must hear that it is in progress, or it delivers it again;
    /// `None` where it waits for the settlement however long it takes.
    pub progress_every: Option<Duration>,
}

/// How a delivery left [`process`].
#[derive(Debug)]
pub enum Processed<A> {
    /// The pump stopped while the delivery waited at the outage gate: its handler never
    /// ran. Hand it back without delay.
    Unstarted,
    /// The handler answered; `settlement` is what its answer says
    /// ([`Settle::settlement`]): an ack, a retry, a dead letter.
    Answered {
        /// The handler's answer.
        answer: A,
        /// What to do with the delivery.
        settlement: Settlement,
    },
    /// The handler's answer halts the consumer ([`Settlement::Halt`], or a settlement a
    /// later version adds, which is not acknowledged blindly): a deployment fault every
    /// delivery would meet. Stop taking deliveries, and hand this one back.
    Halted {
        /// The answer, as `Debug` prints it.
        answer: String,
        /// What the answer said.
        settlement: Settlement,
    },
    /// The handler panicked: its delivery alone is handed back ([`Settlement::of_panic`]).
    Panicked {
        /// What to do with the delivery.
        settlement: Settlement,
    },
}

/// Takes one delivery through the outage gate, its handler and its settlement; see the
/// [module documentation](crate::pump). `stopping` turns `true` once the pump stops taking
/// deliveries; `progress` reports the delivery in progress to the broker (called only with
/// [`InHand::progress_every`]); `handler` calls the application's handler on the delivery.
pub async fn process<A, F, P, PF>(
    in_hand: InHand<'_>,
    outage: &Outage,
    stopping: &tokio::sync::watch::Receiver<bool>,
    progress: P,
    handler: impl FnOnce() -> F,
) -> Processed<A>
where
    F: Future<Output = A>,
    A: Settle + Debug,
    P: Fn() -> PF,
    PF: Future<Output = ()>,
{
    let InHand {
        span,
        system,
        noun,
        progress_every,
    } = in_hand;
    let mut stopping = stopping.clone();
    let mut reported = Instant::now();
    while let Gate::Closed(wait) = outage.enter() {
        // Awake at least as often as the delivery must be reported in progress: a pause can
        // be longer than the broker's bound.
        let nap = progress_every.map_or(wait, |every| wait.min(every));
        let stopped = tokio::select! {
            () = tokio::time::sleep(nap) => false,
            _ = stopping.wait_for(|stopping| *stopping) => true,
        };
        if stopped {
            return Processed::Unstarted;
        }
        if let Some(every) = progress_every
            && reported.elapsed() >= every
        {
            reported = Instant::now();
            progress().await;
        }
    }
    let run = std::panic::AssertUnwindSafe(async {
        span.in_scope(handler).instrument(span.clone()).await
    })
    .catch_unwind();
    let answer = match progress_every {
        None => run.await,
        Some(every) => {
            let mut run = std::pin::pin!(run);
            let mut ticks = tokio::time::interval_at(Instant::now() + every, every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    answer = &mut run => break answer,
                    _ = ticks.tick() => progress().await,
                }
            }
        }
    };
    let answer = match answer {
        Ok(answer) => answer,
        Err(panic) => {
            let (settlement, said) = Settlement::of_panic(panic.as_ref());
            record_outage(span, outage, settlement, true);
            record_settlement(span, system, settlement);
            span.in_scope(|| {
                tracing::error!(
                    panic = said,
                    "the handler panicked; its {noun} is handed back"
                );
            });
            unseen(format_args!(
                "the handler panicked ({said}); its {noun} is handed back"
            ));
            return Processed::Panicked { settlement };
        }
    };
    let settlement = answer.settlement();
    record_outage(span, outage, settlement, false);
    record_settlement(span, system, settlement);
    match settlement {
        Settlement::Ack | Settlement::Retry { .. } | Settlement::Held { .. } => {}
        Settlement::DeadLetter => unseen(format_args!(
            "a {noun} is dead-lettered on the handler's answer: {answer:?}"
        )),
        // `Halt`, and what a later version adds to the non-exhaustive `Settlement`: the
        // adapter stops the pump rather than settle blindly.
        _ => {
            span.in_scope(|| {
                tracing::error!(answer = ?answer, "the handler's answer halts the consumer");
            });
            unseen(format_args!(
                "the handler's answer halts the consumer: {answer:?}"
            ));
            return Processed::Halted {
                answer: format!("{answer:?}"),
                settlement,
            };
        }
    }
    Processed::Answered { answer, settlement }
}
