//! `inbox-chaos`: deliveries of an at-least-once broker to `#[idempotent]` consumers while
//! everything around them fails, then a check that each message has exactly one effect.
//!
//! ```text
//! cargo run -p inbox-chaos --release --features postgres,mysql              # the short run
//! cargo run -p inbox-chaos --release --features postgres,mysql -- --deliveries 1000000
//! cargo run -p inbox-chaos -- --backends sqlite --seed 7                     # one backend, replayed
//! ```
//!
//! The broker is simulated in this process, with a real broker's contract: each message is
//! published 2–4 times; copies are handed out in random order to whichever consumer has
//! room, so that copies of one message run at once on different processes; a delivery is
//! settled only by its acknowledgement; a refusal, or the death of the process that held
//! it, hands it out again. Four consumer processes per backend (two sync, two async, four
//! connections each) run an `#[idempotent]` handler that writes one row to `effects` — a
//! table without a unique index — in the inbox's transaction. Each consumer writes every
//! acknowledgement to its ack log, `fsync`ed, before the broker hears of it.
//!
//! Faults: consumers killed with SIGKILL and started again; sessions ended from the
//! server's side (`pg_terminate_backend`, MariaDB's `KILL`); the private PostgreSQL server
//! crashed (`pg_ctl stop -m immediate`) and started again; in the body, panics, errors,
//! statement timeouts (PostgreSQL), slow bodies (a window for the kills), and async calls cut
//! off by a timeout. Then the check: no message with two effects (doubled), none with none
//! (lost), one inbox marker per message, no message `processed` twice in the ack logs, no
//! acknowledgement without its effect. The table goes to standard output; the exit code is
//! non-zero on any violation, or if the run did not finish.
//!
//! `--handler naive` runs a hand-written check-then-insert handler instead, the check's
//! negative control: it must find doubled messages, and exit non-zero.
//!
//! PostgreSQL runs on a private server this tool starts (`initdb` in a temporary directory,
//! a port of its own; as the `postgres` user when run as root); MariaDB/MySQL on a database
//! of its own on the server `INBOX_TEST_MYSQL` names (default
//! `mysql://root@127.0.0.1:3306/test`), whose sessions of that database it cuts.

#[cfg(feature = "mysql")]
mod cluster;
mod consumer;
#[cfg(feature = "mysql")]
mod galera;
mod protocol;
mod run;
mod server;

use std::path::Path;
use std::process::ExitCode;

use protocol::{Backend, Mode};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("consume") {
        return match args.as_slice() {
            [_, backend, mode, url, name, dir, workers, handler] => {
                let (Ok(backend), Ok(mode), Ok(workers)) = (
                    backend.parse::<Backend>(),
                    mode.parse::<Mode>(),
                    workers.parse::<usize>(),
                ) else {
                    eprintln!(
                        "consume <backend> <mode> <url> <name> <log dir> <workers> <idempotent|naive>"
                    );
                    return ExitCode::from(2);
                };
                let naive = handler == "naive";
                consumer::run(backend, mode, url, name, Path::new(dir), workers, naive);
                ExitCode::SUCCESS
            }
            _ => {
                eprintln!(
                    "consume <backend> <mode> <url> <name> <log dir> <workers> <idempotent|naive>"
                );
                ExitCode::from(2)
            }
        };
    }
    match run::Config::parse(&args) {
        Ok(config) => run::run(config),
        Err(e) => {
            eprintln!("{e}\n\n{}", run::USAGE);
            ExitCode::from(2)
        }
    }
}
