//! The run every broker example makes: consumers `a` and `b` share one queue, the first of
//! them to reach its `kill_after`-th handler body is killed there with SIGKILL and started
//! again (`a2` or `b2`), and the run ends when
//! every message has its effect and the broker has nothing left to deliver. Then the
//! [`Tally`]: what each process did, the effects per message, and the verdict.

use std::collections::{BTreeMap, BTreeSet};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use crate::events::{Answer, Event};
use crate::fleet::{Ended, Fleet, Heard};
use crate::store::{Effects, Store};

/// The consumers that start together; one of them is killed.
pub const CONSUMERS: [&str; 2] = ["a", "b"];

/// The name of `victim` started again after the kill: `a2` for `a`.
pub fn restarted(victim: &str) -> String {
    format!("{victim}2")
}

/// How many messages, how often each is published, when the kill comes, how long the run
/// may take.
#[derive(Debug, Clone, Copy)]
pub struct Scenario {
    /// Distinct messages (ids `m001`, `m002`, …).
    pub messages: u32,
    /// How many times each is published with the same id, as a publisher's retries do.
    pub copies: u32,
    /// The first consumer to start its `kill_after`-th handler body is killed in it. Counted
    /// in bodies, not in answers: a consumer that answers mostly duplicates (its peer took
    /// the first copies) may start no body after its tenth answer. Whichever consumer gets
    /// there, not one named in advance: on SQLite the handlers of both processes queue for
    /// one write lock, and SQLite's busy handler sleeps longer the longer a connection has
    /// waited (up to 100 ms at a time), so the lock goes to the fresh waiters of the process
    /// that just committed; one consumer can start two bodies and then none for the rest of
    /// the run, its deliveries answered `Duplicate` after its peer took their second copies.
    pub kill_after: u64,
    /// The run fails if the messages are not all applied by then.
    pub timeout: Duration,
}

impl Scenario {
    /// The messages' ids, in publishing order.
    pub fn message_ids(&self) -> Vec<String> {
        (1..=self.messages).map(|n| format!("m{n:03}")).collect()
    }

