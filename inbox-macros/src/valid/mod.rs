//! Phase 2: the arguments checked against their rules and against the function.
//!
//! Independent problems are all reported at once (`syn::Error::combine`), each spanned at the
//! token it is about.

use inbox_core::{Consumer, ConsumerError, InboxSchema, Isolation, RetryPolicy};
use proc_macro2::{Span, TokenStream, TokenTree};
use quote::ToTokens;
use syn::spanned::Spanned;
use syn::{
    Expr, FnArg, GenericArgument, Ident, ItemFn, LitStr, Pat, PathArguments, ReturnType, Type,
};

use crate::attr::{Args, USAGE};

mod options;
mod signature;

use options::*;
use signature::*;

/// Everything the expansion needs, checked.
pub struct Handler {
    pub consumer: String,
    pub key: Expr,
    pub conn: Ident,
    pub retries: u32,
    pub isolation: Isolation,
    pub table: String,
    pub constraint: String,
    /// `schema = INBOX`: a `const InboxSchema` of the application's, in place of `table`
    /// and `constraint`.
    pub schema: Option<syn::Path>,
    /// The declared return type, `Result<T, E>` or an alias of it.
    pub ret: Type,
    /// SQLite's busy timeout, when not the runtime's default.
    pub busy_timeout_ms: Option<u32>,
    /// Transaction or claim mode, with claim mode's settings.
    pub mode: Mode,
    /// `batch = msgs`: the parameter holding a batch of messages; `key` is then a closure
    /// from one message to its key.
    pub batch: Option<Ident>,
    /// `precheck = true`: look for a completed marker before opening the transaction.
    pub precheck: bool,
    /// PostgreSQL's bound on an idle handler transaction, when not the runtime's default.
    pub idle_in_transaction_ms: Option<u32>,
    /// `on_locked = "in_flight"`.
    pub in_flight_when_locked: bool,
    /// `store_result = true`: the body's `Ok` value is kept with the marker and returned to
    /// a duplicate.
    pub store_result: bool,
    /// `fingerprint = …`: the bytes whose digest is kept with the marker; a later delivery
    /// of the key with another digest is refused.
    pub fingerprint: Option<Expr>,
    /// `transaction = "caller"`: the marker and the body join the transaction the caller
    /// opened, committed by the caller.
    pub joins: bool,
    /// `transaction = "caller_or_own"`: as `"caller"` where the caller has a transaction
    /// open, as `"own"` where it has none.
    pub or_own: bool,
    /// `lease_ms = <expression>` (not a literal): the lease, evaluated at each call.
    pub lease_expr: Option<Expr>,
}

/// How the body's work is made to happen once.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The body's writes commit with the marker, in one transaction.
    Transaction,
    /// The body's side effect runs between a committed claim and its stamp.
    Claim {
        /// The lease, when not the runtime's default.
        lease_ms: Option<u64>,
        /// `on_expired = "report"`.
        report: bool,
    },
}

/// The longest claim lease, 30 days in milliseconds: far beyond any side effect, and far
/// inside the timestamp arithmetic of every backend.
const MAX_LEASE_MS: u64 = 30 * 24 * 60 * 60 * 1000;

/// The shortest claim lease, 100 ms: a claim whose own statement takes more than a quarter
/// of its lease to come back is given back and taken again, so a lease of a few milliseconds
/// would never let a claim start its body.
const MIN_LEASE_MS: u64 = 100;

/// Collects independent errors so that one compile shows them all.
#[derive(Default)]
struct Errors(Option<syn::Error>);

impl Errors {
    fn push(&mut self, error: syn::Error) {
        match &mut self.0 {
            Some(first) => first.combine(error),
            None => self.0 = Some(error),
        }
    }

    /// Keeps the value, or records the error and keeps nothing.
    fn take<T>(&mut self, result: syn::Result<T>) -> Option<T> {
        result.map_err(|e| self.push(e)).ok()
    }
}

