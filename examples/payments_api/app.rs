// The payments API, written once for each backend (`backends.rs` includes it with `Conn`, the
// backend's diesel-async connection, and `BUSINESS_SCHEMA` in scope).

use std::sync::LazyLock;

use axum::Router;
use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::http::header::{HeaderValue, LOCATION};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use diesel::prelude::*;
use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use diesel_async::pooled_connection::bb8::Pool;
use diesel_async::{RunQueryDsl, SimpleAsyncConnection};
use inbox_axum::{Idempotent, Principal, Reply};
use inbox_diesel::guarded;
use inbox_diesel::handler::{AnswerInFlight, Handler};
use serde::{Deserialize, Serialize};

diesel::table! {
    accounts (id) {
        id -> BigInt,
        balance_cents -> BigInt,
    }
}

diesel::table! {
    payments (id) {
        id -> BigInt,
        account -> BigInt,
        amount_cents -> BigInt,
    }
}

diesel::allow_tables_to_appear_in_same_query!(accounts, payments);

/// What a client posts to `/accounts/{id}/payments`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NewPayment {
    pub amount_cents: i64,
}

/// A payment, as the API answers it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Queryable)]
pub struct Payment {
    pub id: i64,
    pub account: i64,
    pub amount_cents: i64,
}

/// The consumer the keys are stored under. `in_flight_when_locked`: a request whose key
/// another request holds, uncommitted, is answered 409 at once (PostgreSQL); SQLite runs one
/// writer at a time, so there the second waits for the first and replays its answer.
static PAYMENTS: LazyLock<Handler<AnswerInFlight>> = LazyLock::new(|| {
    Handler::new("payments-api")
        .expect("a valid consumer name")
        .in_flight_when_locked()
});

/// The account every fresh database starts with, and its balance.
pub const ACCOUNT: i64 = 1;
pub const OPENING_BALANCE_CENTS: i64 = 1_000_000;

pub type Db = Pool<Conn>;

pub async fn pool(url: &str, size: u32) -> Db {
    Pool::builder()
        .max_size(size)
        .build(AsyncDieselConnectionManager::<Conn>::new(url))
        .await
        .unwrap_or_else(|e| panic!("a pool of connections to {url}: {e}"))
}

/// The inbox table, with the columns the stored responses need, and the business tables.
pub async fn create_schema(db: &Db) {
    let mut conn = db.get().await.expect("a connection");
    let inbox = BACKEND.create_table_with_sql(
        &inbox_diesel::InboxSchema::DEFAULT,
        inbox_diesel::schema::OptionalColumns {
            result: true,
            fingerprint: true,
            ..Default::default()
        },
    );
    conn.batch_execute(&inbox).await.expect("the inbox table");
    for statement in BUSINESS_SCHEMA {
        conn.batch_execute(statement)
            .await
            .expect("the business tables");
    }
    diesel::insert_into(accounts::table)
        .values((
            accounts::id.eq(ACCOUNT),
            accounts::balance_cents.eq(OPENING_BALANCE_CENTS),
        ))
        .execute(&mut conn)
        .await
        .expect("the first account");
}

pub fn router(db: Db) -> Router {
    Router::new()
        .route("/accounts/{account}/payments", post(create_payment))
        .route("/payments/{id}", get(payment))
        .layer(middleware::from_fn(authenticate))
        .with_state(db)
}

/// Stands for the application's authentication: the tenant a request is from. Keys are
/// scoped by it, so one tenant's key never answers another tenant's request; requests without
/// a tenant share one scope, a choice made here (`Principal::shared`).
async fn authenticate(mut request: Request, next: Next) -> Response {
    let tenant = request
        .headers()
        .get("x-tenant")
        .and_then(|v| v.to_str().ok());
    let principal = match tenant.and_then(|t| Principal::new(t).ok()) {
        Some(tenant) => tenant,
        None => Principal::shared(),
    };
    request.extensions_mut().insert(principal);
    next.run(request).await
}

/// `POST /accounts/{account}/payments` with an `Idempotency-Key`: debits the account and
/// records the payment, once per key. The answer — 201 with the payment, or the refusal
/// the business rules give — is committed with the payment and replayed to retries.
async fn create_payment(
    State(db): State<Db>,
    Path(account): Path<i64>,
    request: Idempotent<NewPayment>,
) -> Response {
    let mut conn = match db.get().await {
        Ok(conn) => conn,
        Err(e) => return inbox_axum::unavailable(e),
    };
    let amount = request.payload.amount_cents;
    request
        .run(
            &mut *conn,
            &PAYMENTS,
            guarded!(async |tx: &mut Conn| {
                if amount <= 0 {
                    return Reply::json(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        &refusal("amount_cents must be positive"),
                    );
                }
                let debited = diesel::update(
                    accounts::table
                        .filter(accounts::id.eq(account))
                        .filter(accounts::balance_cents.ge(amount)),
                )
                .set(accounts::balance_cents.eq(accounts::balance_cents - amount))
                .execute(tx)
                .await?;
                if debited == 0 {
                    let exists = diesel::select(diesel::dsl::exists(accounts::table.find(account)))
                        .get_result::<bool>(tx)
                        .await?;
                    return match exists {
                        true => Reply::json(
                            StatusCode::PAYMENT_REQUIRED,
                            &refusal("insufficient funds"),
                        ),
                        false => Reply::json(StatusCode::NOT_FOUND, &refusal("no such account")),
                    };
                }
                let payment: Payment = diesel::insert_into(payments::table)
                    .values((
                        payments::account.eq(account),
                        payments::amount_cents.eq(amount),
                    ))
                    .returning((payments::id, payments::account, payments::amount_cents))
                    .get_result(tx)
                    .await?;
                let location = HeaderValue::try_from(format!("/payments/{}", payment.id))
                    .map_err(inbox_axum::Error::internal)?;
                Ok(Reply::json(StatusCode::CREATED, &payment)?.header(LOCATION, location))
            }),
        )
        .await
}

fn refusal(why: &str) -> serde_json::Value {
    serde_json::json!({ "error": why })
}

/// `GET /payments/{id}`.
async fn payment(State(db): State<Db>, Path(id): Path<i64>) -> Response {
    let mut conn = match db.get().await {
        Ok(conn) => conn,
        Err(e) => return inbox_axum::unavailable(e),
    };
    match payments::table
        .find(id)
        .first::<Payment>(&mut conn)
        .await
        .optional()
    {
        Ok(Some(payment)) => axum::Json(payment).into_response(),
        Ok(None) => (
            StatusCode::NOT_FOUND,
            axum::Json(refusal("no such payment")),
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// How many payments were recorded, and the account's balance: what the tests and the demo
/// check against the answers.
pub async fn ledger(db: &Db) -> (i64, i64) {
    let mut conn = db.get().await.expect("a connection");
    let count = payments::table
        .count()
        .get_result(&mut conn)
        .await
        .expect("count payments");
    let balance = accounts::table
        .find(ACCOUNT)
        .select(accounts::balance_cents)
        .first(&mut conn)
        .await
        .expect("the balance");
    (count, balance)
}
