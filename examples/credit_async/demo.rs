// The handler and the demonstration, written once over `Conn`: each backend's module in
// `main.rs` names its diesel-async connection `Conn`
// (`SyncConnectionWrapper<SqliteConnection>`, `AsyncPgConnection`) and includes this file.

#[idempotent(consumer = "credit", key = msg.message_id)]
async fn on_credit(
    conn: &mut Conn,
    msg: &CreditRequested,
    slow: Duration,
) -> diesel::QueryResult<()> {
    diesel::insert_into(credits::table)
        .values((
            credits::message.eq(msg.message_id.to_string()),
            credits::amount.eq(msg.amount),
        ))
        .execute(conn)
        .await?;
    diesel::update(accounts::table.find(msg.account))
        .set(accounts::balance.eq(accounts::balance + msg.amount))
        .execute(conn)
        .await?;
    // Work that takes a while: an external lookup, a large computation.
    tokio::time::sleep(slow).await;
    Ok(())
}

async fn count(conn: &mut Conn, table: &str) -> i64 {
    #[derive(diesel::QueryableByName)]
    struct Count {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    diesel::sql_query(format!("SELECT count(*) AS n FROM {table}"))
        .get_result::<Count>(conn)
        .await
        .map(|c| c.n)
        .unwrap_or_else(|e| panic!("count {table}: {e}"))
}

/// Creates the tables on the database at `url` and runs the demonstration on a pool
/// of two connections to it.
async fn serve(url: &str, inbox_sql: &str) {
    let mut conn = Conn::establish(url)
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"));
    conn.batch_execute(inbox_sql)
        .await
        .expect("create the inbox");
    conn.batch_execute(BUSINESS_SCHEMA)
        .await
        .expect("create the business tables");
    println!("database: {url}\n");
    let manager = AsyncDieselConnectionManager::<Conn>::new(url);
    run_demo(
        Pool::builder()
            .max_size(2)
            .build(manager)
            .await
            .expect("a pool"),
    )
    .await;
}

async fn run_demo(pool: Pool<Conn>) {
    let barrier = Arc::new(Barrier::new(2));
    let instances: Vec<_> = (0..2)
        .map(|_| {
            let (pool, barrier) = (pool.clone(), barrier.clone());
            tokio::spawn(async move {
                let (mut processed, mut duplicates) = (0, 0);
                for n in 1..=MESSAGES {
                    let msg = CreditRequested {
                        message_id: Uuid::from_u128(n),
                        account: 1,
                        amount: 10,
                    };
                    let mut conn = pool.get().await.expect("a pooled connection");
                    barrier.wait().await;
                    match on_credit(&mut conn, &msg, Duration::ZERO).await {
                        Ok(Outcome::Processed(())) => processed += 1,
                        Ok(Outcome::Duplicate { .. }) => duplicates += 1,
                        Err(e) => panic!("message {n}: {e}"),
                    }
                }
                (processed, duplicates)
            })
        })
        .collect();
    let (mut processed, mut duplicates) = (0, 0);
    for instance in instances {
        let (p, d) = instance.await.expect("instance panicked");
        processed += p;
        duplicates += d;
    }
    let mut conn = pool.get().await.expect("a pooled connection");
    println!("{MESSAGES} messages, each delivered to two instances at the same moment:");
    println!(
        "  {processed} processed, {duplicates} duplicates; {} credits and {} markers in the database\n",
        count(&mut conn, "credits").await,
        count(&mut conn, "inbox").await,
    );
    drop(conn);

    let late = CreditRequested {
        message_id: Uuid::from_u128(1_000),
        account: 1,
        amount: 10,
    };
    let mut conn = pool.get().await.expect("a pooled connection");
    let cancelled = tokio::time::timeout(
        Duration::from_millis(50),
        on_credit(&mut conn, &late, Duration::from_secs(60)),
    )
    .await;
    drop(conn);
    let mut conn = pool.get().await.expect("a pooled connection");
    let credits: i64 = credits::table
        .filter(credits::message.eq(late.message_id.to_string()))
        .count()
        .get_result(&mut conn)
        .await
        .expect("count credits");
    println!("A handler cancelled by a timeout in the middle of its body:");
    println!(
        "  timed out: {}; its credit rows afterwards: {credits}; redelivered: {:?}",
        cancelled.is_err(),
        on_credit(&mut conn, &late, Duration::ZERO)
            .await
            .expect("the redelivery"),
    );
}
