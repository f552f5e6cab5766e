// The expansion names the outcome type of the handler's mode; it is not inferred from the
// declared return type. An alias that would turn a claim-mode handler's `InFlightOutcome`
// into a `StaleClaimOutcome` — and so make it report expired claims that `on_expired`
// says to take over — does not compile.

use diesel::prelude::*;
use inbox_diesel::{InFlightOutcome, StaleClaimOutcome, idempotent};

pub struct Msg {
    pub id: u64,
}

pub trait Pick {
    type Out;
}

impl<X> Pick for InFlightOutcome<X> {
    type Out = StaleClaimOutcome<X>;
}

impl Pick for () {
    type Out = ();
}

pub type PickResult<X> = Result<<X as Pick>::Out, diesel::result::Error>;

#[idempotent(consumer = "mail", key = msg.id, mode = "claim")]
fn mail(conn: &mut SqliteConnection, msg: &Msg) -> PickResult<()> {
    Ok(())
}

fn main() {
    let _ = mail;
}
