#![allow(unused_variables, unused_imports, dead_code, unused_mut, irrefutable_let_patterns, unused_assignments, unreachable_code, unused_labels)]
// More escapes a new user tried: statics, pool fields, boxes of connections, macros. Each
// handler is refused. The handlers never run.
use std::sync::{Arc, LazyLock, Mutex};
use std::cell::RefCell;
use std::rc::Rc;
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::r2d2::{ConnectionManager, Pool, PooledConnection};
use inbox_diesel::idempotent;

diesel::table! {
    accounts (id) {
        id -> Integer,
        balance -> BigInt,
    }
}

pub struct Msg { pub id: u64, pub amounts: Vec<i64>, pub name: String }
type Checkout = PooledConnection<ConnectionManager<SqliteConnection>>;
type SqlitePool = Pool<ConnectionManager<SqliteConnection>>;
static POOL: LazyLock<SqlitePool> =
    LazyLock::new(|| Pool::builder().build_unchecked(ConnectionManager::new(":memory:")));
static GLOBAL: LazyLock<Mutex<SqliteConnection>> =
    LazyLock::new(|| Mutex::new(SqliteConnection::establish(":memory:").unwrap()));

fn add(conn: &mut SqliteConnection, amount: i64) -> QueryResult<usize> {
    diesel::update(accounts::table.find(1))
        .set(accounts::balance.eq(accounts::balance + amount))
        .execute(conn)
}
fn reset() -> diesel::query_builder::SqlQuery { diesel::sql_query("UPDATE accounts SET balance = 0") }
fn add_with_pool(pool: &SqlitePool) -> QueryResult<usize> { add(&mut pool.get().unwrap(), 1) }
fn add_generic<C: diesel::connection::SimpleConnection>(c: &mut C) -> QueryResult<()> { c.batch_execute("UPDATE accounts SET balance = 1") }
fn make_boxed() -> Box<Box<Box<SqliteConnection>>> { Box::new(Box::new(Box::new(SqliteConnection::establish(":memory:").unwrap()))) }
fn checkout() -> Checkout { POOL.get().unwrap() }
fn checkout_impl() -> impl diesel::connection::SimpleConnection { POOL.get().unwrap() }
fn checkout_opt() -> Option<Checkout> { POOL.get().ok() }
pub struct Repo<'c> { pub db: &'c mut SqliteConnection, pub n: i64 }
pub struct Ctx { pub id: u64, pub pool: &'static SqlitePool, pub name: String }
pub struct AppPool(pub SqlitePool);
impl std::ops::Deref for AppPool { type Target = SqlitePool; fn deref(&self) -> &SqlitePool { &self.0 } }
fn add_with_app(p: &AppPool) -> QueryResult<usize> { add(&mut p.get().unwrap(), 1) }
pub struct Svc { pub pool: &'static SqlitePool }

fn reborrow(c: &mut Checkout) -> &mut SqliteConnection { c }
fn credit_one(c: &mut SqliteConnection) -> QueryResult<()> { add(c, 1).map(drop) }
// E23: a pool parameter behind LazyLock
#[idempotent(consumer = "e23", key = msg.id, conn = conn)]
fn e23(conn: &mut SqliteConnection, pool: &LazyLock<SqlitePool>, msg: &Msg) -> QueryResult<()> {
    add_with_pool(pool)?;
    Ok(())
}
// E24: an application pool newtype that derefs to the r2d2 pool
#[idempotent(consumer = "e24", key = msg.id, conn = conn)]
fn e24(conn: &mut SqliteConnection, app: &AppPool, msg: &Msg) -> QueryResult<()> {
    add_with_app(app)?;
    Ok(())
}
// E25: a static declared inside the body
#[idempotent(consumer = "e25", key = msg.id)]
fn e25(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    static LOCAL: LazyLock<SqlitePool> = LazyLock::new(|| Pool::builder().build_unchecked(ConnectionManager::new(":memory:")));
    add_with_pool(&LOCAL)?;
    Ok(())
}
// E26: a method handler: &'static pool field of &self
impl Svc {
    #[idempotent(consumer = "e26", key = msg.id, conn = conn)]
    fn e26(&self, conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
        add_with_pool(self.pool)?;
        Ok(())
    }
}
// E28: pattern parameter (tuple) carrying a checkout
#[idempotent(consumer = "e28", key = msg.id, conn = conn)]
fn e28(conn: &mut SqliteConnection, (n, spare): (i64, &mut Checkout), msg: &Msg) -> QueryResult<()> {
    Ok(())
}
fn main() {}
