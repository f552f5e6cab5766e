// The handler and the counts, written once over `Conn`: each backend's module in `store.rs`
// names its diesel-async connection `Conn` (`SyncConnectionWrapper<SqliteConnection>`,
// `AsyncPgConnection`, `AsyncMysqlConnection`), defines `manager(url)` for its pool, and
// includes this file.

/// The effect of message `message`: one row in `effects`, written in the transaction of the
/// inbox marker, then a pause — work that takes a while — in which the orchestrator kills
/// one consumer. A kill there rolls back the marker and the row together.
#[idempotent(consumer = "broker-example", key = key)]
async fn apply(
    conn: &mut Conn,
    key: &MessageKey,
    message: &str,
    consumer: &str,
    pause: Duration,
) -> Result<(), inbox_diesel::Error> {
    diesel::insert_into(effects::table)
        .values((effects::message.eq(message), effects::consumer.eq(consumer)))
        .execute(conn)
        .await?;
    Event::Handling {
        id: message.to_owned(),
    }
    .emit();
    tokio::time::sleep(pause).await;
    Ok(())
}

/// A pool of `connections` to `url`, one of them connected already: a database that cannot
/// be reached is reported here, not by the first handler.
pub(super) async fn pool(url: &str, connections: u32) -> Result<Pool<Conn>, String> {
    let shown = crate::without_password(url);
    let pool = Pool::builder()
        .max_size(connections)
        .build(manager(url))
        .await
        .map_err(|e| format!("connect to {shown}: {e}"))?;
    drop(
        pool.get()
            .await
            .map_err(|e| format!("connect to {shown}: {e}"))?,
    );
    Ok(pool)
}

/// [`apply`] on a connection of the pool.
pub(super) async fn handle(
    pool: &Pool<Conn>,
    key: &MessageKey,
    message: &str,
    consumer: &str,
    pause: Duration,
) -> Result<Outcome<()>, Failure> {
    // bb8 tests a connection as it is checked out: one the database closed is replaced
    // before a handler gets it.
    let mut conn = pool.get().await.map_err(inbox_diesel::Error::checkout)?;
    Ok(apply(&mut conn, key, message, consumer, pause).await?)
}

/// How many effect rows each (message, consumer) has.
pub(super) async fn applied(pool: &Pool<Conn>) -> Result<Vec<(String, String, i64)>, String> {
    let mut conn = pool.get().await.map_err(|e| e.to_string())?;
    effects::table
        .group_by((effects::message, effects::consumer))
        .select((
            effects::message,
            effects::consumer,
            diesel::dsl::count_star(),
        ))
        .load(&mut conn)
        .await
        .map_err(|e| format!("count the effects: {e}"))
}
