//! The one-statement forms: an insert with `ON CONFLICT` on the key, as a query.

use super::*;

/// `insert` (a diesel `insert_into(…).values(…)` with no `ON CONFLICT` of its own) as one
/// statement that yields the id in `id` of the row with the key, new or existing; built by
/// [`upsert`].
///
/// | backend | statement |
/// |---|---|
/// | PostgreSQL, SQLite | `<insert> ON CONFLICT (<columns>) [WHERE <predicate>] DO UPDATE SET <first column> = excluded.<first column> RETURNING CAST(<id> AS BIGINT)` |
/// | MySQL, MariaDB | `<insert> ON DUPLICATE KEY UPDATE <id> = LAST_INSERT_ID(<id>)`, then `SELECT LAST_INSERT_ID()` |
#[derive(Debug)]
pub struct Upsert<S, Id> {
    pub(super) key: UniqueKey,
    pub(super) insert: S,
    pub(super) id: std::marker::PhantomData<Id>,
}

impl<S: Clone, Id> Clone for Upsert<S, Id> {
    fn clone(&self) -> Self {
        Upsert {
            key: self.key,
            insert: self.insert.clone(),
            id: std::marker::PhantomData,
        }
    }
}

impl<S, Id> QueryId for Upsert<S, Id> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<S, Id> Query for Upsert<S, Id> {
    type SqlType = BigInt;
}

impl<S, Id, C> diesel::RunQueryDsl<C> for Upsert<S, Id> {}

impl<DB, S, Id> QueryFragment<DB> for Upsert<S, Id>
where
    DB: Dialect,
    S: QueryFragment<DB>,
    Id: Column,
    str: diesel::serialize::ToSql<diesel::sql_types::Text, DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        self.insert.walk_ast(out.reborrow())?;
        if DB::CONFLICTS == Conflicts::OnDuplicateKey {
            out.push_sql(" ON DUPLICATE KEY UPDATE ");
            out.push_identifier(Id::NAME)?;
            out.push_sql(" = LAST_INSERT_ID(");
            out.push_identifier(Id::NAME)?;
            out.push_sql(")");
            return Ok(());
        }
        push_conflict_target(&mut out, &self.key)?;
        let first = self.key.columns[0];
        out.push_sql(" DO UPDATE SET ");
        out.push_identifier(first)?;
        out.push_sql(" = excluded.");
        out.push_identifier(first)?;
        out.push_sql(" RETURNING CAST(");
        out.push_identifier(Id::NAME)?;
        out.push_sql(" AS BIGINT)");
        Ok(())
    }
}

/// `insert` with `ON CONFLICT (<columns>) [WHERE <predicate>] DO NOTHING` on PostgreSQL and
/// SQLite, and as it is on MySQL (whose `ON DUPLICATE KEY` cannot name the key; its
/// duplicate-key error is caught by name instead); built by [`insert_if_absent`].
#[derive(Debug, Clone, Copy)]
pub struct InsertIfAbsent<S> {
    pub(super) key: UniqueKey,
    pub(super) insert: S,
}

impl<S> QueryId for InsertIfAbsent<S> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<S, C> diesel::RunQueryDsl<C> for InsertIfAbsent<S> {}

impl<DB, S> QueryFragment<DB> for InsertIfAbsent<S>
where
    DB: Dialect,
    S: QueryFragment<DB>,
    str: diesel::serialize::ToSql<diesel::sql_types::Text, DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        self.insert.walk_ast(out.reborrow())?;
        if DB::CONFLICTS == Conflicts::OnConflict {
            push_conflict_target(&mut out, &self.key)?;
            out.push_sql(" DO NOTHING");
        }
        Ok(())
    }
}

/// ` ON CONFLICT (a, b) [WHERE predicate]`.
pub(super) fn push_conflict_target<DB: diesel::backend::Backend>(
    out: &mut AstPass<'_, '_, DB>,
    key: &UniqueKey,
) -> QueryResult<()> {
    out.push_sql(" ON CONFLICT (");
    for (n, column) in key.columns.iter().enumerate() {
        if n > 0 {
            out.push_sql(", ");
        }
        out.push_identifier(column)?;
    }
    out.push_sql(")");
    if let Some(predicate) = key.predicate {
        out.push_sql(" WHERE ");
        out.push_sql(predicate);
    }
    Ok(())
}
