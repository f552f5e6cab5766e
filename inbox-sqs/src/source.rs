//! How messages reach the pump ([`Receiving`], the pump core's `Source`): long-polled
//! receives of at most the free slots, kept across the loop's races so that a receive in
//! flight is never dropped with its messages; on a FIFO queue, messages of one group handed
//! out one at a time, in order.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};

use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::{Message, MessageSystemAttributeName};
use inbox_diesel::pump::{Next, Source};

use crate::Queue;

type Received = Result<Vec<Message>, String>;

/// A receive in flight: its future owns what it needs.
type Receive = Pin<Box<dyn Future<Output = Received> + Send>>;

/// A message in the pump's hands, and what frees its group when it is done.
pub(crate) struct Delivery {
    pub(crate) message: Message,
    /// On a FIFO queue: the receipts of its group's messages the pump holds behind it.
    pub(crate) behind: Option<Behind>,
    /// Dropped when the message is done, whatever became of it.
    free: Option<Free>,
}

impl Delivery {
    /// The message is not deleted and comes again: the messages of its group the pump holds
    /// behind it go back too, to come after it.
    pub(crate) fn hand_group_back(&mut self) {
        if let Some(free) = &mut self.free {
            free.back = true;
        }
    }
}

/// The receipts of the messages the pump holds, unstarted, behind a FIFO group's first.
type Held = Arc<Mutex<HashMap<String, Vec<String>>>>;

/// A FIFO group's messages held behind the one in hand.
#[derive(Clone)]
pub(crate) struct Behind {
    group: String,
    held: Held,
}

impl Behind {
    /// Their receipts, now.
    pub(crate) fn receipts(&self) -> Vec<String> {
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&self.group)
            .cloned()
            .unwrap_or_default()
    }
}

/// Frees a FIFO group for its next message when dropped; `back` set, the group's queued
/// messages are handed back instead (the one before them will be delivered again first).
struct Free {
    group: String,
    freed: Arc<Mutex<Vec<(String, bool)>>>,
    back: bool,
}

impl Drop for Free {
    fn drop(&mut self) {
        self.freed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((std::mem::take(&mut self.group), self.back));
    }
}

#[derive(Default)]
struct Group {
    queued: VecDeque<Message>,
    busy: bool,
}

pub(crate) struct Receiving<'q> {
    client: &'q Client,
    queue: &'q Queue,
    wait_seconds: i32,
    max_in_hand: usize,
    receive: Option<Receive>,
    /// Messages received and not yet handed out (beyond a FIFO group's).
    ready: VecDeque<Message>,
    groups: HashMap<String, Group>,
    /// The receipts of the groups' queued messages, for the visibility extensions of the
    /// message in hand before them.
    held: Held,
    freed: Arc<Mutex<Vec<(String, bool)>>>,
    /// Messages to hand back unstarted.
    back: VecDeque<Message>,
    /// After a failed receive, not before.
    pause_until: Option<tokio::time::Instant>,
    failures_in_a_row: u32,
}

impl<'q> Receiving<'q> {
    pub(crate) fn new(
        client: &'q Client,
        queue: &'q Queue,
        wait_seconds: i32,
        max_in_hand: usize,
    ) -> Self {
        Self {
            client,
            queue,
            wait_seconds,
            max_in_hand,
            receive: None,
            ready: VecDeque::new(),
            groups: HashMap::new(),
            held: Held::default(),
            freed: Arc::new(Mutex::new(Vec::new())),
            back: VecDeque::new(),
            pause_until: None,
            failures_in_a_row: 0,
        }
    }

    fn receive(&self, max: usize) -> Receive {
        let request = self
            .client
            .receive_message()
            .queue_url(&self.queue.url)
            .max_number_of_messages(i32::try_from(max.clamp(1, 10)).unwrap_or(10))
            .wait_time_seconds(self.wait_seconds)
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .message_attribute_names("All");
        Box::pin(async move {
            match request.send().await {
                Ok(output) => Ok(output.messages.unwrap_or_default()),
                Err(e) => Err(crate::described(&e)),
            }
        })
    }

    fn catch_up(&mut self) {
        let freed = std::mem::take(&mut *self.freed.lock().unwrap_or_else(PoisonError::into_inner));
        for (name, back) in freed {
            let Some(group) = self.groups.get_mut(&name) else {
                continue;
            };
            group.busy = false;
            if back {
                self.back.extend(group.queued.drain(..));
            }
            if let Some(next) = group.queued.pop_front() {
                group.busy = true;
                self.ready.push_back(next);
            }
            let receipts: Vec<String> = group.queued.iter().map(receipt_of).collect();
            if !group.busy {
                self.groups.remove(&name);
            }
            self.hold(&name, receipts);
        }
    }

