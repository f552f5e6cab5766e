//! What the orchestrator counts from the processes' events, the table it prints, and the
//! verdict.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use inbox_broker_examples::events::{Answer, Event};
use inbox_broker_examples::fleet::Ended;
use inbox_broker_examples::store::{Effects, OutboxRows, OutboxState};

use crate::{A, B, COPIES, Downstream, MESSAGES, Plan, RELAY_LEASE, RELAYS};

/// What one process did, from its events.
#[derive(Debug, Clone, Default)]
pub struct Process {
    delivered: u64,
    /// Deliveries the broker flagged as redelivered (RabbitMQ) or numbered above 1
    /// (JetStream): after a kill, or a retry.
    redelivered: u64,
    processed: u64,
    duplicates: u64,
    retried: u64,
    refused: u64,
    /// Messages a relay sent, confirmed by JetStream.
    pub sent: u64,
    /// Of those, messages the killed relay had sent and not marked.
    resent_after_kill: u64,
    /// Of those, messages another relay had sent and was still to mark: its round outlived
    /// its lease.
    resent_after_lease: u64,
    /// Deliveries received and not yet answered, by message.
    outstanding: BTreeMap<String, u32>,
}

impl Process {
    pub fn answered(&self) -> u64 {
        self.processed + self.duplicates
    }
}

/// A kill, as the orchestrator saw it.
#[derive(Debug, Clone)]
pub struct Kill {
    pub victim: String,
    restarted: &'static str,
    /// Since the messages were published.
    at: Duration,
    /// Its service's answers (a consumer's) or sends (a relay's) by then, all processes.
    after: u64,
    /// The message in the victim's handler, or the one it had sent and not marked.
    id: String,
    /// A consumer answered `id` after all: its handler had finished before the signal.
    late: bool,
    /// Deliveries the victim held without an answer, by message: its broker takes them back.
    in_hand: BTreeMap<String, u32>,
    /// The relay that sent `id` again after the victim's lease ran out, and when.
    resent_by: Option<(String, Duration)>,
    /// Its standard output has closed: every line it printed has been read.
    pub gone: bool,
}

/// Everything a run saw, and its verdict.
pub struct Tally {
    pub ids: Vec<String>,
    /// Copies published to RabbitMQ.
    pub published: u64,
    pub processes: BTreeMap<String, Process>,
    /// A's `Processed` and `Duplicate` answers by message.
    pub a_acknowledged: BTreeMap<String, u64>,
    /// Sends by message, of every relay.
    pub sends: BTreeMap<String, u64>,
    /// The relay that sent each message last.
    pub sent_by: BTreeMap<String, String>,
    pub kills: Vec<Kill>,
    pub started: Instant,
    pub a_effects: Effects,
    pub outbox: OutboxRows,
    pub b_effects: Effects,
    /// Messages the downstream broker stored.
    pub stored: u64,
    /// Where the relays send and service B consumes.
    pub downstream: Downstream,
    pub problems: Vec<String>,
    pub elapsed: Duration,
}

impl Tally {
    pub fn new(ids: Vec<String>, started: Instant, downstream: Downstream) -> Self {
        Self {
            ids,
            published: 0,
            processes: [A, RELAYS, B]
                .iter()
                .flatten()
                .map(|name| ((*name).to_owned(), Process::default()))
                .collect(),
            a_acknowledged: BTreeMap::new(),
            sends: BTreeMap::new(),
            sent_by: BTreeMap::new(),
            kills: Vec::new(),
            started,
            a_effects: Effects::default(),
            outbox: OutboxRows::default(),
            b_effects: Effects::default(),
            stored: 0,
            downstream,
            problems: Vec::new(),
            elapsed: Duration::ZERO,
        }
    }

    pub fn process(&mut self, name: &str) -> &mut Process {
        self.processes.entry(name.to_owned()).or_default()
    }

