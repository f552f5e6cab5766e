// Whatever the call is named — a fully qualified call, a renamed trait, an extension trait of
// the user's own, a connection method called on a type, a transaction on a global, a call
// inside a macro's arguments — the value it is given is judged by its type. The handlers
// never run; only the errors are under test. Each handler is one form, refused once.
#![allow(unused_variables, unused_imports, dead_code, unused_mut)]

use std::sync::{LazyLock, Mutex};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::query_dsl::methods::ExecuteDsl;
use diesel::r2d2::{ConnectionManager, Pool};
use diesel::RunQueryDsl as Run;
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

static POOL: LazyLock<Pool<ConnectionManager<SqliteConnection>>> =
    LazyLock::new(|| Pool::builder().build_unchecked(ConnectionManager::new(":memory:")));
static OTHER: LazyLock<Mutex<SqliteConnection>> =
    LazyLock::new(|| Mutex::new(SqliteConnection::establish(":memory:").unwrap()));

fn reset() -> diesel::query_builder::SqlQuery {
    diesel::sql_query("UPDATE accounts SET balance = 0")
}

/// An extension trait of the application's own.
pub trait Audit {
    fn write_audit(&mut self, what: &str) -> QueryResult<()>;
}

impl Audit for SqliteConnection {
    fn write_audit(&mut self, what: &str) -> QueryResult<()> {
        self.batch_execute(what)
    }
}

/// Migrations as diesel_migrations' `MigrationHarness` runs them: a method of the connection.
pub trait Migrate {
    fn run_pending_migrations(&mut self) -> QueryResult<()>;
}

impl<C: SimpleConnection> Migrate for C {
    fn run_pending_migrations(&mut self) -> QueryResult<()> {
        self.batch_execute("CREATE TABLE IF NOT EXISTS t (id INTEGER)")
    }
}

#[idempotent(consumer = "execute-dsl", key = msg.id)]
fn execute_dsl(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let mut pooled = POOL.get().unwrap();
    ExecuteDsl::execute(reset(), &mut *pooled)?;
    Ok(())
}

#[idempotent(consumer = "renamed", key = msg.id)]
fn renamed_run_query_dsl(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let mut pooled = POOL.get().unwrap();
    Run::execute(reset(), &mut pooled)?;
    Ok(())
}

#[idempotent(consumer = "on-a-type", key = msg.id)]
fn connection_method_on_a_type(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let mut g = OTHER.lock().unwrap();
    SqliteConnection::batch_execute(&mut *g, "DELETE FROM accounts")?;
    Ok(())
}

#[idempotent(consumer = "global-transaction", key = msg.id)]
fn transaction_on_a_global(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    OTHER.lock().unwrap().transaction(|c| reset().execute(c))?;
    Ok(())
}

#[idempotent(consumer = "extension", key = msg.id)]
fn extension_method(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let mut pooled = POOL.get().unwrap();
    pooled.write_audit("INSERT INTO audit VALUES (1)")?;
    Ok(())
}

#[idempotent(consumer = "migrations", key = msg.id)]
fn migrations(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    POOL.get().unwrap().run_pending_migrations()?;
    Ok(())
}

#[idempotent(consumer = "dbg", key = msg.id)]
fn inside_dbg(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    dbg!(reset().execute(&mut POOL.get().unwrap()))?;
    Ok(())
}

#[idempotent(consumer = "vec", key = msg.id)]
fn inside_vec(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let spare = vec![SqliteConnection::establish(":memory:").unwrap()];
    Ok(())
}

#[idempotent(consumer = "assert", key = msg.id)]
fn inside_assert(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let mut pooled = POOL.get().unwrap();
    assert!(reset().execute(&mut pooled).is_ok());
    Ok(())
}

#[idempotent(consumer = "format", key = msg.id)]
fn inside_format(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let mut pooled = POOL.get().unwrap();
    let note = format!("{:?}", pooled.batch_execute("DELETE FROM accounts"));
    Ok(())
}

#[idempotent(consumer = "nested-closure", key = msg.id)]
fn in_a_closure(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let run = || reset().execute(&mut *OTHER.lock().unwrap());
    run()?;
    Ok(())
}

fn main() {}
