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

/// `transaction = "own" | "caller" | "caller_or_own"`: whether the handler joins the
/// caller's transaction, and whether it runs in one of its own where the caller has none.
/// With `"caller"` or `"caller_or_own"`, every option that would need a transaction of the
/// handler's own is refused, each at its token, saying why.
fn joins(lit: &LitStr, args: &Args, mode: Mode) -> syn::Result<(bool, bool)> {
    let or_own = match lit.value().as_str() {
        "own" => return Ok((false, false)),
        "caller" => false,
        "caller_or_own" => true,
        _ => {
            return Err(syn::Error::new(
                lit.span(),
                "`transaction` is \"own\" (the default: the handler begins and commits a \
                 transaction of its own), \"caller\" (the marker and the body join the \
                 transaction the caller opened, and commit with it) or \"caller_or_own\" \
                 (the caller's where one is open, its own where none is): \
                 `transaction = \"caller\"`",
            ));
        }
    };
    let own = match or_own {
        false => "with `transaction = \"caller\"` the handler joins the caller's transaction",
        true => {
            "with `transaction = \"caller_or_own\"` the handler joins the caller's \
             transaction where one is open"
        }
    };
    let refused: [(Option<Span>, &str); 8] = [
        (
            args.mode
                .as_ref()
                .filter(|_| matches!(mode, Mode::Claim { .. }))
                .map(LitStr::span),
            "claim mode commits its claim on its own before the side effect, and its stamp \
             after it: neither can wait for the caller's commit",
        ),
        (
            args.batch.as_ref().map(Ident::span),
            "a batch claims its keys in a transaction of its own; call a handler per message \
             inside the caller's transaction",
        ),
        (
            args.retries.as_ref().map(Spanned::span),
            "a deadlock or a serialization failure ends or dooms the caller's whole \
             transaction, which only the caller can run again: nothing is retried inside it",
        ),
        (
            args.isolation.as_ref().map(LitStr::span),
            "the caller's transaction has its isolation level from its `BEGIN`",
        ),
        (
            args.precheck
                .as_ref()
                .filter(|lit| lit.value)
                .map(Spanned::span),
            "the marker's insert in the caller's transaction is the check",
        ),
        (
            args.idle_in_transaction_ms.as_ref().map(Spanned::span),
            "the caller's transaction is the caller's to bound",
        ),
        (
            args.on_locked.as_ref().map(LitStr::span),
            "the caller's transaction waits for locks as the caller set it to",
        ),
        (
            args.busy_timeout_ms.as_ref().map(Spanned::span),
            "the caller's SQLite transaction waits as its connection is set to",
        ),
    ];
    let mut errors = Errors::default();
    for (span, why) in refused {
        if let Some(span) = span {
            errors.push(syn::Error::new(span, format!("{own}: {why}")));
        }
    }
    match errors.0 {
        Some(error) => Err(error),
        None => Ok((true, or_own)),
    }
}

/// A duration in milliseconds that a server takes as a 32-bit signed integer; `None` when the
/// option is not given.
fn milliseconds(lit: Option<&syn::LitInt>, usage: &str) -> syn::Result<Option<u32>> {
    let Some(lit) = lit else { return Ok(None) };
    lit.base10_parse::<u32>()
        .ok()
        .filter(|ms| *ms <= i32::MAX as u32)
        .map(Some)
        .ok_or_else(|| syn::Error::new(lit.span(), usage))
}

