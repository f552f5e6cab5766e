//! A pump's gate for a database that every delivery would fail on.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::{Redelivery, Settlement};

/// A pump's gate for a database that every delivery would fail on.
///
/// A delivery settled [`Retry { reconnect: true }`](Settlement::Retry) — the server lost, a
/// pool pointed at a read-only standby after a failover, a pooler that lost the prepared
/// statements — says that the next delivery will most likely meet the same. Without a gate
/// a pump takes delivery after delivery into that error, hundreds a second, each one a
/// connection attempt and a log line, and each one a delivery counted against the broker's
/// limit. With it, after such a delivery the pump starts no handler for a pause (the
/// policy's delay for the number of such deliveries in a row: doubling, up to its `max`),
/// then lets one delivery try alone; the others wait for its answer. So do
/// [`TRANSIENT_IN_A_ROW`](Outage::TRANSIENT_IN_A_ROW) deliveries in a row settled
/// [`Retry { reconnect: false }`](Settlement::Retry) — each a transient failure that
/// outlasted the handler's own retries, one after the other, with no success between: a
/// lock on the whole table (a migration's `CREATE INDEX`, a `VACUUM FULL`) past the role's
/// `lock_timeout`, a server too busy to answer within `statement_timeout`. One message's
/// lock (its row held by another transaction) fails alone, among successes, and closes
/// nothing. Any other settlement opens the gate: the database answers again.
///
/// The pumps keep a delivery taken while the gate is closed in hand, unstarted, and ask
/// again when [`Gate::Closed`]'s wait has passed: handed back, it would come again counted
/// against the broker's delivery limit at every turn of a long outage, and messages that
/// never ran would be dead-lettered.
///
/// ```
/// use std::time::Duration;
/// use inbox_core::{Gate, Outage, Redelivery, Settlement};
///
/// let outage = Outage::new(Redelivery::exponential(Duration::from_secs(1), Duration::from_secs(30)));
/// assert_eq!(outage.enter(), Gate::Open);
/// // The database refused: a pause of a second begins.
/// assert_eq!(outage.settled(Settlement::Retry { reconnect: true }), Some(Duration::from_secs(1)));
/// assert!(matches!(outage.enter(), Gate::Closed(wait) if wait <= Duration::from_secs(1)));
/// // A success elsewhere opens it again.
/// assert_eq!(outage.settled(Settlement::Ack), None);
/// assert_eq!(outage.enter(), Gate::Open);
/// ```
#[derive(Debug)]
pub struct Outage {
    policy: Redelivery,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Deliveries in a row that needed a new connection, each after the pause before it.
    in_a_row: u32,
    /// Deliveries in a row settled `Retry { reconnect: false }` while the gate was open.
    transient: u32,
    /// The end of the pause.
    until: Option<Instant>,
    /// A delivery is trying the database after a pause; the others wait for its answer.
    trying: bool,
}

/// Whether a handler may start now ([`Outage::enter`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Start it.
    Open,
    /// Do not: ask again after this long.
    Closed(Duration),
}

impl Outage {
    /// The default pause: half a second after the first delivery that needed a new
    /// connection, doubling with each such delivery in a row, at most 30 seconds.
    pub const DEFAULT: Redelivery =
        Redelivery::exponential(Duration::from_millis(500), Duration::from_secs(30));

    /// How many deliveries in a row settled `Retry { reconnect: false }` close the gate as
    /// one that needed a new connection does: three, so that one message's own failure —
    /// its row locked, its deadlock — among the others' successes closes nothing.
    pub const TRANSIENT_IN_A_ROW: u32 = 3;

