// The handlers here never run; only the error is under test.
#![allow(unused_variables, unused_imports, dead_code)]

use std::sync::{LazyLock, Mutex};

use diesel::prelude::*;
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

/// A connection that is not the handler's.
static OTHER: LazyLock<Mutex<SqliteConnection>> =
    LazyLock::new(|| Mutex::new(SqliteConnection::establish(":memory:").unwrap()));

use diesel::r2d2::{ConnectionManager, Pool};

static POOL: LazyLock<Pool<ConnectionManager<SqliteConnection>>> =
    LazyLock::new(|| Pool::new(ConnectionManager::new(":memory:")).unwrap());

#[derive(Debug)]
pub enum AppError {
    Db(diesel::result::Error),
    Pool(diesel::r2d2::PoolError),
    Inbox(inbox_diesel::Error),
}

impl From<diesel::result::Error> for AppError {
    fn from(e: diesel::result::Error) -> Self { AppError::Db(e) }
}
impl From<diesel::r2d2::PoolError> for AppError {
    fn from(e: diesel::r2d2::PoolError) -> Self { AppError::Pool(e) }
}
impl From<inbox_diesel::Error> for AppError {
    fn from(e: inbox_diesel::Error) -> Self { AppError::Inbox(e) }
}

#[idempotent(consumer = "credit", key = msg.id)]
fn on_credit(conn: &mut SqliteConnection, msg: &Msg) -> Result<(), AppError> {
    diesel::update(accounts::table)
        .set(accounts::balance.eq(accounts::balance + 10))
        .execute(&mut POOL.get()?)?;
    Ok(())
}

fn main() {}

impl inbox_diesel::HasDieselError for AppError {
    fn diesel_error(&self) -> Option<&diesel::result::Error> { None }
}