    /// Counts `event`; returns the message of a kill point — a handler in its pause, a send
    /// not yet marked.
    pub fn record(&mut self, name: &str, event: &Event) -> Option<String> {
        match event {
            Event::Delivered {
                id,
                redelivered,
                count,
            } => {
                let process = self.process(name);
                process.delivered += 1;
                process.redelivered += u64::from(*redelivered || *count > 1);
                *process.outstanding.entry(id.clone()).or_default() += 1;
                None
            }
            Event::Handling { id } => Some(id.clone()),
            Event::Answered { id, answer } => {
                if A.contains(&name) && matches!(answer, Answer::Processed | Answer::Duplicate) {
                    *self.a_acknowledged.entry(id.clone()).or_default() += 1;
                }
                if let Some(kill) = self.kills.iter_mut().find(|kill| kill.victim == name)
                    && kill.id == *id
                {
                    kill.late = true;
                }
                let process = self.process(name);
                match answer {
                    Answer::Processed => process.processed += 1,
                    Answer::Duplicate => process.duplicates += 1,
                    Answer::Retry => process.retried += 1,
                    Answer::DeadLetter | Answer::Halt => process.refused += 1,
                }
                if let Some(n) = process.outstanding.get_mut(id) {
                    *n -= 1;
                    if *n == 0 {
                        process.outstanding.remove(id);
                    }
                }
                None
            }
            Event::Sent { id } => {
                *self.sends.entry(id.clone()).or_default() += 1;
                let at = self.started.elapsed();
                // Sent before by the killed relay: its claim ran out after the kill. Sent
                // before by a relay still running: that relay's round outlived its lease.
                let (mut after_kill, mut after_lease) = (false, false);
                if let Some(previous) = self.sent_by.insert(id.clone(), name.to_owned()) {
                    match self.kills.iter_mut().find(|kill| kill.victim == previous) {
                        Some(kill) => {
                            after_kill = true;
                            if kill.id == *id && kill.resent_by.is_none() {
                                kill.resent_by = Some((name.to_owned(), at));
                            }
                        }
                        None => after_lease = true,
                    }
                }
                let process = self.process(name);
                process.sent += 1;
                process.resent_after_kill += u64::from(after_kill);
                process.resent_after_lease += u64::from(after_lease);
                Some(id.clone())
            }
            Event::Ready | Event::Stopped { .. } => None,
        }
    }

    pub fn killed(&mut self, victim: &str, restarted: &'static str, id: String, at: Duration) {
        let after = if RELAYS.contains(&victim) {
            self.sent()
        } else if A.contains(&victim) {
            self.answered(&A)
        } else {
            self.answered(&B)
        };
        self.kills.push(Kill {
            victim: victim.to_owned(),
            restarted,
            at,
            after,
            id,
            late: false,
            in_hand: BTreeMap::new(),
            resent_by: None,
            gone: false,
        });
    }

    /// Every line `victim` printed has been read: what it held is known.
    pub fn gone(&mut self, victim: &str) {
        let in_hand = self.process(victim).outstanding.clone();
        if let Some(kill) = self.kills.iter_mut().find(|kill| kill.victim == victim) {
            kill.in_hand = in_hand;
            kill.gone = true;
        }
    }

    pub fn answered(&self, service: &[&str]) -> u64 {
        self.processes
            .iter()
            .filter(|(name, _)| service.contains(&name.as_str()))
            .map(|(_, process)| process.answered())
            .sum()
    }

    pub fn sent(&self) -> u64 {
        self.sends.values().sum()
    }

    /// Every message answered `Processed` or `Duplicate` by A at least `COPIES` times.
    pub fn every_copy_answered(&self) -> bool {
        self.ids.iter().all(|id| {
            self.a_acknowledged
                .get(id)
                .is_some_and(|n| *n >= u64::from(COPIES))
        })
    }

    /// No process still running holds a delivery it has not answered.
    pub fn nothing_in_hand(&self) -> bool {
        self.processes
            .iter()
            .filter(|(name, _)| !self.kills.iter().any(|kill| kill.victim == **name))
            .all(|(_, process)| process.outstanding.is_empty())
    }

    /// Records how the processes ended when asked to stop: anything but a clean exit is a
    /// problem.
    pub fn stopped(&mut self, ended: Vec<(String, Ended)>) {
        for (name, ended) in ended {
            match ended {
                Ended::Exited(status) if status.success() => {}
                Ended::Exited(status) => self
                    .problems
                    .push(format!("{name} ended with {status} when asked to stop")),
                Ended::KilledAfterGrace => self
                    .problems
                    .push(format!("{name} did not stop when asked; killed")),
            }
        }
    }

    /// Prints the kills, the table and the verdict; the exit code says whether each message
    /// has exactly one effect in A, one outbox row, and exactly one effect in B.
    pub fn report(self, plan: Plan) -> ExitCode {
        println!("Kills (seed {}):", plan.seed);
        for kill in &self.kills {
            println!("  {}", self.describe(kill));
        }
        println!();
        self.print_table();
        let relays = |pick: Pick| {
            RELAYS
                .map(|name| self.processes.get(name).map_or(0, pick))
                .iter()
                .sum::<u64>()
        };
        let (after_kill, after_lease) = (
            relays(|p| p.resent_after_kill),
            relays(|p| p.resent_after_lease),
        );
        if after_lease > 0 {
            println!(
                "\n{} sent twice by relays side by side: a relay's round outlived its {} s \
                 lease — its marks waited for A's database, whose one writer A's handlers hold \
                 through their pause — and the other relay claimed the rows again. {}",
                count(after_lease, "message was", "messages were"),
                RELAY_LEASE.as_secs_f64(),
                self.downstream.copies_dropped(),
            );
        }
        let problems = self.verdict();
        if problems.is_empty() {
            println!(
                "\nOK: each of the {MESSAGES} messages applied once in A, written once to the \
                 outbox, sent by the relays ({} sends: {after_kill} again after the relay's \
                 kill, {after_lease} after a lease ran out) and applied once in B, in {:.1} s; \
                 replay the kills with `cargo run --example outbox -- --seed {}`",
                self.sent(),
                self.elapsed.as_secs_f64(),
                plan.seed,
            );
            ExitCode::SUCCESS
        } else {
            println!();
            for problem in &problems {
                println!("FAIL: {problem}");
            }
            println!(
                "replay the kills with `cargo run --example outbox -- --seed {}`",
                plan.seed
            );
            ExitCode::FAILURE
        }
    }

