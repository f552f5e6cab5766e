//! The payments API example (`inbox-axum`), driven as its users drive it: through the real
//! router (tower's `oneshot`), through a real TCP server and HTTP client with concurrent
//! requests, and through a server process killed with SIGKILL in the middle of a request.
//! Every test checks the answers against the rows in the database.
//!
//! PostgreSQL at `INBOX_TEST_PG` (`.ci/run` sets it); the PostgreSQL tests fail, never skip,
//! without it.

#[path = "../payments_api/backends.rs"]
mod backends;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use tower::ServiceExt;

const CONCURRENT: usize = 16;
const AMOUNT: i64 = 500;

/// One answer, as a client sees it.
#[derive(Debug, Clone)]
struct Answer {
    status: StatusCode,
    replayed: bool,
    content_type: String,
    retry_after: bool,
    body: serde_json::Value,
}

impl Answer {
    fn problem(&self) -> &str {
        assert_eq!(self.content_type, "application/problem+json", "{self:?}");
        self.body["problem"].as_str().expect("a problem member")
    }
}

fn post(key: Option<&str>, tenant: Option<&str>, cents: i64) -> Request<Body> {
    let mut request =
        Request::post("/accounts/1/payments").header("content-type", "application/json");
    if let Some(key) = key {
        request = request.header("idempotency-key", format!("\"{key}\""));
    }
    if let Some(tenant) = tenant {
        request = request.header("x-tenant", tenant);
    }
    request
        .body(Body::from(
            serde_json::json!({ "amount_cents": cents }).to_string(),
        ))
        .expect("a request")
}

async fn oneshot(router: &axum::Router, request: Request<Body>) -> Answer {
    let response = router.clone().oneshot(request).await.expect("infallible");
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("the body")
        .to_bytes();
    Answer {
        status,
        replayed: headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true"),
        content_type: header(&headers, "content-type"),
        retry_after: headers.contains_key("retry-after"),
        body: serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
    }
}

