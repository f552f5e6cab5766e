//! The batch form's suites (`batch = msgs`), written once and instantiated per backend.

/// The sync batch tests, for the fixture `$db` of the [`suite!`](crate::suite) they sit
/// beside: they use its handlers and counters.
#[macro_export]
macro_rules! batch_suite {
    ($db:ty) => {
        mod batch_form {
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
                let db = <$db>::new("batch_once");
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

            /// A handler error rolls back the whole batch: no marker, no credit.
            #[test]
            fn batch_error_rolls_back_the_batch() {
                let db = <$db>::new("batch_error");
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
                let db = <$db>::new("batch_race");
                let barrier = Barrier::new(4);
                let given = AtomicUsize::new(0);
                let processed = AtomicUsize::new(0);
                // Errors are collected, not panicked on: a panicking instance would leave
                // the others waiting at the barrier.
                let errors = std::sync::Mutex::new(Vec::new());
                std::thread::scope(|scope| {
                    for instance in 0..4 {
                        let mut conn = db.connect();
                        let (barrier, given, processed, errors) =
                            (&barrier, &given, &processed, &errors);
                        scope.spawn(move || {
                            for round in 0..ROUNDS {
                                let ids: Vec<u128> = (round * SIZE..(round + 1) * SIZE).collect();
                                barrier.wait();
                                if instance < 2 {
                                    match credit_batch(&mut conn, &batch(&ids), given, false) {
                                        Ok(outcome) => {
                                            processed.fetch_add(
                                                outcome.processed.len(),
                                                Ordering::SeqCst,
                                            );
                                        }
                                        Err(e) => {
                                            errors.lock().unwrap().push(format!("batch: {e:?}"))
                                        }
                                    }
                                } else {
                                    for &n in &ids {
                                        match credit(&mut conn, &Credit::new(n)) {
                                            Ok(outcome) if outcome.is_processed() => {
                                                processed.fetch_add(1, Ordering::SeqCst);
                                            }
                                            Ok(_) => {}
                                            Err(e) => {
                                                errors.lock().unwrap().push(format!("{n}: {e:?}"))
                                            }
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
        }
    };
}

/// The async batch tests, for the fixture `$db` of the [`async_suite!`](crate::async_suite)
/// they sit beside: they use its handlers and counters.
#[macro_export]
macro_rules! async_batch_suite {
    ($db:ty) => {
        mod async_batch_form {
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
                let db = <$db>::new("async_batch");
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
                let db = <$db>::new("async_batch_race");
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
                                    match credit(&mut conn, &Credit::new(n), &Hook::default()).await
                                    {
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
        }
    };
}
