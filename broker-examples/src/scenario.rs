//! The run every broker example makes: consumers `a` and `b` share one queue, `a` is killed
//! with SIGKILL in the middle of a handler and started again as `a2`, and the run ends when
//! every message has its effect and the broker has nothing left to deliver. Then the
//! [`Tally`]: what each process did, the effects per message, and the verdict.

use std::collections::{BTreeMap, BTreeSet};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use crate::events::{Answer, Event};
use crate::fleet::{Ended, Fleet, Heard};
use crate::store::{Effects, Store};

/// The consumer killed in the middle of a handler.
pub const VICTIM: &str = "a";
/// The consumer that runs throughout.
pub const SURVIVOR: &str = "b";
/// The killed consumer, started again.
pub const RESTARTED: &str = "a2";

/// How many messages, how often each is published, when the kill comes, how long the run
/// may take.
#[derive(Debug, Clone, Copy)]
pub struct Scenario {
    /// Distinct messages (ids `m001`, `m002`, …).
    pub messages: u32,
    /// How many times each is published with the same id, as a publisher's retries do.
    pub copies: u32,
    /// [`VICTIM`] is killed as it starts its `kill_after`-th handler body. Counted in bodies,
    /// not in answers: a consumer that answers mostly duplicates (its peer took the first
    /// copies) may start no body after its tenth answer, and then never be killed.
    pub kill_after: u64,
    /// The run fails if the messages are not all applied by then.
    pub timeout: Duration,
}

impl Scenario {
    /// The messages' ids, in publishing order.
    pub fn message_ids(&self) -> Vec<String> {
        (1..=self.messages).map(|n| format!("m{n:03}")).collect()
    }

    /// Starts [`VICTIM`] and [`SURVIVOR`] and waits until both have subscribed, so that
    /// both share the messages from the first.
    ///
    /// # Errors
    /// A process could not be started, or exited, or did not subscribe within the timeout.
    pub async fn start(&self, fleet: &mut Fleet) -> Result<(), String> {
        for name in [VICTIM, SURVIVOR] {
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

    /// Runs until [`VICTIM`] has been killed and is gone, every message has its effect and
    /// as many acknowledged answers as copies published, no consumer holds a delivery it has
    /// not answered, and `pending` — the broker's count of messages waiting for a consumer —
    /// is 0, twice in a row (a delivery may be on its way); or until the timeout. Kills
    /// [`VICTIM`] (SIGKILL) when it prints its `kill_after`-th [`Event::Handling`],
    /// and starts [`RESTARTED`] at once. A problem (a consumer exiting, the timeout) ends
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
        let mut victim_bodies = 0;
        loop {
            if let Some((name, heard)) = fleet.next(Duration::from_millis(50)).await {
                match heard {
                    Heard::Event(event) => {
                        let handling = match &event {
                            Event::Handling { id } => Some(id.clone()),
                            _ => None,
                        };
                        tally.record(&name, event);
                        if handling.is_some() && name == VICTIM {
                            victim_bodies += 1;
                        }
                        if let Some(id) = handling
                            && name == VICTIM
                            && tally.kill.is_none()
                            && victim_bodies >= self.kill_after
                        {
                            fleet
                                .kill(VICTIM)
                                .map_err(|e| format!("kill consumer {VICTIM}: {e}"))?;
                            tally.killed(id);
                            fleet
                                .start(RESTARTED)
                                .map_err(|e| format!("start consumer {RESTARTED}: {e}"))?;
                        }
                    }
                    Heard::Closed if name == VICTIM && tally.kill.is_some() => {
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
    /// The messages the victim received before the kill.
    victim_ids: BTreeSet<String>,
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
            consumers: [VICTIM, SURVIVOR, RESTARTED]
                .iter()
                .map(|name| ((*name).to_owned(), PerConsumer::default()))
                .collect(),
            after_kill: Vec::new(),
            processed: BTreeMap::new(),
            acknowledged: BTreeMap::new(),
            victim_ids: BTreeSet::new(),
            kill: None,
            effects: Effects::default(),
            problems: Vec::new(),
            elapsed: Duration::ZERO,
        }
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
                if self.kill.is_some() && name != VICTIM {
                    self.after_kill
                        .push((name.to_owned(), id.clone(), redelivered));
                }
                if name == VICTIM {
                    self.victim_ids.insert(id.clone());
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
                if name == VICTIM
                    && let Some(kill) = &mut self.kill
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

    fn killed(&mut self, id: String) {
        let answered_before = self.consumer(VICTIM).answered();
        self.kill = Some(Kill {
            id,
            answered_before,
            in_hand: BTreeMap::new(),
            late: false,
            gone: false,
        });
    }

    /// Every line the victim printed has been read: what it had in hand is known.
    fn victim_gone(&mut self) {
        let in_hand = self.consumer(VICTIM).outstanding.clone();
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
            .filter(|(name, _)| name != VICTIM || self.kill.is_none())
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
        for (name, id, redelivered) in self.after_kill.clone() {
            if redelivered && self.victim_ids.contains(&id) {
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
                "{VICTIM} was killed (SIGKILL) after {} answers, {} the handler of {}; \
                 the broker took back its {} without an answer ({}); \
                 restarted as {RESTARTED}\n",
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
            ),
            None => println!("{VICTIM} was not killed\n"),
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
                .map(|(name, c)| match victim_blank && name == VICTIM {
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
                "{VICTIM} was never killed: it started fewer handler bodies than the kill waits for \
                 ({} answers)",
                self.consumers
                    .iter()
                    .find(|(n, _)| n == VICTIM)
                    .map_or(0, |(_, c)| c.answered())
            ));
        }
        problems
    }
}
