//! The compile-time guard: every statement in the handler's body runs on the handler's
//! transaction connection.
//!
//! Diesel runs a statement at once on the connection it is handed. A write on any other
//! connection — one checked out of a pool, one established in the body — commits on its own,
//! outside the inbox transaction, so a duplicate delivery is recognised and the write still
//! happens twice. This module finds such statements syntactically:
//!
//! - a query-running call (`execute`, `load`, `load_iter`, `get_result`, `get_results`,
//!   `first`; `batch_execute` on a connection; the same written as `RunQueryDsl::execute(q, c)`
//!   or `SimpleConnection::batch_execute(c, sql)`) must be given a *transaction connection*:
//!   the connection parameter, a reborrow of it (`&mut *conn`), a `let` alias of one, or the
//!   parameter of a closure handed to `transaction`-like methods called on one;
//! - `…::establish(…)` may not appear in the body.
//!
//! What is checked, exactly: the argument of a query-running method is refused when it is not
//! a transaction connection and it is certainly a connection — the method is called on a
//! diesel query (`diesel::update(…)`, `sql_query(…)`, `accounts::table…`), or the argument is
//! `&mut …`, a `.deref_mut()`/`.as_mut()`/`.borrow_mut()` call, or a local bound to one of
//! those. Other one-argument calls of the same names (`counter.load(ordering)`) are left alone.
//!
//! In claim mode there is no transaction: the body runs after the claim has committed and
//! before the work is stamped. There the handler's connection is treated like any other, so
//! every statement on a connection is refused.
//!
//! A statement marked `#[inbox::outside_transaction("reason")]` is exempt; the attribute is
//! removed from the expansion.

use quote::ToTokens;

use crate::valid::Mode;
use syn::visit::{self, Visit};
use syn::visit_mut::{self, VisitMut};
use syn::{
    Attribute, Block, Expr, ExprClosure, ExprMethodCall, Ident, ItemFn, LitStr, Local, Pat, Stmt,
    UnOp,
};

/// Methods of diesel's `RunQueryDsl` that run the query on the connection they are given.
const QUERY_METHODS: [&str; 6] = [
    "execute",
    "load",
    "load_iter",
    "get_result",
    "get_results",
    "first",
];

/// Methods that hand a closure the connection they are called on, inside a transaction.
const TRANSACTION_METHODS: [&str; 5] = [
    "transaction",
    "immediate_transaction",
    "exclusive_transaction",
    "run",
    "test_transaction",
];

/// Functions that start a query whose result is then run with a `QUERY_METHODS` call.
const QUERY_CONSTRUCTORS: [&str; 8] = [
    "update",
    "delete",
    "insert_into",
    "insert_or_ignore_into",
    "replace_into",
    "sql_query",
    "select",
    "sql",
];

/// The escape hatch's path, as written by the user.
pub const ESCAPE: &str = "inbox::outside_transaction";

/// What a name is bound to, as far as the guard can tell.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Binding {
    /// The handler's transaction connection or an alias of it.
    Transaction,
    /// Another connection: `let c = pool.get()?;`, `let c = &mut PgConnection::establish(…)?;`.
    Connection,
    /// A parameter of a closure that no transaction method hands the connection to: what it
    /// is given is decided where the closure is called (and checked there, by rule 5).
    ClosureParameter,
    /// Anything else.
    Other,
}

pub fn check(function: &ItemFn, conn: &Ident, mode: Mode) -> syn::Result<()> {
    let claim = matches!(mode, Mode::Claim { .. });
    let binding = match claim {
        true => Binding::Connection,
        false => Binding::Transaction,
    };
    let mut guard = Guard {
        conn: conn.clone(),
        claim,
        scope: vec![(conn.clone(), binding)],
        exempt: 0,
        error: None,
    };
    guard.visit_block(&function.block);
    guard.error.map_or(Ok(()), Err)
}

struct Guard {
    /// The handler's connection parameter, for the messages.
    conn: Ident,
    /// Claim mode: no statement may run on any connection.
    claim: bool,
    /// The bindings in scope, innermost last; a name's last entry wins.
    scope: Vec<(Ident, Binding)>,
    /// Depth of statements marked with the escape hatch.
    exempt: usize,
    error: Option<syn::Error>,
}

