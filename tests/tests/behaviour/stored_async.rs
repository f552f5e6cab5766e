// Stored results and fingerprints, async, on one backend: included by each backend's async
// suite into a module that names `Db`, `AsyncConnection` and `BACKEND`.
use std::sync::atomic::{AtomicUsize, Ordering};

use diesel::connection::SimpleConnection;
use inbox_diesel::{Error, InFlightOutcome, InboxSchema, Outcome, idempotent};
use inbox_tests::{AppError, Credit};

/// Answers with the amount it was asked for, doubled; fingerprinted by the amount.
#[idempotent(consumer = "pay", key = msg.id, store_result = true, fingerprint = msg.amount.to_string())]
async fn pay(conn: &mut AsyncConnection, msg: &Credit, ran: &AtomicUsize) -> Result<i64, AppError> {
    ran.fetch_add(1, Ordering::SeqCst);
    diesel_async::SimpleAsyncConnection::batch_execute(
        conn,
        "UPDATE accounts SET balance = balance + 1 WHERE id = 1",
    )
    .await?;
    Ok(msg.amount * 2)
}

/// Claim mode, with both.
#[idempotent(
    consumer = "notify",
    key = msg.id,
    mode = "claim",
    store_result = true,
    fingerprint = msg.amount.to_string()
)]
async fn notify(
    conn: &mut AsyncConnection,
    msg: &Credit,
    sent: &AtomicUsize,
) -> Result<String, AppError> {
    sent.fetch_add(1, Ordering::SeqCst);
    Ok(format!("sent {}", msg.amount))
}

fn with_columns(test: &str) -> Db {
    let db = Db::new(test);
    let schema = InboxSchema::DEFAULT;
    let mut conn = db.connect();
    conn.batch_execute(&BACKEND.add_result_sql(&schema))
        .unwrap();
    conn.batch_execute(&BACKEND.add_fingerprint_sql(&schema))
        .unwrap();
    db
}

fn other(msg: &Credit) -> Credit {
    Credit {
        amount: msg.amount + 1,
        ..msg.clone()
    }
}

#[tokio::test]
async fn async_stored_results_replay_and_another_request_is_refused() {
    let db = with_columns("async_stored");
    let mut conn = db.connect_async().await;
    let (msg, ran) = (Credit::new(1), AtomicUsize::new(0));
    assert_eq!(
        pay(&mut conn, &msg, &ran).await.unwrap(),
        Outcome::Processed(20)
    );
    assert!(matches!(
        pay(&mut conn, &msg, &ran).await.unwrap(),
        Outcome::Duplicate {
            stored: Some(20),
            ..
        }
    ));
    let refused = pay(&mut conn, &other(&msg), &ran).await;
    assert!(
        matches!(refused, Err(AppError::Inbox(Error::KeyReused { .. }))),
        "{refused:?}"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 1);

    let sent = AtomicUsize::new(0);
    assert_eq!(
        notify(&mut conn, &msg, &sent).await.unwrap(),
        InFlightOutcome::Processed("sent 10".to_owned())
    );
    assert!(matches!(
        notify(&mut conn, &msg, &sent).await.unwrap(),
        InFlightOutcome::Duplicate { stored: Some(s), .. } if s == "sent 10"
    ));
    let refused = notify(&mut conn, &other(&msg), &sent).await;
    assert!(
        matches!(refused, Err(AppError::Inbox(Error::KeyReused { .. }))),
        "{refused:?}"
    );
    assert_eq!(sent.load(Ordering::SeqCst), 1);
}

/// `pay` for callers inside their transaction and outside any.
#[idempotent(
    consumer = "pay",
    key = msg.id,
    transaction = "caller_or_own",
    store_result = true,
    fingerprint = msg.amount.to_string()
)]
async fn pay_joined(
    conn: &mut AsyncConnection,
    msg: &Credit,
    ran: &AtomicUsize,
) -> Result<i64, AppError> {
    ran.fetch_add(1, Ordering::SeqCst);
    diesel_async::SimpleAsyncConnection::batch_execute(
        conn,
        "UPDATE accounts SET balance = balance + 1 WHERE id = 1",
    )
    .await?;
    Ok(msg.amount * 2)
}

/// Applied in a caller's transaction, asked for again outside any and in another caller's:
/// the result kept with the marker answers each duplicate; another request under the key is
/// refused and the caller's transaction goes on.
#[tokio::test]
async fn async_a_callers_transaction_keeps_the_result_and_fingerprint() {
    use diesel_async::AsyncConnection as _;
    let db = with_columns("async_stored_joined");
    let mut conn = db.connect_async().await;
    let (msg, ran) = (Credit::new(1), AtomicUsize::new(0));
    let first = conn
        .transaction::<_, AppError, _>(async |conn| pay_joined(conn, &msg, &ran).await)
        .await
        .unwrap();
    assert_eq!(first, Outcome::Processed(20));
    assert!(matches!(
        pay_joined(&mut conn, &msg, &ran).await.unwrap(),
        Outcome::Duplicate {
            stored: Some(20),
            ..
        }
    ));
    conn.transaction::<_, AppError, _>(async |conn| {
        assert!(matches!(
            pay_joined(conn, &msg, &ran).await?,
            Outcome::Duplicate {
                stored: Some(20),
                ..
            }
        ));
        let refused = pay_joined(conn, &other(&msg), &ran).await;
        assert!(
            matches!(refused, Err(AppError::Inbox(Error::KeyReused { .. }))),
            "{refused:?}"
        );
        Ok(())
    })
    .await
    .unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), 1);
}
