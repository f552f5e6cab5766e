// What only servers with row locks show, async: the lock wait and a deadlock retried.
// Included after `transaction_async.rs`, beside `Db` (with `connect_async()` and
// `waiting_for_a_lock()`).
type HandlerResult = Result<Outcome<()>, AppError>;

/// Waits until the server shows one session of the test database waiting for a lock.
async fn until_one_session_waits(db: &Db) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    while db.waiting_for_a_lock() != 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "B never waited for A's lock"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// A runs `a` until its body holds (`Hook::hold`), B then runs `b` and blocks behind
/// A's lock; only when the server shows B waiting does A go on.
async fn a_holds_b_waits(
    db: &Db,
    a: impl AsyncFnOnce(&mut AsyncConnection, Hook) -> HandlerResult,
    b: impl AsyncFnOnce(&mut AsyncConnection) -> HandlerResult,
) -> (HandlerResult, HandlerResult) {
    let (holding, go) = (
        Arc::new(tokio::sync::Notify::new()),
        Arc::new(tokio::sync::Notify::new()),
    );
    let hold = Hook {
        hold: Some((holding.clone(), go.clone())),
        ..Hook::default()
    };
    let (mut conn_a, mut conn_b) = (db.connect_async().await, db.connect_async().await);
    let a = a(&mut conn_a, hold);
    let b = async {
        holding.notified().await;
        let b = b(&mut conn_b);
        let release = async {
            until_one_session_waits(db).await;
            go.notify_one();
        };
        tokio::join!(b, release).0
    };
    tokio::join!(a, b)
}

#[tokio::test(flavor = "multi_thread")]
async fn async_lock_wait_then_commit_makes_the_waiter_a_duplicate() {
    let db = <Db>::new("async_lock_wait_commit");
    let msg = Credit::new(1);
    let (a, b) = a_holds_b_waits(
        &db,
        async |conn, hook| credit(conn, &msg, &hook).await,
        async |conn| credit(conn, &msg, &Hook::default()).await,
    )
    .await;
    assert_eq!(a.unwrap(), Outcome::Processed(()));
    assert!(b.unwrap().is_duplicate());
    let mut conn = db.connect_async().await;
    assert_eq!(count_markers(&mut conn).await, 1);
    assert_eq!(balance(&mut conn, 1).await, 10);
}

#[tokio::test(flavor = "multi_thread")]
async fn async_lock_wait_then_rollback_lets_the_waiter_process() {
    let db = <Db>::new("async_lock_wait_rollback");
    let msg = Credit::new(1);
    let (a, b) = a_holds_b_waits(
        &db,
        async |conn, hook| {
            credit(
                conn,
                &msg,
                &Hook {
                    reject: true,
                    ..hook
                },
            )
            .await
        },
        async |conn| credit(conn, &msg, &Hook::default()).await,
    )
    .await;
    assert!(matches!(a, Err(AppError::Rejected)));
    assert_eq!(b.unwrap(), Outcome::Processed(()));
    let mut conn = db.connect_async().await;
    assert_eq!(count_markers(&mut conn).await, 1);
    assert_eq!(count_credits(&mut conn, &msg).await, 1);
}

/// The provoked deadlock of the sync suite, on async connections.
#[tokio::test(flavor = "multi_thread")]
async fn async_deadlock_is_retried_to_success() {
    let db = <Db>::new("async_deadlock_retried");
    let rendezvous = Arc::new(tokio::sync::Barrier::new(2));
    let attempts = Arc::new(AtomicUsize::new(0));
    let deliver = async |msg: Credit, other: i32| {
        let mut conn = db.connect_async().await;
        let meeting = Meeting {
            rendezvous: rendezvous.clone(),
            attempts: attempts.clone(),
            first_attempt: std::sync::atomic::AtomicBool::new(true),
        };
        transfer(&mut conn, &msg, other, &meeting).await
    };
    let (a, b) = tokio::join!(
        deliver(
            Credit {
                account: 1,
                ..Credit::new(1)
            },
            2
        ),
        deliver(
            Credit {
                account: 2,
                ..Credit::new(2)
            },
            1
        )
    );
    assert_eq!(a.unwrap(), Outcome::Processed(()));
    assert_eq!(b.unwrap(), Outcome::Processed(()));
    assert_eq!(
        AtomicUsize::load(&attempts, Ordering::SeqCst),
        3,
        "the victim ran its body twice"
    );
    let mut conn = db.connect_async().await;
    assert_eq!(balance(&mut conn, 1).await, 11);
    assert_eq!(balance(&mut conn, 2).await, 11);
}

/// Where two deliveries meet once, each holding its first lock.
struct Meeting {
    rendezvous: Arc<tokio::sync::Barrier>,
    attempts: Arc<AtomicUsize>,
    first_attempt: std::sync::atomic::AtomicBool,
}

/// `credit`, then the meeting (on the first attempt only), then one more on `other`.
#[idempotent(consumer = "credit", key = msg.id)]
async fn transfer(
    conn: &mut AsyncConnection,
    msg: &Credit,
    other: i32,
    meeting: &Meeting,
) -> Result<(), AppError> {
    apply_credit(conn, msg).await?;
    meeting.attempts.fetch_add(1, Ordering::SeqCst);
    if meeting.first_attempt.swap(false, Ordering::SeqCst) {
        meeting.rendezvous.wait().await;
    }
    diesel::update(accounts::table.find(other))
        .set(accounts::balance.eq(accounts::balance + 1))
        .execute(conn)
        .await?;
    Ok(())
}