    /// A gate whose pauses follow `policy`.
    pub fn new(policy: Redelivery) -> Self {
        Self {
            policy,
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a handler may start now. After a pause the first delivery to ask is let
    /// through alone; the others are told to come again after the policy's first delay.
    pub fn enter(&self) -> Gate {
        let mut state = self.state();
        if state.in_a_row == 0 {
            return Gate::Open;
        }
        let now = Instant::now();
        if let Some(until) = state.until
            && now < until
        {
            return Gate::Closed(until - now);
        }
        if state.trying {
            return Gate::Closed(self.policy.delay(1));
        }
        state.trying = true;
        Gate::Open
    }

    /// What a delivery that was let through settled as. `Some(pause)` when this settlement
    /// began a pause (the caller logs it); a delivery that needed a new connection while a
    /// pause runs (it started before) does not lengthen it.
    pub fn settled(&self, settlement: Settlement) -> Option<Duration> {
        let mut state = self.state();
        match settlement {
            Settlement::Retry { reconnect: false }
                if state.in_a_row == 0 && state.transient + 1 < Self::TRANSIENT_IN_A_ROW =>
            {
                state.transient += 1;
                None
            }
            Settlement::Retry { .. } => {
                let now = Instant::now();
                state.trying = false;
                if state.until.is_some_and(|until| now < until) {
                    return None;
                }
                state.in_a_row = state.in_a_row.saturating_add(1);
                let pause = self.policy.delay(state.in_a_row);
                state.until = Some(now + pause);
                Some(pause)
            }
            _ => {
                *state = State::default();
                None
            }
        }
    }

    /// What is left of the pause: zero when none runs. A pump that pulls its messages stops
    /// pulling for it.
    pub fn pause_left(&self) -> Duration {
        let state = self.state();
        state.until.map_or(Duration::ZERO, |until| {
            until.saturating_duration_since(Instant::now())
        })
    }

    /// How many deliveries in a row needed a new connection (0: the gate is open).
    pub fn in_a_row(&self) -> u32 {
        self.state().in_a_row
    }
}

impl Default for Outage {
    fn default() -> Self {
        Self::new(Self::DEFAULT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOST: Settlement = Settlement::Retry { reconnect: true };

    #[test]
    fn pauses_double_and_one_delivery_tries_after_each() {
        let ms = Duration::from_millis;
        let outage = Outage::new(Redelivery::exponential(ms(20), ms(50)));
        assert_eq!(outage.settled(LOST), Some(ms(20)));
        // Others that started before it do not lengthen the pause.
        assert_eq!(outage.settled(LOST), None);
        assert!(matches!(outage.enter(), Gate::Closed(_)));
        std::thread::sleep(ms(25));
        assert_eq!(outage.enter(), Gate::Open, "one tries");
        assert_eq!(
            outage.enter(),
            Gate::Closed(ms(20)),
            "the others wait for it"
        );
        assert_eq!(outage.settled(LOST), Some(ms(40)));
        std::thread::sleep(ms(45));
        assert_eq!(outage.enter(), Gate::Open);
        assert_eq!(outage.settled(LOST), Some(ms(50)), "at most max");
        assert_eq!(outage.in_a_row(), 3);
        std::thread::sleep(ms(55));
        assert_eq!(outage.enter(), Gate::Open);
        // The database answers: open for all.
        assert_eq!(outage.settled(Settlement::Ack), None);
        assert_eq!((outage.enter(), outage.enter()), (Gate::Open, Gate::Open));
        assert_eq!(outage.in_a_row(), 0);
        // A failure that is not the database's opens it too.
        outage.settled(LOST);
        outage.settled(Settlement::DeadLetter);
        assert_eq!(outage.enter(), Gate::Open);
    }

    /// Transient failures past the handler's retries close the gate only three in a row:
    /// one message's own (its row locked) among successes closes nothing; a table lock, which
    /// fails every delivery, does.
    #[test]
    fn transient_failures_close_it_only_in_a_row() {
        const TRANSIENT: Settlement = Settlement::Retry { reconnect: false };
        let ms = Duration::from_millis;
        let outage = Outage::new(Redelivery::exponential(ms(20), ms(50)));
        for _ in 0..5 {
            assert_eq!(outage.settled(TRANSIENT), None);
            assert_eq!(outage.settled(TRANSIENT), None);
            assert_eq!(outage.settled(Settlement::Ack), None);
            assert_eq!(outage.enter(), Gate::Open);
        }
        assert_eq!(outage.settled(TRANSIENT), None);
        assert_eq!(outage.settled(TRANSIENT), None);
        assert_eq!(
            outage.settled(TRANSIENT),
            Some(ms(20)),
            "the third in a row"
        );
        assert!(matches!(outage.enter(), Gate::Closed(_)));
        std::thread::sleep(ms(25));
        assert_eq!(outage.enter(), Gate::Open, "one tries");
        assert_eq!(outage.settled(TRANSIENT), Some(ms(40)), "and fails: longer");
        std::thread::sleep(ms(45));
        assert_eq!(outage.enter(), Gate::Open);
        assert_eq!(outage.settled(Settlement::Ack), None);
        assert_eq!((outage.enter(), outage.enter()), (Gate::Open, Gate::Open));
    }
}