    pub fn describe(&self, kill: &Kill) -> String {
        let at = format!(
            "at {:>4.1} s  {} (SIGKILL)",
            kill.at.as_secs_f64(),
            kill.victim
        );
        let held = |broker: &str| match kill.in_hand.values().sum::<u32>() {
            0 => format!("{broker} had nothing of it to take back"),
            n => format!(
                "{broker} took back its {} without an answer ({})",
                if n == 1 {
                    "delivery".to_owned()
                } else {
                    format!("{n} deliveries")
                },
                kill.in_hand
                    .iter()
                    .map(|(id, n)| match n {
                        1 => id.clone(),
                        n => format!("{id} ×{n}"),
                    })
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
        };
        let handler = if kill.late {
            format!("just after the handler of {} (it had committed)", kill.id)
        } else {
            format!("in the middle of the handler of {}", kill.id)
        };
        if RELAYS.contains(&kill.victim.as_str()) {
            let then = match &kill.resent_by {
                Some((relay, at)) => format!(
                    "between {broker}'s confirm of {id} and the mark; its claim ran out after \
                     {lease} s and {relay} sent {id} again at {at:.1} s, with the same {header}",
                    broker = self.downstream.broker(),
                    header = self.downstream.id_header(),
                    id = kill.id,
                    lease = RELAY_LEASE.as_secs_f64(),
                    at = at.as_secs_f64(),
                ),
                None => format!(
                    "just after it marked {} sent: no message went out twice",
                    kill.id
                ),
            };
            format!(
                "{at}, relay, {} by the relays, {then}; restarted as {}",
                count(kill.after, "send", "sends"),
                kill.restarted
            )
        } else if A.contains(&kill.victim.as_str()) {
            let rolled_back = match kill.late {
                true => "",
                false => ": its effect and its outbox row rolled back together",
            };
            format!(
                "{at}, service A, {} by the service, {handler}{rolled_back}; {}; restarted as \
                 {}",
                count(kill.after, "answer", "answers"),
                held("RabbitMQ"),
                kill.restarted
            )
        } else {
            format!(
                "{at}, service B, {} by the service, {handler}; {}, {}; restarted as {}",
                count(kill.after, "answer", "answers"),
                held(self.downstream.broker()),
                self.downstream.taken_back(),
                kill.restarted
            )
        }
    }

    pub fn print_table(&self) {
        const LABEL: usize = 44;
        let header = |title: &str, names: &[&str; 3]| {
            let mut line = format!("{title:<LABEL$}");
            for name in names {
                line += &format!("{name:>6}");
            }
            println!("{line}{:>8}", "total");
        };
        let row = |label: &str, cells: Option<[u64; 3]>, total: String| {
            let mut line = format!("{label:<LABEL$}");
            match cells {
                Some(cells) => {
                    for cell in cells {
                        line += &format!("{cell:>6}");
                    }
                }
                None => line += &" ".repeat(18),
            }
            println!("{line}{total:>8}");
        };
        let counts = |names: &[&str; 3], pick: Pick| {
            let cells = names.map(|name| self.processes.get(name).map_or(0, pick));
            (Some(cells), cells.iter().sum::<u64>().to_string())
        };
        let per_message = |total: u64| format!("{:.2}", total as f64 / f64::from(MESSAGES));
        let effects_of = |effects: &Effects, names: &[&str; 3]| {
            let per_consumer = effects.per_consumer();
            let cells = names.map(|name| {
                per_consumer
                    .get(name)
                    .map_or(0, |n| u64::try_from(*n).unwrap_or(0))
            });
            let applied = effects.per_message();
            let total: i64 = self
                .ids
                .iter()
                .map(|id| applied.get(id.as_str()).copied().unwrap_or(0))
                .sum();
            (cells, u64::try_from(total).unwrap_or(0))
        };

        header("service A: RabbitMQ -> A's effects + outbox", &A);
        row("published to RabbitMQ", None, self.published.to_string());
        for (label, pick) in consumer_rows() {
            let (cells, total) = counts(&A, pick);
            row(label, cells, total);
        }
        let (cells, total) = effects_of(&self.a_effects, &A);
        row("effects in A's database", Some(cells), total.to_string());
        row("A's effects per message", None, per_message(total));
        let outbox = self.outbox.per_message();
        let written: u64 = self
            .ids
            .iter()
            .map(|id| outbox.get(id.as_str()).copied().unwrap_or(0))
            .sum();
        row("outbox rows written", None, self.outbox.len().to_string());
        row("outbox rows per message", None, per_message(written));
        row(
            "outbox rows sent, waiting, parked",
            None,
            format!(
                "{}/{}/{}",
                self.outbox.count(OutboxState::Sent),
                self.outbox.count(OutboxState::Waiting),
                self.outbox.count(OutboxState::Parked)
            ),
        );

        println!();
        let broker = self.downstream.broker();
        header(&format!("relays: A's outbox -> {broker}"), &RELAYS);
        let (cells, total) = counts(&RELAYS, |p| p.sent);
        row(&format!("sent, confirmed by {broker}"), cells, total);
        let (cells, total) = counts(&RELAYS, |p| p.resent_after_kill);
        row("of those, sent again after the kill", cells, total);
        let (cells, total) = counts(&RELAYS, |p| p.resent_after_lease);
        row("of those, sent again after a lease ran out", cells, total);
        row(
            &format!("stored by {broker}"),
            None,
            self.stored.to_string(),
        );
        row(
            &format!(
                "deduplicated by {broker} (same {})",
                self.downstream.id_header()
            ),
            None,
            self.sent().saturating_sub(self.stored).to_string(),
        );

        println!();
        header(&format!("service B: {broker} -> B's effects"), &B);
        for (label, pick) in consumer_rows() {
            let (cells, total) = counts(&B, pick);
            row(label, cells, total);
        }
        let (cells, total) = effects_of(&self.b_effects, &B);
        row("effects in B's database", Some(cells), total.to_string());
        row("B's effects per message", None, per_message(total));
    }

    /// Every problem: a message with other than one effect in A, one outbox row or one effect
    /// in B, a row not sent, a kill that did not happen, the run's own problems.
    pub fn verdict(&self) -> Vec<String> {
        let mut problems = self.problems.clone();
        let a = self.a_effects.per_message();
        let b = self.b_effects.per_message();
        let outbox = self.outbox.per_message();
        for id in &self.ids {
            let a = a.get(id.as_str()).copied().unwrap_or(0);
            let rows = outbox.get(id.as_str()).copied().unwrap_or(0);
            let b = b.get(id.as_str()).copied().unwrap_or(0);
            if a != 1 {
                problems.push(format!("{id} has {a} effects in A"));
            }
            if rows != 1 {
                problems.push(format!("{id} has {rows} outbox rows"));
            }
            if b != 1 {
                problems.push(format!("{id} has {b} effects in B"));
            }
        }
        for (what, unknown) in [
            ("an effect in A", a.keys().copied().collect::<Vec<_>>()),
            ("an outbox row", outbox.keys().copied().collect()),
            ("an effect in B", b.keys().copied().collect()),
        ] {
            for id in unknown {
                if !self.ids.iter().any(|published| published == id) {
                    problems.push(format!("{what} for {id}, which was never published"));
                }
            }
        }
        if self.outbox.len() != u64::from(MESSAGES) {
            problems.push(format!(
                "{} outbox rows for {MESSAGES} messages",
                self.outbox.len()
            ));
        }
        let unsent = self.outbox.len() - self.outbox.count(OutboxState::Sent);
        if unsent > 0 {
            problems.push(format!("{unsent} outbox rows not marked sent"));
        }
        for victim in [A[0], RELAYS[0], B[0]] {
            if !self.kills.iter().any(|kill| kill.victim == victim) {
                problems.push(format!(
                    "{victim} was never killed: the run was over before its point came"
                ));
            }
        }
        problems
    }
}

/// `n` and the noun, singular or plural.
fn count(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// A count of a process's, for a row of the table.
type Pick = fn(&Process) -> u64;

/// The rows every consumer process has.
fn consumer_rows() -> [(&'static str, Pick); 6] {
    [
        ("delivered", |p| p.delivered),
        ("redelivered (after a kill or a retry)", |p| p.redelivered),
        ("processed", |p| p.processed),
        ("duplicates", |p| p.duplicates),
        ("retried", |p| p.retried),
        ("dead-lettered or halted", |p| p.refused),
    ]
}
