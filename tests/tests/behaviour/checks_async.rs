// The startup check under a pool, on each async backend: included beside `Db` (the fixture)
// and `AsyncConnection` (what its pool hands out) in `checks.rs`, whose subscriber counts
// the runtime's `inbox::check` events per thread.
use diesel_async::RunQueryDsl;
use inbox_diesel::idempotent;
use inbox_tests::{Credit, credits};

#[idempotent(consumer = "credit", key = msg.id)]
async fn note(conn: &mut AsyncConnection, msg: &Credit) -> diesel::QueryResult<()> {
    use diesel::ExpressionMethods;
    diesel::insert_into(credits::table)
        .values((
            credits::message.eq(msg.id.to_string()),
            credits::account.eq(msg.account),
            credits::amount.eq(msg.amount),
        ))
        .execute(conn)
        .await?;
    Ok(())
}

/// A pool moves its connections between its idle list and the handlers that check them out:
/// the startup check runs once per connection, not once per checkout, though each checkout
/// puts the connection at another address. A task per message, as a broker pump spawns them,
/// all alive at once: each checks a connection out into its own future. On a current-thread
/// runtime, so that the tasks and the checks they count are on this test's thread.
#[tokio::test]
async fn a_pooled_connection_is_checked_once_not_at_each_checkout() {
    use diesel_async::pooled_connection::AsyncDieselConnectionManager;
    use diesel_async::pooled_connection::bb8::Pool;

    const CONNECTIONS: u32 = 4;
    const MESSAGES: u128 = 120;
    let db = <Db>::new("checked_once_per_connection");
    let manager = AsyncDieselConnectionManager::<AsyncConnection>::new(db.url());
    let pool = Pool::builder()
        .max_size(CONNECTIONS)
        .min_idle(Some(CONNECTIONS))
        .build(manager)
        .await
        .unwrap();
    let before = super::checks_on_this_thread();
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..MESSAGES {
        let pool = pool.clone();
        tasks.spawn(async move {
            let mut pooled = pool.get().await.unwrap();
            tokio::task::yield_now().await;
            let outcome = note(&mut pooled, &Credit::new(n)).await;
            assert!(outcome.unwrap().is_processed(), "message {n}");
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    let checks = super::checks_on_this_thread() - before;
    let mut pooled = pool.get().await.unwrap();
    let rows: i64 = {
        use diesel::QueryDsl;
        credits::table
            .count()
            .get_result(&mut *pooled)
            .await
            .unwrap()
    };
    assert_eq!(rows, MESSAGES as i64);
    // One per connection; a MySQL pool checks each session when the server refuses its
    // first marker, which is also once per connection.
    assert!(
        (1..=CONNECTIONS as usize).contains(&checks),
        "{checks} checks for {MESSAGES} messages on {CONNECTIONS} connections"
    );
}

/// [`inbox_diesel::schema::verify_for_async`]: a table without the `result` column a
/// `store_result` handler writes is refused at startup, on a pool's connection.
#[tokio::test]
async fn the_async_startup_check_told_what_handlers_need_refuses_a_table_without_it() {
    use diesel_async::pooled_connection::AsyncDieselConnectionManager;
    use diesel_async::pooled_connection::bb8::Pool;
    use inbox_diesel::InboxSchema;
    use inbox_diesel::schema::{self, Needs};
    let db = <Db>::new("async_startup_needs");
    let manager = AsyncDieselConnectionManager::<AsyncConnection>::new(db.url());
    let pool = Pool::builder().max_size(1).build(manager).await.unwrap();
    let mut pooled = pool.get().await.unwrap();
    schema::verify_async(&mut *pooled, &InboxSchema::DEFAULT)
        .await
        .unwrap();
    let refusal = schema::verify_for_async(
        &mut *pooled,
        &InboxSchema::DEFAULT,
        Needs::default().result(),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(refusal.contains("no `result` column"), "{refusal}");
}
