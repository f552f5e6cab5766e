//! Each option's value checked on its own: how the handler joins a transaction, its lease and
//! mode, its consumer, its isolation level.

use super::*;

/// `transaction = "own" | "caller" | "caller_or_own"`: whether the handler joins the
/// caller's transaction, and whether it runs in one of its own where the caller has none.
/// With `"caller"` or `"caller_or_own"`, every option that would need a transaction of the
/// handler's own is refused, each at its token, saying why.
pub(super) fn joins(lit: &LitStr, args: &Args, mode: Mode) -> syn::Result<(bool, bool)> {
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
pub(super) fn milliseconds(lit: Option<&syn::LitInt>, usage: &str) -> syn::Result<Option<u32>> {
    let Some(lit) = lit else { return Ok(None) };
    lit.base10_parse::<u32>()
        .ok()
        .filter(|ms| *ms <= i32::MAX as u32)
        .map(Some)
        .ok_or_else(|| syn::Error::new(lit.span(), usage))
}

/// `mode`, and the options that belong to one mode only.
pub(super) fn mode(args: &Args) -> syn::Result<Mode> {
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

pub(super) fn missing(option: &str) -> syn::Error {
    syn::Error::new(
        Span::call_site(),
        format!("#[idempotent] needs `{option}`; the correct form is `{USAGE}`"),
    )
}

pub(super) fn consumer(lit: &LitStr) -> syn::Result<String> {
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

pub(super) fn isolation(lit: &LitStr) -> syn::Result<Isolation> {
    Isolation::from_name(&lit.value()).ok_or_else(|| {
        syn::Error::new(
            lit.span(),
            "`isolation` is one of \"read committed\", \"repeatable read\", \"serializable\": \
             `isolation = \"serializable\"`",
        )
    })
}
