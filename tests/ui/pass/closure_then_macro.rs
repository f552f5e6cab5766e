#![allow(unused_variables, unused_imports, dead_code, unused_mut, irrefutable_let_patterns, unused_assignments, unreachable_code, unused_labels)]
//! A closure given the transaction stays the transaction when a macro follows it.
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
#[idempotent(consumer = "g01a", key = msg.id)]
fn g01a(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let credit = |c: &mut SqliteConnection, n: i64| add(c, n);
    credit(conn, 1)?;
    Ok(())
}
#[idempotent(consumer = "g01b", key = msg.id)]
fn g01b(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let credit = |c: &mut SqliteConnection, n: i64| add(c, n);
    credit(conn, 1)?;
    assert!(msg.id > 0);
    Ok(())
}
#[idempotent(consumer = "g01c", key = msg.id)]
fn g01c(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let credit = |c: &mut SqliteConnection, n: i64| add(c, n);
    let v = vec![1i64, 2];
    for n in v { credit(conn, n)?; }
    Ok(())
}
fn main() {}
