//! The startup check: does the database hold the inbox table the runtime expects?

use diesel::QueryResult;
use diesel::sql_types::{BigInt, Text};
use inbox_core::InboxSchema;

use crate::dialect::Sql;
use crate::dialect::catalog::{Catalogs, FactRow};
use crate::dialect::layout::{Layout, intern};
use crate::io::{Io, Session};

mod catalog;
mod table;

use catalog::*;
use table::*;

pub use crate::error::schema::{SchemaError, SchemaProblem};

/// The catalog's view of the inbox table: its columns, the named index, and the facts of
/// [`Catalogs::facts_sql`] and [`Session::more_facts`].
#[derive(Debug, Default)]
pub(crate) struct Catalog {
    columns: Vec<ColumnRow>,
    index: Vec<IndexRow>,
    facts: Vec<FactRow>,
    /// `VERSION()` on MySQL and MariaDB; empty elsewhere.
    server: String,
    /// `@@max_allowed_packet` on MySQL and MariaDB; 0 elsewhere.
    max_packet: u64,
}

#[derive(Debug, diesel::QueryableByName)]
pub(crate) struct ColumnRow {
    #[diesel(sql_type = Text)]
    name: String,
    #[diesel(sql_type = Text)]
    type_name: String,
    #[diesel(sql_type = BigInt)]
    nullable: i64,
}

#[derive(Debug, diesel::QueryableByName)]
pub(crate) struct IndexRow {
    #[diesel(sql_type = BigInt)]
    is_unique: i64,
    #[diesel(sql_type = Text)]
    name: String,
}

/// The startup check on one connection: reads the catalog, compares, and marks the layout
/// ([`Catalogs::mark`]); where that is a session mark (MySQL and MariaDB,
/// [`SessionMark`](crate::dialect::layout::SessionMark)), sets it on the session. `claim`: the handler runs in
/// claim mode, whose statements take more privileges.
pub(crate) async fn check_table<S: Io>(
    io: &mut S,
    schema: &InboxSchema,
    claim: bool,
) -> Result<Layout, SchemaError> {
    let lifted = S::Backend::lift_statement_timeout(io).await;
    let set_english = match S::Backend::english_messages(io, schema, lifted).await {
        Ok(set) => set,
        Err(refused) => {
            if lifted {
                let _ = io.batch("ROLLBACK").await;
            }
            return Err(refused);
        }
    };
    let read = match claim {
        true => S::Backend::refuse_default_messages_for_claims(io, schema).await,
        false => Ok(()),
    };
    if let Err(refused) = read {
        if lifted {
            let _ = io.batch("ROLLBACK").await;
        }
        return Err(refused);
    }
    let read = read_catalog(io, schema, claim).await;
    if lifted {
        let end = match read {
            Ok(_) => "COMMIT",
            Err(_) => "ROLLBACK",
        };
        let ended = io.batch(end).await;
        if read.is_ok() {
            ended.map_err(SchemaError::Database)?;
        }
    }
    let catalog = read.map_err(SchemaError::Database)?;
    let mut layout = check::<S::Backend>(schema, catalog, claim)?;
    layout.english = set_english;
    if let Some(mark) = layout.session_mark {
        io.execute(&Sql::new(mark.set_sql()))
            .await
            .map_err(SchemaError::Database)?;
    }
    Ok(layout)
}
