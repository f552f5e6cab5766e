//! One message from its receipt to its settlement: the handler run through
//! `inbox_diesel::pump` with its visibility extended, then deleted, made visible again after
//! a delay, or moved to the dead-letter queue; and a message handed back unstarted.

use aws_sdk_sqs::types::{MessageAttributeValue, MessageSystemAttributeName};
use inbox_diesel::pump::{Done, InHand, Processed, Sent, process};

use super::*;
use crate::source::Delivery;

pub(crate) struct Settings {
    pub(crate) redelivery: Redelivery,
    pub(crate) progress_every: Duration,
}

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
    let count = receive_count(message);
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
    let progress = || {
        let request = client
            .change_message_visibility()
            .queue_url(&queue.url)
            .receipt_handle(&receipt)
            .visibility_timeout(seconds(queue.visibility_timeout));
        async move {
            if let Err(e) = request.send().await {
                tracing::warn!(error = %described(&e), "extending a message's visibility failed");
            }
        }
    };
    let processed = process(in_hand, outage, stopping, progress, || {
        handler(message.clone())
    })
    .await;
    let (settlement, reason) = match processed {
        Processed::Unstarted => {
            let sent = visible_in(client, queue, &receipt, Duration::ZERO).await;
            return Done::Returned {
                halted: false,
                sent,
            };
        }
        Processed::Halted { answer, .. } => {
            return Done::Halting {
                answer,
                back: delivery.message,
            };
        }
        Processed::Panicked { settlement } => (settlement, "the handler panicked".to_owned()),
        Processed::Answered { answer, settlement } => (settlement, format!("{answer:?}")),
    };
    let sent = match settlement {
        Settlement::Ack => {
            delete(client, queue, &receipt)
                .instrument(span.clone())
                .await
        }
        Settlement::DeadLetter => match dead_letter(client, queue, message, &reason).await {
            Ok(()) => {
                delete(client, queue, &receipt)
                    .instrument(span.clone())
                    .await
            }
            Err(e) => {
                tracing::warn!(
                    parent: &span,
                    error = %e,
                    "moving a message to the dead-letter queue failed; it is delivered \
                     again after its visibility timeout"
                );
                Sent::Unconfirmed
            }
        },
        retry => {
            // Behind it, its FIFO group's messages go back: they come again after it.
            if let Some(free) = &mut delivery.free {
                free.back = true;
            }
            let delay = settings.redelivery.delay_of(retry, count);
            visible_in(client, queue, &receipt, delay)
                .instrument(span.clone())
                .await
        }
    };
    Done::Settled {
        settlement,
        sent,
        handed_back: None,
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

async fn delete(client: &Client, queue: &Queue, receipt: &str) -> Sent {
    match client
        .delete_message()
        .queue_url(&queue.url)
        .receipt_handle(receipt)
        .send()
        .await
    {
        Ok(_) => Sent::Confirmed,
        Err(e) => {
            tracing::warn!(
                error = %described(&e),
                "deleting a settled message failed; SQS delivers it again after its visibility \
                 timeout, and the inbox answers it Duplicate"
            );
            Sent::Unconfirmed
        }
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
        Err(e) => {
            tracing::warn!(
                error = %described(&e),
                "handing a message back failed; SQS delivers it again after its visibility \
                 timeout"
            );
            Sent::Unconfirmed
        }
    }
}

/// Sends `message` to the queue's dead-letter queue — its body and attributes, with where
/// it came from and why — before the original is deleted.
async fn dead_letter(
    client: &Client,
    queue: &Queue,
    message: &Message,
    reason: &str,
) -> Result<(), String> {
    let mut request = client
        .send_message()
        .queue_url(&queue.dead_letter_url)
        .message_body(message.body().unwrap_or_default());
    let mut attributes = message.message_attributes().cloned().unwrap_or_default();
    for (name, value) in [
        (DEAD_LETTER_QUEUE, queue.name.as_str()),
        (DEAD_LETTER_MESSAGE_ID, message.message_id().unwrap_or("-")),
        (DEAD_LETTER_REASON, reason),
    ] {
        // SQS takes at most 10 attributes: the message's own come first.
        if attributes.len() < 10 {
            attributes.insert(name.to_owned(), text_attribute(value)?);
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
    request.send().await.map(|_| ()).map_err(|e| described(&e))
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
