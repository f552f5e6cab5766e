//! The core of a broker pump, whatever the broker: for the adapters (`inbox-lapin`,
//! `inbox-nats`) and the next ones, so that each holds only what its broker differs in — how
//! deliveries are taken, how a settlement is sent, how wide it runs after a restart.
//!
//! **The loop** ([`run`]) takes deliveries from a [`Source`] while it has room, runs each to
//! its settlement beside the others, counts what became of each ([`Counts`]), and stops on
//! the shutdown, on a halting answer, on a settlement the broker could not take, or when the
//! source ends. Stopping, it tells the deliveries in hand (`stopping`: a retry's delay is cut
//! short, a delivery waiting at the outage gate is handed back), closes the source, hands
//! back what the source had taken but no handler started and the halting deliveries, and
//! waits for the handlers in hand to settle:
//!
//! ```text
//! take (Source::next) → run (process) → settle (the adapter's) → count (Done)
//!   … stop → Source::close → hand back (Source::returned, halted) → the rest settles → Ended
//! ```
//!
//! **One delivery** ([`process`]) goes from the moment the pump holds it to the handler's
//! settlement:
//!
//! 1. **The outage gate.** After the database failed a delivery for its connection
//!    ([`Outage`](inbox_core::Outage)), the next ones wait in hand until the pause has passed
//!    and one that tried alone got through — not handed back, which a broker would count
//!    against its delivery limit on every turn of a long outage. A pump that stops meanwhile
//!    hands them back unstarted ([`Processed::Unstarted`]).
//! 2. **The handler**, called inside the delivery's span as well as polled in it (a sync
//!    handler runs when called). A panic settles its own delivery
//!    ([`Settlement::of_panic`](inbox_core::Settlement::of_panic)), not the pump: the
//!    deliveries beside it run on ([`Processed::Panicked`]).
//! 3. **Progress.** Where the broker takes back a delivery that is not reported in progress
//!    within a bound (JetStream's `ack_wait`, SQS's visibility timeout), it is reported at
//!    [`InHand::progress_every`], while it waits at the gate and while its handler runs.
//! 4. **The settlement**, recorded on the span and in the metrics, the outage told of it; a
//!    dead letter and a halt also written to standard error when no tracing subscriber
//!    listens ([`telemetry::unseen`](crate::telemetry::unseen)).
//!
//! What the broker then does with the settlement — ack, requeue with a delay, reject — is the
//! adapter's, which answers the loop with a [`Done`].
//!
//! **A new broker** supplies a [`Source`] (how deliveries arrive, how the broker is asked for
//! more, what it had taken when the pump stops), a function from a delivery to its [`Done`]
//! (usually [`process`], then the broker's settlement), and one that hands a delivery back
//! unstarted; its report is made from the [`Counts`].

mod done;
mod process;
mod run;

use std::time::Duration;

use inbox_core::Redelivery;

pub use done::{Counts, Done, HandedBack, Sent};
pub use process::{InHand, Processed, process};
pub use run::{Ended, Next, Source, run};

/// A database outage a pump is expected to ride out without dead-lettering live messages: a
/// failover or a restart takes minutes; half an hour leaves the person paged for it the time
/// to act. A broker's delivery limit whose [`outage_tolerance`] is shorter is set up with a
/// warning ([`warn_short_tolerance`]).
pub const OUTAGE_TO_RIDE_OUT: Duration = Duration::from_secs(30 * 60);

/// The longest database outage a message outlives, at worst, before `deliveries` (the
/// broker's delivery limit: `x-delivery-limit`, `max_deliver`, `maxReceiveCount`, a Kafka
/// pump's attempts) are spent: a message whose every delivery fails waits `redelivery`'s
/// delay after each, and is dead-lettered at the last. The outage gate keeps most messages
/// in hand, unstarted and uncounted, while the database is down; the one that tries alone is
/// counted, and the same message can be that one each time.
///
/// ```
/// use std::time::Duration;
/// use inbox_diesel::Redelivery;
/// use inbox_diesel::pump::outage_tolerance;
///
/// let redelivery = Redelivery::exponential(Duration::from_secs(1), Duration::from_secs(60));
/// // 1 + 2 + 4 + 8 s before deliveries 2 to 5.
/// assert_eq!(outage_tolerance(&redelivery, 5), Duration::from_secs(15));
/// // Then 60 s each: 1 + 2 + 4 + 8 + 16 + 32 s, and 60 s before each of deliveries 8 to 100.
/// assert_eq!(outage_tolerance(&redelivery, 100), Duration::from_secs(63 + 93 * 60));
/// ```
pub fn outage_tolerance(redelivery: &Redelivery, deliveries: u32) -> Duration {
    // The delay stops doubling after 32 deliveries: from there on each adds the same, and a
    // limit of `u32::MAX` (unlimited) is not walked delivery by delivery.
    const DOUBLINGS: u32 = 34;
    let walked = (1..deliveries.min(DOUBLINGS))
        .map(|delivery| redelivery.delay(delivery))
        .fold(Duration::ZERO, Duration::saturating_add);
    let rest = deliveries.saturating_sub(DOUBLINGS);
    walked.saturating_add(redelivery.delay(DOUBLINGS).saturating_mul(rest))
}

/// Warns — a `tracing` warning, and on standard error without a subscriber — that `what`
/// (`"the queue credits"`) dead-letters a message after `deliveries`, when a database outage
/// shorter than [`OUTAGE_TO_RIDE_OUT`] can spend them under `redelivery`'s delays
/// ([`outage_tolerance`]). Whether it warned.
pub fn warn_short_tolerance(what: &str, redelivery: &Redelivery, deliveries: u32) -> bool {
    let tolerance = outage_tolerance(redelivery, deliveries);
    if tolerance >= OUTAGE_TO_RIDE_OUT {
        return false;
    }
    let said = format!(
        "{what} dead-letters a message after {deliveries} deliveries: a database outage longer \
         than {:.1} s can spend them and dead-letter live messages; raise the delivery limit or \
         the pump's redelivery delays",
        tolerance.as_secs_f64()
    );
    tracing::warn!(tolerance_s = tolerance.as_secs(), "{said}");
    crate::telemetry::unseen(format_args!("{said}"));
    true
}