    /// Starts the [`CONSUMERS`] and waits until both have subscribed, so that
    /// both share the messages from the first.
    ///
    /// # Errors
    /// A process could not be started, or exited, or did not subscribe within the timeout.
    pub async fn start(&self, fleet: &mut Fleet) -> Result<(), String> {
        for name in CONSUMERS {
            fleet
                .start(name)
                .map_err(|e| format!("start consumer {name}: {e}"))?;
        }
        let deadline = Instant::now() + self.timeout;
        let mut ready = BTreeSet::new();
        while ready.len() < 2 {
            match fleet.next(Duration::from_millis(100)).await {
                Some((name, Heard::Event(Event::Ready))) => {
                    ready.insert(name);
                }
                Some((name, Heard::Closed)) => {
                    return Err(format!(
                        "consumer {name} exited before it subscribed (its error is above)"
                    ));
                }
                _ if Instant::now() > deadline => {
                    return Err(format!(
                        "the consumers did not subscribe within {:?}",
                        self.timeout
                    ));
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Runs until a consumer has been killed and is gone, every message has its effect and
    /// as many acknowledged answers as copies published, no consumer holds a delivery it has
    /// not answered, and `pending` — the broker's count of messages waiting for a consumer —
    /// is 0, twice in a row (a delivery may be on its way); or until the timeout. Kills the
    /// first consumer to print its `kill_after`-th [`Event::Handling`] (SIGKILL), and starts
    /// it again at once under its [`restarted`] name. A problem (a consumer exiting, the timeout) ends
    /// the run early and is in the tally.
    ///
    /// # Errors
    /// A process could not be killed or started, the database or the broker could not be
    /// read.
    pub async fn drive(
        &self,
        fleet: &mut Fleet,
        store: &Store,
        pending: impl AsyncFn() -> Result<u64, String>,
    ) -> Result<Tally, String> {
        let started = Instant::now();
        let deadline = started + self.timeout;
        let published = u64::from(self.messages) * u64::from(self.copies);
        let mut tally = Tally::new(self.message_ids(), published);
        let mut checked = Instant::now();
        let mut quiet_checks = 0;
        let mut bodies = BTreeMap::<String, u64>::new();
        loop {
            if let Some((name, heard)) = fleet.next(Duration::from_millis(50)).await {
                match heard {
                    Heard::Event(event) => {
                        let handling = match &event {
                            Event::Handling { id } => Some(id.clone()),
                            _ => None,
                        };
                        tally.record(&name, event);
                        if let Some(id) = handling
                            && tally.kill.is_none()
                        {
                            let started = bodies.entry(name.clone()).or_default();
                            *started += 1;
                            if *started >= self.kill_after {
                                fleet
                                    .kill(&name)
                                    .map_err(|e| format!("kill consumer {name}: {e}"))?;
                                tally.killed(&name, id);
                                let again = restarted(&name);
                                fleet
                                    .start(&again)
                                    .map_err(|e| format!("start consumer {again}: {e}"))?;
                            }
                        }
                    }
                    Heard::Closed if tally.is_victim(&name) => {
                        tally.victim_gone();
                    }
                    Heard::Closed => {
                        let status = fleet
                            .exited(&name)
                            .map_or_else(String::new, |status| format!(" ({status})"));
                        tally.problems.push(format!(
                            "consumer {name} exited before the end{status}; its error is above"
                        ));
                        break;
                    }
                }
            }
            if Instant::now() > deadline {
                tally.problems.push(format!(
                    "not done after {:?}: {} of {published} copies answered, {}",
                    self.timeout,
                    tally.acknowledged(),
                    match &tally.kill {
                        None => "the kill has not happened".to_owned(),
                        Some(_) => "the kill has happened".to_owned(),
                    },
                ));
                break;
            }
            if checked.elapsed() < Duration::from_millis(100) {
                continue;
            }
            checked = Instant::now();
            let quiet = tally.kill.as_ref().is_some_and(|kill| kill.gone)
                && tally.every_copy_answered(u64::from(self.copies))
                && tally.nothing_in_hand()
                && {
                    let applied = store.effects().await?;
                    let applied = applied.per_message();
                    tally.ids.iter().all(|id| applied.contains_key(id.as_str()))
                }
                && pending().await? == 0;
            quiet_checks = if quiet { quiet_checks + 1 } else { 0 };
            if quiet_checks == 2 {
                break;
            }
        }
        tally.effects = store.effects().await?;
        tally.elapsed = started.elapsed();
        Ok(tally)
    }
}

/// What one consumer process did, from its events.
#[derive(Debug, Clone, Default)]
pub struct PerConsumer {
    /// Deliveries it received.
    pub delivered: u64,
    /// Of those, deliveries after the kill flagged redelivered, of messages the killed
    /// consumer had received.
    pub redelivered_after_kill: u64,
    /// `Processed` answers.
    pub processed: u64,
    /// `Duplicate` answers.
    pub duplicates: u64,
    /// Failures requeued for a retry.
    pub retried: u64,
    /// Failures dead-lettered or halting the pump.
    pub refused: u64,
    /// Deliveries received and not yet answered, by message.
    outstanding: BTreeMap<String, u32>,
}

impl PerConsumer {
    /// Deliveries answered `Processed` or `Duplicate`: acknowledged.
    pub fn answered(&self) -> u64 {
        self.processed + self.duplicates
    }
}

/// The kill, as the orchestrator saw it.
#[derive(Debug, Clone)]
pub struct Kill {
    /// The consumer killed.
    pub victim: String,
    /// The message whose handler was in its body when the signal went.
    pub id: String,
    /// How many deliveries the victim had answered before.
    pub answered_before: u64,
    /// The deliveries the victim had received and not answered, by message: the broker
    /// takes them back.
    pub in_hand: BTreeMap<String, u32>,
    /// The victim answered `id` after all: the handler had finished before the signal.
    pub late: bool,
    /// Its standard output has closed: every line it printed has been read.
    gone: bool,
}

/// Everything a run saw, and its verdict.
#[derive(Debug, Clone)]
pub struct Tally {
    ids: Vec<String>,
    /// Copies published.
    pub published: u64,
    /// Of those, copies the broker dropped on arrival as duplicates of a message it had
    /// stored (JetStream within its duplicate window): never delivered. Printed when not 0.
    pub deduplicated_by_broker: u64,
    consumers: Vec<(String, PerConsumer)>,
    /// Deliveries after the kill: consumer, message, the broker's redelivered flag.
    after_kill: Vec<(String, String, bool)>,
    /// Processed answers by message.
    processed: BTreeMap<String, u64>,
    /// Processed and Duplicate answers by message.
    acknowledged: BTreeMap<String, u64>,
    /// The messages each consumer received before the kill.
    received: BTreeMap<String, BTreeSet<String>>,
    /// The kill, once it happened.
    pub kill: Option<Kill>,
    /// The effect rows at the end.
    pub effects: Effects,
    /// What went wrong in the run itself.
    pub problems: Vec<String>,
    /// How long the run took, from the messages published to the last check.
    pub elapsed: Duration,
}

impl Tally {
    fn new(ids: Vec<String>, published: u64) -> Self {
        Self {
            ids,
            published,
            deduplicated_by_broker: 0,
            consumers: CONSUMERS
                .iter()
                .map(|name| ((*name).to_owned(), PerConsumer::default()))
                .collect(),
            after_kill: Vec::new(),
            processed: BTreeMap::new(),
            acknowledged: BTreeMap::new(),
            received: BTreeMap::new(),
            kill: None,
            effects: Effects::default(),
            problems: Vec::new(),
            elapsed: Duration::ZERO,
        }
    }

    /// `name` was killed.
    fn is_victim(&self, name: &str) -> bool {
        self.kill.as_ref().is_some_and(|kill| kill.victim == name)
    }

    /// What `name` did so far.
    fn consumer(&mut self, name: &str) -> &mut PerConsumer {
        if let Some(at) = self.consumers.iter().position(|(n, _)| n == name) {
            return &mut self.consumers[at].1;
        }
        self.consumers
            .push((name.to_owned(), PerConsumer::default()));
        &mut self.consumers.last_mut().expect("pushed").1
    }

    fn record(&mut self, name: &str, event: Event) {
        match event {
            Event::Delivered {
                id, redelivered, ..
            } => {
                // The victim's lines are read after the kill too: what it printed before.
                if self.kill.is_some() && !self.is_victim(name) {
                    self.after_kill
                        .push((name.to_owned(), id.clone(), redelivered));
                } else {
                    self.received
                        .entry(name.to_owned())
                        .or_default()
                        .insert(id.clone());
                }
                let consumer = self.consumer(name);
                consumer.delivered += 1;
                *consumer.outstanding.entry(id).or_default() += 1;
            }
            Event::Answered { id, answer } => {
                if answer == Answer::Processed {
                    *self.processed.entry(id.clone()).or_default() += 1;
                }
                if matches!(answer, Answer::Processed | Answer::Duplicate) {
                    *self.acknowledged.entry(id.clone()).or_default() += 1;
                }
                if let Some(kill) = &mut self.kill
                    && kill.victim == name
                    && kill.id == id
                {
                    kill.late = true;
                }
                let consumer = self.consumer(name);
                match answer {
                    Answer::Processed => consumer.processed += 1,
                    Answer::Duplicate => consumer.duplicates += 1,
                    Answer::Retry => consumer.retried += 1,
                    Answer::DeadLetter | Answer::Halt => consumer.refused += 1,
                }
                if let Some(n) = consumer.outstanding.get_mut(&id) {
                    *n -= 1;
                    if *n == 0 {
                        consumer.outstanding.remove(&id);
                    }
                }
            }
            Event::Ready | Event::Handling { .. } | Event::Sent { .. } | Event::Stopped { .. } => {}
        }
    }

    fn killed(&mut self, victim: &str, id: String) {
        let answered_before = self.consumer(victim).answered();
        // Its column, beside the others from the start.
        self.consumer(&restarted(victim));
        self.kill = Some(Kill {
            victim: victim.to_owned(),
            id,
            answered_before,
            in_hand: BTreeMap::new(),
            late: false,
            gone: false,
        });
    }

    /// Every line the victim printed has been read: what it had in hand is known.
    fn victim_gone(&mut self) {
        let Some(victim) = self.kill.as_ref().map(|kill| kill.victim.clone()) else {
            return;
        };
        let in_hand = self.consumer(&victim).outstanding.clone();
        if let Some(kill) = &mut self.kill {
            kill.in_hand = in_hand;
            kill.gone = true;
        }
    }

    /// Deliveries answered `Processed` or `Duplicate`, by every consumer.
    pub fn acknowledged(&self) -> u64 {
        self.consumers.iter().map(|(_, c)| c.answered()).sum()
    }

    /// Every message answered `Processed` or `Duplicate` at least `copies` times.
    fn every_copy_answered(&self, copies: u64) -> bool {
        self.ids
            .iter()
            .all(|id| self.acknowledged.get(id).is_some_and(|n| *n >= copies))
    }

    /// No consumer still running holds a delivery it has not answered.
    fn nothing_in_hand(&self) -> bool {
        self.consumers
            .iter()
            .filter(|(name, _)| !self.is_victim(name))
            .all(|(_, c)| c.outstanding.is_empty())
    }

    /// Records how the consumers ended when the fleet stopped: anything but a clean exit
    /// is a problem.
    pub fn stopped(&mut self, ended: Vec<(String, Ended)>) {
        for (name, ended) in ended {
            match ended {
                Ended::Exited(status) if status.success() => {}
                Ended::Exited(status) => self.problems.push(format!(
                    "consumer {name} ended with {status} when asked to stop"
                )),
                Ended::KilledAfterGrace => self
                    .problems
                    .push(format!("consumer {name} did not stop when asked; killed")),
            }
        }
    }

    /// Counts the redeliveries, after the kill, of messages the victim had received: those
    /// it had not answered, and those it had answered but whose acknowledgement had not
    /// reached the broker.
    fn finish_counts(&mut self) {
        for (_, consumer) in &mut self.consumers {
            consumer.redelivered_after_kill = 0;
        }
        let Some(victim) = self.kill.as_ref().map(|kill| kill.victim.clone()) else {
            return;
        };
        let victim_ids = self.received.get(&victim).cloned().unwrap_or_default();
        for (name, id, redelivered) in self.after_kill.clone() {
            if redelivered && victim_ids.contains(&id) {
                self.consumer(&name).redelivered_after_kill += 1;
            }
        }
    }

    /// Prints the kill, the table, and the verdict; the exit code says whether every
    /// message was applied exactly once and the run went as described.
    pub fn report(mut self) -> ExitCode {
        self.finish_counts();
        match &self.kill {
            Some(kill) => println!(
                "{} was killed (SIGKILL) after {} answers, {} the handler of {}; \
                 the broker took back its {} without an answer ({}); \
                 restarted as {}\n",
                kill.victim,
                kill.answered_before,
                if kill.late {
                    "just after"
                } else {
                    "in the middle of"
                },
                kill.id,
                match kill.in_hand.values().sum::<u32>() {
                    1 => "1 delivery".to_owned(),
                    n => format!("{n} deliveries"),
                },
                kill.in_hand
                    .iter()
                    .map(|(id, n)| match n {
                        1 => id.clone(),
                        n => format!("{id} ×{n}"),
                    })
                    .collect::<Vec<_>>()
                    .join(" "),
                restarted(&kill.victim),
            ),
            None => println!("no consumer was killed\n"),
        }
        self.print_table();
        let problems = self.verdict();
        if problems.is_empty() {
            println!(
                "\nOK: each of the {} messages applied exactly once ({} copies published{}, {} \
                 deliveries) in {:.1} s",
                self.ids.len(),
                self.published,
                match self.deduplicated_by_broker {
                    0 => String::new(),
                    n => format!(", {n} dropped by the broker"),
                },
                self.consumers.iter().map(|(_, c)| c.delivered).sum::<u64>(),
                self.elapsed.as_secs_f64(),
            );
            ExitCode::SUCCESS
        } else {
            println!();
            for problem in &problems {
                println!("FAIL: {problem}");
            }
            ExitCode::FAILURE
        }
    }

    fn print_table(&self) {
        let per_consumer = self.effects.per_consumer();
        let names: Vec<&str> = self.consumers.iter().map(|(n, _)| n.as_str()).collect();
        let mut header = format!("{:<28}", "");
        for name in &names {
            header += &format!("{name:>7}");
        }
        println!("{header}{:>8}", "total");
        let row = |label: &str, cells: Vec<String>, total: String| {
            let mut line = format!("{label:<28}");
            for cell in cells {
                line += &format!("{cell:>7}");
            }
            println!("{line}{total:>8}");
        };
        let blank = || vec![String::new(); names.len()];
        row("published", blank(), self.published.to_string());
        if self.deduplicated_by_broker > 0 {
            row(
                "deduplicated by the broker",
                blank(),
                self.deduplicated_by_broker.to_string(),
            );
        }
        // The third field: the victim has no value, as it receives nothing after the kill.
        for (label, pick, victim_blank) in [
            (
                "delivered",
                (|c| c.delivered) as fn(&PerConsumer) -> u64,
                false,
            ),
            (
                "redelivered after the kill",
                |c| c.redelivered_after_kill,
                true,
            ),
            ("processed", |c| c.processed, false),
            ("duplicates", |c| c.duplicates, false),
            ("retried", |c| c.retried, false),
            ("dead-lettered or halted", |c| c.refused, false),
        ] {
            let cells = self
                .consumers
                .iter()
                .map(|(name, c)| match victim_blank && self.is_victim(name) {
                    true => "-".to_owned(),
                    false => pick(c).to_string(),
                })
                .collect();
            let total: u64 = self.consumers.iter().map(|(_, c)| pick(c)).sum();
            row(label, cells, total.to_string());
        }
        let cells = names
            .iter()
            .map(|name| per_consumer.get(name).copied().unwrap_or(0).to_string())
            .collect();
        let applied = self.effects.per_message();
        let total: i64 = self
            .ids
            .iter()
            .map(|id| applied.get(id.as_str()).copied().unwrap_or(0))
            .sum();
        row("effects", cells, total.to_string());
        row(
            "effects per message",
            blank(),
            format!("{:.2}", total as f64 / self.ids.len().max(1) as f64),
        );
    }

    /// Every problem: messages applied other than once, a kill that did not happen, the
    /// run's own problems.
    fn verdict(&self) -> Vec<String> {
        let mut problems = self.problems.clone();
        let applied = self.effects.per_message();
        for id in &self.ids {
            let effects = applied.get(id.as_str()).copied().unwrap_or(0);
            let processed = self.processed.get(id).copied().unwrap_or(0);
            if effects != 1 {
                problems.push(format!("{id} has {effects} effects"));
            } else if processed > 1 {
                problems.push(format!("{id} was answered Processed {processed} times"));
            }
        }
        for id in applied.keys() {
            if !self.ids.iter().any(|published| published == id) {
                problems.push(format!("an effect for {id}, which was never published"));
            }
        }
        if self.kill.is_none() {
            problems.push(format!(
                "no consumer was killed: none started as many handler bodies as the kill waits \
                 for (answers: {})",
                self.consumers
                    .iter()
                    .map(|(name, c)| format!("{name} {}", c.answered()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        problems
    }
}
