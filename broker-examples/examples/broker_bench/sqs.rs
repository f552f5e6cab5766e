//! Amazon SQS: a queue per run on the run's server (a private moto, or `SQS_ENDPOINT`), the
//! direct consumer and the pump on it, timed.

use std::time::{Duration, Instant};

use aws_sdk_sqs::types::{MessageAttributeValue, SendMessageBatchRequestEntry};
use futures_util::StreamExt;
use inbox_broker_examples::brokers::Sqs as Server;

use crate::database::Database;
use crate::run::{PAYLOAD, RunError, Tally, Timing, Variant, timing};

pub(crate) struct Sqs {
    server: Server,
    client: aws_sdk_sqs::Client,
}

impl Sqs {
    pub(crate) async fn connect() -> Result<Self, String> {
        let server = Server::start().await?;
        let client = server.client();
        Ok(Self { server, client })
    }

    pub(crate) fn describe(&self) -> String {
        self.server.describe()
    }

    /// A queue of its own for run `run` (with its dead-letter queue), holding `ids` (each
    /// its `message-id` attribute), sent ten at a time.
    pub(crate) async fn prepare(&self, run: usize, ids: &[String]) -> Result<String, String> {
        let name = format!("inbox-bench-{}-{run}", std::process::id());
        let url = self
            .server
            .create_queue(&name, Duration::from_secs(30), 20)
            .await?;
        let body = String::from_utf8_lossy(&PAYLOAD).into_owned();
        for chunk in ids.chunks(10) {
            let entries = chunk
                .iter()
                .enumerate()
                .map(|(n, id)| {
                    let attribute = MessageAttributeValue::builder()
                        .data_type("String")
                        .string_value(id)
                        .build()
                        .map_err(|e| e.to_string())?;
                    SendMessageBatchRequestEntry::builder()
                        .id(n.to_string())
                        .message_body(&body)
                        .message_attributes(inbox_sqs::MESSAGE_ID, attribute)
                        .build()
                        .map_err(|e| e.to_string())
                })
                .collect::<Result<Vec<_>, _>>()?;
            let sent = self
                .client
                .send_message_batch()
                .queue_url(&url)
                .set_entries(Some(entries))
                .send()
                .await
                .map_err(|e| format!("send to {name}: {e}"))?;
            if !sent.failed.is_empty() {
                return Err(format!("send to {name}: {:?}", sent.failed));
            }
        }
        Ok(url)
    }

    /// Messages still in the queue, visible or not.
    pub(crate) async fn left(&self, url: &str) -> Result<u64, String> {
        self.server.pending(url).await
    }

    pub(crate) async fn delete(&self, url: &str) {
        self.server.delete_queue(url).await;
    }

    /// One throughput run of `variant` on the queue at `url`.
    pub(crate) async fn consume(
        &self,
        url: &str,
        variant: Variant,
        in_hand: usize,
        database: &Database,
        tally: &Tally,
    ) -> Result<Timing, RunError> {
        let client = &self.client;
        let (start, stopped) = match variant {
            Variant::Pump => {
                let pump = inbox_sqs::Pump::new()
                    .max_in_hand(in_hand)
                    .wait_time(Duration::from_secs(1));
                let queue = pump.queue(client, url).await.map_err(|e| e.to_string())?;
                let start = Instant::now();
                pump.run(client, &queue, tally.finished(), |message| async move {
                    let id = id_of(&message);
                    tally.handle(database, inbox_sqs::key(&message), &id).await
                })
                .await
                .map_err(|stopped| stopped.to_string())?;
                (start, Instant::now())
            }
            _ => {
                // What one writes with the SDK alone: receives of up to ten, up to `in_hand`
                // handlers at once, each message deleted after its answer.
                let start = Instant::now();
                let batches = futures_util::stream::unfold((), |()| async move {
                    let received = client
                        .receive_message()
                        .queue_url(url)
                        .max_number_of_messages(i32::try_from(in_hand.min(10)).unwrap_or(10))
                        .wait_time_seconds(1)
                        .message_attribute_names("All")
                        .send()
                        .await;
                    let messages = received
                        .map(|output| output.messages.unwrap_or_default())
                        .unwrap_or_default();
                    Some((futures_util::stream::iter(messages), ()))
                });
                batches
                    .flatten()
                    .take_until(tally.finished())
                    .for_each_concurrent(in_hand, |message| async move {
                        let id = id_of(&message);
                        let key = inbox_diesel::broker::sqs(&id);
                        if tally.handle(database, key, &id).await.is_ok() {
                            let _ = client
                                .delete_message()
                                .queue_url(url)
                                .receipt_handle(message.receipt_handle().unwrap_or_default())
                                .send()
                                .await;
                        }
                    })
                    .await;
                (start, Instant::now())
            }
        };
        timing(start, tally, stopped)
    }
}

fn id_of(message: &aws_sdk_sqs::types::Message) -> String {
    message
        .message_attributes()
        .and_then(|attributes| attributes.get(inbox_sqs::MESSAGE_ID))
        .and_then(|value| value.string_value())
        .unwrap_or_default()
        .to_owned()
}