impl Guard {
    fn push_error(&mut self, error: syn::Error) {
        match &mut self.error {
            Some(first) => first.combine(error),
            None => self.error = Some(error),
        }
    }

    fn binding(&self, name: &Ident) -> Option<Binding> {
        self.scope
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, b)| *b)
    }

    /// `conn`, `&mut *conn`, `&mut conn`, `(conn)`, for `conn` bound to the transaction.
    fn is_transaction(&self, expr: &Expr) -> bool {
        match expr {
            Expr::Paren(e) => self.is_transaction(&e.expr),
            Expr::Group(e) => self.is_transaction(&e.expr),
            Expr::Reference(e) if e.mutability.is_some() => self.is_transaction(&e.expr),
            Expr::Unary(e) if matches!(e.op, UnOp::Deref(_)) => self.is_transaction(&e.expr),
            Expr::Path(p) => p
                .path
                .get_ident()
                .is_some_and(|name| self.binding(name) == Some(Binding::Transaction)),
            _ => false,
        }
    }

    fn is_closure_parameter(&self, expr: &Expr) -> bool {
        match peel(expr) {
            Expr::Path(p) => p
                .path
                .get_ident()
                .is_some_and(|name| self.binding(name) == Some(Binding::ClosureParameter)),
            _ => false,
        }
    }

    /// An expression that is certainly another connection: a pool checkout
    /// (`pool.get()?`, `&mut *POOL.get().unwrap()`), an established connection, or a name
    /// bound to one.
    fn is_other_connection(&self, expr: &Expr) -> bool {
        if self.is_transaction(expr) {
            return false;
        }
        match peel(expr) {
            Expr::MethodCall(call) => {
                let method = call.method.to_string();
                match method.as_str() {
                    "unwrap" | "expect" | "deref_mut" | "as_mut" | "borrow_mut" => {
                        self.is_other_connection(&call.receiver)
                    }
                    _ => POOL_CHECKOUTS.contains(&method.as_str()) && call.args.len() <= 1,
                }
            }
            Expr::Call(call) => is_establish(call),
            Expr::Path(p) => p
                .path
                .get_ident()
                .is_some_and(|name| self.binding(name) == Some(Binding::Connection)),
            _ => false,
        }
    }

    /// How a `let` binds its name, judged from the initializer.
    fn judge(&self, init: &Expr) -> Binding {
        if self.is_transaction(init) {
            Binding::Transaction
        } else if self.is_other_connection(init) {
            Binding::Connection
        } else {
            Binding::Other
        }
    }

    /// Where a refused statement runs, for the messages.
    fn elsewhere(&self) -> String {
        match self.claim {
            true => "a database connection in a claim-mode body".to_owned(),
            false => format!(
                "a connection other than `{}`, the handler's transaction connection",
                self.conn
            ),
        }
    }

    /// Rule 5: a helper or closure given another connection runs its statements there.
    fn refuse_connection_arguments(
        &mut self,
        args: &syn::punctuated::Punctuated<Expr, syn::Token![,]>,
        callee: &str,
    ) {
        for arg in args {
            if self.is_other_connection(arg) {
                let problem = match self.claim {
                    true => format!("{callee} is given {}", self.elsewhere()),
                    false => format!(
                        "{callee} is given {}: what it runs there is not part of the transaction",
                        self.elsewhere()
                    ),
                };
                self.refuse(arg, &problem);
            }
        }
    }

    /// Records an error, unless the statement is marked with the escape hatch. `problem` says
    /// what runs where; the consequence and the fix are the same for every rule.
    fn refuse(&mut self, at: &dyn ToTokens, problem: &str) {
        if self.exempt > 0 {
            return;
        }
        let conn = &self.conn;
        let message = match self.claim {
            true => format!(
                "{problem}, so it would commit on its own: a claim-mode body runs outside any \
                 transaction, after the claim has committed and before the work is stamped, \
                 and nothing it writes is undone when the side effect fails and the message is \
                 redelivered; do database work in a transaction-mode handler, or before this \
                 one, or, if it must run here, mark the statement \
                 `#[inbox::outside_transaction(\"why\")]`"
            ),
            false => format!(
                "{problem}, so it would commit on its own, outside the inbox transaction: a \
                 redelivered message would be recognised as a duplicate and this write would \
                 still happen again; run it on the handler's connection (`{conn}`, or \
                 `&mut *{conn}`) so that it commits or rolls back with the inbox marker, or, if \
                 it must commit on its own, mark the statement \
                 `#[inbox::outside_transaction(\"why\")]`"
            ),
        };
        self.push_error(syn::Error::new_spanned(at, message));
    }

    /// Visits a closure, binding its parameters as `binding` while its body is visited.
    fn visit_closure_as(&mut self, closure: &ExprClosure, binding: Binding) {
        let depth = self.scope.len();
        for input in &closure.inputs {
            for name in pattern_names(input) {
                self.scope.push((name, binding));
            }
        }
        visit::visit_expr(self, &closure.body);
        self.scope.truncate(depth);
    }
}

