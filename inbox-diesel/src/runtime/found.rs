//! What a read of the markers found, in the words every step uses: which markers of a set of
//! keys are there ([`Presence`]), and what one kept beside its key ([`Kept`]).

use crate::value::Fingerprint;

/// The markers [`present`](super::claim::present) found: all of them, those completed (`processed_at` set), and
/// claims of claim mode still within their lease. A claim is a marker too, but not a
/// duplicate's evidence for a handler of another mode: its side effect may not have run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Presence {
    pub(crate) present: usize,
    pub(crate) completed: usize,
    pub(crate) live_claims: usize,
}

/// What a marker kept: its stored result's text and its fingerprint, each if any.
#[derive(Debug, Default)]
pub(crate) struct Kept {
    pub(crate) result: Option<String>,
    pub(crate) fingerprint: Option<Vec<u8>>,
}

impl Kept {
    /// Whether the marker was written for a request with another fingerprint than `ours`.
    /// A marker without one (written before the handler had one) is not known to differ.
    pub(crate) fn reused_by(&self, ours: Option<Fingerprint>) -> bool {
        match (&self.fingerprint, ours) {
            (Some(kept), Some(ours)) => kept.as_slice() != ours.as_bytes(),
            _ => false,
        }
    }
}
