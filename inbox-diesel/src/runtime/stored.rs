//! What a marker keeps beyond its key. Stored results (`store_result`): the body's `Ok`
//! value, as JSON in the table's optional `result` column, written in the same transaction
//! as the body's work (claim mode: just before the stamp), and given back to a later
//! delivery of the message in `Duplicate { stored, .. }`. Fingerprints (`fingerprint =
//! …`): a digest of what identifies the request, in the optional `fingerprint` column,
//! written with the marker; a later delivery of the key with another fingerprint is
//! [`Error::KeyReused`].

use diesel::QueryResult;
use diesel::sql_types::{Binary, Nullable, Text};
use inbox_core::{InboxSchema, MessageKey};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::classify;
use crate::dialect::layout::Layout;
use crate::dialect::{Dialect, Sql};
use crate::error::Error;
use crate::error::StoredResultProblem;
use crate::io::Io;
use crate::runtime::found::Kept;
use crate::runtime::steps::{Decided, Steps};
use crate::spec::HandlerSpec;
use crate::telemetry;
use crate::value::{Fingerprint, MAX_STORED_RESULT_BYTES};
use inbox_core::ErrorClass;

/// What the statement that stores a result carries beside the result's text: the statement,
/// the key, the consumer (at most 200 characters of up to 4 bytes), the fingerprint.
const RESULT_STATEMENT: usize = 2048;

/// What a handler's marker keeps beyond its key: its result (a codec for it) and the
/// request's fingerprint. Written by the expansion of `#[idempotent]`.
#[doc(hidden)]
pub struct Remembered<T> {
    pub(crate) store: Option<Store<T>>,
    pub(crate) fingerprint: Option<Fingerprint>,
}

impl<T> Remembered<T> {
    /// With `store` for the result (`store_result = true`) and `fingerprint`.
    pub fn new(store: Option<Store<T>>, fingerprint: Option<Fingerprint>) -> Self {
        Remembered { store, fingerprint }
    }

    /// Nothing beyond the key.
    pub fn nothing() -> Self {
        Remembered {
            store: None,
            fingerprint: None,
        }
    }

    /// Whether a duplicate reads the marker: for its result, or to compare fingerprints.
    pub(crate) fn reads(&self) -> bool {
        self.store.is_some() || self.fingerprint.is_some()
    }
}

impl<T> Clone for Remembered<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Remembered<T> {}

/// How a handler's `Ok` value becomes the stored text and back: JSON, through serde.
#[doc(hidden)]
pub struct Store<T> {
    encode: fn(&T) -> serde_json::Result<String>,
    decode: fn(&str) -> serde_json::Result<T>,
}

impl<T> Clone for Store<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Store<T> {}

impl<T: Serialize + DeserializeOwned> Store<T> {
    /// JSON, through serde.
    pub fn json() -> Self {
        Store {
            encode: |value| serde_json::to_string(value),
            decode: |text| serde_json::from_str(text),
        }
    }
}

impl<T> Store<T> {
    /// The value's JSON text, refused when it cannot be written or is over the limit: the
    /// smaller of [`MAX_STORED_RESULT_BYTES`] and what the server takes in one statement's
    /// parameters (MySQL and MariaDB: `max_allowed_packet`, [`Layout::max_packet`]; a larger
    /// statement makes the server drop the connection, on every redelivery).
    ///
    /// [`Layout::max_packet`]: crate::dialect::layout::Layout
    pub(crate) fn encode(self, value: &T, layout: Layout) -> Result<String, Error> {
        let text = (self.encode)(value)
            .map_err(|e| Error::StoredResult(StoredResultProblem::Encode(e.to_string())))?;
        let limit = layout.room(RESULT_STATEMENT).min(MAX_STORED_RESULT_BYTES);
        if text.len() > limit {
            return Err(Error::StoredResult(StoredResultProblem::TooLarge {
                bytes: text.len(),
                limit,
            }));
        }
        Ok(text)
    }

