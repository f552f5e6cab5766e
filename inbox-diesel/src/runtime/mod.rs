//! The runtime: the steps of every mode written once over the connection's steps
//! ([`steps`], implemented once over either IO model in [`handle`]) — transaction mode
//! ([`transaction`]), claim mode ([`claim_mode`], on a pool too), a batch's markers
//! ([`batch`]), what a duplicate is answered on ([`evidence`]), what a read of markers found
//! ([`found`]), the startup check's cache ([`checked`]), stored results ([`stored`]),
//! failures and giving up ([`failure`]) — and the entry points, run synchronously
//! ([`sync`]) or awaited ([`asynchronous`]).

/// Where `inbox_diesel::testing::crash` may stop the handler; nothing without the feature.
macro_rules! crash_point {
    ($point:ident) => {
        #[cfg(feature = "testing")]
        crate::testing::reached(crate::testing::Crash::$point);
    };
}

pub(crate) mod batch;
pub(crate) mod call;
pub(crate) mod checked;
pub(crate) mod claim;
pub(crate) mod claim_mode;
pub(crate) mod evidence;
pub(crate) mod failure;
pub(crate) mod found;
pub(crate) mod handle;
pub(crate) mod steps;
pub(crate) mod stored;
pub(crate) mod sync;
pub(crate) mod transaction;

#[cfg(feature = "async")]
pub(crate) mod asynchronous;

#[cfg(test)]
mod tests;
