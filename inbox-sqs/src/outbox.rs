//! An outbox's relay sending to SQS ([`OutboxSink`]).
//!
//! ```no_run
//! use inbox_diesel::outbox::Outbox;
//! use inbox_diesel::outbox::relay::Relay;
//! use inbox_sqs::outbox::{LIMITS, OutboxSink};
//!
//! // The handlers publish with SQS's limits: what it cannot carry is refused there.
//! static OUTBOX: Outbox = Outbox::new("outbox").limits(LIMITS);
//!
//! # type Conn = diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>;
//! # async fn run(conn: &mut Conn, client: aws_sdk_sqs::Client) -> Result<(), Box<dyn std::error::Error>> {
//! // `conn`: a diesel-async connection to the database the handlers publish in; a message's
//! // destination is a queue's name.
//! let mut sink = OutboxSink::new(client);
//! let shutdown = std::future::pending::<()>();
//! Relay::new(OUTBOX).run(conn, &mut sink, shutdown).await?;
//! # Ok(())
//! # }
//! ```
//!
//! Each message is sent to the queue its destination names (its URL looked up once per
//! name), with its headers as `String` message attributes and its outbox id in the
//! [`MESSAGE_ID`] attribute, which [`key`](crate::key) reads downstream.
//! To a FIFO queue (a name ending in `.fifo`) the ordering key is the `MessageGroupId` — a
//! group's messages are delivered in the relay's order — and the outbox id the
//! `MessageDeduplicationId`: a relay that sends a message again within five minutes (it
//! stopped between the send and the mark) is dropped by SQS itself, and later by the
//! consumer's inbox. The row is marked sent once SQS answered the send.
//!
//! A queue that does not exist, a body over the queue's maximum or not valid text, a FIFO
//! message without an ordering key are [`Rejected`](SinkError::Rejected) — parked after the
//! relay's `max_attempts`; a timeout, throttling or SQS out of reach are
//! [`Unavailable`](SinkError::Unavailable).

use std::collections::HashMap;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::MessageAttributeValue;
use inbox_diesel::outbox::Limits;
use inbox_diesel::outbox::relay::{Outgoing, Sink, SinkError};

use crate::{MESSAGE_ID, described};

/// What SQS carries: bodies of up to 248 KiB (`MaximumMessageSize` is 256 KiB by default,
/// the message attributes counted in it: 8 KiB are left for them), queue names of up to 80
/// characters from `[A-Za-z0-9_-]` (with a `.fifo` suffix), ordering keys of up to 128
/// characters (a `MessageGroupId`: printable ASCII, no spaces — checked at the send), and
/// nine headers (SQS takes ten message attributes, one of them the outbox id) whose names
/// are SQS attribute names.
pub const LIMITS: Limits = Limits {
    max_payload: 248 << 10,
    max_destination: 80,
    max_key: 128,
    destination: queue_name,
    header,
};

fn queue_name(name: &str) -> Result<(), &'static str> {
    let stem = name.strip_suffix(".fifo").unwrap_or(name);
    if stem.is_empty()
        || !stem
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'))
    {
        return Err("an SQS queue name has ASCII letters, digits, `-` and `_` (then `.fifo`)");
    }
    Ok(())
}

fn header(name: &str, value: &str) -> Result<(), &'static str> {
    if name == MESSAGE_ID {
        return Err("the `message-id` attribute is the outbox id's, set by the sink");
    }
    let lower = name.to_ascii_lowercase();
    if name.is_empty()
        || name.len() > 256
        || name.starts_with('.')
        || name.ends_with('.')
        || name.contains("..")
        || lower.starts_with("aws.")
        || lower.starts_with("amazon.")
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
    {
        return Err(
            "an SQS attribute name has ASCII letters, digits, `-`, `_` and single inner `.`, \
             and does not start with `AWS.` or `Amazon.`",
        );
    }
    if value.is_empty() {
        return Err("an SQS attribute value is not empty");
    }
    Ok(())
}

/// Sends an outbox's messages to SQS queues.
#[derive(Debug, Clone)]
pub struct OutboxSink {
    client: Client,
    urls: HashMap<String, String>,
}

