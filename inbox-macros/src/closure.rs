//! `guarded!(|tx| …)`: the compile-time guard of `#[idempotent]` on a closure, for the
//! function API (`inbox_diesel::handler::run_once` and its relatives) and the integrations
//! built on it.
//!
//! The closure's first parameter is the transaction; its body is rewritten by
//! [`guard::instrument`] exactly as a transaction-mode handler's body is (a closure without
//! parameters is a claim-mode body, `handler::claim_once`'s, and rewritten as one), so a value it hands
//! on — a captured pool, a connection established in it, a second connection parameter — is
//! asked at its type whether it is a connection, and one that is fails to compile with the
//! guard's message. The closure then returns its value wrapped in
//! `inbox_diesel::handler::Checked`, which has no public constructor (this expansion builds it
//! through `inbox_diesel::__private`) and which the function API requires: a body that did not
//! come through the guard does not type-check there.

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Block, Expr, ExprClosure, FnArg, Ident, ItemFn, Pat, PatType, ReturnType};

use crate::guard;
use crate::valid::Mode;

const SHAPE: &str = "guarded! takes a closure whose first parameter is the transaction: \
                     `guarded!(|tx| …)`, or `guarded!(async |tx| …)` for diesel-async; or, \
                     for a claim-mode body, which has no connection, one without parameters: \
                     `guarded!(|| …)`, `guarded!(async || …)`";

pub fn guarded(input: TokenStream) -> TokenStream {
    let mut closure: ExprClosure = match syn::parse2(input) {
        Ok(closure) => closure,
        Err(_) => {
            let error = syn::Error::new(Span::call_site(), SHAPE).to_compile_error();
            return quote!({ #error; |_| ::core::unreachable!() });
        }
    };
    match instrument(&mut closure) {
        Ok(()) => closure.into_token_stream(),
        Err(error) => {
            // A closure of the shape the function API takes, whose body never runs, so that
            // the caller type-checks against it and only the real error shows: async if the
            // body was meant to be, its transaction's type as written.
            let error = error.to_compile_error();
            let asyncness = closure.asyncness.is_some() || matches!(*closure.body, Expr::Async(_));
            let asyncness = asyncness.then(|| quote!(async));
            let ty = match closure.inputs.first() {
                Some(Pat::Type(typed)) => {
                    let ty = &typed.ty;
                    quote!(: #ty)
                }
                _ => quote!(),
            };
            quote!({ #error; #asyncness |_ #ty| ::core::unreachable!() })
        }
    }
}

fn instrument(closure: &mut ExprClosure) -> syn::Result<()> {
    // No parameter: a claim-mode body, which has no transaction and touches no database
    // (`handler::claim_once`); every value it hands on is asked with claim mode's question.
    let (conn, mode) = match closure.inputs.is_empty() {
        true => (
            Ident::new("__inbox_no_connection", Span::call_site()),
            Mode::Claim {
                lease_ms: None,
                report: false,
            },
        ),
        false => (transaction_parameter(closure)?, Mode::Transaction),
    };
    if closure.asyncness.is_none()
        && let Expr::Async(block) = &*closure.body
    {
        return Err(syn::Error::new(
            block.async_token.span,
            "a closure that returns an `async` block: write an async closure, \
             `guarded!(async |tx| …)`, which the function API's async runners take",
        ));
    }
    let inputs = closure
        .inputs
        .iter()
        .map(|pat| match pat {
            Pat::Type(typed) => FnArg::Typed(typed.clone()),
            other => FnArg::Typed(PatType {
                attrs: Vec::new(),
                pat: Box::new(other.clone()),
                colon_token: Default::default(),
                ty: Box::new(syn::parse_quote!(_)),
            }),
        })
        .collect::<Vec<_>>();
    let body = &closure.body;
    let block: Block = match &**body {
        Expr::Block(block) if block.attrs.is_empty() && block.label.is_none() => {
            block.block.clone()
        }
        other => syn::parse_quote_spanned!(other.span()=> { #other }),
    };
    // The guard works on a function: the closure's parameters as its parameters, its body as
    // its block. Only the names are read from the parameters.
    let mut function: ItemFn = syn::parse_quote!(
        fn __inbox_guarded() {}
    );
    function.sig.inputs = inputs.into_iter().collect();
    function.block = Box::new(block);
    let instrumented = guard::instrument(&mut function, &conn, mode);
    guard::strip_escapes(&mut function);
    instrumented?;
    let block = function.block;
    let span = closure.body.span();
    // The body runs in a closure (an async block) of its own, called at once, whose value
    // is wrapped: its `return`s and `?`s — also those a macro writes, as `anyhow::bail!`
    // does — leave that inner scope with the body's value, as they left the closure before.
    let async_body = closure.asyncness.is_some();
    let value = match (
        std::mem::replace(&mut closure.output, ReturnType::Default),
        async_body,
    ) {
        (ReturnType::Type(_, ty), false) => quote_spanned!(span=>
            ::inbox_diesel::__private::checked_call(|| -> #ty #block)
        ),
        (ReturnType::Default, false) => quote_spanned!(span=>
            ::inbox_diesel::__private::checked_call(|| #block)
        ),
        (ReturnType::Type(_, ty), true) => quote_spanned!(span=>
            ::inbox_diesel::__private::checked_future::<#ty, _>(async #block).await
        ),
        (ReturnType::Default, true) => quote_spanned!(span=>
            ::inbox_diesel::__private::checked_future(async #block).await
        ),
    };
    *closure.body = syn::parse2(value)?;
    Ok(())
}

/// The name of the closure's first parameter: the transaction.
fn transaction_parameter(closure: &ExprClosure) -> syn::Result<Ident> {
    let Some(first) = closure.inputs.first() else {
        return Err(syn::Error::new(closure.inputs_begin.span, SHAPE));
    };
    let pat = match first {
        Pat::Type(typed) => &*typed.pat,
        other => other,
    };
    match pat {
        Pat::Ident(ident) if ident.by_ref.is_none() && ident.subpat.is_none() => {
            Ok(ident.ident.clone())
        }
        other => Err(syn::Error::new(
            other.span(),
            "the transaction parameter is a name, as in `guarded!(|tx| …)`: the guard follows \
             that name through the body",
        )),
    }
}
