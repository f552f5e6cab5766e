#![allow(unused_variables, unused_imports, dead_code, unused_mut, irrefutable_let_patterns, unused_assignments, unreachable_code, unused_labels)]
//! Temporaries borrowed by a binding's literal live as long as the binding.
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
pub struct Labels<'a> { pub a: &'a str, pub b: &'a [i64] }
// G25: array of borrowed temporaries
#[idempotent(consumer = "g25", key = msg.id)]
fn g25(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let names = [&msg.name.to_lowercase(), &msg.name.to_uppercase()];
    println!("{names:?}");
    Ok(())
}
// G26: Some(&temporary)
#[idempotent(consumer = "g26", key = msg.id)]
fn g26(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let o = Some(&msg.name.to_lowercase());
    println!("{o:?}");
    Ok(())
}
// G27: a struct of borrowed slices of temporaries
#[idempotent(consumer = "g27", key = msg.id)]
fn g27(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let l = Labels { a: &format!("id-{}", msg.id), b: &[1, 2, 3] };
    println!("{}", l.a);
    Ok(())
}
// G28: a borrowed literal array / constant (no temporaries that need calls)
#[idempotent(consumer = "g28", key = msg.id)]
fn g28(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let l = Labels { a: "x", b: &msg.amounts };
    println!("{}", l.a);
    Ok(())
}
fn main() {}
