// The handlers here never run; only the error is under test.
#![allow(unused_variables, unused_imports)]

use diesel::prelude::*;
use inbox_diesel::idempotent;

pub struct Msg {
    pub id: u64,
}

#[idempotent(consumer = "credit", key = msg.id)]
fn on_credit(conn: &mut SqliteConnection, msg: &Msg) -> Option<()> {
    Some(())
}

/// A type named without arguments is read through the compiler: not a `Result`, refused there.
pub struct Receipt;

#[idempotent(consumer = "receipt", key = msg.id)]
fn on_receipt(conn: &mut SqliteConnection, msg: &Msg) -> Receipt {
    Receipt
}

fn main() {}
