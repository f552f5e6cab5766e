//! The compile-time guard: no statement in a handler's body runs on a connection other than
//! the handler's transaction, and a claim-mode body touches no database at all.
//!
//! Diesel runs a statement at once on the connection it is handed. A write on any other
//! connection — one checked out of a pool, established in the body, kept in a struct, a
//! global or a second parameter — commits on its own, outside the inbox transaction, so a
//! duplicate delivery is recognised and the write still happens twice.
//!
//! What a value *is* is decided by the compiler, not here. This module rewrites the body so
//! that every value it hands on — a call's argument, a method's receiver, a struct, tuple or
//! array element, an assignment's right side, a macro's argument that parses as an
//! expression, and every parameter besides the connection — is asked, at its concrete type,
//! whether it is a diesel connection (sync or async, owned, borrowed, pooled, behind a guard
//! or a `Deref`) or a connection pool. `inbox_diesel::__private::vet!` does the asking (see
//! `inbox-diesel/src/guard.rs`); a connection fails to compile, spanned at the value, with a
//! message that says why and how to fix it. Anything else — an `i64`, a Redis client, an
//! atomic's `load` — is never called a connection.
//!
//! What *is* decided here is which values are the handler's transaction, and so need no
//! question: the connection parameter and what is bound from it. Names are tracked as Rust
//! scopes them — every pattern, closure parameter, `for`, `match`, `if let`, `while let` and
//! `let … else` binds a new value, judged by where it comes from — and an assignment can
//! only bring in a value that was itself asked. A value the tracking cannot follow is asked
//! too; if it is in fact the transaction reached by a way not followed here, the message
//! says so and the fix is to pass the parameter itself.
//!
//! In claim mode there is no transaction: the body is given `inbox_diesel::NoConnection`,
//! which has no methods and no diesel impls, and every value it hands on is asked with
//! claim mode's message.
//!
//! A statement marked `#[inbox::outside_transaction("reason")]` is not rewritten; the
//! attribute is removed from the expansion.

use proc_macro2::{Delimiter, Group, Span, TokenStream, TokenTree};
use quote::{ToTokens, quote, quote_spanned};
use syn::punctuated::Punctuated;
use syn::visit::Visit;
use syn::visit_mut::{self, VisitMut};
use syn::{
    Arm, Attribute, Block, Expr, ExprCall, ExprClosure, ExprMethodCall, FnArg, Ident, ItemFn,
    LitStr, Local, Member, Pat, Stmt, Token, Type, UnOp,
};

use crate::valid::Mode;

/// Methods that hand the closure they are given the connection they are called on, inside a
/// transaction (diesel's and diesel-async's `Connection` and `TransactionBuilder`).
const TRANSACTION_METHODS: [&str; 5] = [
    "transaction",
    "immediate_transaction",
    "exclusive_transaction",
    "run",
    "test_transaction",
];

/// Macros whose arguments after the first are patterns, not expressions.
const PATTERN_MACROS: [&str; 3] = ["matches", "assert_matches", "debug_assert_matches"];

/// The escape hatch's path, as written by the user.
pub const ESCAPE: &str = "inbox::outside_transaction";

/// Where a name's value comes from, as far as the body shows.
#[derive(Clone, Debug, PartialEq)]
enum Origin {
    /// The handler's transaction, or an alias of it: never asked.
    Transaction,
    /// A parameter of a closure that is only ever called in the body, so what it is given is
    /// asked where it is called.
    CheckedAtCalls,
    /// A handler parameter, asked once at the top of the body.
    Parameter,
    /// A handler parameter declared as a shared reference (`msg: &Msg`): asked at the top;
    /// what is read out of it by value cannot be a connection or a pool (neither is `Copy`).
    SharedParameter,
    /// A field (or element) read out of a shared-reference parameter.
    SharedField,
    /// Claim mode: the `NoConnection` the body is given; every mention of it is asked.
    NoConnection,
    /// A tuple, or `Some`/`Ok`/`Err` of a value: where each part comes from.
    Parts(Vec<Origin>),
    /// A struct literal: where each field comes from.
    Fields(Vec<(String, Origin)>),
    /// A path that names no local binding: a static, a constant, a unit struct, a function.
    /// None of them can be a connection value.
    NotLocal,
    /// One of the questions this module writes: asked already.
    Asked,
    /// A metavariable of a `macro_rules!` defined in the body (`$c`): whatever the caller
    /// passes, asked where the macro is called, as a macro's argument.
    Metavariable,
    /// Anything else: asked wherever it is handed on.
    Unknown,
}

