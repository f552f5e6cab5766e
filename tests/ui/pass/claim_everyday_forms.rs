#![allow(unused_variables, unused_imports, dead_code, unused_mut, irrefutable_let_patterns, unused_assignments, unreachable_code, unused_labels)]
//! Good code a new user wrote, claim mode and the transaction through branches: every form
//! compiles.
include!("../common/sync.rs");
#[derive(Debug)]
pub struct AppError;
impl From<diesel::result::Error> for AppError { fn from(_: diesel::result::Error) -> Self { AppError } }
impl From<inbox_diesel::Error> for AppError { fn from(_: inbox_diesel::Error) -> Self { AppError } }
impl From<String> for AppError { fn from(_: String) -> Self { AppError } }
pub struct RedisConnection;
impl RedisConnection { pub fn set(&mut self, k: &str, v: &str) -> Result<(), String> { Ok(()) } }
pub struct Http;
impl Http { pub fn execute(&self, req: &mut Vec<u8>) -> Result<usize, String> { Ok(req.len()) } }
macro_rules! info { ($($t:tt)*) => { let _ = stringify!($($t)*); }; }
fn with_retry(conn: &mut SqliteConnection, f: impl Fn(&mut SqliteConnection) -> QueryResult<usize>) -> QueryResult<usize> { f(conn) }

// GC01: claim with a redis-like client, an http `execute`, iterators, macros
#[idempotent(consumer = "gc01", key = msg.id, mode = "claim", conn = conn)]
fn gc01(conn: &mut SqliteConnection, redis: &mut RedisConnection, http: &Http, msg: &Msg) -> Result<(), AppError> {
    let key = format!("k-{}", msg.id);
    redis.set(&key, "v")?;
    let mut body = msg.name.as_bytes().to_vec();
    http.execute(&mut body)?;
    let total: i64 = msg.amounts.iter().filter(|a| **a > 0).sum();
    info!(%key, ?total, "sent");
    assert!(matches!(msg.amounts.first(), Some(n) if *n >= 0));
    let conn = "smtp://localhost";
    println!("{conn} {total}");
    Ok(())
}
// GC02: claim with closures mutating state, labeled loops, let-else, combinators
#[idempotent(consumer = "gc02", key = msg.id, mode = "claim")]
fn gc02(conn: &mut SqliteConnection, msg: &Msg) -> Result<(), AppError> {
    let mut sent = Vec::new();
    let mut record = |s: &str| sent.push(s.to_string());
    record("a");
    'l: for a in &msg.amounts { if *a < 0 { break 'l; } }
    let Some(first) = msg.amounts.first() else { return Ok(()) };
    let doubled = msg.amounts.get(1).map(|x| x * 2).unwrap_or_default();
    let parsed: i64 = msg.name.parse().map_err(|_| String::from("bad"))?;
    Ok(())
}
// G31: match returning the transaction
#[idempotent(consumer = "g31", key = msg.id)]
fn g31(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let c = match msg.id { 0 => &mut *conn, _ => &mut *conn };
    add(c, 1)?;
    Ok(())
}
/// A job taken by value and handed on, as a port of a job runner writes it: a claim-mode
/// body runs once, so it may consume its parameters (no clone).
pub struct Job {
    pub id: u64,
    pub email: String,
}
fn send_email(to: String) -> Result<(), String> {
    let _ = to;
    Ok(())
}
#[idempotent(consumer = "gc-owned", key = job.id, mode = "claim")]
fn consumes_its_job(conn: &mut SqliteConnection, job: Job) -> Result<(), AppError> {
    send_email(job.email)?;
    Ok(())
}
#[idempotent(consumer = "gc-owned-async", key = job.id, mode = "claim")]
async fn consumes_its_job_async(
    conn: &mut diesel_async::sync_connection_wrapper::SyncConnectionWrapper<SqliteConnection>,
    job: Job,
) -> Result<(), AppError> {
    let sent = async move { send_email(job.email) }.await;
    sent?;
    Ok(())
}

fn main() {}
