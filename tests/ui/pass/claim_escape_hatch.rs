#![allow(unused_variables, dead_code)]
// Claim mode's exception, as its message describes it: a statement that must write while
// the side effect runs uses a connection of its own and says why.
include!("../common/sync.rs");

#[idempotent(consumer = "claim-escape-hatch", key = msg.id, mode = "claim")]
fn claim_escape_hatch(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    #[inbox::outside_transaction("the attempt is recorded whether the provider answers or not")]
    inbox_diesel::tripwire::allow_outside_transaction("attempts are recorded", || {
        add(&mut checkout(), 1)
    })?;
    Ok(())
}

fn main() {}
