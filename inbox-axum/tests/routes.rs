//! `inbox-axum` through a real router on SQLite (tower's `oneshot`): how keys are scoped by
//! route and path, an optional key, a body that fails, and the rows left behind.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use diesel::prelude::*;
use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use diesel_async::pooled_connection::bb8::Pool;
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use diesel_async::{RunQueryDsl, SimpleAsyncConnection};
use inbox_axum::{Error, Idempotent, MaybeIdempotent, Principal, Problem, Reply};
use inbox_diesel::guarded;
use inbox_diesel::handler::Handler;
use tower::ServiceExt;

type Conn = SyncConnectionWrapper<SqliteConnection>;

#[derive(Clone)]
struct App {
    pool: Pool<Conn>,
    runs: &'static AtomicUsize,
}

#[derive(serde::Deserialize)]
struct Note {
    text: String,
}

static NOTES: LazyLock<Handler> = LazyLock::new(|| Handler::new("notes").unwrap());

async fn add(State(app): State<App>, Path(list): Path<i64>, request: Idempotent<Note>) -> Response {
    let mut conn = app.pool.get().await.unwrap();
    let text = request.payload.text.clone();
    let runs = app.runs;
    request
        .run(
            &mut *conn,
            &NOTES,
            guarded!(async |tx: &mut Conn| {
                runs.fetch_add(1, Ordering::SeqCst);
                if text == "audit" {
                    // A helper that checks a connection out of a pool, as a guarded pool's `get()`
                    // does: refused inside the body, whose writes would not be the request's.
                    audit_elsewhere().map_err(Error::internal)?;
                }
                if text == "locked" {
                    // An answer that is not the request's last: not stored, the retry runs again.
                    return Err(Error::Respond(Problem::new(
                        StatusCode::LOCKED,
                        "list-locked",
                        "the list is being reordered",
                    )));
                }
                if text == "fail" {
                    diesel::sql_query(
                        "INSERT INTO notes (list, text) VALUES (0, 'written, then rolled back')",
                    )
                    .execute(tx)
                    .await?;
                    return Err(Error::internal("the body gave up"));
                }
                diesel::sql_query("INSERT INTO notes (list, text) VALUES (?, ?)")
                    .bind::<diesel::sql_types::BigInt, _>(list)
                    .bind::<diesel::sql_types::Text, _>(&text)
                    .execute(tx)
                    .await?;
                // A reply over what a key's stored reply may hold.
                let echo = match text.as_str() {
                    "huge" => "x".repeat(2 * inbox_diesel::MAX_STORED_RESULT_BYTES),
                    _ => text.clone(),
                };
                Reply::json(
                    StatusCode::CREATED,
                    &serde_json::json!({ "list": list, "text": echo }),
                )
            }),
        )
        .await
}

/// `POST /lists/{list}/clear`: no body, `Idempotent<()>`.
async fn clear(State(app): State<App>, Path(list): Path<i64>, request: Idempotent<()>) -> Response {
    let mut conn = app.pool.get().await.unwrap();
    request
        .run(
            &mut *conn,
            &NOTES,
            guarded!(async |tx: &mut Conn| {
                let n = diesel::sql_query("DELETE FROM notes WHERE list = ?")
                    .bind::<diesel::sql_types::BigInt, _>(list)
                    .execute(tx)
                    .await?;
                Reply::json(StatusCode::OK, &serde_json::json!({ "cleared": n }))
            }),
        )
        .await
}

/// What a pool wrapped by `inbox_diesel::tripwire` does first at each checkout.
fn audit_elsewhere() -> Result<(), inbox_diesel::tripwire::InsideHandler> {
    inbox_diesel::tripwire::refuse_checkout()
}

/// A route where the key is optional: without one, the note is added every time.
async fn add_maybe(State(app): State<App>, request: MaybeIdempotent<Note>) -> Response {
    let mut conn = app.pool.get().await.unwrap();
    let request = match request {
        MaybeIdempotent::Idempotent(request) => request,
        MaybeIdempotent::Plain(note) => {
            diesel::sql_query("INSERT INTO notes (list, text) VALUES (9, ?)")
                .bind::<diesel::sql_types::Text, _>(&note.text)
                .execute(&mut conn)
                .await
                .unwrap();
            return (StatusCode::ACCEPTED, "no key: not deduplicated").into_response();
        }
    };
    request
        .run(
            &mut *conn,
            &NOTES,
            guarded!(async |tx: &mut Conn| {
                diesel::sql_query("INSERT INTO notes (list, text) VALUES (9, 'maybe')")
                    .execute(tx)
                    .await?;
                Ok(Reply::empty(StatusCode::NO_CONTENT))
            }),
        )
        .await
}

