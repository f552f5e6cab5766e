//! Macro invocations: arguments that parse as expressions are visited and asked, every name
//! of the body's in a piece that does not, and `macro_rules!` transcribers defined in the body.

use super::*;

impl Guard {
    /// A macro invocation: arguments that parse as expressions are visited and asked.
    pub(super) fn visit_macro(&mut self, mac: &mut syn::Macro) {
        if is_question(mac) || is_literal_macro(mac) {
            return;
        }
        let patterns = mac
            .path
            .segments
            .last()
            .is_some_and(|s| PATTERN_MACROS.contains(&s.ident.to_string().as_str()));
        let formatting = mac
            .path
            .segments
            .last()
            .is_some_and(|s| FORMATTING_MACROS.contains(&s.ident.to_string().as_str()));
        let outer = std::mem::replace(&mut self.formatting, formatting);
        self.visit_macro_arguments(mac, patterns);
        self.formatting = outer;
    }

    pub(super) fn visit_macro_arguments(&mut self, mac: &mut syn::Macro, patterns: bool) {
        // The usual case: expressions separated by commas.
        if let Ok(mut args) = mac.parse_body_with(Punctuated::<Expr, Token![,]>::parse_terminated) {
            for (at, arg) in args.iter_mut().enumerate() {
                if patterns && at > 0 {
                    break;
                }
                self.macro_argument(arg);
            }
            mac.tokens = args.to_token_stream();
            return;
        }
        // Otherwise each piece between `,` and `;`, and each part of a piece between `=>`
        // and `=` (`target: "audit", …`, `vec![x; n]`, `r = future => { … }`), that parses
        // as an expression.
        let mut out = TokenStream::new();
        for (at, (piece, separator)) in split(mac.tokens.clone(), is_list_separator)
            .into_iter()
            .enumerate()
        {
            match patterns && at > 0 {
                // A pattern, left as written, and its guard (`n if …`), which is code.
                true => {
                    let tokens: Vec<TokenTree> = piece.into_iter().collect();
                    let guard = tokens
                        .iter()
                        .position(|t| matches!(t, TokenTree::Ident(i) if i == "if"));
                    match guard {
                        Some(at) => {
                            out.extend(tokens[..=at].iter().cloned());
                            let rest: TokenStream = tokens[at + 1..].iter().cloned().collect();
                            out.extend(self.macro_part(rest));
                        }
                        None => out.extend(tokens),
                    }
                }
                // Before a first `=` stands a pattern or a name (`Ok(v) = future => …`,
                // `field = value`): it is left as written.
                false => {
                    let parts = split(piece, is_binding_separator);
                    let pattern_first = parts
                        .first()
                        .is_some_and(|(_, separator)| separator.to_string() == "=");
                    for (at, (part, arrow)) in parts.into_iter().enumerate() {
                        match at > 0 || !pattern_first {
                            true => out.extend(self.macro_part(part)),
                            false => out.extend(part),
                        }
                        out.extend(arrow);
                    }
                }
            }
            out.extend(separator);
        }
        mac.tokens = out;
    }

    pub(super) fn macro_part(&mut self, part: TokenStream) -> TokenStream {
        match syn::parse2::<Expr>(part.clone()) {
            Ok(mut expr) => {
                self.macro_argument(&mut expr);
                expr.to_token_stream()
            }
            Err(_) => {
                if !self.formatting {
                    self.ask_names_in(part.clone());
                }
                self.rewrite_blocks(part)
            }
        }
    }

    /// A macro's piece that is not an expression, with each `{ … }` in it that parses as a
    /// block visited as the body's code: the arms of `tokio::select!` written without commas
    /// (`_ = a => { … } _ = b => { … }`).
    pub(super) fn rewrite_blocks(&mut self, tokens: TokenStream) -> TokenStream {
        tokens
            .into_iter()
            .map(|token| match token {
                TokenTree::Group(group) if group.delimiter() == Delimiter::Brace => {
                    match syn::parse2::<Block>(TokenTree::Group(group.clone()).into()) {
                        Ok(mut block) => {
                            self.visit_block_mut(&mut block);
                            block.to_token_stream()
                        }
                        Err(_) => TokenTree::Group(group).into(),
                    }
                }
                TokenTree::Group(group) => {
                    let mut inner =
                        Group::new(group.delimiter(), self.rewrite_blocks(group.stream()));
                    inner.set_span(group.span());
                    TokenTree::Group(inner).into()
                }
                other => other.into(),
            })
            .collect()
    }

