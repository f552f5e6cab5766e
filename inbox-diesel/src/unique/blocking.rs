//! The entry points on a sync connection (or an enum of them).

use super::*;

/// Inserts a row, or — when a concurrent or earlier caller holds the key — reads back theirs.
///
/// `insert` runs the insert and returns the row (with `RETURNING` where the backend has it, or
/// a read after the insert); `reread` reads the row with the key — the winner's.
/// A violation of `key` leads to the re-read. So does a violation of another unique index,
/// because a row that collides on several indexes is reported for one of them only (SQLite
/// names the index it checked first, which is not always the key's): if the key's row is
/// there it is the answer, and otherwise the other violation is returned,
/// [`UniqueError::OtherViolation`] with the server's name for it — a primary key behind its
/// sequence, another business rule.
///
/// `insert` runs in a transaction of its own, or in a savepoint inside the caller's, so that
/// all its statements commit or none do and, on PostgreSQL, the violation does not abort the
/// caller's transaction: the caller's other writes commit with it. The re-read runs after
/// that, in the caller's transaction if there is one. Outside a transaction, transient
/// failures (deadlocks, SQLite's busy database) are retried.
///
/// On MySQL and MariaDB (REPEATABLE READ by default), when the surrounding transaction has
/// already read something, make `reread` a locking read (`.for_update()`): a plain read sees
/// the snapshot of that first read, without the winner's row.
///
/// `conn` is a backend's connection, or an application's enum of connections
/// (`#[derive(diesel::MultiConnection, inbox_diesel::MultiConnection)]`): `insert` and
/// `reread` are then given the enum, and the savepoint and the violation's reading are the
/// variant's.
///
/// # Errors
/// [`UniqueError::OtherViolation`], [`UniqueError::WinnerNotFound`], or the database's error.
pub fn insert_or_get<C, T>(
    conn: &mut C,
    key: &UniqueKey,
    insert: impl FnMut(&mut C) -> QueryResult<T>,
    reread: impl FnMut(&mut C) -> QueryResult<T>,
) -> Result<Created<T>, UniqueError>
where
    C: crate::backends::HandlerConnection,
{
    // On an application's enum of connections (`#[derive(inbox_diesel::MultiConnection)]`)
    // the statements of the runtime's own run on its variant; `insert` and `reread` are
    // given the enum.
    conn.__inbox_visit(InsertOrGet {
        key,
        insert,
        reread,
        row: std::marker::PhantomData,
    })
}

/// [`insert_or_get`] on the connection an application's connection leads to: itself, or
/// the variant of its enum of connections, whose transactions are the enum's; `insert` and
/// `reread` are given the application's connection.
pub(super) struct InsertOrGet<'k, I, R, T> {
    key: &'k UniqueKey,
    insert: I,
    reread: R,
    row: std::marker::PhantomData<fn() -> T>,
}

impl<O, T, I, R> crate::backends::Visit<O> for InsertOrGet<'_, I, R, T>
where
    O: Send,
    I: FnMut(&mut O) -> QueryResult<T>,
    R: FnMut(&mut O) -> QueryResult<T>,
{
    type Output = Result<Created<T>, UniqueError>;

    fn visit<C: crate::backends::InboxConnection>(
        self,
        outer: &mut O,
        project: fn(&mut O) -> &mut C,
    ) -> Self::Output {
        complete_now(insert_or_get_steps(
            &mut crate::runtime::sync::Projected::new(outer, project),
            self.key,
            &mut Immediate(self.insert),
            &mut Immediate(self.reread),
        ))
    }
}

