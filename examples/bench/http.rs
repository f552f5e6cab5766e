//! `--section http`: an `inbox-axum` route against the same route without it, over real HTTP
//! in the same run (issue #43).
//!
//! One axum server on 127.0.0.1, in process, with two routes that do the same business work
//! — the client's account read, updated, and a ledger entry inserted, on a diesel-async bb8
//! pool — and answer 201 with the same JSON:
//!
//! - `plain`: axum's `Json` extractor, the work in a transaction of its own, a `Json` answer;
//! - `inbox-axum`: the `Idempotent` extractor (the key, its scope, the request's fingerprint),
//!   the work run by `Idempotent::run` in one transaction with the key, the fingerprint and
//!   the stored `Reply`.
//!
//! Clients (reqwest, one client, keep-alive) post a JSON body of about 200 bytes with a fresh
//! `Idempotency-Key` each — the plain route ignores it, so both receive the same bytes — and
//! every answer is checked: a status other than 201, or a replay, ends the bench.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Instant;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Json, Router};
use bb8::ManageConnection;
use diesel::{ExpressionMethods, QueryDsl, QueryResult};
use diesel_async::pooled_connection::{
    AsyncDieselConnectionManager, PoolError, PoolableConnection,
};
use diesel_async::{AsyncConnection, RunQueryDsl};
use inbox_axum::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED, Idempotent, Principal, Reply};
use inbox_diesel::guarded;
use inbox_diesel::handler::Handler;
use serde::{Deserialize, Serialize};

use crate::measure::{KEPT, ROUNDS, key, median};
use crate::{accounts, ledger};

/// The clients of the section's rows: one, and the eight issue #43 names.
const CLIENTS: [usize; 2] = [1, 8];

/// What a client posts: a transfer to its own account (so that clients never wait on each
/// other's rows), about 200 bytes of JSON.
#[derive(Serialize, Deserialize)]
pub(crate) struct Transfer {
    account: i32,
    amount_cents: i64,
    currency: String,
    reference: String,
    counterparty: String,
    memo: String,
}

impl Transfer {
    fn of(client: usize) -> Self {
        Transfer {
            account: client as i32 + 1,
            amount_cents: 1_250,
            currency: "EUR".into(),
            reference: "invoice 2026-04-000123".into(),
            counterparty: "DE89 3704 0044 0532 0130 00".into(),
            memo: "Monthly subscription, April 2026: three seats, annual billing".into(),
        }
    }
}

/// What both routes answer with 201: about 100 bytes of JSON.
#[derive(Serialize)]
struct Posted<'a> {
    account: i32,
    amount_cents: i64,
    balance_cents: i64,
    reference: &'a str,
    status: &'static str,
}

impl<'a> Posted<'a> {
    fn of(transfer: &'a Transfer, balance_cents: i64) -> Self {
        Posted {
            account: transfer.account,
            amount_cents: transfer.amount_cents,
            balance_cents,
            reference: &transfer.reference,
            status: "settled",
        }
    }
}

/// A diesel-async connection the section runs on: the business work, on its own and in a
/// transaction of its own.
pub(crate) trait Bank:
    inbox_diesel::AsyncInboxConnection + PoolableConnection + 'static
{
    /// diesel-async's manager of these connections (`AsyncDieselConnectionManager<Self>`),
    /// named here so that code generic over the connection can check one out of a pool: the
    /// bounds under which it manages connections are not ones a connection's trait implies.
    type Manager: ManageConnection<Connection = Self, Error = PoolError>;

    /// The account's balance read, the account updated, a ledger entry inserted; the
    /// balance after.
    fn transfer(&mut self, transfer: &Transfer) -> impl Future<Output = QueryResult<i64>> + Send;

    /// [`transfer`](Self::transfer) in a transaction, as the application runs it without the
    /// inbox.
    fn transfer_alone(
        &mut self,
        transfer: &Transfer,
    ) -> impl Future<Output = QueryResult<i64>> + Send;

    /// The ledger's entries, and the keys the inbox-axum route stored.
    fn rows(&mut self) -> impl Future<Output = QueryResult<(i64, i64)>> + Send;
}

