//! One record from the moment the pump holds it to its stored offset: the handler run
//! through `inbox_diesel::pump`, retried in place while it answers a retry, written to the
//! dead-letter topic when it answers a dead letter or its retries are used up.

use std::sync::atomic::{AtomicU64, Ordering};

use inbox_diesel::pump::{Done, InHand, Processed, Sent, process};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;

use super::*;
use crate::source::{Delivery, store};

pub(crate) struct Settings<'a> {
    pub(crate) redelivery: Redelivery,
    pub(crate) max_attempts: u32,
    pub(crate) dead_letter_suffix: &'a str,
    pub(crate) dead_letter_timeout: Duration,
    pub(crate) retries: AtomicU64,
}

pub(crate) async fn work<H, F, A>(
    handler: &H,
    settings: &Settings<'_>,
    outage: &Outage,
    stopping: &tokio::sync::watch::Receiver<bool>,
    consumer: &GroupConsumer,
    producer: &FutureProducer,
    delivery: Delivery,
) -> Done<()>
where
    H: Fn(OwnedMessage) -> F,
    F: Future<Output = A>,
    A: Settle + std::fmt::Debug,
{
    let message = &delivery.message;
    let mut stopping_now = stopping.clone();
    // Whether the partition is still this consumer's as it was when the record was taken:
    // revoked since (even if assigned back), another consumer may have read and committed
    // past the record, and storing its offset now would move the group's offset back.
    let still_ours =
        || consumer.rdkafka().context().generation(&delivery.partition) == delivery.generation;
    let revoked = |settlement: Settlement, span: &tracing::Span| {
        tracing::info!(
            parent: span,
            "the record's partition was revoked while it was in hand: its offset is not \
             stored, and the partition's owner delivers it again"
        );
        Done::Settled {
            settlement,
            sent: Sent::Unconfirmed,
            handed_back: None,
        }
    };
    let mut attempt = 1u32;
    loop {
        let span = process_span("kafka", message.topic(), attempt);
        record_position(&span, message);
        let in_hand = InHand {
            span: &span,
            system: "kafka",
            noun: "record",
            progress_every: None,
        };
        let progress = || async {};
        let processed = process(in_hand, outage, stopping, progress, || {
            handler(message.clone())
        })
        .await;
        let (settlement, reason) = match processed {
            Processed::Unstarted => {
                return Done::Returned {
                    halted: false,
                    sent: Sent::Confirmed,
                };
            }
            Processed::Halted { answer, .. } => return Done::Halting { answer, back: () },
            Processed::Panicked { settlement } => (settlement, "the handler panicked".to_owned()),
            Processed::Answered { answer, settlement } => (settlement, format!("{answer:?}")),
        };
        if !still_ours() {
            return revoked(settlement, &span);
        }
        let answered_dead_letter = settlement == Settlement::DeadLetter;
        let settlement = match settlement {
            Settlement::Ack => Settlement::Ack,
            Settlement::DeadLetter => Settlement::DeadLetter,
            _ if attempt >= settings.max_attempts => {
                tracing::warn!(
                    parent: &span,
                    attempts = attempt,
                    "a record's retries are used up; it is dead-lettered"
                );
                Settlement::DeadLetter
            }
            retry => {
                let delay = settings.redelivery.delay_of(retry, attempt);
                let stopped = tokio::select! {
                    () = tokio::time::sleep(delay) => false,
                    _ = stopping_now.wait_for(|stopping| *stopping) => true,
                };
                if stopped {
                    // Not stored: the group delivers it again, to this consumer restarted or
                    // to another.
                    return Done::Settled {
                        settlement: retry,
                        sent: Sent::Confirmed,
                        handed_back: None,
                    };
                }
                if !still_ours() {
                    return revoked(retry, &span);
                }
                settings.retries.fetch_add(1, Ordering::Relaxed);
                attempt += 1;
                continue;
            }
        };
        if settlement == Settlement::DeadLetter {
            let reason = if answered_dead_letter {
                reason
            } else {
                format!("{reason} (after {attempt} attempts)")
            };
            if let Err(failure) = dead_letter(settings, producer, message, &reason).await {
                return Done::Settled {
                    settlement,
                    sent: Sent::Failed(failure),
                    handed_back: None,
                };
            }
        }
        if !still_ours() {
            return revoked(settlement, &span);
        }
        let sent = match store(consumer.rdkafka(), message) {
            Ok(()) => Sent::Confirmed,
            Err(e) => {
                tracing::info!(
                    parent: &span,
                    error = %e,
                    "a settled record's offset could not be stored (its partition was revoked): \
                     its next owner delivers it again"
                );
                Sent::Unconfirmed
            }
        };
        return Done::Settled {
            settlement,
            sent,
            handed_back: None,
        };
    }
}

/// The record's `message-id` header, partition and offset on its span.
fn record_position(span: &tracing::Span, message: &OwnedMessage) {
    if let Some(id) = crate::message_id(message) {
        span.record("messaging.message.id", String::from_utf8_lossy(id).as_ref());
    }
    span.record(
        "messaging.destination.partition.id",
        tracing::field::display(message.partition()),
    );
    span.record("messaging.kafka.offset", message.offset());
}

/// Writes `message` to its dead-letter topic — its key, payload and headers, with where it
/// came from and why — and waits for the broker's acknowledgement.
async fn dead_letter(
    settings: &Settings<'_>,
    producer: &FutureProducer,
    message: &OwnedMessage,
    reason: &str,
) -> Result<(), String> {
    let topic = format!("{}{}", message.topic(), settings.dead_letter_suffix);
    let partition = message.partition().to_string();
    let offset = message.offset().to_string();
    let mut headers = OwnedHeaders::new();
    if let Some(original) = message.headers() {
        for header in original.iter() {
            headers = headers.insert(header);
        }
    }
    for (key, value) in [
        (DEAD_LETTER_TOPIC, message.topic()),
        (DEAD_LETTER_PARTITION, partition.as_str()),
        (DEAD_LETTER_OFFSET, offset.as_str()),
        (DEAD_LETTER_REASON, reason),
    ] {
        headers = headers.insert(Header {
            key,
            value: Some(value),
        });
    }
    let mut record = FutureRecord::<[u8], [u8]>::to(&topic).headers(headers);
    if let Some(key) = message.key() {
        record = record.key(key);
    }
    if let Some(payload) = message.payload() {
        record = record.payload(payload);
    }
    match producer
        .send(record, Timeout::After(settings.dead_letter_timeout))
        .await
    {
        Ok(_) => Ok(()),
        Err((e, _)) => Err(format!(
            "writing the record at {}/{partition}/{offset} to {topic} failed: {e}",
            message.topic()
        )),
    }
}

/// Hands back a record the pump took but did not start: its offset is not stored.
pub(crate) async fn give_back((): (), halted: bool) -> Done<()> {
    Done::Returned {
        halted,
        sent: Sent::Confirmed,
    }
}