    /// A message received: ready at once, or queued behind its FIFO group's.
    fn arrived(&mut self, message: Message) {
        let group = self
            .queue
            .fifo
            .then(|| crate::attribute(&message, MessageSystemAttributeName::MessageGroupId))
            .flatten()
            .map(str::to_owned);
        match group {
            None => self.ready.push_back(message),
            Some(name) => {
                let group = self.groups.entry(name.clone()).or_default();
                if group.busy {
                    group.queued.push_back(message);
                    let receipts = group.queued.iter().map(receipt_of).collect();
                    self.hold(&name, receipts);
                } else {
                    group.busy = true;
                    self.ready.push_back(message);
                }
            }
        }
    }

    /// What the group `name` holds queued now.
    fn hold(&self, name: &str, receipts: Vec<String>) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if receipts.is_empty() {
            held.remove(name);
        } else {
            held.insert(name.to_owned(), receipts);
        }
    }

    fn delivery(&self, message: Message) -> Delivery {
        let group = self
            .queue
            .fifo
            .then(|| crate::attribute(&message, MessageSystemAttributeName::MessageGroupId))
            .flatten()
            .map(str::to_owned);
        let free = group.clone().map(|group| Free {
            group,
            freed: Arc::clone(&self.freed),
            back: false,
        });
        let behind = group.map(|group| Behind {
            group,
            held: Arc::clone(&self.held),
        });
        Delivery {
            message,
            behind,
            free,
        }
    }

    fn received(&mut self, received: Received) {
        match received {
            Ok(messages) => {
                self.failures_in_a_row = 0;
                for message in messages {
                    self.arrived(message);
                }
            }
            Err(e) => {
                // Out of reach, throttled: the SDK retried already. Pause, doubling, at most
                // 30 s, and receive again.
                self.failures_in_a_row += 1;
                let pause = std::time::Duration::from_millis(250)
                    .saturating_mul(1 << self.failures_in_a_row.min(7))
                    .min(std::time::Duration::from_secs(30));
                tracing::warn!(error = %e, ?pause, "receiving from SQS failed");
                self.pause_until = Some(tokio::time::Instant::now() + pause);
            }
        }
    }
}

impl Source for Receiving<'_> {
    type Delivery = Delivery;
    type Back = Message;
    type End = String;

    async fn next(&mut self, in_hand: usize) -> Next<Delivery, Message, String> {
        self.catch_up();
        if let Some(message) = self.back.pop_front() {
            return Next::Back(message);
        }
        if in_hand < self.max_in_hand
            && let Some(message) = self.ready.pop_front()
        {
            return Next::Delivery(self.delivery(message));
        }
        let queued: usize =
            self.ready.len() + self.groups.values().map(|g| g.queued.len()).sum::<usize>();
        if self.receive.is_none() {
            let free = self.max_in_hand.saturating_sub(in_hand + queued);
            if free == 0 {
                return std::future::pending().await;
            }
            if let Some(until) = self.pause_until {
                tokio::time::sleep_until(until).await;
                self.pause_until = None;
            }
            self.receive = Some(self.receive(free));
        }
        let receive = self.receive.as_mut().expect("a receive in flight");
        let received = receive.await;
        self.receive = None;
        self.received(received);
        Next::Nothing
    }

    async fn close(&mut self) {}

    async fn returned(&mut self) -> Option<Message> {
        self.catch_up();
        if let Some(message) = self.back.pop_front().or_else(|| self.ready.pop_front()) {
            return Some(message);
        }
        if let Some((name, group)) = self
            .groups
            .iter_mut()
            .find(|(_, group)| !group.queued.is_empty())
        {
            let message = group.queued.pop_front();
            let (name, receipts) = (name.clone(), group.queued.iter().map(receipt_of).collect());
            self.hold(&name, receipts);
            return message;
        }
        // A receive in flight as the pump stopped: its messages go back too.
        let receive = self.receive.as_mut()?;
        let received = receive.await;
        self.receive = None;
        if let Ok(messages) = received {
            self.back.extend(messages);
        }
        self.back.pop_front()
    }
}

fn receipt_of(message: &Message) -> String {
    message.receipt_handle().unwrap_or_default().to_owned()
}
