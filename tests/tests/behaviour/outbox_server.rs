// The outbox on a server backend: a body retried after a real deadlock publishes the same
// ids. Included after `outbox.rs` by the PostgreSQL and MariaDB modules.

/// Moves a unit from `first` to `second`, publishing before and after; waits at `barrier` on
/// its first attempt, holding its first lock, so that two opposite transfers deadlock.
#[idempotent(consumer = "transfers", key = *id)]
fn transfer(
    conn: &mut Conn,
    id: &u64,
    (first, second): (i32, i32),
    barrier: &std::sync::Barrier,
    attempts: &std::sync::atomic::AtomicU32,
) -> Result<(), AppError> {
    let attempt = attempts.fetch_add(1, Ordering::SeqCst) + 1;
    let p = if BACKEND == inbox_diesel::schema::Backend::Postgres {
        "$1"
    } else {
        "?"
    };
    OUTBOX.publish(conn, Message::new("transfers", format!("{id} start")))?;
    diesel::sql_query(format!(
        "UPDATE accounts SET balance = balance - 1 WHERE id = {p}"
    ))
    .bind::<diesel::sql_types::Integer, _>(first)
    .execute(conn)?;
    if attempt == 1 {
        barrier.wait();
    }
    diesel::sql_query(format!(
        "UPDATE accounts SET balance = balance + 1 WHERE id = {p}"
    ))
    .bind::<diesel::sql_types::Integer, _>(second)
    .execute(conn)?;
    OUTBOX.publish(conn, Message::new("transfers", format!("{id} end")))?;
    Ok(())
}

fn outbox_ids_by_payload(db: &Db) -> Vec<(String, String)> {
    #[derive(QueryableByName)]
    struct Row {
        #[diesel(sql_type = diesel::sql_types::Text)]
        id: String,
        #[diesel(sql_type = diesel::sql_types::Binary)]
        payload: Vec<u8>,
    }
    let sql = match BACKEND {
        inbox_diesel::schema::Backend::Postgres => {
            "SELECT CAST(id AS text) AS id, payload FROM outbox ORDER BY payload"
        }
        _ => "SELECT id, payload FROM outbox ORDER BY payload",
    };
    diesel::sql_query(sql)
        .load::<Row>(&mut db.connect())
        .unwrap()
        .into_iter()
        .map(|row| (String::from_utf8(row.payload).unwrap(), row.id))
        .collect()
}

/// Two transfers in opposite directions deadlock for real; the server rolls one back and the
/// runtime runs its body again: its messages are written once, under the ids the same
/// deliveries get without any contention.
#[test]
fn a_body_retried_after_a_deadlock_publishes_the_same_ids() {
    let db = Db::new("outbox_deadlock");
    setup(&db);
    let barrier = std::sync::Barrier::new(2);
    let attempts = [
        std::sync::atomic::AtomicU32::new(0),
        std::sync::atomic::AtomicU32::new(0),
    ];
    std::thread::scope(|scope| {
        let runs: Vec<_> = [(1u64, (1, 2)), (2u64, (2, 1))]
            .into_iter()
            .zip(&attempts)
            .map(|((id, accounts), attempts)| {
                let (db, barrier) = (&db, &barrier);
                scope.spawn(move || {
                    let mut conn = db.connect();
                    transfer(&mut conn, &id, accounts, barrier, attempts)
                })
            })
            .collect();
        for run in runs {
            assert!(run.join().unwrap().unwrap().is_processed());
        }
    });
    let total: u32 = attempts.iter().map(|a| a.load(Ordering::SeqCst)).sum();
    assert_eq!(total, 3, "no deadlock was provoked and retried");

    let calm = Db::new("outbox_deadlock_calm");
    setup(&calm);
    let single = std::sync::Barrier::new(1);
    for (id, accounts) in [(1u64, (1, 2)), (2u64, (2, 1))] {
        let attempts = std::sync::atomic::AtomicU32::new(0);
        let mut conn = calm.connect();
        assert!(
            transfer(&mut conn, &id, accounts, &single, &attempts)
                .unwrap()
                .is_processed()
        );
    }
    let contended = outbox_ids_by_payload(&db);
    assert_eq!(contended.len(), 4, "{contended:?}");
    assert_eq!(contended, outbox_ids_by_payload(&calm));
}