/// A pool of `C`s.
type Pool<C> = bb8::Pool<<C as Bank>::Manager>;

/// [`Bank`]'s manager, [`transfer`](Bank::transfer) and [`rows`](Bank::rows): the same on
/// every backend.
macro_rules! bank {
    () => {
        type Manager = AsyncDieselConnectionManager<Self>;

        async fn transfer(&mut self, transfer: &Transfer) -> QueryResult<i64> {
            let balance: i64 = accounts::table
                .find(transfer.account)
                .select(accounts::balance)
                .first(self)
                .await?;
            let after = balance + transfer.amount_cents;
            diesel::update(accounts::table.find(transfer.account))
                .set(accounts::balance.eq(after))
                .execute(self)
                .await?;
            diesel::insert_into(ledger::table)
                .values((
                    ledger::account_id.eq(transfer.account),
                    ledger::amount.eq(transfer.amount_cents),
                    ledger::balance.eq(after),
                ))
                .execute(self)
                .await?;
            Ok(after)
        }

        async fn rows(&mut self) -> QueryResult<(i64, i64)> {
            let entries = ledger::table.count().get_result(self).await?;
            let keys = diesel::sql_query(format!(
                "SELECT count(*) AS n FROM {} WHERE consumer = '{}'",
                KEPT.table(),
                TRANSFERS.consumer()
            ))
            .get_result::<Count>(self)
            .await?;
            Ok((entries, keys.n))
        }
    };
}

type SqliteConn =
    diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>;

impl Bank for SqliteConn {
    bank!();

    /// `BEGIN IMMEDIATE`, as the inbox's own transactions begin on SQLite: a transaction that
    /// reads before it writes, begun deferred, fails with `SQLITE_BUSY` when another writer
    /// commits in between, where an immediate one waits for the write lock.
    async fn transfer_alone(&mut self, transfer: &Transfer) -> QueryResult<i64> {
        use diesel_async::TransactionManager;
        type Transactions = <SqliteConn as AsyncConnection>::TransactionManager;
        self.spawn_blocking(|c| {
            diesel::connection::AnsiTransactionManager::begin_transaction_sql(c, "BEGIN IMMEDIATE")
        })
        .await?;
        match self.transfer(transfer).await {
            Ok(after) => Transactions::commit_transaction(self).await.map(|()| after),
            Err(e) => {
                Transactions::rollback_transaction(self).await?;
                Err(e)
            }
        }
    }
}

/// diesel-async's `transaction`: `BEGIN`, the body, `COMMIT`.
macro_rules! transfer_alone {
    () => {
        async fn transfer_alone(&mut self, transfer: &Transfer) -> QueryResult<i64> {
            self.transaction(async |c| c.transfer(transfer).await).await
        }
    };
}

#[cfg(feature = "postgres")]
impl Bank for diesel_async::AsyncPgConnection {
    bank!();
    transfer_alone!();
}

#[cfg(feature = "mysql")]
impl Bank for diesel_async::AsyncMysqlConnection {
    bank!();
    transfer_alone!();
}

/// The inbox-axum route's keys: on the table with the `result` and `fingerprint` columns.
static TRANSFERS: LazyLock<Handler> = LazyLock::new(|| {
    Handler::new("http-bench")
        .expect("a valid consumer name")
        .schema(KEPT)
});

