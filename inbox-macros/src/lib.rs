//! The `#[idempotent]` attribute of `inbox-diesel`, its `guarded!` closures and its
//! `MultiConnection` derive (`multi`), which `inbox-diesel` re-exports with their
//! documentation. This crate is an implementation detail: depend on `inbox-diesel`.
//!
//! The expansion runs in three phases, one module each: `attr` parses the arguments,
//! `valid` checks them and the function against each other, `guard` rewrites the body so
//! that the compiler checks every value it hands on against the transaction, `expand` writes
//! the code.
//! Every error is spanned at the token it is about; on error the function is emitted with
//! the signature the expansion would give it and a body that never runs (`expand::fallback`),
//! so that the rest of the crate keeps type-checking against it and only the real error shows.

use proc_macro::TokenStream;

mod attr;
mod closure;
mod expand;
mod guard;
mod multi;
mod valid;

/// See `inbox_diesel::idempotent`.
#[proc_macro_attribute]
pub fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::idempotent(args.into(), item.into()).into()
}

/// See `inbox_diesel::guarded`.
#[proc_macro]
pub fn guarded(input: TokenStream) -> TokenStream {
    closure::guarded(input.into()).into()
}

/// See `inbox_diesel::MultiConnection`.
#[proc_macro_derive(MultiConnection)]
pub fn multi_connection(input: TokenStream) -> TokenStream {
    multi::derive(input.into()).into()
}
