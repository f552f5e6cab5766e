//! The course of one backend's run: the consumers started, the broker driven and faults
//! injected until every copy is settled, the consumers stopped, the results checked.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::broker::Run;
use super::faults::other_writer;
use super::report::Report;

impl Run<'_> {
    pub(super) fn drive(&mut self) -> Report {
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
}