/// `POST /plain/transfers`: the work in a transaction, a `Json` answer.
async fn plain<C: Bank>(State(pool): State<Pool<C>>, Json(transfer): Json<Transfer>) -> Response {
    let mut conn = match pool.get().await {
        Ok(conn) => conn,
        Err(e) => return (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
    };
    match conn.transfer_alone(&transfer).await {
        Ok(after) => (StatusCode::CREATED, Json(Posted::of(&transfer, after))).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// `POST /keyed/transfers`: the same work through inbox-axum, its reply stored with the key
/// and the request's fingerprint.
async fn keyed<C: Bank>(State(pool): State<Pool<C>>, request: Idempotent<Transfer>) -> Response {
    let mut conn = match pool.get().await {
        Ok(conn) => conn,
        Err(e) => return inbox_axum::unavailable(e),
    };
    let transfer = &request.payload;
    request
        .run(
            &mut *conn,
            &TRANSFERS,
            guarded!(async |tx: &mut C| {
                let after = tx.transfer(transfer).await?;
                Reply::json(StatusCode::CREATED, &Posted::of(transfer, after))
            }),
        )
        .await
}

fn router<C: Bank>(pool: Pool<C>) -> Router {
    Router::new()
        .route("/plain/transfers", post(plain::<C>))
        .route("/keyed/transfers", post(keyed::<C>))
        // No authentication: every client's keys in one scope, by choice (they never share one).
        .layer(Extension(Principal::shared()))
        .with_state(pool)
}

/// The section on SQLite: the database file at `path` (the bench's, in WAL mode), each
/// connection with the sync sections' settings.
pub(crate) fn sqlite(label: &str, seconds: f64, path: &std::path::Path) {
    let mut config = diesel_async::pooled_connection::ManagerConfig::<SqliteConn>::default();
    config.custom_setup = Box::new(|url| {
        let url = url.to_owned();
        Box::pin(async move {
            use diesel_async::SimpleAsyncConnection;
            let mut conn = SqliteConn::establish(&url).await?;
            conn.batch_execute("PRAGMA synchronous = NORMAL; PRAGMA busy_timeout = 10000;")
                .await
                .map_err(diesel::ConnectionError::CouldntSetupConfiguration)?;
            Ok(conn)
        })
    });
    let manager = AsyncDieselConnectionManager::new_with_config(path.display().to_string(), config);
    run::<SqliteConn>(label, seconds, manager);
}

/// The section on PostgreSQL, the database at `url`.
#[cfg(feature = "postgres")]
pub(crate) fn postgres(label: &str, seconds: f64, url: &str) {
    run::<diesel_async::AsyncPgConnection>(label, seconds, AsyncDieselConnectionManager::new(url));
}

/// The section on MariaDB/MySQL, the database at `url`.
#[cfg(feature = "mysql")]
pub(crate) fn mysql(label: &str, seconds: f64, url: &str) {
    run::<diesel_async::AsyncMysqlConnection>(
        label,
        seconds,
        AsyncDieselConnectionManager::new(url),
    );
}

/// Serves both routes on a pool of `manager`'s connections (as many as the most clients) and
/// measures them: interleaved rounds at each number of clients, the median of each; then
/// checks that the database holds a ledger entry for every 201 and a key for every keyed one.
fn run<C: Bank>(label: &str, seconds: f64, manager: C::Manager) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        let most = *CLIENTS.iter().max().unwrap();
        let pool = bb8::Pool::builder()
            .max_size(most as u32)
            .build(manager)
            .await
            .expect("a pool of connections");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a local port");
        let addr = listener.local_addr().expect("its address");
        // As reqwest does on its side: a small answer is not held back for an ACK.
        let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
            let _ = tcp.set_nodelay(true);
        });
        tokio::spawn(axum::serve(listener, router::<C>(pool.clone())).into_future());
        let client = reqwest::Client::new();
        // Parsed once: both variants' clients skip the parse a `&str` costs on each request.
        let urls = ["plain", "keyed"].map(|route| {
            reqwest::Url::parse(&format!("http://{addr}/{route}/transfers")).expect("a URL")
        });
        let (ledger_before, keys_before) = rows::<C>(&pool).await;
        let mut sent = [0; 2];
        let mut run = 9_000;
        // Every connection of the pool and of the client opened, and each route's statements
        // prepared on them (the handler's startup check run), before the timing starts.
        for (url, sent) in urls.iter().zip(&mut sent) {
            run += 1;
            *sent += measure(&client, url, most, seconds / ROUNDS as f64, run)
                .await
                .0;
        }
        let mut rates = Vec::new();
        for clients in CLIENTS {
            let mut rounds = [[0.0; ROUNDS]; 2];
            for round in 0..ROUNDS {
                for ((url, rates), sent) in urls.iter().zip(&mut rounds).zip(&mut sent) {
                    run += 1;
                    let (answered, rate) =
                        measure(&client, url, clients, seconds / ROUNDS as f64, run).await;
                    *sent += answered;
                    rates[round] = rate;
                }
            }
            rates.push(rounds.map(median));
        }
        let (ledger_after, keys_after) = rows::<C>(&pool).await;
        assert_eq!(
            (ledger_after - ledger_before, keys_after - keys_before),
            ((sent[0] + sent[1]) as i64, sent[1] as i64),
            "a ledger entry for every 201, a key for every keyed one"
        );
        report(label, &rates);
    });
}

