//! Runnable examples: `credit.rs` (the attribute on SQLite, PostgreSQL or MySQL),
//! `credit_async.rs` (diesel-async and a bb8 pool), `signup.rs` (get-or-create on a business
//! key) and `bench/` (throughput against baselines and peers). This library holds what they
//! share.

pub mod support;
