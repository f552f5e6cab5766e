// The function API reads the body's diesel error through `HasDieselError`: an error type
// of the application's that does not implement it is refused, with what to write.
#![allow(unused_variables, dead_code)]

use std::sync::LazyLock;

use diesel::prelude::*;
use inbox_diesel::handler::{Handler, run_once};
use inbox_diesel::{Outcome, guarded};

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

static CREDIT: LazyLock<Handler> = LazyLock::new(|| Handler::new("credit").unwrap());

fn credit(conn: &mut SqliteConnection, id: &str) -> Result<Outcome<usize>, ApiError> {
    run_once(conn, &CREDIT, id, guarded!(|tx| {
        Ok::<_, ApiError>(diesel::sql_query("UPDATE accounts SET balance = 0").execute(tx)?)
    }))
}

fn main() {}
