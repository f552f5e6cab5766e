//! The orchestrator: the simulated broker, the consumer processes, the faults, the check.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::protocol::{Answer, Backend, Delivery, Fault, Mode};
use crate::server::Database;

pub const USAGE: &str =
    "inbox-chaos [--backends sqlite,postgres,mysql] [--deliveries N] [--seed N] [--timeout SECONDS]

  --backends    the backends to run, one after the other (default: each this build has)
  --deliveries  deliveries per backend, at least (default: 20000: the short run)
  --seed        the seed of every random choice (default: from the clock; printed)
  --timeout     the time one backend's run may take (default: 240)
  --copies      copies published per message: N, or LOW-HIGH drawn per message (default: 2-4);
                1 is what a broker delivers when nothing goes wrong
  --hot         every transaction-mode body also updates one of three rows that all bodies
                update, then pauses 0-3 ms: on a Galera cluster, commits on other nodes then
                abort transactions on this one
  --handler     idempotent (default), or naive: a check-then-insert handler, which the check
                must catch (its negative control)";

/// Consumer processes per backend, and their modes.
const CONSUMERS: [Mode; 4] = [Mode::Sync, Mode::Async, Mode::Sync, Mode::Async];
/// Connections (workers) per consumer process.
const WORKERS: usize = 4;
/// Deliveries a consumer holds at once, as a broker's prefetch.
const PREFETCH: usize = 8;
/// Copies published but not yet handed out: small, so that copies of one message are handed
/// out close together, to different consumers, and run at once.
const WINDOW: usize = 24;

pub struct Config {
    backends: Vec<Backend>,
    deliveries: u64,
    seed: u64,
    timeout: Duration,
    naive: bool,
    /// Copies per message, drawn from this range.
    copies: (u64, u64),
    hot: bool,
}

impl Config {
    pub fn parse(args: &[String]) -> Result<Self, String> {
        let mut config = Config {
            backends: default_backends(),
            deliveries: 20_000,
            seed: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64 % 1_000_000),
            timeout: Duration::from_secs(240),
            naive: false,
            copies: (2, 4),
            hot: false,
        };
        let mut args = args.iter();
        while let Some(flag) = args.next() {
            let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
            match flag.as_str() {
                "--backends" => {
                    config.backends = value()?
                        .split(',')
                        .map(str::parse)
                        .collect::<Result<_, _>>()?
                }
                "--deliveries" => {
                    config.deliveries =
                        value()?.parse().map_err(|e| format!("--deliveries: {e}"))?
                }
                "--seed" => config.seed = value()?.parse().map_err(|e| format!("--seed: {e}"))?,
                "--timeout" => {
                    config.timeout = Duration::from_secs(
                        value()?.parse().map_err(|e| format!("--timeout: {e}"))?,
                    )
                }
                "--copies" => {
                    let text = value()?;
                    let number = |n: &str| {
                        n.parse::<u64>()
                            .ok()
                            .filter(|n| *n > 0)
                            .ok_or_else(|| format!("--copies: {text:?} (N or LOW-HIGH, from 1)"))
                    };
                    config.copies = match text.split_once('-') {
                        Some((low, high)) => (number(low)?, number(high)?),
                        None => (number(text)?, number(text)?),
                    };
                    if config.copies.0 > config.copies.1 {
                        return Err(format!("--copies: {text:?} (LOW-HIGH, LOW at most HIGH)"));
                    }
                }
                "--hot" => config.hot = true,
                "--handler" => {
                    config.naive = match value()?.as_str() {
                        "idempotent" => false,
                        "naive" => true,
                        other => return Err(format!("--handler: {other:?} (idempotent, naive)")),
                    }
                }
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        Ok(config)
    }
}

fn default_backends() -> Vec<Backend> {
    let mut backends = vec![Backend::Sqlite];
    if cfg!(feature = "postgres") {
        backends.push(Backend::Postgres);
    }
    if cfg!(feature = "mysql") {
        backends.push(Backend::Mysql);
    }
    backends
}

pub fn run(config: Config) -> ExitCode {
    println!(
        "inbox-chaos: seed {}, {} deliveries at least per backend, {} consumer processes \
         ({} connections each, prefetch {PREFETCH}) per backend, {}–{} copies per message{}, {} \
         handlers",
        config.seed,
        config.deliveries,
        CONSUMERS.len(),
        WORKERS,
        config.copies.0,
        config.copies.1,
        match config.hot {
            true => ", hot rows",
            false => "",
        },
        match config.naive {
            true => "naive check-then-insert",
            false => "#[idempotent]",
        }
    );
    let mut reports = Vec::new();
    for (at, backend) in config.backends.iter().enumerate() {
        let seed = config.seed.wrapping_add(at as u64);
        println!("\n== {}", backend.name());
        let report = match Run::new(*backend, seed, &config) {
            Ok(mut run) => run.drive(),
            Err(e) => Report::failed(*backend, format!("could not start: {e}")),
        };
        reports.push(report);
    }
    print_table(&reports);
    let violations: Vec<String> = reports.iter().flat_map(Report::violations).collect();
    match violations.is_empty() {
        true => {
            println!(
                "\nOK: no invariant violated on any backend ({} deliveries)",
                reports.iter().map(|r| r.deliveries).sum::<u64>()
            );
            ExitCode::SUCCESS
        }
        false => {
            println!("\nFAILED:");
            for v in &violations {
                println!("  {v}");
            }
            ExitCode::FAILURE
        }
    }
}

/// One copy of a message, published once, settled by one acknowledgement.
#[derive(Debug, Clone, Copy)]
struct Copy {
    message: u64,
}

/// A consumer process's slot: started again under the same name after a kill.
struct Slot {
    name: String,
    mode: Mode,
    child: Option<Child>,
    stdin: Option<ChildStdin>,
    generation: u64,
    ready: bool,
    held: HashSet<u64>,
}

enum Heard {
    Line(String),
    Closed,
}

/// What a consumer slot's reader heard, and from which start of the slot's process.
type Event = (usize, u64, Heard);

struct Run<'c> {
    backend: Backend,
    config: &'c Config,
    db: Database,
    rng: fastrand::Rng,
    slots: Vec<Slot>,
    events: (mpsc::Sender<Event>, mpsc::Receiver<Event>),
    // The broker.
    messages: u64,
    published: u64,
    copies: u64,
    settled: u64,
    pending: Vec<Copy>,
    in_flight: HashMap<u64, (usize, Copy, Instant, Fault)>,
    next_delivery: u64,
    report: Report,
    latencies: Vec<Duration>,
}

