//! How records reach the pump ([`Records`], the pump core's `Source`): taken from the
//! consumer's stream, queued per partition, and handed out one partition at a time — never
//! two records of one partition in hand at once, so that its offsets are stored in order.
//! A partition whose queue is long is paused at the broker until it drains; a partition
//! revoked in a rebalance loses what it had queued (its next owner reads it again).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use futures_util::StreamExt;
use inbox_diesel::pump::{Done, Next, Source};
use rdkafka::consumer::{
    BaseConsumer, Consumer, ConsumerContext, MessageStream, Rebalance, StreamConsumer,
};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::{ClientContext, Offset, TopicPartitionList};

/// A partition: its topic and number.
pub(crate) type Partition = (Arc<str>, i32);

/// The pump's consumer context: it tells the pump which partitions a rebalance revoked, so
/// that the records it had queued for them are dropped, and resumes the partitions it is
/// assigned (a partition the pump paused, revoked and assigned again, would stay paused).
/// Made only by [`Pump::consumer`](crate::Pump::consumer), which configures the consumer for
/// the pump.
pub struct Rebalances {
    revoked: Mutex<Vec<Partition>>,
    /// How many times each partition was revoked: a record taken before a revocation is no
    /// longer this consumer's to settle, even if the partition came back since.
    generations: Mutex<HashMap<Partition, u64>>,
}

impl Rebalances {
    pub(crate) fn new() -> Self {
        Self {
            revoked: Mutex::new(Vec::new()),
            generations: Mutex::new(HashMap::new()),
        }
    }

    fn take_revoked(&self) -> Vec<Partition> {
        std::mem::take(&mut *self.revoked.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// How many times `partition` was revoked so far.
    pub(crate) fn generation(&self, partition: &Partition) -> u64 {
        self.generations
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(partition)
            .copied()
            .unwrap_or(0)
    }
}

impl std::fmt::Debug for Rebalances {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rebalances").finish_non_exhaustive()
    }
}

impl ClientContext for Rebalances {}

impl ConsumerContext for Rebalances {
    fn pre_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(list) = rebalance {
            let mut revoked = self.revoked.lock().unwrap_or_else(PoisonError::into_inner);
            let mut generations = self
                .generations
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            for element in list.elements() {
                let partition: Partition = (Arc::from(element.topic()), element.partition());
                *generations.entry(partition.clone()).or_default() += 1;
                revoked.push(partition);
            }
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(list) = rebalance
            && list.count() > 0
            && let Err(e) = consumer.resume(list)
        {
            tracing::warn!(error = %e, "resuming the partitions assigned failed");
        }
    }
}

/// A record in the pump's hands, and what tells the source its partition is free again.
pub(crate) struct Delivery {
    pub(crate) message: OwnedMessage,
    /// Its partition, and the partition's generation when the record was taken: a
    /// revocation since means another consumer may have read past it.
    pub(crate) partition: Partition,
    pub(crate) generation: u64,
    /// Dropped when the record is done, whatever became of it.
    _free: Free,
}

/// Frees its partition for the next record when dropped.
struct Free {
    partition: Partition,
    freed: Arc<Mutex<Vec<Partition>>>,
}

impl Drop for Free {
    fn drop(&mut self) {
        self.freed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(self.partition.clone());
    }
}

#[derive(Default)]
struct Queue {
    records: VecDeque<OwnedMessage>,
    /// One of its records is in hand.
    busy: bool,
    /// Paused at the broker by the pump.
    paused: bool,
}

pub(crate) struct Records<'c> {
    consumer: &'c StreamConsumer<Rebalances>,
    stream: MessageStream<'c, Rebalances>,
    queues: HashMap<Partition, Queue>,
    /// Partitions free with records queued, in the order they became so.
    ready: VecDeque<Partition>,
    freed: Arc<Mutex<Vec<Partition>>>,
    max_in_hand: usize,
    /// A partition is paused with this many records queued.
    pause_at: usize,
}

impl<'c> Records<'c> {
    pub(crate) fn new(
        consumer: &'c StreamConsumer<Rebalances>,
        max_in_hand: usize,
        pause_at: usize,
    ) -> Self {
        // A consumer a previous run stopped has its assignment paused.
        if let Ok(assignment) = consumer.assignment()
            && assignment.count() > 0
            && let Err(e) = consumer.resume(&assignment)
        {
            tracing::debug!(error = %e, "resuming the assignment at the start failed");
        }
        Self {
            consumer,
            stream: consumer.stream(),
            queues: HashMap::new(),
            ready: VecDeque::new(),
            freed: Arc::new(Mutex::new(Vec::new())),
            max_in_hand,
            pause_at: pause_at.max(1),
        }
    }

