//! Phase 3: the code. The function keeps its attributes, visibility, name, parameters and
//! body; only its return type changes (`T` → `Outcome<T>`, or the outcome type of its mode),
//! and its body moves into a closure
//! handed to the runtime, which owns the transaction.

use inbox_core::Isolation;
use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{GenericArgument, ItemFn, PathArguments, ReturnType, Type};

use crate::attr::Args;
use crate::guard;
use crate::valid::{self, Handler, Mode};

/// The whole attribute: parse, validate, expand; on error the errors and the [`fallback`],
/// so that only the real error shows.
pub fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    let mut function: ItemFn = match syn::parse2(item.clone()) {
        Ok(function) => function,
        Err(_) => {
            let error = syn::Error::new(
                proc_macro2::Span::call_site(),
                "#[idempotent] applies to a function: `#[idempotent(consumer = \"credit\", \
                 key = msg.id)] fn on_credit(conn: &mut PgConnection, msg: &Msg) -> Result<…>`",
            );
            return with_error(item, error);
        }
    };
    let form = outcome_form(&args);
    let handler = syn::parse2::<Args>(args)
        .and_then(|args| valid::validate(args, &function))
        .and_then(|handler| {
            guard::instrument(&mut function, &handler.conn, handler.mode)?;
            Ok(handler)
        });
    // The escape hatch is this macro's own attribute; the compiler must not see it, on error
    // either.
    guard::strip_escapes(&mut function);
    match handler {
        Ok(handler) => expand(handler, function),
        Err(error) => with_error(fallback(function, form), error),
    }
}