/// `mode`, and the options that belong to one mode only.
fn mode(args: &Args) -> syn::Result<Mode> {
    let claim = match &args.mode {
        None => false,
        Some(lit) => match lit.value().as_str() {
            "transaction" => false,
            "claim" => true,
            _ => {
                return Err(syn::Error::new(
                    lit.span(),
                    "`mode` is \"transaction\" (the default: the body's writes commit with the \
                     marker) or \"claim\" (for a side effect outside the database: claim, run, \
                     stamp): `mode = \"claim\"`",
                ));
            }
        },
    };
    let mut errors = Errors::default();
    if claim {
        if let Some(lit) = &args.isolation {
            errors.push(syn::Error::new(
                lit.span(),
                "`isolation` sets the level of the handler's transaction, and a claim-mode body \
                 runs outside any transaction; remove `isolation`, or use `mode = \"transaction\"`",
            ));
        }
    } else {
        let only_claim = [
            args.lease_ms.as_ref().map(|l| ("lease_ms", l.span())),
            args.on_expired.as_ref().map(|l| ("on_expired", l.span())),
        ];
        for (option, span) in only_claim.into_iter().flatten() {
            errors.push(syn::Error::new(
                span,
                format!(
                    "`{option}` applies to claim mode, where a claim outlives its transaction; \
                     add `mode = \"claim\"`, or remove `{option}`"
                ),
            ));
        }
    }
    // A literal is checked here; another expression is the application's setting, evaluated
    // at each call and checked by the runtime before any SQL.
    let lease_ms = match &args.lease_ms {
        Some(Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Int(lit),
            ..
        })) => errors.take(
            lit.base10_parse::<u64>()
                .ok()
                .filter(|ms| (MIN_LEASE_MS..=MAX_LEASE_MS).contains(ms))
                .map(Some)
                .ok_or_else(|| {
                    syn::Error::new(
                        lit.span(),
                        "`lease_ms` is how long a claim stays live, in milliseconds, above the \
                         body's longest run, from 100 (a claim whose insert takes more than a \
                         quarter of its lease is given back and taken again, so a shorter lease \
                         would never start the body) to 2592000000 (30 days; a longer lease \
                         would overflow the servers' timestamp arithmetic, and an overflowed \
                         lease reads as released): `lease_ms = 60000`",
                    )
                }),
        ),
        Some(Expr::Lit(other)) => {
            errors.push(syn::Error::new(
                other.span(),
                "`lease_ms` is an integer number of milliseconds (or an expression of type \
                 u64, such as a setting): `lease_ms = 60000`",
            ));
            None
        }
        Some(_) | None => Some(None),
    };
    let report = match &args.on_expired {
        Some(lit) => errors.take(match lit.value().as_str() {
            "take_over" => Ok(false),
            "report" => Ok(true),
            _ => Err(syn::Error::new(
                lit.span(),
                "`on_expired` is \"take_over\" (the next delivery runs the side effect again) \
                 or \"report\" (it returns `StaleClaim` for reconciliation): \
                 `on_expired = \"report\"`",
            )),
        }),
        None => Some(false),
    };
    match errors.0 {
        Some(error) => Err(error),
        None if claim => Ok(Mode::Claim {
            lease_ms: lease_ms.flatten(),
            report: report.unwrap_or_default(),
        }),
        None => Ok(Mode::Transaction),
    }
}

fn missing(option: &str) -> syn::Error {
    syn::Error::new(
        Span::call_site(),
        format!("#[idempotent] needs `{option}`; the correct form is `{USAGE}`"),
    )
}

fn consumer(lit: &LitStr) -> syn::Result<String> {
    let name = lit.value();
    Consumer::validate(&name).map(|()| name).map_err(|e| {
        let rule = match e {
            ConsumerError::Empty => "it is empty".to_owned(),
            ConsumerError::TooLong { len, max } => {
                format!("it is {len} bytes long and the limit is {max}")
            }
            ConsumerError::ControlCharacter { .. } => "it contains a control character".to_owned(),
            ConsumerError::SurroundingWhitespace => "it starts or ends with whitespace, which \
                MySQL and MariaDB ignore when they compare names, so `credit` and `credit ` \
                would share markers there"
                .to_owned(),
            _ => e.to_string(),
        };
        syn::Error::new(
            lit.span(),
            format!(
                "`consumer` names the handler in the inbox, and {rule}; use a short, stable, \
                 printable name: `consumer = \"credit\"`"
            ),
        )
    })
}