async fn app(dir: &tempfile::TempDir, runs: &'static AtomicUsize) -> (Router, Pool<Conn>) {
    let path = dir.path().join("notes.sqlite").display().to_string();
    let pool = Pool::builder()
        .max_size(4)
        .build(AsyncDieselConnectionManager::<Conn>::new(path))
        .await
        .unwrap();
    let mut conn = pool.get().await.unwrap();
    let inbox = inbox_diesel::schema::Backend::Sqlite.create_table_with_sql(
        &inbox_diesel::InboxSchema::DEFAULT,
        inbox_diesel::schema::OptionalColumns {
            result: true,
            fingerprint: true,
            ..Default::default()
        },
    );
    conn.batch_execute(&inbox).await.unwrap();
    conn.batch_execute("CREATE TABLE notes (list BIGINT NOT NULL, text TEXT NOT NULL)")
        .await
        .unwrap();
    drop(conn);
    let router = Router::new()
        .route("/lists/{list}/notes", post(add).put(add))
        .route("/other/{list}/notes", post(add))
        .route("/maybe", post(add_maybe))
        .route("/lists/{list}/clear", post(clear))
        .layer(axum::Extension(Principal::shared()))
        .with_state(App {
            pool: pool.clone(),
            runs,
        });
    (router, pool)
}

fn note(path: &str, key: Option<&str>, text: &str) -> Request<Body> {
    let mut request = Request::post(path).header("content-type", "application/json");
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    request
        .body(Body::from(serde_json::json!({ "text": text }).to_string()))
        .unwrap()
}

async fn answer(router: &Router, request: Request<Body>) -> (StatusCode, bool, serde_json::Value) {
    use http_body_util::BodyExt;
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let replayed = response.headers().contains_key("idempotent-replayed");
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        replayed,
        serde_json::from_slice(&bytes).unwrap_or_default(),
    )
}