    /// A macro's argument in syntax that is not an expression (`audit!(db: "x")`): every
    /// name in it that is a binding of the body, neither the transaction nor settled, is
    /// asked as a macro's argument — the macro may use it as a value, whatever surrounds it.
    /// A name after `.` (a field or a method) or before `::` or `!` is not a binding.
    pub(super) fn ask_names_in(&mut self, tokens: TokenStream) {
        let tokens: Vec<TokenTree> = tokens.into_iter().collect();
        for (at, token) in tokens.iter().enumerate() {
            match token {
                TokenTree::Group(group) => self.ask_names_in(group.stream()),
                TokenTree::Ident(name) => {
                    let after_dot = at > 0
                        && matches!(&tokens[at - 1], TokenTree::Punct(p) if p.as_char() == '.');
                    let path_or_macro = matches!(
                        tokens.get(at + 1),
                        Some(TokenTree::Punct(p)) if p.as_char() == '!'
                            || (p.as_char() == ':' && p.spacing() == Spacing::Joint)
                    );
                    if after_dot || path_or_macro || self.lookup(name).is_none() {
                        continue;
                    }
                    let mut value: Expr = syn::parse_quote_spanned!(name.span()=> #name);
                    self.hand(&mut value, Handed::InMacro);
                }
                _ => {}
            }
        }
    }

    pub(super) fn macro_argument(&mut self, arg: &mut Expr) {
        // Inside the arguments, a nested macro decides for itself.
        let formatting = std::mem::take(&mut self.formatting);
        let value = match arg {
            // `name = value`, as tracing's fields are written.
            Expr::Assign(assign) => &mut *assign.right,
            _ => arg,
        };
        self.visit_expr_mut(value);
        if !formatting {
            self.hand(value, Handed::InMacro);
        }
        self.formatting = formatting;
    }

    /// A macro called as a statement may bind the names it is given (`lease!(c);` expanding
    /// to `let mut c = pool.get()?;`, or `lease!((c) = pool)` to a pattern): a name of the
    /// transaction given to a macro that is not one of the standard library's, bare or inside
    /// brackets, is no longer taken for the transaction after it.
    pub(super) fn rebound_by(&mut self, mac: &syn::Macro) {
        let name = mac.path.segments.last().map(|s| s.ident.to_string());
        if name.is_some_and(|n| {
            STANDARD_MACROS.contains(&n.as_str()) || FORMATTING_MACROS.contains(&n.as_str())
        }) {
            return;
        }
        self.rebound_in(mac.tokens.clone());
    }

    pub(super) fn rebound_in(&mut self, tokens: TokenStream) {
        for token in tokens {
            match token {
                TokenTree::Ident(ident)
                    if self
                        .lookup(&ident)
                        .is_some_and(|(_, b)| b.origin != Origin::Unknown) =>
                {
                    self.bind(ident, Origin::Unknown);
                }
                TokenTree::Group(group) => self.rebound_in(group.stream()),
                _ => {}
            }
        }
    }
}

impl Guard {
    /// The rules of a `macro_rules!` defined in the body, each transcriber rewritten like the
    /// body, its metavariables standing for whatever the caller passes. A transcriber with a
    /// repetition (`$(…)*`) does not parse as Rust and is left as written (see the limits on
    /// `idempotent`).
    pub(super) fn macro_rules(&mut self, rules: TokenStream) -> TokenStream {
        let mut out = Vec::new();
        let mut after_arrow = false;
        for token in rules {
            match token {
                TokenTree::Group(group) if after_arrow => {
                    after_arrow = false;
                    let mut rewritten = Group::new(
                        group.delimiter(),
                        self.transcriber(group.stream())
                            .unwrap_or_else(|| group.stream()),
                    );
                    rewritten.set_span(group.span());
                    out.push(TokenTree::Group(rewritten));
                }
                TokenTree::Punct(ref punct) if punct.as_char() == '>' => {
                    after_arrow =
                        matches!(out.last(), Some(TokenTree::Punct(p)) if p.as_char() == '=');
                    out.push(token);
                }
                token => out.push(token),
            }
        }
        out.into_iter().collect()
    }

