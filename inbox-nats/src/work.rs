//! One message from the pull that brought it to its settlement: the pull's end, the job a
//! message or a hand-back is, the handler run through `inbox_diesel::pump`, and the
//! settlement sent and confirmed.

use super::*;

/// The pull request waiting on the server: at most one at a time, for as many messages as
/// the pump had free slots when it sent it.
pub(crate) struct Pull {
    pub(crate) id: u64,
    pub(crate) wanted: usize,
    pub(crate) received: usize,
    pub(crate) deadline: Instant,
}

/// What a status reply ending a pull request means.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum PullEnd {
    /// It expired (408), or found nothing (404): pull again.
    Expired,
    /// The consumer was deleted while the request waited (409 `Consumer Deleted`).
    ConsumerDeleted,
    /// Refused, and every request would be: it asks more than the consumer's `max_batch`
    /// or `max_expires` allow, or the consumer is a push consumer (409).
    Refused,
    /// No one answers for the consumer (503).
    NoResponders,
    /// Anything else (409 `Exceeded MaxWaiting`, `Leadership Change`, …): pull again after a
    /// pause.
    Other,
}

impl PullEnd {
    pub(crate) fn of(status: StatusCode, description: &str) -> Self {
        match status {
            StatusCode::TIMEOUT | StatusCode::NOT_FOUND => PullEnd::Expired,
            StatusCode::REQUEST_TERMINATED
                if description.eq_ignore_ascii_case("consumer deleted") =>
            {
                PullEnd::ConsumerDeleted
            }
            StatusCode::REQUEST_TERMINATED
                if description.starts_with("Exceeded MaxRequest")
                    || description.contains("push based") =>
            {
                PullEnd::Refused
            }
            StatusCode::NO_RESPONDERS => PullEnd::NoResponders,
            _ => PullEnd::Other,
        }
    }
}

/// Why the pump stopped, other than its shutdown or a halt.
pub(crate) enum End {
    Deleted,
    Broker(String),
}

#[derive(Clone, Copy)]
pub(crate) struct Settings {
    pub(crate) redelivery: Redelivery,
    pub(crate) progress_every: Duration,
}

pub(crate) enum Job {
    /// Run the handler, then settle by its answer.
    Handle(Message),
    /// Hand the message back unstarted (or, `halted`, after a halting answer): `Nak` without
    /// delay.
    Return { acker: Acker, halted: bool },
}

pub(crate) enum Done {
    Settled {
        settlement: Settlement,
        confirmed: bool,
        /// The stream sequence of a message this pump handed back (`Nak`): when it comes
        /// again, it is not a stranger's redelivery ([`Window`]).
        handed_back: Option<u64>,
    },
    /// The answer halts the pump; the message is handed back once the pump stopped pulling.
    Halted {
        answer: String,
        acker: Box<Acker>,
    },
    Returned {
        halted: bool,
        confirmed: bool,
    },
}

pub(crate) async fn work<H, F, A>(
    handler: &H,
    settings: Settings,
    outage: &Outage,
    stopping: &tokio::sync::watch::Receiver<bool>,
    job: Job,
) -> Done
where
    H: Fn(Message) -> F,
    F: Future<Output = A>,
    A: Settle + std::fmt::Debug,
{
    let message = match job {
        Job::Handle(message) => message,
        Job::Return { acker, halted } => {
            let confirmed = confirm(&acker, AckKind::Nak(None), "nak").await;
            return Done::Returned { halted, confirmed };
        }
    };
    let acker = acker(&message);
    let count = delivery_count(&message);
    // The stream, not the subject, names the destination: a subject can carry an id, and a
    // span name should not.
    let (stream, sequence) = match message.info() {
        Ok(info) => (info.stream.to_owned(), Some(info.stream_sequence)),
        Err(_) => (message.subject.to_string(), None),
    };
    let span = process_span("nats", &stream, count);
    let in_hand = InHand {
        span: &span,
        system: "nats",
        noun: "message",
        progress_every: Some(settings.progress_every),
    };
    // Sent without waiting for a confirmation: a lost one is followed by the next well within
    // `ack_wait`.
    let progress = {
        let acker = &acker;
        move || async move {
            if let Err(e) = acker.ack_with(AckKind::Progress).await {
                tracing::warn!(error = %e, "reporting a message in progress failed");
            }
        }
    };
    let settlement = match process(in_hand, outage, stopping, progress, || handler(message)).await {
        Processed::Unstarted => {
            let confirmed = confirm(&acker, AckKind::Nak(None), "nak")
                .instrument(span)
                .await;
            return Done::Returned {
                halted: false,
                confirmed,
            };
        }
        Processed::Panicked { settlement } | Processed::Answered { settlement, .. } => settlement,
        // Back to the stream once the pump stopped pulling, for when the deployment is fixed.
        Processed::Halted { answer, .. } => {
            return Done::Halted {
                answer,
                acker: Box::new(acker),
            };
        }
    };
    let kind = match settlement {
        Settlement::Ack => AckKind::Ack,
        Settlement::DeadLetter => AckKind::Term,
        _ => {
            let delay = settings.redelivery.delay_of(settlement, count);
            AckKind::Nak((!delay.is_zero()).then_some(delay))
        }
    };
    let handed_back = match kind {
        AckKind::Nak(_) => sequence,
        _ => None,
    };
    let confirmed = confirm(&acker, kind, settlement.as_str())
        .instrument(span)
        .await;
    Done::Settled {
        settlement,
        confirmed,
        handed_back,
    }
}

/// Sends a settlement and waits for the server's confirmation.
pub(crate) async fn confirm(acker: &Acker, kind: AckKind, settlement: &'static str) -> bool {
    match acker.double_ack_with(kind).await {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(
                error = %e,
                settlement,
                "the server did not confirm a settlement; JetStream redelivers the message \
                 after ack_wait"
            );
            false
        }
    }
}
