// The outbox's side, written once over `Conn` like `effects.rs`: a handler that publishes, the
// relay on a connection of the pool, and the rows the orchestrator counts. Each backend's
// module in `store.rs` includes this file after `effects.rs`.

/// The effect of message `message` and what it publishes: one row in `effects` and one
/// message as `to` says, its payload the message's id, both in the
/// transaction of the inbox marker; then a pause — work that takes a while — in which the
/// orchestrator kills one consumer. A kill there rolls back the marker, the row and the
/// outbox row together: nothing is relayed for a message that was not applied.
#[idempotent(consumer = "broker-example", key = key)]
async fn apply_and_publish(
    conn: &mut Conn,
    key: &MessageKey,
    message: &str,
    consumer: &str,
    pause: Duration,
    to: &Publish<'_>,
) -> Result<(), inbox_diesel::Error> {
    diesel::insert_into(effects::table)
        .values((effects::message.eq(message), effects::consumer.eq(consumer)))
        .execute(conn)
        .await?;
    to.outbox
        .publish_async(
            conn,
            Message::new(to.destination, message).key(to.ordering_key),
        )
        .await?;
    Event::Handling {
        id: message.to_owned(),
    }
    .emit();
    tokio::time::sleep(pause).await;
    Ok(())
}

/// [`apply_and_publish`] on a connection of the pool.
pub(super) async fn handle_and_publish(
    pool: &Pool<Conn>,
    key: &MessageKey,
    message: &str,
    consumer: &str,
    pause: Duration,
    to: Publish<'_>,
) -> Result<Outcome<()>, Failure> {
    let mut conn = pool.get().await.map_err(inbox_diesel::Error::checkout)?;
    Ok(apply_and_publish(&mut conn, key, message, consumer, pause, &to).await?)
}

/// `relay` on a connection of the pool until `shutdown` completes.
pub(super) async fn run_relay<S: Sink>(
    pool: &Pool<Conn>,
    relay: &Relay,
    sink: &mut S,
    shutdown: impl Future<Output = ()>,
) -> Result<RelayReport, String> {
    let mut conn = pool.get().await.map_err(|e| e.to_string())?;
    relay
        .run(&mut *conn, sink, shutdown)
        .await
        .map_err(|e| e.to_string())
}

/// Every row of `outbox`: its payload, and whether it was marked sent or parked.
pub(super) async fn outbox_rows(
    pool: &Pool<Conn>,
    outbox: &Outbox,
) -> Result<Vec<OutboxRow>, String> {
    #[derive(diesel::QueryableByName)]
    struct Payload {
        #[diesel(sql_type = diesel::sql_types::Binary)]
        payload: Vec<u8>,
    }
    let mut conn = pool.get().await.map_err(|e| e.to_string())?;
    let table = outbox.table();
    let mut load = async |condition: &str| {
        diesel::sql_query(format!("SELECT payload FROM {table} WHERE {condition}"))
            .load::<Payload>(&mut conn)
            .await
            .map_err(|e| format!("read the outbox: {e}"))
            .map(|rows| {
                rows.into_iter()
                    .map(|row| String::from_utf8_lossy(&row.payload).into_owned())
                    .collect::<Vec<_>>()
            })
    };
    let sent = load("sent_at IS NOT NULL").await?;
    let parked = load("parked_at IS NOT NULL").await?;
    let waiting = load("sent_at IS NULL AND parked_at IS NULL").await?;
    let row = |state: OutboxState| move |message: String| OutboxRow { message, state };
    Ok(sent
        .into_iter()
        .map(row(OutboxState::Sent))
        .chain(parked.into_iter().map(row(OutboxState::Parked)))
        .chain(waiting.into_iter().map(row(OutboxState::Waiting)))
        .collect())
}

/// Runs `sql` on a connection of the pool.
pub(super) async fn execute(pool: &Pool<Conn>, sql: &str) -> Result<(), String> {
    let mut conn = pool.get().await.map_err(|e| e.to_string())?;
    conn.batch_execute(sql)
        .await
        .map_err(|e| format!("{sql}: {e}"))
}
