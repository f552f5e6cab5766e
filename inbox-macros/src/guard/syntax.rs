//! What the guard reads off the syntax alone: places, patterns, closures, literals and
//! paths.

use super::*;

/// Whether `name` is assigned whole, borrowed mutably whole or used as a method's receiver (so
/// possibly auto-borrowed mutably: `o.replace(…)`, `o.insert(…)`) in `rest`, or handed to a
/// macro, which may do any of these.
pub(super) fn replaced_whole(name: &Ident, rest: &[Stmt]) -> bool {
    struct Replaced<'n> {
        name: &'n Ident,
        found: bool,
    }
    impl Replaced<'_> {
        fn is_name(&self, expr: &Expr) -> bool {
            match expr {
                Expr::Paren(e) => self.is_name(&e.expr),
                Expr::Path(path) => path.path.is_ident(self.name),
                _ => false,
            }
        }
    }
    impl<'ast> Visit<'ast> for Replaced<'_> {
        fn visit_expr(&mut self, expr: &'ast Expr) {
            self.found |= match expr {
                Expr::Assign(assign) => self.is_name(&assign.left),
                Expr::Reference(reference) => {
                    reference.mutability.is_some() && self.is_name(&reference.expr)
                }
                // What the standard wrappers give back does not replace them (`take` leaves
                // `None`, which holds no connection).
                Expr::MethodCall(call) => {
                    self.is_name(&call.receiver)
                        && !ACCESSORS.contains(&call.method.to_string().as_str())
                }
                _ => false,
            };
            syn::visit::visit_expr(self, expr);
        }
        fn visit_macro(&mut self, mac: &'ast syn::Macro) {
            self.found |= mac.tokens.clone().into_iter().any(|t| match t {
                TokenTree::Ident(ident) => ident == *self.name,
                _ => false,
            });
        }
    }
    let mut replaced = Replaced { name, found: false };
    for stmt in rest {
        replaced.visit_stmt(stmt);
    }
    replaced.found
}

/// Where a value that comes from one of two places comes from: the same place, or unknown.
pub(super) fn same(a: Origin, b: Origin) -> Origin {
    match a == b {
        true => a,
        false => Origin::Unknown,
    }
}

/// A name written as statics and constants are: `POOL`, `AUDIT_DB`.
pub(super) fn is_screaming(name: &Ident) -> bool {
    let name = name.to_string();
    name.chars().any(|c| c.is_uppercase()) && !name.chars().any(|c| c.is_lowercase())
}

/// `query.load(conn)`, `get_result`, `get_results`, `first`: one argument, a connection.
pub(super) fn is_read(call: &ExprMethodCall) -> bool {
    call.args.len() == 1 && READ_METHODS.contains(&call.method.to_string().as_str())
}

/// The read `call` (or `call.await`), its query's type bound to `query` for the question
/// about its connection: `match query_type(&q) { query => q.load(…) }` when the receiver
/// is a place, which is borrowed for nothing but its type, and `match receiver { r => match
/// query_type(&r) { query => r.load(…) } }` when it is a value, evaluated first as before.
pub(super) fn bind_query_type(mut call: Expr, query: Ident) -> Expr {
    let receiver = match &mut call {
        Expr::MethodCall(call) => &mut call.receiver,
        Expr::Await(awaited) => match &mut *awaited.base {
            Expr::MethodCall(call) => &mut call.receiver,
            _ => unreachable!("a read is a method call"),
        },
        _ => unreachable!("a read is a method call"),
    };
    match place(receiver) {
        Place::Simple => syn::parse_quote! {
            match ::inbox_diesel::__private::guard::query_type(&#receiver) {
                #query => #call,
            }
        },
        _ => {
            let value = Ident::new("__inbox_receiver", Span::mixed_site());
            let original = std::mem::replace(&mut **receiver, syn::parse_quote!(#value));
            syn::parse_quote! {
                match #original {
                    #value => match ::inbox_diesel::__private::guard::query_type(&#value) {
                        #query => #call,
                    },
                }
            }
        }
    }
}

