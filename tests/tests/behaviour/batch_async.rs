// The batch form's tests (`batch = msgs`), async, on one backend: included beside the
// backend's async suite, whose handlers and counters they use, into a module naming `Db`.
use super::*;

#[idempotent(consumer = "credit", batch = msgs, key = |msg| msg.id)]
async fn credit_batch(
    conn: &mut AsyncConnection,
    msgs: &[Credit],
    fail: bool,
) -> Result<usize, AppError> {
    for msg in msgs {
        apply_credit(conn, msg).await?;
    }
    if fail {
        return Err(AppError::Rejected);
    }
    Ok(msgs.len())
}

fn batch(ids: std::ops::Range<u128>) -> Vec<Credit> {
    ids.map(Credit::new).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn async_batch_processes_each_new_message_once_and_rolls_back_on_error() {
    let db = <Db>::new("async_batch");
    let mut conn = db.connect_async().await;
    let failed = credit_batch(&mut conn, &batch(0..3), true).await;
    assert!(matches!(failed, Err(AppError::Rejected)), "{failed:?}");
    assert_eq!(count_markers(&mut conn).await, 0);
    let mut msgs = batch(0..3);
    msgs.push(Credit::new(1));
    let outcome = credit_batch(&mut conn, &msgs, false).await.unwrap();
    assert_eq!(outcome.value, Some(3));
    assert_eq!(outcome.processed, [0, 1, 2]);
    assert_eq!(outcome.duplicates, [3]);
    let again = credit_batch(&mut conn, &msgs, false).await.unwrap();
    assert_eq!(again.value, None);
    assert_eq!(count_markers(&mut conn).await, 3);
    assert_eq!(balance(&mut conn, 1).await, 30);
}

/// Two batch tasks and two per-message tasks on the same 100 messages, released
/// together per round: each message is credited once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn async_batch_racing_per_message_handlers_applies_each_message_once() {
    const ROUNDS: u128 = 10;
    const SIZE: u128 = 10;
    let db = <Db>::new("async_batch_race");
    let barrier = Arc::new(tokio::sync::Barrier::new(4));
    let mut tasks = Vec::new();
    for instance in 0..4 {
        let mut conn = db.connect_async().await;
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            let mut processed = 0;
            let mut errors = Vec::new();
            for round in 0..ROUNDS {
                let ids = round * SIZE..(round + 1) * SIZE;
                barrier.wait().await;
                if instance < 2 {
                    match credit_batch(&mut conn, &batch(ids), false).await {
                        Ok(outcome) => processed += outcome.processed.len(),
                        Err(e) => errors.push(format!("batch: {e:?}")),
                    }
                } else {
                    for n in ids {
                        match credit(&mut conn, &Credit::new(n), &Hook::default()).await {
                            Ok(outcome) if outcome.is_processed() => processed += 1,
                            Ok(_) => {}
                            Err(e) => errors.push(format!("{n}: {e:?}")),
                        }
                    }
                }
            }
            (processed, errors)
        }));
    }
    let mut processed = 0;
    for task in tasks {
        let (p, errors) = task.await.unwrap();
        assert_eq!(errors, Vec::<String>::new());
        processed += p;
    }
    let total = (ROUNDS * SIZE) as usize;
    assert_eq!(processed, total);
    let mut conn = db.connect_async().await;
    assert_eq!(count_markers(&mut conn).await, total as i64);
    assert_eq!(balance(&mut conn, 1).await, 10 * total as i64);
}
