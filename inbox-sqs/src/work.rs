//! One message from its receipt to its settlement: the handler run through
//! `inbox_diesel::pump` with its visibility extended, then deleted, made visible again after
//! a delay (on a FIFO queue: run again in place), or moved to the dead-letter queue; and a
//! message handed back unstarted.

use aws_sdk_sqs::types::{MessageAttributeValue, MessageSystemAttributeName};
use inbox_diesel::pump::{Done, InHand, Processed, Sent, process};

use super::*;
use crate::source::Delivery;

pub(crate) struct Settings {
    pub(crate) redelivery: Redelivery,
    pub(crate) progress_every: Duration,
}

/// The longest dead-letter reason sent: SQS counts attributes towards the message's size.
const MAX_REASON: usize = 1024;

pub(crate) async fn work<H, F, A>(
    handler: &H,
    settings: &Settings,
    client: &Client,
    queue: &Queue,
    outage: &Outage,
    stopping: &tokio::sync::watch::Receiver<bool>,
    mut delivery: Delivery,
) -> Done<Message>
where
    H: Fn(Message) -> F,
    F: Future<Output = A>,
    A: Settle + std::fmt::Debug,
{
    let message = &delivery.message;
    let receipt = message.receipt_handle().unwrap_or_default().to_owned();
    let received = receive_count(message);
    // The receipts of its FIFO group's messages the pump holds behind it: their visibility is
    // extended with its own, so that they wait in hand without coming back (each receive
    // would count against the redrive policy's `maxReceiveCount`).
    let behind = delivery.behind.clone();
    let progress = || {
        let mut receipts = vec![receipt.clone()];
        if let Some(behind) = &behind {
            receipts.extend(behind.receipts());
        }
        async move {
            for receipt in receipts {
                let extended = client
                    .change_message_visibility()
                    .queue_url(&queue.url)
                    .receipt_handle(receipt)
                    .visibility_timeout(seconds(queue.visibility_timeout))
                    .send()
                    .await;
                if let Err(e) = extended {
                    tracing::warn!(error = %described(&e), "extending a message's visibility failed");
                }
            }
        }
    };
    let mut stopping_now = stopping.clone();
    // Runs of the handler: more than one on a FIFO queue only, which retries in place.
    let mut run = 1u32;
    loop {
        let count = received.saturating_add(run - 1);
        let span = process_span("aws_sqs", &queue.name, count);
        if let Some(id) = message.message_id() {
            span.record("messaging.message.id", id);
        }
        let in_hand = InHand {
            span: &span,
            system: "aws_sqs",
            noun: "message",
            progress_every: Some(settings.progress_every),
        };
        let processed = process(in_hand, outage, stopping, progress, || {
            let mut message = message.clone();
            if run > 1 {
                // Run again in place: the handler sees the receives and runs so far.
                message.attributes.get_or_insert_default().insert(
                    MessageSystemAttributeName::ApproximateReceiveCount,
                    count.to_string(),
                );
            }
            handler(message)
        })
        .await;
        let (settlement, reason) = match processed {
            Processed::Unstarted => {
                delivery.hand_group_back();
                let sent = visible_in(client, queue, &receipt, Duration::ZERO).await;
                return Done::Returned {
                    halted: false,
                    sent,
                };
            }
            Processed::Halted { answer, .. } => {
                delivery.hand_group_back();
                return Done::Halting {
                    answer,
                    back: delivery.message,
                };
            }
            Processed::Panicked { settlement } => (settlement, "the handler panicked".to_owned()),
            Processed::Answered { answer, settlement } => (settlement, format!("{answer:?}")),
        };
        let (settlement, reason) = match settlement {
            Settlement::Ack | Settlement::DeadLetter => (settlement, reason),
            // A FIFO message is retried in place, its group waiting behind it: handed back,
            // it would come again with the messages behind it, and each would count a
            // receive. Its receives and runs together are bounded by the redrive policy.
            retry if queue.fifo && count < queue.max_receive_count => {
                let delay = settings.redelivery.delay_of(retry, count);
                if !wait_extending(delay, settings.progress_every, &progress, &mut stopping_now)
                    .await
                {
                    delivery.hand_group_back();
                    let sent = visible_in(client, queue, &receipt, Duration::ZERO).await;
                    return Done::Settled {
                        settlement: retry,
                        sent,
                        handed_back: None,
                    };
                }
                run += 1;
                continue;
            }
            _ if queue.fifo => (
                Settlement::DeadLetter,
                format!(
                    "{reason} (after {count} receives and runs: the redrive policy's maxReceiveCount)"
                ),
            ),
            retry => {
                let delay = settings.redelivery.delay_of(retry, count);
                let sent = visible_in(client, queue, &receipt, delay)
                    .instrument(span.clone())
                    .await;
                return Done::Settled {
                    settlement: retry,
                    sent,
                    handed_back: None,
                };
            }
        };
        let sent = match settlement {
            Settlement::DeadLetter => match dead_letter(client, queue, message, &reason).await {
                Ok(()) => {
                    delete(client, queue, &receipt)
                        .instrument(span.clone())
                        .await
                }
                Err(sent) => sent,
            },
            _ => {
                delete(client, queue, &receipt)
                    .instrument(span.clone())
                    .await
            }
        };
        if sent != Sent::Confirmed {
            // Not deleted: it comes again, and the messages of its group behind it after it.
            delivery.hand_group_back();
        }
        return Done::Settled {
            settlement,
            sent,
            handed_back: None,
        };
    }
}

