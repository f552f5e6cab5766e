//! `transaction = "caller"`: the shapes a job runner writes, sync and async — the handler
//! called inside the runner's `conn.transaction`, its body run once (it may consume its
//! parameters), the default and explicit `transaction = "own"`.
#![allow(unused_variables)]

use diesel::prelude::*;
use diesel_async::AsyncConnection;
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use inbox_diesel::{Outcome, idempotent};

pub struct Job {
    pub id: i64,
    pub email: String,
}

#[idempotent(consumer = "jobs", key = job.id, transaction = "caller")]
fn notify(conn: &mut SqliteConnection, job: Job) -> Result<String, inbox_diesel::Error> {
    diesel::sql_query("INSERT INTO sent (id) VALUES (1)").execute(conn)?;
    // Run once: the parameter is handed on, not cloned.
    Ok(job.email)
}

#[idempotent(consumer = "jobs", key = job.id, transaction = "caller")]
async fn notify_async(
    conn: &mut SyncConnectionWrapper<SqliteConnection>,
    job: Job,
) -> Result<String, inbox_diesel::Error> {
    diesel_async::RunQueryDsl::execute(diesel::sql_query("INSERT INTO sent (id) VALUES (1)"), conn)
        .await?;
    Ok(job.email)
}

// Its result and the job's fingerprint kept with the marker, the body still consuming the
// parameter the fingerprint reads.
#[idempotent(
    consumer = "jobs",
    key = job.id,
    transaction = "caller",
    store_result = true,
    fingerprint = job.email.as_bytes()
)]
fn notify_kept(conn: &mut SqliteConnection, job: Job) -> Result<String, inbox_diesel::Error> {
    Ok(job.email)
}

#[idempotent(
    consumer = "jobs",
    key = job.id,
    transaction = "caller",
    store_result = true,
    fingerprint = job.email.as_bytes()
)]
async fn notify_kept_async(
    conn: &mut SyncConnectionWrapper<SqliteConnection>,
    job: Job,
) -> Result<String, inbox_diesel::Error> {
    Ok(job.email)
}

// Claim mode, whose body runs once too.
#[idempotent(consumer = "mails", key = job.id, mode = "claim", fingerprint = job.email.as_bytes())]
fn mail_kept(conn: &mut SqliteConnection, job: Job) -> Result<String, inbox_diesel::Error> {
    Ok(job.email)
}

#[idempotent(consumer = "jobs", key = job.id, transaction = "own")]
fn notify_own(conn: &mut SqliteConnection, job: &Job) -> Result<(), inbox_diesel::Error> {
    Ok(())
}

fn run_job(conn: &mut SqliteConnection, job: Job) -> Result<Outcome<String>, inbox_diesel::Error> {
    conn.transaction(|conn| {
        let id = job.id;
        let outcome = notify(conn, job)?;
        diesel::sql_query("DELETE FROM jobs WHERE id = ?")
            .bind::<diesel::sql_types::BigInt, _>(id)
            .execute(conn)?;
        Ok(outcome)
    })
}

async fn run_job_async(
    conn: &mut SyncConnectionWrapper<SqliteConnection>,
    job: Job,
) -> Result<Outcome<String>, inbox_diesel::Error> {
    conn.transaction(async |conn| notify_async(conn, job).await)
        .await
}

fn main() {}
