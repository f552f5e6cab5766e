//! The options checked against the function: the names the key uses, the batch parameter,
//! the connection parameter and its type, the return type.

use super::*;

/// The names the handler's parameters bind (`self` included).
pub(super) fn parameter_names(item: &ItemFn) -> Vec<Ident> {
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
pub(super) fn collect_idents(tokens: TokenStream, out: &mut Vec<Ident>) {
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
pub(super) fn format_arguments(tokens: TokenStream, out: &mut Vec<Ident>) {
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
pub(super) fn batch_parameter(batch: &Ident, item: &ItemFn, mode: Mode) -> syn::Result<Ident> {
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
pub(super) fn key_closure(key: Expr) -> syn::Result<Expr> {
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
pub(super) fn key_uses_a_parameter(key: Expr, item: &ItemFn) -> syn::Result<Expr> {
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
pub(super) fn connection(named: Option<&Ident>, item: &ItemFn, claim: bool) -> syn::Result<Ident> {
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
pub(super) fn is_connection_ref(ty: &Type, by_name: bool) -> bool {
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
pub(super) fn is_pool_ref(ty: &Type) -> bool {
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
pub(super) fn peel(ty: &Type) -> &Type {
    match ty {
        Type::Group(group) => peel(&group.elem),
        Type::Paren(paren) => peel(&paren.elem),
        _ => ty,
    }
}

/// The declared return type must be a `Result` whose first argument is the body's value.
pub(super) fn return_type(item: &ItemFn) -> syn::Result<Type> {
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
