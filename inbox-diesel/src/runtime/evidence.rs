//! What a duplicate is answered on: the marker of this key and consumer read back, never
//! the absence of a new row or an error's wording alone ([`confirm_duplicates`]); and what a
//! refusal of the runtime's own marker means ([`refused_marker`]).

use diesel::QueryResult;
use diesel::result::Error as DieselError;
use inbox_core::ErrorClass;

use crate::classify;
use crate::error::Error;
use crate::error::schema::{SchemaError, SchemaProblem};
use crate::runtime::found::Presence;
use crate::runtime::steps::Steps;
use crate::spec::HandlerSpec;

/// The error of the runtime's own marker or claim insert (or a claim's takeover): a
/// violation of another unique index, a check or a foreign key, a column without a default,
/// an exhausted sequence, row-level security — anything neither transient nor the
/// connection's — says the inbox table refuses markers, not that the message is bad: a
/// schema fault (`Alert`, and the table checked again), never dead-lettered with the
/// message. The server's error stays the source.
pub(crate) fn refused_marker(error: DieselError, schema: &inbox_core::InboxSchema) -> DieselError {
    // The inbox's own refusal, before the statement was sent (a key too long for the
    // server's packet): as it is.
    if let DieselError::QueryBuilderError(inner) = &error
        && inner.is::<Error>()
    {
        return error;
    }
    match classify(&error, schema) {
        ErrorClass::UniqueViolation { .. } | ErrorClass::Other => {
            DieselError::QueryBuilderError(Box::new(Error::Database {
                class: ErrorClass::Schema,
                attempts: 1,
                source: error,
            }))
        }
        _ => error,
    }
}

/// Confirms that each of `ids`, which an insert did not write, has its marker: a duplicate
/// is answered on the evidence that the other row exists, not on the absence of this one. A
/// trigger, rule or inheritance child can swallow an insert; a new message would then be
/// answered `Duplicate` and never applied. Without the evidence, the delivery fails as a
/// schema fault (the driver checks the table again, which names the cause).
pub(crate) async fn confirm_duplicates<S: Steps>(
    steps: &mut S,
    spec: &'static HandlerSpec,
    ids: &[uuid::Uuid],
) -> QueryResult<()> {
    let found = steps.markers_present(spec, ids, false).await?;
    evidence(spec, found, ids.len())
}

/// Whether `found` proves `n` duplicates: a completed marker of each. A marker that is a
/// claim-mode handler's claim, not completed, is not a duplicate's evidence for a handler
/// of another mode — its side effect may not have run ([`Error::OpenClaim`]); no marker at
/// all is a schema fault ([`swallowed`]).
pub(crate) fn evidence(spec: &'static HandlerSpec, found: Presence, n: usize) -> QueryResult<()> {
    if found.completed == n {
        return Ok(());
    }
    if found.present == n {
        tracing::error!(
            open = n - found.completed,
            live = found.live_claims,
            "the marker met is a claim of claim mode, not completed: not a duplicate"
        );
        return Err(Error::OpenClaim {
            consumer: spec.consumer.clone(),
            live: found.live_claims > 0,
        }
        .into());
    }
    tracing::error!(
        missing = n - found.present,
        "a marker insert was refused or wrote no row, and no marker of its key and consumer \
         is there"
    );
    Err(swallowed(spec))
}

/// The schema fault of a marker or claim insert that wrote no row where no row exists.
pub(crate) fn swallowed(spec: &HandlerSpec) -> DieselError {
    Error::Schema(SchemaError::Mismatch {
        table: spec.schema.table(),
        resolved: None,
        problems: vec![SchemaProblem::Unsupported {
            found: "a marker insert refused as a duplicate or that wrote no row, where no \
                    marker of its key and consumer exists"
                .into(),
            why: "the unique index was redefined since the check (on other columns, under the \
                  inbox index's name), or something on the table (a trigger, a rule, an \
                  inheritance child) swallows inserts: a new message would be answered \
                  Duplicate and never applied",
            fix: "restore the index on (message_id, consumer) and remove what swallows \
                  inserts; `inbox_diesel::schema::verify` names what the check finds"
                .into(),
        }],
    })
    .into()
}