/// What the function becomes when the attribute has an error: its signature as the
/// expansion would have written it — returning the outcome type the arguments ask for — and
/// a body that never runs. Callers that match on the outcome type-check against it,
/// so the attribute's error is the only one (thiserror's `fallback.rs`, tokio's `entry.rs`).
/// The original body stays, in a closure never called, so that its own errors still show
/// and its parameters are used. A function without a `Result` return type is left as it is:
/// the error says what it should return.
fn fallback(function: ItemFn, form: OutcomeForm) -> TokenStream {
    let ReturnType::Type(_, ret) = &function.sig.output else {
        return quote!(#function);
    };
    let ret = (**ret).clone();
    let wrapper = form.wrapper();
    let ItemFn {
        attrs,
        vis,
        mut sig,
        block,
        ..
    } = function;
    sig.output = outcome_return_type(&ret, wrapper);
    // A `const fn` is itself an error the attribute reports; the fallback is not const.
    sig.constness = None;
    let body = match sig.asyncness {
        Some(_) => quote!(async move || -> #ret #block),
        None => quote!(move || -> #ret #block),
    };
    quote! {
        #(#attrs)*
        #[allow(unreachable_code, unused_variables, clippy::diverging_sub_expression)]
        #vis #sig {
            let _body = #body;
            ::core::unreachable!("#[idempotent] did not expand: see its error")
        }
    }
}

/// Which outcome type a handler returns: the one that holds only what its mode can answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OutcomeForm {
    /// Transaction mode: `Processed` or `Duplicate`.
    Outcome,
    /// `on_locked = "in_flight"`, and claim mode: and `InFlight`.
    InFlight,
    /// Claim mode with `on_expired = "report"`: and `StaleClaim`.
    StaleClaim,
    /// `batch = …`.
    Batch,
}

impl OutcomeForm {
    fn of(handler: &Handler) -> Self {
        match (&handler.batch, handler.mode) {
            (Some(_), _) => OutcomeForm::Batch,
            (None, Mode::Claim { report: true, .. }) => OutcomeForm::StaleClaim,
            (None, Mode::Claim { report: false, .. }) => OutcomeForm::InFlight,
            (None, Mode::Transaction) if handler.in_flight_when_locked => OutcomeForm::InFlight,
            (None, Mode::Transaction) => OutcomeForm::Outcome,
        }
    }

    fn wrapper(self) -> TokenStream {
        match self {
            OutcomeForm::Outcome => quote!(::inbox_diesel::Outcome),
            OutcomeForm::InFlight => quote!(::inbox_diesel::InFlightOutcome),
            OutcomeForm::StaleClaim => quote!(::inbox_diesel::StaleClaimOutcome),
            OutcomeForm::Batch => quote!(::inbox_diesel::BatchOutcome),
        }
    }
}

/// The outcome type the arguments ask for, read from their tokens (`batch = …`,
/// `mode = "claim"`, `on_expired = "report"`, `on_locked = "in_flight"`): the fallback needs
/// it also when the arguments do not parse.
fn outcome_form(args: &TokenStream) -> OutcomeForm {
    let tokens: Vec<_> = args.clone().into_iter().collect();
    let set = |name: &str| -> Option<String> {
        tokens.windows(3).find_map(|window| match window {
            [
                proc_macro2::TokenTree::Ident(ident),
                proc_macro2::TokenTree::Punct(eq),
                value,
            ] if ident == name && eq.as_char() == '=' => Some(value.to_string()),
            _ => None,
        })
    };
    if set("batch").is_some() {
        OutcomeForm::Batch
    } else if set("on_expired").as_deref() == Some("\"report\"") {
        OutcomeForm::StaleClaim
    } else if set("mode").as_deref() == Some("\"claim\"")
        || set("on_locked").as_deref() == Some("\"in_flight\"")
    {
        OutcomeForm::InFlight
    } else {
        OutcomeForm::Outcome
    }
}

/// The type of the body's connection parameter: `&mut` the handler's declared connection
/// type, named so that the body's calls on it resolve as they do in the handler (the body is a
/// closure in a struct, where no bound tells its parameter's type), and so that the closure
/// takes a connection of any lifetime. `&mut _` where the declared type cannot be named
/// (`impl Trait`) or is not `&mut`.
fn body_connection_type(sig: &syn::Signature, conn: &syn::Ident) -> TokenStream {
    let declared = sig.inputs.iter().find_map(|input| match input {
        syn::FnArg::Typed(typed) => match &*typed.pat {
            syn::Pat::Ident(pat) if pat.ident == *conn => Some(&*typed.ty),
            _ => None,
        },
        syn::FnArg::Receiver(_) => None,
    });
    match declared {
        Some(syn::Type::Reference(reference))
            if reference.mutability.is_some()
                && !quote!(#reference)
                    .to_string()
                    .split(|c: char| !c.is_alphanumeric() && c != '_')
                    .any(|word| word == "impl") =>
        {
            let elem = &reference.elem;
            quote!(&mut #elem)
        }
        _ => quote!(&mut _),
    }
}

fn with_error(item: TokenStream, error: syn::Error) -> TokenStream {
    let error = error.to_compile_error();
    quote!(#item #error)
}

pub fn expand(handler: Handler, function: ItemFn) -> TokenStream {
    let form = OutcomeForm::of(&handler);
    let Handler {
        consumer,
        key,
        conn,
        retries,
        isolation,
        table,
        constraint,
        schema,
        ret,
        busy_timeout_ms,
        mode,
        batch,
        precheck,
        idle_in_transaction_ms,
        in_flight_when_locked,
        store_result,
        fingerprint,
        joins,
        or_own,
        lease_expr,
    } = handler;
    // An application's `const InboxSchema`, or the names given (checked at compile time).
    let schema = match schema {
        Some(path) => quote!(#path),
        None => quote!(::inbox_diesel::__private::InboxSchema::new_unchecked(#table, #constraint)),
    };
    let ItemFn {
        attrs,
        vis,
        mut sig,
        block,
        ..
    } = function;
    let wrapper = form.wrapper();
    sig.output = outcome_return_type(&ret, wrapper.clone());

    let busy_timeout_ms = match busy_timeout_ms {
        Some(ms) => quote!(#ms),
        None => quote!(::inbox_diesel::__private::HandlerSpec::SQLITE_BUSY_TIMEOUT_MS),
    };
    let idle_in_transaction_ms = match idle_in_transaction_ms {
        Some(ms) => quote!(#ms),
        None => quote!(::inbox_diesel::__private::HandlerSpec::IDLE_IN_TRANSACTION_MS),
    };
    let isolation = match isolation {
        Isolation::ServerDefault => quote!(ServerDefault),
        Isolation::ReadCommitted => quote!(ReadCommitted),
        Isolation::RepeatableRead => quote!(RepeatableRead),
        Isolation::Serializable => quote!(Serializable),
    };
    // Spanned at the user's tokens, so that a type error is reported where it can be fixed:
    // an error type without `From<inbox_diesel::Error>` at the return type, a key type that
    // is not a message key at the key.
    let inbox_error = quote_spanned!(ret.span()=>
        <#ret as ::inbox_diesel::__private::HandlerResult>::inbox_error
    );
    // A tuple (a composite key) borrows each part: `(a, b)` would move a `String` parameter
    // out of the body's reach.
    let key = match key {
        syn::Expr::Tuple(tuple) if !tuple.elems.is_empty() => {
            let parts = tuple.elems.iter();
            let span = tuple.span();
            syn::parse_quote_spanned!(span=> (#(&(#parts),)*))
        }
        key => key,
    };
    let message_key = quote_spanned!(key.span()=> ::inbox_diesel::__private::message_key(&(#key)));
    // The one place sync and async differ: which runtime, and whether the body is an async
    // closure that the runtime awaits.
    let (body_asyncness, awaited) = match &sig.asyncness {
        Some(_) => (quote!(async), quote!(.await)),
        None => (quote!(), quote!()),
    };
    // How the body's error is classified, for retries: resolved here, where its type is known.
    // An error type it cannot find a diesel error in is warned about, at the return type
    // (a deprecated method: the only warning a library can raise on stable Rust).
    let readable = quote_spanned!(ret.span()=> {
        #[allow(unused_imports)]
        use ::inbox_diesel::__private::{
            ReadDiesel as _, ReadHasDieselError as _, ReadOpaque as _, ReadOther as _,
            ReadSourceChain as _,
        };
        ::inbox_diesel::__private::error_is_readable(
            (&&&&::inbox_diesel::__private::Readable::<#ret>::NEW).inbox_readable(),
        );
    });
    let probe = quote!({
        #readable
        ::inbox_diesel::__private::error_class!(#ret, __INBOX_SPEC)
    });
    // `store_result = true`: the value's codec, which needs the value to be serde's.
    // Spanned at the return type: a value that is not serde's is reported there.
    let store = match store_result {
        true => quote_spanned!(ret.span()=> ::core::option::Option::Some(
            ::inbox_diesel::__private::Store::json()
        )),
        false => quote!(::core::option::Option::None),
    };
    // `fingerprint = …`: spanned at the expression, so that one that is not bytes is
    // reported there.
    let fingerprint = match fingerprint {
        Some(expr) => quote_spanned!(expr.span()=> ::core::option::Option::Some(
            ::inbox_diesel::Fingerprint::of(&(#expr))
        )),
        None => quote!(::core::option::Option::None),
    };
    let store = quote!(::inbox_diesel::__private::Remembered::new(#store, #fingerprint));
    let conn_type = body_connection_type(&sig, &conn);
    let call = match (mode, batch) {
        (Mode::Transaction, Some(batch)) => {
            let runtime = match &sig.asyncness {
                Some(_) => quote!(run_batch_async),
                None => quote!(run_batch),
            };
            let keys = quote_spanned!(key.span()=>
                ::inbox_diesel::__private::batch_keys(::inbox_diesel::__private::messages(&#batch), #key)
            );
            // Each attempt's body sees, under the parameter's name, the messages that are new
            // in that attempt.
            quote! {
                let __inbox_new = ::inbox_diesel::__private::NewMessages::default();
                ::inbox_diesel::__private::#runtime(
                    #conn,
                    &__INBOX_SPEC,
                    #keys,
                    &__inbox_new,
                    #body_asyncness |#[allow(unused_variables)] #conn| -> #ret {
                        let __inbox_selected = __inbox_new.select(::inbox_diesel::__private::messages(&#batch));
                        let #batch = &__inbox_selected[..];
                        #block
                    },
                    #probe,
                    #inbox_error,
                ) #awaited
            }
        }
        (Mode::Transaction, None) => {
            // Which entry point, and how the body's closure takes the handler's parameters:
            // - `caller_or_own`: run once where it joins, as often as its retries where it is
            //   on its own, so the body is one that may run again;
            // - `caller`: run once, in the caller's transaction, so the body may consume its
            //   parameters (`move`);
            // - its own transaction: as often as its retries.
            let (run, run_async, capture) = match (or_own, joins) {
                (true, _) => (
                    quote!(run_joined_or_own),
                    quote!(run_joined_or_own_async),
                    quote!(),
                ),
                (false, true) => (quote!(run_joined), quote!(run_joined_async), quote!(move)),
                (false, false) => (quote!(run), quote!(run_async), quote!()),
            };
            let runtime = match &sig.asyncness {
                Some(_) => run_async,
                None => run,
            };
            // The outcome type named here, not inferred from the declared return type: it is
            // what the runtime answers by (`InFlight` only with `on_locked = "in_flight"`).
            quote! {
                // What the marker keeps, evaluated before the body's closure takes the parameters.
                let __inbox_remembered = #store;
                ::inbox_diesel::__private::#runtime(
                    #conn,
                    ::inbox_diesel::__private::Call {
                        outcome: ::core::marker::PhantomData::<#wrapper<_>>,
                        spec: &__INBOX_SPEC,
                        key: #message_key,
                        body: #body_asyncness #capture |#[allow(unused_variables)] #conn: #conn_type| -> #ret #block,
                        probe: #probe,
                        remembered: __inbox_remembered,
                        inbox_error: #inbox_error,
                    },
                ) #awaited
            }
        }
        (Mode::Claim { lease_ms, .. }, _) => {
            let runtime = match &sig.asyncness {
                Some(_) => quote!(run_claim_async),
                None => quote!(run_claim),
            };
            let lease_ms = match (lease_ms, &lease_expr) {
                (_, Some(setting)) => quote!(#setting),
                (Some(ms), None) => quote!(#ms),
                (None, None) => quote!(::inbox_diesel::__private::ClaimSpec::DEFAULT_LEASE_MS),
            };
            // The body is handed `NoConnection` in place of the connection: it runs outside
            // any transaction, and the guard asks about every mention of it. The outcome type
            // is named: whether an expired claim is reported follows from it.
            quote! {
                // What the marker keeps, evaluated before the body's closure takes the parameters.
                let __inbox_remembered = #store;
                ::inbox_diesel::__private::#runtime(
                    #conn,
                    ::inbox_diesel::__private::ClaimSpec { lease_ms: #lease_ms },
                    ::inbox_diesel::__private::Call {
                        outcome: ::core::marker::PhantomData::<#wrapper<_>>,
                        spec: &__INBOX_SPEC,
                        key: #message_key,
                        body: #body_asyncness |#[allow(unused_variables)] #conn: &mut ::inbox_diesel::NoConnection| -> #ret #block,
                        probe: (),
                        remembered: __inbox_remembered,
                        inbox_error: #inbox_error,
                    },
                ) #awaited
            }
        }
    };

    quote! {
        #(#attrs)*
        #vis #sig {
            static __INBOX_SPEC: ::inbox_diesel::__private::HandlerSpec =
                ::inbox_diesel::__private::HandlerSpec {
                    consumer: ::inbox_diesel::__private::Consumer::from_validated(#consumer),
                    schema: #schema,
                    retry: ::inbox_diesel::__private::RetryPolicy::new(#retries),
                    isolation: ::inbox_diesel::Isolation::#isolation,
                    sqlite_busy_timeout_ms: #busy_timeout_ms,
                    precheck: #precheck,
                    idle_in_transaction_ms: #idle_in_transaction_ms,
                    in_flight_when_locked: #in_flight_when_locked,
                };
            #call
        }
    }
}

/// `Result<T, E>` → `Result<::inbox_diesel::Outcome<T>, E>` (or `BatchOutcome<T>`); an alias
/// keeps its path (`QueryResult<T>` → `QueryResult<Outcome<T>>`). `valid` checked the shape.
/// An alias without a value type (`type EmptyResult = ApiResult<()>`) is read through
/// `HandlerResult`: `Result<Outcome<<EmptyResult as HandlerResult>::Ok>, … ::Error>`.
fn outcome_return_type(ret: &Type, wrapper: TokenStream) -> ReturnType {
    let mut ret = ret.clone();
    if let Type::Path(path) = &mut ret
        && let Some(last) = path.path.segments.last_mut()
        && let PathArguments::AngleBracketed(args) = &mut last.arguments
        && let Some(GenericArgument::Type(value)) = args.args.first_mut()
    {
        let wrapped = quote_spanned!(value.span()=> #wrapper<#value>);
        *value = syn::parse2(wrapped).expect("a path type parses");
        return syn::parse_quote!(-> #ret);
    }
    let result = quote_spanned!(ret.span()=> ::inbox_diesel::__private::HandlerResult);
    syn::parse_quote!(
        -> ::core::result::Result<#wrapper<<#ret as #result>::Ok>, <#ret as #result>::Error>
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The expansion as a reviewer reads it.
    fn pretty(args: TokenStream, item: TokenStream) -> String {
        let tokens = idempotent(args, item);
        let file: syn::File = syn::parse2(tokens).expect("the expansion parses as a file");
        prettyplease::unparse(&file)
    }

    #[test]
    fn expands_a_handler() {
        insta::assert_snapshot!(pretty(
            quote!(consumer = "credit", key = msg.message_id),
            quote! {
                /// Credits an account.
                pub fn on_credit(conn: &mut PgConnection, msg: &CreditRequested) -> Result<Receipt, AppError> {
                    diesel::update(accounts::table.find(msg.account_id))
                        .set(accounts::balance.eq(accounts::balance + msg.amount))
                        .execute(conn)?;
                    Ok(Receipt)
                }
            }
        ));
    }

    #[test]
    fn expands_every_option_and_an_alias_return_type() {
        insta::assert_snapshot!(pretty(
            quote!(
                consumer = "ship",
                key = (msg.topic.as_str(), msg.partition, msg.offset),
                conn = db,
                retries = 0,
                isolation = "serializable",
                table = "billing.inbox",
                constraint = "ux_billing_inbox",
                busy_timeout_ms = 250,
            ),
            quote! {
                fn on_shipment(&self, db: &mut Db, msg: &Record) -> diesel::QueryResult<()> {
                    Ok(())
                }
            }
        ));
    }

    /// A batch: keys from the closure, the body given the new messages under the
    /// parameter's name.
    #[test]
    fn expands_a_batch_handler() {
        insta::assert_snapshot!(pretty(
            quote!(
                consumer = "credit",
                batch = msgs,
                key = |msg| msg.message_id
            ),
            quote! {
                fn on_credits(conn: &mut PgConnection, msgs: &[CreditRequested]) -> QueryResult<usize> {
                    Ok(msgs.len())
                }
            }
        ));
    }

    /// Claim mode: the claim's lease and policy, and no probe (the body is not retried).
    #[test]
    fn expands_a_claim_mode_handler() {
        insta::assert_snapshot!(pretty(
            quote!(
                consumer = "email",
                key = msg.id,
                mode = "claim",
                lease_ms = 30000,
                on_expired = "report"
            ),
            quote! {
                async fn send(conn: &mut AsyncPgConnection, mailer: &Mailer, msg: &Signup) -> Result<(), AppError> {
                    mailer.send(&msg.email, &msg.id.to_string()).await?;
                    Ok(())
                }
            }
        ));
    }

    /// The escape hatch is the macro's own attribute: it must not reach the compiler.
    #[test]
    fn strips_the_escape_hatch() {
        insta::assert_snapshot!(pretty(
            quote!(consumer = "credit", key = msg.id),
            quote! {
                fn on_credit(conn: &mut PgConnection, msg: &Msg) -> QueryResult<()> {
                    #[inbox::outside_transaction("audit rows must survive a rollback")]
                    diesel::insert_into(audit::table).values(audit::id.eq(msg.id)).execute(&mut *AUDIT.lock().unwrap())?;
                    conn.transaction(|c| diesel::delete(holds::table).execute(c))?;
                    Ok(())
                }
            }
        ));
    }

    /// The guard's questions: a value handed on is asked in place, a receiver that is a place
    /// before its statement; the transaction and its aliases are not asked; a binding that
    /// shadows the connection is asked with its own message.
    #[test]
    fn asks_about_every_value_handed_on() {
        insta::assert_snapshot!(pretty(
            quote!(consumer = "credit", key = msg.id),
            quote! {
                fn on_credit(conn: &mut PgConnection, ctx: &mut Context, msg: &Msg) -> QueryResult<()> {
                    let alias = &mut *conn;
                    diesel::update(accounts::table).set(accounts::balance.eq(0)).execute(alias)?;
                    ctx.audit.batch_execute("INSERT INTO audit VALUES (1)")?;
                    if let Ok(mut conn) = pool.get() {
                        diesel::delete(holds::table).execute(&mut conn)?;
                    }
                    Ok(())
                }
            }
        ));
    }

    #[test]
    fn falls_back_to_the_outcome_signature_after_an_error() {
        insta::assert_snapshot!(pretty(
            quote!(key = msg.id),
            quote! {
                fn on_credit(conn: &mut PgConnection, msg: &Msg) -> Result<(), E> {
                    Ok(())
                }
            }
        ));
    }

    /// The fallback returns the outcome type the arguments ask for, read from their tokens
    /// even when they do not parse.
    #[test]
    fn the_fallback_reads_the_outcome_type_from_the_arguments() {
        let form = |args: TokenStream| outcome_form(&args);
        assert_eq!(form(quote!(key = msg.id)), OutcomeForm::Outcome);
        assert_eq!(
            form(quote!(on_locked = "wait", key =)),
            OutcomeForm::Outcome
        );
        assert_eq!(
            form(quote!(on_locked = "in_flight", key =)),
            OutcomeForm::InFlight
        );
        assert_eq!(
            form(quote!(mode = "claim", retries = x)),
            OutcomeForm::InFlight
        );
        assert_eq!(
            form(quote!(mode = "claim", on_expired = "report", 7)),
            OutcomeForm::StaleClaim
        );
        assert_eq!(form(quote!(batch = msgs, key = ,)), OutcomeForm::Batch);
    }
}
