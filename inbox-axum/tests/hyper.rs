//! `Incoming`: a route of another framework — a plain `hyper` service, no axum router —
//! behind a real server, called by a real client. The request is made an `Idempotent` by
//! hand from what the framework hands over; the rows it leaves are counted.

use std::convert::Infallible;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::response::IntoResponse;
use diesel::prelude::*;
use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use diesel_async::pooled_connection::bb8::Pool;
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use diesel_async::{RunQueryDsl, SimpleAsyncConnection};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use inbox_axum::http::StatusCode;
use inbox_axum::{Incoming, Principal, Reply};
use inbox_diesel::guarded;
use inbox_diesel::handler::Handler;

type Conn = SyncConnectionWrapper<SqliteConnection>;

diesel::table! {
    orders (id) {
        id -> Integer,
        item -> Text,
    }
}

#[derive(serde::Deserialize)]
struct Order {
    item: String,
}

static ORDERS: LazyLock<Handler> = LazyLock::new(|| Handler::new("orders").unwrap());

/// How many times a body ran.
static RUNS: AtomicUsize = AtomicUsize::new(0);

fn runs() -> usize {
    // Not `RUNS.load`: diesel-async's `RunQueryDsl::load` is in scope too.
    AtomicUsize::load(&RUNS, Ordering::SeqCst)
}

/// The route: `POST /tenants/{tenant}/orders`, the tenant the principal.
async fn route(
    pool: Pool<Conn>,
    request: hyper::Request<hyper::body::Incoming>,
) -> Result<hyper::Response<Full<Bytes>>, Infallible> {
    let (parts, body) = request.into_parts();
    let tenant = parts.uri.path().split('/').nth(2).unwrap_or("").to_owned();
    let path_and_query = parts
        .uri
        .path_and_query()
        .map_or("/", |pq| pq.as_str())
        .to_owned();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let answer = async {
        let principal = match Principal::new(tenant) {
            Ok(principal) => principal,
            Err(e) => return inbox_axum::Error::internal(e).into_response(),
        };
        let request = Incoming::new(
            parts.method.as_str(),
            "/tenants/{tenant}/orders",
            &path_and_query,
        )
        .idempotency_key(
            parts
                .headers
                .get_all("idempotency-key")
                .iter()
                .map(|v| v.as_bytes()),
        )
        .content_type(
            parts
                .headers
                .get("content-type")
                .and_then(|v| v.to_str().ok()),
        )
        .principal(principal)
        .idempotent::<Order>(&body);
        let request = match request {
            Ok(request) => request,
            Err(refused) => return refused.into_response(),
        };
        let mut conn = match pool.get().await {
            Ok(conn) => conn,
            Err(e) => return inbox_axum::unavailable(e),
        };
        let item = request.payload.item.clone();
        request
            .run(
                &mut *conn,
                &ORDERS,
                guarded!(async |tx: &mut Conn| {
                    RUNS.fetch_add(1, Ordering::SeqCst);
                    let id: i32 = diesel::insert_into(orders::table)
                        .values(orders::item.eq(&item))
                        .returning(orders::id)
                        .get_result(tx)
                        .await?;
                    // Long enough for a concurrent retry to arrive while this one is open.
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    Reply::json(StatusCode::CREATED, &serde_json::json!({ "id": id }))
                }),
            )
            .await
    }
    .await;
    // The answer in hyper's own terms, as another framework would take it.
    let answer = inbox_axum::Answer::of(answer).await.unwrap();
    let mut response = hyper::Response::new(Full::new(answer.body));
    *response.status_mut() = StatusCode::from_u16(answer.status).unwrap();
    for (name, value) in answer.headers {
        response.headers_mut().append(
            hyper::header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            hyper::header::HeaderValue::from_bytes(&value).unwrap(),
        );
    }
    Ok(response)
}

async fn serve(dir: &tempfile::TempDir) -> (Pool<Conn>, String) {
    let path = dir.path().join("orders.sqlite").display().to_string();
    let pool = Pool::builder()
        .max_size(4)
        .build(AsyncDieselConnectionManager::<Conn>::new(path))
        .await
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
        .await
        .unwrap()
        .batch_execute(&format!(
            "PRAGMA journal_mode = WAL; {inbox}; \
             CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL)"
        ))
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    let served = pool.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let pool = served.clone();
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |request| route(pool.clone(), request));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (pool, address)
}

async fn orders(pool: &Pool<Conn>) -> i64 {
    orders::table
        .count()
        .get_result(&mut pool.get().await.unwrap())
        .await
        .unwrap()
}

