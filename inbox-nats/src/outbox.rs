//! An outbox's relay publishing to JetStream ([`OutboxSink`]), each message confirmed by the
//! stream that stores it.
//!
//! ```no_run
//! use inbox_diesel::outbox::Outbox;
//! use inbox_diesel::outbox::relay::Relay;
//! use inbox_nats::outbox::{LIMITS, OutboxSink};
//!
//! // The handlers publish with NATS's limits: what it cannot carry is refused there.
//! static OUTBOX: Outbox = Outbox::new("outbox").limits(LIMITS);
//!
//! # type Conn = diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>;
//! # async fn run(conn: &mut Conn) -> Result<(), Box<dyn std::error::Error>> {
//! // `conn`: a diesel-async connection to the database the handlers publish in.
//! let jetstream = inbox_nats::connect("nats://127.0.0.1:4222", Default::default()).await?;
//! let mut sink = OutboxSink::new(jetstream);
//! let shutdown = std::future::pending::<()>();
//! Relay::new(OUTBOX).run(conn, &mut sink, shutdown).await?;
//! # Ok(())
//! # }
//! ```
//!
//! Each message is published to the subject its destination names, with its outbox id as
//! `Nats-Msg-Id` (what [`key`](crate::key) reads downstream) and its headers; the row is
//! marked sent once the stream acknowledges it. A relay that sends a message again (it
//! stopped between the send and the mark) sends the same `Nats-Msg-Id`: inside the stream's
//! `duplicate_window` (2 minutes by default) JetStream drops the copy itself; outside it the
//! copy is stored, and the consumer's inbox recognises it by the same id. A subject no stream
//! takes, or a message over the server's `max_payload`, is
//! [`Rejected`](SinkError::Rejected) — parked after the relay's `max_attempts`; a timeout or
//! a lost connection is [`Unavailable`](SinkError::Unavailable) (the client reconnects on its
//! own).

use async_nats::HeaderMap;
use async_nats::jetstream::Context;
use async_nats::jetstream::context::PublishErrorKind;
use inbox_diesel::outbox::Limits;
use inbox_diesel::outbox::relay::{Outgoing, Sink, SinkError};

/// What NATS carries: payloads up to the server's default `max_payload` (1 MiB, headers
/// included; a server configured lower rejects larger ones at the send), subjects to publish
/// to (no wildcards, whitespace or empty tokens), header names without `:` or control
/// characters and values without line breaks.
pub const LIMITS: Limits = Limits {
    max_payload: 1 << 20,
    max_destination: 255,
    max_key: 255,
    destination: subject,
    header,
};

/// Whether `subject` is one a message can be published to.
fn subject(subject: &str) -> Result<(), &'static str> {
    if subject.is_empty() {
        return Err("a NATS subject is not empty");
    }
    if subject.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("a NATS subject has no whitespace or control characters");
    }
    for token in subject.split('.') {
        match token {
            "" => {
                return Err(
                    "a NATS subject has no empty tokens (`a..b`, a leading or trailing `.`)",
                );
            }
            "*" | ">" => return Err("a message is published to a subject without wildcards"),
            _ => {}
        }
    }
    Ok(())
}

fn header(name: &str, value: &str) -> Result<(), &'static str> {
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_graphic() && b != b':') {
        return Err("a NATS header name is printable ASCII without `:` or spaces");
    }
    if value.contains(['\r', '\n']) {
        return Err("a NATS header value has no line breaks");
    }
    Ok(())
}

/// Publishes an outbox's messages to JetStream, each acknowledged by its stream.
#[derive(Debug, Clone)]
pub struct OutboxSink {
    jetstream: Context,
}

impl OutboxSink {
    /// A sink publishing through `jetstream` ([`connect`](crate::connect)).
    pub fn new(jetstream: Context) -> Self {
        Self { jetstream }
    }

    async fn publish(&self, message: &Outgoing) -> Result<(), SinkError> {
        // Checked again here, for rows written with other limits: a bad header name would
        // otherwise panic in the client.
        subject(&message.destination).map_err(|why| SinkError::Rejected(why.into()))?;
        let mut headers = HeaderMap::new();
        for (name, value) in &message.headers {
            header(name, value).map_err(|why| SinkError::Rejected(why.into()))?;
            headers.insert(name.as_str(), value.as_str());
        }
        headers.insert("Nats-Msg-Id", message.id.to_string().as_str());
        let stored = match self
            .jetstream
            .publish_with_headers(
                message.destination.clone(),
                headers,
                message.payload.clone().into(),
            )
            .await
        {
            Ok(ack) => ack.await,
            Err(e) => Err(e),
        };
        match stored {
            // A copy inside the duplicate window is acknowledged as a duplicate: stored once.
            Ok(_) => Ok(()),
            Err(e) => match e.kind() {
                PublishErrorKind::StreamNotFound => Err(SinkError::Rejected(format!(
                    "no stream takes the subject {:?}",
                    message.destination
                ))),
                PublishErrorKind::MaxPayloadExceeded
                | PublishErrorKind::WrongLastMessageId
                | PublishErrorKind::WrongLastSequence => Err(SinkError::Rejected(e.to_string())),
                _ => Err(SinkError::Unavailable(e.to_string())),
            },
        }
    }
}

impl Sink for OutboxSink {
    fn send(&mut self, message: &Outgoing) -> impl Future<Output = Result<(), SinkError>> + Send {
        self.publish(message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_and_headers_are_checked() {
        assert!(subject("orders.placed").is_ok());
        assert!(subject("orders..placed").is_err());
        assert!(subject("orders.*").is_err());
        assert!(subject("orders placed").is_err());
        assert!(subject("").is_err());
        assert!(header("order", "7").is_ok());
        assert!(header("or der", "7").is_err());
        assert!(header("order:", "7").is_err());
        assert!(header("order", "7\r\nNats-Msg-Id: x").is_err());
    }
}