    /// What happened since the last look: partitions freed by their records' end, and
    /// partitions revoked by a rebalance.
    fn catch_up(&mut self) {
        let freed = std::mem::take(&mut *self.freed.lock().unwrap_or_else(PoisonError::into_inner));
        for partition in freed {
            let Some(queue) = self.queues.get_mut(&partition) else {
                continue;
            };
            queue.busy = false;
            if !queue.records.is_empty() {
                self.ready.push_back(partition);
            }
        }
        for partition in self.consumer.context().take_revoked() {
            if let Some(queue) = self.queues.get_mut(&partition) {
                // Its next owner reads them again from the committed offset, and librdkafka
                // forgets that the pump paused it.
                queue.records.clear();
                queue.paused = false;
            }
        }
    }

    /// The next record of a free partition, while there is room.
    fn take_ready(&mut self, in_hand: usize) -> Option<Delivery> {
        while in_hand < self.max_in_hand {
            let partition = self.ready.pop_front()?;
            let Some(queue) = self.queues.get_mut(&partition) else {
                continue;
            };
            if queue.busy {
                continue;
            }
            let Some(message) = queue.records.pop_front() else {
                continue;
            };
            queue.busy = true;
            if queue.paused && queue.records.is_empty() {
                queue.paused = false;
                self.pause(&partition, false);
            }
            return Some(self.delivery(message, partition));
        }
        None
    }

    fn delivery(&self, message: OwnedMessage, partition: Partition) -> Delivery {
        Delivery {
            message,
            generation: self.consumer.context().generation(&partition),
            partition: partition.clone(),
            _free: Free {
                partition,
                freed: Arc::clone(&self.freed),
            },
        }
    }

    fn pause(&self, (topic, partition): &Partition, pause: bool) {
        let mut list = TopicPartitionList::new();
        list.add_partition(topic, *partition);
        let done = if pause {
            self.consumer.pause(&list)
        } else {
            self.consumer.resume(&list)
        };
        if let Err(e) = done {
            tracing::debug!(error = %e, topic = %topic, partition, pause, "pausing or resuming a partition failed");
        }
    }

    /// A record arrived: queued behind its partition's, and handed out at once if the
    /// partition is free and there is room.
    fn arrived(&mut self, message: OwnedMessage, in_hand: usize) -> Option<Delivery> {
        let partition: Partition = (Arc::from(message.topic()), message.partition());
        let queue = self.queues.entry(partition.clone()).or_default();
        if !queue.busy && queue.records.is_empty() && in_hand < self.max_in_hand {
            queue.busy = true;
            return Some(self.delivery(message, partition));
        }
        let was_empty = queue.records.is_empty();
        queue.records.push_back(message);
        let pause = queue.records.len() >= self.pause_at && !queue.paused;
        queue.paused |= pause;
        let ready = was_empty && !queue.busy;
        if pause {
            self.pause(&partition, true);
        }
        if ready {
            self.ready.push_back(partition);
        }
        None
    }
}

impl Source for Records<'_> {
    type Delivery = Delivery;
    type Back = ();
    type End = String;

    async fn next(&mut self, in_hand: usize) -> Next<Delivery, (), String> {
        self.catch_up();
        if let Some(delivery) = self.take_ready(in_hand) {
            return Next::Delivery(delivery);
        }
        // Polled however full the pump is: a consumer that stops polling leaves its group
        // after `max.poll.interval.ms`. Partitions whose queues are long are paused instead.
        match self.stream.next().await {
            Some(Ok(message)) => {
                let message = message.detach();
                self.catch_up();
                match self.arrived(message, in_hand) {
                    Some(delivery) => Next::Delivery(delivery),
                    None => Next::Nothing,
                }
            }
            Some(Err(KafkaError::MessageConsumptionFatal(code))) => {
                Next::End(format!("a fatal consumer error: {code}"))
            }
            Some(Err(e)) => {
                if e.rdkafka_error_code() == Some(RDKafkaErrorCode::Fatal) {
                    return Next::End(e.to_string());
                }
                // Transient: a broker down (librdkafka reconnects), a topic not yet there.
                tracing::warn!(error = %e, "the Kafka consumer reported an error");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                Next::Nothing
            }
            None => Next::End("the consumer's stream ended".to_owned()),
        }
    }

    async fn close(&mut self) {
        // Nothing more is fetched; what is queued is handed back below, and the records in
        // hand store their offsets as they settle.
        if let Ok(assignment) = self.consumer.assignment()
            && assignment.count() > 0
            && let Err(e) = self.consumer.pause(&assignment)
        {
            tracing::debug!(error = %e, "pausing the assignment at the stop failed");
        }
    }

    async fn returned(&mut self) -> Option<()> {
        for queue in self.queues.values_mut() {
            if queue.records.pop_front().is_some() {
                return Some(());
            }
        }
        None
    }

    fn done(&mut self, _: &Done<()>) {}
}

/// The offset the group commits for `partition` once `message` is settled: the next one.
pub(crate) fn store(
    consumer: &StreamConsumer<Rebalances>,
    message: &OwnedMessage,
) -> Result<(), KafkaError> {
    let mut list = TopicPartitionList::new();
    list.add_partition_offset(
        message.topic(),
        message.partition(),
        Offset::Offset(message.offset() + 1),
    )?;
    consumer.store_offsets(&list)
}
