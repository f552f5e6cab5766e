//! What a delivery claims ([`Claims`]): one key, or a batch's keys in statements of bounded
//! size, and which of a batch's messages were new.

use diesel::QueryResult;
use inbox_core::{BatchOutcome, ErrorClass, MessageKey};

use crate::classify;
use crate::dialect::claim::{ClaimAnswer, ClaimState, ClaimStep};
use crate::dialect::layout::{Layout, key_text};
use crate::dialect::marker::Keeps;
use crate::runtime::evidence::{confirm_duplicates, evidence};
use crate::runtime::steps::{Steps, roll_back};
use crate::spec::HandlerSpec;

/// The outcome of a batch of `len` messages: the body's value, if it ran, and which
/// positions it was given.
pub(crate) fn batch_outcome<T>(len: usize, value: Option<T>, new: &NewMessages) -> BatchOutcome<T> {
    let processed = match value {
        Some(_) => new.positions(),
        None => Vec::new(),
    };
    // `processed` is sorted: the positions in the batch's order.
    let duplicates = (0..len)
        .filter(|at| processed.binary_search(at).is_err())
        .collect();
    BatchOutcome {
        value,
        processed,
        duplicates,
    }
}

/// What a transaction-mode handler claims: one message's marker, or a batch's.
pub(crate) trait Claims {
    /// Inserts the markers that do not exist yet, inside the open transaction, with the
    /// columns `layout` has; `false` when none was new.
    async fn claim<S: Steps>(
        &self,
        steps: &mut S,
        spec: &'static HandlerSpec,
        layout: Layout,
    ) -> QueryResult<bool>;

    /// Opens the transaction and claims in it: one round trip where the connection sends
    /// both together ([`Steps::begin_with_claim`], one message's marker). The outer error is
    /// the transaction's start failing, before any claim.
    ///
    /// `keeps`: what one message's marker keeps beside its key. Where the connection writes
    /// such a marker at the commit ([`Steps::defers_marker`]), the answer's second part is
    /// `true`: the claim was the key's lock and the look for the marker, `Ok(true)` says that
    /// none exists, and the marker is for the commit to write
    /// ([`Steps::commit_with_marker`]).
    async fn begin_and_claim<S: Steps>(
        &self,
        steps: &mut S,
        spec: &'static HandlerSpec,
        layout: Layout,
        keeps: Keeps,
    ) -> QueryResult<(QueryResult<bool>, bool)> {
        if let Some(key) = self.key() {
            let keeps = match steps.defers_marker(spec, keeps) {
                true => keeps,
                false => Keeps::default(),
            };
            if let Some(claimed) = steps.begin_with_claim(spec, key, layout, keeps).await {
                let claimed = claimed_with_begin(steps, spec, key, claimed).await;
                return Ok((claimed, keeps.any()));
            }
        }
        steps.begin(spec, layout).await?;
        Ok((self.claim(steps, spec, layout).await, false))
    }

    /// The origin of the messages the body publishes to the outbox: the keys and the
    /// consumer ([`crate::outbox`]).
    fn origin(&self, spec: &'static HandlerSpec) -> crate::outbox::Seed;

    /// The message's key, for one message; `None` for a batch.
    fn key(&self) -> Option<&MessageKey> {
        None
    }

    /// `precheck = true`: whether the work was completed before, read outside any
    /// transaction. A failed read is not an answer: the transaction then decides.
    async fn completed_before<S: Steps>(
        &self,
        _steps: &mut S,
        _spec: &'static HandlerSpec,
        _layout: Layout,
    ) -> bool {
        false
    }
}

impl Claims for MessageKey {
    fn origin(&self, spec: &'static HandlerSpec) -> crate::outbox::Seed {
        crate::outbox::Seed::Key(self.stored_id(), spec.consumer.as_str())
    }

    fn key(&self) -> Option<&MessageKey> {
        Some(self)
    }

    async fn claim<S: Steps>(
        &self,
        steps: &mut S,
        spec: &'static HandlerSpec,
        layout: Layout,
    ) -> QueryResult<bool> {
        let claimed = steps.claim(spec, self, layout).await?;
        if !claimed {
            confirm_duplicates(steps, spec, &[self.stored_id()]).await?;
        }
        Ok(claimed)
    }

