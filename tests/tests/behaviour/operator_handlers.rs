// The handlers of the operator tests, on one backend: included by `operator.rs` into each
// backend's module, which names `Conn`.

/// Credits account 1: the business change a message makes.
#[idempotent(consumer = "operator", key = *id)]
fn apply(conn: &mut Conn, id: &u64) -> Result<(), AppError> {
    diesel::sql_query("UPDATE accounts SET balance = balance + 1 WHERE id = 1").execute(conn)?;
    Ok(())
}

/// Claim mode: runs `effect`, then counts the side effect in `sent`.
#[allow(dead_code)]
#[idempotent(consumer = "operator", key = *id, mode = "claim")]
fn send(
    conn: &mut Conn,
    id: &u64,
    sent: &std::sync::atomic::AtomicUsize,
    effect: &dyn Fn(),
) -> Result<(), AppError> {
    effect();
    sent.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    Ok(())
}