impl<'ast> Visit<'ast> for Guard {
    fn visit_block(&mut self, block: &'ast Block) {
        let depth = self.scope.len();
        visit::visit_block(self, block);
        self.scope.truncate(depth);
    }

    fn visit_stmt(&mut self, stmt: &'ast Stmt) {
        let escape = match stmt_attrs(stmt).iter().find(|a| is_escape(a)) {
            Some(attr) => match escape_reason(attr) {
                Ok(_) => true,
                Err(error) => {
                    self.push_error(error);
                    false
                }
            },
            None => false,
        };
        self.exempt += usize::from(escape);
        visit::visit_stmt(self, stmt);
        self.exempt -= usize::from(escape);
    }

    fn visit_local(&mut self, local: &'ast Local) {
        if let Some(init) = &local.init {
            self.visit_expr(&init.expr);
            if let Some((_, diverge)) = &init.diverge {
                self.visit_expr(diverge);
            }
        }
        let binding = local
            .init
            .as_ref()
            .map_or(Binding::Other, |init| self.judge(&init.expr));
        for name in pattern_names(&local.pat) {
            // A destructured or typed pattern binds parts of the value: only a plain name
            // becomes an alias of a transaction connection.
            let plain = matches!(&local.pat, Pat::Ident(_));
            let binding = if plain { binding } else { Binding::Other };
            self.scope.push((name, binding));
        }
    }

    fn visit_expr_closure(&mut self, closure: &'ast ExprClosure) {
        // A closure's parameters shadow what they name; what a closure is given is unknown
        // unless a transaction method hands it the transaction's connection (see
        // `visit_expr_method_call`).
        self.visit_closure_as(closure, Binding::ClosureParameter);
    }

    fn visit_expr_method_call(&mut self, call: &'ast ExprMethodCall) {
        let method = call.method.to_string();
        if QUERY_METHODS.contains(&method.as_str()) && call.args.len() == 1 {
            // Rule 1: a query runs on the transaction's connection.
            let connection = &call.args[0];
            let refused =
                if self.is_transaction(connection) || self.is_closure_parameter(connection) {
                    false
                } else if is_diesel_query(&call.receiver) {
                    true
                } else {
                    is_mut_reference(connection) || self.is_other_connection(connection)
                };
            if refused {
                let problem = format!("`.{method}(…)` runs this statement on {}", self.elsewhere());
                self.refuse(connection, &problem);
            }
        } else if method == "batch_execute" && call.args.len() == 1 {
            // Rule 2: so does SQL sent straight to a connection.
            if !self.is_transaction(&call.receiver) && !self.is_closure_parameter(&call.receiver) {
                let problem = format!("`.batch_execute(…)` sends this SQL to {}", self.elsewhere());
                self.refuse(&call.receiver, &problem);
            }
        } else if TRANSACTION_METHODS.contains(&method.as_str())
            && self.is_other_connection(receiver_root(&call.receiver))
        {
            // Rule 6: a transaction of another connection commits on its own.
            let problem = format!(
                "`.{method}(…)` opens a transaction on {}, and what runs in it",
                self.elsewhere()
            );
            self.refuse(receiver_root(&call.receiver), &problem);
        } else {
            self.refuse_connection_arguments(&call.args, &format!("`.{method}(…)`"));
        }
        self.visit_expr(&call.receiver);
        let hands_over = TRANSACTION_METHODS.contains(&method.as_str())
            && self.is_transaction(receiver_root(&call.receiver));
        for arg in &call.args {
            match arg {
                Expr::Closure(closure) if hands_over => {
                    self.visit_closure_as(closure, Binding::Transaction)
                }
                _ => self.visit_expr(arg),
            }
        }
    }