struct Answer {
    status: u16,
    replayed: bool,
    problem: Option<String>,
    body: serde_json::Value,
}

async fn post(client: &reqwest::Client, url: &str, keys: &[&str], body: &str, ct: &str) -> Answer {
    let mut request = client
        .post(url)
        .header("content-type", ct)
        .body(body.to_owned());
    for key in keys {
        request = request.header("idempotency-key", *key);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let replayed = response.headers().get("idempotent-replayed").is_some();
    let body: serde_json::Value = response.json().await.unwrap_or(serde_json::Value::Null);
    Answer {
        status,
        replayed,
        problem: body
            .get("problem")
            .and_then(|t| t.as_str())
            .map(str::to_owned),
        body,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hyper_route_answers_as_the_axum_extractor_does() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, address) = serve(&dir).await;
    let client = reqwest::Client::new();
    let acme = format!("{address}/tenants/acme/orders");
    let json = "application/json";

    let first = post(&client, &acme, &["k-1"], r#"{"item":"tea"}"#, json).await;
    assert_eq!(first.status, 201);
    assert!(!first.replayed);
    let again = post(&client, &acme, &["k-1"], r#"{"item":"tea"}"#, json).await;
    assert_eq!((again.status, again.replayed), (201, true));
    assert_eq!(again.body, first.body, "the stored reply, replayed");
    assert_eq!(orders(&pool).await, 1);

    // The same key with another body: 422, and nothing runs.
    let reused = post(&client, &acme, &["k-1"], r#"{"item":"coffee"}"#, json).await;
    assert_eq!(
        (reused.status, reused.problem.as_deref()),
        (422, Some("idempotency-key-reused"))
    );
    // The key is the tenant's: another tenant's k-1 is its own request.
    let other = format!("{address}/tenants/initech/orders");
    assert_eq!(
        post(&client, &other, &["k-1"], r#"{"item":"tea"}"#, json)
            .await
            .status,
        201
    );
    assert_eq!(orders(&pool).await, 2);

    // Refusals before any SQL, as problem+json.
    for (keys, body, ct, status, problem) in [
        (
            &[][..],
            r#"{"item":"tea"}"#,
            json,
            400,
            "idempotency-key-missing",
        ),
        (
            &["a", "b"][..],
            r#"{"item":"tea"}"#,
            json,
            400,
            "idempotency-key-invalid",
        ),
        (
            &[""][..],
            r#"{"item":"tea"}"#,
            json,
            400,
            "idempotency-key-invalid",
        ),
        (
            &["k-2"][..],
            "tea",
            "text/plain",
            415,
            "body-type-unsupported",
        ),
        (&["k-2"][..], r#"{"item":"#, json, 400, "body-malformed"),
        (&["k-2"][..], r#"{"thing":1}"#, json, 422, "body-invalid"),
    ] {
        let answer = post(&client, &acme, keys, body, ct).await;
        assert_eq!(
            (answer.status, answer.problem.as_deref()),
            (status, Some(problem)),
            "{keys:?} {body} {ct}"
        );
    }
    let long = "k".repeat(inbox_axum::MAX_KEY_LEN + 1);
    assert_eq!(
        post(&client, &acme, &[&long], r#"{"item":"tea"}"#, json)
            .await
            .status,
        400
    );
    // A form body is taken as under axum.
    let form = post(
        &client,
        &acme,
        &["k-3"],
        "item=cake",
        "application/x-www-form-urlencoded",
    )
    .await;
    assert_eq!(form.status, 201);
    assert_eq!(orders(&pool).await, 3);
    assert_eq!(runs(), 3);

    // Eight retries of one request at once: one runs, the others replay its reply.
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(8));
    let answers = futures_join(
        (0..8)
            .map(|_| {
                let (client, acme, barrier) = (client.clone(), acme.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    post(&client, &acme, &["k-4"], r#"{"item":"jam"}"#, json).await
                })
            })
            .collect(),
    )
    .await;
    assert_eq!(
        orders(&pool).await,
        4,
        "one order for eight concurrent retries"
    );
    assert_eq!(runs(), 4);
    let ran: Vec<&Answer> = answers.iter().filter(|a| !a.replayed).collect();
    assert_eq!(ran.len(), 1, "one request ran the body");
    for answer in &answers {
        assert_eq!(answer.status, 201);
        assert_eq!(
            answer.body, ran[0].body,
            "every retry answered with the reply that committed"
        );
    }
}

async fn futures_join(handles: Vec<tokio::task::JoinHandle<Answer>>) -> Vec<Answer> {
    let mut answers = Vec::new();
    for handle in handles {
        answers.push(handle.await.unwrap());
    }
    answers
}