    /// The value a stored text holds.
    pub(crate) fn decode(self, text: &str) -> Result<T, Error> {
        (self.decode)(text)
            .map_err(|e| Error::StoredResult(StoredResultProblem::Decode(e.to_string())))
    }
}

#[derive(diesel::QueryableByName)]
struct MarkerRow {
    #[diesel(sql_type = Nullable<Text>)]
    result: Option<String>,
    #[diesel(sql_type = Nullable<Binary>)]
    fingerprint: Option<Vec<u8>>,
}

/// Writes `text` as the stored result of `key`'s marker: in the handler's transaction
/// (transaction mode), or committed on its own where the claim of `attempt` is still open
/// (claim mode). Answers the rows written: 1, or 0 when the marker is not there (a claim
/// taken over).
pub(crate) async fn write<S: Io>(
    io: &mut S,
    schema: &InboxSchema,
    consumer: &str,
    key: &MessageKey,
    text: String,
    fingerprint: Option<Fingerprint>,
    attempt: Option<u32>,
) -> QueryResult<usize> {
    let table = S::Backend::BACKEND.quote_table(schema.table());
    let sql = S::Backend::store_result(&table, fingerprint.is_some(), attempt.is_some());
    // One of a few texts per table: prepared once per connection.
    let mut sql = Sql::new(sql).cached().bind_text(text);
    if let Some(fingerprint) = fingerprint {
        sql = sql.bind_bytes(fingerprint.as_bytes().to_vec());
    }
    let mut sql = S::Backend::bind_message_id(sql, &key.stored_id()).bind_text(consumer);
    if let Some(attempt) = attempt {
        sql = sql.bind_i64(attempt.into());
    }
    io.execute(&sql).await
}

/// What `key`'s marker kept: its result, with `result`, and its fingerprint, with
/// `fingerprint` (each read only where the table has the column).
pub(crate) async fn read<S: Io>(
    io: &mut S,
    schema: &InboxSchema,
    consumer: &str,
    key: &MessageKey,
    (result, fingerprint): (bool, bool),
    latest: bool,
) -> QueryResult<Kept> {
    let table = S::Backend::BACKEND.quote_table(schema.table());
    let mut sql = S::Backend::read_marker(&table, result, fingerprint);
    if latest {
        sql.push_str(S::Backend::LATEST_READ);
    }
    let sql = Sql::new(sql).cached();
    let sql = S::Backend::bind_message_id(sql, &key.stored_id()).bind_text(consumer);
    let rows: Vec<MarkerRow> = io.load(&sql).await?;
    Ok(rows
        .into_iter()
        .next()
        .map(|row| Kept {
            result: row.result,
            fingerprint: row.fingerprint,
        })
        .unwrap_or_default())
}

/// Writes `fingerprint` on `key`'s marker, in the handler's transaction, just after the
/// marker's insert: another delivery of the key sees the marker only once it committed, and
/// then with its fingerprint. (A handler that stores its result writes the fingerprint with
/// it instead, in [`write`]'s one statement: the same commit, one round trip fewer; where
/// the backend writes the marker at the commit, both travel in its insert —
/// [`Session::defers_marker`](crate::io::Session::defers_marker).)
pub(crate) async fn write_fingerprint<S: Io>(
    io: &mut S,
    schema: &InboxSchema,
    consumer: &str,
    key: &MessageKey,
    fingerprint: Fingerprint,
) -> QueryResult<usize> {
    let table = S::Backend::BACKEND.quote_table(schema.table());
    let sql = Sql::new(S::Backend::store_fingerprint(&table))
        .cached()
        .bind_bytes(fingerprint.as_bytes().to_vec());
    let sql = S::Backend::bind_message_id(sql, &key.stored_id()).bind_text(consumer);
    io.execute(&sql).await
}