impl Origin {
    /// Whether a value of this origin, handed on whole, needs no question.
    fn is_settled(&self) -> bool {
        matches!(
            self,
            Origin::Transaction
                | Origin::CheckedAtCalls
                | Origin::Parameter
                | Origin::SharedParameter
                | Origin::SharedField
                | Origin::Parts(_)
                | Origin::Fields(_)
                | Origin::NotLocal
                | Origin::Asked
                | Origin::Metavariable
        )
    }
}

/// A name in scope.
struct Binding {
    name: Ident,
    origin: Origin,
    /// The name is the connection parameter's, bound anew: it shadows the connection.
    shadows: bool,
}

/// Statements to place before the statement being rewritten: questions about places (a
/// method's receiver, a macro's argument) that must not be moved to be asked.
struct Frame {
    /// How many bindings were in scope when the statement began: a place rooted in a later
    /// one cannot be asked before the statement.
    visible: usize,
    asked: Vec<Stmt>,
}

/// How a value is handed on, which decides how it is asked.
#[derive(Clone, Copy, PartialEq)]
enum Handed {
    /// Moved, copied or reborrowed into a call, a literal or an assignment: asked in place,
    /// through a function that returns it.
    ByValue,
    /// A method's receiver or a macro's argument, which may be auto-referenced: a place is
    /// asked by reference before the statement; any other value in place.
    ByPlace,
}

