// The handlers here never run; only the error is under test.
#![allow(unused_variables, unused_imports)]

use diesel::prelude::*;
use inbox_diesel::idempotent;

pub struct Msg {
    pub id: i64,
}

pub struct Mailer;

// `conn = …` in claim mode names `&mut` a connection or `&` a pool; a mailer is neither.
#[idempotent(consumer = "mail", key = msg.id, mode = "claim", conn = mailer)]
fn on_signup(mailer: &Mailer, msg: &Msg) -> QueryResult<()> {
    Ok(())
}
fn main() {}