impl<'c> Run<'c> {
    fn new(backend: Backend, seed: u64, config: &'c Config) -> Result<Self, String> {
        let db = Database::create(backend, seed)?;
        // Enough messages for the deliveries asked for at the average number of copies, with
        // redeliveries on top.
        let average = (config.copies.0 + config.copies.1).div_ceil(2);
        let messages = config.deliveries.div_ceil(average);
        let slots = CONSUMERS
            .iter()
            .enumerate()
            .map(|(at, mode)| Slot {
                name: format!("c{at}-{}", mode.name()),
                mode: *mode,
                child: None,
                stdin: None,
                generation: 0,
                ready: false,
                held: HashSet::new(),
            })
            .collect();
        Ok(Run {
            backend,
            config,
            db,
            rng: fastrand::Rng::with_seed(seed),
            slots,
            events: mpsc::channel(),
            messages,
            published: 0,
            copies: 0,
            settled: 0,
            pending: Vec::new(),
            in_flight: HashMap::new(),
            next_delivery: 1,
            report: Report::new(backend),
            latencies: Vec::new(),
        })
    }

    fn start(&mut self, at: usize) -> Result<(), String> {
        let program = std::env::current_exe().map_err(|e| format!("this program: {e}"))?;
        let slot = &mut self.slots[at];
        slot.generation += 1;
        let mut command = Command::new(program);
        if self.config.hot {
            command.env(crate::consumer::HOT_ENV, "1");
        }
        let mut child = command
            .args([
                "consume",
                self.backend.name(),
                slot.mode.name(),
                &self.db.url_for(at),
                &slot.name,
                &self.db.dir().display().to_string(),
                &WORKERS.to_string(),
                match self.config.naive {
                    true => "naive",
                    false => "idempotent",
                },
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("start {}: {e}", slot.name))?;
        let stdout = child.stdout.take().expect("piped");
        slot.stdin = child.stdin.take();
        slot.child = Some(child);
        slot.ready = false;
        let (send, generation) = (self.events.0.clone(), slot.generation);
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if send.send((at, generation, Heard::Line(line))).is_err() {
                    return;
                }
            }
            let _ = send.send((at, generation, Heard::Closed));
        });
        Ok(())
    }

    /// SIGKILL, then what it held is handed out again, then the consumer is started again.
    fn kill(&mut self, at: usize) -> Result<(), String> {
        let slot = &mut self.slots[at];
        if let Some(mut child) = slot.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        slot.stdin = None;
        self.report.kills += 1;
        self.take_back(at);
        self.start(at)
    }

    /// The deliveries a consumer held go back to the queue, as the broker does when the
    /// consumer's channel closes.
    fn take_back(&mut self, at: usize) {
        for delivery in std::mem::take(&mut self.slots[at].held) {
            if let Some((_, copy, _, _)) = self.in_flight.remove(&delivery) {
                self.report.redelivered_after_kill += 1;
                self.pending.push(copy);
            }
        }
    }

    fn fault(&mut self, mode: Mode) -> Fault {
        let roll = self.rng.u32(0..100);
        match roll {
            0..3 => Fault::Panic,
            3..6 => Fault::Error,
            6..14 => Fault::Slow,
            14..17 if self.backend == Backend::Postgres => Fault::Timeout,
            17..20 if mode == Mode::Async => Fault::Cancel,
            _ => Fault::None,
        }
    }

    /// Publishes while the window has room, then hands out copies at random to consumers
    /// with room.
    fn dispatch(&mut self) {
        while self.pending.len() < WINDOW && self.published < self.messages {
            self.published += 1;
            let copies = self.rng.u64(self.config.copies.0..=self.config.copies.1);
            self.copies += copies;
            for _ in 0..copies {
                self.pending.push(Copy {
                    message: self.published,
                });
            }
        }
        let mut order: Vec<usize> = (0..self.slots.len()).collect();
        self.rng.shuffle(&mut order);
        for at in order {
            while self.slots[at].ready
                && self.slots[at].held.len() < PREFETCH
                && !self.pending.is_empty()
            {
                let pick = self.rng.usize(0..self.pending.len());
                let copy = self.pending.swap_remove(pick);
                let fault = self.fault(self.slots[at].mode);
                let delivery = Delivery {
                    id: self.next_delivery,
                    message: copy.message,
                    fault,
                };
                self.next_delivery += 1;
                let sent = self.slots[at].stdin.as_mut().is_some_and(|stdin| {
                    writeln!(stdin, "{delivery}")
                        .and_then(|()| stdin.flush())
                        .is_ok()
                });
                if !sent {
                    self.pending.push(copy);
                    break;
                }
                self.report.deliveries += 1;
                if fault != Fault::None {
                    *self.report.faults.entry(fault.name()).or_default() += 1;
                }
                self.slots[at].held.insert(delivery.id);
                self.in_flight
                    .insert(delivery.id, (at, copy, Instant::now(), fault));
            }
        }
    }

    fn heard(&mut self, at: usize, generation: u64, heard: Heard) -> Result<(), String> {
        if self.slots[at].generation != generation {
            // A line of a process killed since: what it held is handed out again already.
            return Ok(());
        }
        match heard {
            Heard::Closed => {
                self.report.problems.push(format!(
                    "consumer {} exited on its own (its error is above)",
                    self.slots[at].name
                ));
                self.slots[at].child.take().map(|mut c| c.wait());
                self.take_back(at);
                self.start(at)?;
            }
            Heard::Line(line) => match line.parse::<Answer>()? {
                Answer::Ready => self.slots[at].ready = true,
                Answer::Ack { delivery, outcome } => {
                    self.slots[at].held.remove(&delivery);
                    if let Some((_, _, sent, _)) = self.in_flight.remove(&delivery) {
                        self.latencies.push(sent.elapsed());
                        self.settled += 1;
                        *self.report.acks.entry(outcome).or_default() += 1;
                    }
                }
                Answer::Nack { delivery, class } => {
                    self.slots[at].held.remove(&delivery);
                    if let Some((_, copy, _, _)) = self.in_flight.remove(&delivery) {
                        self.pending.push(copy);
                        *self.report.nacks.entry(class).or_default() += 1;
                    }
                }
            },
        }
        Ok(())
    }

    fn inject(&mut self) -> Result<(), String> {
        let mut kinds = vec!["kill", "kill"];
        if self.db.can_cut() {
            kinds.push("cut");
        }
        if self.db.can_crash()
            && self
                .report
                .last_crash
                .is_none_or(|t| t.elapsed() > Duration::from_secs(5))
        {
            kinds.push("crash");
        }
        match kinds[self.rng.usize(0..kinds.len())] {
            "kill" => {
                let at = self.rng.usize(0..self.slots.len());
                self.kill(at)?;
            }
            "cut" => self.report.cuts += self.db.cut()? as u64,
            _ => {
                self.db.crash()?;
                self.report.crashes += 1;
                self.report.last_crash = Some(Instant::now());
            }
        }
        Ok(())
    }

    fn drive(&mut self) -> Report {
        let started = Instant::now();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writers: Vec<_> = match self.config.hot {
            true => self.db.other_writers(),
            false => Vec::new(),
        }
        .into_iter()
        .map(|url| {
            let stop = stop.clone();
            std::thread::spawn(move || other_writer(&url, &stop))
        })
        .collect();
        if let Err(e) = self.drive_until_settled(started) {
            self.report.problems.push(e);
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let written: u64 = writers.into_iter().map(|w| w.join().unwrap_or(0)).sum();
        self.report.other_writes = self.config.hot.then_some(written);
        if let Err(e) = self.db.recover() {
            self.report.problems.push(e);
        }
        self.stop();
        self.report.elapsed = started.elapsed();
        self.latencies.sort();
        let at = |q: f64| {
            self.latencies
                .get(
                    ((self.latencies.len() as f64 * q) as usize)
                        .min(self.latencies.len().saturating_sub(1)),
                )
                .copied()
                .unwrap_or_default()
        };
        self.report.p50 = at(0.5);
        self.report.p99 = at(0.99);
        self.report.messages = self.messages;
        self.report.copies = self.copies;
        self.check();
        if let Some((lines, violations)) = self.db.cluster_checks() {
            for line in lines {
                println!("  {line}");
            }
            self.report.problems.extend(violations);
        }
        std::mem::replace(&mut self.report, Report::new(self.backend))
    }

    fn drive_until_settled(&mut self, started: Instant) -> Result<(), String> {
        for at in 0..self.slots.len() {
            self.start(at)?;
        }
        let mut next_fault = Instant::now() + Duration::from_millis(self.rng.u64(200..800));
        let mut progress = Instant::now();
        while !(self.published == self.messages && self.settled == self.copies) {
            if started.elapsed() > self.config.timeout {
                return Err(format!(
                    "not settled after {:?}: {} of {} copies acknowledged",
                    self.config.timeout, self.settled, self.copies
                ));
            }
            self.dispatch();
            match self.events.1.recv_timeout(Duration::from_millis(20)) {
                Ok((at, generation, heard)) => {
                    self.heard(at, generation, heard)?;
                    while let Ok((at, generation, heard)) = self.events.1.try_recv() {
                        self.heard(at, generation, heard)?;
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    unreachable!("this run holds a sender")
                }
            }
            if Instant::now() >= next_fault {
                self.inject()?;
                next_fault = Instant::now() + Duration::from_millis(self.rng.u64(200..800));
            }
            if progress.elapsed() > Duration::from_secs(5) {
                progress = Instant::now();
                println!(
                    "  {:>5.1} s  {} of {} messages published, {} of {} copies acknowledged",
                    started.elapsed().as_secs_f64(),
                    self.published,
                    self.messages,
                    self.settled,
                    self.copies
                );
            }
        }
        Ok(())
    }

    /// Closes the consumers' input: each answers what it holds and exits.
    fn stop(&mut self) {
        for slot in &mut self.slots {
            slot.stdin = None;
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        for slot in &mut self.slots {
            if let Some(mut child) = slot.child.take() {
                loop {
                    match child.try_wait() {
                        Ok(Some(_)) => break,
                        _ if Instant::now() > deadline => {
                            let _ = child.kill();
                            let _ = child.wait();
                            break;
                        }
                        _ => std::thread::sleep(Duration::from_millis(20)),
                    }
                }
            }
        }
    }

    /// The database and the ack logs against the invariants.
    fn check(&mut self) {
        let contents = match self.db.contents() {
            Ok(contents) => contents,
            Err(e) => {
                self.report.problems.push(format!("read the database: {e}"));
                return;
            }
        };
        // Odd messages go to the claim-mode handler, even ones to the transaction's (the
        // naive handler takes them all).
        let (transactional, claimed) = match self.config.naive {
            true => (self.messages, 0),
            false => (self.messages / 2, self.messages.div_ceil(2)),
        };
        self.report.transactional = transactional;
        self.report.claimed = claimed;
        self.report.doubled = contents.doubled as u64;
        self.report.lost = transactional.saturating_sub(contents.messages as u64);
        self.report.effects = contents.effects as u64;
        self.report.markers = contents.markers as u64;
        self.report.claims_completed = contents.claims_completed as u64;
        self.report.torn = contents.torn;
        // The naive handler touches no hot row.
        self.report.hot = (self.config.hot && !self.config.naive).then_some(contents.hot);
        self.report.may_lose_commits = self.db.may_lose_commits();
        self.check_side_effects();
        let mut processed: HashMap<u64, u64> = HashMap::new();
        let mut logged = 0;
        for (_, text) in logs(self.db.dir(), "acks") {
            for line in text.lines() {
                let fields: Vec<&str> = line.split_whitespace().collect();
                let [delivery, message, outcome] = fields.as_slice() else {
                    self.report
                        .problems
                        .push(format!("a torn ack log line: {line:?}"));
                    continue;
                };
                let Ok(message) = message.parse::<u64>() else {
                    continue;
                };
                logged += 1;
                if *outcome == "processed" {
                    *processed.entry(message).or_default() += 1;
                }
                let transactional = self.config.naive || message % 2 == 0;
                if transactional && !contents.applied.contains(&message) {
                    self.report.ack_without_effect += 1;
                }
                // This delivery's own body committed: its effect row names it. (A duplicate's
                // effect is another delivery's.)
                if transactional
                    && *outcome == "processed"
                    && !delivery
                        .parse::<u64>()
                        .is_ok_and(|d| contents.deliveries.contains(&d))
                {
                    self.report.processed_without_effect += 1;
                }
            }
        }
        self.report.logged_acks = logged;
        self.report.processed_twice = processed.values().filter(|n| **n > 1).count() as u64;
    }
}

/// One of the application's other writers ([`Database::other_writers`]): updates a hot row
/// in a transaction of its own, again and again until `stop`, connecting again after a
/// node's crash. Returns how many it committed.
#[cfg(feature = "mysql")]
fn other_writer(url: &str, stop: &std::sync::atomic::AtomicBool) -> u64 {
    use diesel::Connection as _;
    use diesel::connection::SimpleConnection as _;
    let mut written = 0;
    let mut conn: Option<diesel::MysqlConnection> = None;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let Some(c) = conn.as_mut() else {
            conn = diesel::MysqlConnection::establish(url).ok();
            if conn.is_none() {
                std::thread::sleep(Duration::from_millis(200));
            }
            continue;
        };
        let row = fastrand::u8(0..crate::consumer::HOT_ROWS as u8);
        match c.batch_execute(&format!("UPDATE hot SET w = w + 1 WHERE id = {row}")) {
            Ok(()) => written += 1,
            Err(diesel::result::Error::DatabaseError(..)) => {}
            Err(_) => conn = None,
        }
        std::thread::sleep(Duration::from_micros(fastrand::u64(0..2000)));
    }
    written
}

/// Without MySQL there is no Galera run, and no other writer.
#[cfg(not(feature = "mysql"))]
fn other_writer(_: &str, _: &std::sync::atomic::AtomicBool) -> u64 {
    0
}

/// The consumers' logs of one kind (`acks`, `effects`) in `dir`: each file's name and its
/// complete lines.
fn logs(dir: &std::path::Path, extension: &str) -> Vec<(String, String)> {
    let entries = std::fs::read_dir(dir).map(|d| d.flatten().collect::<Vec<_>>());
    entries
        .unwrap_or_default()
        .into_iter()
        .filter(|entry| entry.path().extension().is_some_and(|e| e == extension))
        .map(|entry| {
            let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
            (
                entry.file_name().to_string_lossy().into_owned(),
                complete_lines(text),
            )
        })
        .collect()
}

/// A log without the line a SIGKILL cut short: that line's write never finished, so
/// neither did what it records (the acknowledgement was not sent; the body went no further).
fn complete_lines(mut text: String) -> String {
    match text.rfind('\n') {
        Some(end) => text.truncate(end + 1),
        None => text.clear(),
    }
    text
}

/// Claim mode's lease, as the handler declares it.
const LEASE: Duration = Duration::from_millis(1000);
/// Between a claim's statement and its side effect's log line: what a takeover may seem to
/// gain on the lease. The database starts the lease when it runs the claim, and the library
/// runs a body only when its claim came back within a quarter of the lease (250 ms); the
/// rest covers the step from the claim to the log line.
const SLACK: Duration = Duration::from_millis(300);

/// One run of a claim-mode body, from a side-effect log.
struct Attempt {
    /// The consumer process whose log has it.
    by: String,
    start: u128,
    /// The body's end, when it returned: `true` for `ok`, `false` for an error (which
    /// releases the claim).
    end: Option<(u128, bool)>,
}

impl Run<'_> {
    /// The side-effect logs against claim mode's promises: every claimed message's side
    /// effect ran; none ran while another attempt's lease was live (unless that one had
    /// released its claim), and none after the message's claim was stamped complete.
    fn check_side_effects(&mut self) {
        let mut attempts: HashMap<u64, Vec<Attempt>> = HashMap::new();
        let mut stamped: HashMap<u64, u128> = HashMap::new();
        for (by, text) in logs(self.db.dir(), "effects") {
            // Attempts of this process not yet ended, by message.
            let mut open: HashMap<u64, usize> = HashMap::new();
            for line in text.lines() {
                let fields: Vec<&str> = line.split_whitespace().collect();
                let parsed = |at: usize| fields.get(at).and_then(|f| f.parse::<u128>().ok());
                match fields.as_slice() {
                    ["S", message, _] => {
                        let (Ok(message), Some(t)) = (message.parse(), parsed(2)) else {
                            continue;
                        };
                        let list = attempts.entry(message).or_default();
                        list.push(Attempt {
                            by: by.clone(),
                            start: t,
                            end: None,
                        });
                        open.insert(message, list.len() - 1);
                    }
                    ["E", message, how, _] => {
                        let (Ok(message), Some(t)) = (message.parse(), parsed(3)) else {
                            continue;
                        };
                        if let Some(at) = open.remove(&message)
                            && let Some(attempt) =
                                attempts.get_mut(&message).and_then(|l| l.get_mut(at))
                        {
                            attempt.end = Some((t, *how == "ok"));
                        }
                    }
                    ["T", message, _] => {
                        let (Ok(message), Some(t)) = (message.parse(), parsed(2)) else {
                            continue;
                        };
                        let first = stamped.entry(message).or_insert(t);
                        *first = (*first).min(t);
                    }
                    _ => self
                        .report
                        .problems
                        .push(format!("a torn side-effect log line: {line:?}")),
                }
            }
        }
        let (lease, slack) = (LEASE.as_nanos(), SLACK.as_nanos());
        for (message, list) in &mut attempts {
            list.sort_by_key(|a| a.start);
            self.report.side_effects += list.len() as u64;
            for pair in list.windows(2) {
                let (a, b) = (&pair[0], &pair[1]);
                let released = matches!(a.end, Some((end, false)) if b.start >= end);
                if !released && b.start + slack < a.start + lease {
                    self.report.inside_live_lease += 1;
                    if self.report.inside_live_lease <= 5 && !self.db.may_lose_commits() {
                        let end = |x: &Attempt| match x.end {
                            Some((t, ok)) => format!(
                                "ended {} after {} ms",
                                if ok { "ok" } else { "in error" },
                                (t - x.start) / 1_000_000
                            ),
                            None => "never ended".to_owned(),
                        };
                        self.report.problems.push(format!(
                            "message {message}: a side effect by {} {} ms after one by {} ({}), \
                             inside its lease",
                            b.by,
                            (b.start - a.start) / 1_000_000,
                            a.by,
                            end(a)
                        ));
                    }
                }
            }
            if let Some(stamp) = stamped.get(message) {
                self.report.after_stamp += list.iter().filter(|a| a.start > *stamp).count() as u64;
            }
        }
        let claimed_messages = attempts.keys().filter(|m| *m % 2 == 1).count() as u64;
        self.report.claims_without_side_effect =
            self.report.claimed.saturating_sub(claimed_messages);
    }
}

