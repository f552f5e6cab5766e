//! One message from its arrival to its settlement: the handler run through
//! `inbox_diesel::pump`, the settlement sent and confirmed; and a message handed back
//! unstarted.

use inbox_diesel::pump::{Done, Sent};

use super::*;

#[derive(Clone, Copy)]
pub(crate) struct Settings {
    pub(crate) redelivery: Redelivery,
    pub(crate) progress_every: Duration,
}

pub(crate) async fn work<H, F, A>(
    handler: &H,
    settings: Settings,
    outage: &Outage,
    stopping: &tokio::sync::watch::Receiver<bool>,
    message: Message,
) -> Done<Acker>
where
    H: Fn(Message) -> F,
    F: Future<Output = A>,
    A: Settle + std::fmt::Debug,
{
    let acker = acker(&message);
    let count = delivery_count(&message);
    // The stream, not the subject, names the destination: a subject can carry an id, and a
    // span name should not.
    let (stream, sequence) = match message.info() {
        Ok(info) => (info.stream.to_owned(), Some(info.stream_sequence)),
        Err(_) => (message.subject.to_string(), None),
    };
    let span = process_span("nats", &stream, count);
    match message
        .headers
        .as_ref()
        .and_then(|headers| headers.get(async_nats::header::NATS_MESSAGE_ID))
    {
        Some(id) => {
            span.record("messaging.message.id", id.as_str());
        }
        None => {
            if let Some(sequence) = sequence {
                span.record("messaging.message.id", tracing::field::display(sequence));
            }
        }
    }
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
            let sent = confirm(&acker, AckKind::Nak(None), "nak")
                .instrument(span)
                .await;
            return Done::Returned {
                halted: false,
                sent,
            };
        }
        Processed::Panicked { settlement } | Processed::Answered { settlement, .. } => settlement,
        // Back to the stream once the pump stopped pulling, for when the deployment is fixed.
        Processed::Halted { answer, .. } => {
            return Done::Halting {
                answer,
                back: acker,
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
    let sent = confirm(&acker, kind, settlement.as_str())
        .instrument(span)
        .await;
    Done::Settled {
        settlement,
        sent,
        handed_back,
    }
}

/// Hands a message back unstarted (or, `halted`, after a halting answer once the pump
/// stopped pulling): `Nak` without delay, for another consumer to take at once.
pub(crate) async fn give_back(acker: Acker, halted: bool) -> Done<Acker> {
    let sent = confirm(&acker, AckKind::Nak(None), "nak").await;
    Done::Returned { halted, sent }
}

/// Sends a settlement and waits for the server's confirmation.
pub(crate) async fn confirm(acker: &Acker, kind: AckKind, settlement: &'static str) -> Sent {
    match acker.double_ack_with(kind).await {
        Ok(()) => Sent::Confirmed,
        Err(e) => {
            tracing::warn!(
                error = %e,
                settlement,
                "the server did not confirm a settlement; JetStream redelivers the message \
                 after ack_wait"
            );
            Sent::Unconfirmed
        }
    }
}