/// The ledger's entries, and the keys the inbox-axum route stored.
async fn rows<C: Bank>(pool: &Pool<C>) -> (i64, i64) {
    let mut conn = pool.get().await.expect("a connection");
    conn.rows()
        .await
        .expect("the ledger's and the inbox's rows")
}

/// A row count, as `sql_query` reads one.
#[derive(diesel::QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

/// `clients` tasks post to `url` for `seconds` after a common start, each at least once;
/// the requests answered, and how many per second.
async fn measure(
    client: &reqwest::Client,
    url: &reqwest::Url,
    clients: usize,
    seconds: f64,
    run: u64,
) -> (u64, f64) {
    let start = Arc::new(tokio::sync::Barrier::new(clients + 1));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for worker in 0..clients {
        let (client, url) = (client.clone(), url.clone());
        let (start, stop) = (start.clone(), stop.clone());
        let body = serde_json::to_string(&Transfer::of(worker)).expect("JSON");
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            let mut n = 0;
            loop {
                let response = client
                    .post(url.clone())
                    .header(IDEMPOTENCY_KEY, format!("\"{}\"", key(run, worker, n)))
                    .header(axum::http::header::CONTENT_TYPE, "application/json")
                    .body(body.clone())
                    .send()
                    .await
                    .unwrap_or_else(|e| panic!("POST {url}: {e}"));
                let (status, replayed) = (
                    response.status(),
                    response.headers().contains_key(IDEMPOTENT_REPLAYED),
                );
                let answer = response.text().await.expect("the answer's body");
                assert!(
                    status == StatusCode::CREATED && !replayed,
                    "POST {url} answered {status}{}: {answer}",
                    if replayed { " (replayed)" } else { "" }
                );
                n += 1;
                if AtomicBool::load(&stop, Ordering::Relaxed) {
                    return n;
                }
            }
        }));
    }
    start.wait().await;
    let began = Instant::now();
    tokio::time::sleep(std::time::Duration::from_secs_f64(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let mut answered = 0;
    for task in tasks {
        answered += task
            .await
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    }
    // Until the last answer: every request counted was answered within the time divided by.
    (answered, answered as f64 / began.elapsed().as_secs_f64())
}

fn report(label: &str, rates: &[[f64; 2]]) {
    let request = serde_json::to_string(&Transfer::of(0)).unwrap().len();
    let answer = serde_json::to_string(&Posted::of(&Transfer::of(0), 1_000_000))
        .unwrap()
        .len();
    println!(
        "\n### {label}: over HTTP (axum, reqwest), a read, an update and an insert per request\n\n\
         {request}-byte JSON request, {answer}-byte JSON answer, 201; a fresh Idempotency-Key \
         per request\n"
    );
    println!("| clients | plain (`Json`) | inbox-axum (`Idempotent`, stored reply) |");
    println!("|---|---:|---:|");
    for (clients, [plain, keyed]) in CLIENTS.into_iter().zip(rates) {
        println!(
            "| {clients} | 1.00 ({plain:.0}/s) | {:.2} ({keyed:.0}/s) |",
            keyed / plain
        );
    }
    let ratios: Vec<String> = rates
        .iter()
        .map(|[plain, keyed]| format!("{:.2}", keyed / plain))
        .collect();
    println!(
        "\ninbox-axum / plain ({} clients): {}",
        CLIENTS.map(|c| c.to_string()).join(" / "),
        ratios.join(" / ")
    );
}