/// Waits `delay`, extending the visibility of what `progress` extends every `every`: whether
/// it waited to the end (not stopped).
async fn wait_extending<P, PF>(
    delay: Duration,
    every: Duration,
    progress: &P,
    stopping: &mut tokio::sync::watch::Receiver<bool>,
) -> bool
where
    P: Fn() -> PF,
    PF: Future<Output = ()>,
{
    let until = tokio::time::Instant::now() + delay;
    loop {
        let now = tokio::time::Instant::now();
        if now >= until {
            return true;
        }
        let nap = (until - now).min(every);
        let stopped = tokio::select! {
            () = tokio::time::sleep(nap) => false,
            _ = stopping.wait_for(|stopping| *stopping) => true,
        };
        if stopped {
            return false;
        }
        progress().await;
    }
}

/// Hands a message back unstarted (or, `halted`, after a halting answer once the pump
/// stopped receiving): visible again at once.
pub(crate) async fn give_back(
    client: &Client,
    queue: &Queue,
    message: Message,
    halted: bool,
) -> Done<Message> {
    let receipt = message.receipt_handle().unwrap_or_default();
    let sent = visible_in(client, queue, receipt, Duration::ZERO).await;
    Done::Returned { halted, sent }
}

/// What a failed settlement means: SQS out of reach, or a receipt that expired — the message
/// comes again after its visibility timeout (`Unconfirmed`) —, or a refusal every message
/// would meet (no permission, no such queue, a KMS key the role cannot use): the pump stops
/// (`Failed`), rather than process every message to see it come back until the redrive
/// policy moves it to the dead-letter queue.
fn sent_of<E, R>(error: &aws_sdk_sqs::error::SdkError<E, R>, what: &str) -> Sent
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    let described = described(error);
    let lasting = error.code().is_some_and(|code| {
        matches!(
            code,
            "AccessDenied"
                | "AccessDeniedException"
                | "AWS.SimpleQueueService.NonExistentQueue"
                | "QueueDoesNotExist"
                | "InvalidSecurity"
                | "UnrecognizedClientException"
                | "InvalidClientTokenId"
        ) || code.starts_with("Kms")
            || code.starts_with("KMS")
    });
    if lasting {
        tracing::error!(error = %described, "{what} was refused; the pump stops");
        Sent::Failed(format!("{what} was refused: {described}"))
    } else {
        tracing::warn!(
            error = %described,
            "{what} failed; SQS delivers the message again after its visibility timeout"
        );
        Sent::Unconfirmed
    }
}

async fn delete(client: &Client, queue: &Queue, receipt: &str) -> Sent {
    match client
        .delete_message()
        .queue_url(&queue.url)
        .receipt_handle(receipt)
        .send()
        .await
    {
        Ok(_) => Sent::Confirmed,
        Err(e) => sent_of(&e, "deleting a settled message"),
    }
}

async fn visible_in(client: &Client, queue: &Queue, receipt: &str, delay: Duration) -> Sent {
    match client
        .change_message_visibility()
        .queue_url(&queue.url)
        .receipt_handle(receipt)
        .visibility_timeout(seconds(delay))
        .send()
        .await
    {
        Ok(_) => Sent::Confirmed,
        Err(e) => sent_of(&e, "handing a message back"),
    }
}

/// Sends `message` to the queue's dead-letter queue — its body and attributes, with where
/// it came from and why — before the original is deleted.
async fn dead_letter(
    client: &Client,
    queue: &Queue,
    message: &Message,
    reason: &str,
) -> Result<(), Sent> {
    let mut request = client
        .send_message()
        .queue_url(&queue.dead_letter_url)
        .message_body(message.body().unwrap_or_default());
    let mut attributes = message.message_attributes().cloned().unwrap_or_default();
    let reason = match reason.char_indices().nth(MAX_REASON) {
        Some((at, _)) => &reason[..at],
        None => reason,
    };
    for (name, value) in [
        (DEAD_LETTER_QUEUE, queue.name.as_str()),
        (DEAD_LETTER_MESSAGE_ID, message.message_id().unwrap_or("-")),
        (DEAD_LETTER_REASON, reason),
    ] {
        // SQS takes at most 10 attributes: the message's own come first.
        if attributes.len() < 10 {
            let value = text_attribute(value).map_err(|e| {
                tracing::warn!(
                    error = %e,
                    "a dead letter's attribute was refused; the message is delivered again after \
                     its visibility timeout"
                );
                Sent::Unconfirmed
            })?;
            attributes.insert(name.to_owned(), value);
        }
    }
    request = request.set_message_attributes(Some(attributes));
    if queue.dead_letter_fifo {
        let group = attribute(message, MessageSystemAttributeName::MessageGroupId)
            .unwrap_or("dead-letters");
        request = request
            .message_group_id(group)
            .message_deduplication_id(message.message_id().unwrap_or_default());
    }
    match request.send().await {
        Ok(_) => Ok(()),
        Err(e) => Err(sent_of(&e, "sending a dead letter to its queue")),
    }
}

fn text_attribute(value: &str) -> Result<MessageAttributeValue, String> {
    MessageAttributeValue::builder()
        .data_type("String")
        .string_value(if value.is_empty() { "-" } else { value })
        .build()
        .map_err(|e| e.to_string())
}

/// `duration` in whole seconds, rounded up (SQS takes whole seconds, at most 12 hours): a
/// delay of 100 ms is one second, not none.
fn seconds(duration: Duration) -> i32 {
    let seconds = duration.as_millis().div_ceil(1000).min(43_200);
    i32::try_from(seconds).unwrap_or(43_200)
}