    pub(super) fn transcriber(&mut self, tokens: TokenStream) -> Option<TokenStream> {
        let mut metavariables = Vec::new();
        let tokens = to_placeholders(tokens, &mut metavariables)?;
        let mut block: Block = syn::parse2(quote!({ #tokens })).ok()?;
        let depth = self.scope.len();
        for name in &metavariables {
            self.bind(name.clone(), Origin::Metavariable);
        }
        let before = block.stmts.len();
        let single_expression = matches!(block.stmts.as_slice(), [Stmt::Expr(_, None)]);
        self.visit_block_mut(&mut block);
        self.scope.truncate(depth);
        let stmts = &block.stmts;
        // Questions placed before an expression would end it: keep it one expression.
        let rewritten = match single_expression && stmts.len() > before {
            true => quote!({ #(#stmts)* }),
            false => quote!(#(#stmts)*),
        };
        Some(from_placeholders(rewritten))
    }
}

/// Splits tokens at the top-level separators `is_separator` recognises; each piece comes with
/// the separator tokens that ended it.
pub(super) fn split(
    tokens: TokenStream,
    is_separator: fn(&[TokenTree], usize) -> usize,
) -> Vec<(TokenStream, TokenStream)> {
    let tokens: Vec<TokenTree> = tokens.into_iter().collect();
    let mut pieces = Vec::new();
    let mut piece = TokenStream::new();
    let mut at = 0;
    while at < tokens.len() {
        match is_separator(&tokens, at) {
            0 => {
                piece.extend([tokens[at].clone()]);
                at += 1;
            }
            width => {
                let separator: TokenStream = tokens[at..at + width].iter().cloned().collect();
                pieces.push((std::mem::take(&mut piece), separator));
                at += width;
            }
        }
    }
    pieces.push((piece, TokenStream::new()));
    pieces
}

/// `,` and `;`.
pub(super) fn is_list_separator(tokens: &[TokenTree], at: usize) -> usize {
    usize::from(
        matches!(&tokens[at], TokenTree::Punct(p) if p.as_char() == ',' || p.as_char() == ';'),
    )
}

/// `=>`, and an `=` that is not part of `==`, `<=`, `>=`, `!=` or the like.
pub(super) fn is_binding_separator(tokens: &[TokenTree], at: usize) -> usize {
    let punct = |at: usize| match tokens.get(at) {
        Some(TokenTree::Punct(p)) => Some(p),
        _ => None,
    };
    let Some(p) = punct(at).filter(|p| p.as_char() == '=') else {
        return 0;
    };
    let joined_before = at > 0 && punct(at - 1).is_some_and(|q| q.spacing() == Spacing::Joint);
    match p.spacing() {
        Spacing::Joint if punct(at + 1).is_some_and(|q| q.as_char() == '>') => 2,
        Spacing::Alone if !joined_before => 1,
        _ => 0,
    }
}

/// The prefix that stands for `$` in a transcriber while it is parsed as Rust.
pub(super) const METAVARIABLE: &str = "__inbox_metavariable_";

/// `$name` → `__inbox_metavariable_name`; `None` for a repetition, which does not parse.
pub(super) fn to_placeholders(tokens: TokenStream, names: &mut Vec<Ident>) -> Option<TokenStream> {
    let mut out = Vec::new();
    let mut tokens = tokens.into_iter().peekable();
    while let Some(token) = tokens.next() {
        match token {
            TokenTree::Punct(punct) if punct.as_char() == '$' => match tokens.next() {
                Some(TokenTree::Ident(name)) => {
                    let placeholder = Ident::new(&format!("{METAVARIABLE}{name}"), name.span());
                    names.push(placeholder.clone());
                    out.push(TokenTree::Ident(placeholder));
                }
                _ => return None,
            },
            TokenTree::Group(group) => {
                let mut inner =
                    Group::new(group.delimiter(), to_placeholders(group.stream(), names)?);
                inner.set_span(group.span());
                out.push(TokenTree::Group(inner));
            }
            token => out.push(token),
        }
    }
    Some(out.into_iter().collect())
}

/// `__inbox_metavariable_name` → `$name`.
pub(super) fn from_placeholders(tokens: TokenStream) -> TokenStream {
    let mut out = Vec::new();
    for token in tokens {
        match token {
            TokenTree::Ident(ident) => match ident.to_string().strip_prefix(METAVARIABLE) {
                Some(name) => {
                    let mut dollar = proc_macro2::Punct::new('$', proc_macro2::Spacing::Alone);
                    dollar.set_span(ident.span());
                    out.push(TokenTree::Punct(dollar));
                    out.push(TokenTree::Ident(Ident::new(name, ident.span())));
                }
                None => out.push(TokenTree::Ident(ident)),
            },
            TokenTree::Group(group) => {
                let mut inner = Group::new(group.delimiter(), from_placeholders(group.stream()));
                inner.set_span(group.span());
                out.push(TokenTree::Group(inner));
            }
            token => out.push(token),
        }
    }
    out.into_iter().collect()
}

/// The span of an expression's first token and of its last, so that a question about it is
/// reported over the whole of it.
pub(super) fn spans(tokens: &dyn ToTokens) -> (Span, Span) {
    let tokens: Vec<TokenTree> = tokens.to_token_stream().into_iter().collect();
    let first = tokens.first().map_or_else(Span::call_site, TokenTree::span);
    let last = match tokens.last() {
        Some(TokenTree::Group(group)) => group.span_close(),
        Some(token) => token.span(),
        None => first,
    };
    (first, last)
}

/// One of the questions this module writes.
pub(super) fn is_question(mac: &syn::Macro) -> bool {
    let segments: Vec<String> = mac
        .path
        .segments
        .iter()
        .map(|s| s.ident.to_string())
        .collect();
    segments.len() == 3
        && segments[0] == "inbox_diesel"
        && segments[1] == "__private"
        && (segments[2].starts_with("vet") || segments[2] == "no_connection")
}
