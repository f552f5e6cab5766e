//! Each get-or-create written once over [`Io`]: the key's lock, the insert and its re-read,
//! the one statement retried, and the transaction around them.

use super::*;

/// What taking a key lock gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum KeyLock {
    /// Held until the transaction ends (MySQL: until released).
    Held,
    /// Not granted: the wait timed out (MySQL).
    NotGranted,
    /// Held, but in a transaction whose snapshot predates it (PostgreSQL above READ
    /// COMMITTED).
    SnapshotTooOld,
}

#[derive(diesel::QueryableByName)]
pub(super) struct Answer {
    #[diesel(sql_type = Nullable<BigInt>)]
    n: Option<i64>,
}

impl Answer {
    /// The `n` of the one row a query returns.
    fn of(rows: Vec<Answer>) -> QueryResult<Option<i64>> {
        rows.into_iter()
            .next()
            .map(|row| row.n)
            .ok_or(DieselError::NotFound)
    }
}

// The key lock's statements and MySQL's `LAST_INSERT_ID()`, on any connection.

/// Takes the lock on `key`: what [`serialize_on`] holds while its body runs.
pub(super) async fn lock_key<S: Io>(io: &mut S, key: &str) -> QueryResult<KeyLock> {
    let n = match S::Backend::lock_key(key) {
        Some(sql) => Answer::of(io.load(&sql).await?)?,
        None => Some(1),
    };
    Ok(match n {
        Some(1) => KeyLock::Held,
        Some(2) => KeyLock::SnapshotTooOld,
        _ => KeyLock::NotGranted,
    })
}

/// Fails when an earlier statement aborted the transaction ([`Dialect::ABORTED_PROBE`]).
pub(super) async fn probe_transaction<S: Io>(io: &mut S) -> QueryResult<()> {
    if let Some(probe) = S::Backend::ABORTED_PROBE {
        io.load::<Answer>(&Sql::new(probe)).await?;
    }
    Ok(())
}

/// Releases a session's key lock ([`Dialect::unlock_key`]); nothing where the transaction's
/// end does.
pub(super) async fn unlock_key<S: Io>(io: &mut S, key: &str) -> QueryResult<()> {
    if let Some(sql) = S::Backend::unlock_key(key) {
        io.load::<Answer>(&sql).await?;
    }
    Ok(())
}

/// MySQL's `LAST_INSERT_ID()`: the id `upsert`'s `ON DUPLICATE KEY UPDATE` left there.
pub(super) async fn last_insert_id<S: Io>(io: &mut S) -> QueryResult<i64> {
    Answer::of(
        io.load(&Sql::new("SELECT CAST(LAST_INSERT_ID() AS SIGNED) AS n"))
            .await?,
    )?
    .ok_or(DieselError::NotFound)
}

// The steps of each function, written once over `Transactions` for both IO models: the
// sync functions run them on `Blocking` with `complete_now`, the async ones await them on
// `Awaiting`. A caller's closure is a `Body`, called with the connection.

/// Whether a transaction is open on the connection.
pub(super) fn in_transaction<S: Io>(io: &mut S) -> QueryResult<bool> {
    Ok(io.transaction_status().transaction_depth()?.is_some())
}

pub(super) async fn insert_or_get_steps<S, T>(
    io: &mut S,
    key: &UniqueKey,
    insert: &mut impl Body<S::Conn, QueryResult<T>>,
    reread: &mut impl Body<S::Conn, QueryResult<T>>,
) -> Result<Created<T>, UniqueError>
where
    S: Transactions,
{
    let nested = in_transaction(io)?;
    let mut attempt = 0;
    loop {
        // A transaction of its own, or a savepoint inside the caller's: `insert` may run more
        // than one statement, and on PostgreSQL a violation must not abort the caller's
        // transaction. The re-read runs after it, in the caller's context.
        io.begin_transaction().await?;
        let inserted = insert.call(io.conn()).await;
        let failure = match end(io, inserted, |e| e).await {
            Ok(row) => return Ok(Created::New(row)),
            Err(error) => match UniqueError::sort(error, key) {
                // The race, lost: the winner has committed (the insert waited for it).
                None => match reread.call(io.conn()).await {
                    Ok(row) => return Ok(Created::Existing(row)),
                    Err(DieselError::NotFound) => UniqueError::WinnerNotFound { key: *key },
                    Err(error) => UniqueError::Database(error),
                },
                // A row that collides with the key's row and another index's at once is
                // reported for whichever index the server checked first (SQLite: the last
                // created). The key's row, if there is one, is the answer.
                Some(other @ UniqueError::OtherViolation { .. }) => {
                    match reread.call(io.conn()).await {
                        Ok(row) => return Ok(Created::Existing(row)),
                        Err(DieselError::NotFound) => other,
                        Err(error) => UniqueError::Database(error),
                    }
                }
                Some(failure) => failure,
            },
        };
        retry_or_return(io, failure, nested, &mut attempt).await?;
    }
}

