// A connection erased on its way: handed on as `&mut dyn Any` (downcast inside the helper),
// coerced by a typed `let` or a cast to the application's own trait object, boxed as one.
// Each is asked at its own type, before it is erased.
#![allow(unused_variables, dead_code)]

use std::any::Any;

use diesel::prelude::*;
use diesel::r2d2::{ConnectionManager, Pool, PooledConnection};
use inbox_diesel::idempotent;

pub struct Msg {
    pub id: u64,
}

type DbPool = Pool<ConnectionManager<SqliteConnection>>;

pub struct Ctx {
    pub pool: DbPool,
}

fn through_any(c: &mut dyn Any) -> QueryResult<usize> {
    let c = c
        .downcast_mut::<PooledConnection<ConnectionManager<SqliteConnection>>>()
        .unwrap();
    diesel::sql_query("UPDATE accounts SET balance = balance + 1").execute(c)
}

pub trait Store {
    fn bump(&mut self) -> QueryResult<usize>;
}

impl Store for PooledConnection<ConnectionManager<SqliteConnection>> {
    fn bump(&mut self) -> QueryResult<usize> {
        diesel::sql_query("UPDATE accounts SET balance = 1").execute(&mut **self)
    }
}

#[idempotent(consumer = "erased", key = msg.id)]
fn erased(conn: &mut SqliteConnection, msg: &Msg, ctx: &Ctx) -> QueryResult<()> {
    let mut checkout = ctx.pool.get().unwrap();
    through_any(&mut checkout)?;
    let store: &mut dyn Store = &mut checkout;
    store.bump()?;
    let cast = &mut checkout as &mut dyn Store;
    let boxed: Box<dyn Store> = Box::new(ctx.pool.get().unwrap());
    Ok(())
}

fn main() {}