fn isolation(lit: &LitStr) -> syn::Result<Isolation> {
    Isolation::from_name(&lit.value()).ok_or_else(|| {
        syn::Error::new(
            lit.span(),
            "`isolation` is one of \"read committed\", \"repeatable read\", \"serializable\": \
             `isolation = \"serializable\"`",
        )
    })
}

/// The names the handler's parameters bind (`self` included).
fn parameter_names(item: &ItemFn) -> Vec<Ident> {
    let mut names = Vec::new();
    for input in &item.sig.inputs {
        match input {
            FnArg::Receiver(receiver) => names.push(Ident::new("self", receiver.span())),
            FnArg::Typed(typed) => collect_idents(typed.pat.to_token_stream(), &mut names),
        }
    }
    names
}

/// The identifiers an expression names: its own, and the inline arguments of the format
/// strings of the macros it calls (`format!("{id}/{email}")` names `id` and `email`).
fn collect_idents(tokens: TokenStream, out: &mut Vec<Ident>) {
    // `name !` just before: a group is that macro's arguments.
    let (mut ident_before, mut bang_before) = (false, false);
    for token in tokens {
        let (ident, bang) = match token {
            TokenTree::Ident(ident) => {
                out.push(ident);
                (true, false)
            }
            TokenTree::Punct(punct) if punct.as_char() == '!' => (false, ident_before),
            TokenTree::Group(group) => {
                if bang_before {
                    format_arguments(group.stream(), out);
                }
                collect_idents(group.stream(), out);
                (false, false)
            }
            _ => (false, false),
        };
        (ident_before, bang_before) = (ident, bang);
    }
}

/// The inline arguments named in the string literals among a macro call's arguments:
/// `{name}`, `{name:?}`, `{name:>8}`; `{{` is a brace, `{0}` and `{}` name nothing.
fn format_arguments(tokens: TokenStream, out: &mut Vec<Ident>) {
    for token in tokens {
        let TokenTree::Literal(literal) = token else {
            continue;
        };
        let span = literal.span();
        let Ok(text) = syn::parse2::<syn::LitStr>(TokenTree::Literal(literal).into()) else {
            continue;
        };
        let text = text.value();
        let mut rest = text.as_str();
        while let Some(open) = rest.find('{') {
            rest = &rest[open + 1..];
            if let Some(after) = rest.strip_prefix('{') {
                rest = after;
                continue;
            }
            let end = rest.find(['}', ':']).unwrap_or(rest.len());
            if let Ok(mut ident) = syn::parse_str::<Ident>(rest[..end].trim()) {
                ident.set_span(span);
                out.push(ident);
            }
            rest = &rest[end..];
        }
    }
}

/// `batch = msgs` names a parameter: the messages, as a slice, a `Vec` or a reference to one.
fn batch_parameter(batch: &Ident, item: &ItemFn, mode: Mode) -> syn::Result<Ident> {
    if matches!(mode, Mode::Claim { .. }) {
        return Err(syn::Error::new(
            batch.span(),
            "`batch` applies to transaction mode, where one transaction claims the whole \
             batch; a claim-mode handler takes one message",
        ));
    }
    if parameter_names(item).contains(batch) {
        return Ok(batch.clone());
    }
    Err(syn::Error::new(
        batch.span(),
        format!(
            "`batch` names the parameter holding the messages (`msgs: &[Msg]`), and the \
             function has no parameter `{batch}`: `batch = msgs`"
        ),
    ))
}

/// With `batch`, `key` is a closure from one message to its key, and uses its message.
fn key_closure(key: Expr) -> syn::Result<Expr> {
    let usage = "with `batch`, `key` is a closure from one message of the batch to its key: \
                 `key = |msg| msg.id`";
    let Expr::Closure(closure) = &key else {
        return Err(syn::Error::new_spanned(&key, usage));
    };
    if closure.inputs.len() != 1 {
        return Err(syn::Error::new_spanned(&closure.inputs, usage));
    }
    let mut params = Vec::new();
    collect_idents(closure.inputs.to_token_stream(), &mut params);
    let mut used = Vec::new();
    collect_idents(closure.body.to_token_stream(), &mut used);
    if !used.iter().any(|ident| params.contains(ident)) {
        return Err(syn::Error::new_spanned(
            &closure.body,
            "`key` must be computed from its message, e.g. `key = |msg| msg.id`; this one gives \
             every message of the batch the same key, so all but the first would be dropped \
             as duplicates",
        ));
    }
    Ok(key)
}

