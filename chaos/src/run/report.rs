//! The report of one backend's run: its figures, the invariants it violated, the table.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::protocol::{Backend, Fault};

/// One backend's run.
pub struct Report {
    backend: Backend,
    pub(super) messages: u64,
    pub(super) copies: u64,
    pub(super) deliveries: u64,
    pub(super) acks: BTreeMap<String, u64>,
    pub(super) nacks: BTreeMap<String, u64>,
    pub(super) faults: BTreeMap<&'static str, u64>,
    pub(super) kills: u64,
    pub(super) cuts: u64,
    pub(super) crashes: u64,
    pub(super) last_crash: Option<Instant>,
    pub(super) redelivered_after_kill: u64,
    pub(super) effects: u64,
    pub(super) markers: u64,
    pub(super) transactional: u64,
    pub(super) claimed: u64,
    pub(super) claims_completed: u64,
    pub(super) side_effects: u64,
    pub(super) inside_live_lease: u64,
    pub(super) after_stamp: u64,
    pub(super) claims_without_side_effect: u64,
    pub(super) torn: Option<u64>,
    /// An asynchronous replica was promoted: acknowledged commits may be gone, and with
    /// them what they recorded; marker and effect must still go together.
    pub(super) may_lose_commits: bool,
    pub(super) logged_acks: u64,
    pub(super) doubled: u64,
    pub(super) lost: u64,
    pub(super) processed_twice: u64,
    pub(super) ack_without_effect: u64,
    /// Deliveries answered `Processed` whose own effect is not in the database.
    pub(super) processed_without_effect: u64,
    /// With `--hot`: the hot rows' sum, one per committed body.
    pub(super) hot: Option<i64>,
    /// With `--hot` on Galera: the other writers' commits on the hot rows.
    pub(super) other_writes: Option<u64>,
    pub(super) p50: Duration,
    pub(super) p99: Duration,
    pub(super) elapsed: Duration,
    pub(super) problems: Vec<String>,
}

impl Report {
    pub(super) fn new(backend: Backend) -> Self {
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

    pub(super) fn failed(backend: Backend, problem: String) -> Self {
        let mut report = Report::new(backend);
        report.problems.push(problem);
        report
    }

    pub(super) fn violations(&self) -> Vec<String> {
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

pub(super) fn print_table(reports: &[Report]) {
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
