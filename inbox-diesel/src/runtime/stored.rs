//! Stored results (`store_result`): the body's `Ok` value kept with its marker, as JSON in
//! the table's optional `result` column, in the same transaction as the body's work (claim
//! mode: just before the stamp), and given back to a later delivery of the message in
//! `Duplicate { stored, .. }`.

use diesel::QueryResult;
use diesel::sql_types::{Nullable, Text};
use inbox_core::{InboxSchema, MessageKey};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::dialect::{Dialect, Sql};
use crate::io::Io;
use crate::{Error, StoredResultProblem};

/// The largest result a handler stores, in bytes of its JSON text: 1 MiB. A larger one is
/// refused before any SQL with [`StoredResultProblem::TooLarge`].
pub const MAX_STORED_RESULT_BYTES: usize = 1 << 20;

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
    /// The value's JSON text, refused when it cannot be written or is over the limit.
    pub(crate) fn encode(self, value: &T) -> Result<String, Error> {
        let text = (self.encode)(value)
            .map_err(|e| Error::StoredResult(StoredResultProblem::Encode(e.to_string())))?;
        if text.len() > MAX_STORED_RESULT_BYTES {
            return Err(Error::StoredResult(StoredResultProblem::TooLarge {
                bytes: text.len(),
                limit: MAX_STORED_RESULT_BYTES,
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
struct StoredRow {
    #[diesel(sql_type = Nullable<Text>)]
    result: Option<String>,
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
    attempt: Option<u32>,
) -> QueryResult<usize> {
    let table = S::Backend::BACKEND.quote_table(schema.table());
    let sql = Sql::new(S::Backend::store_result(&table, attempt.is_some())).bind_text(text);
    let mut sql = S::Backend::bind_message_id(sql, &key.stored_id()).bind_text(consumer);
    if let Some(attempt) = attempt {
        sql = sql.bind_i64(attempt.into());
    }
    io.execute(&sql).await
}

/// The stored result of `key`'s marker, if any.
pub(crate) async fn read<S: Io>(
    io: &mut S,
    schema: &InboxSchema,
    consumer: &str,
    key: &MessageKey,
) -> QueryResult<Option<String>> {
    let table = S::Backend::BACKEND.quote_table(schema.table());
    let sql = Sql::new(S::Backend::read_result(&table));
    let sql = S::Backend::bind_message_id(sql, &key.stored_id()).bind_text(consumer);
    let rows: Vec<StoredRow> = io.load(&sql).await?;
    Ok(rows.into_iter().next().and_then(|row| row.result))
}