/// One statement on the key, `run`: in a savepoint inside a transaction; `done` maps its
/// result, `key_violated` answers the key's own violation. Another index's violation is
/// tried once more: on PostgreSQL a concurrent insert of the same row can trip a unique index
/// that is not the conflict target (checked while waiting for the other transaction) before
/// the key's conflict is seen; the second try sees the committed row and resolves by the key.
pub(super) async fn one_statement<S, V, Out>(
    io: &mut S,
    key: &UniqueKey,
    run: &mut impl Body<S::Conn, QueryResult<V>>,
    done: impl Fn(V) -> Result<Out, UniqueError>,
    key_violated: impl Fn() -> Result<Out, UniqueError>,
) -> Result<Out, UniqueError>
where
    S: Transactions,
{
    let nested = in_transaction(io)?;
    let (mut attempt, mut tried_again) = (0, false);
    loop {
        let result = match nested {
            true => {
                io.begin_transaction().await?;
                let result = run.call(io.conn()).await;
                end(io, result, |e| e).await
            }
            false => run.call(io.conn()).await,
        };
        let failure = match result {
            Ok(value) => return done(value),
            Err(error) => match UniqueError::sort(error, key) {
                None => return key_violated(),
                Some(failure) => failure,
            },
        };
        if matches!(failure, UniqueError::OtherViolation { .. }) && !tried_again {
            tried_again = true;
            continue;
        }
        retry_or_return(io, failure, nested, &mut attempt).await?;
    }
}

/// `upsert`'s answers: the id, or — its key violated, which the statement itself resolves —
/// a winner that cannot be read.
pub(super) async fn upsert_steps<S: Transactions>(
    io: &mut S,
    key: &UniqueKey,
    run: &mut impl Body<S::Conn, QueryResult<i64>>,
) -> Result<i64, UniqueError> {
    one_statement(io, key, run, Ok, || {
        Err(UniqueError::WinnerNotFound { key: *key })
    })
    .await
}

/// What `upsert_all` answers before any statement: refused where the backend's upsert
/// leaves one id in `LAST_INSERT_ID()` ([`Conflicts::OnDuplicateKey`]), which cannot yield
/// every row's; no ids for no rows. `None`: the statement runs.
pub(super) fn upsert_all_answered<D: Dialect>(
    rows: usize,
) -> Option<Result<Vec<i64>, UniqueError>> {
    if D::CONFLICTS == Conflicts::OnDuplicateKey {
        return Some(Err(UniqueError::Unsupported {
            what: "MySQL has no RETURNING: a multi-row upsert cannot yield every row's id; call \
                   upsert or insert_or_get per row, in one transaction",
        }));
    }
    (rows == 0).then(|| Ok(Vec::new()))
}