    fn visit_expr_call(&mut self, call: &'ast syn::ExprCall) {
        if let Expr::Path(path) = &*call.func {
            let segments: Vec<String> = path
                .path
                .segments
                .iter()
                .map(|s| s.ident.to_string())
                .collect();
            let last = segments.last().map(String::as_str).unwrap_or_default();
            let qualifier = segments.iter().rev().nth(1).map(String::as_str);
            if is_establish(call) {
                // Rule 3: no connection of its own.
                self.refuse(
                    call,
                    "this connection is established inside the handler: a statement run on it is \
                     not part of the handler's transaction",
                );
            }
            let connection = match (qualifier, last) {
                (Some("RunQueryDsl"), method) if QUERY_METHODS.contains(&method) => {
                    call.args.iter().nth(1)
                }
                (
                    Some("SimpleConnection" | "SimpleAsyncConnection" | "Connection"),
                    "batch_execute",
                ) => call.args.first(),
                _ => None,
            };
            match connection {
                Some(connection) => {
                    if !self.is_transaction(connection) && !self.is_closure_parameter(connection) {
                        let problem = format!(
                            "`{}(…)` runs this statement on {}",
                            segments.join("::"),
                            self.elsewhere()
                        );
                        self.refuse(connection, &problem);
                    }
                }
                None => self.refuse_connection_arguments(
                    &call.args,
                    &format!("`{}(…)`", segments.join("::")),
                ),
            }
            let hands_over = TRANSACTION_METHODS.contains(&last)
                && call.args.first().is_some_and(|c| self.is_transaction(c));
            if hands_over {
                for arg in &call.args {
                    match arg {
                        Expr::Closure(closure) => {
                            self.visit_closure_as(closure, Binding::Transaction)
                        }
                        _ => self.visit_expr(arg),
                    }
                }
                return;
            }
        }
        visit::visit_expr_call(self, call);
    }

    /// A nested item is its own world: its statements run wherever its caller says.
    fn visit_item(&mut self, _: &'ast syn::Item) {}
}

/// Methods that check a connection out of a pool (r2d2, deadpool, bb8, diesel's own).
const POOL_CHECKOUTS: [&str; 5] = ["get", "get_timeout", "try_get", "get_owned", "timeout_get"];

/// An expression without the parentheses, `&mut`, `*` and `?` around its core.
fn peel(expr: &Expr) -> &Expr {
    match expr {
        Expr::Paren(e) => peel(&e.expr),
        Expr::Group(e) => peel(&e.expr),
        Expr::Reference(e) => peel(&e.expr),
        Expr::Unary(e) if matches!(e.op, UnOp::Deref(_)) => peel(&e.expr),
        Expr::Try(e) => peel(&e.expr),
        Expr::Await(e) => peel(&e.base),
        _ => expr,
    }
}

fn is_mut_reference(expr: &Expr) -> bool {
    match expr {
        Expr::Paren(e) => is_mut_reference(&e.expr),
        Expr::Group(e) => is_mut_reference(&e.expr),
        Expr::Reference(e) => e.mutability.is_some(),
        _ => false,
    }
}

/// `PgConnection::establish(…)`, `diesel::Connection::establish(…)`, `establish(…)`.
fn is_establish(call: &syn::ExprCall) -> bool {
    matches!(&*call.func, Expr::Path(path) if path.path.segments.last().is_some_and(|s| s.ident == "establish"))
}

/// The expression a method chain starts from: `conn` in `conn.build_transaction().run(…)`.
fn receiver_root(expr: &Expr) -> &Expr {
    match expr {
        Expr::MethodCall(call) => receiver_root(&call.receiver),
        Expr::Paren(e) => receiver_root(&e.expr),
        _ => expr,
    }
}

/// Whether a method chain starts from something that is certainly a diesel query:
/// `diesel::update(…)`, `sql_query(…)`, a path ending in `table`, or a path through `dsl`.
fn is_diesel_query(receiver: &Expr) -> bool {
    match receiver_root(receiver) {
        Expr::Call(call) => match &*call.func {
            Expr::Path(path) => path
                .path
                .segments
                .last()
                .is_some_and(|s| QUERY_CONSTRUCTORS.contains(&s.ident.to_string().as_str())),
            _ => false,
        },
        // `accounts::table`, `users::dsl::users` — not `metrics::PROCESSED`, a static whose
        // `.load(ordering)` is an atomic's.
        Expr::Path(path) => {
            let segments = &path.path.segments;
            segments.len() >= 2
                && (segments.last().is_some_and(|s| s.ident == "table")
                    || segments.iter().any(|s| s.ident == "dsl"))
        }
        _ => false,
    }
}

fn pattern_names(pat: &Pat) -> Vec<Ident> {
    let mut names = Vec::new();
    collect_pattern_names(pat, &mut names);
    names
}

fn collect_pattern_names(pat: &Pat, out: &mut Vec<Ident>) {
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
        Pat::Tuple(p) => p.elems.iter().for_each(|e| collect_pattern_names(e, out)),
        Pat::TupleStruct(p) => p.elems.iter().for_each(|e| collect_pattern_names(e, out)),
        Pat::Slice(p) => p.elems.iter().for_each(|e| collect_pattern_names(e, out)),
        Pat::Struct(p) => p
            .fields
            .iter()
            .for_each(|f| collect_pattern_names(&f.pat, out)),
        Pat::Or(p) => p.cases.iter().for_each(|c| collect_pattern_names(c, out)),
        _ => {}
    }
}

