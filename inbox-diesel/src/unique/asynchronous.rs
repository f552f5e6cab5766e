//! The entry points on a diesel-async connection.

use super::*;
use crate::backends::AsyncInboxConnection;
use crate::io::Awaiting;
use crate::runtime::asynchronous::{AsyncBody, Cloned};
use std::marker::PhantomData;

/// [`insert_or_get`](super::insert_or_get) on a diesel-async connection; `insert` and
/// `reread` are async closures.
///
/// # Errors
/// As [`insert_or_get`](super::insert_or_get).
pub async fn insert_or_get_async<C, T, I, R>(
    conn: &mut C,
    key: &UniqueKey,
    insert: I,
    reread: R,
) -> Result<Created<T>, UniqueError>
where
    C: AsyncInboxConnection,
    I: Clone + for<'c> AsyncBody<&'c mut C, QueryResult<T>, Fut: Send>,
    R: Clone + for<'c> AsyncBody<&'c mut C, QueryResult<T>, Fut: Send>,
{
    insert_or_get_steps(
        &mut Awaiting(conn),
        key,
        &mut Cloned(insert),
        &mut Cloned(reread),
    )
    .await
}

/// [`upsert`](super::upsert) on a diesel-async connection.
///
/// Inside a future that must be `Send` (`tokio::spawn`), bind owned values (`String`, not
/// `&str`) in `insert`: the compiler cannot prove the future `Send` for every lifetime of
/// a borrowed bind (a limitation of `async fn` today, not of this function's bounds).
///
/// # Errors
/// As [`upsert`](super::upsert).
pub async fn upsert_async<'q, C, S, Id>(
    conn: &mut C,
    key: &UniqueKey,
    insert: S,
    #[allow(unused_variables)] id: Id,
) -> Result<i64, UniqueError>
where
    C: AsyncInboxConnection,
    S: Clone + Send + 'q,
    Id: Send + 'q,
    Upsert<S, Id>:
        diesel_async::methods::LoadQuery<'q, C, i64> + diesel_async::methods::ExecuteDsl<C> + 'q,
{
    let mut run = Statement(Upsert::<S, Id>::new(key, insert), PhantomData);
    upsert_steps(&mut Awaiting(conn), key, &mut run).await
}

/// [`upsert_all`](super::upsert_all) on a diesel-async connection.
///
/// # Errors
/// As [`upsert_all`](super::upsert_all).
pub async fn upsert_all_async<'q, 'r, C, R, S, Id>(
    conn: &mut C,
    key: &UniqueKey,
    rows: &'r [R],
    insert: impl Fn(&'r [R]) -> S,
    #[allow(unused_variables)] id: Id,
) -> Result<Vec<i64>, UniqueError>
where
    C: AsyncInboxConnection,
    S: Send + 'q,
    Id: Send + 'q,
    Upsert<S, Id>: diesel_async::methods::LoadQuery<'q, C, i64> + 'q,
{
    if let Some(answer) = upsert_all_answered::<C::Backend>(rows.len()) {
        return answer;
    }
    let statement = || Upsert::<S, Id>::new(key, insert(rows));
    let mut run = Statements(statement, PhantomData);
    one_statement(&mut Awaiting(conn), key, &mut run, Ok, || {
        Err(UniqueError::WinnerNotFound { key: *key })
    })
    .await
}

/// [`insert_if_absent`](super::insert_if_absent) on a diesel-async connection.
///
/// # Errors
/// As [`insert_if_absent`](super::insert_if_absent).
pub async fn insert_if_absent_async<'q, C, S>(
    conn: &mut C,
    key: &UniqueKey,
    insert: S,
) -> Result<bool, UniqueError>
where
    C: AsyncInboxConnection,
    S: Clone + Send + 'q,
    InsertIfAbsent<S>: diesel_async::methods::ExecuteDsl<C> + 'q,
{
    let statement = InsertIfAbsent { key: *key, insert };
    let mut run = Statement(statement, PhantomData);
    one_statement(
        &mut Awaiting(conn),
        key,
        &mut run,
        |rows| Ok(rows > 0),
        || Ok(false),
    )
    .await
}

/// [`serialize_on`](super::serialize_on) on a diesel-async connection; `body` is an async
/// closure.
///
/// # Errors
/// As [`serialize_on`](super::serialize_on).
pub async fn serialize_on_async<C, T, E, B>(conn: &mut C, key: &str, body: B) -> Result<T, E>
where
    C: AsyncInboxConnection,
    E: From<UniqueError>,
    B: Clone + for<'c> AsyncBody<&'c mut C, Result<T, E>, Fut: Send>,
{
    serialize_on_steps(&mut Awaiting(conn), key, &mut Cloned(body)).await
}

/// One of this module's statements, run afresh (cloned) by each call of the steps: a
/// type rather than an async closure, whose borrow of the statement the compiler cannot
/// prove `Send` for every lifetime. `'q` is the statement's, as the caller bound it.
struct Statement<'q, Q>(Q, PhantomData<&'q ()>);

impl<'q, C, S, Id> Body<C, QueryResult<i64>> for Statement<'q, Upsert<S, Id>>
where
    C: AsyncInboxConnection,
    Upsert<S, Id>: Clone
        + diesel_async::methods::LoadQuery<'q, C, i64>
        + diesel_async::methods::ExecuteDsl<C>
        + 'q,
{
    async fn call(&mut self, conn: &mut C) -> QueryResult<i64> {
        match <C::Backend as Dialect>::CONFLICTS {
            Conflicts::OnDuplicateKey => {
                diesel_async::RunQueryDsl::execute(self.0.clone(), conn).await?;
                last_insert_id(&mut Awaiting(conn)).await
            }
            _ => diesel_async::RunQueryDsl::get_result(self.0.clone(), conn).await,
        }
    }
}

impl<'q, C, S> Body<C, QueryResult<usize>> for Statement<'q, InsertIfAbsent<S>>
where
    C: AsyncInboxConnection,
    S: Clone + Send + 'q,
    InsertIfAbsent<S>: diesel_async::methods::ExecuteDsl<C> + 'q,
{
    async fn call(&mut self, conn: &mut C) -> QueryResult<usize> {
        diesel_async::RunQueryDsl::execute(self.0.clone(), conn).await
    }
}

/// A multi-row statement, built afresh by each call (it is not `Clone`).
struct Statements<'q, F>(F, PhantomData<&'q ()>);

impl<'q, C, F, S, Id> Body<C, QueryResult<Vec<i64>>> for Statements<'q, F>
where
    C: AsyncInboxConnection,
    F: Fn() -> Upsert<S, Id>,
    S: Send + 'q,
    Id: Send + 'q,
    Upsert<S, Id>: diesel_async::methods::LoadQuery<'q, C, i64> + 'q,
{
    async fn call(&mut self, conn: &mut C) -> QueryResult<Vec<i64>> {
        diesel_async::RunQueryDsl::get_results((self.0)(), conn).await
    }
}
