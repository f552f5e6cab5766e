//! Why the startup check refused a table or a session: named by [`Error`](super::Error) and
//! returned by [`verify`](crate::schema::verify), which re-exports them.

use std::fmt;

/// What [`verify`](crate::schema::verify) found different from what the runtime needs.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SchemaProblem {
    /// The table does not exist (or is not visible on this connection's search path or
    /// database).
    MissingTable {
        /// The table looked for.
        table: String,
    },
    /// A column the runtime reads or writes is missing.
    MissingColumn {
        /// The column.
        column: &'static str,
    },
    /// A column has a type the runtime cannot work with.
    WrongType {
        /// The column.
        column: &'static str,
        /// Its type in the database.
        found: String,
        /// What it should be.
        expected: &'static str,
    },
    /// A key column may hold NULL. On MySQL and MariaDB the runtime relies on `consumer`
    /// being `NOT NULL` to refuse a marker from a session that did not check the table; a
    /// NULL in a unique index is distinct from every other, so no duplicate would be seen.
    Nullable {
        /// The column.
        column: &'static str,
    },
    /// No index of the name the runtime recognises duplicates by. Without it, two
    /// deliveries both insert their marker and both run the body.
    MissingUniqueIndex {
        /// The index looked for (`constraint = "…"`).
        index: String,
    },
    /// The index exists but is not unique.
    IndexNotUnique {
        /// The index.
        index: String,
    },
    /// The index is unique but not on `(message_id, consumer)`.
    IndexColumns {
        /// The index.
        index: String,
        /// Its columns, in order (`(expression)` for an expression).
        found: Vec<String>,
    },
    /// The table or its index has a property that breaks an assumption of the runtime: a
    /// trigger or rule that can swallow or rewrite the marker, an inheritance child, a
    /// table that is not crash-safe or not transactional, an index that is invalid, partial,
    /// on a prefix or deferrable, a missing privilege, a name that means different tables on
    /// different sessions.
    Unsupported {
        /// What was found, e.g. ``trigger `audit_inbox` ``.
        found: String,
        /// What it breaks.
        why: &'static str,
        /// How to fix it.
        fix: String,
    },
}

impl fmt::Display for SchemaProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SchemaProblem::MissingTable { table } => write!(f, "table `{table}` does not exist"),
            SchemaProblem::MissingColumn { column } => write!(f, "column `{column}` is missing"),
            SchemaProblem::WrongType {
                column,
                found,
                expected,
            } => write!(f, "column `{column}` is {found}, expected {expected}"),
            SchemaProblem::Nullable { column } => write!(
                f,
                "column `{column}` allows NULL: a NULL key is distinct from every other in the \
                 unique index, so duplicates would not be recognised; make it NOT NULL"
            ),
            SchemaProblem::MissingUniqueIndex { index } => write!(
                f,
                "unique index `{index}` on (message_id, consumer) is missing: without it \
                 deliveries of one message are not recognised as duplicates; create it \
                 (`CREATE UNIQUE INDEX {index} ON … (message_id, consumer)`), or, if the \
                 table has such an index under another name, name that one with \
                 `constraint = \"…\"`"
            ),
            SchemaProblem::IndexNotUnique { index } => write!(f, "index `{index}` is not unique"),
            SchemaProblem::IndexColumns { index, found } => write!(
                f,
                "index `{index}` is on ({}), expected (message_id, consumer)",
                found.join(", ")
            ),
            SchemaProblem::Unsupported { found, why, fix } => {
                write!(f, "{found}: {why}; {fix}")
            }
        }
    }
}

/// Why [`verify`](crate::schema::verify) failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum SchemaError {
    /// The table differs from what the runtime needs, in each of these ways.
    Mismatch {
        /// The table checked, as the handler names it.
        table: &'static str,
        /// The table the name resolved to on the session checked, with its schema or
        /// database (`public.inbox`, `shop.inbox`); `None` where it did not resolve.
        resolved: Option<String>,
        /// Everything found wrong.
        problems: Vec<SchemaProblem>,
    },
    /// The session the check ran on cannot be used, whatever the table: a setting of its
    /// role or database it may not change (its server messages' language). Class
    /// [`ErrorClass::ServerSetting`](crate::ErrorClass::ServerSetting), an alert.
    Session {
        /// The table checked, as the handler names it.
        table: &'static str,
        /// What was found, why it matters, and the fix.
        problem: SchemaProblem,
    },
    /// Reading the catalog failed.
    Database(diesel::result::Error),
}

impl fmt::Display for SchemaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SchemaError::Mismatch {
                table,
                resolved,
                problems,
            } => {
                match resolved {
                    Some(resolved) if resolved != table => write!(
                        f,
                        "the inbox table `{table}` (`{resolved}` on this session) is not as \
                         the runtime needs it: "
                    )?,
                    _ => write!(
                        f,
                        "the inbox table `{table}` is not as the runtime needs it: "
                    )?,
                }
                for (n, problem) in problems.iter().enumerate() {
                    if n > 0 {
                        f.write_str("; ")?;
                    }
                    write!(f, "{problem}")?;
                }
                // The generator's table fixes the table's shape; the other refusals (a
                // trigger, a privilege, the session's language) name their own fix.
                match problems
                    .iter()
                    .any(|problem| !matches!(problem, SchemaProblem::Unsupported { .. }))
                {
                    true => {
                        f.write_str(" (generate the table with `inbox-diesel migration generate`)")
                    }
                    false => Ok(()),
                }
            }
            SchemaError::Session { table, problem } => write!(
                f,
                "the session checking the inbox table `{table}` is not as the runtime needs \
                 it: {problem}"
            ),
            SchemaError::Database(_) => f.write_str("reading the inbox table's definition failed"),
        }
    }
}

impl std::error::Error for SchemaError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SchemaError::Database(e) => Some(e),
            SchemaError::Mismatch { .. } | SchemaError::Session { .. } => None,
        }
    }
}
