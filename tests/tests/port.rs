//! A federated server's inbox, ported: activity handlers are trait methods without a
//! connection parameter, the application's error is built on `anyhow` with a blanket `From`,
//! the context holds a deadpool pool of 4, and activities are keyed by their URL. Sixteen
//! deliveries of one activity at once apply it once, and no delivery times out waiting for
//! the pool. PostgreSQL through diesel-async (`INBOX_TEST_PG`).
#![cfg(feature = "postgres")]

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use inbox_diesel::guarded;
use inbox_diesel::handler::{Handler, run_once_async};
use inbox_diesel::{HasDieselError, Outcome};
use inbox_tests::postgres::PgDb;

/// The application's error, as such servers write it.
#[derive(Debug)]
pub struct AppError(anyhow::Error);

impl<E: Into<anyhow::Error>> From<E> for AppError {
    fn from(error: E) -> Self {
        AppError(error.into())
    }
}

impl HasDieselError for AppError {
    fn diesel_error(&self) -> Option<&diesel::result::Error> {
        self.0.chain().find_map(|cause| cause.downcast_ref())
    }
}

/// What every handler is given.
pub struct Context {
    pool: Pool<AsyncPgConnection>,
}

trait ActivityHandler {
    async fn receive(&self, context: &Context, id: &url::Url) -> Result<Outcome<()>, AppError>;
}

static FOLLOW: LazyLock<Handler> = LazyLock::new(|| Handler::new("follow").unwrap());

pub struct Follow;

impl ActivityHandler for Follow {
    async fn receive(&self, context: &Context, id: &url::Url) -> Result<Outcome<()>, AppError> {
        let mut conn = context.pool.get().await?;
        run_once_async(
            &mut *conn,
            &FOLLOW,
            id,
            guarded!(async |tx: &mut AsyncPgConnection| {
                diesel::sql_query("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
                    .execute(tx)
                    .await?;
                Ok(())
            }),
        )
        .await
    }
}

#[test]
fn sixteen_deliveries_of_one_activity_on_a_pool_of_four_apply_it_once() {
    let db = PgDb::new("port_follow");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let pool = Pool::builder(AsyncDieselConnectionManager::<AsyncPgConnection>::new(
            db.url(),
        ))
        .max_size(4)
        .wait_timeout(Some(Duration::from_secs(10)))
        .runtime(deadpool::Runtime::Tokio1)
        .build()
        .unwrap();
        let context = Arc::new(Context { pool });
        let id = url::Url::parse(&format!(
            "https://example.social/activities/{}",
            "f".repeat(1_039)
        ))
        .unwrap();
        let barrier = Arc::new(tokio::sync::Barrier::new(16));
        let deliveries: Vec<_> = (0..16)
            .map(|_| {
                let (context, id, barrier) = (context.clone(), id.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    Follow.receive(&context, &id).await
                })
            })
            .collect();
        let mut processed = 0;
        for delivery in deliveries {
            match delivery.await.unwrap() {
                Ok(Outcome::Processed(())) => processed += 1,
                Ok(outcome) => assert!(outcome.is_duplicate(), "{outcome:?}"),
                Err(error) => panic!("a delivery failed (a pool timeout?): {error:?}"),
            }
        }
        assert_eq!(processed, 1);
    });
    let balance = inbox_tests::server::count(
        &mut db.connect(),
        "SELECT balance AS n FROM accounts WHERE id = 1",
    );
    assert_eq!(balance, 1, "the follow was applied once");
}

/// A handler cancelled by a timeout mid-body, on deadpool, whose connection goes back to the
/// pool with its transaction open: the server ends that transaction once it has sat idle for
/// `idle_in_transaction_ms`, and the redelivery on another connection, which waited on the
/// marker's lock, processes the message. Without the bound it would wait until the pool next
/// handed that connection out.
#[test]
fn a_cancelled_handler_holds_the_marker_only_as_long_as_its_bound() {
    #[inbox_diesel::idempotent(consumer = "slow", key = *id, idle_in_transaction_ms = 300)]
    async fn slow(conn: &mut AsyncPgConnection, id: &u64, stall: bool) -> diesel::QueryResult<()> {
        diesel::sql_query("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
            .execute(conn)
            .await?;
        if stall {
            tokio::time::sleep(Duration::from_secs(60)).await;
        }
        Ok(())
    }

    let db = PgDb::new("cancelled_bound");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let pool = Pool::builder(AsyncDieselConnectionManager::<AsyncPgConnection>::new(
            db.url(),
        ))
        .max_size(1)
        .build()
        .unwrap();
        let mut conn = pool.get().await.unwrap();
        let cancelled =
            tokio::time::timeout(Duration::from_millis(200), slow(&mut conn, &1, true)).await;
        assert!(cancelled.is_err(), "{cancelled:?}");
        drop(conn); // back to the pool, its transaction open and its marker locked
        let mut other = db.connect_async().await;
        let redelivered =
            tokio::time::timeout(Duration::from_secs(10), slow(&mut other, &1, false))
                .await
                .expect("the marker's lock was released within the bound");
        assert!(redelivered.unwrap().is_processed());
    });
    let balance = inbox_tests::server::count(
        &mut db.connect(),
        "SELECT balance AS n FROM accounts WHERE id = 1",
    );
    assert_eq!(
        balance, 1,
        "the cancelled attempt rolled back; the redelivery applied once"
    );
}