    async fn completed_before<S: Steps>(
        &self,
        steps: &mut S,
        spec: &'static HandlerSpec,
        layout: Layout,
    ) -> bool {
        match steps
            .claim_step(
                spec,
                self,
                ClaimStep::Precheck {
                    layout,
                    nowait: spec.in_flight_when_locked,
                },
            )
            .await
        {
            Ok(ClaimAnswer::Read(Some((ClaimState::Completed, ..)))) => true,
            Ok(_) => false,
            Err(e) => {
                tracing::debug!(error = %e, "precheck failed; the transaction decides");
                false
            }
        }
    }
}

/// What [`Steps::begin_with_claim`] answered for `key`'s marker. Its duplicate is the
/// violation of an index of the inbox's name — and confirmed by reading the marker of this key
/// and consumer once the transaction is rolled back ([`confirm_duplicates`]): an index
/// redefined under that name since the check (`UNIQUE (message_id)`, say, on a live MariaDB)
/// refuses a new message of another consumer with the same error, and MariaDB names no table
/// beside the index. A duplicate costs that one read.
pub(crate) async fn claimed_with_begin<S: Steps>(
    steps: &mut S,
    spec: &'static HandlerSpec,
    key: &MessageKey,
    claimed: QueryResult<bool>,
) -> QueryResult<bool> {
    match claimed {
        // Another unique index refused the marker: on a partitioned inbox, the partition's
        // own. A duplicate only where the marker is there once this transaction is rolled
        // back (the other one committed: the insert waited).
        Err(e)
            if matches!(
                classify(&e, &spec.schema),
                ErrorClass::UniqueViolation { .. }
            ) =>
        {
            roll_back(steps).await;
            match steps.markers_present(spec, &[key.stored_id()], false).await {
                Ok(found) if found.present == 1 => evidence(spec, found, 1).map(|()| false),
                _ => Err(e),
            }
        }
        Ok(false) => {
            roll_back(steps).await;
            confirm_duplicates(steps, spec, &[key.stored_id()])
                .await
                .map(|()| false)
        }
        claimed => claimed,
    }
}

/// A batch's markers: the distinct stored ids, in a fixed order (so that two batches with
/// keys in common lock them in the same order and do not deadlock), and where each first
/// appears in the batch.
pub(crate) struct BatchClaims<'n> {
    /// Distinct ids, sorted, with the index of the first message carrying each.
    ids: Vec<(uuid::Uuid, usize)>,
    /// The batch's keys, for their texts on a table with `key_text`.
    keys: &'n [MessageKey],
    /// Where the body finds the messages that are new in this attempt.
    new: &'n NewMessages,
}

impl<'n> BatchClaims<'n> {
    pub(crate) fn new(keys: &'n [MessageKey], new: &'n NewMessages) -> Self {
        let mut ids: Vec<(uuid::Uuid, usize)> = keys
            .iter()
            .enumerate()
            .map(|(at, key)| (key.stored_id(), at))
            .collect();
        // Sorted by id, then by position: the first of equal ids is the first delivered.
        ids.sort_unstable();
        ids.dedup_by_key(|(id, _)| *id);
        Self { ids, keys, new }
    }
}

impl Claims for BatchClaims<'_> {
    fn origin(&self, spec: &'static HandlerSpec) -> crate::outbox::Seed {
        crate::outbox::Seed::Origin(crate::outbox::origin(
            self.ids.iter().map(|&(id, _)| id),
            spec.consumer.as_str(),
        ))
    }

    async fn claim<S: Steps>(
        &self,
        steps: &mut S,
        spec: &'static HandlerSpec,
        layout: Layout,
    ) -> QueryResult<bool> {
        let ids: Vec<uuid::Uuid> = self.ids.iter().map(|(id, _)| *id).collect();
        let texts: Option<Vec<String>> = layout.key_text.then(|| {
            self.ids
                .iter()
                .map(|&(_, at)| key_text(&self.keys[at]))
                .collect()
        });
        // One statement per chunk, in the transaction and in the ids' order: a server takes
        // only so many bind parameters in one statement (PostgreSQL 65 535, SQLite 32 766;
        // two or three per marker), and a batch past that would fail on every redelivery.
        let mut inserted = Vec::new();
        for (n, chunk) in ids.chunks(MARKERS_PER_STATEMENT).enumerate() {
            let texts = texts.as_deref().map(|texts| {
                let start = n * MARKERS_PER_STATEMENT;
                &texts[start..start + chunk.len()]
            });
            inserted.extend(steps.claim_batch(spec, chunk, texts, layout).await?);
        }
        inserted.sort_unstable();
        let existing: Vec<uuid::Uuid> = ids
            .iter()
            .filter(|id| inserted.binary_search(id).is_err())
            .copied()
            .collect();
        for chunk in existing.chunks(present_per_statement(layout)) {
            confirm_duplicates(steps, spec, chunk).await?;
        }
        let mut new: Vec<usize> = self
            .ids
            .iter()
            .filter(|(id, _)| inserted.binary_search(id).is_ok())
            .map(|(_, at)| *at)
            .collect();
        new.sort_unstable();
        let any = !new.is_empty();
        self.new.set(new);
        Ok(any)
    }
}

/// Markers per insert statement of a batch: with three bind parameters each, under a quarter
/// of PostgreSQL's limit, under half of SQLite's.
pub(super) const MARKERS_PER_STATEMENT: usize = 5_000;

/// Ids per read of the duplicates' evidence ([`confirm_duplicates`]): as many as a packet of
/// the server's takes (MySQL, MariaDB: `max_allowed_packet`, which the check read), each id
/// its 16 bytes with its length and type and its `?, ` in the statement, the statement's own
/// text besides; at most [`MARKERS_PER_STATEMENT`]. A redelivered batch of 1 000 duplicates
/// made one read larger than a 4 KiB packet, which the server answers by dropping the
/// connection — on every redelivery, the batch's new messages never applied (an operator's
/// trial).
fn present_per_statement(layout: Layout) -> usize {
    const PER_ID: usize = 24;
    const STATEMENT: usize = 512;
    (layout.room(STATEMENT) / PER_ID).clamp(1, MARKERS_PER_STATEMENT)
}

/// The positions of the messages of a batch that are new in the current attempt, written by
/// the runtime before each run of the body and read by the body.
#[derive(Debug, Default)]
pub struct NewMessages(std::sync::Mutex<Vec<usize>>);

impl NewMessages {
    fn set(&self, positions: Vec<usize>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = positions;
    }

    /// The positions, in the batch's order.
    pub fn positions(&self) -> Vec<usize> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The new messages of `all`, in the batch's order.
    pub fn select<'m, T>(&self, all: &'m [T]) -> Vec<&'m T> {
        self.positions().into_iter().map(|at| &all[at]).collect()
    }
}