/// The names a closure or an `async` block mentions and does not bind itself: what it may
/// capture. A name it also binds somewhere inside is left out.
pub(super) fn captured_names(expr: &Expr) -> Vec<Ident> {
    struct Names {
        used: Vec<Ident>,
        bound: Vec<Ident>,
    }
    impl<'ast> Visit<'ast> for Names {
        fn visit_expr_path(&mut self, path: &'ast syn::ExprPath) {
            if path.qself.is_none()
                && let Some(name) = path.path.get_ident()
            {
                self.used.push(name.clone());
            }
            syn::visit::visit_expr_path(self, path);
        }
        fn visit_pat_ident(&mut self, pat: &'ast syn::PatIdent) {
            self.bound.push(pat.ident.clone());
            syn::visit::visit_pat_ident(self, pat);
        }
        fn visit_macro(&mut self, mac: &'ast syn::Macro) {
            fn idents(tokens: TokenStream, out: &mut Vec<Ident>) {
                for token in tokens {
                    match token {
                        TokenTree::Ident(name) => out.push(name),
                        TokenTree::Group(group) => idents(group.stream(), out),
                        _ => {}
                    }
                }
            }
            idents(mac.tokens.clone(), &mut self.used);
        }
        fn visit_item(&mut self, _: &'ast syn::Item) {}
    }
    let mut names = Names {
        used: Vec::new(),
        bound: Vec::new(),
    };
    names.visit_expr(expr);
    let mut captured: Vec<Ident> = Vec::new();
    for name in names.used {
        if !names.bound.contains(&name) && !captured.contains(&name) {
            captured.push(name);
        }
    }
    captured
}

/// Whether a type names a trait object (`&mut dyn Store`, `Box<dyn Any>`), to which a
/// connection coerces out of sight.
pub(super) fn mentions_trait_object(ty: &syn::Type) -> bool {
    fn tokens(stream: TokenStream) -> bool {
        stream.into_iter().any(|token| match token {
            TokenTree::Ident(name) => name == "dyn",
            TokenTree::Group(group) => tokens(group.stream()),
            _ => false,
        })
    }
    tokens(ty.to_token_stream())
}

pub(super) fn is_lower_case(name: &Ident) -> bool {
    name.to_string()
        .chars()
        .find(|c| *c != '_')
        .is_some_and(|c| c.is_lowercase())
}

/// `Some`, `Ok`, `Err`: the standard library's, whatever they wrap.
pub(super) fn is_std_variant(func: &Expr) -> bool {
    matches!(func, Expr::Path(path) if path.path.get_ident().is_some_and(|name| name == "Some" || name == "Ok" || name == "Err"))
}

/// `Some`, `Ok`, `Err`, and a tuple struct's or variant's constructor named in upper case
/// (`Tx(conn)`): the value they wrap is the value a pattern of them takes apart.
pub(super) fn is_variant_constructor(func: &Expr) -> bool {
    matches!(func, Expr::Path(path) if path.qself.is_none() && path.path.get_ident().is_some_and(|name| !is_lower_case(name)))
}

/// The standard library's cells, locks and pointers, made with `new` (`RefCell::new(conn)`):
/// a value that holds the value it is given, and gives it back through [`ACCESSORS`].
pub(super) const WRAPPERS: [&str; 8] = [
    "Box", "Rc", "Arc", "Cell", "RefCell", "Mutex", "RwLock", "OnceCell",
];

/// Methods of the standard library's wrappers, `Option` and `Result` that give back (a guard
/// of, a reference to) what they hold. Inherent methods of those types: a trait of the
/// application's cannot replace them.
pub(super) const ACCESSORS: [&str; 14] = [
    "borrow_mut",
    "borrow",
    "lock",
    "read",
    "write",
    "get_mut",
    "as_mut",
    "as_deref_mut",
    "as_ref",
    "as_deref",
    "unwrap",
    "expect",
    "take",
    "into_inner",
];

/// The standard library's macros that expand to a literal (`concat!`, `env!`,
/// `include_str!`, …): never a connection, and the macros around them (`include_str!`,
/// `println!`'s format string) need them left as they are.
pub(super) fn is_literal_macro(mac: &syn::Macro) -> bool {
    const LITERAL_MACROS: [&str; 11] = [
        "concat",
        "stringify",
        "env",
        "option_env",
        "include_str",
        "include_bytes",
        "include",
        "file",
        "line",
        "column",
        "module_path",
    ];
    mac.path
        .segments
        .last()
        .is_some_and(|s| LITERAL_MACROS.contains(&s.ident.to_string().as_str()))
}

/// The names of a path's segments.
pub(super) fn segments(path: &syn::Path) -> Vec<String> {
    path.segments.iter().map(|s| s.ident.to_string()).collect()
}

/// `RefCell::new`, `std::sync::Mutex::new`, …: a constructor of one of [`WRAPPERS`].
pub(super) fn is_wrapper_constructor(func: &Expr) -> bool {
    let Expr::Path(path) = func else { return false };
    match segments(&path.path).as_slice() {
        [.., wrapper, new] => new == "new" && WRAPPERS.contains(&wrapper.as_str()),
        _ => false,
    }
}

/// Whether `expr` mentions one of `names` (as a path of one segment, or in a macro's tokens).
pub(super) fn mentions_any(expr: &Expr, names: &[Ident]) -> bool {
    struct Mentions<'n> {
        names: &'n [Ident],
        found: bool,
    }
    impl<'ast> Visit<'ast> for Mentions<'_> {
        fn visit_expr_path(&mut self, path: &'ast syn::ExprPath) {
            if let Some(name) = path.path.get_ident() {
                self.found |= self.names.contains(name);
            }
        }
        fn visit_macro(&mut self, mac: &'ast syn::Macro) {
            self.found |= mac.tokens.clone().into_iter().any(|t| match t {
                TokenTree::Ident(ident) => self.names.contains(&ident),
                _ => false,
            });
        }
    }
    let mut mentions = Mentions {
        names,
        found: false,
    };
    mentions.visit_expr(expr);
    mentions.found
}

