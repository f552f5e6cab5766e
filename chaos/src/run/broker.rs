//! The simulated broker: the consumer processes it delivers to, started and killed, the
//! copies it publishes, hands out and takes back, and what the consumers answer.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::report::Report;
use super::{CONSUMERS, Config, PREFETCH, WINDOW, WORKERS};
use crate::protocol::{Answer, Backend, Delivery, Fault, Mode};
use crate::server::Database;

/// One copy of a message, published once, settled by one acknowledgement.
#[derive(Debug, Clone, Copy)]
struct Copy {
    message: u64,
}

/// A consumer process's slot: started again under the same name after a kill.
pub(super) struct Slot {
    name: String,
    mode: Mode,
    pub(super) child: Option<Child>,
    pub(super) stdin: Option<ChildStdin>,
    generation: u64,
    ready: bool,
    held: HashSet<u64>,
}

pub(super) enum Heard {
    Line(String),
    Closed,
}

/// What a consumer slot's reader heard, and from which start of the slot's process.
pub(super) type Event = (usize, u64, Heard);

pub(super) struct Run<'c> {
    pub(super) backend: Backend,
    pub(super) config: &'c Config,
    pub(super) db: Database,
    pub(super) rng: fastrand::Rng,
    pub(super) slots: Vec<Slot>,
    pub(super) events: (mpsc::Sender<Event>, mpsc::Receiver<Event>),
    // The broker.
    pub(super) messages: u64,
    pub(super) published: u64,
    pub(super) copies: u64,
    pub(super) settled: u64,
    pending: Vec<Copy>,
    in_flight: HashMap<u64, (usize, Copy, Instant, Fault)>,
    next_delivery: u64,
    pub(super) report: Report,
    pub(super) latencies: Vec<Duration>,
}

impl<'c> Run<'c> {
    pub(super) fn new(backend: Backend, seed: u64, config: &'c Config) -> Result<Self, String> {
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

    pub(super) fn start(&mut self, at: usize) -> Result<(), String> {
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
    pub(super) fn kill(&mut self, at: usize) -> Result<(), String> {
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
    /// Publishes while the window has room, then hands out copies at random to consumers
    /// with room.
    pub(super) fn dispatch(&mut self) {
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

    pub(super) fn heard(&mut self, at: usize, generation: u64, heard: Heard) -> Result<(), String> {
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
