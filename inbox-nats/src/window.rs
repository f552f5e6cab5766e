//! How many messages the pump takes at once (the window after a restart).

use inbox_diesel::pump::{Done, HandedBack};

use super::*;

/// How many messages the pump takes at once: one after it starts, doubling with each
/// message its handler answered, up to `max_ack_pending` — and one again when a stranger's
/// redelivery arrives, a message delivered before that this pump did not hand back itself.
///
/// A process that dies with messages in hand — a build with `panic = "abort"`, an
/// out-of-memory kill, a handler that exits — has each of them delivered again, and each
/// death counts against `max_deliver`. Run at full width after a restart, the message that
/// kills the process would take every message pulled with it down with it again, until
/// their deliveries ran out. One at a time, it dies alone: the others lose the one delivery
/// of the first death.
pub(crate) struct Window {
    pub(crate) size: usize,
    pub(crate) max: usize,
    /// [`Pump::slow_start`]: off, the window is `max` from the start and stays so.
    pub(crate) slow_start: bool,
    /// Stream sequences of messages this pump handed back (`Nak`), until they come again.
    pub(crate) handed_back: HandedBack,
}

impl Window {
    pub(crate) fn new(max: usize, slow_start: bool) -> Self {
        let max = max.max(1);
        Self {
            size: if slow_start { 1 } else { max },
            max,
            slow_start,
            handed_back: HandedBack::default(),
        }
    }

    /// A message arrived: a stranger's redelivery narrows the window to one.
    pub(crate) fn arrived(&mut self, message: &Message) {
        let Ok(info) = message.info() else { return };
        let count = u32::try_from(info.delivered).unwrap_or(u32::MAX);
        if self.handed_back.stranger(count, info.stream_sequence) && self.slow_start {
            self.size = 1;
        }
    }

    /// A message's handler answered — whatever it answered, it did not take the process
    /// down: the window widens (a failure too: in a database outage, a window kept narrow
    /// would put every try on the same few messages, and spend their deliveries). A
    /// message handed back is remembered.
    pub(crate) fn done(&mut self, done: &Done<Acker>) {
        if let Done::Settled { handed_back, .. } = done {
            self.size = (self.size * 2).min(self.max);
            if let Some(sequence) = handed_back {
                self.handed_back.remember(*sequence);
            }
        }
    }
}
