// The credit handlers and scenarios, written once over `Conn`: each backend's module in
// `main.rs` names its connection `Conn` (`type Conn = SqliteConnection;`, `PgConnection`,
// `MysqlConnection`) and includes this file. Read it with `Conn` as `SqliteConnection`: it is
// the code of a SQLite service.

fn apply_credit(conn: &mut Conn, msg: &CreditRequested) -> QueryResult<()> {
    diesel::insert_into(credits::table)
        .values((
            credits::message.eq(msg.message_id.to_string()),
            credits::amount.eq(msg.amount),
        ))
        .execute(conn)?;
    let updated = diesel::update(accounts::table.find(msg.account))
        .set(accounts::balance.eq(accounts::balance + msg.amount))
        .execute(conn)?;
    if updated == 0 {
        // The write after the marker and after the credit row fails.
        return Err(diesel::result::Error::NotFound);
    }
    Ok(())
}

/// What most handlers look like first: check, work, then mark. Each statement
/// commits on its own, and both instances can pass the check before either marks.
fn naive_credit(conn: &mut Conn, msg: &CreditRequested, window: &Barrier) -> QueryResult<bool> {
    let seen: i64 = naive_inbox::table
        .filter(naive_inbox::message_id.eq(msg.message_id.to_string()))
        .count()
        .get_result(conn)?;
    // The window between check and mark: the handler's whole run time in production,
    // made certain here so that every run shows it.
    window.wait();
    if seen > 0 {
        return Ok(false);
    }
    apply_credit(conn, msg)?;
    diesel::insert_into(naive_inbox::table)
        .values((
            naive_inbox::message_id.eq(msg.message_id.to_string()),
            naive_inbox::consumer.eq("credit"),
        ))
        .execute(conn)?;
    Ok(true)
}

#[idempotent(consumer = "credit", key = msg.message_id)]
fn on_credit(conn: &mut Conn, msg: &CreditRequested) -> QueryResult<()> {
    apply_credit(conn, msg)
}

// A write on any other connection would commit on its own, outside the inbox
// transaction. The macro refuses it at compile time:
//
//     #[idempotent(consumer = "credit", key = msg.message_id)]
//     fn on_credit(conn: &mut PgConnection, msg: &CreditRequested) -> Result<(), AppError> {
//         diesel::update(accounts::table.find(msg.account))
//             .set(accounts::balance.eq(accounts::balance + msg.amount))
//             .execute(&mut pool.get()?)?;
//         Ok(())
//     }
//
//     error: `.execute(…)` runs this statement on a connection other than `conn`, the
//            handler's transaction connection, so it would commit on its own, outside
//            the inbox transaction: a redelivered message would be recognised as a
//            duplicate and this write would still happen again; run it on the
//            handler's connection (`conn`, or `&mut *conn`) so that it commits or rolls
//            back with the inbox marker, or, if it must commit on its own, mark the
//            statement `#[inbox::outside_transaction("why")]`
//       |
//       |             .execute(&mut pool.get()?)?;
//       |                      ^^^^^^^^^^^^^^^^

#[idempotent(consumer = "payment", key = msg.message_id)]
fn on_payment(conn: &mut Conn, msg: &CreditRequested) -> QueryResult<()> {
    diesel::insert_into(payments::table)
        .values(payments::reference.eq(&msg.reference))
        .execute(conn)?;
    Ok(())
}

fn count(conn: &mut Conn, table: &str) -> i64 {
    #[derive(QueryableByName)]
    struct Count {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    diesel::sql_query(format!("SELECT count(*) AS n FROM {table}"))
        .get_result::<Count>(conn)
        .map(|c| c.n)
        .unwrap_or_else(|e| panic!("count {table}: {e}"))
}

fn reset(conn: &mut Conn) {
    run_each(conn, &RESET);
}

fn messages() -> Vec<CreditRequested> {
    (1..=MESSAGES)
        .map(|n| CreditRequested {
            message_id: Uuid::from_u128(n),
            account: 1,
            amount: 10,
            reference: format!("ref-{n}"),
        })
        .collect()
}

/// Two instances, their own connections, each receiving every message; a barrier
/// releases both deliveries of a message together.
fn two_instances<R: Send>(
    connect: &(dyn Fn() -> Conn + Sync),
    deliver: &(dyn Fn(&mut Conn, &CreditRequested, &Barrier) -> R + Sync),
) -> Vec<R> {
    let (start, window) = (Barrier::new(2), Barrier::new(2));
    let msgs = messages();
    std::thread::scope(|scope| {
        let instances: Vec<_> = (0..2)
            .map(|_| {
                let mut conn = connect();
                let (start, window, msgs) = (&start, &window, &msgs);
                scope.spawn(move || {
                    msgs.iter()
                        .map(|msg| {
                            start.wait();
                            deliver(&mut conn, msg, window)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        instances
            .into_iter()
            .flat_map(|i| i.join().expect("instance panicked"))
            .collect()
    })
}

fn run_demo(connect: &(dyn Fn() -> Conn + Sync)) -> Vec<Row> {
    let mut conn = connect();
    let mut rows = Vec::new();
    let per_message = |n: i64| n as f64 / MESSAGES as f64;

    reset(&mut conn);
    let results = two_instances(connect, &|c, msg, window| naive_credit(c, msg, window));
    let processed = results.iter().filter(|r| matches!(r, Ok(true))).count();
    rows.push(Row {
        scenario: "naive check-then-insert",
        credits_per_message: per_message(count(&mut conn, "credits")),
        markers_per_message: per_message(count(&mut conn, "naive_inbox")),
        outcome: format!("{processed} of {} deliveries applied", results.len()),
    });

    reset(&mut conn);
    let results = two_instances(connect, &|c, msg, _| on_credit(c, msg));
    let processed = results
        .iter()
        .filter(|r| matches!(r, Ok(Outcome::Processed(()))))
        .count();
    let duplicates = results
        .iter()
        .filter(|r| matches!(r, Ok(Outcome::Duplicate { .. })))
        .count();
    rows.push(Row {
        scenario: "#[idempotent]",
        credits_per_message: per_message(count(&mut conn, "credits")),
        markers_per_message: per_message(count(&mut conn, "inbox")),
        outcome: format!("{processed} processed, {duplicates} duplicates"),
    });

    reset(&mut conn);
    let failing: Vec<_> = messages()
        .into_iter()
        .map(|msg| CreditRequested {
            account: 404,
            ..msg
        })
        .collect();
    let errors = failing
        .iter()
        .filter(|msg| on_credit(&mut conn, msg).is_err())
        .count();
    rows.push(Row {
        scenario: "write after the marker fails",
        credits_per_message: per_message(count(&mut conn, "credits")),
        markers_per_message: per_message(count(&mut conn, "inbox")),
        outcome: format!("{errors} errors, all rolled back"),
    });

    reset(&mut conn);
    let first = CreditRequested {
        reference: "ref-dup".into(),
        ..messages()[0].clone()
    };
    let second = CreditRequested {
        message_id: Uuid::from_u128(999),
        ..first.clone()
    };
    assert!(
        on_payment(&mut conn, &first)
            .expect("the first payment")
            .is_processed()
    );
    let outcome = match on_payment(&mut conn, &second) {
        Err(e) => format!("error: {}", classify(&e, &InboxSchema::DEFAULT)),
        Ok(o) => format!("{o:?} (wrong!)"),
    };
    rows.push(Row {
        scenario: "business unique violation",
        credits_per_message: 0.0,
        markers_per_message: count(&mut conn, "inbox") as f64,
        outcome,
    });
    rows
}
