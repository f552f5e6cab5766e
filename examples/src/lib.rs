//! Runnable examples: see `credit.rs`.
