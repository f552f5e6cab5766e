//! The loop every pump runs: take → run → settle → count, until it stops; then hand back what
//! it had taken and not started, and let the deliveries in hand settle.

use std::future::Future;
use std::pin::pin;

use futures_util::future::Either;
use futures_util::stream::{FuturesUnordered, StreamExt};

use super::{Counts, Done, Sent};

/// What a [`Source`] has next.
#[derive(Debug)]
pub enum Next<D, B, E> {
    /// A delivery to run its handler on.
    Delivery(D),
    /// A delivery to hand back unstarted (one that came with every slot taken).
    Back(B),
    /// Nothing for the loop: the source did something of its own (a heartbeat, a request
    /// expired). The loop asks again.
    Nothing,
    /// The broker ended the consumer, or the connection to it: the pump stops.
    End(E),
}

/// How a broker's deliveries reach the pump: its adapter's half of [`run`].
pub trait Source {
    /// A delivery, as the adapter's function for one takes it.
    type Delivery;
    /// What hands a delivery back to the broker unstarted (an acknowledgement handle).
    type Back;
    /// Why the broker ended the pump.
    type End;

    /// Before the loop waits: what the source does to be sent more (JetStream's pull
    /// request), with `in_hand` deliveries running. Not raced: it runs to its end.
    fn prepare(&mut self, in_hand: usize) -> impl Future<Output = ()> {
        let _ = in_hand;
        async {}
    }

    /// What comes next, with `in_hand` deliveries running. Raced against the handlers'
    /// answers and the shutdown, and dropped when one of them comes first: nothing may be
    /// lost then (a stream's `next` is such a future).
    fn next(
        &mut self,
        in_hand: usize,
    ) -> impl Future<Output = Next<Self::Delivery, Self::Back, Self::End>>;

    /// A delivery in hand is done (before it is counted): the window's business.
    fn done(&mut self, done: &Done<Self::Back>) {
        let _ = done;
    }

    /// The pump stopped taking deliveries: stop the broker's (unsubscribe, cancel the
    /// consumer). Not raced.
    fn close(&mut self) -> impl Future<Output = ()>;

    /// After [`Source::close`], the next delivery the source had taken that no handler
    /// started, to be handed back; `None` once there are none (or the wait for them is over).
    /// Raced against the handlers' answers, as [`Source::next`].
    fn returned(&mut self) -> impl Future<Output = Option<Self::Back>>;
}

/// How a pump ended: what it counted, and why it stopped (none of the three: its shutdown).
#[derive(Debug)]
#[non_exhaustive]
pub struct Ended<E> {
    /// What became of the deliveries it took.
    pub counts: Counts,
    /// The first halting answer, as `Debug` prints it.
    pub halted: Option<String>,
    /// The first settlement the broker could not take ([`Sent::Failed`]).
    pub failed: Option<String>,
    /// How the broker ended it.
    pub end: Option<E>,
}

/// Runs a pump: takes deliveries from `source` and runs `work` on each beside the others —
/// `work` returns when the delivery is settled —, until `shutdown` completes, an answer
/// halts, a settlement fails, or the source ends. Then sends `true` on `stop` (the deliveries
/// in hand watch it), closes the source, hands back with `give_back` what the source had
/// taken unstarted (`halted: false`) and the halting deliveries (`halted: true`), and waits
/// for every delivery in hand to be done. See the [module documentation](crate::pump).
pub async fn run<S, W, WF, G, GF>(
    source: &mut S,
    shutdown: impl Future<Output = ()>,
    stop: &tokio::sync::watch::Sender<bool>,
    work: W,
    give_back: G,
) -> Ended<S::End>
where
    S: Source,
    W: Fn(S::Delivery) -> WF,
    WF: Future<Output = Done<S::Back>>,
    G: Fn(S::Back, bool) -> GF,
    GF: Future<Output = Done<S::Back>>,
{
    let mut ended = Ended {
        counts: Counts::default(),
        halted: None,
        failed: None,
        end: None,
    };
    let mut in_hand = FuturesUnordered::new();
    let mut to_return = Vec::new();
    let mut shutdown = pin!(shutdown);
    while ended.end.is_none() && ended.halted.is_none() && ended.failed.is_none() {
        let held = in_hand.len();
        source.prepare(held).await;
        tokio::select! {
            // A shutdown goes before what arrived: that is handed back.
            biased;
            () = &mut shutdown => break,
            Some(done) = in_hand.next(), if !in_hand.is_empty() => {
                source.done(&done);
                ended.record(done, &mut to_return);
            }
            next = source.next(held) => match next {
                Next::Delivery(delivery) => in_hand.push(Either::Left(work(delivery))),
                Next::Back(back) => in_hand.push(Either::Right(give_back(back, false))),
                Next::Nothing => {}
                Next::End(end) => ended.end = Some(end),
            },
        }
    }

    let _ = stop.send(true);
    source.close().await;
    let mut returning = true;
    loop {
        for back in to_return.drain(..) {
            in_hand.push(Either::Right(give_back(back, true)));
        }
        if !returning && in_hand.is_empty() {
            break;
        }
        tokio::select! {
            Some(done) = in_hand.next(), if !in_hand.is_empty() => {
                source.done(&done);
                ended.record(done, &mut to_return);
            }
            back = source.returned(), if returning => match back {
                Some(back) => in_hand.push(Either::Right(give_back(back, false))),
                None => returning = false,
            },
        }
    }
    ended
}

impl<E> Ended<E> {
    fn record<B>(&mut self, done: Done<B>, to_return: &mut Vec<B>) {
        self.counts.record(&done);
        match done {
            Done::Halting { answer, back } => {
                self.halted.get_or_insert(answer);
                to_return.push(back);
            }
            Done::Settled {
                sent: Sent::Failed(failure),
                ..
            }
            | Done::Returned {
                sent: Sent::Failed(failure),
                ..
            } => {
                self.failed.get_or_insert(failure);
            }
            Done::Settled { .. } | Done::Returned { .. } => {}
        }
    }
}
