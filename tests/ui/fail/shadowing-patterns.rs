// A binding that shadows the handler's connection is a new value, judged by its own type:
// every pattern that binds a name, sync. The handlers never run; only the errors are under
// test. Each handler below is one form, refused once.
#![allow(unused_variables, unused_imports, dead_code, unused_mut, irrefutable_let_patterns)]

use std::sync::LazyLock;

use diesel::prelude::*;
use diesel::r2d2::{ConnectionManager, Pool, PooledConnection};
use inbox_diesel::idempotent;

diesel::table! {
    accounts (id) {
        id -> Integer,
        balance -> BigInt,
    }
}

pub struct Msg {
    pub id: u64,
}

type Checkout = PooledConnection<ConnectionManager<SqliteConnection>>;

static POOL: LazyLock<Pool<ConnectionManager<SqliteConnection>>> =
    LazyLock::new(|| Pool::builder().build_unchecked(ConnectionManager::new(":memory:")));

fn reset() -> diesel::query_builder::SqlQuery {
    diesel::sql_query("UPDATE accounts SET balance = 0")
}

#[idempotent(consumer = "if-let", key = msg.id)]
fn if_let(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    if let Ok(mut conn) = POOL.get() {
        reset().execute(&mut conn)?;
    }
    Ok(())
}

#[idempotent(consumer = "match-arm", key = msg.id)]
fn match_arm(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    match POOL.get() {
        Ok(mut conn) => reset().execute(&mut conn).map(drop),
        Err(_) => Ok(()),
    }
}

#[idempotent(consumer = "for", key = msg.id)]
fn for_loop(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    for mut conn in POOL.get() {
        reset().execute(&mut conn)?;
    }
    Ok(())
}

#[idempotent(consumer = "while-let", key = msg.id)]
fn while_let(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let mut spare: Vec<Checkout> = Vec::new();
    while let Some(mut conn) = spare.pop() {
        reset().execute(&mut conn)?;
    }
    Ok(())
}

#[idempotent(consumer = "tuple", key = msg.id)]
fn tuple(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let (mut conn, attempts) = (POOL.get().unwrap(), 1);
    reset().execute(&mut conn)?;
    Ok(())
}

pub struct Lease {
    pub db: Checkout,
}

#[idempotent(consumer = "struct", key = msg.id)]
fn destructured(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let Lease { db: mut conn } = Lease { db: POOL.get().unwrap() };
    reset().execute(&mut conn)?;
    Ok(())
}

#[idempotent(consumer = "let-else", key = msg.id)]
fn let_else(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let Ok(mut conn) = POOL.get() else { return Ok(()) };
    reset().execute(&mut conn)?;
    Ok(())
}

#[idempotent(consumer = "closure", key = msg.id)]
fn closure_parameter(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    POOL.get().into_iter().try_for_each(|mut conn| reset().execute(&mut conn).map(drop))
}

#[idempotent(consumer = "block", key = msg.id)]
fn inner_block(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    {
        let conn = &mut *POOL.get().unwrap();
        reset().execute(conn)?;
    }
    Ok(())
}

#[idempotent(consumer = "reborrow", key = msg.id)]
fn shadowed_then_reborrowed(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let mut pooled = POOL.get().unwrap();
    let conn = &mut *pooled;
    reset().execute(&mut *conn)?;
    Ok(())
}

fn main() {}
