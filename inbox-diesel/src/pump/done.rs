//! What became of one delivery, as the loop counts it; and the messages a pump handed back.

use std::collections::HashSet;

use inbox_core::Settlement;

/// Whether the broker took a settlement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sent {
    /// The broker took it (confirmed, where the broker confirms).
    Confirmed,
    /// It may not have reached the broker (a connection down that the client restores by
    /// itself): the broker delivers the message again, and the pump goes on.
    Unconfirmed,
    /// It could not be sent, and no later one will be (the channel closed): the broker
    /// delivers the message again, and the pump stops with this failure.
    Failed(String),
}

/// What became of one delivery the pump took: the answer of the adapter's function for it.
#[derive(Debug)]
pub enum Done<B> {
    /// Settled by its handler's answer.
    Settled {
        /// What the broker was asked to do with it.
        settlement: Settlement,
        /// Whether the broker took it.
        sent: Sent,
        /// The identity of a message handed back (a retry), for the source's window
        /// ([`Source::done`](super::Source::done)); `None` where the adapter remembers it
        /// itself, or the message was not handed back.
        handed_back: Option<u64>,
    },
    /// Handed back without its handler running: the pump stopped first (`halted: false`), or
    /// after a halting answer (`halted: true`).
    Returned {
        /// Whether a halting answer handed it back.
        halted: bool,
        /// Whether the broker took it.
        sent: Sent,
    },
    /// Its handler's answer halts the pump ([`Processed::Halted`](super::Processed::Halted)):
    /// `back` is handed back once the pump stopped taking deliveries, so that it does not come
    /// straight back to this pump.
    Halting {
        /// The answer, as `Debug` prints it.
        answer: String,
        /// What hands it back.
        back: B,
    },
}

/// What a pump did with the deliveries it took, each counted once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Counts {
    /// Acknowledged (processed, or duplicates).
    pub acked: u64,
    /// Handed back to be retried.
    pub retried: u64,
    /// Dead-lettered (rejected, terminated).
    pub dead_lettered: u64,
    /// Handed back after a halting answer.
    pub halted: u64,
    /// Handed back unstarted as the pump stopped.
    pub returned_unstarted: u64,
    /// Settlements the broker may not have taken ([`Sent::Unconfirmed`], [`Sent::Failed`]):
    /// the broker delivers those messages again.
    pub unsettled: u64,
}

impl Counts {
    /// Counts one delivery done; a [`Done::Halting`] is counted when it is handed back.
    pub fn record<B>(&mut self, done: &Done<B>) {
        let counter = match done {
            Done::Settled {
                sent: Sent::Unconfirmed | Sent::Failed(_),
                ..
            }
            | Done::Returned {
                sent: Sent::Unconfirmed | Sent::Failed(_),
                ..
            } => &mut self.unsettled,
            Done::Settled { settlement, .. } => match settlement {
                Settlement::Ack => &mut self.acked,
                Settlement::Retry { .. } | Settlement::Held { .. } => &mut self.retried,
                Settlement::DeadLetter => &mut self.dead_lettered,
                _ => &mut self.halted,
            },
            Done::Returned { halted: true, .. } => &mut self.halted,
            Done::Returned { halted: false, .. } => &mut self.returned_unstarted,
            Done::Halting { .. } => return,
        };
        *counter += 1;
    }
}

/// The messages a pump handed back itself, until they come again: a redelivery of one of
/// them is the pump's own, and any other redelivery a stranger's — one that was in hand when
/// a process died, this one's or another's, and may be what killed it.
#[derive(Debug, Default)]
pub struct HandedBack {
    identities: HashSet<u64>,
}

impl HandedBack {
    /// Messages remembered at most: one handed back that never comes again (past the delivery
    /// limit, purged) is forgotten with the others past this many, and is then taken for a
    /// stranger's if it does.
    pub const REMEMBERED: usize = 100_000;

    /// The pump handed back the message `identity`.
    pub fn remember(&mut self, identity: u64) {
        if self.identities.len() >= Self::REMEMBERED {
            self.identities.clear();
        }
        self.identities.insert(identity);
    }

    /// A delivery of the message `identity` arrived, delivered `count` times with this one:
    /// whether it is a stranger's redelivery, delivered before and not handed back by this
    /// pump. The pump's own is forgotten as it comes back.
    pub fn stranger(&mut self, count: u32, identity: u64) -> bool {
        count >= 2 && !self.identities.remove(&identity)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_delivery_is_counted_once() {
        let mut counts = Counts::default();
        let settled = |settlement, sent| Done::<()>::Settled {
            settlement,
            sent,
            handed_back: None,
        };
        counts.record(&settled(Settlement::Ack, Sent::Confirmed));
        counts.record(&settled(
            Settlement::Retry { reconnect: true },
            Sent::Confirmed,
        ));
        counts.record(&settled(Settlement::DeadLetter, Sent::Confirmed));
        counts.record(&settled(Settlement::Ack, Sent::Unconfirmed));
        counts.record(&settled(Settlement::Ack, Sent::Failed("closed".into())));
        counts.record(&Done::<()>::Returned {
            halted: false,
            sent: Sent::Confirmed,
        });
        counts.record(&Done::Halting {
            answer: "Halt".into(),
            back: (),
        });
        counts.record(&Done::<()>::Returned {
            halted: true,
            sent: Sent::Confirmed,
        });
        counts.record(&Done::<()>::Returned {
            halted: true,
            sent: Sent::Unconfirmed,
        });
        assert_eq!(
            counts,
            Counts {
                acked: 1,
                retried: 1,
                dead_lettered: 1,
                halted: 1,
                returned_unstarted: 1,
                unsettled: 3,
            }
        );
    }

    #[test]
    fn a_message_handed_back_comes_back_as_the_pumps_own_once() {
        let mut handed_back = HandedBack::default();
        assert!(!handed_back.stranger(1, 7), "a first delivery");
        assert!(
            handed_back.stranger(2, 7),
            "delivered before, not by this pump"
        );
        handed_back.remember(7);
        assert!(!handed_back.stranger(2, 7), "this pump's own");
        assert!(handed_back.stranger(3, 7), "forgotten as it came back");
    }
}
