// A claim-mode body is given `NoConnection`, not the handler's connection: every use of it is
// refused, and so is any other connection. The handlers never run; only the errors are under
// test. Each handler is one form.
#![allow(unused_variables, unused_imports, dead_code, unused_mut, irrefutable_let_patterns)]

use std::sync::LazyLock;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::r2d2::{ConnectionManager, Pool};
use inbox_diesel::idempotent;

pub struct Msg {
    pub id: u64,
}

static POOL: LazyLock<Pool<ConnectionManager<SqliteConnection>>> =
    LazyLock::new(|| Pool::builder().build_unchecked(ConnectionManager::new(":memory:")));

pub struct Repo<'c> {
    pub db: &'c mut SqliteConnection,
}

pub trait Audit {
    fn write_audit(&mut self);
}

#[idempotent(consumer = "typed-alias", key = msg.id, mode = "claim")]
fn typed_alias(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let c: &mut SqliteConnection = conn;
    Ok(())
}

#[idempotent(consumer = "repo", key = msg.id, mode = "claim")]
fn in_a_struct(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let repo = Repo { db: conn };
    Ok(())
}

#[idempotent(consumer = "match", key = msg.id, mode = "claim")]
fn matched(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    match conn {
        c => c.batch_execute("DELETE FROM t"),
    }
}

#[idempotent(consumer = "tuple", key = msg.id, mode = "claim")]
fn in_a_tuple(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let (c, _) = (conn, 0);
    Ok(())
}

#[idempotent(consumer = "block", key = msg.id, mode = "claim")]
fn in_a_block(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let c = { conn };
    Ok(())
}

#[idempotent(consumer = "array", key = msg.id, mode = "claim")]
fn in_an_array(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let all = [&mut *conn];
    Ok(())
}

#[idempotent(consumer = "extension", key = msg.id, mode = "claim")]
fn extension_method(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    conn.write_audit();
    Ok(())
}

#[idempotent(consumer = "if-let", key = msg.id, mode = "claim")]
fn shadowed_by_if_let(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    if let Ok(mut conn) = POOL.get() {
        conn.batch_execute("DELETE FROM t")?;
    }
    Ok(())
}

#[idempotent(consumer = "pool", key = msg.id, mode = "claim")]
fn pool_checkout(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    diesel::sql_query("DELETE FROM t").execute(&mut POOL.get().unwrap())?;
    Ok(())
}

#[idempotent(consumer = "established", key = msg.id, mode = "claim")]
fn established(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let mut other = SqliteConnection::establish(":memory:").unwrap();
    diesel::sql_query("DELETE FROM t").execute(&mut other)?;
    Ok(())
}

fn main() {}