fn stmt_attrs(stmt: &Stmt) -> &[Attribute] {
    match stmt {
        Stmt::Local(local) => &local.attrs,
        Stmt::Expr(expr, _) => expr_attrs(expr),
        Stmt::Macro(mac) => &mac.attrs,
        Stmt::Item(_) => &[],
    }
}

fn expr_attrs(expr: &Expr) -> &[Attribute] {
    macro_rules! attrs {
        ($($variant:ident),*) => {
            match expr {
                $(Expr::$variant(e) => &e.attrs,)*
                _ => &[],
            }
        };
    }
    attrs!(
        Assign, Await, Binary, Block, Call, Field, ForLoop, If, Index, Let, Loop, Macro, Match,
        MethodCall, Paren, Path, Reference, Return, Try, Unary, Unsafe, While
    )
}

fn is_escape(attr: &Attribute) -> bool {
    let path = attr.path();
    path.segments.len() == 2
        && path.segments[0].ident == "inbox"
        && path.segments[1].ident == "outside_transaction"
}

/// `#[inbox::outside_transaction("reason")]`: the reason is required and may not be blank.
fn escape_reason(attr: &Attribute) -> syn::Result<String> {
    let usage = || {
        syn::Error::new_spanned(
            attr,
            format!(
                "`#[{ESCAPE}]` needs the reason the statement may commit on its own: \
                 `#[{ESCAPE}(\"audit log must survive a rollback\")]`"
            ),
        )
    };
    let reason: LitStr = attr.parse_args().map_err(|_| usage())?;
    if reason.value().trim().is_empty() {
        return Err(usage());
    }
    Ok(reason.value())
}

/// Removes the escape-hatch attributes, which only this macro understands, from the body.
pub fn strip_escapes(function: &mut ItemFn) {
    struct Strip;
    impl VisitMut for Strip {
        fn visit_stmt_mut(&mut self, stmt: &mut Stmt) {
            let attrs = match stmt {
                Stmt::Local(local) => Some(&mut local.attrs),
                Stmt::Macro(mac) => Some(&mut mac.attrs),
                Stmt::Expr(expr, _) => expr_attrs_mut(expr),
                Stmt::Item(_) => None,
            };
            if let Some(attrs) = attrs {
                attrs.retain(|a| !is_escape(a));
            }
            visit_mut::visit_stmt_mut(self, stmt);
        }
    }
    Strip.visit_block_mut(&mut function.block);
}

fn expr_attrs_mut(expr: &mut Expr) -> Option<&mut Vec<Attribute>> {
    macro_rules! attrs {
        ($($variant:ident),*) => {
            match expr {
                $(Expr::$variant(e) => Some(&mut e.attrs),)*
                _ => None,
            }
        };
    }
    attrs!(
        Assign, Await, Binary, Block, Call, Field, ForLoop, If, Index, Let, Loop, Macro, Match,
        MethodCall, Paren, Path, Reference, Return, Try, Unary, Unsafe, While
    )
}
