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
    count_on(&mut pool.get().unwrap(), sql)
}

fn count_on(conn: &mut SqliteConnection, sql: &str) -> i64 {
    #[derive(QueryableByName)]
    struct Count {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    diesel::sql_query(sql).get_result::<Count>(conn).unwrap().n
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

/// An HTML form's POST (`application/x-www-form-urlencoded`), as a browser or an API in
/// Stripe's style sends it: read as the payload, replayed under its key, another form under
/// the key refused; a body of another type is 415.
#[tokio::test(flavor = "multi_thread")]
async fn a_form_is_a_payload_like_json() {
    let dir = tempfile::tempdir().unwrap();
    let (app, address) = serve(&dir).await;
    let client = reqwest::Client::new();
    let post = |key: &'static str, form: &'static [(&'static str, &'static str)]| {
        client
            .post(format!("{address}/transfers"))
            .header("idempotency-key", key)
            .form(form)
            .send()
    };
    let first = post("f-1", &[("cents", "250")]).await.unwrap();
    assert_eq!(first.status().as_u16(), 201);
    let first: serde_json::Value = first.json().await.unwrap();
    let again = post("f-1", &[("cents", "250")]).await.unwrap();
    assert_eq!(again.status().as_u16(), 201);
    assert!(again.headers().contains_key("idempotent-replayed"));
    assert_eq!(again.json::<serde_json::Value>().await.unwrap(), first);
    let other = post("f-1", &[("cents", "999")]).await.unwrap();
    assert_eq!(other.status().as_u16(), 422);
    let invalid = post("f-2", &[("cents", "many")]).await.unwrap();
    assert_eq!(invalid.status().as_u16(), 422);
    let problem: serde_json::Value = invalid.json().await.unwrap();
    assert_eq!(problem["problem"], "body-invalid", "{problem}");
    let text = client
        .post(format!("{address}/transfers"))
        .header("idempotency-key", "f-3")
        .header("content-type", "text/plain")
        .body("cents=5")
        .send()
        .await
        .unwrap();
    assert_eq!(text.status().as_u16(), 415);
    let problem: serde_json::Value = text.json().await.unwrap();
    assert_eq!(problem["problem"], "body-type-unsupported", "{problem}");
    assert_eq!(count(&app.pool, "SELECT count(*) AS n FROM transfers"), 1);
    assert_eq!(app.runs.load(Ordering::SeqCst), 1);
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

/// Another service's outbox relayed to this server over HTTP: the side effect of a handler
/// that is not a broker's message — a call to an API that takes an `Idempotency-Key` — sent
/// by a [`Sink`] of the application's own, each message's outbox id as the key. A relay that
/// stalls after the server answered, past its lease, has its rows taken over and sent again
/// by a second relay: every transfer applied once, the second copies answered from the
/// stored replies.
mod relayed {
    use super::*;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
    use inbox_diesel::outbox::relay::{Outgoing, Relay, Sink, SinkError};
    use inbox_diesel::outbox::{Message, Outbox};
    use inbox_diesel::{MessageKey, idempotent};

    static OUTBOX: Outbox = Outbox::new("outbox");

    /// The ordering service: an order placed, the transfer it asks for written to the
    /// outbox in the same transaction.
    #[idempotent(consumer = "orders", key = key)]
    fn place(
        conn: &mut SqliteConnection,
        key: &MessageKey,
        cents: i64,
    ) -> Result<(), inbox_diesel::Error> {
        diesel::sql_query("INSERT INTO orders (cents) VALUES (?)")
            .bind::<diesel::sql_types::BigInt, _>(cents)
            .execute(conn)?;
        let body = serde_json::json!({ "cents": cents }).to_string();
        OUTBOX.publish(conn, Message::new("transfers", body))?;
        Ok(())
    }

    /// Each POST's key, status and whether it was a replay.
    type Posts = Arc<Mutex<Vec<(String, u16, bool)>>>;

    /// POSTs each message to `{base}/{destination}` with its outbox id as the
    /// `Idempotency-Key`; waits `stall` after the answer, as a relay whose process stalls
    /// before it marks the rows sent.
    struct HttpSink {
        client: reqwest::Client,
        base: String,
        stall: Duration,
        posts: Posts,
    }

    impl Sink for HttpSink {
        fn send(
            &mut self,
            message: &Outgoing,
        ) -> impl Future<Output = Result<(), SinkError>> + Send {
            let key = message.id.to_string();
            let request = self
                .client
                .post(format!("{}/{}", self.base, message.destination))
                .header("idempotency-key", &key)
                .header("content-type", "application/json")
                .body(message.payload.clone());
            let (stall, posts) = (self.stall, self.posts.clone());
            async move {
                let response = request
                    .send()
                    .await
                    .map_err(|e| SinkError::Unavailable(e.to_string()))?;
                let status = response.status();
                let replayed = response.headers().contains_key("idempotent-replayed");
                posts.lock().unwrap().push((key, status.as_u16(), replayed));
                tokio::time::sleep(stall).await;
                match status.as_u16() {
                    200..=299 => Ok(()),
                    // In flight under another request, overloaded, the server's own fault:
                    // later.
                    409 | 429 | 500..=599 => Err(SinkError::Unavailable(status.to_string())),
                    _ => Err(SinkError::Rejected(status.to_string())),
                }
            }
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_relay_taken_over_sends_again_and_the_server_applies_once() {
        let dir = tempfile::tempdir().unwrap();
        let (app, address) = serve(&dir).await;
        let orders = dir.path().join("orders.sqlite").display().to_string();
        let connect = || <SqliteConnection as diesel::Connection>::establish(&orders).unwrap();
        connect()
            .batch_execute(&format!(
                "PRAGMA journal_mode = WAL; {}; {}; CREATE TABLE orders (cents BIGINT NOT NULL)",
                inbox_diesel::schema::sqlite::create_table_sql(&inbox_diesel::InboxSchema::DEFAULT),
                OUTBOX.create_table_sql(inbox_diesel::schema::Backend::Sqlite),
            ))
            .unwrap();
        for n in 0..5 {
            let key = MessageKey::text(format!("order-{n}")).unwrap();
            assert!(place(&mut connect(), &key, 100 + n).unwrap().is_processed());
        }
        // A duplicate delivery of an order publishes nothing.
        let key = MessageKey::text("order-0").unwrap();
        assert!(place(&mut connect(), &key, 100).unwrap().is_duplicate());

        let posts = Posts::default();
        let sink = |stall| HttpSink {
            client: reqwest::Client::new(),
            base: address.clone(),
            stall,
            posts: posts.clone(),
        };
        let relay = Relay::new(OUTBOX).lease(Duration::from_millis(200));
        // The first relay stalls a second after each answer; the second claims the rows
        // once their lease has run out, and sends them again.
        let (mut stalled, mut other) = (sink(Duration::from_secs(1)), sink(Duration::ZERO));
        let (mut first_conn, mut second_conn) = (
            SyncConnectionWrapper::new(connect()),
            SyncConnectionWrapper::new(connect()),
        );
        let first = relay.run_once(&mut first_conn, &mut stalled);
        let second = async {
            tokio::time::sleep(Duration::from_millis(400)).await;
            relay.run_once(&mut second_conn, &mut other).await
        };
        let (first, second) = tokio::join!(first, second);
        let (first, second) = (first.unwrap(), second.unwrap());
        assert!(first.sent_unmarked >= 1, "{first:?}");
        assert!(second.sent >= 1, "{second:?}");
        // On a loaded machine a copy can meet its original in flight (409): the relay
        // pauses, and a later round sends what is left.
        let mut rounds = 0;
        while count_on(
            &mut connect(),
            "SELECT count(*) AS n FROM outbox WHERE sent_at IS NULL",
        ) > 0
        {
            rounds += 1;
            assert!(rounds < 50, "the outbox did not empty");
            tokio::time::sleep(Duration::from_millis(100)).await;
            relay.run_once(&mut second_conn, &mut other).await.unwrap();
        }

        let posts = posts.lock().unwrap().clone();
        assert!(
            posts
                .iter()
                .all(|(_, status, _)| [201, 409].contains(status)),
            "{posts:?}"
        );
        let posts: Vec<_> = posts.into_iter().filter(|p| p.1 == 201).collect();
        let keys: std::collections::BTreeSet<_> = posts.iter().map(|p| &p.0).collect();
        assert_eq!(keys.len(), 5, "{posts:?}");
        let fresh = posts.iter().filter(|(_, _, replayed)| !replayed).count();
        assert_eq!(
            fresh, 5,
            "each key answered fresh once, replayed after: {posts:?}"
        );
        assert!(posts.len() > 5, "{posts:?}");
        assert_eq!(count(&app.pool, "SELECT count(*) AS n FROM transfers"), 5);
        assert_eq!(
            count(&app.pool, "SELECT sum(cents) AS n FROM transfers"),
            100 + 101 + 102 + 103 + 104
        );
        assert_eq!(app.runs.load(Ordering::SeqCst), 5);
        assert_eq!(
            count_on(
                &mut connect(),
                "SELECT count(*) AS n FROM outbox WHERE sent_at IS NULL"
            ),
            0
        );
    }
}