impl Drop for Run<'_> {
    fn drop(&mut self) {
        for slot in &mut self.slots {
            if let Some(mut child) = slot.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// One backend's run.
pub struct Report {
    backend: Backend,
    messages: u64,
    copies: u64,
    deliveries: u64,
    acks: BTreeMap<String, u64>,
    nacks: BTreeMap<String, u64>,
    faults: BTreeMap<&'static str, u64>,
    kills: u64,
    cuts: u64,
    crashes: u64,
    last_crash: Option<Instant>,
    redelivered_after_kill: u64,
    effects: u64,
    markers: u64,
    transactional: u64,
    claimed: u64,
    claims_completed: u64,
    side_effects: u64,
    inside_live_lease: u64,
    after_stamp: u64,
    claims_without_side_effect: u64,
    torn: Option<u64>,
    /// An asynchronous replica was promoted: acknowledged commits may be gone, and with
    /// them what they recorded; marker and effect must still go together.
    may_lose_commits: bool,
    logged_acks: u64,
    doubled: u64,
    lost: u64,
    processed_twice: u64,
    ack_without_effect: u64,
    /// Deliveries answered `Processed` whose own effect is not in the database.
    processed_without_effect: u64,
    /// With `--hot`: the hot rows' sum, one per committed body.
    hot: Option<i64>,
    /// With `--hot` on Galera: the other writers' commits on the hot rows.
    other_writes: Option<u64>,
    p50: Duration,
    p99: Duration,
    elapsed: Duration,
    problems: Vec<String>,
}

impl Report {
    fn new(backend: Backend) -> Self {
        Report {
            backend,
            messages: 0,
            copies: 0,
            deliveries: 0,
            acks: BTreeMap::new(),
            nacks: BTreeMap::new(),
            faults: BTreeMap::new(),
            kills: 0,
            cuts: 0,
            crashes: 0,
            last_crash: None,
            redelivered_after_kill: 0,
            effects: 0,
            markers: 0,
            transactional: 0,
            claimed: 0,
            claims_completed: 0,
            side_effects: 0,
            inside_live_lease: 0,
            after_stamp: 0,
            claims_without_side_effect: 0,
            torn: None,
            may_lose_commits: false,
            logged_acks: 0,
            doubled: 0,
            lost: 0,
            processed_twice: 0,
            ack_without_effect: 0,
            processed_without_effect: 0,
            hot: None,
            other_writes: None,
            p50: Duration::ZERO,
            p99: Duration::ZERO,
            elapsed: Duration::ZERO,
            problems: Vec::new(),
        }
    }

    fn failed(backend: Backend, problem: String) -> Self {
        let mut report = Report::new(backend);
        report.problems.push(problem);
        report
    }

    fn violations(&self) -> Vec<String> {
        let name = self.backend.name();
        let mut out: Vec<String> = self
            .problems
            .iter()
            .map(|p| format!("{name}: {p}"))
            .collect();
        let mut check = |bad: bool, what: String| {
            if bad {
                out.push(format!("{name}: {what}"));
            }
        };
        check(
            self.doubled > 0,
            format!("{} messages doubled", self.doubled),
        );
        // An asynchronous replica promoted loses what it had not received: those checks give
        // way to one that the loss took marker and effect together.
        let lossy = self.may_lose_commits;
        check(
            !lossy && self.lost > 0,
            format!("{} messages lost", self.lost),
        );
        check(
            self.torn.is_some_and(|t| t > 0),
            format!(
                "{} messages with an effect and no marker, or a marker and no effect",
                self.torn.unwrap_or(0)
            ),
        );
        let unclassified = self.nacks.get("other").copied().unwrap_or(0);
        check(
            unclassified > 0,
            format!(
                "{unclassified} deliveries failed with an error of no class (a pump dead-letters \
                 those: the consumers printed them above)"
            ),
        );
        check(
            !lossy && self.effects != self.transactional,
            format!(
                "{} effects for {} messages",
                self.effects, self.transactional
            ),
        );
        check(
            !lossy && self.markers != self.transactional,
            format!(
                "{} inbox markers for {} messages",
                self.markers, self.transactional
            ),
        );
        check(
            !lossy && self.claims_completed != self.claimed,
            format!(
                "{} claims completed of {}",
                self.claims_completed, self.claimed
            ),
        );
        check(
            !lossy && self.claims_without_side_effect > 0,
            format!(
                "{} claimed messages without their side effect",
                self.claims_without_side_effect
            ),
        );
        check(
            !lossy && self.inside_live_lease > 0,
            format!(
                "{} side effects inside another attempt's live lease",
                self.inside_live_lease
            ),
        );
        check(
            !lossy && self.after_stamp > 0,
            format!(
                "{} side effects after their claim was stamped complete",
                self.after_stamp
            ),
        );
        check(
            !lossy && self.processed_twice > 0,
            format!(
                "{} messages processed twice in the ack logs",
                self.processed_twice
            ),
        );
        check(
            !lossy && self.ack_without_effect > 0,
            format!(
                "{} acknowledgements without their effect",
                self.ack_without_effect
            ),
        );
        check(
            !lossy && self.processed_without_effect > 0,
            format!(
                "{} deliveries answered processed whose own effect is not in the database",
                self.processed_without_effect
            ),
        );
        check(
            !lossy && self.hot.is_some_and(|hot| hot != self.effects as i64),
            format!(
                "the hot rows count {} committed bodies, the effects {}",
                self.hot.unwrap_or(0),
                self.effects
            ),
        );
        out
    }
}

fn print_table(reports: &[Report]) {
    let mut rows: Vec<(String, Vec<String>)> = Vec::new();
    let mut row = |label: &str, cell: &dyn Fn(&Report) -> String| {
        rows.push((label.to_owned(), reports.iter().map(cell).collect()));
    };
    row("messages", &|r| r.messages.to_string());
    row("copies published", &|r| r.copies.to_string());
    row("deliveries", &|r| r.deliveries.to_string());
    row("acked processed", &|r| {
        r.acks.get("processed").copied().unwrap_or(0).to_string()
    });
    row("acked duplicate", &|r| {
        r.acks.get("duplicate").copied().unwrap_or(0).to_string()
    });
    row("nacked (redelivered)", &|r| {
        r.nacks.values().sum::<u64>().to_string()
    });
    let classes: std::collections::BTreeSet<&String> =
        reports.iter().flat_map(|r| r.nacks.keys()).collect();
    for class in classes {
        let label = format!("  {class}");
        row(&label, &|r| {
            r.nacks.get(class).copied().unwrap_or(0).to_string()
        });
    }
    row("consumers killed (SIGKILL)", &|r| r.kills.to_string());
    row("  deliveries taken back", &|r| {
        r.redelivered_after_kill.to_string()
    });
    row("sessions cut by the server", &|r| r.cuts.to_string());
    row("server crashes", &|r| r.crashes.to_string());
    row("faults in bodies", &|r| {
        r.faults.values().sum::<u64>().to_string()
    });
    for fault in Fault::ALL.into_iter().filter(|f| *f != Fault::None) {
        let label = format!("  {}", fault.name());
        row(&label, &|r| {
            r.faults.get(fault.name()).copied().unwrap_or(0).to_string()
        });
    }
    row("acks in the logs (fsync)", &|r| r.logged_acks.to_string());
    row("transaction mode: messages", &|r| {
        r.transactional.to_string()
    });
    row("claim mode: messages", &|r| r.claimed.to_string());
    row("  stamped complete", &|r| r.claims_completed.to_string());
    row("  side effects run", &|r| r.side_effects.to_string());
    row("  inside a live lease", &|r| {
        r.inside_live_lease.to_string()
    });
    row("  after the stamp", &|r| r.after_stamp.to_string());
    // A commit the promoted replica never received: acknowledged, then gone with its
    // marker; what the broker still held of it was processed again (or, settled, is lost).
    row(
        "commits lost in the failover: redone",
        &|r| match r.may_lose_commits {
            true => r.processed_twice.to_string(),
            false => "-".to_owned(),
        },
    );
    row("  acknowledged and gone", &|r| match r.may_lose_commits {
        true => (r.ack_without_effect + r.lost).to_string(),
        false => "-".to_owned(),
    });
    row("marker and effect apart", &|r| {
        r.torn.map_or_else(|| "-".to_owned(), |t| t.to_string())
    });
    row("doubled", &|r| r.doubled.to_string());
    row("lost", &|r| r.lost.to_string());
    row("processed twice", &|r| r.processed_twice.to_string());
    row("ack without effect", &|r| r.ack_without_effect.to_string());
    row("processed without its effect", &|r| {
        r.processed_without_effect.to_string()
    });
    row("hot rows: bodies committed", &|r| {
        r.hot.map_or_else(|| "-".to_owned(), |h| h.to_string())
    });
    row("  other writers' commits", &|r| {
        r.other_writes
            .map_or_else(|| "-".to_owned(), |w| w.to_string())
    });
    row("delivery to ack p50", &|r| {
        format!("{:.1} ms", r.p50.as_secs_f64() * 1000.0)
    });
    row("delivery to ack p99", &|r| {
        format!("{:.1} ms", r.p99.as_secs_f64() * 1000.0)
    });
    row("time", &|r| format!("{:.1} s", r.elapsed.as_secs_f64()));
    let width = rows.iter().map(|(l, _)| l.len()).max().unwrap_or(0);
    let columns: Vec<usize> = (0..reports.len())
        .map(|c| {
            rows.iter()
                .map(|(_, cells)| cells[c].len())
                .chain([reports[c].backend.name().len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    println!();
    print!("{:width$}", "");
    for (c, r) in reports.iter().enumerate() {
        print!("  {:>w$}", r.backend.name(), w = columns[c]);
    }
    println!();
    for (label, cells) in &rows {
        print!("{label:width$}");
        for (c, cell) in cells.iter().enumerate() {
            print!("  {cell:>w$}", w = columns[c]);
        }
        println!();
    }
}
