// Containers are refused for what they hold, not for being containers: the handler's own
// transaction in an `Option` built in the body, and containers of values that are not
// connections — a cache behind a mutex, a channel, an `Option` of a count — compile.
#![allow(unused_variables, dead_code)]

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use diesel::prelude::*;
use inbox_diesel::idempotent;

pub struct Msg {
    pub id: u64,
}

pub struct Ctx {
    pub cache: Arc<Mutex<HashMap<u64, String>>>,
    pub seen: RefCell<Vec<u64>>,
    pub events: std::sync::mpsc::Sender<String>,
}

fn write(conn: Option<&mut SqliteConnection>) -> QueryResult<usize> {
    match conn {
        Some(conn) => diesel::sql_query("UPDATE accounts SET balance = 0").execute(conn),
        None => Ok(0),
    }
}

fn remember(cache: &Mutex<HashMap<u64, String>>, id: u64) {
    cache.lock().unwrap().insert(id, "done".into());
}

#[idempotent(consumer = "other-things", key = msg.id)]
fn other_things(conn: &mut SqliteConnection, msg: &Msg, ctx: &Ctx) -> QueryResult<()> {
    let on_the_transaction = Some(&mut *conn);
    write(on_the_transaction)?;
    remember(&ctx.cache, msg.id);
    ctx.seen.borrow_mut().push(msg.id);
    let count: Option<i64> = Some(1);
    let _ = ctx.events.send(format!("{count:?}"));
    Ok(())
}

fn main() {}
