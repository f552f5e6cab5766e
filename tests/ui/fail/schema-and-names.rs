// The inbox's table named once, as a `const InboxSchema`: given with `table` or
// `constraint` too, the handler is refused; a constant whose names are not identifiers
// fails where it is evaluated.
#![allow(unused_variables, dead_code)]

use diesel::prelude::*;
use inbox_diesel::{InboxSchema, idempotent};

pub struct Msg {
    pub id: u64,
}

pub const BILLING: InboxSchema = InboxSchema::named("billing_inbox", "ux_billing_inbox");

#[idempotent(consumer = "invoices", key = msg.id, schema = BILLING, table = "inbox")]
fn invoice(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    Ok(())
}

pub const BROKEN: InboxSchema = InboxSchema::named("billing inbox", "ux_billing_inbox");

#[idempotent(consumer = "refunds", key = msg.id, schema = BROKEN)]
fn refund(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    Ok(())
}

fn main() {}
