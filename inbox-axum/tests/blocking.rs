//! `Idempotent::run_blocking`: a synchronous diesel application (an r2d2 pool of
//! `SqliteConnection`s) behind a real server, called by a real client — each request's
//! transaction run in `spawn_blocking`, the rows it leaves counted.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::r2d2::{ConnectionManager, Pool};
use inbox_axum::{Error, Idempotent, Principal, Reply};
use inbox_diesel::guarded;
use inbox_diesel::handler::Handler;

type DbPool = Pool<ConnectionManager<SqliteConnection>>;

diesel::table! {
    transfers (id) {
        id -> Integer,
        cents -> BigInt,
    }
}

#[derive(serde::Deserialize)]
struct Transfer {
    cents: i64,
}

static TRANSFERS: LazyLock<Handler> = LazyLock::new(|| Handler::new("transfers").unwrap());

#[derive(Clone)]
struct App {
    pool: DbPool,
    /// How many times a body ran.
    runs: &'static AtomicUsize,
}

async fn create(State(App { pool, runs }): State<App>, request: Idempotent<Transfer>) -> Response {
    tokio::task::spawn_blocking(move || {
        let mut conn = match pool.get() {
            Ok(conn) => conn,
            Err(e) => return inbox_axum::unavailable(e),
        };
        let cents = request.payload.cents;
        request.run_blocking(
            &mut *conn,
            &TRANSFERS,
            guarded!(|tx: &mut SqliteConnection| {
                runs.fetch_add(1, Ordering::SeqCst);
                let id: i32 = diesel::insert_into(transfers::table)
                    .values(transfers::cents.eq(cents))
                    .returning(transfers::id)
                    .get_result(tx)?;
                if cents == 13 {
                    // The application's own `expect` on a row that is not there.
                    panic!("no account for a transfer of 13");
                }
                if cents < 0 {
                    // Written, then rolled back with the request's transaction.
                    return Err(Error::internal("a transfer cannot be negative"));
                }
                Reply::json(
                    StatusCode::CREATED,
                    &serde_json::json!({ "id": id, "cents": cents }),
                )
            }),
        )
    })
    .await
    .unwrap_or_else(|e| inbox_axum::Error::internal(e).into_response())
}

fn count(pool: &DbPool, sql: &str) -> i64 {
    #[derive(QueryableByName)]
    struct Count {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    diesel::sql_query(sql)
        .get_result::<Count>(&mut pool.get().unwrap())
        .unwrap()
        .n
}

/// The server on a port of its own; its state and address.
async fn serve(dir: &tempfile::TempDir) -> (App, String) {
    let path = dir.path().join("transfers.sqlite").display().to_string();
    let pool = Pool::builder()
        .max_size(4)
        .build(ConnectionManager::<SqliteConnection>::new(path))
        .unwrap();
    let inbox = inbox_diesel::schema::Backend::Sqlite.create_table_with_sql(
        &inbox_diesel::InboxSchema::DEFAULT,
        inbox_diesel::schema::OptionalColumns {
            result: true,
            fingerprint: true,
            ..Default::default()
        },
    );
    pool.get()
        .unwrap()
        .batch_execute(&format!(
            "PRAGMA journal_mode = WAL; {inbox}; \
             CREATE TABLE transfers (id INTEGER PRIMARY KEY, cents BIGINT NOT NULL)"
        ))
        .unwrap();
    let router = Router::new()
        .route("/transfers", post(create))
        .layer(axum::Extension(Principal::shared()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    let app = App {
        pool,
        runs: Box::leak(Box::new(AtomicUsize::new(0))),
    };
    let router = router.with_state(app.clone());
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    (app, address)
}

async fn post_transfer(
    client: &reqwest::Client,
    address: &str,
    key: &str,
    cents: i64,
) -> (StatusCode, bool, serde_json::Value) {
    let response = client
        .post(format!("{address}/transfers"))
        .header("idempotency-key", key)
        .json(&serde_json::json!({ "cents": cents }))
        .send()
        .await
        .unwrap();
    let status = StatusCode::from_u16(response.status().as_u16()).unwrap();
    let replayed = response.headers().contains_key("idempotent-replayed");
    (status, replayed, response.json().await.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_synchronous_application_answers_once_and_replays() {
    let dir = tempfile::tempdir().unwrap();
    let (app, address) = serve(&dir).await;
    let client = reqwest::Client::new();

    let (status, replayed, first) = post_transfer(&client, &address, "t-1", 250).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, false), "{first}");
    let (status, replayed, again) = post_transfer(&client, &address, "t-1", 250).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, true));
    assert_eq!(again, first, "the stored reply, not a second transfer");

    // The same key with another body: refused, nothing run.
    let (status, _, problem) = post_transfer(&client, &address, "t-1", 999).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{problem}");

    // A body that fails: its write rolled back with the key, and the retry runs it again.
    let (status, _, _) = post_transfer(&client, &address, "t-2", -5).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    let (status, _, _) = post_transfer(&client, &address, "t-2", -5).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);

    assert_eq!(count(&app.pool, "SELECT count(*) AS n FROM transfers"), 1);
    assert_eq!(
        count(&app.pool, "SELECT sum(cents) AS n FROM transfers"),
        250
    );
    assert_eq!(count(&app.pool, "SELECT count(*) AS n FROM inbox"), 1);
    assert_eq!(app.runs.load(Ordering::SeqCst), 3, "t-1 once, t-2 twice");
}

/// Eight clients send one key at once: SQLite takes one writer at a time, so one request
/// runs the body and the others wait for its commit and replay its reply.
#[tokio::test(flavor = "multi_thread")]
async fn concurrent_requests_with_one_key_run_it_once() {
    let dir = tempfile::tempdir().unwrap();
    let (app, address) = serve(&dir).await;
    let client = reqwest::Client::new();
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(8));
    let requests: Vec<_> = (0..8)
        .map(|_| {
            let (client, address, barrier) = (client.clone(), address.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                post_transfer(&client, &address, "t-concurrent", 70).await
            })
        })
        .collect();
    let mut answers = Vec::new();
    for request in requests {
        answers.push(request.await.unwrap());
    }
    let replayed = answers.iter().filter(|(_, replayed, _)| *replayed).count();
    assert!(
        answers
            .iter()
            .all(|(status, ..)| *status == StatusCode::CREATED),
        "{answers:?}"
    );
    assert_eq!(replayed, 7, "{answers:?}");
    assert!(answers.iter().all(|(_, _, body)| *body == answers[0].2));
    assert_eq!(
        count(
            &app.pool,
            "SELECT count(*) AS n FROM transfers WHERE cents = 70"
        ),
        1
    );
    assert_eq!(app.runs.load(Ordering::SeqCst), 1);
}

/// A body that panics (an application's `expect`): its transaction rolls back as the panic
/// unwinds, and the request is answered 500 — not 503, which would say it did not run and
/// invite the same panic again.
#[tokio::test(flavor = "multi_thread")]
async fn a_panicking_body_is_a_500_and_commits_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (app, address) = serve(&dir).await;
    let client = reqwest::Client::new();
    for _ in 0..2 {
        let (status, _, problem) = post_transfer(&client, &address, "t-13", 13).await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{problem}");
    }
    assert_eq!(count(&app.pool, "SELECT count(*) AS n FROM transfers"), 0);
    assert_eq!(count(&app.pool, "SELECT count(*) AS n FROM inbox"), 0);
    // The pool's connections are whole: the next request runs.
    let (status, replayed, _) = post_transfer(&client, &address, "t-14", 14).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, false));
}
