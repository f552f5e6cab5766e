//! The durable pull consumer as the pump core reads it ([`inbox_diesel::pump::Source`]): one
//! pull request at a time for as many messages as the window has room, its end told from the
//! server's status, the consumer asked for when no one answers, and the replies drained when
//! the pump stops.

use futures_util::future::BoxFuture;
use inbox_diesel::pump::{Done, Next, Source};

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

type InfoAnswer = Result<async_nats::jetstream::consumer::Info, ConsumerInfoError>;

/// The consumer's messages, pulled.
pub(crate) struct Pulled<'a> {
    pub(crate) jetstream: &'a Context,
    pub(crate) consumer: &'a PullConsumer,
    pub(crate) outage: &'a Outage,
    /// One subscription for every pull request's replies, each request answered on a subject
    /// of its own (`<inbox>.<n>`): the status ending a request given up for lost is told
    /// apart from the current request's.
    pub(crate) inbox: String,
    pub(crate) replies: async_nats::Subscriber,
    pub(crate) window: Window,
    pub(crate) max_ack_pending: usize,
    /// What one pull request may ask for at most (the consumer's `max_batch`).
    pub(crate) max_batch: usize,
    pub(crate) expires: Duration,
    pub(crate) pull: Option<Pull>,
    pub(crate) requests: u64,
    pub(crate) pull_after: Instant,
    /// Whether the consumer still exists, asked when JetStream did not answer a pull.
    pub(crate) check: Fuse<BoxFuture<'a, InfoAnswer>>,
    /// Until when a stopping pump waits for the replies still on their way.
    pub(crate) drain_deadline: Option<Instant>,
}

impl Source for Pulled<'_> {
    type Delivery = Message;
    type Back = Acker;
    type End = End;

    async fn prepare(&mut self, in_hand: usize) {
        // No messages pulled while the database is given a pause.
        self.pull_after = self
            .pull_after
            .max(Instant::now() + self.outage.pause_left());
        if self.pull.is_some()
            || !self.check.is_terminated()
            || in_hand >= self.window.size
            || Instant::now() < self.pull_after
        {
            return;
        }
        let wanted = (self.window.size - in_hand).min(self.max_batch);
        self.requests += 1;
        let request = BatchConfig {
            batch: wanted,
            expires: Some(self.expires),
            ..BatchConfig::default()
        };
        let subject = format!("{}.{}", self.inbox, self.requests);
        match self.consumer.request_batch(request, subject.into()).await {
            Ok(()) => {
                self.pull = Some(Pull {
                    id: self.requests,
                    wanted,
                    received: 0,
                    deadline: Instant::now() + self.expires + PULL_GRACE,
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "sending a pull request failed");
                self.pull_after = Instant::now() + PULL_PAUSE;
            }
        }
    }

    async fn next(&mut self, in_hand: usize) -> Next<Message, Acker, End> {
        // When to look again without a reply: a pull request's deadline, or the end of a
        // pause before the next one (never while the consumer's info is being asked).
        let wake = match &self.pull {
            Some(pull) => Some(pull.deadline),
            None if self.check.is_terminated() && in_hand < self.window.size => {
                Some(self.pull_after)
            }
            None => None,
        };
        tokio::select! {
            biased;
            info = &mut self.check, if !self.check.is_terminated() => match info {
                Ok(_) => self.pull_after = Instant::now() + PULL_PAUSE,
                Err(e) if is_gone(&e) => return Next::End(End::Deleted),
                Err(e) => {
                    tracing::warn!(error = %e, "asking for the consumer's info failed");
                    self.pull_after = Instant::now() + PULL_PAUSE;
                }
            },
            reply = self.replies.next() => {
                let Some(reply) = reply else {
                    return Next::End(End::Broker(
                        "the client's connection closed for good".to_owned(),
                    ));
                };
                return self.reply(reply, in_hand);
            }
            () = sleep_until(wake) => {
                if self.pull.as_ref().is_some_and(|pull| Instant::now() >= pull.deadline) {
                    tracing::warn!("a pull request went unanswered past its expiry; pulling again");
                    self.pull = None;
                }
            }
        }
        Next::Nothing
    }

    fn done(&mut self, done: &Done<Acker>) {
        self.window.done(done);
    }

    async fn close(&mut self) {
        // Stop pulling: the server forgets the pull requests of a subject without interest.
        // Unsubscribing before any `Nak` also keeps a message handed back from coming
        // straight back to this pump.
        if let Err(e) = self.replies.drain().await {
            tracing::warn!(error = %e, "unsubscribing from the pull replies failed");
        }
        self.drain_deadline = Some(Instant::now() + DRAIN_TIMEOUT);
    }

    async fn returned(&mut self) -> Option<Acker> {
        loop {
            tokio::select! {
                reply = self.replies.next() => match reply {
                    Some(reply) if matches!(reply.status, None | Some(StatusCode::OK)) => {
                        let message = Message { message: reply, context: self.jetstream.clone() };
                        return Some(acker(&message));
                    }
                    Some(_) => {}
                    None => return None,
                },
                () = sleep_until(self.drain_deadline) => return None,
            }
        }
    }
}

impl Pulled<'_> {
    /// A reply on the pull requests' subject: a message, a heartbeat, or a request's end.
    fn reply(&mut self, reply: async_nats::Message, in_hand: usize) -> Next<Message, Acker, End> {
        match reply.status {
            None | Some(StatusCode::OK) => {
                // A message keeps the subject it was published on: it is counted to the
                // request waiting now (a late one to a request given up for lost is rare,
                // and only makes the next request early).
                if let Some(request) = self.pull.as_mut() {
                    request.received += 1;
                    if request.received >= request.wanted {
                        self.pull = None;
                    }
                }
                let message = Message {
                    message: reply,
                    context: self.jetstream.clone(),
                };
                self.window.arrived(&message);
                if in_hand < self.max_ack_pending {
                    Next::Delivery(message)
                } else {
                    // A late answer to a request given up for lost, with every slot taken:
                    // back to the stream for another consumer.
                    Next::Back(acker(&message))
                }
            }
            Some(StatusCode::IDLE_HEARTBEAT) => Next::Nothing,
            // A status comes on the subject of the request it ends.
            Some(status)
                if self.pull.as_ref().is_some_and(|pull| {
                    reply.subject.as_str().rsplit('.').next() == Some(pull.id.to_string().as_str())
                }) =>
            {
                self.pull = None;
                let description = reply.description.unwrap_or_default();
                match PullEnd::of(status, &description) {
                    PullEnd::Expired => {}
                    PullEnd::ConsumerDeleted => return Next::End(End::Deleted),
                    PullEnd::Refused => {
                        return Next::End(End::Broker(format!(
                            "the server refused the pull request: {description}"
                        )));
                    }
                    // Nobody answers for the consumer: deleted, or its stream between
                    // leaders. The consumer's info tells which.
                    PullEnd::NoResponders => {
                        let consumer = self.consumer;
                        self.check = async move { consumer.get_info().await }.boxed().fuse();
                    }
                    PullEnd::Other => {
                        tracing::warn!(%status, %description, "the server ended a pull request");
                        self.pull_after = Instant::now() + PULL_PAUSE;
                    }
                }
                Next::Nothing
            }
            // The end of a request given up before.
            Some(_) => Next::Nothing,
        }
    }
}

fn is_gone(error: &ConsumerInfoError) -> bool {
    matches!(
        error.kind(),
        ConsumerInfoErrorKind::NotFound | ConsumerInfoErrorKind::StreamNotFound
    )
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
