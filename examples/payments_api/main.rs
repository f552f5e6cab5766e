//! A payments API whose `POST` takes an `Idempotency-Key`: the payment, the key and the
//! response commit in one transaction (`inbox-axum`), so a retried request is answered with
//! the first one's response and never pays twice.
//!
//! ```text
//! cargo run --example payments_api                 # embedded SQLite: the demo, then exits
//! cargo run --example payments_api -- --serve      # and then serves on 127.0.0.1:3000
//! DATABASE_URL=postgres://postgres@127.0.0.1/test \
//!     cargo run --example payments_api --features inbox-examples/postgres
//! ```
//!
//! The demo sends, over real HTTP: sixteen identical `POST`s with one key at the same moment,
//! a retry of it, the same key with another amount, a `POST` without a key, and the same key
//! from another tenant; then it prints what each got and what the database holds.
//!
//! With `--serve` (address: `PAYMENTS_API_ADDR`, default `127.0.0.1:3000`):
//!
//! ```text
//! curl -i localhost:3000/accounts/1/payments -H 'Idempotency-Key: "order-1"' \
//!      -H 'content-type: application/json' -d '{"amount_cents": 500}'
//! ```

mod backends;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use inbox_examples::support::{self, Target};

const CONCURRENT: usize = 16;

fn main() {
    let serve = std::env::args().skip(1).any(|a| a == "--serve");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        match support::target() {
            Target::Sqlite => {
                use backends::sqlite as app;
                let dir = tempfile::tempdir().expect("a temporary directory");
                let path = dir.path().join("payments.sqlite").display().to_string();
                println!("SQLite database: {path}\n");
                let db = app::pool(&path, 8).await;
                app::create_schema(&db).await;
                run(app::router(db.clone()), || app::ledger(&db), serve).await;
            }
            #[cfg(feature = "postgres")]
            Target::Postgres(url) => {
                use backends::postgres as app;
                let url = fresh_postgres_database(&url, "inbox_payments_api");
                println!("PostgreSQL: {url}\n");
                let db = app::pool(&url, 8).await;
                app::create_schema(&db).await;
                run(app::router(db.clone()), || app::ledger(&db), serve).await;
            }
            #[cfg(feature = "mysql")]
            Target::Mysql(_) => {
                eprintln!("the payments API example runs on SQLite and PostgreSQL");
                std::process::exit(2);
            }
        }
    });
}

/// Serves `router` on a port of its own, runs the demo against it over HTTP, and, with
/// `--serve`, goes on serving on `PAYMENTS_API_ADDR` until interrupted.
async fn run<L, F>(router: Router, ledger: L, serve: bool)
where
    L: Fn() -> F,
    F: Future<Output = (i64, i64)>,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a local port");
    let addr = listener.local_addr().expect("its address");
    tokio::spawn(axum::serve(listener, router.clone()).into_future());
    demo(addr, ledger).await;
    if serve {
        let addr = std::env::var("PAYMENTS_API_ADDR").unwrap_or_else(|_| "127.0.0.1:3000".into());
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .unwrap_or_else(|e| panic!("listen on {addr}: {e}"));
        println!("\nserving on http://{addr} (Ctrl-C to stop)");
        axum::serve(listener, router)
            .with_graceful_shutdown(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await
            .expect("serve");
    }
}

