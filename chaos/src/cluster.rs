//! What a Galera cluster changes for the purge and the outbox relay, shown on the run's own
//! cluster once its deliveries are settled. Both rely on locks that are a node's own: the
//! purge's one-runner rule on `GET_LOCK`, the relay's claims on `FOR UPDATE SKIP LOCKED`.
//! Across nodes neither lock is seen, and what keeps the rows right is certification: two
//! nodes' transactions that write the same row do not both commit.
//!
//! - **purge:** three purges, one per node, started together on aged, fresh and open rows:
//!   every aged stamped row goes, no fresh row and no open claim does, whatever the purges
//!   answer (each is run again on its node until it returns `Ok`, as a schedule would);
//! - **relay:** three relays, one per node, drain an outbox of keyed messages: every message
//!   sent at least once and marked sent, and no key's messages sent out of order.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::sql_types::BigInt;
use diesel_async::AsyncConnection;
use inbox_diesel::outbox::relay::{Outgoing, Relay, Sink, SinkError};
use inbox_diesel::outbox::{Message, Outbox};
use inbox_diesel::purge::{Purge, purge};
use inbox_diesel::{InboxSchema, idempotent};

use crate::galera::Galera;

static OUTBOX: Outbox = Outbox::new("outbox");

/// Aged stamped rows, fresh stamped rows, and aged open claims the purge must leave.
const AGED: u32 = 3_000;
const FRESH: u32 = 300;
const OPEN: u32 = 100;
/// Outbox messages, and the ordering keys they are spread over.
const MESSAGES: u64 = 600;
const KEYS: u64 = 20;
/// How often a node's purge or relay round is tried again after an error.
const TRIES: usize = 20;

/// What the cluster checks found: lines to print, and violations.
#[derive(Debug, Default)]
pub struct Findings {
    pub lines: Vec<String>,
    pub violations: Vec<String>,
}

/// Runs both checks on `galera`'s database `db`.
pub fn check(galera: &Galera, db: &str) -> Findings {
    let mut findings = Findings::default();
    if let Err(e) = purge_from_every_node(galera, db, &mut findings) {
        findings
            .violations
            .push(format!("purge on every node: {e}"));
    }
    if let Err(e) = relay_from_every_node(galera, db, &mut findings) {
        findings
            .violations
            .push(format!("relay on every node: {e}"));
    }
    findings
}

