// The batch form's tests (`batch = msgs`), sync, on one backend: included beside the
// backend's suite, whose handlers and counters they use, into a module naming `Db`.
use super::*;

/// Credits each new message of the batch; counts the messages it was given.
#[idempotent(consumer = "credit", batch = msgs, key = |msg| msg.id)]
fn credit_batch(
    conn: &mut DbConnection,
    msgs: &[Credit],
    given: &AtomicUsize,
    fail: bool,
) -> Result<usize, AppError> {
    for msg in msgs {
        apply_credit(conn, msg)?;
    }
    given.fetch_add(msgs.len(), Ordering::SeqCst);
    if fail {
        return Err(AppError::Rejected);
    }
    Ok(msgs.len())
}

fn batch(ids: &[u128]) -> Vec<Credit> {
    ids.iter().map(|&n| Credit::new(n)).collect()
}

/// One transaction for the batch; a key repeated inside the batch and a key
/// processed before are not given to the body; the redelivered batch runs nothing.
#[test]
fn batch_processes_each_new_message_once() {
    let db = <Db>::new("batch_once");
    let mut conn = db.connect();
    let given = AtomicUsize::new(0);
    assert!(credit(&mut conn, &Credit::new(4)).unwrap().is_processed());
    let msgs = batch(&[1, 2, 2, 3, 4]);
    let outcome = credit_batch(&mut conn, &msgs, &given, false).unwrap();
    assert_eq!(outcome.value, Some(3));
    assert_eq!(outcome.processed, [0, 1, 3]);
    assert_eq!(outcome.duplicates, [2, 4]);
    assert_eq!(given.load(Ordering::SeqCst), 3);
    for n in 1..=4 {
        assert_eq!(count_credits(&mut conn, &Credit::new(n)), 1, "message {n}");
    }
    assert_eq!(count_markers(&mut conn), 4);

    let again = credit_batch(&mut conn, &msgs, &given, false).unwrap();
    assert_eq!(again.value, None, "nothing new: the body does not run");
    assert_eq!(again.duplicates, [0, 1, 2, 3, 4]);
    assert_eq!(given.load(Ordering::SeqCst), 3);
    let empty = credit_batch(&mut conn, &[], &given, false).unwrap();
    assert_eq!((empty.value, empty.processed.len()), (None, 0));
}

/// A batch larger than one multi-row marker insert (MySQL and MariaDB insert a batch's
/// markers 500 to a statement, and claim a chunk with a duplicate row by row): duplicates
/// in the first and last chunks, none in the middle one; each message once.
#[test]
fn a_batch_of_several_chunks_with_duplicates_in_some_processes_each_new_message_once() {
    let db = <Db>::new("batch_chunks");
    let mut conn = db.connect();
    let given = AtomicUsize::new(0);
    for n in [10, 1100] {
        assert!(credit(&mut conn, &Credit::new(n)).unwrap().is_processed());
    }
    let ids: Vec<u128> = (1..=1200).collect();
    let msgs = batch(&ids);
    let outcome = credit_batch(&mut conn, &msgs, &given, false).unwrap();
    assert_eq!(outcome.value, Some(1198));
    assert_eq!(outcome.duplicates, [9, 1099]);
    assert_eq!(outcome.processed.len(), 1198);
    assert_eq!(given.load(Ordering::SeqCst), 1198);
    assert_eq!(count_markers(&mut conn), 1200);
    for n in [1, 10, 499, 500, 501, 1000, 1100, 1200] {
        assert_eq!(count_credits(&mut conn, &Credit::new(n)), 1, "message {n}");
    }
    let again = credit_batch(&mut conn, &msgs, &given, false).unwrap();
    assert_eq!((again.value, again.duplicates.len()), (None, 1200));
}

/// A handler error rolls back the whole batch: no marker, no credit.
#[test]
fn batch_error_rolls_back_the_batch() {
    let db = <Db>::new("batch_error");
    let mut conn = db.connect();
    let given = AtomicUsize::new(0);
    let msgs = batch(&[1, 2, 3]);
    let failed = credit_batch(&mut conn, &msgs, &given, true);
    assert!(matches!(failed, Err(AppError::Rejected)), "{failed:?}");
    assert_eq!(count_markers(&mut conn), 0);
    assert_eq!(balance(&mut conn, 1), 0);
    let outcome = credit_batch(&mut conn, &msgs, &given, false).unwrap();
    assert_eq!(outcome.processed, [0, 1, 2]);
    assert_eq!(balance(&mut conn, 1), 30);
}

/// Two batch consumers and two per-message consumers receive the same 120
/// messages, released together per round: each message is credited once.
#[test]
fn batch_racing_per_message_handlers_applies_each_message_once() {
    const ROUNDS: u128 = 12;
    const SIZE: u128 = 10;
    let db = <Db>::new("batch_race");
    let barrier = Barrier::new(4);
    let given = AtomicUsize::new(0);
    let processed = AtomicUsize::new(0);
    // Errors are collected, not panicked on: a panicking instance would leave
    // the others waiting at the barrier.
    let errors = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for instance in 0..4 {
            let mut conn = db.connect();
            let (barrier, given, processed, errors) = (&barrier, &given, &processed, &errors);
            scope.spawn(move || {
                for round in 0..ROUNDS {
                    let ids: Vec<u128> = (round * SIZE..(round + 1) * SIZE).collect();
                    barrier.wait();
                    if instance < 2 {
                        match credit_batch(&mut conn, &batch(&ids), given, false) {
                            Ok(outcome) => {
                                processed.fetch_add(outcome.processed.len(), Ordering::SeqCst);
                            }
                            Err(e) => errors.lock().unwrap().push(format!("batch: {e:?}")),
                        }
                    } else {
                        for &n in &ids {
                            match credit(&mut conn, &Credit::new(n)) {
                                Ok(outcome) if outcome.is_processed() => {
                                    processed.fetch_add(1, Ordering::SeqCst);
                                }
                                Ok(_) => {}
                                Err(e) => errors.lock().unwrap().push(format!("{n}: {e:?}")),
                            }
                        }
                    }
                }
            });
        }
    });
    assert_eq!(errors.into_inner().unwrap(), Vec::<String>::new());
    let mut conn = db.connect();
    let total = (ROUNDS * SIZE) as usize;
    assert_eq!(processed.load(Ordering::SeqCst), total);
    assert_eq!(count_markers(&mut conn), total as i64);
    assert_eq!(balance(&mut conn, 1), 10 * total as i64);
    for n in 0..ROUNDS * SIZE {
        assert_eq!(count_credits(&mut conn, &Credit::new(n)), 1, "message {n}");
    }
}
