//! The raw-SQL floor on PostgreSQL: the statements the library sends for one message,
//! written by hand and run by `pgbench` against the bench's own database — what the protocol
//! costs with no client library at all, beside what the library measures.
//!
//! Each client updates its own account row, as the library's workers do. The scripts:
//!
//! - `plain`: `BEGIN`, the `UPDATE`, `COMMIT` — the baseline;
//! - `marker`: `BEGIN`, the marker's `INSERT … ON CONFLICT DO NOTHING RETURNING 1`, the
//!   `UPDATE`, `COMMIT` — the library's statements, one round trip each;
//! - `marker, one pipeline`: the same four statements sent as one pipeline
//!   (`\startpipeline` … `\endpipeline`): what the protocol costs when its round trips are one.

use std::process::Command;

/// `pgbench`: on `PATH`, or in a PostgreSQL server's `bin`.
fn pgbench() -> Option<String> {
    if Command::new("pgbench").arg("--version").output().is_ok() {
        return Some("pgbench".into());
    }
    let mut found: Vec<_> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|entry| {
            let path = entry.ok()?.path().join("bin/pgbench");
            path.exists().then(|| path.display().to_string())
        })
        .collect();
    found.sort();
    found.pop()
}

const PLAIN: &str = "BEGIN;
UPDATE accounts SET balance = balance + 1 WHERE id = :client_id % 16 + 1;
COMMIT;
";

const MARKER: &str = "BEGIN;
INSERT INTO inbox (message_id, consumer, received_at, processed_at)
    VALUES (gen_random_uuid(), 'floor', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)
    ON CONFLICT (message_id, consumer) DO NOTHING RETURNING CAST(1 AS BIGINT);
UPDATE accounts SET balance = balance + 1 WHERE id = :client_id % 16 + 1;
COMMIT;
";

const PIPELINED: &str = "\\startpipeline
BEGIN;
INSERT INTO inbox (message_id, consumer, received_at, processed_at)
    VALUES (gen_random_uuid(), 'floor', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)
    ON CONFLICT (message_id, consumer) DO NOTHING RETURNING CAST(1 AS BIGINT);
UPDATE accounts SET balance = balance + 1 WHERE id = :client_id % 16 + 1;
COMMIT;
\\endpipeline
";

/// Transactions per second of `script` with `clients` connections for `seconds`.
fn tps(pgbench: &str, url: &str, script: &str, clients: usize, seconds: u64) -> f64 {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let file = dir.path().join("script.sql");
    std::fs::write(&file, script).expect("the script");
    let output = Command::new(pgbench)
        .args(["--no-vacuum", "--protocol=prepared"])
        .arg(format!("--client={clients}"))
        .arg(format!("--jobs={}", clients.min(2)))
        .arg(format!("--time={seconds}"))
        .arg(format!("--file={}", file.display()))
        .arg(url)
        .output()
        .unwrap_or_else(|e| panic!("run {pgbench}: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "pgbench failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
        .lines()
        .find_map(|line| {
            let rest = line.trim().strip_prefix("tps = ")?;
            rest.split_whitespace().next()?.parse().ok()
        })
        .unwrap_or_else(|| panic!("no tps in pgbench's output:\n{stdout}"))
}

/// The floor's table: each script at 1, 4 and 16 clients, as a ratio to `plain` at the same
/// concurrency. Panics without `pgbench` (a PostgreSQL server package has it).
pub(crate) fn floor(label: &str, url: &str, seconds: f64) {
    let pgbench = pgbench().expect(
        "pgbench, for the PostgreSQL floor (Debian: postgresql-client or the server package)",
    );
    let seconds = seconds.ceil().max(1.0) as u64;
    println!("\n### {label}: the raw-SQL floor (pgbench, prepared statements)");
    println!("\n| statements | 1 client | 4 clients | 16 clients |\n|---|---:|---:|---:|");
    let clients = CONCURRENCY;
    let plain: Vec<f64> = clients
        .iter()
        .map(|&c| tps(&pgbench, url, PLAIN, c, seconds))
        .collect();
    print!("| plain (`BEGIN`, `UPDATE`, `COMMIT`) |");
    for rate in &plain {
        print!(" 1.00 ({rate:.0}/s) |");
    }
    println!();
    for (name, script) in [
        ("marker (`BEGIN`, `INSERT`, `UPDATE`, `COMMIT`)", MARKER),
        ("marker, one pipeline", PIPELINED),
    ] {
        print!("| {name} |");
        for (&c, base) in clients.iter().zip(&plain) {
            let rate = tps(&pgbench, url, script, c, seconds);
            print!(" {:.2} ({rate:.0}/s) |", rate / base);
        }
        println!();
    }
}

use super::CONCURRENCY;