/// Whether a condition binds names (`let` in an `if` or a chain).
pub(super) fn binds_names(cond: &Expr) -> bool {
    match cond {
        Expr::Let(test) => !pattern_names(&test.pat).is_empty(),
        Expr::Binary(binary) => binds_names(&binary.left) || binds_names(&binary.right),
        Expr::Paren(e) => binds_names(&e.expr),
        _ => false,
    }
}

/// Whether a block has a `break` with a value (for its own label or any other).
pub(super) fn breaks_with_value(block: &Block) -> bool {
    struct Breaks {
        found: bool,
    }
    impl<'ast> Visit<'ast> for Breaks {
        fn visit_expr_break(&mut self, brk: &'ast syn::ExprBreak) {
            self.found |= brk.expr.is_some();
            syn::visit::visit_expr_break(self, brk);
        }
        // A closure's or a nested item's breaks are their own.
        fn visit_expr_closure(&mut self, _: &'ast ExprClosure) {}
        fn visit_item(&mut self, _: &'ast syn::Item) {}
    }
    let mut breaks = Breaks { found: false };
    breaks.visit_block(block);
    breaks.found
}

/// Whether a macro call panics (`panic!`, `unreachable!`, `todo!`, `unimplemented!`).
pub(super) fn panics(mac: &syn::Macro) -> bool {
    mac.path.segments.last().is_some_and(|s| {
        ["panic", "unreachable", "todo", "unimplemented"].contains(&s.ident.to_string().as_str())
    })
}

/// Whether evaluating `expr` never yields a value: `return`, `break`, `continue`, a
/// panicking macro, or a block that ends in one.
pub(super) fn diverges(expr: &Expr) -> bool {
    match expr {
        Expr::Return(_) | Expr::Break(_) | Expr::Continue(_) => true,
        Expr::Paren(e) => diverges(&e.expr),
        Expr::Macro(mac) => panics(&mac.mac),
        Expr::Block(block) => match block.block.stmts.last() {
            Some(Stmt::Expr(tail, _)) => diverges(tail),
            Some(Stmt::Macro(mac)) => panics(&mac.mac),
            _ => false,
        },
        _ => false,
    }
}

/// Whether every value `expr` can yield is a closure written there: a closure, or a block,
/// `if` or `match` whose every value is one (or diverges).
pub(super) fn yields_closures(expr: &Expr) -> bool {
    match expr {
        Expr::Closure(_) => true,
        Expr::Paren(e) => yields_closures(&e.expr),
        Expr::Block(block) => block_yields_closures(&block.block),
        Expr::If(branch) => {
            block_yields_closures(&branch.then_branch)
                && branch
                    .else_branch
                    .as_ref()
                    .is_some_and(|(_, otherwise)| yields_closures(otherwise) || diverges(otherwise))
        }
        Expr::Match(matched) => {
            !matched.arms.is_empty()
                && matched
                    .arms
                    .iter()
                    .all(|arm| yields_closures(&arm.body) || diverges(&arm.body))
                && matched.arms.iter().any(|arm| yields_closures(&arm.body))
        }
        _ => false,
    }
}

pub(super) fn block_yields_closures(block: &Block) -> bool {
    match block.stmts.last() {
        Some(Stmt::Expr(tail, None)) => yields_closures(tail) || diverges(tail),
        _ => false,
    }
}

/// What kind of place an expression is: a receiver that is a place is auto-referenced, so
/// it is asked by reference before the statement rather than moved into a question.
#[derive(PartialEq)]
pub(super) enum Place {
    /// A value, not a place.
    No,
    /// A name, and fields, dereferences and indexes (by a literal or a name) of it: asking
    /// about it by reference evaluates nothing twice.
    Simple,
    /// A place indexed by an expression that would be evaluated twice.
    Indexed,
}

pub(super) fn place(expr: &Expr) -> Place {
    match expr {
        Expr::Paren(e) => place(&e.expr),
        Expr::Group(e) => place(&e.expr),
        Expr::Path(path) if path.qself.is_none() && path.path.get_ident().is_some() => {
            Place::Simple
        }
        // A static (`self::CALLS`, `db::POOL`): asked by reference, never moved.
        Expr::Path(path)
            if path.qself.is_none()
                && path
                    .path
                    .segments
                    .last()
                    .is_some_and(|last| is_screaming(&last.ident)) =>
        {
            Place::Simple
        }
        Expr::Field(field) => place(&field.base),
        Expr::Unary(e) if matches!(e.op, UnOp::Deref(_)) => place(&e.expr),
        Expr::Index(index) => match place(&index.expr) {
            Place::No => Place::No,
            Place::Simple if is_pure(&index.index) => Place::Simple,
            _ => Place::Indexed,
        },
        _ => Place::No,
    }
}

/// Replaces each index of the place `expr` that [`is_pure`] does not accept by a name, bound
/// to it by a `let` pushed on `lets`, in the order the place evaluates them.
pub(super) fn hoist_indexes(expr: &mut Expr, lets: &mut Vec<Stmt>) {
    match expr {
        Expr::Paren(e) => hoist_indexes(&mut e.expr, lets),
        Expr::Group(e) => hoist_indexes(&mut e.expr, lets),
        Expr::Field(field) => hoist_indexes(&mut field.base, lets),
        Expr::Unary(e) if matches!(e.op, UnOp::Deref(_)) => hoist_indexes(&mut e.expr, lets),
        Expr::Index(index) => {
            hoist_indexes(&mut index.expr, lets);
            if !is_pure(&index.index) {
                let name =
                    quote::format_ident!("__inbox_index_{}", lets.len(), span = Span::mixed_site());
                let value = &index.index;
                lets.push(syn::parse_quote!(let #name = #value;));
                *index.index = syn::parse_quote!(#name);
            }
        }
        _ => {}
    }
}

/// An expression that can be evaluated twice to the same effect: literals, names, fields,
/// arithmetic and casts of them.
pub(super) fn is_pure(expr: &Expr) -> bool {
    match expr {
        Expr::Lit(_) | Expr::Path(_) => true,
        Expr::Paren(e) => is_pure(&e.expr),
        Expr::Field(e) => is_pure(&e.base),
        Expr::Binary(e) => is_pure(&e.left) && is_pure(&e.right),
        Expr::Unary(e) => is_pure(&e.expr),
        Expr::Cast(e) => is_pure(&e.expr),
        _ => false,
    }
}

/// The name a place starts from.
pub(super) fn place_root(expr: &Expr) -> Option<&Ident> {
    match expr {
        Expr::Paren(e) => place_root(&e.expr),
        Expr::Group(e) => place_root(&e.expr),
        Expr::Reference(e) => place_root(&e.expr),
        Expr::Path(path) => path.path.get_ident(),
        Expr::Field(field) => place_root(&field.base),
        Expr::Index(index) => place_root(&index.expr),
        Expr::Unary(e) if matches!(e.op, UnOp::Deref(_)) => place_root(&e.expr),
        Expr::MethodCall(call) => place_root(&call.receiver),
        _ => None,
    }
}

/// The connection a transaction method `method` is called on, when the call is diesel's:
/// `conn` in `conn.transaction(…)` and in `conn.build_transaction().read_only().run(…)`;
/// `None` for `conn.scope().run(…)`, whose `scope` is the application's own method.
pub(super) fn transaction_receiver<'e>(receiver: &'e Expr, method: &str) -> Option<&'e Expr> {
    match receiver {
        Expr::Paren(e) => transaction_receiver(&e.expr, method),
        Expr::MethodCall(call) if BUILDER_METHODS.contains(&call.method.to_string().as_str()) => {
            match call.method == "build_transaction" {
                true => {
                    transaction_receiver(&call.receiver, "transaction").filter(|_| method == "run")
                }
                false => transaction_receiver(&call.receiver, method),
            }
        }
        Expr::MethodCall(_) => None,
        // `run` is a method of the builder, not of a connection.
        _ if method == "run" => None,
        root => Some(root),
    }
}

pub(super) fn pattern_names(pat: &Pat) -> Vec<Ident> {
    let mut names = Vec::new();
    collect_pattern_names(pat, &mut names);
    names
}

pub(super) fn collect_pattern_names(pat: &Pat, out: &mut Vec<Ident>) {
    match pat {
        Pat::Ident(p) => {
            out.push(p.ident.clone());
            if let Some((_, sub)) = &p.subpat {
                collect_pattern_names(sub, out);
            }
        }
        Pat::Type(p) => collect_pattern_names(&p.pat, out),
        Pat::Reference(p) => collect_pattern_names(&p.pat, out),
        Pat::Paren(p) => collect_pattern_names(&p.pat, out),
        Pat::Guard(p) => collect_pattern_names(&p.pat, out),
        Pat::Tuple(p) => p.elems.iter().for_each(|e| collect_pattern_names(e, out)),
        Pat::TupleStruct(p) => p.elems.iter().for_each(|e| collect_pattern_names(e, out)),
        Pat::Slice(p) => p.elems.iter().for_each(|e| collect_pattern_names(e, out)),
        Pat::Struct(p) => p
            .fields
            .iter()
            .for_each(|f| collect_pattern_names(&f.pat, out)),
        Pat::Or(p) => {
            // Every alternative binds the same names.
            if let Some(first) = p.cases.first() {
                collect_pattern_names(first, out);
            }
        }
        _ => {}
    }
}
