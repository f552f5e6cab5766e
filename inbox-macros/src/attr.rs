//! Phase 1: the attribute's arguments, as written, each kept with its tokens for spans.

use syn::parse::{Parse, ParseStream};
use syn::{Expr, Ident, LitInt, LitStr, Token};

/// The correct form, shown in errors about the attribute as a whole.
pub const USAGE: &str = "#[idempotent(consumer = \"credit\", key = msg.id)]";

/// `#[idempotent(...)]` arguments before any semantic check.
#[derive(Default)]
pub struct Args {
    pub consumer: Option<LitStr>,
    pub key: Option<Expr>,
    pub conn: Option<Ident>,
    pub retries: Option<LitInt>,
    pub isolation: Option<LitStr>,
    pub table: Option<LitStr>,
    pub constraint: Option<LitStr>,
    pub schema: Option<syn::Path>,
    pub busy_timeout_ms: Option<LitInt>,
    pub mode: Option<LitStr>,
    /// An integer literal (checked here), or an expression of type `u64` evaluated at each
    /// call (a setting; checked by the runtime before any SQL).
    pub lease_ms: Option<Expr>,
    pub on_expired: Option<LitStr>,
    pub batch: Option<Ident>,
    pub precheck: Option<syn::LitBool>,
    pub idle_in_transaction_ms: Option<LitInt>,
    pub on_locked: Option<LitStr>,
    pub store_result: Option<syn::LitBool>,
    pub fingerprint: Option<Expr>,
    pub transaction: Option<LitStr>,
}

/// Each option with the form of its value, for "unknown option" and "expected …" errors.
const OPTIONS: [(&str, &str); 19] = [
    ("consumer", "consumer = \"credit\""),
    ("key", "key = msg.id"),
    ("conn", "conn = db"),
    ("retries", "retries = 3"),
    ("isolation", "isolation = \"serializable\""),
    ("table", "table = \"inbox\""),
    ("constraint", "constraint = \"ux_inbox_message_consumer\""),
    ("schema", "schema = INBOX"),
    ("busy_timeout_ms", "busy_timeout_ms = 5000"),
    ("mode", "mode = \"claim\""),
    (
        "lease_ms",
        "lease_ms = 60000 (or an expression of type u64, such as a setting)",
    ),
    ("on_expired", "on_expired = \"report\""),
    ("batch", "batch = msgs"),
    ("precheck", "precheck = true"),
    ("idle_in_transaction_ms", "idle_in_transaction_ms = 10000"),
    ("on_locked", "on_locked = \"in_flight\""),
    ("store_result", "store_result = true"),
    ("fingerprint", "fingerprint = request.body"),
    ("transaction", "transaction = \"caller\""),
];

impl Parse for Args {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let mut args = Args::default();
        while !input.is_empty() {
            let name: Ident = input.parse().map_err(|e| {
                syn::Error::new(
                    e.span(),
                    format!("expected an option name; the correct form is `{USAGE}`"),
                )
            })?;
            let form = form_of(&name).ok_or_else(|| {
                let known: Vec<_> = OPTIONS.iter().map(|(o, _)| format!("`{o}`")).collect();
                syn::Error::new(
                    name.span(),
                    format!(
                        "unknown option `{name}`; the options are {}",
                        known.join(", ")
                    ),
                )
            })?;
            input.parse::<Token![=]>().map_err(|e| {
                syn::Error::new(e.span(), format!("expected `=` after `{name}`: `{form}`"))
            })?;
            match name.to_string().as_str() {
                "consumer" => set_once(&mut args.consumer, &name, value(input, form)?)?,
                "key" => set_once(&mut args.key, &name, value(input, form)?)?,
                "conn" => set_once(&mut args.conn, &name, parameter(input, &name, form)?)?,
                "retries" => set_once(&mut args.retries, &name, value(input, form)?)?,
                "isolation" => set_once(&mut args.isolation, &name, value(input, form)?)?,
                "table" => set_once(&mut args.table, &name, value(input, form)?)?,
                "constraint" => set_once(&mut args.constraint, &name, value(input, form)?)?,
                "schema" => set_once(&mut args.schema, &name, value(input, form)?)?,
                "busy_timeout_ms" => {
                    set_once(&mut args.busy_timeout_ms, &name, value(input, form)?)?
                }
                "mode" => set_once(&mut args.mode, &name, value(input, form)?)?,
                "lease_ms" => set_once(&mut args.lease_ms, &name, value(input, form)?)?,
                "on_expired" => set_once(&mut args.on_expired, &name, value(input, form)?)?,
                "batch" => set_once(&mut args.batch, &name, parameter(input, &name, form)?)?,
                "precheck" => set_once(&mut args.precheck, &name, value(input, form)?)?,
                "on_locked" => set_once(&mut args.on_locked, &name, value(input, form)?)?,
                "store_result" => set_once(&mut args.store_result, &name, value(input, form)?)?,
                "fingerprint" => set_once(&mut args.fingerprint, &name, value(input, form)?)?,
                "transaction" => set_once(&mut args.transaction, &name, value(input, form)?)?,
                "idle_in_transaction_ms" => {
                    set_once(&mut args.idle_in_transaction_ms, &name, value(input, form)?)?
                }
                _ => unreachable!("form_of knows every option"),
            }
            if input.is_empty() {
                break;
            }
            input.parse::<Token![,]>().map_err(|e| {
                syn::Error::new(e.span(), format!("expected `,` between options: `{USAGE}`"))
            })?;
        }
        Ok(args)
    }
}

fn form_of(name: &Ident) -> Option<&'static str> {
    OPTIONS
        .iter()
        .find(|(option, _)| name == option)
        .map(|(_, form)| *form)
}

/// Parses an option's value, saying the correct form when it has the wrong shape.
fn value<T: Parse>(input: ParseStream, form: &str) -> syn::Result<T> {
    input
        .parse()
        .map_err(|e| syn::Error::new(e.span(), format!("{e}; the correct form is `{form}`")))
}

/// Parses the name of one of the handler's parameters (`conn`, `batch`): a path into a
/// value (`conn = ctx.db_pool`) is refused with what to write instead, rather than as a
/// missing comma.
fn parameter(input: ParseStream, option: &Ident, form: &str) -> syn::Result<Ident> {
    let name: Ident = value(input, form)?;
    if input.is_empty() || input.peek(Token![,]) {
        return Ok(name);
    }
    let rest: proc_macro2::TokenStream = input.parse()?;
    let said = rest
        .clone()
        .into_iter()
        .take_while(
            |token| !matches!(token, proc_macro2::TokenTree::Punct(p) if p.as_char() == ','),
        )
        .collect::<proc_macro2::TokenStream>();
    Err(syn::Error::new_spanned(
        quote::quote!(#name #said),
        format!(
            "`{option}` names one of the handler's parameters (`{form}`), not a value inside \
             one (`{name}{said}`): take it as a parameter of its own — `pool: &PgPool`, \
             `conn: &mut PgConnection` — and pass `{name}{said}` where the handler is called",
            said = said.to_string().replace(' ', ""),
        ),
    ))
}

/// Stores an option's value; the one place that rejects an option given twice.
fn set_once<T>(slot: &mut Option<T>, name: &Ident, value: T) -> syn::Result<()> {
    if slot.is_some() {
        return Err(syn::Error::new(
            name.span(),
            format!("`{name}` is given more than once; give each option once"),
        ));
    }
    *slot = Some(value);
    Ok(())
}
