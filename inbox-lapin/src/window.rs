//! How many deliveries the pump takes at once (the window after a restart), and which
//! deliveries are strangers' redeliveries.

use inbox_diesel::pump::HandedBack;

use super::*;

/// How wide the pump runs ([`Pump::slow_start`]): one delivery after it starts, `prefetch`
/// once a message of its own was answered, or a delivery was held for a retry's delay
/// (unacknowledged, it keeps the one slot, and the pump would stand still while it waits).
pub(crate) struct Window {
    pub(crate) wide: bool,
    /// The messages this pump handed back, until they come again.
    pub(crate) handed_back: HandedBack,
    /// The pump's stream, woken when it widens.
    pub(crate) waker: Option<std::task::Waker>,
}

impl Window {
    pub(crate) fn new(slow_start: bool) -> Self {
        Self {
            wide: !slow_start,
            handed_back: HandedBack::default(),
            waker: None,
        }
    }

    /// Whether the pump runs wide; the stream is woken when it widens.
    pub(crate) fn wide(&mut self, waker: &std::task::Waker) -> bool {
        if !self.wide {
            match &mut self.waker {
                Some(known) => known.clone_from(waker),
                None => self.waker = Some(waker.clone()),
            }
        }
        self.wide
    }

    /// A delivery of the message `identity` arrived: whether it is a stranger's redelivery,
    /// delivered before and not handed back by this pump.
    pub(crate) fn arrived(&mut self, delivery: &Delivery, identity: u64) -> bool {
        self.handed_back
            .stranger(delivery_count(delivery), identity)
    }

    /// A handler answered — whatever it answered, it did not take the process down. A
    /// message of the pump's own answered, or a delivery held for a delay (`held`), widens
    /// it.
    pub(crate) fn answered(&mut self, stranger: bool, held: bool) {
        if !self.wide && (!stranger || held) {
            self.wide = true;
            if let Some(waker) = self.waker.take() {
                waker.wake();
            }
        }
    }

    /// The pump handed a delivery back: when it comes again, it is not a stranger's.
    pub(crate) fn handed_back(&mut self, identity: u64) {
        self.handed_back.remember(identity);
    }
}