/// Refuses a handler that stores its results on a table without the `result` column, or
/// one with a fingerprint on a table without `fingerprint`, before anything is written.
pub(super) fn kept_columns<T, E>(
    spec: &'static HandlerSpec,
    layout: Layout,
    remembered: &Remembered<T>,
    inbox_error: fn(Error) -> E,
) -> Result<(), E> {
    let mut needs = crate::schema::Needs::default();
    if remembered.store.is_some() {
        needs = needs.result();
    }
    if remembered.fingerprint.is_some() {
        needs = needs.fingerprint();
    }
    crate::schema::has_what_is_needed(&spec.schema, layout, needs).map_err(|problem| {
        tracing::error!(error = %problem, "the inbox table has no column the handler writes");
        telemetry::failed(spec, ErrorClass::Schema.label());
        inbox_error(Error::Schema(problem))
    })
}

/// A duplicate of one message (`key`), with what its marker kept, for a handler that keeps
/// something ([`Remembered`]): read after the delivery's own transaction ended, from the
/// committed marker. A marker of a request with another fingerprint is
/// [`Error::KeyReused`] — on the conflict path of a race as on a later delivery: the loser
/// waited for the winner's commit, and reads its marker.
pub(super) async fn kept_duplicate<S: Steps, T, E, W>(
    steps: &mut S,
    spec: &'static HandlerSpec,
    key: Option<&MessageKey>,
    remembered: Remembered<T>,
    latest: bool,
    inbox_error: fn(Error) -> E,
) -> Result<Decided<T, W>, E> {
    let Some(key) = key.filter(|_| remembered.reads()) else {
        return Ok(Decided::Duplicate(None));
    };
    let kept = read_kept(steps, spec, key, &remembered, latest, inbox_error).await?;
    stored_value(spec, key, kept, remembered, inbox_error).map(Decided::Duplicate)
}

/// What `key`'s marker kept, as the handler needs it.
pub(super) async fn read_kept<S: Steps, T, E>(
    steps: &mut S,
    spec: &'static HandlerSpec,
    key: &MessageKey,
    remembered: &Remembered<T>,
    latest: bool,
    inbox_error: fn(Error) -> E,
) -> Result<Kept, E> {
    let columns = (remembered.store.is_some(), remembered.fingerprint.is_some());
    steps
        .read_kept(spec, key, columns, latest)
        .await
        .map_err(|source| {
            let error = Error::Database {
                class: classify(&source, &spec.schema),
                attempts: 1,
                source,
            };
            tracing::error!(error = %error, "the duplicate's marker could not be read");
            telemetry::failed(spec, error.class().label());
            inbox_error(error)
        })
}

/// The value a marker stored, as the handler's type; [`Error::KeyReused`] when it was kept
/// for a request with another fingerprint.
pub(super) fn stored_value<T, E>(
    spec: &'static HandlerSpec,
    key: &MessageKey,
    kept: Kept,
    remembered: Remembered<T>,
    inbox_error: fn(Error) -> E,
) -> Result<Option<T>, E> {
    let error = if kept.reused_by(remembered.fingerprint) {
        tracing::warn!(
            outcome = "key_reused",
            "the key's marker is of a request with another fingerprint; body not run"
        );
        Error::KeyReused {
            consumer: spec.consumer.clone(),
            key: key.clone(),
        }
    } else {
        match (remembered.store, kept.result) {
            (Some(store), Some(text)) => match store.decode(&text) {
                Ok(value) => return Ok(Some(value)),
                Err(e) => {
                    tracing::error!(error = %e, "the duplicate's stored result could not be read");
                    e
                }
            },
            _ => return Ok(None),
        }
    };
    telemetry::failed(spec, error.class().label());
    Err(inbox_error(error))
}

#[cfg(test)]
mod tests {
    use super::Fingerprint;

    /// The parts' digest is the digest of their length-prefixed concatenation, as
    /// `inbox-axum` stored it before: fingerprints already stored still match.
    #[test]
    fn parts_are_digested_as_their_length_prefixed_concatenation() {
        let parts: [&[u8]; 3] = [b"POST", b"/payments?account=7", b"{\"amount\":500}"];
        let mut joined = Vec::new();
        for part in parts {
            joined.extend_from_slice(&(part.len() as u64).to_be_bytes());
            joined.extend_from_slice(part);
        }
        assert_eq!(Fingerprint::of_parts(parts), Fingerprint::of(&joined));
    }
}
