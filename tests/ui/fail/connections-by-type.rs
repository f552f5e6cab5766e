// Connections the guard knows by their type, wherever they come from and however they are
// spelled: globals, fields, aliases, generic parameters, smart pointers, assignments. The
// handlers never run; only the errors are under test. Each handler is one form, refused once.
#![allow(unused_variables, unused_imports, dead_code, unused_mut, unused_assignments)]

use std::cell::RefCell;
use std::sync::{LazyLock, Mutex, OnceLock};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::r2d2::{ConnectionManager, Pool};
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

fn reset() -> diesel::query_builder::SqlQuery {
    diesel::sql_query("UPDATE accounts SET balance = 0")
}

fn helper(conn: &mut SqliteConnection) -> QueryResult<usize> {
    reset().execute(conn)
}

static POOL: LazyLock<Pool<ConnectionManager<SqliteConnection>>> =
    LazyLock::new(|| Pool::builder().build_unchecked(ConnectionManager::new(":memory:")));
static AUDIT: LazyLock<Mutex<SqliteConnection>> =
    LazyLock::new(|| Mutex::new(SqliteConnection::establish(":memory:").unwrap()));
static LATE: OnceLock<Mutex<SqliteConnection>> = OnceLock::new();
thread_local! {
    static LOCAL: RefCell<SqliteConnection> = RefCell::new(SqliteConnection::establish(":memory:").unwrap());
}

#[idempotent(consumer = "mutex", key = msg.id)]
fn global_behind_a_mutex(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let mut audit = AUDIT.lock().unwrap();
    reset().execute(&mut *audit)?;
    Ok(())
}

#[idempotent(consumer = "thread-local", key = msg.id)]
fn thread_local_connection(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    LOCAL.with(|c| reset().execute(&mut *c.borrow_mut()))?;
    Ok(())
}

#[idempotent(consumer = "once-lock", key = msg.id)]
fn once_lock(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    helper(&mut LATE.get().unwrap().lock().unwrap())?;
    Ok(())
}

pub struct Context {
    pub spare: SqliteConnection,
}

#[idempotent(consumer = "field", key = msg.id)]
fn field_to_a_helper(conn: &mut SqliteConnection, ctx: &mut Context, msg: &Msg) -> QueryResult<()> {
    helper(&mut ctx.spare)?;
    Ok(())
}

#[idempotent(consumer = "swap", key = msg.id)]
fn swapped_in(conn: &mut SqliteConnection, ctx: &mut Context, msg: &Msg) -> QueryResult<()> {
    std::mem::swap(conn, &mut ctx.spare);
    reset().execute(conn)?;
    Ok(())
}

#[derive(Debug)]
pub struct AppError;

impl From<diesel::result::Error> for AppError {
    fn from(_: diesel::result::Error) -> Self {
        AppError
    }
}

impl From<inbox_diesel::Error> for AppError {
    fn from(_: inbox_diesel::Error) -> Self {
        AppError
    }
}

#[idempotent(consumer = "map-err", key = msg.id)]
fn checkout_through_map_err(conn: &mut SqliteConnection, msg: &Msg) -> Result<(), AppError> {
    reset().execute(&mut POOL.get().map_err(|_| AppError)?)?;
    Ok(())
}

type Audit = SqliteConnection;

#[idempotent(consumer = "alias", key = msg.id, conn = conn)]
fn second_parameter_behind_an_alias(conn: &mut SqliteConnection, audit: &mut Audit, msg: &Msg) -> QueryResult<()> {
    Ok(())
}

#[idempotent(consumer = "generic", key = msg.id, conn = conn)]
fn generic_second_connection<C: Connection>(conn: &mut SqliteConnection, other: &mut C, msg: &Msg) -> QueryResult<()> {
    Ok(())
}

#[idempotent(consumer = "impl", key = msg.id, conn = conn)]
fn impl_connection(conn: &mut SqliteConnection, other: &mut impl Connection, msg: &Msg) -> QueryResult<()> {
    Ok(())
}

#[idempotent(consumer = "impl-simple", key = msg.id, conn = conn)]
fn impl_simple_connection(conn: &mut SqliteConnection, other: &mut impl SimpleConnection, msg: &Msg) -> QueryResult<()> {
    Ok(())
}

#[idempotent(consumer = "boxed", key = msg.id, conn = conn)]
fn boxed_connection(conn: &mut SqliteConnection, other: Box<SqliteConnection>, msg: &Msg) -> QueryResult<()> {
    Ok(())
}

pub struct Repo<'c> {
    pub db: &'c mut SqliteConnection,
}

#[idempotent(consumer = "struct-literal", key = msg.id)]
fn checkout_in_a_struct_literal(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let mut pooled = POOL.get().unwrap();
    let repo = Repo { db: &mut pooled };
    reset().execute(repo.db)?;
    Ok(())
}

#[idempotent(consumer = "array-literal", key = msg.id)]
fn checkout_in_an_array_literal(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    for c in [POOL.get().unwrap()] {
        let _ = c;
    }
    Ok(())
}

#[idempotent(consumer = "assignment", key = msg.id)]
fn reassigned_alias(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let mut pooled = POOL.get().unwrap();
    let mut c = &mut *conn;
    c = &mut *pooled;
    reset().execute(c)?;
    Ok(())
}

#[idempotent(consumer = "replace", key = msg.id)]
fn replaced_connection(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    *conn = SqliteConnection::establish(":memory:").unwrap();
    Ok(())
}

#[idempotent(consumer = "established", key = msg.id)]
fn established_and_written(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let mut other = SqliteConnection::establish(":memory:").unwrap();
    other.batch_execute("DELETE FROM accounts")?;
    Ok(())
}

#[idempotent(consumer = "guarded-pool", key = msg.id, conn = conn)]
fn guarded_pool_parameter(
    conn: &mut SqliteConnection,
    pool: &inbox_diesel::tripwire::r2d2::GuardedPool<ConnectionManager<SqliteConnection>>,
    msg: &Msg,
) -> QueryResult<()> {
    Ok(())
}

fn main() {}

impl inbox_diesel::HasDieselError for AppError {
    fn diesel_error(&self) -> Option<&diesel::result::Error> { None }
}