impl OutboxSink {
    /// A sink sending through `client`.
    pub fn new(client: Client) -> Self {
        Self {
            client,
            urls: HashMap::new(),
        }
    }

    async fn url(&mut self, name: &str) -> Result<String, SinkError> {
        if let Some(url) = self.urls.get(name) {
            return Ok(url.clone());
        }
        let output = self
            .client
            .get_queue_url()
            .queue_name(name)
            .send()
            .await
            .map_err(|e| match e.as_service_error() {
                Some(service) if service.is_queue_does_not_exist() => {
                    SinkError::Rejected(format!("no SQS queue is named {name:?}"))
                }
                _ => SinkError::Unavailable(described(&e)),
            })?;
        let url = output.queue_url.unwrap_or_default();
        self.urls.insert(name.to_owned(), url.clone());
        Ok(url)
    }

    async fn send_one(&mut self, message: &Outgoing) -> Result<(), SinkError> {
        let rejected = |why: &str| SinkError::Rejected(why.to_owned());
        queue_name(&message.destination).map_err(rejected)?;
        let body = std::str::from_utf8(&message.payload)
            .map_err(|_| rejected("an SQS message body is text: the payload is not UTF-8"))?;
        if message.headers.len() > 9 {
            return Err(rejected(
                "SQS takes ten message attributes: at most nine headers",
            ));
        }
        let fifo = message.destination.ends_with(".fifo");
        if fifo && message.key.is_empty() {
            return Err(rejected(
                "a message to a FIFO queue needs an ordering key (its MessageGroupId)",
            ));
        }
        if fifo && !message.key.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(rejected(
                "a FIFO queue's MessageGroupId (the ordering key) is printable ASCII without \
                 spaces",
            ));
        }
        let url = self.url(&message.destination).await?;
        let id = message.id.to_string();
        let mut request = self.client.send_message().queue_url(url).message_body(body);
        for (name, value) in message
            .headers
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_str()))
            .chain([(MESSAGE_ID, id.as_str())])
        {
            if name != MESSAGE_ID {
                header(name, value).map_err(rejected)?;
            }
            let value = MessageAttributeValue::builder()
                .data_type("String")
                .string_value(value)
                .build()
                .map_err(|e| SinkError::Rejected(e.to_string()))?;
            request = request.message_attributes(name, value);
        }
        if fifo {
            request = request
                .message_group_id(&message.key)
                .message_deduplication_id(&id);
        }
        match request.send().await {
            Ok(_) => Ok(()),
            Err(e) => {
                // What SQS refuses in this message, as opposed to a failure of the call.
                let refused = e.as_service_error().is_some_and(|service| {
                    service.is_queue_does_not_exist()
                        || service.is_invalid_message_contents()
                        || service.is_unsupported_operation()
                }) || matches!(
                    aws_sdk_sqs::error::ProvideErrorMetadata::code(&e),
                    Some(
                        "InvalidParameterValue"
                            | "InvalidAttributeName"
                            | "InvalidAttributeValue"
                            | "MissingParameter"
                    )
                );
                if refused {
                    Err(SinkError::Rejected(described(&e)))
                } else {
                    Err(SinkError::Unavailable(described(&e)))
                }
            }
        }
    }
}

impl Sink for OutboxSink {
    fn send(&mut self, message: &Outgoing) -> impl Future<Output = Result<(), SinkError>> + Send {
        self.send_one(message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_names_and_attributes_are_checked() {
        assert!(queue_name("credits").is_ok());
        assert!(queue_name("credits-v2_eu.fifo").is_ok());
        assert!(queue_name(".fifo").is_err());
        assert!(queue_name("credits.v2").is_err());
        assert!(header("trace-id", "x").is_ok());
        assert!(header("a.b", "x").is_ok());
        assert!(header("a..b", "x").is_err());
        assert!(header("AWS.trace", "x").is_err());
        assert!(header("trace", "").is_err());
        assert!(header(MESSAGE_ID, "x").is_err());
    }
}