/// A key computed from no parameter is the same for every message: every delivery after the
/// first would be dropped as a duplicate.
fn key_uses_a_parameter(key: Expr, item: &ItemFn) -> syn::Result<Expr> {
    let params = parameter_names(item);
    let mut used = Vec::new();
    collect_idents(key.to_token_stream(), &mut used);
    if used.iter().any(|ident| params.contains(ident)) {
        return Ok(key);
    }
    Err(syn::Error::new_spanned(
        &key,
        format!(
            "`key` must be computed from the handler's parameters, e.g. `key = msg.id`; `{}` \
             uses none of them, so every message would share one key and all but the first \
             would be dropped as duplicates",
            key.to_token_stream()
        ),
    ))
}

/// The parameter that carries the transaction: named with `conn = …`, or the one parameter of
/// type `&mut …Connection`. In claim mode a pool may carry the claim and the stamp instead:
/// a parameter of type `&…Pool<…>` when no connection is there, or any `&` one named.
fn connection(named: Option<&Ident>, item: &ItemFn, claim: bool) -> syn::Result<Ident> {
    let typed = item.sig.inputs.iter().filter_map(|input| match input {
        FnArg::Typed(typed) => match &*typed.pat {
            Pat::Ident(pat) if pat.subpat.is_none() => Some((&pat.ident, &*typed.ty)),
            _ => None,
        },
        FnArg::Receiver(_) => None,
    });
    if let Some(named) = named {
        let Some((ident, ty)) = typed.clone().find(|(ident, _)| *ident == named) else {
            return Err(syn::Error::new(
                named.span(),
                format!(
                    "`conn = {named}` names no parameter of this function; name the `&mut` connection parameter"
                ),
            ));
        };
        return match peel(ty) {
            Type::Reference(reference) if reference.mutability.is_some() || claim => {
                Ok(ident.clone())
            }
            _ => Err(syn::Error::new_spanned(
                ty,
                format!(
                    "the connection parameter `{named}` must be a `&mut` reference to a connection, e.g. `{named}: &mut PgConnection`"
                ),
            )),
        };
    }
    let mut candidates: Vec<&Ident> = typed
        .clone()
        .filter(|(_, ty)| is_connection_ref(ty, true))
        .map(|(ident, _)| ident)
        .collect();
    let pools: Vec<&Ident> = typed
        .clone()
        .filter(|(_, ty)| is_pool_ref(ty))
        .map(|(ident, _)| ident)
        .collect();
    if candidates.is_empty() && claim {
        // Claim mode on a pool: the claim and the stamp each check a connection out.
        if let [pool] = pools.as_slice() {
            return Ok((*pool).clone());
        }
    }
    if candidates.is_empty() {
        // No type is named like a connection (an alias such as `type Db = …` hides it): the
        // one `&mut` parameter of a named type is the connection.
        let mutable: Vec<&Ident> = typed
            .filter(|(_, ty)| is_connection_ref(ty, false))
            .map(|(ident, _)| ident)
            .collect();
        if let [conn] = mutable.as_slice() {
            candidates.push(conn);
        } else if mutable.len() > 1 {
            return Err(syn::Error::new(
                mutable[1].span(),
                format!(
                    "cannot tell which of the `&mut` parameters ({}) is the connection; name it: \
                     `conn = {}`",
                    mutable
                        .iter()
                        .map(|c| format!("`{c}`"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    mutable[0]
                ),
            ));
        }
    }
    match candidates.as_slice() {
        [conn] => Ok((*conn).clone()),
        [] if !claim && !pools.is_empty() => Err(syn::Error::new(
            pools[0].span(),
            format!(
                "a pool carries a handler's markers in claim mode only (`mode = \"claim\"`, \
                 where the claim and the stamp each check a connection out and the side \
                 effect holds none); a transaction-mode body runs in one transaction on one \
                 connection: take `conn: &mut PgConnection` and pass `&mut {}.get()?`",
                pools[0]
            ),
        )),
        [] => Err(syn::Error::new(
            item.sig.paren_token.span.join(),
            "an #[idempotent] handler needs its connection as a parameter, e.g. \
             `conn: &mut PgConnection` (in claim mode, or a pool: `pool: &Pool<…>`); if it \
             has another type, name it: `conn = db`",
        )),
        // Several parameters are named like connections (a Redis or AMQP client can be):
        // the first is taken, and the compiler says so if it is not a diesel connection.
        [first, ..] => Ok((*first).clone()),
    }
}

/// `&mut PgConnection`, `&mut SqliteConnection`, `&mut diesel::PgConnection`,
/// `&mut PooledConnection<…>`, `&mut SyncConnectionWrapper<…>`, …
///
/// With `by_name` false, any `&mut` of a named type.
fn is_connection_ref(ty: &Type, by_name: bool) -> bool {
    let Type::Reference(reference) = peel(ty) else {
        return false;
    };
    if reference.mutability.is_none() {
        return false;
    }
    let Type::Path(path) = peel(&reference.elem) else {
        return false;
    };
    path.path.segments.last().is_some_and(|segment| {
        let name = segment.ident.to_string();
        !by_name || name.ends_with("Connection") || name == "SyncConnectionWrapper"
    })
}

/// `&Pool<…>`, `&bb8::Pool<…>`, `&GuardedPool<…>`, `&PgPool`: a shared reference to a type
/// whose name ends in `Pool`.
fn is_pool_ref(ty: &Type) -> bool {
    let Type::Reference(reference) = peel(ty) else {
        return false;
    };
    if reference.mutability.is_some() {
        return false;
    }
    let Type::Path(path) = peel(&reference.elem) else {
        return false;
    };
    path.path
        .segments
        .last()
        .is_some_and(|segment| segment.ident.to_string().ends_with("Pool"))
}

/// A type as written, without the invisible groups of a `macro_rules!` `$t:ty` or parentheses.
fn peel(ty: &Type) -> &Type {
    match ty {
        Type::Group(group) => peel(&group.elem),
        Type::Paren(paren) => peel(&paren.elem),
        _ => ty,
    }
}

/// The declared return type must be a `Result` whose first argument is the body's value.
fn return_type(item: &ItemFn) -> syn::Result<Type> {
    let not_a_result = |at: &dyn ToTokens| {
        syn::Error::new_spanned(
            at,
            "an #[idempotent] handler must return a `Result`, e.g. `-> Result<Receipt, AppError>` \
             or `-> QueryResult<Receipt>`; it then returns `Result<Outcome<Receipt>, AppError>` \
             (the outcome type of its mode in place of `Receipt`)",
        )
    };
    let ReturnType::Type(_, ty) = &item.sig.output else {
        return Err(not_a_result(&item.sig.ident));
    };
    let Type::Path(path) = peel(ty) else {
        return Err(not_a_result(ty));
    };
    let Some(last) = path.path.segments.last() else {
        return Err(not_a_result(ty));
    };
    let has_value_type = matches!(
        &last.arguments,
        PathArguments::AngleBracketed(args) if matches!(args.args.first(), Some(GenericArgument::Type(_)))
    );
    // An alias that names no value type (`type EmptyResult = ApiResult<()>`) is read
    // through the compiler: one that is not a `Result` fails there, with this message.
    let alias = matches!(last.arguments, PathArguments::None);
    if path.qself.is_some()
        || !(alias || last.ident.to_string().ends_with("Result") && has_value_type)
    {
        return Err(not_a_result(ty));
    }
    Ok(peel(ty).clone())
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