pub(super) async fn serialize_on_steps<S, T, E>(
    io: &mut S,
    name: &str,
    body: &mut impl Body<S::Conn, Result<T, E>>,
) -> Result<T, E>
where
    S: Transactions,
    E: From<UniqueError>,
{
    let database = |error: DieselError| E::from(UniqueError::Database(error));
    let nested = in_transaction(io).map_err(database)?;
    // A session's lock (MySQL's GET_LOCK) is released by its unlock, not by COMMIT. Taken
    // inside a transaction it would be released before the commit that publishes the rows,
    // and the next caller would not see them; so it is taken before BEGIN and released after
    // COMMIT, and refused inside a transaction.
    let session_lock = S::Backend::unlock_key(name).is_some();
    if session_lock && nested {
        return Err(database(DieselError::AlreadyInTransaction));
    }
    if session_lock {
        lock(io, name, database).await?;
    }
    // A transaction (PostgreSQL: READ COMMITTED, so that each statement sees what the
    // previous holder committed; SQLite: BEGIN IMMEDIATE, whose write lock is the
    // serialisation), or a savepoint inside the caller's.
    let begun = match nested {
        true => io.begin_transaction().await,
        false => io.begin_write().await,
    };
    let result = match begun {
        Ok(()) => {
            let locked = match session_lock {
                true => Ok(()),
                false => lock(io, name, database).await,
            };
            let result = match locked {
                Ok(()) => body.call(io.conn()).await,
                Err(error) => Err(error),
            };
            end(io, result, database).await
        }
        Err(error) => Err(database(error)),
    };
    if session_lock {
        // After the commit. A lock that could not be released stays with the session: the
        // connection is marked broken, so that a pool drops it rather than hand the lock to
        // its next user.
        if let Err(error) = unlock_key(io, name).await {
            tracing::warn!(%error, "releasing the key lock failed; the connection is dropped");
            io.transaction_status().set_in_error();
        }
    }
    result
}

/// After a failed attempt: returns the failure inside the caller's transaction (only the
/// whole transaction can run again), when it is not transient, or after the last retry;
/// otherwise waits before the next attempt.
pub(super) async fn retry_or_return<S: Io>(
    io: &mut S,
    failure: UniqueError,
    nested: bool,
    attempt: &mut u32,
) -> Result<(), UniqueError> {
    if nested || !failure.is_transient() || *attempt == UniqueKey::RETRIES {
        return Err(failure);
    }
    io.sleep(RetryPolicy::default().backoff(*attempt, fastrand::f64()))
        .await;
    *attempt += 1;
    Ok(())
}

/// Takes the key lock: `Ok(())`, or the error converted by `convert`.
pub(super) async fn lock<S: Io, E: From<UniqueError>>(
    io: &mut S,
    name: &str,
    convert: impl Fn(DieselError) -> E,
) -> Result<(), E> {
    match lock_key(io, name).await {
        Ok(KeyLock::Held) => Ok(()),
        Ok(KeyLock::NotGranted) => Err(E::from(UniqueError::LockTimeout {
            key: name.to_owned(),
        })),
        Ok(KeyLock::SnapshotTooOld) => Err(E::from(UniqueError::Unsupported {
            what: "serialize_on inside a REPEATABLE READ or SERIALIZABLE transaction: its \
                   snapshot predates the lock, so the previous holder's rows stay invisible; \
                   call it outside a transaction or under READ COMMITTED",
        })),
        Err(error) => Err(convert(error)),
    }
}

/// Ends the transaction or savepoint begun for `result`: commits it if `result` is `Ok` (on
/// PostgreSQL after checking that no swallowed error aborted it), rolls it back otherwise. A
/// failed rollback is logged, and the error that caused it returned.
pub(super) async fn end<S: Transactions, T, E>(
    io: &mut S,
    result: Result<T, E>,
    convert: impl Fn(DieselError) -> E,
) -> Result<T, E> {
    match result {
        Ok(value) => {
            let committed = match probe_transaction(io).await {
                Ok(()) => io.commit_transaction().await,
                Err(error) => Err(error),
            };
            match committed {
                Ok(()) => Ok(value),
                Err(error) => {
                    roll_back(io).await;
                    Err(convert(error))
                }
            }
        }
        Err(error) => {
            roll_back(io).await;
            Err(error)
        }
    }
}

pub(super) async fn roll_back<S: Transactions>(io: &mut S) {
    match io.rollback_transaction().await {
        // A failed COMMIT has already ended the transaction.
        Ok(()) | Err(DieselError::NotInTransaction) => {}
        Err(error) => tracing::warn!(%error, "rolling back after a failure failed"),
    }
}

/// A caller's `FnOnce` body, called once.
pub(super) fn once<C, R>(body: impl FnOnce(&mut C) -> R) -> Immediate<impl FnMut(&mut C) -> R> {
    let mut body = Some(body);
    Immediate(move |conn: &mut C| (body.take().expect("serialize_on runs its body once"))(conn))
}
