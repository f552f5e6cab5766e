//! An outbox's relay publishing to RabbitMQ ([`OutboxSink`]), with publisher confirms.
//!
//! ```no_run
//! use inbox_diesel::outbox::Outbox;
//! use inbox_diesel::outbox::relay::Relay;
//! use inbox_lapin::outbox::{LIMITS, OutboxSink};
//!
//! // The handlers publish with RabbitMQ's limits: what it cannot carry is refused there.
//! static OUTBOX: Outbox = Outbox::new("outbox").limits(LIMITS);
//!
//! # type Conn = diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>;
//! # async fn run(conn: &mut Conn) -> Result<(), Box<dyn std::error::Error>> {
//! // `conn`: a diesel-async connection to the database the handlers publish in.
//! // Each message to the default exchange, routed by its destination (a queue's name).
//! let mut sink = OutboxSink::new("amqp://127.0.0.1:5672/%2f", "");
//! let shutdown = std::future::pending::<()>();
//! Relay::new(OUTBOX).run(conn, &mut sink, shutdown).await?;
//! # Ok(())
//! # }
//! ```
//!
//! Each message is published to the sink's exchange with its destination as the routing key,
//! its outbox id as `message_id` (what [`key`](crate::key) reads downstream), its headers as
//! AMQP headers, persistent, and `mandatory`: the row is marked sent once the broker confirms
//! it. A message no queue is bound for comes back unroutable and is
//! [`Rejected`](SinkError::Rejected) — parked after the relay's `max_attempts`, not lost in
//! the exchange. A negative confirm — a queue at its `x-max-length` with
//! `x-overflow = reject-publish`, a quorum queue without a majority — and a connection that
//! cannot be opened or fails are [`Unavailable`](SinkError::Unavailable): the relay pauses
//! (doubling up to its longest backoff) without counting an attempt, and the next send
//! connects again. A channel the broker closes for what will not pass (an exchange that
//! does not exist: `NOT_FOUND`) is `Unavailable` too, logged each round with the broker's
//! words, until the exchange is declared.

use inbox_diesel::outbox::Limits;
use inbox_diesel::outbox::relay::{Outgoing, Sink, SinkError};
use lapin::Confirmation;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};

/// What RabbitMQ carries: payloads up to its default `max_message_size` (128 MiB; a server
/// configured lower rejects larger ones at the send), routing keys up to 255 bytes.
pub const LIMITS: Limits = Limits {
    max_payload: 128 << 20,
    max_destination: 255,
    max_key: 255,
    destination: routing_key,
    header: amqp_header,
};

fn amqp_header(name: &str, _: &str) -> Result<(), &'static str> {
    // A header's name is an AMQP short string.
    if name.len() > 255 {
        Err("an AMQP header name has at most 255 bytes")
    } else {
        Ok(())
    }
}

fn routing_key(_: &str) -> Result<(), &'static str> {
    // Any text of up to 255 bytes is a routing key (the length is checked by the limits);
    // the empty one too (a fanout exchange ignores it).
    Ok(())
}

/// Publishes an outbox's messages to an exchange, confirmed.
pub struct OutboxSink {
    url: String,
    exchange: String,
    open: Option<(Connection, Channel)>,
}

impl std::fmt::Debug for OutboxSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboxSink")
            .field("exchange", &self.exchange)
            .field("connected", &self.open.is_some())
            .finish_non_exhaustive()
    }
}

impl OutboxSink {
    /// A sink publishing to `exchange` (`""`: the default exchange, which routes to the queue
    /// named by the destination) on the broker at `url`; it connects at its first send.
    pub fn new(url: impl Into<String>, exchange: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            exchange: exchange.into(),
            open: None,
        }
    }

    /// The channel, opened (with publisher confirms) if there is none or it failed.
    async fn channel(&mut self) -> Result<&Channel, SinkError> {
        let usable = self.open.as_ref().is_some_and(|(connection, channel)| {
            connection.status().connected() && channel.status().connected()
        });
        if !usable {
            self.open = None;
            let unavailable = |e: lapin::Error| SinkError::Unavailable(e.to_string());
            let connection = Connection::connect(&self.url, ConnectionProperties::default())
                .await
                .map_err(unavailable)?;
            let channel = connection.create_channel().await.map_err(unavailable)?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await
                .map_err(unavailable)?;
            self.open = Some((connection, channel));
        }
        Ok(&self.open.as_ref().expect("opened above").1)
    }

    async fn publish(&mut self, message: &Outgoing) -> Result<(), SinkError> {
        let exchange = self.exchange.clone();
        let channel = self.channel().await?;
        let mut headers = FieldTable::default();
        for (name, value) in &message.headers {
            headers.insert(
                name.as_str().into(),
                AMQPValue::LongString(value.as_str().into()),
            );
        }
        let properties = BasicProperties::default()
            .with_message_id(message.id.to_string().into())
            .with_delivery_mode(2)
            .with_headers(headers);
        let confirm = channel
            .basic_publish(
                exchange.as_str().into(),
                message.destination.as_str().into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                &message.payload,
                properties,
            )
            .await;
        let confirmation = match confirm {
            Ok(confirm) => confirm.await,
            Err(e) => Err(e),
        };
        match confirmation {
            Ok(Confirmation::Ack(None)) => Ok(()),
            Ok(Confirmation::Ack(Some(returned))) => Err(SinkError::Rejected(format!(
                "unroutable: no queue is bound to the exchange {exchange:?} for the routing key \
                 {:?} ({})",
                message.destination, returned.reply_text
            ))),
            // A queue at its `x-max-length` with `x-overflow = reject-publish`, a quorum queue
            // without a majority, an internal error of the broker's: a refusal that passes.
            // Counted as a rejection, a full queue would park each key's oldest message
            // within a minute, and every message behind it with it.
            Ok(Confirmation::Nack(_)) => Err(SinkError::Unavailable(
                "the broker did not accept the message (a negative confirm: a queue at its \
                 x-max-length with reject-publish, a quorum queue without a majority); tried \
                 again after a pause"
                    .into(),
            )),
            Ok(Confirmation::NotRequested) => Err(SinkError::Unavailable(
                "the channel does not confirm publishes".into(),
            )),
            Err(e) => {
                self.open = None;
                Err(SinkError::Unavailable(e.to_string()))
            }
        }
    }
}

impl Sink for OutboxSink {
    fn send(&mut self, message: &Outgoing) -> impl Future<Output = Result<(), SinkError>> + Send {
        self.publish(message)
    }
}