pub fn instrument(function: &mut ItemFn, conn: &Ident, mode: Mode) -> syn::Result<()> {
    let claim = matches!(mode, Mode::Claim { .. });
    let mut guard = Guard {
        conn: conn.clone(),
        claim,
        scope: Vec::new(),
        parameter_bound: false,
        frames: Vec::new(),
        error: None,
    };
    let mut asked = Vec::new();
    for input in &function.sig.inputs {
        let (names, shared) = match input {
            FnArg::Receiver(receiver) => (
                vec![Ident::new("self", receiver.self_token.span)],
                matches!(receiver.kind, syn::ReceiverKind::Reference(_, _, None)),
            ),
            FnArg::Typed(typed) => {
                let shared = matches!(&*typed.ty, Type::Reference(r) if r.mutability.is_none());
                (pattern_names(&typed.pat), shared)
            }
        };
        for name in names {
            if name == *conn {
                let origin = match claim {
                    true => Origin::NoConnection,
                    false => Origin::Transaction,
                };
                guard.bind(name, origin);
                guard.parameter_bound = true;
                continue;
            }
            asked.push(guard.ask_place(&syn::parse_quote!(#name), false));
            let origin = match shared {
                true => Origin::SharedParameter,
                false => Origin::Parameter,
            };
            guard.bind(name, origin);
        }
    }
    guard.visit_block_mut(&mut function.block);
    function.block.stmts.splice(0..0, asked);
    guard.error.map_or(Ok(()), Err)
}

struct Guard {
    /// The handler's connection parameter.
    conn: Ident,
    /// Claim mode: the body has no transaction.
    claim: bool,
    /// The bindings in scope, innermost last; a name's last entry wins.
    scope: Vec<Binding>,
    /// The connection parameter is in scope: a later binding of its name shadows it.
    parameter_bound: bool,
    frames: Vec<Frame>,
    error: Option<syn::Error>,
}

impl Guard {
    fn push_error(&mut self, error: syn::Error) {
        match &mut self.error {
            Some(first) => first.combine(error),
            None => self.error = Some(error),
        }
    }

    fn bind(&mut self, name: Ident, origin: Origin) {
        let shadows = name == self.conn && self.parameter_bound;
        self.scope.push(Binding {
            name,
            origin,
            shadows,
        });
    }

    fn lookup(&self, name: &Ident) -> Option<(usize, &Binding)> {
        self.scope
            .iter()
            .enumerate()
            .rev()
            .find(|(_, binding)| binding.name == *name)
    }

    /// Binds the names of `pat` to the parts of a value of origin `origin`.
    fn bind_pattern(&mut self, pat: &Pat, origin: Origin) {
        match (pat, &origin) {
            (Pat::Ident(p), _) => {
                if let Some((_, sub)) = &p.subpat {
                    self.bind_pattern(sub, Origin::Unknown);
                }
                self.bind(p.ident.clone(), origin);
            }
            (Pat::Type(p), _) => self.bind_pattern(&p.pat, origin),
            (Pat::Paren(p), _) => self.bind_pattern(&p.pat, origin),
            (Pat::Reference(p), _) => self.bind_pattern(&p.pat, origin),
            (Pat::Tuple(p), Origin::Parts(parts)) if p.elems.len() == parts.len() => {
                for (elem, part) in p.elems.iter().zip(parts) {
                    self.bind_pattern(elem, part.clone());
                }
            }
            (Pat::TupleStruct(p), Origin::Parts(parts)) if p.elems.len() == parts.len() => {
                for (elem, part) in p.elems.iter().zip(parts) {
                    self.bind_pattern(elem, part.clone());
                }
            }
            (Pat::Struct(p), Origin::Fields(fields)) => {
                for field in &p.fields {
                    let part = match &field.member {
                        Member::Named(name) => fields
                            .iter()
                            .find(|(n, _)| name == n)
                            .map_or(Origin::Unknown, |(_, o)| o.clone()),
                        Member::Unnamed(_) => Origin::Unknown,
                    };
                    self.bind_pattern(&field.pat, part);
                }
            }
            _ => {
                for name in pattern_names(pat) {
                    self.bind(name, Origin::Unknown);
                }
            }
        }
    }

    /// Where a value comes from.
    fn origin(&self, expr: &Expr) -> Origin {
        match expr {
            Expr::Paren(e) => self.origin(&e.expr),
            Expr::Group(e) => self.origin(&e.expr),
            Expr::Reference(e) => match self.origin(&e.expr) {
                // A reference to what was read out of a shared parameter may be a pool's.
                Origin::SharedField => Origin::Unknown,
                origin => origin,
            },
            Expr::Unary(e) if matches!(e.op, UnOp::Deref(_)) => self.origin(&e.expr),
            Expr::Path(path) if path.qself.is_none() => match path.path.get_ident() {
                Some(name) => self
                    .lookup(name)
                    .map_or(Origin::NotLocal, |(_, b)| b.origin.clone()),
                None => Origin::NotLocal,
            },
            Expr::Field(field) => match self.origin(&field.base) {
                Origin::SharedParameter | Origin::SharedField => Origin::SharedField,
                Origin::Parts(parts) => match &field.member {
                    Member::Unnamed(index) => parts
                        .get(index.index as usize)
                        .cloned()
                        .unwrap_or(Origin::Unknown),
                    Member::Named(_) => Origin::Unknown,
                },
                Origin::Fields(fields) => match &field.member {
                    Member::Named(name) => fields
                        .iter()
                        .find(|(n, _)| name == n)
                        .map_or(Origin::Unknown, |(_, o)| o.clone()),
                    Member::Unnamed(_) => Origin::Unknown,
                },
                _ => Origin::Unknown,
            },
            Expr::Index(index) => match self.origin(&index.expr) {
                Origin::SharedParameter | Origin::SharedField => Origin::SharedField,
                _ => Origin::Unknown,
            },
            Expr::MethodCall(call) if call.args.is_empty() => {
                let method = call.method.to_string();
                match (self.origin(&call.receiver), method.as_str()) {
                    (
                        Origin::Transaction,
                        "deref_mut" | "deref" | "as_mut" | "as_ref" | "borrow_mut" | "borrow",
                    ) => Origin::Transaction,
                    (Origin::Parts(parts), "unwrap") if parts.len() == 1 => parts[0].clone(),
                    (Origin::Parts(parts), "as_mut" | "as_deref_mut" | "take")
                        if parts.len() == 1 =>
                    {
                        Origin::Parts(parts)
                    }
                    _ => Origin::Unknown,
                }
            }
            Expr::Call(call) if call.args.len() == 1 && is_variant_constructor(&call.func) => {
                Origin::Parts(vec![self.origin(&call.args[0])])
            }
            Expr::Macro(mac) if is_question(&mac.mac) => Origin::Asked,
            Expr::Tuple(tuple) => {
                Origin::Parts(tuple.elems.iter().map(|e| self.origin(e)).collect())
            }
            Expr::Struct(literal) if literal.rest.is_none() => Origin::Fields(
                literal
                    .fields
                    .iter()
                    .filter_map(|field| match &field.member {
                        Member::Named(name) => Some((name.to_string(), self.origin(&field.expr))),
                        Member::Unnamed(_) => None,
                    })
                    .collect(),
            ),
            _ => Origin::Unknown,
        }
    }

    /// Whether a value of this shape can only be something other than a connection: a
    /// literal, a closure, arithmetic, a comparison, a cast, a range, an array, tuple or
    /// struct literal (whose parts are asked one by one), or one of our own questions.
    fn is_plainly_not_a_connection(&self, expr: &Expr) -> bool {
        match expr {
            Expr::Paren(e) => self.is_plainly_not_a_connection(&e.expr),
            Expr::Lit(_)
            | Expr::Closure(_)
            | Expr::Binary(_)
            | Expr::Cast(_)
            | Expr::Range(_)
            | Expr::Array(_)
            | Expr::Repeat(_)
            | Expr::Tuple(_)
            | Expr::Struct(_)
            | Expr::Async(_) => true,
            Expr::Unary(e) => !matches!(e.op, UnOp::Deref(_)),
            Expr::Macro(mac) => is_question(&mac.mac),
            _ => false,
        }
    }

    /// Asks about a value handed on, replacing it by the question where it is asked in place.
    fn hand(&mut self, expr: &mut Expr, handed: Handed) {
        if self.is_plainly_not_a_connection(expr) {
            return;
        }
        let origin = self.origin(expr);
        if origin.is_settled() {
            // A shared parameter's field, read by value, cannot be a connection; one used as
            // a receiver is auto-referenced, and may be a pool.
            if !(origin == Origin::SharedField && handed == Handed::ByPlace) {
                return;
            }
        }
        let shadowed = self.shadows(expr);
        match handed {
            Handed::ByPlace if place(expr) == Place::Simple => {
                let Some(root) = place_root(expr) else { return };
                // A static is visible everywhere; a binding from where it was bound.
                let bound_at = self.lookup(root).map(|(at, _)| at);
                let question = self.ask_place(expr, shadowed);
                if let Some(frame) = self.frames.last_mut()
                    && bound_at.is_none_or(|at| at < frame.visible)
                {
                    frame.asked.push(question);
                }
                // A place bound inside the statement itself (a `let` chain) cannot be asked
                // before it; see the limits on `idempotent`.
            }
            // Asked in place, it would be moved out of its container; asked before the
            // statement, its index would run twice. See the limits on `idempotent`.
            Handed::ByPlace if place(expr) == Place::Indexed => {}
            _ => *expr = self.ask(expr, shadowed),
        }
    }

    /// Whether the value's root is a name that shadows the connection parameter.
    fn shadows(&self, expr: &Expr) -> bool {
        place_root(expr)
            .and_then(|root| self.lookup(root))
            .is_some_and(|(_, binding)| binding.shadows)
    }

    /// `vet!(expr)`, spanned at the expression, so that the compiler's message points there.
    fn ask(&self, expr: &Expr, shadowed: bool) -> Expr {
        let tokens = self.question(expr.to_token_stream(), shadowed);
        syn::parse2(tokens).expect("a question parses as an expression")
    }

    /// `vet!(&place);`, asked before the statement.
    fn ask_place(&self, place: &Expr, shadowed: bool) -> Stmt {
        let (first, _) = spans(place);
        let reference = quote_spanned!(first=> &);
        let tokens = self.question(quote!(#reference #place), shadowed);
        syn::parse2(quote!(#tokens;)).expect("a question parses as a statement")
    }

    fn question(&self, value: TokenStream, shadowed: bool) -> TokenStream {
        let (first, last) = spans(&value);
        let name = match (self.claim, shadowed) {
            (true, _) => "vet_claim",
            (false, true) => "vet_shadowed",
            (false, false) => "vet",
        };
        let name = Ident::new(name, first);
        let mut args = Group::new(Delimiter::Parenthesis, value);
        args.set_span(last);
        quote_spanned!(first=> ::inbox_diesel::__private::#name! #args)
    }

    /// Visits a closure whose parameters come from `origin`.
    fn visit_closure_as(&mut self, closure: &mut ExprClosure, origin: Origin) {
        let depth = self.scope.len();
        for input in &closure.inputs {
            self.bind_pattern(input, origin.clone());
        }
        self.in_frame(&mut closure.body);
        self.scope.truncate(depth);
    }

    /// Visits an expression that is a scope of statements of its own (a closure's or an
    /// arm's body, a guard); the questions about places go in front of it.
    fn in_frame(&mut self, expr: &mut Expr) {
        self.frames.push(Frame {
            visible: self.scope.len(),
            asked: Vec::new(),
        });
        self.visit_expr_mut(expr);
        let asked = self.frames.pop().map(|f| f.asked).unwrap_or_default();
        if !asked.is_empty() {
            let inner = std::mem::replace(expr, Expr::Verbatim(TokenStream::new()));
            *expr = syn::parse_quote!({ #(#asked)* #inner });
        }
    }

    /// The arguments of a call or a method call; closures handed to a transaction method of
    /// the transaction are given the transaction.
    fn visit_arguments(&mut self, args: &mut Punctuated<Expr, Token![,]>, hands_over: bool) {
        for arg in args.iter_mut() {
            match arg {
                Expr::Closure(closure) => {
                    let origin = match hands_over {
                        true => Origin::Transaction,
                        false => Origin::Unknown,
                    };
                    self.visit_closure_as(closure, origin);
                }
                _ => {
                    self.visit_expr_mut(arg);
                    self.hand(arg, Handed::ByValue);
                }
            }
        }
    }

    /// A macro invocation: arguments that parse as expressions are visited and asked.
    fn visit_macro(&mut self, mac: &mut syn::Macro) {
        if is_question(mac) {
            return;
        }
        let name = mac.path.segments.last().map(|s| s.ident.to_string());
        let Ok(mut args) = mac.parse_body_with(Punctuated::<Expr, Token![,]>::parse_terminated)
        else {
            return;
        };
        let patterns = name.is_some_and(|n| PATTERN_MACROS.contains(&n.as_str()));
        for (at, arg) in args.iter_mut().enumerate() {
            if patterns && at > 0 {
                break;
            }
            match arg {
                // `name = value`, as tracing's fields are written.
                Expr::Assign(assign) => {
                    self.visit_expr_mut(&mut assign.right);
                    self.hand(&mut assign.right, Handed::ByPlace);
                }
                _ => {
                    self.visit_expr_mut(arg);
                    self.hand(arg, Handed::ByPlace);
                }
            }
        }
        mac.tokens = args.to_token_stream();
    }

    /// Whether every later mention of `name` in `rest` calls it: then what its parameters
    /// are given is asked at those calls.
    fn only_called(name: &Ident, rest: &[Stmt]) -> bool {
        struct Mentions<'n> {
            name: &'n Ident,
            called: usize,
            all: usize,
        }
        impl<'ast> Visit<'ast> for Mentions<'_> {
            fn visit_expr_call(&mut self, call: &'ast ExprCall) {
                if let Expr::Path(path) = &*call.func
                    && path.path.is_ident(self.name)
                {
                    self.called += 1;
                }
                syn::visit::visit_expr_call(self, call);
            }
            fn visit_expr_path(&mut self, path: &'ast syn::ExprPath) {
                if path.path.is_ident(self.name) {
                    self.all += 1;
                }
            }
            fn visit_macro(&mut self, mac: &'ast syn::Macro) {
                // A mention inside a macro's tokens may be anything.
                fn mentions(tokens: TokenStream, name: &Ident) -> usize {
                    tokens
                        .into_iter()
                        .map(|t| match t {
                            TokenTree::Ident(ident) => usize::from(ident == *name),
                            TokenTree::Group(group) => mentions(group.stream(), name),
                            _ => 0,
                        })
                        .sum()
                }
                self.all += mentions(mac.tokens.clone(), self.name) + 1;
            }
        }
        let mut mentions = Mentions {
            name,
            called: 0,
            all: 0,
        };
        for stmt in rest {
            mentions.visit_stmt(stmt);
        }
        mentions.called == mentions.all
    }
}

impl VisitMut for Guard {
    fn visit_block_mut(&mut self, block: &mut Block) {
        let depth = self.scope.len();
        let stmts = std::mem::take(&mut block.stmts);
        for at in 0..stmts.len() {
            let mut stmt = stmts[at].clone();
            if stmt_attrs(&stmt).iter().any(is_escape) {
                self.check_escape(&stmt);
                // Not rewritten; its bindings are still in scope after it.
                if let Stmt::Local(local) = &stmt {
                    self.bind_pattern(&local.pat, Origin::Unknown);
                }
                block.stmts.push(stmt);
                continue;
            }
            self.frames.push(Frame {
                visible: self.scope.len(),
                asked: Vec::new(),
            });
            match &mut stmt {
                Stmt::Local(local) => {
                    let closure_called_here = match (&local.pat, local.init.as_ref()) {
                        (Pat::Ident(p), Some(init)) if matches!(&*init.expr, Expr::Closure(_)) => {
                            Self::only_called(&p.ident, &stmts[at + 1..])
                        }
                        _ => false,
                    };
                    self.visit_local_as(local, closure_called_here);
                }
                _ => visit_mut::visit_stmt_mut(self, &mut stmt),
            }
            let asked = self.frames.pop().map(|f| f.asked).unwrap_or_default();
            block.stmts.extend(asked);
            block.stmts.push(stmt);
        }
        self.scope.truncate(depth);
    }

    fn visit_local_mut(&mut self, local: &mut Local) {
        self.visit_local_as(local, false);
    }

    fn visit_expr_mut(&mut self, expr: &mut Expr) {
        match expr {
            Expr::Path(path) if self.claim && path.qself.is_none() => {
                // Every mention of claim mode's `NoConnection` is asked, wherever it is.
                if let Some(name) = path.path.get_ident()
                    && self
                        .lookup(name)
                        .is_some_and(|(_, b)| b.origin == Origin::NoConnection)
                {
                    let (first, last) = spans(&*path);
                    let mut args = Group::new(Delimiter::Parenthesis, path.to_token_stream());
                    args.set_span(last);
                    *expr = syn::parse2(
                        quote_spanned!(first=> ::inbox_diesel::__private::no_connection! #args),
                    )
                    .expect("a question parses as an expression");
                }
            }
            Expr::Closure(closure) => self.visit_closure_as(closure, Origin::Unknown),
            Expr::MethodCall(call) => self.visit_method_call(call),
            Expr::Call(call) => self.visit_call(call),
            Expr::Macro(mac) => self.visit_macro(&mut mac.mac),
            Expr::Struct(literal) => {
                for field in literal.fields.iter_mut() {
                    self.visit_expr_mut(&mut field.expr);
                    let before = field.expr.to_token_stream().to_string();
                    self.hand(&mut field.expr, Handed::ByValue);
                    if field.colon_token.is_none()
                        && field.expr.to_token_stream().to_string() != before
                    {
                        field.colon_token = Some(Default::default());
                    }
                }
                if let Some(rest) = &mut literal.rest {
                    self.visit_expr_mut(rest);
                }
            }
            Expr::Tuple(tuple) => {
                for elem in tuple.elems.iter_mut() {
                    self.visit_expr_mut(elem);
                    self.hand(elem, Handed::ByValue);
                }
            }
            Expr::Array(array) => {
                for elem in array.elems.iter_mut() {
                    self.visit_expr_mut(elem);
                    self.hand(elem, Handed::ByValue);
                }
            }
            Expr::Repeat(repeat) => {
                self.visit_expr_mut(&mut repeat.expr);
                self.hand(&mut repeat.expr, Handed::ByValue);
            }
            Expr::Assign(assign) => {
                self.visit_expr_mut(&mut assign.left);
                self.visit_expr_mut(&mut assign.right);
                self.hand(&mut assign.right, Handed::ByValue);
            }
            Expr::If(branch) => {
                let depth = self.scope.len();
                self.visit_expr_mut(&mut branch.cond);
                self.visit_block_mut(&mut branch.then_branch);
                self.scope.truncate(depth);
                if let Some((_, otherwise)) = &mut branch.else_branch {
                    self.visit_expr_mut(otherwise);
                }
            }
            Expr::While(looped) => {
                let depth = self.scope.len();
                self.visit_expr_mut(&mut looped.cond);
                self.visit_block_mut(&mut looped.body);
                self.scope.truncate(depth);
            }
            Expr::Let(test) => {
                self.visit_expr_mut(&mut test.expr);
                let origin = self.origin(&test.expr);
                self.bind_pattern(&test.pat, origin);
            }
            Expr::ForLoop(looped) => {
                self.visit_expr_mut(&mut looped.expr);
                let depth = self.scope.len();
                self.bind_pattern(&looped.pat, Origin::Unknown);
                self.visit_block_mut(&mut looped.body);
                self.scope.truncate(depth);
            }
            Expr::Match(matched) => {
                self.visit_expr_mut(&mut matched.expr);
                let origin = self.origin(&matched.expr);
                for arm in matched.arms.iter_mut() {
                    self.visit_arm(arm, origin.clone());
                }
            }
            _ => visit_mut::visit_expr_mut(self, expr),
        }
    }

    fn visit_stmt_macro_mut(&mut self, mac: &mut syn::StmtMacro) {
        self.visit_macro(&mut mac.mac);
    }

    /// A nested item is its own world: its statements run wherever its caller says. A
    /// `macro_rules!` defined in the body is the body's code: its transcribers are rewritten.
    fn visit_item_mut(&mut self, item: &mut syn::Item) {
        if let syn::Item::Macro(item) = item
            && item.mac.path.is_ident("macro_rules")
        {
            item.mac.tokens = self.macro_rules(item.mac.tokens.clone());
        }
    }
}

impl Guard {
    fn visit_local_as(&mut self, local: &mut Local, closure_called_here: bool) {
        let mut origin = Origin::Unknown;
        if let Some(init) = &mut local.init {
            match &mut *init.expr {
                Expr::Closure(closure) if closure_called_here => {
                    self.visit_closure_as(closure, Origin::CheckedAtCalls)
                }
                _ => self.visit_expr_mut(&mut init.expr),
            }
            origin = self.origin(&init.expr);
            if let Some((_, diverge)) = &mut init.diverge {
                self.visit_expr_mut(diverge);
            }
        }
        self.bind_pattern(&local.pat, origin);
    }

    fn visit_arm(&mut self, arm: &mut Arm, origin: Origin) {
        let depth = self.scope.len();
        match &mut arm.pat {
            Pat::Guard(guarded) => {
                self.bind_pattern(&guarded.pat, origin);
                self.in_frame(&mut guarded.guard);
            }
            pat => self.bind_pattern(pat, origin),
        }
        self.in_frame(&mut arm.body);
        self.scope.truncate(depth);
    }

    fn visit_method_call(&mut self, call: &mut ExprMethodCall) {
        self.visit_expr_mut(&mut call.receiver);
        let method = call.method.to_string();
        let hands_over = TRANSACTION_METHODS.contains(&method.as_str())
            && self.origin(receiver_root(&call.receiver)) == Origin::Transaction;
        self.hand(&mut call.receiver, Handed::ByPlace);
        self.visit_arguments(&mut call.args, hands_over);
    }

    fn visit_call(&mut self, call: &mut ExprCall) {
        self.visit_expr_mut(&mut call.func);
        // `Connection::transaction(conn, |c| …)`.
        let hands_over = match &*call.func {
            Expr::Path(path) => path.path.segments.last().is_some_and(|s| {
                TRANSACTION_METHODS.contains(&s.ident.to_string().as_str())
                    && call
                        .args
                        .first()
                        .is_some_and(|c| self.origin(c) == Origin::Transaction)
            }),
            _ => false,
        };
        self.visit_arguments(&mut call.args, hands_over);
    }

    /// The rules of a `macro_rules!` defined in the body, each transcriber rewritten like the
    /// body, its metavariables standing for whatever the caller passes. A transcriber with a
    /// repetition (`$(…)*`) does not parse as Rust and is left as written (see the limits on
    /// `idempotent`).
    fn macro_rules(&mut self, rules: TokenStream) -> TokenStream {
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

    fn transcriber(&mut self, tokens: TokenStream) -> Option<TokenStream> {
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

    fn check_escape(&mut self, stmt: &Stmt) {
        for attr in stmt_attrs(stmt).iter().filter(|a| is_escape(a)) {
            if let Err(error) = escape_reason(attr) {
                self.push_error(error);
            }
        }
    }
}

/// The prefix that stands for `$` in a transcriber while it is parsed as Rust.
const METAVARIABLE: &str = "__inbox_metavariable_";

/// `$name` → `__inbox_metavariable_name`; `None` for a repetition, which does not parse.
fn to_placeholders(tokens: TokenStream, names: &mut Vec<Ident>) -> Option<TokenStream> {
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
fn from_placeholders(tokens: TokenStream) -> TokenStream {
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
fn spans(tokens: &dyn ToTokens) -> (Span, Span) {
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
fn is_question(mac: &syn::Macro) -> bool {
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

/// `Some`, `Ok`, `Err`: the value they wrap is the value a pattern of them takes apart.
fn is_variant_constructor(func: &Expr) -> bool {
    matches!(func, Expr::Path(path) if path.path.get_ident().is_some_and(|name| name == "Some" || name == "Ok" || name == "Err"))
}

/// What kind of place an expression is: a receiver that is a place is auto-referenced, so
/// it is asked by reference before the statement rather than moved into a question.
#[derive(PartialEq)]
enum Place {
    /// A value, not a place.
    No,
    /// A name, and fields, dereferences and indexes (by a literal or a name) of it: asking
    /// about it by reference evaluates nothing twice.
    Simple,
    /// A place indexed by an expression that would be evaluated twice.
    Indexed,
}

fn place(expr: &Expr) -> Place {
    match expr {
        Expr::Paren(e) => place(&e.expr),
        Expr::Group(e) => place(&e.expr),
        Expr::Path(path) if path.qself.is_none() && path.path.get_ident().is_some() => {
            Place::Simple
        }
        Expr::Field(field) => place(&field.base),
        Expr::Unary(e) if matches!(e.op, UnOp::Deref(_)) => place(&e.expr),
        Expr::Index(index) => match (place(&index.expr), &*index.index) {
            (Place::No, _) => Place::No,
            (Place::Simple, Expr::Lit(_)) => Place::Simple,
            (Place::Simple, Expr::Path(p)) if p.path.get_ident().is_some() => Place::Simple,
            _ => Place::Indexed,
        },
        _ => Place::No,
    }
}

/// The name a place starts from.
fn place_root(expr: &Expr) -> Option<&Ident> {
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

/// The expression a method chain starts from: `conn` in `conn.build_transaction().run(…)`.
fn receiver_root(expr: &Expr) -> &Expr {
    match expr {
        Expr::MethodCall(call) => receiver_root(&call.receiver),
        Expr::Paren(e) => receiver_root(&e.expr),
        _ => expr,
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
        Pat::Or(p) => {
            // Every alternative binds the same names.
            if let Some(first) = p.cases.first() {
                collect_pattern_names(first, out);
            }
        }
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