pub fn validate(args: Args, item: &ItemFn) -> syn::Result<Handler> {
    let mut errors = Errors::default();
    let sig = &item.sig;

    if let Some(constness) = &sig.constness {
        errors.push(syn::Error::new(
            constness.span(),
            "#[idempotent] cannot be applied to a `const fn`: the handler runs SQL at run \
             time; remove `const`",
        ));
    }
    let consumer = match &args.consumer {
        Some(lit) => errors.take(consumer(lit)),
        None => {
            errors.push(missing("consumer"));
            None
        }
    };
    let mode = errors.take(mode(&args)).unwrap_or(Mode::Transaction);
    let joins = match &args.transaction {
        Some(lit) => errors.take(joins(lit, &args, mode)),
        None => Some((false, false)),
    };

    let batch = match &args.batch {
        Some(batch) => errors.take(batch_parameter(batch, item, mode)).map(Some),
        None => Some(None),
    };
    let key = match args.key {
        Some(key) if args.batch.is_some() => errors.take(key_closure(key)),
        Some(key) => errors.take(key_uses_a_parameter(key, item)),
        None => {
            errors.push(missing("key"));
            None
        }
    };
    let conn = errors.take(connection(
        args.conn.as_ref(),
        item,
        matches!(mode, Mode::Claim { .. }),
    ));
    let ret = errors.take(return_type(item));
    let retries = match &args.retries {
        Some(lit) => errors.take(lit.base10_parse::<u32>().map_err(|_| {
            syn::Error::new(
                lit.span(),
                "`retries` is a number of retries (0 to 4294967295): `retries = 3`",
            )
        })),
        None => Some(RetryPolicy::DEFAULT_RETRIES),
    };
    let isolation = match &args.isolation {
        Some(lit) => errors.take(isolation(lit)),
        None => Some(Isolation::ServerDefault),
    };
    if let Some(schema) = &args.schema
        && (args.table.is_some() || args.constraint.is_some())
    {
        errors.push(syn::Error::new_spanned(
            schema,
            "`schema` names the inbox table and its index already: give `schema = INBOX` or \
             `table` and `constraint`, not both",
        ));
    }
    let table = match &args.table {
        Some(lit) => errors.take(
            InboxSchema::validate_table(&lit.value())
                .map(|()| lit.value())
                .map_err(|e| {
                    syn::Error::new(
                        lit.span(),
                        format!(
                            "`table` must be a table name, optionally qualified: {e}; e.g. \
                             `table = \"inbox\"` or `table = \"billing.inbox\"`"
                        ),
                    )
                }),
        ),
        None => Some(InboxSchema::DEFAULT_TABLE.to_owned()),
    };
    let constraint = match &args.constraint {
        Some(lit) => errors.take(
            InboxSchema::validate_identifier(&lit.value())
                .map(|()| lit.value())
                .map_err(|e| {
                    syn::Error::new(
                        lit.span(),
                        format!(
                            "`constraint` must be the name of the unique index on \
                             (message_id, consumer): {e}; e.g. \
                             `constraint = \"ux_inbox_message_consumer\"`"
                        ),
                    )
                }),
        ),
        None => Some(InboxSchema::DEFAULT_CONSTRAINT.to_owned()),
    };

    // Both servers take these as 32-bit signed integers: a larger value would wrap (SQLite's
    // busy timeout to no wait at all).
    let busy_timeout_ms = errors.take(milliseconds(
        args.busy_timeout_ms.as_ref(),
        "`busy_timeout_ms` is how long a SQLite handler waits for another writer, in \
         milliseconds, from 0 to 2147483647 (what SQLite accepts): `busy_timeout_ms = 5000`",
    ));
    let idle_in_transaction_ms = errors.take(milliseconds(
        args.idle_in_transaction_ms.as_ref(),
        "`idle_in_transaction_ms` is how long a handler's transaction may sit idle on PostgreSQL or MariaDB \
         before the server ends it, in milliseconds, from 0 (no bound) to 2147483647: \
         `idle_in_transaction_ms = 10000`",
    ));

    let in_flight_when_locked = match &args.on_locked {
        Some(lit) => errors.take(match lit.value().as_str() {
            "wait" => Ok(false),
            "in_flight" if args.batch.is_some() || !matches!(mode, Mode::Transaction) => {
                Err(syn::Error::new(
                    lit.span(),
                    "`on_locked` applies to a transaction-mode handler of one message: claim \
                     mode answers `InFlight` already, and a batch waits for its markers",
                ))
            }
            "in_flight" => Ok(true),
            _ => Err(syn::Error::new(
                lit.span(),
                "`on_locked` is \"wait\" (the default: a delivery waits while another one holds \
                 the message's marker, then sees the outcome) or \"in_flight\" (it answers \
                 `InFlight` at once, and the pump redelivers later): \
                 `on_locked = \"in_flight\"`",
            )),
        }),
        None => Some(false),
    };

    let precheck = match &args.precheck {
        Some(lit) if lit.value && (args.batch.is_some() || !matches!(mode, Mode::Transaction)) => {
            errors.push(syn::Error::new(
                lit.span(),
                "`precheck` applies to a transaction-mode handler of one message: claim mode \
                 reads the row anyway, and a batch claims all its keys in one statement",
            ));
            None
        }
        Some(lit) => Some(lit.value),
        None => Some(false),
    };

    let store_result = match &args.store_result {
        Some(lit) if lit.value && args.batch.is_some() => {
            errors.push(syn::Error::new(
                lit.span(),
                "`store_result` keeps the value of one message's handler with its marker: a \
                 batch's value answers for many messages, and none of them alone",
            ));
            None
        }
        Some(lit) => Some(lit.value),
        None => Some(false),
    };

    let fingerprint = match &args.fingerprint {
        Some(expr) if args.batch.is_some() => {
            errors.push(syn::Error::new(
                expr.span(),
                "`fingerprint` is one request's: a batch's messages each have their own",
            ));
            None
        }
        other => Some(other.clone()),
    };

    // Every `None` below recorded an error; the defaults of the others are in place.
    match (errors.0, consumer, key, conn, ret) {
        (None, Some(consumer), Some(key), Some(conn), Some(ret)) => Ok(Handler {
            consumer,
            key,
            conn,
            ret,
            retries: retries.unwrap_or_default(),
            isolation: isolation.unwrap_or(Isolation::ServerDefault),
            table: table.unwrap_or_default(),
            constraint: constraint.unwrap_or_default(),
            schema: args.schema.clone(),
            busy_timeout_ms: busy_timeout_ms.flatten(),
            mode,
            batch: batch.flatten(),
            precheck: precheck.unwrap_or_default(),
            idle_in_transaction_ms: idle_in_transaction_ms.flatten(),
            in_flight_when_locked: in_flight_when_locked.unwrap_or_default(),
            store_result: store_result.unwrap_or_default(),
            fingerprint: fingerprint.flatten(),
            joins: joins.unwrap_or_default().0,
            or_own: joins.unwrap_or_default().1,
            lease_expr: args
                .lease_ms
                .clone()
                .filter(|lease| !matches!(lease, Expr::Lit(_))),
        }),
        (Some(error), ..) => Err(error),
        _ => unreachable!("every missing value recorded an error"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(expr: &str) -> Vec<String> {
        let mut out = Vec::new();
        collect_idents(expr.parse().unwrap(), &mut out);
        out.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn inline_format_arguments_are_named() {
        let names = named(r#"format!("{version_id}/{email:?}/{{literal}}/{0}/{}/{ width:>8}", n)"#);
        for name in ["format", "version_id", "email", "width", "n"] {
            assert!(names.iter().any(|n| n == name), "{name} in {names:?}");
        }
        assert!(!names.iter().any(|n| n == "literal"), "{names:?}");
        // A string outside a macro call names nothing: a constant key.
        assert_eq!(named(r#"String::from("{id}")"#), ["String", "from"]);
        // Nested calls, raw identifiers.
        let names = named(r#"key(&format!("{r#type}-{}", inner!("{id}")))"#);
        assert!(
            names.iter().any(|n| n == "r#type" || n == "type"),
            "{names:?}"
        );
        assert!(names.iter().any(|n| n == "id"), "{names:?}");
    }
}
