//! The broker's consumer as the pump reads it: started, polled within the window, cancelled
//! with what it had buffered handed back; a settlement sent and counted.

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

    /// Cancels the consumers and requeues what the channel had buffered for them.
    pub(crate) async fn close(mut self, channel: &Channel) -> (lapin::Result<()>, u64) {
        if let Some(adding) = self.adding.take()
            && let Ok(Ok(consumer)) = tokio::time::timeout(Duration::from_secs(5), adding).await
        {
            self.added = Some(consumer);
        }
        let mut cancelled = Ok(());
        for consumer in [&self.given, &self.added].into_iter().flatten() {
            if let Err(e) = channel
                .basic_cancel(consumer.tag(), BasicCancelOptions::default())
                .await
            {
                cancelled = Err(e);
            }
        }
        let mut requeued = 0;
        for consumer in [&mut self.given, &mut self.added].into_iter().flatten() {
            requeued += requeue_buffered(consumer).await;
        }
        (cancelled, requeued)
    }
}

/// Requeues the deliveries the channel had buffered when the pump stopped: the consumer was
/// cancelled, so the stream ends once they are out.
pub(crate) async fn requeue_buffered(stream: &mut Consumer) -> u64 {
    let mut requeued = 0;
    let drain = async {
        while let Some(Ok(delivery)) = stream.next().await {
            if delivery
                .acker
                .nack(BasicNackOptions {
                    requeue: true,
                    ..BasicNackOptions::default()
                })
                .await
                // `false`: the channel could no longer send it (the broker redelivers it).
                .is_ok_and(|sent| sent)
            {
                requeued += 1;
            }
        }
    };
    // A consumer the broker did not confirm cancelled may not end: what is left is returned
    // to the queue when the channel closes.
    let _ = tokio::time::timeout(Duration::from_secs(5), drain).await;
    requeued
}

/// Settles one delivery. A retry waits out its delay before the requeue — or less, when the
/// pump stops meanwhile (`stopping`): a shutdown does not wait for it.
pub(crate) async fn settle(
    acker: &lapin::Acker,
    settlement: Settlement,
    delay: Duration,
    mut stopping: tokio::sync::watch::Receiver<bool>,
) -> lapin::Result<bool> {
    match settlement {
        Settlement::Ack => acker.ack(BasicAckOptions::default()).await,
        Settlement::Retry { .. } | Settlement::Held { .. } => {
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                _ = stopping.wait_for(|stopping| *stopping) => {}
            }
            acker
                .nack(BasicNackOptions {
                    requeue: true,
                    ..BasicNackOptions::default()
                })
                .await
        }
        Settlement::DeadLetter => acker.reject(BasicRejectOptions { requeue: false }).await,
        // Back to the queue, for when the deployment is fixed; and `Settlement` is
        // non-exhaustive: what a later version adds is not acknowledged blindly.
        _ => {
            acker
                .nack(BasicNackOptions {
                    requeue: true,
                    ..BasicNackOptions::default()
                })
                .await
        }
    }
}

#[derive(Default)]
pub(crate) struct Counts {
    pub(crate) ack: AtomicU64,
    pub(crate) retry: AtomicU64,
    pub(crate) dead_letter: AtomicU64,
    pub(crate) halt: AtomicU64,
    pub(crate) unsettled: AtomicU64,
}

impl Counts {
    /// Counts a settlement the broker was sent. One the channel could no longer send (closed
    /// or failed since the delivery: lapin answers `false`) is unsettled — the broker delivers
    /// the message again — and the channel's failure stops the pump.
    pub(crate) fn settled(
        &self,
        settlement: Settlement,
        settled: lapin::Result<bool>,
        failed: &tokio::sync::watch::Sender<Option<String>>,
        halt: &tokio::sync::watch::Sender<Option<String>>,
    ) {
        let counter = match (settled, settlement) {
            (Ok(false), _) => {
                let why = "the channel closed before the delivery was settled; the broker \
                           delivers it again";
                tracing::warn!("{why}");
                failed.send_if_modified(|failed| {
                    failed.is_none() && failed.replace(why.into()).is_none()
                });
                let _ = halt.send(Some(format!("settling failed: {why}")));
                &self.unsettled
            }
            (Err(e), _) => {
                let _ = failed.send(Some(e.to_string()));
                let _ = halt.send(Some(format!("settling failed: {e}")));
                &self.unsettled
            }
            (Ok(true), Settlement::Ack) => &self.ack,
            (Ok(true), Settlement::Retry { .. } | Settlement::Held { .. }) => &self.retry,
            (Ok(true), Settlement::DeadLetter) => &self.dead_letter,
            (Ok(true), _) => &self.halt,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}