/// Inserts a row unless its key exists, and returns the id of the row with the key, in one
/// statement — `INSERT … ON CONFLICT (<key>) DO UPDATE SET … RETURNING <id>` on PostgreSQL
/// and SQLite, `INSERT … ON DUPLICATE KEY UPDATE <id> = LAST_INSERT_ID(<id>)` and
/// `SELECT LAST_INSERT_ID()` on MySQL and MariaDB (see [`Upsert`]).
///
/// `insert` is a plain `diesel::insert_into(…).values(…)` of one row; `id` the table's
/// integer id column. On MySQL `id` must be the table's `AUTO_INCREMENT` column and the
/// insert must not set it: `LAST_INSERT_ID()` changes only for a generated value, and would
/// otherwise name the session's previous insert.
///
/// What it costs: on PostgreSQL every duplicate writes a new version of the existing row
/// (the no-op `SET` is still an update: a dead tuple for vacuum, WAL, and every `BEFORE
/// UPDATE` trigger fires); SQLite likewise rewrites the row. Where no id is needed,
/// [`insert_if_absent`] writes nothing on a duplicate. On MySQL `ON DUPLICATE KEY UPDATE`
/// cannot name an index: a collision on *any* unique index (the primary key included) yields
/// that row's id. Use it only on a table whose one unique index besides an auto-increment
/// primary key is the key, and [`insert_or_get`] otherwise. Every form burns a sequence or
/// auto-increment value on a duplicate.
///
/// A partial unique index needs its predicate in the key ([`UniqueKey::partial`]).
///
/// # Errors
/// [`UniqueError::OtherViolation`] for another index (PostgreSQL, SQLite), or the database's
/// error.
pub fn upsert<'q, C, S, Id>(
    conn: &mut C,
    key: &UniqueKey,
    insert: S,
    #[allow(unused_variables)] id: Id,
) -> Result<i64, UniqueError>
where
    C: crate::backends::InboxConnection,
    S: Clone,
    Upsert<S, Id>:
        diesel::query_dsl::LoadQuery<'q, C, i64> + diesel::query_dsl::methods::ExecuteDsl<C>,
{
    use diesel::RunQueryDsl;
    let statement = Upsert::<S, Id>::new(key, insert);
    let mut run = Immediate(|conn: &mut C| match <C::Backend as Dialect>::CONFLICTS {
        Conflicts::OnDuplicateKey => {
            statement.clone().execute(conn)?;
            complete_now(last_insert_id(&mut Blocking(conn)))
        }
        _ => statement.clone().get_result::<i64>(conn),
    });
    complete_now(upsert_steps(&mut Blocking(conn), key, &mut run))
}

