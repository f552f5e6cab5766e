//! `guarded!(|tx| …)`: the compile-time guard of `#[idempotent]` on a closure, for the
//! function API (`inbox_diesel::handler::run_once` and its relatives) and the integrations
//! built on it.
//!
//! The closure's first parameter is the transaction; its body is rewritten by
//! [`guard::instrument`] exactly as a transaction-mode handler's body is, so a value it hands
//! on — a captured pool, a connection established in it, a second connection parameter — is
//! asked at its type whether it is a connection, and one that is fails to compile with the
//! guard's message. The closure then returns its value wrapped in
//! `inbox_diesel::handler::Checked`, which only this expansion builds and which the function
//! API requires: a body that did not come through the guard does not type-check there.

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::visit_mut::{self, VisitMut};
use syn::{Block, Expr, ExprClosure, FnArg, Ident, Item, ItemFn, Pat, PatType, ReturnType};

use crate::guard;
use crate::valid::Mode;

const SHAPE: &str = "guarded! takes a closure whose first parameter is the transaction: \
                     `guarded!(|tx| …)`, or `guarded!(async |tx| …)` for diesel-async";

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
    let conn = transaction_parameter(closure)?;
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
    let instrumented = guard::instrument(&mut function, &conn, Mode::Transaction);
    guard::strip_escapes(&mut function);
    instrumented?;
    let mut block = function.block;
    Exits { wrapped: 0 }.visit_block_mut(&mut block);
    let span = closure.body.span();
    // A body that is one expression stays one: `checked(expr)`, not `checked({ expr })`,
    // which the compiler would flag as unnecessary braces.
    let block = match block.stmts.as_slice() {
        [syn::Stmt::Expr(expr, None)] => quote!(#expr),
        _ => quote!(#block),
    };
    let value = match std::mem::replace(&mut closure.output, ReturnType::Default) {
        ReturnType::Type(_, ty) => quote_spanned!(span=>
            ::inbox_diesel::__private::checked::<#ty>(#block)
        ),
        ReturnType::Default => quote_spanned!(span=> ::inbox_diesel::__private::checked(#block)),
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

/// Wraps the closure's exits other than its tail: `return value` becomes
/// `return checked(value)`, and `expr?` the `match` it stands for, whose `Err` arm returns
/// `checked(Err(From::from(error)))` — a body of the function API returns a `Result`, so
/// `?` there is always the `Result` form. Closures, async blocks and items in the body are
/// their own exits' targets, and are left alone.
struct Exits {
    /// How many exits were wrapped: a macro's arguments are re-emitted only if some were.
    wrapped: usize,
}

impl VisitMut for Exits {
    fn visit_expr_mut(&mut self, expr: &mut Expr) {
        match expr {
            Expr::Closure(_) | Expr::Async(_) => {}
            Expr::Return(ret) => {
                if let Some(value) = &mut ret.expr {
                    self.visit_expr_mut(value);
                }
                let span = ret.span();
                let value = match ret.expr.take() {
                    Some(value) => quote!(#value),
                    None => quote!(()),
                };
                self.wrapped += 1;
                ret.expr = Some(Box::new(syn::parse_quote_spanned!(span=>
                    ::inbox_diesel::__private::checked(#value)
                )));
            }
            Expr::Try(question) => {
                self.visit_expr_mut(&mut question.expr);
                let inner = &question.expr;
                let span = question.question_token.span;
                let ok = Ident::new("__inbox_ok", Span::mixed_site());
                let error = Ident::new("__inbox_error", Span::mixed_site());
                self.wrapped += 1;
                *expr = syn::parse_quote_spanned!(span=>
                    match #inner {
                        ::core::result::Result::Ok(#ok) => #ok,
                        // `?`'s conversion, which is the identity when the error is the
                        // body's own type.
                        #[allow(clippy::useless_conversion)]
                        ::core::result::Result::Err(#error) => {
                            return ::inbox_diesel::__private::checked(
                                ::core::result::Result::Err(::core::convert::From::from(#error)),
                            );
                        }
                    }
                );
            }
            _ => visit_mut::visit_expr_mut(self, expr),
        }
    }

    fn visit_item_mut(&mut self, _: &mut Item) {}

    /// The guard's questions wrap the values they ask about in `vet!(value)` and
    /// `vet!(@place value)`, and a macro's arguments may hold exits too (`format!("{}",
    /// f()?)`): arguments that parse as expressions are visited, and re-emitted if an exit
    /// in them was wrapped. Arguments that are not expressions are left as written.
    fn visit_macro_mut(&mut self, mac: &mut syn::Macro) {
        let tokens = mac.tokens.clone().into_iter().collect::<Vec<_>>();
        let (marker, rest) = match tokens.first() {
            Some(proc_macro2::TokenTree::Punct(at)) if at.as_char() == '@' && tokens.len() > 2 => (
                tokens[..2].iter().cloned().collect::<TokenStream>(),
                &tokens[2..],
            ),
            _ => (TokenStream::new(), &tokens[..]),
        };
        let parser = syn::punctuated::Punctuated::<Expr, syn::Token![,]>::parse_terminated;
        let Ok(mut arguments) = syn::parse::Parser::parse2(parser, rest.iter().cloned().collect())
        else {
            return;
        };
        let before = self.wrapped;
        for argument in arguments.iter_mut() {
            self.visit_expr_mut(argument);
        }
        if self.wrapped != before {
            mac.tokens = quote!(#marker #arguments);
        }
    }
}
