//! What the broker examples share: consumer processes started from the example's own
//! binary ([`fleet`]), the lines they print for the orchestrator ([`events`]), the database
//! of their effects ([`store`]), the brokers' connections, queues and streams
//! ([`brokers`]), and the run with its kill and its table ([`scenario`]).
//!
//! An example is one binary in two modes. Run without arguments it orchestrates: it
//! declares a queue, starts two consumer processes (itself, with `consume <queue>
//! <database> <name>`), publishes every message twice, kills one consumer with SIGKILL in
//! the middle of a handler, starts it again, and prints what happened:
//!
//! ```no_run
//! use inbox_broker_examples::fleet::Fleet;
//! use inbox_broker_examples::scenario::Scenario;
//! use inbox_broker_examples::store::Store;
//!
//! # async fn publish(ids: &[String]) {}
//! # async fn orchestrate() -> Result<std::process::ExitCode, String> {
//! let scenario = Scenario {
//!     messages: 40,
//!     copies: 2,
//!     kill_after: 3,
//!     timeout: std::time::Duration::from_secs(60),
//! };
//! let store = Store::prepare().await?; // DATABASE_URL, or SQLite in a temporary directory
//! let mut fleet = Fleet::new(["consume", "the-queue", store.url()]).map_err(|e| e.to_string())?;
//! scenario.start(&mut fleet).await?;
//! publish(&scenario.message_ids()).await; // each id `copies` times, through the broker
//! // The broker's count of messages waiting for a consumer: the run ends at 0.
//! let pending = async || Ok::<u64, String>(0);
//! let mut tally = scenario.drive(&mut fleet, &store, pending).await?;
//! tally.stopped(fleet.stop(std::time::Duration::from_secs(15)).await);
//! Ok(tally.report()) // non-zero unless every message has exactly one effect
//! # }
//! ```
//!
//! In consumer mode it runs the broker's consumer loop with
//! [`Database::apply`](store::Database::apply) — an `#[idempotent]` handler — and prints
//! an [`Event`](events::Event) per delivery and per answer, until its standard input closes
//! ([`fleet::until_stdin_closes`]).

pub mod brokers;
pub mod events;
pub mod fleet;
pub mod scenario;
pub mod store;

/// The RabbitMQ broker the examples use: `AMQP_URL`, by default the local one.
pub fn amqp_url() -> String {
    env_or("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f")
}

/// The NATS server (with JetStream) the examples use: `NATS_URL`, by default the local one.
pub fn nats_url() -> String {
    env_or("NATS_URL", "nats://127.0.0.1:4222")
}

/// The Kafka brokers the examples use: `KAFKA_BROKERS` (a bootstrap list), else none — the
/// example then starts a private broker ([`brokers::Kafka::start`]).
pub fn kafka_brokers() -> Option<String> {
    std::env::var("KAFKA_BROKERS")
        .ok()
        .filter(|brokers| !brokers.is_empty())
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|url| !url.is_empty())
        .unwrap_or_else(|| default.to_owned())
}

/// `url` with the password of its user replaced by `***`, for messages and logs.
///
/// ```
/// use inbox_broker_examples::without_password;
///
/// assert_eq!(
///     without_password("amqp://guest:guest@127.0.0.1:5672/%2f"),
///     "amqp://guest:***@127.0.0.1:5672/%2f"
/// );
/// assert_eq!(without_password("/tmp/effects.sqlite"), "/tmp/effects.sqlite");
/// ```
pub fn without_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return url.to_owned();
    };
    match rest[..at].split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***{}", &rest[at..]),
        None => url.to_owned(),
    }
}
