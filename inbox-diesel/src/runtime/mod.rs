//! The runtime: the steps of every mode written once ([`driver`]) over the connection's
//! steps, run synchronously ([`sync`]) or awaited ([`asynchronous`]).

pub(crate) mod claim;
pub(crate) mod driver;
pub(crate) mod stored;
pub(crate) mod sync;

#[cfg(feature = "async")]
pub(crate) mod asynchronous;
