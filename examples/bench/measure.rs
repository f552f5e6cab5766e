//! The measurement: workers on their own connections run a variant for a fixed time after a
//! common start, and the report gives each variant's rate as a ratio to `plain` measured in
//! the same run.

use super::*;

pub(crate) const CONSUMER: &str = "bench";
pub(crate) const CONCURRENCY: [usize; 3] = [1, 4, 16];
pub(crate) const VARIANTS: [&str; 7] = [
    "plain",
    "#[idempotent]",
    "+ outbox",
    "hand-written",
    "duplicate",
    "naive",
    "two transactions",
];
/// `--schema lean`: SQLite's lean inbox (`--lean`: `WITHOUT ROWID`, keyed by the pair, no
/// index on `processed_at`).
pub(crate) static LEAN: AtomicBool = AtomicBool::new(false);

/// The variants that run on the lean schema: the others use the shipped `table!`, which
/// has the surrogate key.
pub(crate) const LEAN_VARIANTS: [&str; 3] = ["plain", "#[idempotent]", "duplicate"];

/// The variants of this run.
pub(crate) fn variants() -> &'static [&'static str] {
    match LEAN.load(Ordering::Relaxed) {
        true => &LEAN_VARIANTS,
        false => &VARIANTS,
    }
}

/// `--smoke`: every section on every backend, with tiny durations and row counts — that the
/// bench still runs, not what it measures.
pub(crate) static SMOKE: AtomicBool = AtomicBool::new(false);

fn smoke() -> bool {
    SMOKE.load(Ordering::Relaxed)
}

/// Keys each worker processes before the duplicate variant runs over them again.
pub(crate) fn duplicate_keys() -> u64 {
    if smoke() { 5 } else { 500 }
}

/// Completed rows in the inbox the purge measurement removes (a square: MySQL's archive is
/// built as a cross join).
pub(crate) fn archive_rows() -> u32 {
    if smoke() { 10_000 } else { 1_000_000 }
}

/// The key of message `n` of `worker` in run `run`: never seen before by the other variants.
pub(crate) fn key(run: u64, worker: usize, n: u64) -> Uuid {
    Uuid::from_u128((u128::from(run) << 96) | ((worker as u128) << 64) | u128::from(n))
}

/// A measured cell: messages per second.
pub(crate) struct Cell {
    pub(crate) variant: &'static str,
    pub(crate) clients: usize,
    pub(crate) per_second: f64,
}

/// `workers` threads, each with its own connection, run `message` (which returns how many
/// messages it handled) for `seconds` after a common start; returns the messages per second.
pub(crate) fn measure<C: Send>(
    workers: usize,
    seconds: f64,
    connect: &(dyn Fn() -> C + Sync),
    message: &(dyn Fn(&mut C, usize, u64) -> u64 + Sync),
) -> f64 {
    let start = Barrier::new(workers + 1);
    let stop = AtomicBool::new(false);
    let done = AtomicU64::new(0);
    let elapsed = std::thread::scope(|scope| {
        for worker in 0..workers {
            let (start, stop, done) = (&start, &stop, &done);
            scope.spawn(move || {
                let mut conn = connect();
                start.wait();
                let (mut n, mut messages) = (0, 0);
                while !stop.load(Ordering::Relaxed) {
                    messages += message(&mut conn, worker, n);
                    n += 1;
                }
                done.fetch_add(messages, Ordering::Relaxed);
            });
        }
        start.wait();
        let began = Instant::now();
        std::thread::sleep(Duration::from_secs_f64(seconds));
        stop.store(true, Ordering::Relaxed);
        began.elapsed()
    });
    done.load(Ordering::Relaxed) as f64 / elapsed.as_secs_f64()
}

/// The messages per second of `variant` at `clients`, NaN when it was not measured.
pub(crate) fn rate(cells: &[Cell], variant: &str, clients: usize) -> f64 {
    cells
        .iter()
        .find(|c| c.variant == variant && c.clients == clients)
        .map_or(f64::NAN, |c| c.per_second)
}