#[derive(QueryableByName)]
struct N {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

fn count(conn: &mut MysqlConnection, sql: &str) -> Result<i64, String> {
    diesel::sql_query(sql)
        .get_result::<N>(conn)
        .map(|row| row.n)
        .map_err(|e| e.to_string())
}

fn connect(galera: &Galera, n: usize, db: &str) -> Result<MysqlConnection, String> {
    MysqlConnection::establish(&galera.url(n, db)).map_err(|e| format!("node {}: {e}", n + 1))
}

fn purge_from_every_node(galera: &Galera, db: &str, found: &mut Findings) -> Result<(), String> {
    let mut admin = connect(galera, 0, db)?;
    let rows = |prefix: &str, n: u32, age: &str, processed: &str| {
        format!(
            "INSERT INTO inbox (message_id, consumer, received_at, processed_at) \
             SELECT UNHEX(MD5(CONCAT('{prefix}', seq))), 'cluster-purge', \
             UTC_TIMESTAMP(6) - INTERVAL {age}, {processed} FROM seq_1_to_{n};"
        )
    };
    admin
        .batch_execute(
            &[
                rows("aged-", AGED, "2 DAY", "UTC_TIMESTAMP(6) - INTERVAL 2 DAY"),
                rows("fresh-", FRESH, "1 SECOND", "UTC_TIMESTAMP(6)"),
                rows("open-", OPEN, "2 DAY", "NULL"),
            ]
            .concat(),
        )
        .map_err(|e| e.to_string())?;
    let nodes = galera.len();
    let start = Barrier::new(nodes);
    let policy = Purge::older_than(Duration::from_secs(86_400)).batch_size(100);
    let answers: Vec<Result<(usize, usize), String>> = std::thread::scope(|scope| {
        let runs: Vec<_> = (0..nodes)
            .map(|n| {
                let (start, policy) = (&start, &policy);
                scope.spawn(move || {
                    let mut conn = connect(galera, n, db)?;
                    start.wait();
                    // (errors, rounds that ran). What was removed is counted from the rows
                    // left: a purge that fails after some batches does not report theirs.
                    let (mut errors, mut ran) = (0, 0);
                    for _ in 0..TRIES {
                        match purge(&mut conn, &InboxSchema::DEFAULT, policy) {
                            Ok(report) => {
                                ran += usize::from(report.ran);
                                return Ok((errors, ran));
                            }
                            Err(e) => {
                                errors += 1;
                                if errors == 1 {
                                    eprintln!("  purge on node {}: {e}", n + 1);
                                }
                                conn = connect(galera, n, db)?;
                            }
                        }
                    }
                    Err(format!(
                        "node {}: no purge returned Ok in {TRIES} tries",
                        n + 1
                    ))
                })
            })
            .collect();
        runs.into_iter()
            .map(|run| run.join().expect("a purge thread panicked"))
            .collect()
    });
    let answers: Vec<(usize, usize)> = answers.into_iter().collect::<Result<_, _>>()?;
    let mut left = |sql: &str| count(&mut admin, sql);
    let aged = left(
        "SELECT COUNT(*) AS n FROM inbox WHERE consumer = 'cluster-purge' \
         AND processed_at < UTC_TIMESTAMP(6) - INTERVAL 1 DAY",
    )?;
    let fresh = left(
        "SELECT COUNT(*) AS n FROM inbox WHERE consumer = 'cluster-purge' \
         AND processed_at > UTC_TIMESTAMP(6) - INTERVAL 1 DAY",
    )?;
    let open = left(
        "SELECT COUNT(*) AS n FROM inbox WHERE consumer = 'cluster-purge' \
         AND processed_at IS NULL",
    )?;
    found.lines.push(format!(
        "purge started on {nodes} nodes at once: {} of them ran (GET_LOCK is a node's own), \
         {} errors retried; left: {aged} of {AGED} aged, {fresh} of {FRESH} fresh, {open} of \
         {OPEN} open claims",
        answers.iter().filter(|a| a.1 > 0).count(),
        answers.iter().map(|a| a.0).sum::<usize>(),
    ));
    if aged != 0 || fresh != i64::from(FRESH) || open != i64::from(OPEN) {
        found.violations.push(format!(
            "purge on every node left {aged} aged rows (want 0), {fresh} fresh (want {FRESH}), \
             {open} open claims (want {OPEN})"
        ));
    }
    Ok(())
}

/// Publishes message `n` of the outbox check, under key `n % KEYS`.
#[idempotent(consumer = "cluster-relay", key = *n)]
fn enqueue(conn: &mut MysqlConnection, n: &u64) -> Result<(), inbox_diesel::Error> {
    OUTBOX.publish(
        conn,
        Message::new("cluster", n.to_string()).key(format!("k{}", n % KEYS)),
    )?;
    Ok(())
}

/// What the relays handed downstream: (node, message), in the order it arrived.
#[derive(Clone, Default)]
struct Downstream(Arc<Mutex<Vec<(usize, Outgoing)>>>, usize);

impl Sink for Downstream {
    fn send(&mut self, message: &Outgoing) -> impl Future<Output = Result<(), SinkError>> + Send {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((self.1, message.clone()));
        async { Ok(()) }
    }
}

fn relay_from_every_node(galera: &Galera, db: &str, found: &mut Findings) -> Result<(), String> {
    let mut admin = connect(galera, 0, db)?;
    admin
        .batch_execute(&OUTBOX.create_table_sql(inbox_diesel::schema::Backend::Mysql))
        .map_err(|e| e.to_string())?;
    for n in 0..MESSAGES {
        let _: inbox_diesel::Outcome<()> =
            enqueue(&mut admin, &n).map_err(|e| format!("publish {n}: {e}"))?;
    }
    let nodes = galera.len();
    let received = Arc::new(Mutex::new(Vec::new()));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(nodes)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let errors: Vec<Result<usize, String>> = runtime.block_on(async {
        let start = Arc::new(tokio::sync::Barrier::new(nodes));
        let relays: Vec<_> = (0..nodes)
            .map(|n| {
                let (start, url) = (start.clone(), galera.url(n, db));
                let mut sink = Downstream(received.clone(), n);
                tokio::spawn(async move {
                    let connect = || diesel_async::AsyncMysqlConnection::establish(&url);
                    let mut conn = connect().await.map_err(|e| e.to_string())?;
                    let relay = Relay::new(OUTBOX).batch(10).lease(Duration::from_secs(30));
                    start.wait().await;
                    let (mut errors, mut idle) = (0, 0);
                    while idle < 5 {
                        match relay.run_once(&mut conn, &mut sink).await {
                            Ok(round) if round.claimed == 0 => {
                                idle += 1;
                                tokio::time::sleep(Duration::from_millis(50)).await;
                            }
                            Ok(_) => idle = 0,
                            Err(e) => {
                                errors += 1;
                                if errors == 1 {
                                    eprintln!("  relay on node {}: {e}", n + 1);
                                }
                                if errors > TRIES * 10 {
                                    return Err(format!("node {}: {e}", n + 1));
                                }
                                conn = connect().await.map_err(|e| e.to_string())?;
                            }
                        }
                    }
                    Ok(errors)
                })
            })
            .collect();
        let mut out = Vec::new();
        for relay in relays {
            out.push(relay.await.map_err(|e| e.to_string()).and_then(|r| r));
        }
        out
    });
    let errors: usize = errors
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?
        .iter()
        .sum();
    let received = received.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let unsent = count(
        &mut admin,
        "SELECT COUNT(*) AS n FROM outbox WHERE sent_at IS NULL",
    )?;
    let ids: HashSet<_> = received.iter().map(|(_, m)| m.id).collect();
    let by_node = (0..nodes)
        .map(|n| {
            received
                .iter()
                .filter(|(at, _)| *at == n)
                .count()
                .to_string()
        })
        .collect::<Vec<_>>()
        .join(" / ");
    // Per key, in arrival order: a message sent after a later one of its key, other than a
    // second send of one already out, is out of order.
    let mut highest: HashMap<&str, i64> = HashMap::new();
    let mut out_of_order = 0;
    let mut seen = HashSet::new();
    for (_, m) in &received {
        let again = !seen.insert(m.id);
        let top = highest.entry(m.key.as_str()).or_insert(i64::MIN);
        if m.seq < *top && !again {
            out_of_order += 1;
        }
        *top = (*top).max(m.seq);
    }
    found.lines.push(format!(
        "relays on {nodes} nodes at once: {MESSAGES} messages, {} sends ({by_node} by node), \
         {} sent twice, {errors} rounds failed and retried, {unsent} left unsent, \
         {out_of_order} out of their key's order",
        received.len(),
        received.len() - ids.len(),
    ));
    if ids.len() as u64 != MESSAGES || unsent != 0 || out_of_order != 0 {
        found.violations.push(format!(
            "relays on every node: {} of {MESSAGES} messages sent, {unsent} unsent, \
             {out_of_order} out of order",
            ids.len()
        ));
    }
    Ok(())
}
