//! Claim mode on a pool: the handler takes `&` a pool in place of its connection — r2d2's,
//! bb8's, deadpool's, each guarded one, an alias, one named by `conn = …` — and its future
//! stays `Send`.
#![allow(unused_variables)]

use diesel::prelude::*;
use diesel::r2d2::ConnectionManager;
use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use inbox_diesel::tripwire;
use inbox_diesel::{InFlightOutcome, StaleClaimOutcome, idempotent};

pub struct Signup {
    pub id: i64,
}

#[derive(Debug)]
pub struct AppError;

impl From<inbox_diesel::Error> for AppError {
    fn from(_: inbox_diesel::Error) -> Self {
        AppError
    }
}

type AsyncSqlite = SyncConnectionWrapper<SqliteConnection>;
type DbPool = diesel::r2d2::Pool<ConnectionManager<SqliteConnection>>;

#[idempotent(consumer = "mail", key = msg.id, mode = "claim")]
fn on_r2d2(
    pool: &diesel::r2d2::Pool<ConnectionManager<SqliteConnection>>,
    msg: &Signup,
) -> Result<(), AppError> {
    Ok(())
}

#[idempotent(consumer = "mail", key = msg.id, mode = "claim", on_expired = "report")]
fn on_an_alias(pool: &DbPool, msg: &Signup) -> Result<(), AppError> {
    Ok(())
}

#[idempotent(consumer = "mail", key = msg.id, mode = "claim")]
fn on_a_guarded_r2d2(
    pool: &tripwire::r2d2::GuardedPool<ConnectionManager<SqliteConnection>>,
    msg: &Signup,
) -> Result<(), AppError> {
    Ok(())
}

/// Taken by value: a claim-mode body runs once.
#[idempotent(consumer = "mail", key = msg.id, mode = "claim", conn = db)]
fn named(db: &DbPool, msg: Signup) -> Result<i64, AppError> {
    Ok(msg.id)
}

#[idempotent(consumer = "mail", key = msg.id, mode = "claim")]
async fn on_bb8(
    pool: &diesel_async::pooled_connection::bb8::Pool<AsyncSqlite>,
    msg: &Signup,
) -> Result<(), AppError> {
    Ok(())
}

#[idempotent(consumer = "mail", key = msg.id, mode = "claim")]
async fn on_deadpool(
    pool: &diesel_async::pooled_connection::deadpool::Pool<AsyncSqlite>,
    msg: &Signup,
) -> Result<(), AppError> {
    Ok(())
}

#[idempotent(consumer = "mail", key = msg.id, mode = "claim")]
async fn on_a_guarded_bb8(
    pool: &tripwire::bb8::GuardedPool<AsyncDieselConnectionManager<AsyncSqlite>>,
    msg: &Signup,
) -> Result<(), AppError> {
    Ok(())
}

#[idempotent(consumer = "mail", key = msg.id, mode = "claim")]
async fn on_a_guarded_deadpool(
    pool: &tripwire::deadpool::GuardedPool<AsyncDieselConnectionManager<AsyncSqlite>>,
    msg: &Signup,
) -> Result<(), AppError> {
    Ok(())
}

fn is_send<T: Send>(_: T) {}

fn main() {
    let _: fn(&DbPool, &Signup) -> Result<InFlightOutcome<()>, AppError> = on_r2d2;
    let _: fn(&DbPool, &Signup) -> Result<StaleClaimOutcome<()>, AppError> = on_an_alias;
    let _ = on_a_guarded_r2d2;
    let _ = named;
    let signup = Signup { id: 1 };
    let bb8 = None::<diesel_async::pooled_connection::bb8::Pool<AsyncSqlite>>;
    if let Some(pool) = &bb8 {
        is_send(on_bb8(pool, &signup));
    }
    let deadpool = None::<diesel_async::pooled_connection::deadpool::Pool<AsyncSqlite>>;
    if let Some(pool) = &deadpool {
        is_send(on_deadpool(pool, &signup));
    }
    let _ = on_a_guarded_bb8;
    let _ = on_a_guarded_deadpool;
}
