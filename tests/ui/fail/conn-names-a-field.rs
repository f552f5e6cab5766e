// A pool kept in a job runner's context, named by its path: the handler takes the pool as a
// parameter of its own instead. The handlers here never run; only the error is under test.
#![allow(unused_variables, unused_imports)]

use diesel::prelude::*;
use inbox_diesel::idempotent;

pub struct Context {
    pub db_pool: diesel::r2d2::Pool<diesel::r2d2::ConnectionManager<SqliteConnection>>,
}

#[idempotent(consumer = "mail", key = user_id, mode = "claim", conn = ctx.db_pool)]
fn send_mail(ctx: &Context, user_id: i64) -> Result<(), inbox_diesel::Error> {
    Ok(())
}

fn main() {}