/// The batch form of [`upsert`]: one statement for many rows, the ids of the rows with their
/// keys, new or existing — one id per row of `insert`, in the order PostgreSQL returns them
/// (read the rows back by key where the pairing matters).
///
/// `insert` builds the multi-row `diesel::insert_into(…).values(rows)` from `rows`, which
/// must be [`collapse`]d first: PostgreSQL refuses to let one `ON CONFLICT DO UPDATE` touch a
/// row twice ("ON CONFLICT DO UPDATE command cannot affect row a second time", SQLSTATE
/// `21000`). No rows: no statement, no ids.
///
/// PostgreSQL only, in practice: diesel builds no multi-row insert for SQLite (the call does
/// not compile), and MySQL's `LAST_INSERT_ID()` names one row — there it returns
/// [`UniqueError::Unsupported`]. On those, call [`upsert`] or [`insert_or_get`] per row in one
/// transaction.
///
/// # Errors
/// As [`upsert`], and [`UniqueError::Unsupported`] on MySQL.
pub fn upsert_all<'q, 'r, C, R, S, Id>(
    conn: &mut C,
    key: &UniqueKey,
    rows: &'r [R],
    insert: impl Fn(&'r [R]) -> S,
    #[allow(unused_variables)] id: Id,
) -> Result<Vec<i64>, UniqueError>
where
    C: crate::backends::InboxConnection,
    Upsert<S, Id>: diesel::query_dsl::LoadQuery<'q, C, i64>,
{
    use diesel::RunQueryDsl;
    if let Some(answer) = upsert_all_answered::<C::Backend>(rows.len()) {
        return answer;
    }
    // Built again for each attempt: a multi-row insert is not `Clone`.
    let statement = || Upsert::<S, Id>::new(key, insert(rows));
    let mut run = Immediate(|conn: &mut C| statement().get_results::<i64>(conn));
    complete_now(one_statement(
        &mut Blocking(conn),
        key,
        &mut run,
        Ok,
        || Err(UniqueError::WinnerNotFound { key: *key }),
    ))
}

/// Inserts a row unless its key exists; `true` when it inserted. Nothing is written for a
/// duplicate (see [`InsertIfAbsent`]).
///
/// On MySQL and MariaDB the row is inserted as it is and the key's duplicate-key error caught
/// by name. A row that collides on the key and on another unique index at once is reported
/// for the first of them in the server's order (the primary key, then the unique keys as the
/// table declares them): declare the key before the table's other unique keys, or use
/// [`insert_or_get`], which re-reads by the key whatever index was named.
///
/// # Errors
/// [`UniqueError::OtherViolation`] for another index, or the database's error.
pub fn insert_if_absent<C, S>(conn: &mut C, key: &UniqueKey, insert: S) -> Result<bool, UniqueError>
where
    C: crate::backends::InboxConnection,
    S: Clone,
    InsertIfAbsent<S>: diesel::query_dsl::methods::ExecuteDsl<C>,
{
    use diesel::RunQueryDsl;
    let statement = InsertIfAbsent { key: *key, insert };
    // MySQL's plain insert: the key's own violation means "present".
    let mut run = Immediate(|conn: &mut C| statement.clone().execute(conn));
    complete_now(one_statement(
        &mut Blocking(conn),
        key,
        &mut run,
        |rows| Ok(rows > 0),
        || Ok(false),
    ))
}

/// Runs `body` in a transaction that holds a lock on `key` until it ends: one caller at a
/// time creates what belongs to the key ("the tenant, then its schema row, then its
/// settings"); the next finds it there.
///
/// | backend | lock | inside an open transaction |
/// |---|---|---|
/// | PostgreSQL | `pg_advisory_xact_lock(<64-bit hash of key>)`, taken first in a READ COMMITTED transaction, released by its commit or rollback | taken in it and held to its end, the body in a savepoint; refused under REPEATABLE READ or SERIALIZABLE, whose snapshot predates the lock ([`UniqueError::Unsupported`]) |
/// | MySQL, MariaDB | `GET_LOCK('inbox:<hash>', @@innodb_lock_wait_timeout)` before `BEGIN`, `RELEASE_LOCK` after `COMMIT` | refused: the session's lock would be released before the rows are visible (diesel's `AlreadyInTransaction`) |
/// | SQLite | `BEGIN IMMEDIATE`: the database's write lock serialises every writer | the body in a savepoint: serialised only if the caller's transaction began `IMMEDIATE`; otherwise a second writer fails with a busy database rather than duplicate anything |
///
/// A tool for performance and for statements that cannot be one, on top of the unique index,
/// never instead of it: the lock holds only among callers that take it, so the index still
/// catches the code path that forgets. Two keys can share a hash and then wait for each other
/// — slower, never wrong.
///
/// MySQL's lock belongs to the session. If releasing it fails, the connection is marked
/// broken, so that a pool drops it instead of lending the lock to its next user; an async
/// caller that drops the future between `GET_LOCK` and `RELEASE_LOCK` must drop the
/// connection too.
///
/// # Errors
/// The body's error, its writes rolled back; [`UniqueError::LockTimeout`] when MySQL did not
/// grant the lock; the database's errors — each converted into `E`.
pub fn serialize_on<C, T, E>(
    conn: &mut C,
    key: &str,
    body: impl FnOnce(&mut C) -> Result<T, E>,
) -> Result<T, E>
where
    C: crate::backends::HandlerConnection,
    E: From<UniqueError>,
{
    conn.__inbox_visit(SerializeOn {
        key,
        body,
        answer: std::marker::PhantomData,
    })
}

/// [`serialize_on`] on the connection an application's connection leads to ([`InsertOrGet`]).
pub(super) struct SerializeOn<'k, B, T, E> {
    key: &'k str,
    body: B,
    answer: std::marker::PhantomData<fn() -> (T, E)>,
}

impl<O, T, E, B> crate::backends::Visit<O> for SerializeOn<'_, B, T, E>
where
    O: Send,
    B: FnOnce(&mut O) -> Result<T, E>,
    E: From<UniqueError>,
{
    type Output = Result<T, E>;

    fn visit<C: crate::backends::InboxConnection>(
        self,
        outer: &mut O,
        project: fn(&mut O) -> &mut C,
    ) -> Self::Output {
        complete_now(serialize_on_steps(
            &mut crate::runtime::sync::Projected::new(outer, project),
            self.key,
            &mut once(self.body),
        ))
    }
}