pub(crate) fn report(backend: &str, cells: &[Cell]) {
    println!("\n### {backend}\n");
    print!("| variant |");
    for clients in CONCURRENCY {
        print!(" {clients} client{} |", if clients == 1 { "" } else { "s" });
    }
    println!("\n|---|{}", "---:|".repeat(CONCURRENCY.len()));
    for variant in variants() {
        print!("| {variant} |");
        for clients in CONCURRENCY {
            let (value, plain) = (rate(cells, variant, clients), rate(cells, "plain", clients));
            print!(" {:.2} ({:.0}/s) |", value / plain, value);
        }
        println!();
    }
    let ratio = |a: &str, b: &str| {
        CONCURRENCY
            .iter()
            .map(|&clients| format!("{:.2}", rate(cells, a, clients) / rate(cells, b, clients)))
            .collect::<Vec<_>>()
            .join(" / ")
    };
    println!();
    for (line, a, b) in [
        (
            "library overhead, #[idempotent] / hand-written",
            "#[idempotent]",
            "hand-written",
        ),
        (
            "#[idempotent] publishing one message to the outbox / #[idempotent]",
            "+ outbox",
            "#[idempotent]",
        ),
        (
            "duplicate path / processing path",
            "duplicate",
            "#[idempotent]",
        ),
        (
            "#[idempotent] / two transactions",
            "#[idempotent]",
            "two transactions",
        ),
    ] {
        if variants().contains(&a) && variants().contains(&b) {
            println!("{line} (1 / 4 / 16 clients): {}", ratio(a, b));
        }
    }
}

/// The stored-result section: rows written before the table's size is read.
pub(crate) fn kept_rows() -> u64 {
    if smoke() { 50 } else { 20_000 }
}

/// The stored-result section's rounds per variant, interleaved; their median is reported.
pub(crate) const ROUNDS: usize = 5;

/// `--section stored`: only the stored-result section.
pub(crate) static ONLY_STORED: AtomicBool = AtomicBool::new(false);

/// `--section floor`: only PostgreSQL's raw-SQL floor (`pgbench`).
pub(crate) static ONLY_FLOOR: AtomicBool = AtomicBool::new(false);

/// `--section main`: only the main table of each backend (and diesel-async's), without the
/// batches, the existence check, the purge and the sections after them.
pub(crate) static ONLY_MAIN: AtomicBool = AtomicBool::new(false);

/// `--section batches`: only the batch form against one message per transaction.
pub(crate) static ONLY_BATCHES: AtomicBool = AtomicBool::new(false);

/// `--section body`: only the realistic body (a read, an update, an insert), sync and
/// diesel-async, with and without the inbox.
pub(crate) static ONLY_BODY: AtomicBool = AtomicBool::new(false);

/// `--section http`: only the HTTP section, an `inbox-axum` route against the same route
/// without it (`http.rs`).
pub(crate) static ONLY_HTTP: AtomicBool = AtomicBool::new(false);

/// The median of `rates`.
pub(crate) fn median<const N: usize>(mut rates: [f64; N]) -> f64 {
    rates.sort_by(f64::total_cmp);
    rates[N / 2]
}

/// The realistic body's report: a row per concurrency, `plain` and `#[idempotent]` (the
/// medians of interleaved rounds, `rates[clients][variant]`).
pub(crate) fn body_report(label: &str, unit: &str, rates: &[[f64; 2]]) {
    println!("\n### {label}: a read, an update and an insert per message\n");
    println!("| {unit} | plain | #[idempotent] |\n|---|---:|---:|");
    for (clients, [plain, idempotent]) in CONCURRENCY.into_iter().zip(rates) {
        println!(
            "| {clients} | 1.00 ({plain:.0}/s) | {:.2} ({idempotent:.0}/s) |",
            idempotent / plain
        );
    }
}

/// What the stored-result handlers return and keep: a typical small answer.
#[derive(serde::Serialize, serde::Deserialize)]
pub(crate) struct Receipt {
    payment: String,
    account: u64,
    amount_cents: i64,
    status: String,
}

impl Receipt {
    pub(crate) fn of(id: &Uuid, worker: usize) -> Self {
        Receipt {
            payment: id.to_string(),
            account: worker as u64 + 1,
            amount_cents: 1_250,
            status: "settled".into(),
        }
    }
}

/// The inbox of the stored-result section, with the optional columns.
pub(crate) const KEPT: InboxSchema =
    InboxSchema::new_unchecked("inbox_kept", "ux_inbox_kept_message_consumer");

pub(crate) fn kept_sql(backend: inbox_diesel::schema::Backend) -> String {
    backend.create_table_with_sql(
        &KEPT,
        inbox_diesel::schema::OptionalColumns {
            result: true,
            fingerprint: true,
            ..Default::default()
        },
    )
}
