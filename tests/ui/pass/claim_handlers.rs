//! Claim-mode forms that must keep compiling: sync and async, every option, the escape hatch,
//! and a spawned async handler (its future is `Send`).
#![allow(unused_variables)]

use diesel::prelude::*;
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use inbox_diesel::{InFlightOutcome, StaleClaimOutcome, Uuid, idempotent};

pub struct Signup {
    pub id: Uuid,
    pub email: String,
}

pub struct Mailer;

impl Mailer {
    /// A provider call that takes an idempotency key.
    pub fn send(&self, to: &str, idempotency_key: &str) -> Result<(), MailError> {
        Ok(())
    }

    pub async fn send_async(&self, to: &str, idempotency_key: &str) -> Result<(), MailError> {
        Ok(())
    }
}

#[derive(Debug)]
pub struct MailError;

#[derive(Debug)]
pub enum AppError {
    Mail(MailError),
    Inbox(inbox_diesel::Error),
}

impl From<MailError> for AppError {
    fn from(e: MailError) -> Self {
        AppError::Mail(e)
    }
}

impl From<inbox_diesel::Error> for AppError {
    fn from(e: inbox_diesel::Error) -> Self {
        AppError::Inbox(e)
    }
}

#[idempotent(consumer = "welcome-mail", key = msg.id, mode = "claim")]
fn send_welcome(conn: &mut SqliteConnection, mailer: &Mailer, msg: &Signup) -> Result<(), AppError> {
    mailer.send(&msg.email, &msg.id.to_string())?;
    Ok(())
}

#[idempotent(
    consumer = "welcome-mail",
    key = msg.id,
    mode = "claim",
    lease_ms = 120000,
    on_expired = "report",
    retries = 5,
    table = "mail.inbox",
    busy_timeout_ms = 100
)]
fn send_welcome_or_report(
    conn: &mut SqliteConnection,
    mailer: &Mailer,
    msg: &Signup,
) -> Result<String, AppError> {
    // The body has no connection; a read from another one needs the escape hatch.
    #[inbox::outside_transaction("the template is read, never written, and may be stale")]
    let count: i64 = diesel::dsl::select(1_i64.into_sql::<diesel::sql_types::BigInt>())
        .get_result(&mut SqliteConnection::establish(":memory:").unwrap())
        .unwrap_or(0);
    mailer.send(&msg.email, &msg.id.to_string())?;
    Ok(format!("sent {count}"))
}

#[idempotent(consumer = "welcome-mail", key = msg.id, mode = "claim", on_expired = "take_over")]
async fn send_welcome_async(
    conn: &mut SyncConnectionWrapper<SqliteConnection>,
    mailer: &Mailer,
    msg: &Signup,
) -> Result<(), AppError> {
    mailer.send_async(&msg.email, &msg.id.to_string()).await?;
    Ok(())
}

// Each claim-mode handler's outcome type holds what it can answer: a pump's match is
// exhaustive without dead arms.
fn settle(outcome: InFlightOutcome<()>) -> bool {
    match outcome {
        InFlightOutcome::Processed(()) | InFlightOutcome::Duplicate { .. } => true,
        InFlightOutcome::InFlight { .. } => false,
    }
}

fn settle_report(outcome: StaleClaimOutcome<String>) -> bool {
    match outcome {
        StaleClaimOutcome::Processed(_) | StaleClaimOutcome::Duplicate { .. } => true,
        StaleClaimOutcome::InFlight { .. } | StaleClaimOutcome::StaleClaim { .. } => false,
    }
}

fn main() {
    let _: fn(&mut SqliteConnection, &Mailer, &Signup) -> Result<StaleClaimOutcome<String>, AppError> =
        send_welcome_or_report;
    let _ = settle_report;
    // A pump serving several modes widens with `From`.
    let _: StaleClaimOutcome<()> = InFlightOutcome::Processed(()).into();
    let _spawned = async {
        tokio::spawn(async move {
            let mut conn = SyncConnectionWrapper::new(SqliteConnection::establish(":memory:").unwrap());
            let msg = Signup { id: Uuid::nil(), email: String::new() };
            let outcome = send_welcome_async(&mut conn, &Mailer, &msg).await;
            outcome.map(settle)
        })
    };
}
