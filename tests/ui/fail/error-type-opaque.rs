#![deny(deprecated)]
// A handler whose error type carries no diesel error the runtime can find — neither a
// `std::error::Error` nor `HasDieselError` — is warned about at its return type: a deadlock in
// its body would be handed back unretried. A warning (`deprecated`), denied here.
use diesel::prelude::*;
use inbox_diesel::idempotent;

#[derive(Debug)]
pub enum JobError {
    Abort(String),
    Retry(String),
}

impl From<inbox_diesel::Error> for JobError {
    fn from(error: inbox_diesel::Error) -> Self {
        JobError::Retry(error.to_string())
    }
}

impl From<diesel::result::Error> for JobError {
    fn from(error: diesel::result::Error) -> Self {
        JobError::Retry(error.to_string())
    }
}

#[idempotent(consumer = "jobs", key = id)]
fn run_job(conn: &mut SqliteConnection, id: i64) -> Result<(), JobError> {
    diesel::sql_query("UPDATE accounts SET balance = balance + 1").execute(conn)?;
    Ok(())
}

fn main() {}
