//! The orchestrator: the simulated broker, the consumer processes, the faults, the check.

mod broker;
mod check;
mod drive;
mod faults;
mod report;

use std::process::ExitCode;
use std::time::Duration;

use self::broker::Run;
use self::report::{Report, print_table};
use crate::protocol::{Backend, Mode};

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
