//! The broker's consumers as the pump core reads them ([`inbox_diesel::pump::Source`]):
//! started, polled within the window, cancelled with what they had buffered handed back.

use inbox_diesel::pump::{Next, Source};

use super::*;

/// The pump's consumers: the one it was given (one delivery at a time with
/// [`Pump::slow_start`]), and the one it adds when it widens, for `prefetch` less one.
/// RabbitMQ keeps a consumer's prefetch for its life, and a consumer cancelled to change it
/// would have the deliveries on their way to it requeued, each counted once more.
pub(crate) struct Consumers {
    pub(crate) given: Option<Consumer>,
    pub(crate) added: Option<Consumer>,
    pub(crate) adding:
        Option<std::pin::Pin<Box<dyn Future<Output = lapin::Result<Consumer>> + Send>>>,
    /// `prefetch` less one, or nothing to add.
    pub(crate) to_add: Option<u16>,
}

impl Consumers {
    pub(crate) fn new(consumer: Consumer, pump: &Pump) -> Self {
        Self {
            given: Some(consumer),
            added: None,
            adding: None,
            to_add: (pump.slow_start && pump.prefetch > 1).then(|| pump.prefetch - 1),
        }
    }

    /// The next delivery of either consumer; `None` when the broker ended one (its queue
    /// deleted). Once `wide`, the second consumer is added.
    pub(crate) fn poll_next(
        &mut self,
        cx: &mut std::task::Context<'_>,
        channel: &Channel,
        wide: bool,
    ) -> std::task::Poll<Option<lapin::Result<Delivery>>> {
        use std::task::Poll;
        if wide
            && let Some(prefetch) = self.to_add.take()
            && let Some(given) = &self.given
        {
            let (channel, queue) = (channel.clone(), given.queue());
            let tag = format!("{}.wide", given.tag());
            self.adding = Some(Box::pin(async move {
                consume(&channel, queue.as_str(), &tag, prefetch).await
            }));
        }
        if let Some(adding) = self.adding.as_mut()
            && let Poll::Ready(consumer) = adding.as_mut().poll(cx)
        {
            self.adding = None;
            match consumer {
                Ok(consumer) => self.added = Some(consumer),
                Err(e) => return Poll::Ready(Some(Err(e))),
            }
        }
        for consumer in [&mut self.given, &mut self.added].into_iter().flatten() {
            if let Poll::Ready(next) = consumer.poll_next_unpin(cx) {
                return Poll::Ready(next);
            }
        }
        Poll::Pending
    }

    /// Cancels the consumers: the broker sends them nothing more, and their streams end once
    /// what the channel had buffered for them is out.
    pub(crate) async fn cancel(&mut self, channel: &Channel) {
        if let Some(adding) = self.adding.take()
            && let Ok(Ok(consumer)) = tokio::time::timeout(Duration::from_secs(5), adding).await
        {
            self.added = Some(consumer);
        }
        for consumer in [&self.given, &self.added].into_iter().flatten() {
            if let Err(e) = channel
                .basic_cancel(consumer.tag(), BasicCancelOptions::default())
                .await
            {
                tracing::warn!(error = %e, "cancelling the consumer failed");
            }
        }
    }

    /// What the channel had buffered for the cancelled consumers, one at a time; `None` once
    /// both streams ended.
    pub(crate) async fn buffered(&mut self) -> Option<Delivery> {
        futures_util::future::poll_fn(|cx| {
            use std::task::Poll;
            for consumer in [&mut self.given, &mut self.added] {
                if let Some(stream) = consumer
                    && let Poll::Ready(next) = stream.poll_next_unpin(cx)
                {
                    match next {
                        Some(Ok(delivery)) => return Poll::Ready(Some(delivery)),
                        // Ended (or failed: what is left returns to the queue with the
                        // channel).
                        _ => *consumer = None,
                    }
                }
            }
            match (&self.given, &self.added) {
                (None, None) => Poll::Ready(None),
                _ => Poll::Pending,
            }
        })
        .await
    }
}

/// Why the broker ended the pump.
pub(crate) enum End {
    /// The broker cancelled the consumer (its queue deleted, say).
    Cancelled,
    /// The channel failed.
    Broker(String),
}

/// A delivery as it arrived: whether it is a stranger's redelivery ([`Pump::slow_start`]),
/// and what tells it from the message's other deliveries.
pub(crate) struct Arrived {
    pub(crate) delivery: Delivery,
    pub(crate) stranger: bool,
    pub(crate) identity: u64,
}

/// The pump's consumers as the pump core reads them.
pub(crate) struct Delivered<'a> {
    pub(crate) channel: &'a Channel,
    pub(crate) consumers: Consumers,
    pub(crate) window: &'a std::sync::Mutex<Window>,
    pub(crate) prefetch: usize,
    /// Until when a stopping pump waits for what the channel had buffered.
    pub(crate) requeue_deadline: Option<tokio::time::Instant>,
}

impl Source for Delivered<'_> {
    type Delivery = Arrived;
    type Back = lapin::Acker;
    type End = End;

    async fn next(&mut self, in_hand: usize) -> Next<Arrived, lapin::Acker, End> {
        if in_hand >= self.prefetch {
            return std::future::pending().await;
        }
        let (channel, window, consumers) = (self.channel, self.window, &mut self.consumers);
        let next = futures_util::future::poll_fn(|cx| {
            let wide = lock(window).wide(cx.waker());
            consumers.poll_next(cx, channel, wide)
        })
        .await;
        match next {
            Some(Ok(delivery)) => {
                let identity = identity(&delivery);
                let stranger = lock(window).arrived(&delivery, identity);
                Next::Delivery(Arrived {
                    delivery,
                    stranger,
                    identity,
                })
            }
            Some(Err(e)) => Next::End(End::Broker(e.to_string())),
            None => Next::End(End::Cancelled),
        }
    }

    async fn close(&mut self) {
        self.consumers.cancel(self.channel).await;
        self.requeue_deadline = Some(tokio::time::Instant::now() + Duration::from_secs(5));
    }

    async fn returned(&mut self) -> Option<lapin::Acker> {
        // A consumer the broker did not confirm cancelled may not end: what is left is
        // returned to the queue when the channel closes.
        let deadline = self.requeue_deadline?;
        tokio::time::timeout_at(deadline, self.consumers.buffered())
            .await
            .ok()
            .flatten()
            .map(|delivery| delivery.acker)
    }
}
