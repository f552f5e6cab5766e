//! Forms that compile: a value that is not a connection is never called one, and the
//! transaction reached by any binding the guard follows is the transaction.
#![allow(unused_variables, dead_code, unused_mut, clippy::all)]

use std::collections::HashMap;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use inbox_diesel::{NoConnection, idempotent};

diesel::table! {
    accounts (id) {
        id -> Integer,
        balance -> BigInt,
    }
}

pub struct Msg {
    pub id: u64,
    pub amounts: Vec<i64>,
    pub headers: HashMap<String, String>,
    pub raw: String,
}

static CONFIG: OnceLock<String> = OnceLock::new();
static SEEN: AtomicU64 = AtomicU64::new(0);

fn add(conn: &mut SqliteConnection, amount: i64) -> QueryResult<usize> {
    diesel::update(accounts::table.find(1))
        .set(accounts::balance.eq(accounts::balance + amount))
        .execute(conn)
}

fn takes_amount(amount: &i64) -> i64 {
    *amount
}

fn takes_header(value: Option<&String>) -> usize {
    value.map_or(0, String::len)
}

fn takes_config(value: Option<&String>) -> bool {
    value.is_some()
}

/// A step of the application's own with an `execute` that is not diesel's.
pub struct Step;

impl Step {
    pub fn execute(&self, log: &mut Vec<String>) {
        log.push("step".into());
    }
}

/// A cache with a `load` that is not diesel's.
pub struct Cache;

impl Cache {
    pub fn load(&self, source: &mut Vec<u8>) -> usize {
        source.len()
    }
}

/// A client whose type name ends in `Connection` and is not a database.
pub struct RedisConnection;

impl RedisConnection {
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        Ok(())
    }
}

/// A channel that is "established", and is not a database.
pub struct Channel;

impl Channel {
    pub fn establish(addr: &str) -> Result<Channel, String> {
        Ok(Channel)
    }

    pub fn publish(&mut self, body: &[u8]) -> Result<(), String> {
        Ok(())
    }
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

impl From<String> for AppError {
    fn from(_: String) -> Self {
        AppError
    }
}

#[idempotent(consumer = "not-connections", key = msg.id)]
pub fn not_connections(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<i64> {
    // One-argument `.get()`s that are not pool checkouts.
    let first = takes_amount(msg.amounts.get(0).unwrap());
    let header = takes_header(msg.headers.get("k"));
    let configured = takes_config(CONFIG.get());
    // `execute` and `load` that are not diesel's.
    let mut log = Vec::new();
    Step.execute(&mut log);
    let mut source = vec![1_u8];
    let loaded = Cache.load(&mut source);
    // An atomic's `load`, arguments inferred from the call.
    SEEN.load(Ordering::Relaxed);
    let parsed = takes_amount(&msg.raw.parse().unwrap_or_default());
    add(conn, first.into())?;
    add(conn, Default::default())?;
    Ok(first + header as i64)
}

#[idempotent(consumer = "aliases", key = msg.id)]
pub fn aliases(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    // A typed alias of the transaction.
    let c: &mut SqliteConnection = &mut *conn;
    add(c, 1)?;
    // The transaction in an `Option`, taken apart by `if let`.
    let maybe = Some(&mut *conn);
    if let Some(c) = maybe {
        add(c, 1)?;
    }
    // Destructured from a tuple, matched, reborrowed through `DerefMut`.
    let (c, n) = (&mut *conn, 2);
    add(c, n)?;
    match &mut *conn {
        c => add(c, 3)?,
    };
    // Shadowing the connection with itself.
    let conn = &mut *conn;
    add(conn, 6)?;
    Ok(())
}

#[idempotent(consumer = "nested", key = msg.id)]
pub fn nested_transactions(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    conn.transaction(|outer| {
        outer.transaction(|inner| add(inner, 1))?;
        outer.batch_execute("UPDATE accounts SET balance = balance")
    })?;
    conn.immediate_transaction(|c| add(c, 1))?;
    conn.exclusive_transaction(|c| c.batch_execute("SELECT 1"))?;
    Connection::transaction(conn, |c| add(c, 2))?;
    Ok(())
}

#[idempotent(consumer = "macros", key = msg.id)]
pub fn macros(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let written = dbg!(add(conn, 1))?;
    assert_eq!(written, 1, "{}", msg.raw);
    let all = vec![msg.id, 2];
    let note = format!("{} {:?}", msg.raw, all);
    println!("{note} {}", msg.amounts.len());
    assert!(matches!(msg.amounts.first(), Some(_)));
    Ok(())
}

#[idempotent(consumer = "local-macros", key = msg.id)]
pub fn local_macros(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    macro_rules! credit {
        ($c:expr, $n:expr) => {
            add($c, $n)
        };
    }
    credit!(conn, 1)?;
    credit!(&mut *conn, msg.amounts.len() as i64)?;
    macro_rules! on_the_handler {
        ($n:expr) => {{
            let written = add(conn, $n)?;
            written + 1
        }};
    }
    let written = on_the_handler!(2);
    macro_rules! each {
        ($($n:expr),*) => {
            $( add(conn, $n)?; )*
        };
    }
    each!(1, 2);
    Ok(())
}

#[idempotent(consumer = "loops", key = msg.id)]
pub fn loops_and_closures(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    for amount in &msg.amounts {
        add(conn, *amount)?;
    }
    let mut remaining = msg.amounts.clone();
    while let Some(amount) = remaining.pop() {
        add(conn, amount)?;
    }
    let apply = |c: &mut SqliteConnection, amount: i64| add(c, amount);
    apply(conn, 1)?;
    let total: i64 = msg.amounts.iter().map(|a| a * 2).sum();
    let by_key: HashMap<u64, i64> = msg.amounts.iter().map(|a| (msg.id, *a)).collect();
    add(conn, total)?;
    Ok(())
}

#[idempotent(consumer = "redis", key = msg.id, mode = "claim")]
pub fn claim_with_a_redis_client(
    conn: &mut SqliteConnection,
    redis: &mut RedisConnection,
    msg: &Msg,
) -> Result<(), AppError> {
    redis.set(&msg.id.to_string(), "sent")?;
    let mut channel = Channel::establish("amqp://localhost")?;
    channel.publish(msg.raw.as_bytes())?;
    Ok(())
}

/// A claim-mode body may name what it is given.
#[idempotent(consumer = "unused", key = msg.id, mode = "claim")]
pub fn claim_names_its_stand_in(conn: &mut SqliteConnection, msg: &Msg) -> Result<(), AppError> {
    fn check(_: &mut NoConnection) {}
    Ok(())
}

fn main() {}