async fn demo<L, F>(addr: SocketAddr, ledger: L)
where
    L: Fn() -> F,
    F: Future<Output = (i64, i64)>,
{
    let client = reqwest::Client::new();
    let url = format!("http://{addr}/accounts/1/payments");
    let post = move |key: Option<&str>, tenant: Option<&str>, cents: i64| {
        let mut request = client
            .post(&url)
            .json(&serde_json::json!({ "amount_cents": cents }));
        if let Some(key) = key {
            request = request.header("idempotency-key", format!("\"{key}\""));
        }
        if let Some(tenant) = tenant {
            request = request.header("x-tenant", tenant);
        }
        async move {
            let response = request.send().await.expect("the server answers");
            let replayed = response.headers().contains_key("idempotent-replayed");
            let status = response.status().as_u16();
            let body = response.text().await.expect("a body");
            (status, replayed, body)
        }
    };

    println!("{CONCURRENT} identical POSTs with one Idempotency-Key, at the same moment:");
    let barrier = Arc::new(tokio::sync::Barrier::new(CONCURRENT));
    let mut requests = tokio::task::JoinSet::new();
    for _ in 0..CONCURRENT {
        let (barrier, send) = (
            barrier.clone(),
            post(Some("order-1"), Some("tenant-a"), 500),
        );
        requests.spawn(async move {
            barrier.wait().await;
            send.await
        });
    }
    let answers = requests.join_all().await;
    let count = |status: u16, replayed: bool| {
        answers
            .iter()
            .filter(|a| a.0 == status && a.1 == replayed)
            .count()
    };
    println!(
        "  201 Created                          {:>3}",
        count(201, false)
    );
    println!(
        "  201 Created, Idempotent-Replayed     {:>3}",
        count(201, true)
    );
    println!(
        "  409 Conflict (the first in flight)   {:>3}",
        count(409, false)
    );
    let created = answers
        .iter()
        .find(|a| a.0 == 201 && !a.1)
        .map(|a| a.2.clone());
    println!("  the payment: {}", created.unwrap_or_default());

    let mut outcomes = Vec::new();
    for (what, key, tenant, cents) in [
        (
            "a retry of it:                    ",
            Some("order-1"),
            "tenant-a",
            500,
        ),
        (
            "the same key, another amount:     ",
            Some("order-1"),
            "tenant-a",
            700,
        ),
        ("no Idempotency-Key:               ", None, "tenant-a", 500),
        (
            "the same key from another tenant: ",
            Some("order-1"),
            "tenant-b",
            500,
        ),
    ] {
        let (status, replayed, body) = post(key, Some(tenant), cents).await;
        println!("{what}     {status}{}  {body}", flag(replayed));
        outcomes.push((status, replayed));
    }

    let (payments, balance) = ledger().await;
    println!("\npayments recorded: {payments} (one per tenant's key); balance: {balance} cents");

    // The demo is a check too: it exits with an error unless each answer is the right one.
    let fresh = count(201, false);
    let expected = [
        (
            fresh == 1,
            "exactly one of the sixteen POSTs ran the payment",
        ),
        (
            fresh + count(201, true) + count(409, false) == CONCURRENT,
            "the others were replayed or in flight",
        ),
        (
            answers
                .iter()
                .filter(|a| a.0 == 201)
                .all(|a| a.2 == answers.iter().find(|a| a.0 == 201).unwrap().2),
            "every 201 carries the same payment",
        ),
        (
            outcomes == [(201, true), (422, false), (400, false), (201, false)],
            "the retry, the other amount, no key, the other tenant",
        ),
        (payments == 2, "two payments: one per tenant"),
    ];
    for (held, what) in expected {
        if !held {
            eprintln!("FAIL: {what}");
            std::process::exit(1);
        }
    }
}

fn flag(replayed: bool) -> &'static str {
    if replayed { " (replayed)" } else { "" }
}

/// A fresh database `name` on the PostgreSQL server at `url`; its URL.
#[cfg(feature = "postgres")]
fn fresh_postgres_database(url: &str, name: &str) -> String {
    use diesel::Connection;
    use diesel::connection::SimpleConnection;
    let mut admin =
        diesel::PgConnection::establish(url).unwrap_or_else(|e| panic!("connect to {url}: {e}"));
    admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .and_then(|()| admin.batch_execute(&format!("CREATE DATABASE {name}")))
        .unwrap_or_else(|e| panic!("create the database {name}: {e}"));
    support::with_database(url, name)
}