async fn rows(pool: &Pool<Conn>, sql: &str) -> i64 {
    #[derive(QueryableByName)]
    struct Count {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let mut conn = pool.get().await.unwrap();
    diesel::sql_query(sql)
        .get_result::<Count>(&mut conn)
        .await
        .unwrap()
        .n
}

#[tokio::test(flavor = "multi_thread")]
async fn a_key_is_scoped_by_the_route_and_method_and_fingerprinted_with_the_path() {
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let dir = tempfile::tempdir().unwrap();
    let (router, pool) = app(&dir, &RUNS).await;
    let first = answer(&router, note("/lists/1/notes", Some("k"), "milk")).await;
    assert_eq!((first.0, first.1), (StatusCode::CREATED, false));
    // The same key on another route pattern is another key.
    let other_route = answer(&router, note("/other/1/notes", Some("k"), "milk")).await;
    assert_eq!((other_route.0, other_route.1), (StatusCode::CREATED, false));
    // Another method on the same path is another route: another key, run.
    let mut put = note("/lists/1/notes", Some("k"), "milk");
    *put.method_mut() = axum::http::Method::PUT;
    let other_method = answer(&router, put).await;
    assert_eq!(
        (other_method.0, other_method.1),
        (StatusCode::CREATED, false)
    );
    // The same route pattern with another path is the same key, another request: 422.
    let other_list = answer(&router, note("/lists/2/notes", Some("k"), "milk")).await;
    assert_eq!(other_list.0, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(other_list.2["problem"], "idempotency-key-reused");
    // A query string is part of the request too.
    let with_query = answer(&router, note("/lists/1/notes?x=1", Some("k"), "milk")).await;
    assert_eq!(with_query.0, StatusCode::UNPROCESSABLE_ENTITY);
    let retry = answer(&router, note("/lists/1/notes", Some("k"), "milk")).await;
    assert_eq!(
        (retry.0, retry.1, &retry.2),
        (StatusCode::CREATED, true, &first.2)
    );
    assert_eq!(AtomicUsize::load(&RUNS, Ordering::SeqCst), 3);
    assert_eq!(rows(&pool, "SELECT count(*) AS n FROM notes").await, 3);
    // One marker per route, each with its reply and fingerprint.
    let stored = rows(
        &pool,
        "SELECT count(*) AS n FROM inbox WHERE result IS NOT NULL AND fingerprint IS NOT NULL",
    )
    .await;
    assert_eq!(stored, 3);
}

/// A reply over the stored reply's limit: nothing committed, a problem that names the cause
/// (before, a generic 500), the same on a retry.
#[tokio::test(flavor = "multi_thread")]
async fn a_reply_too_large_to_store_is_named_and_commits_nothing() {
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let dir = tempfile::tempdir().unwrap();
    let (router, pool) = app(&dir, &RUNS).await;
    for _ in 0..2 {
        let huge = answer(&router, note("/lists/1/notes", Some("big"), "huge")).await;
        assert_eq!(huge.0, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(huge.2["problem"], "reply-too-large", "{}", huge.2);
        assert_eq!(rows(&pool, "SELECT count(*) AS n FROM notes").await, 0);
        assert_eq!(rows(&pool, "SELECT count(*) AS n FROM inbox").await, 0);
    }
    assert_eq!(AtomicUsize::load(&RUNS, Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_body_that_fails_commits_nothing_and_its_retry_runs_it_again() {
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let dir = tempfile::tempdir().unwrap();
    let (router, pool) = app(&dir, &RUNS).await;
    for attempt in 1..=2 {
        let failed = answer(&router, note("/lists/1/notes", Some("k-fail"), "fail")).await;
        assert_eq!(failed.0, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(failed.2["problem"], "internal");
        assert_eq!(
            AtomicUsize::load(&RUNS, Ordering::SeqCst),
            attempt,
            "the retry ran the body again"
        );
    }
    assert_eq!(rows(&pool, "SELECT count(*) AS n FROM notes").await, 0);
    assert_eq!(rows(&pool, "SELECT count(*) AS n FROM inbox").await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_optional_key_is_none_without_the_header_and_still_checked_with_it() {
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let dir = tempfile::tempdir().unwrap();
    let (router, pool) = app(&dir, &RUNS).await;
    for _ in 0..2 {
        let without = answer(&router, note("/maybe", None, "x")).await;
        assert_eq!(without.0, StatusCode::ACCEPTED);
    }
    let bad = answer(&router, note("/maybe", Some("\"unterminated"), "x")).await;
    assert_eq!(bad.0, StatusCode::BAD_REQUEST);
    assert_eq!(bad.2["problem"], "idempotency-key-invalid");
    let first = answer(&router, note("/maybe", Some("m-1"), "x")).await;
    assert_eq!((first.0, first.1), (StatusCode::NO_CONTENT, false));
    let retry = answer(&router, note("/maybe", Some("m-1"), "x")).await;
    assert_eq!((retry.0, retry.1), (StatusCode::NO_CONTENT, true));
    // Twice without a key, once with one.
    assert_eq!(rows(&pool, "SELECT count(*) AS n FROM notes").await, 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_table_without_the_reply_columns_is_refused_before_anything_is_written() {
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bare.sqlite").display().to_string();
    let pool = Pool::builder()
        .build(AsyncDieselConnectionManager::<Conn>::new(path))
        .await
        .unwrap();
    let mut conn = pool.get().await.unwrap();
    conn.batch_execute(&inbox_diesel::schema::sqlite::create_table_sql(
        &inbox_diesel::InboxSchema::DEFAULT,
    ))
    .await
    .unwrap();
    conn.batch_execute("CREATE TABLE notes (list BIGINT NOT NULL, text TEXT NOT NULL)")
        .await
        .unwrap();
    drop(conn);
    let router = Router::new()
        .route("/lists/{list}/notes", post(add))
        .layer(axum::Extension(Principal::shared()))
        .with_state(App {
            pool: pool.clone(),
            runs: &RUNS,
        });
    let refused = answer(&router, note("/lists/1/notes", Some("k"), "milk")).await;
    assert_eq!(refused.0, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        AtomicUsize::load(&RUNS, Ordering::SeqCst),
        0,
        "the body never ran"
    );
    assert_eq!(rows(&pool, "SELECT count(*) AS n FROM notes").await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pool_checkout_in_the_body_is_refused_at_run_time_and_nothing_commits() {
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let dir = tempfile::tempdir().unwrap();
    let (router, pool) = app(&dir, &RUNS).await;
    // Outside a body, the checkout is allowed.
    audit_elsewhere().expect("no handler is running here");
    let refused = answer(&router, note("/lists/1/notes", Some("k-audit"), "audit")).await;
    assert_eq!(refused.0, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(AtomicUsize::load(&RUNS, Ordering::SeqCst), 1);
    assert_eq!(rows(&pool, "SELECT count(*) AS n FROM notes").await, 0);
    assert_eq!(rows(&pool, "SELECT count(*) AS n FROM inbox").await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_route_that_says_nothing_of_whose_keys_they_are_is_refused() {
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let dir = tempfile::tempdir().unwrap();
    let (_, pool) = app(&dir, &RUNS).await;
    let unscoped = Router::new()
        .route("/lists/{list}/notes", post(add))
        .with_state(App {
            pool: pool.clone(),
            runs: &RUNS,
        });
    let refused = answer(&unscoped, note("/lists/1/notes", Some("k"), "milk")).await;
    assert_eq!(refused.0, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(refused.2["problem"], "principal-missing");
    assert_eq!(AtomicUsize::load(&RUNS, Ordering::SeqCst), 0);
    assert_eq!(rows(&pool, "SELECT count(*) AS n FROM inbox").await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_answer_that_is_not_the_last_is_sent_not_stored() {
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let dir = tempfile::tempdir().unwrap();
    let (router, pool) = app(&dir, &RUNS).await;
    for attempt in 1..=2 {
        let locked = answer(&router, note("/lists/1/notes", Some("k-locked"), "locked")).await;
        assert_eq!((locked.0, locked.1), (StatusCode::LOCKED, false));
        assert_eq!(locked.2["problem"], "list-locked");
        assert_eq!(AtomicUsize::load(&RUNS, Ordering::SeqCst), attempt);
    }
    assert_eq!(rows(&pool, "SELECT count(*) AS n FROM inbox").await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_post_without_a_body_and_a_key_with_parameters() {
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let dir = tempfile::tempdir().unwrap();
    let (router, _) = app(&dir, &RUNS).await;
    let clear = |key: &str| {
        Request::post("/lists/1/clear")
            .header("idempotency-key", key)
            .body(Body::empty())
            .unwrap()
    };
    let first = answer(&router, clear("\"c-1\";source=cli")).await;
    assert_eq!((first.0, first.1), (StatusCode::OK, false), "{first:?}");
    // The parameters are the field's: the same key without them.
    let retry = answer(&router, clear("c-1")).await;
    assert_eq!(
        (retry.0, retry.1, &retry.2),
        (StatusCode::OK, true, &first.2)
    );
}

fn raw(path: &str, key: &str, body: &str) -> Request<Body> {
    Request::post(path)
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(Body::from(body.to_owned()))
        .unwrap()
}

/// A client that builds its JSON again on each retry — other key order, other whitespace —
/// sends the same request: with `Fingerprinting::CanonicalJson` it is replayed; with the
/// default (the bytes as sent) it is another request under the key, 422. Another value is
/// another request either way.
#[tokio::test(flavor = "multi_thread")]
async fn canonical_json_fingerprints_see_through_key_order_and_whitespace() {
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let dir = tempfile::tempdir().unwrap();
    let (router, pool) = app(&dir, &RUNS).await;
    let canonical = router
        .clone()
        .layer(axum::Extension(inbox_axum::Fingerprinting::CanonicalJson));
    let first = answer(
        &canonical,
        raw("/lists/1/notes", "k", r#"{"text":"milk","n":1}"#),
    )
    .await;
    assert_eq!((first.0, first.1), (StatusCode::CREATED, false));
    for retry in [
        "{ \"n\": 1.0,\n  \"text\": \"milk\" }",
        r#"{"text":"milk","n":1}"#,
    ] {
        let again = answer(&canonical, raw("/lists/1/notes", "k", retry)).await;
        assert_eq!(
            (again.0, again.1, &again.2),
            (StatusCode::CREATED, true, &first.2),
            "{retry}"
        );
    }
    let other = answer(
        &canonical,
        raw("/lists/1/notes", "k", r#"{"n":1,"text":"eggs"}"#),
    )
    .await;
    assert_eq!(other.0, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(other.2["problem"], "idempotency-key-reused");
    // The default: the bytes as sent.
    let first = answer(
        &router,
        raw("/lists/2/notes", "j", r#"{"text":"milk","n":1}"#),
    )
    .await;
    assert_eq!(first.0, StatusCode::CREATED);
    let reordered = answer(
        &router,
        raw("/lists/2/notes", "j", r#"{"n":1,"text":"milk"}"#),
    )
    .await;
    assert_eq!(reordered.0, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(AtomicUsize::load(&RUNS, Ordering::SeqCst), 2);
    assert_eq!(rows(&pool, "SELECT count(*) AS n FROM notes").await, 2);
}

/// An error that ends a request, where the application installed no tracing subscriber:
/// written to standard error, never silent. Run in a child process of this test binary, so
/// that no other test's subscriber (or its absence) decides it: the child answers a route
/// without a `Principal` (500), one whose reply is over the stored limit (500) and a plain
/// route whose handler fails with its own `inbox_axum::Error` (500), with no subscriber; the parent reads what the child wrote. With a subscriber, nothing is written
/// there.
#[test]
fn a_failure_is_written_to_stderr_without_a_tracing_subscriber() {
    const CHILD: &str = "INBOX_AXUM_UNSEEN_CHILD";
    if std::env::var_os(CHILD).is_some() {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async {
            static RUNS: AtomicUsize = AtomicUsize::new(0);
            let dir = tempfile::tempdir().unwrap();
            let (router, pool) = app(&dir, &RUNS).await;
            let unscoped = Router::new()
                .route("/lists/{list}/notes", post(add))
                .with_state(App {
                    pool: pool.clone(),
                    runs: &RUNS,
                });
            let refused = answer(&unscoped, note("/lists/1/notes", Some("k"), "milk")).await;
            assert_eq!(refused.0, StatusCode::INTERNAL_SERVER_ERROR);
            let too_large = "x".repeat(inbox_diesel::MAX_STORED_RESULT_BYTES + 1);
            let refused = answer(&router, note("/lists/1/notes", Some("big"), &too_large)).await;
            assert_eq!(refused.0, StatusCode::INTERNAL_SERVER_ERROR);
            // A handler's own `inbox_axum::Error`, outside any key (a plain route, or the
            // keyless branch of `MaybeIdempotent`).
            let plain = Router::new().route(
                "/plain",
                post(async || -> Result<(), inbox_axum::Error> {
                    Err(inbox_axum::Error::internal("the mail server refused"))
                }),
            );
            let refused = answer(&plain, note("/plain", None, "milk")).await;
            assert_eq!(refused.0, StatusCode::INTERNAL_SERVER_ERROR);
            // With a subscriber, the event is the record: nothing more on stderr.
            let subscriber = tracing_subscriber::fmt()
                .with_writer(std::io::sink)
                .finish();
            let _quiet = tracing::subscriber::set_default(subscriber);
            let refused = answer(&unscoped, note("/lists/2/notes", Some("q"), "milk")).await;
            assert_eq!(refused.0, StatusCode::INTERNAL_SERVER_ERROR);
        });
        return;
    }
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_failure_is_written_to_stderr_without_a_tracing_subscriber",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&child.stderr);
    assert!(child.status.success(), "{stderr}");
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("inbox: "))
        .collect();
    assert_eq!(lines.len(), 3, "{stderr}");
    assert!(lines[0].contains("without a Principal"), "{stderr}");
    assert!(lines[1].contains("over the"), "{stderr}");
    assert!(lines[2].contains("the mail server refused"), "{stderr}");
}

/// Whether the body ran in this call, from the response's extensions (`Processed`): what
/// follows a commit — a job handed to a queue — runs on the first request only, not on its
/// replay or on a failure.
#[tokio::test(flavor = "multi_thread")]
async fn the_response_says_whether_the_body_ran() {
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let dir = tempfile::tempdir().unwrap();
    let (router, _pool) = app(&dir, &RUNS).await;
    async fn ran(router: &Router, request: Request<Body>) -> (StatusCode, bool) {
        let response = router.clone().oneshot(request).await.unwrap();
        let processed = response.extensions().get::<inbox_axum::Processed>();
        (response.status(), processed.is_some())
    }
    let first = ran(&router, note("/lists/1/notes", Some("k-ran"), "first")).await;
    assert_eq!(first, (StatusCode::CREATED, true));
    let replay = ran(&router, note("/lists/1/notes", Some("k-ran"), "first")).await;
    assert_eq!(replay, (StatusCode::CREATED, false));
    let failed = ran(&router, note("/lists/1/notes", Some("k-fail"), "fail")).await;
    assert_eq!(failed, (StatusCode::INTERNAL_SERVER_ERROR, false));
    assert_eq!(AtomicUsize::load(&RUNS, Ordering::SeqCst), 2);
}
