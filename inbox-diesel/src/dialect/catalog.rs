//! What the startup check reads of a backend's catalog, and the rules it weighs the answers
//! by where the backends differ. Each backend's [`Catalogs`] (in `backends/`) holds its SQL
//! and its rules; `schema::check` runs the queries and weighs what is common.

use diesel::sql_types::Text;
use inbox_core::InboxSchema;

use crate::dialect::layout::Layout;

/// One fact about the table that the check refuses or reports: its kind and a detail.
#[derive(Debug, diesel::QueryableByName)]
pub struct FactRow {
    #[diesel(sql_type = Text)]
    pub(crate) kind: String,
    #[diesel(sql_type = Text)]
    pub(crate) detail: String,
}

/// A backend's catalog queries and the rules of its types, indexes and sessions.
pub trait Catalogs {
    /// The columns query and the index query. Binds: the table's qualifier (`''` when none;
    /// [`QUALIFIER_BINDS`](Catalogs::QUALIFIER_BINDS) times) and its name; the index query
    /// then the index's name.
    fn catalog_sql() -> (String, String);

    /// The facts query: rows of (kind, detail) for what the table is (`table`: its name with
    /// its schema or database) and what the check refuses. Binds as
    /// [`catalog_sql`](Catalogs::catalog_sql), then the index's name. `qualifier` is given
    /// for a catalog that names an attached database rather than binding it (SQLite);
    /// `needs` the privileges the handler's statements take, by column.
    fn facts_sql(qualifier: &str, needs: &[(&str, &str)]) -> String;

    /// How many times the queries bind the qualifier.
    const QUALIFIER_BINDS: usize = 1;

    /// The type names the runtime works with in `column`: prefixes of the catalog's name,
    /// lower-cased.
    fn accepts(column: &str) -> &'static [&'static str];

    /// Whether a column of an accepted type (its name lower-cased, with MySQL's collation)
    /// holds what the runtime writes, beyond the type's name.
    fn holds(_column: &str, _type_name: &str) -> bool {
        true
    }

    /// What a column of the wrong type should be, where this backend says more than the
    /// check's common text.
    fn expected(_column: &str) -> Option<&'static str> {
        None
    }

    /// Whether the table may lack `id`.
    const ID_OPTIONAL: bool = false;

    /// Whether another unique index of the inbox table, on `columns`, is harmless: one with
    /// `id`, unique by itself (the primary key a partitioned table needs, `(id, message_id)`,
    /// included); where `ON CONFLICT` names the columns, also one covering
    /// `(message_id, consumer)`, which cannot be violated unless the inbox's index is.
    fn harmless_unique(columns: &[&str]) -> bool {
        columns.contains(&"id")
            || (columns.contains(&"message_id") && columns.contains(&"consumer"))
    }

    /// The fix of a unique index that is not harmless.
    const OTHER_UNIQUE_FIX: &'static str = "drop it, or make it cover (message_id, consumer)";

    /// Whether an unqualified name may resolve to another table in another session (a
    /// `search_path`, a temporary table), so that the check pins the one it resolved.
    const PINS_TABLE: bool = true;

    /// Whether the server itself refuses the marker of a session the check did not mark
    /// ([`SessionMark`](crate::dialect::layout::SessionMark)): a check is then remembered
    /// per handler, and each session checked where the server refuses it.
    const MARKS_SESSIONS: bool = false;

    /// Marks `layout` so that a session can be known to be the one checked (see
    /// [`Layout`]); `oids` is the catalog's `oids` fact, where the backend reads one.
    fn mark(layout: &mut Layout, schema: &InboxSchema, claim: bool, oids: Option<&str>);
}

/// The longest consumer name, in characters: what `consumer` must hold.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) const CONSUMER_CHARS: u64 = inbox_core::Consumer::MAX_LEN as u64;

/// The length a type name bounds a text to, `varchar(50)` → 50; `None` when unbounded.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn bound(type_name: &str) -> Option<u64> {
    let (_, rest) = type_name.split_once('(')?;
    rest.split_once(')')?.0.trim().parse().ok()
}
