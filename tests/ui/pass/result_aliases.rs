// Return types written as applications write them: an alias with its value type
// (`ApiResult<()>`), and one without (`type EmptyResult = ApiResult<()>`, Vaultwarden's most
// common), read through the compiler; the handler returns the outcome of the same `T`.
#![allow(unused_variables, dead_code)]

use diesel::prelude::*;
use inbox_diesel::{Outcome, idempotent};

#[derive(Debug)]
pub struct ApiError(String);

impl From<inbox_diesel::Error> for ApiError {
    fn from(e: inbox_diesel::Error) -> Self {
        ApiError(e.to_string())
    }
}

impl From<diesel::result::Error> for ApiError {
    fn from(e: diesel::result::Error) -> Self {
        ApiError(e.to_string())
    }
}

pub type ApiResult<T> = Result<T, ApiError>;
pub type EmptyResult = ApiResult<()>;
pub type JsonResult = ApiResult<String>;

pub struct Msg {
    pub id: u64,
}

#[idempotent(consumer = "empty", key = msg.id)]
fn empty(conn: &mut SqliteConnection, msg: &Msg) -> EmptyResult {
    diesel::sql_query("UPDATE accounts SET balance = 0").execute(conn)?;
    Ok(())
}

#[idempotent(consumer = "json", key = msg.id)]
fn json(conn: &mut SqliteConnection, msg: &Msg) -> JsonResult {
    Ok("{}".into())
}

fn callers(conn: &mut SqliteConnection) {
    let _: Result<Outcome<()>, ApiError> = empty(conn, &Msg { id: 1 });
    let _: Result<Outcome<String>, ApiError> = json(conn, &Msg { id: 2 });
}

fn main() {}
