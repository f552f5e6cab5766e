//! The verification of a run: the database, the ack logs and the side-effect logs against
//! the invariants.

use std::collections::HashMap;
use std::time::Duration;

use super::broker::Run;

impl Run<'_> {
    /// The database and the ack logs against the invariants.
    pub(super) fn check(&mut self) {
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