fn header(headers: &axum::http::HeaderMap, name: &str) -> String {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

/// A POST over HTTP, with `reqwest`.
async fn send(
    client: &reqwest::Client,
    addr: SocketAddr,
    key: &str,
    cents: i64,
) -> reqwest::Result<Answer> {
    let response = client
        .post(format!("http://{addr}/accounts/1/payments"))
        .header("idempotency-key", format!("\"{key}\""))
        .json(&serde_json::json!({ "amount_cents": cents }))
        .send()
        .await?;
    let status = StatusCode::from_u16(response.status().as_u16()).expect("a status");
    let replayed = response
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true");
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let retry_after = response.headers().contains_key("retry-after");
    let body = response.json().await.unwrap_or(serde_json::Value::Null);
    Ok(Answer {
        status,
        replayed,
        content_type,
        retry_after,
        body,
    })
}

/// Sixteen identical POSTs over TCP, released together: one payment, one fresh 201, and the
/// first's answer replayed (or 409 while it is in flight) to the others.
async fn sixteen_identical_posts(addr: SocketAddr) -> Vec<Answer> {
    let client = reqwest::Client::new();
    let barrier = Arc::new(tokio::sync::Barrier::new(CONCURRENT));
    let mut requests = tokio::task::JoinSet::new();
    for _ in 0..CONCURRENT {
        let (client, barrier) = (client.clone(), barrier.clone());
        requests.spawn(async move {
            barrier.wait().await;
            send(&client, addr, "order-16", AMOUNT)
                .await
                .expect("an answer")
        });
    }
    requests.join_all().await
}

fn check_sixteen(answers: &[Answer], ledger: (i64, i64)) {
    let fresh: Vec<_> = answers
        .iter()
        .filter(|a| a.status == StatusCode::CREATED && !a.replayed)
        .collect();
    assert_eq!(fresh.len(), 1, "one request ran the payment: {answers:#?}");
    let payment = &fresh[0].body;
    for answer in answers {
        match (answer.status, answer.replayed) {
            (StatusCode::CREATED, _) => assert_eq!(&answer.body, payment, "the same payment"),
            (StatusCode::CONFLICT, false) => {
                assert_eq!(answer.problem(), "request-in-flight");
                assert!(answer.retry_after, "409 says when to retry");
            }
            other => panic!("an answer no retry should get: {other:?} {answer:?}"),
        }
    }
    assert_eq!(
        ledger,
        (1, backends::sqlite::OPENING_BALANCE_CENTS - AMOUNT)
    );
}

async fn serve(router: axum::Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let addr = listener.local_addr().expect("its address");
    tokio::spawn(axum::serve(listener, router).into_future());
    addr
}

/// What every backend must answer the same way, through `oneshot`.
macro_rules! router_answers {
    ($app:path, $router:expr, $db:expr) => {{
        use $app as app;
        let router = $router;
        // No key: 400, problem+json, and nothing ran.
        let missing = oneshot(&router, post(None, None, AMOUNT)).await;
        assert_eq!(missing.status, StatusCode::BAD_REQUEST);
        assert_eq!(missing.problem(), "idempotency-key-missing");
        // A key that cannot be one: 400 before the body is read.
        let long = "k".repeat(inbox_axum::MAX_KEY_LEN + 1);
        let invalid = oneshot(&router, post(Some(&long), None, AMOUNT)).await;
        assert_eq!(invalid.problem(), "idempotency-key-invalid");
        // Neither JSON nor a form: 415; broken JSON: 400; JSON that is not a payment: 422.
        let text = Request::post("/accounts/1/payments")
            .header("idempotency-key", "k-text")
            .header("content-type", "text/plain")
            .body(Body::from("500"))
            .unwrap();
        assert_eq!(oneshot(&router, text).await.problem(), "body-type-unsupported");
        let broken = Request::post("/accounts/1/payments")
            .header("idempotency-key", "k-broken")
            .header("content-type", "application/json")
            .body(Body::from("{\"amount_cents\":"))
            .unwrap();
        assert_eq!(oneshot(&router, broken).await.problem(), "body-malformed");
        let wrong = Request::post("/accounts/1/payments")
            .header("idempotency-key", "k-wrong")
            .header("content-type", "application/json")
            .body(Body::from("{\"amount\":5}"))
            .unwrap();
        assert_eq!(oneshot(&router, wrong).await.problem(), "body-invalid");
        assert_eq!(app::ledger(&$db).await, (0, app::OPENING_BALANCE_CENTS));

        // The first request: 201 with Location, not replayed.
        let first = oneshot(&router, post(Some("k-1"), Some("tenant-a"), AMOUNT)).await;
        assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
        assert!(!first.replayed);
        let id = first.body["id"].as_i64().expect("the payment's id");
        // A retry: the same answer, replayed; the key in its bare form is the same key.
        let bare = Request::post("/accounts/1/payments")
            .header("idempotency-key", "k-1")
            .header("x-tenant", "tenant-a")
            .header("content-type", "application/json")
            .body(Body::from(serde_json::json!({ "amount_cents": AMOUNT }).to_string()))
            .unwrap();
        let retry = oneshot(&router, bare).await;
        assert_eq!((retry.status, retry.replayed), (StatusCode::CREATED, true));
        assert_eq!(retry.body, first.body);
        // Another amount under the key: 422, from the committed key's fingerprint.
        let reused = oneshot(&router, post(Some("k-1"), Some("tenant-a"), AMOUNT + 1)).await;
        assert_eq!(reused.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(reused.problem(), "idempotency-key-reused");
        // The key from another tenant, and the key without a tenant: other keys.
        let b = oneshot(&router, post(Some("k-1"), Some("tenant-b"), AMOUNT)).await;
        assert_eq!((b.status, b.replayed), (StatusCode::CREATED, false));
        assert_ne!(b.body["id"].as_i64(), Some(id));
        let anonymous = oneshot(&router, post(Some("k-1"), None, AMOUNT)).await;
        assert_eq!((anonymous.status, anonymous.replayed), (StatusCode::CREATED, false));
        assert_eq!(app::ledger(&$db).await, (3, app::OPENING_BALANCE_CENTS - 3 * AMOUNT));

        // A refusal of the business rules is the request's answer: committed and replayed,
        // even once the account could pay.
        let too_much = app::OPENING_BALANCE_CENTS;
        let refused = oneshot(&router, post(Some("k-big"), None, too_much)).await;
        assert_eq!(refused.status, StatusCode::PAYMENT_REQUIRED);
        assert_eq!(refused.body["error"], "insufficient funds");
        let again = oneshot(&router, post(Some("k-big"), None, too_much)).await;
        assert_eq!((again.status, again.replayed), (StatusCode::PAYMENT_REQUIRED, true));
        assert_eq!(app::ledger(&$db).await, (3, app::OPENING_BALANCE_CENTS - 3 * AMOUNT));
        // The stored row is readable JSON: status, marked headers, body.
        let location = format!("/payments/{id}");
        let get = oneshot(&router, Request::get(location.as_str()).body(Body::empty()).unwrap()).await;
        assert_eq!(get.body, first.body);
    }};
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("a runtime")
}

mod sqlite {
    use super::*;
    use backends::sqlite as app;

    async fn fresh(dir: &tempfile::TempDir) -> (app::Db, String) {
        let path = dir.path().join("payments.sqlite").display().to_string();
        let db = app::pool(&path, 8).await;
        app::create_schema(&db).await;
        (db, path)
    }

    #[test]
    fn the_router_answers_each_case_as_the_draft_says() {
        runtime().block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let (db, _) = fresh(&dir).await;
            router_answers!(backends::sqlite, app::router(db.clone()), db);
        });
    }

    #[test]
    fn sixteen_concurrent_identical_posts_create_one_payment() {
        runtime().block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let (db, _) = fresh(&dir).await;
            let addr = serve(app::router(db.clone())).await;
            let answers = sixteen_identical_posts(addr).await;
            check_sixteen(&answers, app::ledger(&db).await);
        });
    }

    #[test]
    fn a_server_killed_once_the_payment_committed_replays_it_to_the_retry() {
        let dir = tempfile::tempdir().unwrap();
        let rt = runtime();
        let (db, path) = rt.block_on(fresh(&dir));
        killed_after_commit(&rt, "sqlite", &path, || rt.block_on(app::ledger(&db)));
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;
    use backends::postgres as app;
    use diesel::Connection;
    use diesel::connection::SimpleConnection;

    /// A fresh database of its own on the test server, with the API's tables.
    async fn fresh(name: &str) -> (app::Db, String) {
        let server = std::env::var("INBOX_TEST_PG")
            .expect("INBOX_TEST_PG: the PostgreSQL server of the payments API tests");
        let mut admin = diesel::PgConnection::establish(&server).expect("connect");
        admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .unwrap();
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .unwrap();
        let url = inbox_examples::support::with_database(&server, name);
        let db = app::pool(&url, 8).await;
        app::create_schema(&db).await;
        (db, url)
    }

    #[test]
    fn the_router_answers_each_case_as_the_draft_says() {
        runtime().block_on(async {
            let (db, _) = fresh("payments_api_router").await;
            router_answers!(backends::postgres, app::router(db.clone()), db);
        });
    }

    #[test]
    fn sixteen_concurrent_identical_posts_create_one_payment() {
        runtime().block_on(async {
            let (db, _) = fresh("payments_api_sixteen").await;
            let addr = serve(app::router(db.clone())).await;
            let answers = sixteen_identical_posts(addr).await;
            check_sixteen(&answers, app::ledger(&db).await);
        });
    }

    /// Another amount under a key whose first request is still in flight: 409 while it
    /// is, then 422 — never processed, never answered with the first's response.
    #[test]
    fn another_amount_under_a_key_in_flight_is_never_processed() {
        runtime().block_on(async {
            let (db, url) = fresh("payments_api_reuse_in_flight").await;
            let addr = serve(app::router(db.clone())).await;
            let client = reqwest::Client::new();
            // Hold the account's row: the first request's body waits on it, inside its
            // transaction, with its key's marker inserted.
            let mut locker = diesel::PgConnection::establish(&url).unwrap();
            locker
                .batch_execute("BEGIN; SELECT * FROM accounts WHERE id = 1 FOR UPDATE;")
                .unwrap();
            let first = tokio::spawn({
                let client = client.clone();
                async move { send(&client, addr, "k-held", AMOUNT).await }
            });
            wait_for_a_lock_wait(&url);
            let other = send(&client, addr, "k-held", AMOUNT + 1).await.unwrap();
            assert_eq!(other.status, StatusCode::CONFLICT, "{other:?}");
            assert_eq!(other.problem(), "request-in-flight");
            locker.batch_execute("COMMIT").unwrap();
            let first = first.await.unwrap().unwrap();
            assert_eq!((first.status, first.replayed), (StatusCode::CREATED, false));
            let other = send(&client, addr, "k-held", AMOUNT + 1).await.unwrap();
            assert_eq!(other.problem(), "idempotency-key-reused");
            assert_eq!(
                app::ledger(&db).await,
                (1, app::OPENING_BALANCE_CENTS - AMOUNT)
            );
        });
    }

    #[test]
    fn a_server_killed_once_the_payment_committed_replays_it_to_the_retry() {
        let rt = runtime();
        let (db, url) = rt.block_on(fresh("payments_api_kill_after"));
        killed_after_commit(&rt, "postgres", &url, || rt.block_on(app::ledger(&db)));
    }

    /// SIGKILL while the payment's transaction is open — its marker and payment inserted,
    /// its debit waiting on a row lock: nothing commits, and the retry pays once.
    #[test]
    fn a_server_killed_inside_the_payments_transaction_pays_once_on_the_retry() {
        let rt = runtime();
        let (db, url) = rt.block_on(fresh("payments_api_kill_inside"));
        let ledger = || rt.block_on(app::ledger(&db));
        let mut locker = diesel::PgConnection::establish(&url).unwrap();
        locker
            .batch_execute("BEGIN; SELECT * FROM accounts WHERE id = 1 FOR UPDATE;")
            .unwrap();
        let mut server = Server::start("postgres", &url);
        let addr = server.addr;
        let pending =
            rt.spawn(async move { send(&reqwest::Client::new(), addr, "k-killed", AMOUNT).await });
        wait_for_a_lock_wait(&url);
        server.kill();
        let lost = rt.block_on(pending).unwrap();
        assert!(lost.is_err(), "the killed server answered: {lost:?}");
        // The orphaned session finds its client gone when its statement returns, and rolls
        // back.
        locker.batch_execute("COMMIT").unwrap();
        let server = Server::start("postgres", &url);
        let retry = retry_past_in_flight(&rt, server.addr, "k-killed");
        assert_eq!(
            (retry.status, retry.replayed),
            (StatusCode::CREATED, false),
            "{retry:?}"
        );
        assert_eq!(ledger(), (1, app::OPENING_BALANCE_CENTS - AMOUNT));
        let again = rt
            .block_on(send(
                &reqwest::Client::new(),
                server.addr,
                "k-killed",
                AMOUNT,
            ))
            .unwrap();
        assert_eq!((again.status, again.replayed), (StatusCode::CREATED, true));
        assert_eq!(again.body, retry.body);
    }

    /// Waits until a session of the database at `url` waits for a lock.
    fn wait_for_a_lock_wait(url: &str) {
        use diesel::RunQueryDsl;
        let mut conn = diesel::PgConnection::establish(url).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            #[derive(diesel::QueryableByName)]
            struct Waiting {
                #[diesel(sql_type = diesel::sql_types::BigInt)]
                n: i64,
            }
            let waiting = diesel::sql_query(
                "SELECT count(*) AS n FROM pg_stat_activity
                 WHERE datname = current_database() AND wait_event_type = 'Lock'",
            )
            .get_result::<Waiting>(&mut conn)
            .unwrap();
            if waiting.n > 0 {
                return;
            }
            assert!(Instant::now() < deadline, "no request reached the held row");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The API served by a process of its own: this test binary, running
/// [`payments_api_server_for_the_kill_tests`], which a test kills with SIGKILL.
struct Server {
    child: Child,
    addr: SocketAddr,
}

impl Server {
    fn start(backend: &str, url: &str) -> Server {
        let mut child = Command::new(std::env::current_exe().expect("the test binary"))
            .args([
                "--ignored",
                "--exact",
                "payments_api_server_for_the_kill_tests",
                "--nocapture",
            ])
            .env("PAYMENTS_API_SERVER", format!("{backend} {url}"))
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the server process");
        let stdout = child.stdout.take().expect("its stdout");
        let mut lines = BufReader::new(stdout).lines();
        let addr = loop {
            let line = lines
                .next()
                .expect("the server process exited before listening")
                .expect("its output");
            if let Some(addr) = line.strip_prefix("payments API listening on ") {
                break addr.parse().expect("an address");
            }
        };
        // The rest of its output is not read; keep the pipe open so it never blocks.
        std::thread::spawn(move || lines.for_each(drop));
        Server { child, addr }
    }

    fn kill(&mut self) {
        self.child.kill().expect("SIGKILL the server");
        self.child.wait().expect("reap it");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Retries `key` until the answer is not 409 (the killed server's transaction may hold the
/// key a moment longer), for at most 30 seconds.
fn retry_past_in_flight(rt: &tokio::runtime::Runtime, addr: SocketAddr, key: &str) -> Answer {
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let answer = rt
            .block_on(send(&client, addr, key, AMOUNT))
            .expect("an answer");
        if answer.status != StatusCode::CONFLICT || Instant::now() > deadline {
            return answer;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// SIGKILL as soon as the payment is committed — between the commit and the response, or
/// just after it: the retry replays the committed response, and there is one payment.
fn killed_after_commit(
    rt: &tokio::runtime::Runtime,
    backend: &str,
    url: &str,
    ledger: impl Fn() -> (i64, i64),
) {
    let mut server = Server::start(backend, url);
    let addr = server.addr;
    let pending =
        rt.spawn(async move { send(&reqwest::Client::new(), addr, "k-commit", AMOUNT).await });
    let deadline = Instant::now() + Duration::from_secs(30);
    while ledger().0 == 0 {
        assert!(Instant::now() < deadline, "the payment never committed");
        std::thread::sleep(Duration::from_millis(1));
    }
    server.kill();
    // Answered or cut off: either way the retry must get the committed payment.
    let first = rt.block_on(pending).unwrap();
    let server = Server::start(backend, url);
    let retry = retry_past_in_flight(rt, server.addr, "k-commit");
    assert_eq!(
        (retry.status, retry.replayed),
        (StatusCode::CREATED, true),
        "{retry:?}"
    );
    if let Ok(first) = first {
        assert_eq!(first.body, retry.body);
    }
    let (payments, balance) = ledger();
    assert_eq!(payments, 1);
    assert_eq!(balance, backends::sqlite::OPENING_BALANCE_CENTS - AMOUNT);
}

/// The server of the kill tests, started by them in a process of its own
/// (`PAYMENTS_API_SERVER="<backend> <url>"`); it serves until killed.
#[test]
#[ignore = "the server process of the kill tests, which start it themselves"]
fn payments_api_server_for_the_kill_tests() {
    let Ok(spec) = std::env::var("PAYMENTS_API_SERVER") else {
        panic!("run by the kill tests, with PAYMENTS_API_SERVER set");
    };
    let (backend, url) = spec.split_once(' ').expect("<backend> <url>");
    runtime().block_on(async {
        let router = match backend {
            "sqlite" => backends::sqlite::router(backends::sqlite::pool(url, 8).await),
            #[cfg(feature = "postgres")]
            "postgres" => backends::postgres::router(backends::postgres::pool(url, 8).await),
            other => panic!("no backend {other}"),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        println!(
            "payments API listening on {}",
            listener.local_addr().unwrap()
        );
        axum::serve(listener, router).await.unwrap();
    });
}
