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
//! array element, an assignment's right side, a macro's argument (an expression, or every
//! name of the body's in a piece that is not one, such as `audit!(db: "x")`; a name bound in
//! the macro's own statement, by a `let` chain or a `match` guard, asked in a block before
//! the macro), and every parameter besides the connection — is asked, at its concrete type,
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

use proc_macro2::{Delimiter, Group, Spacing, Span, TokenStream, TokenTree};
use quote::{ToTokens, quote, quote_spanned};
use syn::punctuated::Punctuated;
use syn::visit::Visit;
use syn::visit_mut::{self, VisitMut};
use syn::{
    Arm, Attribute, Block, Expr, ExprCall, ExprClosure, ExprMethodCall, FnArg, Ident, ItemFn,
    LitStr, Local, Member, Pat, Stmt, Token, UnOp,
};

use crate::valid::Mode;

/// Methods that hand the closure they are given the connection they are called on, inside a
/// transaction (diesel's and diesel-async's `Connection` and `TransactionBuilder`, and the
/// `SyncConnectionWrapper`'s `spawn_blocking`).
const TRANSACTION_METHODS: [&str; 6] = [
    "transaction",
    "immediate_transaction",
    "exclusive_transaction",
    "run",
    "test_transaction",
    // diesel-async's `SyncConnectionWrapper`: the wrapped connection, on a blocking thread.
    "spawn_blocking",
];

/// diesel's and diesel-async's connection traits and types, whose transaction methods
/// (`Connection::transaction(conn, |c| …)`) hand the closure the connection they are given.
/// A type of the application's own, whatever its name, is not trusted.
const CONNECTION_TYPES: [&str; 8] = [
    "Connection",
    "AsyncConnection",
    "SqliteConnection",
    "PgConnection",
    "MysqlConnection",
    "AsyncPgConnection",
    "AsyncMysqlConnection",
    "SyncConnectionWrapper",
];

/// The methods of diesel's `TransactionBuilder` between `conn.build_transaction()` and its
/// `run(…)`.
const BUILDER_METHODS: [&str; 8] = [
    "build_transaction",
    "read_only",
    "read_write",
    "deferrable",
    "not_deferrable",
    "serializable",
    "repeatable_read",
    "read_committed",
];

/// Macros of the standard library that bind no name of the caller's, besides the
/// [`FORMATTING_MACROS`] (which bind none either).
const STANDARD_MACROS: [&str; 3] = ["dbg", "matches", "vec"];

/// The checkouts of r2d2's, deadpool's and bb8's pools: a pool is allowed as their receiver,
/// since a checkout runs no statement. What it gives is asked wherever it is handed on.
const CHECKOUT_METHODS: [&str; 6] = [
    "get",
    "get_timeout",
    "try_get",
    "timeout_get",
    "get_owned",
    "dedicated_connection",
];

/// diesel's and diesel-async's `RunQueryDsl` methods that run a query and return its rows:
/// the connection they are given may be another one when the query is a `SELECT` built by
/// diesel's query builder, which the question asks of the query's type.
const READ_METHODS: [&str; 4] = ["load", "get_result", "get_results", "first"];

/// Functions and methods that run a closure or a future on another thread or task
/// (`std::thread::spawn`, `thread::Builder::spawn`, `thread::scope`'s `spawn`,
/// `tokio::spawn`, `spawn_blocking`, `spawn_local`, a `JoinSet`'s): what the closure
/// captures is asked, since neither the transaction nor the run-time net follows it there.
const SPAWN_FUNCTIONS: [&str; 3] = ["spawn", "spawn_blocking", "spawn_local"];

/// Macros of the standard library and of `tracing` that only format, compare or log their
/// arguments: what they are given is not handed on (`info!(score, …)`, of a value whose
/// type a later line settles), though what it computes is asked as anywhere else.
const FORMATTING_MACROS: [&str; 26] = [
    "assert",
    "assert_eq",
    "assert_ne",
    "debug_assert",
    "debug_assert_eq",
    "debug_assert_ne",
    "eprint",
    "eprintln",
    "format",
    "format_args",
    "panic",
    "print",
    "println",
    "todo",
    "unimplemented",
    "unreachable",
    "write",
    "writeln",
    "trace",
    "debug",
    "info",
    "warn",
    "error",
    "event",
    "span",
    "info_span",
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
    /// A closure whose parameters are [`Origin::CheckedAtCalls`]: the body only calls it,
    /// or hands it to a transaction method of the transaction, which gives it the
    /// transaction.
    CalledClosure,
    /// A handler parameter, asked at the top of the body (a connection is refused there, a
    /// pool is not: it may be a replica's) and wherever it is handed on.
    Parameter,
    /// Claim mode: the `NoConnection` the body is given; every mention of it is asked.
    NoConnection,
    /// A tuple, or `Some`/`Ok`/`Err` of a value: where each part comes from.
    Parts(Vec<Origin>),
    /// A struct literal: where each field comes from.
    Fields(Vec<(String, Origin)>),
    /// A tuple struct of the application's around one value (`Tx(conn)`): `.0`, its
    /// pattern and its `Deref` give the value back; its methods are the application's code.
    Newtype(Box<Origin>),
    /// A path that names no local binding and is not written in upper case as statics are:
    /// a unit struct, a variant, a function. None of them can be a connection value.
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
                | Origin::CalledClosure
                | Origin::Parts(_)
                | Origin::Fields(_)
                | Origin::Newtype(_)
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
    /// A method's receiver, which may be auto-referenced: a place is asked by reference
    /// before the statement; any other value in place.
    ByPlace,
    /// A macro's argument: as a receiver, since the macro may take it by reference.
    InMacro,
    /// An element of a struct, tuple, array or `Some(…)` in a `let`'s initializer, where a
    /// reference to a temporary keeps the temporary alive as long as the binding.
    Extending,
}

impl Handed {
    /// How the elements of a literal are handed on, in an extending position or not.
    fn element(extending: bool) -> Handed {
        match extending {
            true => Handed::Extending,
            false => Handed::ByValue,
        }
    }
}

pub fn instrument(function: &mut ItemFn, conn: &Ident, mode: Mode) -> syn::Result<()> {
    let claim = matches!(mode, Mode::Claim { .. });
    let mut guard = Guard {
        conn: conn.clone(),
        claim,
        scope: Vec::new(),
        parameter_bound: false,
        frames: Vec::new(),
        receiver_question: None,
        macro_questions: Vec::new(),
        closure_tail: false,
        extending: false,
        kind: Kind::Plain,
        formatting: false,
        read_asked: false,
        error: None,
    };
    let mut asked = Vec::new();
    for input in &function.sig.inputs {
        let names = match input {
            FnArg::Receiver(receiver) => vec![Ident::new("self", receiver.self_token.span)],
            FnArg::Typed(typed) => pattern_names(&typed.pat),
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
            // A pool parameter is a replica's, maybe: what is checked out of it is asked
            // wherever it is handed on, and so is the pool itself.
            guard.kind = Kind::Checkout;
            asked.push(guard.ask_place(&syn::parse_quote!(#name), false));
            guard.kind = Kind::Plain;
            guard.bind(name, Origin::Parameter);
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
    /// The question about the receiver of the method call being rewritten, when it cannot be
    /// asked before the statement, and the `let`s of the receiver's indexes it needs.
    receiver_question: Option<Vec<Stmt>>,
    /// Questions about a macro's arguments that are bound in the macro's own statement (a
    /// `let` chain, a `match` guard): asked in a block of their own, `{ vet!(…); m!(…) }`.
    macro_questions: Vec<Stmt>,
    /// The next block visited is the value of a `let` of closures the body only calls: its
    /// tail's closures are given their parameters' values at the calls.
    closure_tail: bool,
    /// The expression about to be visited is an element of a literal in a `let`'s
    /// initializer (see `Handed::Extending`).
    extending: bool,
    /// The question asked of the value being handed on, in transaction mode.
    kind: Kind,
    /// The macro being visited only formats, compares or logs its arguments
    /// ([`FORMATTING_MACROS`]).
    formatting: bool,
    /// A question about the connection of a read ([`Kind::Read`]) was written: the method
    /// call is rewritten to bind the query's type.
    read_asked: bool,
    error: Option<syn::Error>,
}

/// Which question transaction mode asks of a value.
#[derive(Clone)]
enum Kind {
    /// Not a connection or a pool other than the transaction.
    Plain,
    /// The receiver of a pool's checkout: a pool is allowed.
    Checkout,
    /// The connection a query is run on: another connection is allowed for a `SELECT`
    /// built by diesel's query builder, whose type is bound to this name.
    Read(Ident),
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
                // A mutable tuple, `Option` or struct can be refilled by a value that is not
                // itself a connection (`o = other.as_deref_mut()`): only the parts of an
                // immutable one stay what they were bound to.
                let origin = match (&origin, p.mutability.is_some() || p.by_ref.is_some()) {
                    (Origin::Parts(_) | Origin::Fields(_) | Origin::Newtype(_), true) => {
                        Origin::Unknown
                    }
                    _ => origin,
                };
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
            (Pat::TupleStruct(p), Origin::Newtype(inner)) if p.elems.len() == 1 => {
                self.bind_pattern(&p.elems[0], (**inner).clone());
            }
            // The transaction taken apart by its variant: an application's enum of
            // connections (`DbConn::Sqlite(c)`, diesel's `MultiConnection`) holds one
            // connection per variant, the one the handler's transaction is open on. (A
            // connection of one backend has no variant to match.)
            (Pat::TupleStruct(p), Origin::Transaction) if p.elems.len() == 1 => {
                self.bind_pattern(&p.elems[0], Origin::Transaction);
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
        self.origin_in(expr, None)
    }

    /// Where a value comes from, a name bound by an arm's pattern (`over`) taking the
    /// origin of the part of the scrutinee it binds.
    fn origin_in(&self, expr: &Expr, over: Option<(&Ident, &Origin)>) -> Origin {
        match expr {
            Expr::Paren(e) => self.origin_in(&e.expr, over),
            Expr::Group(e) => self.origin_in(&e.expr, over),
            Expr::Reference(e) => match self.origin_in(&e.expr, over) {
                // A reference to a static may be to a pool or a connection behind a lock.
                Origin::NotLocal => Origin::Unknown,
                origin => origin,
            },
            Expr::Unary(e) if matches!(e.op, UnOp::Deref(_)) => match self.origin_in(&e.expr, over)
            {
                // What a static points to may be a pool or a connection (`*AUDIT_POOL`).
                Origin::NotLocal => Origin::Unknown,
                origin => origin,
            },
            // `&mut *conn as &mut dyn SimpleConnection`: the value cast.
            Expr::Cast(cast) => self.origin_in(&cast.expr, over),
            Expr::Path(path) if path.qself.is_none() => match path.path.get_ident() {
                Some(name) if over.is_some_and(|(bound, _)| bound == name) => {
                    over.map(|(_, origin)| origin.clone()).expect("checked")
                }
                Some(name) => match self.lookup(name) {
                    Some((_, binding)) => binding.origin.clone(),
                    // A lower-case name bound nowhere the guard sees may be a local a macro
                    // bound; a static, a constant or a type is named in upper case.
                    None if is_lower_case(name) => Origin::Unknown,
                    // A static may be a pool (`POOL.bump()`, `audit!(POOL)`).
                    None if is_screaming(name) => Origin::Unknown,
                    None => Origin::NotLocal,
                },
                None if path
                    .path
                    .segments
                    .last()
                    .is_some_and(|last| is_screaming(&last.ident)) =>
                {
                    Origin::Unknown
                }
                None => Origin::NotLocal,
            },
            Expr::Field(field) => match self.origin_in(&field.base, over) {
                Origin::Parts(parts) => match &field.member {
                    Member::Unnamed(index) => parts
                        .get(index.index as usize)
                        .cloned()
                        .unwrap_or(Origin::Unknown),
                    Member::Named(_) => Origin::Unknown,
                },
                Origin::Newtype(inner) => match &field.member {
                    Member::Unnamed(index) if index.index == 0 => *inner,
                    _ => Origin::Unknown,
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
            // No method's result is taken for the transaction by its name: a method of the
            // application's own could return another connection under any name.
            // A branch that diverges (`return`, `break`, `panic!`) yields nothing.
            Expr::If(branch) => match &branch.else_branch {
                // `if let … = … { name }`: the branch's names may be the pattern's.
                Some(_) if binds_names(&branch.cond) => Origin::Unknown,
                Some((_, otherwise)) => {
                    let then = Expr::Block(syn::ExprBlock {
                        attrs: Vec::new(),
                        label: None,
                        block: branch.then_branch.clone(),
                    });
                    match (diverges(&then), diverges(otherwise)) {
                        (true, false) => self.origin_in(otherwise, over),
                        (false, true) => self.origin_of_block(&branch.then_branch, over),
                        _ => same(
                            self.origin_of_block(&branch.then_branch, over),
                            self.origin_in(otherwise, over),
                        ),
                    }
                }
                None => Origin::Unknown,
            },
            // A labeled block's value may also come from a `break 'label value` inside it.
            Expr::Block(block) if block.label.is_some() && breaks_with_value(&block.block) => {
                Origin::Unknown
            }
            Expr::Block(block) => self.origin_of_block(&block.block, over),
            // An arm's value is judged with the arm's own bindings: a name the pattern binds
            // is not the outer binding of that name.
            Expr::Match(matched) => {
                let scrutinee = self.origin_in(&matched.expr, over);
                matched
                    .arms
                    .iter()
                    .filter(|arm| !diverges(&arm.body))
                    .map(|arm| self.origin_in_arm(&arm.pat, &scrutinee, &arm.body))
                    .reduce(same)
                    .unwrap_or(Origin::Unknown)
            }
            Expr::Call(call)
                if call.args.len() == 1
                    && (is_std_variant(&call.func) || is_wrapper_constructor(&call.func)) =>
            {
                Origin::Parts(vec![self.origin_in(&call.args[0], over)])
            }
            // A newtype of the application's (`Tx(conn)`) is followed only around the
            // transaction: an upper-case name may also be a function that returns anything.
            Expr::Call(call)
                if call.args.len() == 1
                    && is_variant_constructor(&call.func)
                    && self.origin_in(&call.args[0], over) == Origin::Transaction =>
            {
                Origin::Newtype(Box::new(Origin::Transaction))
            }
            // What a wrapper built in the body from the transaction gives back is the
            // transaction (`cell.borrow_mut()`, `slot.as_deref_mut().unwrap()`).
            Expr::MethodCall(call)
                if ACCESSORS.contains(&call.method.to_string().as_str())
                    && matches!(self.origin_in(&call.receiver, over), Origin::Parts(ref parts)
                        if parts.len() == 1 && parts[0] == Origin::Transaction) =>
            {
                Origin::Parts(vec![Origin::Transaction])
            }
            Expr::Macro(mac) if is_question(&mac.mac) => Origin::Asked,
            Expr::Tuple(tuple) => Origin::Parts(
                tuple
                    .elems
                    .iter()
                    .map(|e| self.origin_in(e, over))
                    .collect(),
            ),
            Expr::Struct(literal) => {
                let mut fields: Vec<(String, Origin)> = literal
                    .fields
                    .iter()
                    .filter_map(|field| match &field.member {
                        Member::Named(name) => {
                            Some((name.to_string(), self.origin_in(&field.expr, over)))
                        }
                        Member::Unnamed(_) => None,
                    })
                    .collect();
                match literal
                    .rest
                    .as_deref()
                    .map(|rest| self.origin_in(rest, over))
                {
                    None => Origin::Fields(fields),
                    // `..base`: the fields not written come from `base`.
                    Some(Origin::Fields(base)) => {
                        for (name, origin) in base {
                            if !fields.iter().any(|(n, _)| *n == name) {
                                fields.push((name, origin));
                            }
                        }
                        Origin::Fields(fields)
                    }
                    Some(_) => Origin::Unknown,
                }
            }
            _ => Origin::Unknown,
        }
    }

    /// Where an arm's value comes from, the arm's pattern taking `scrutinee` apart. A value
    /// that mentions a name the pattern binds comes from that binding: the scrutinee's part
    /// for `Some(n) => n`, `Ok(n) => n`, `n => n` (and `&mut *n`), unknown otherwise.
    fn origin_in_arm(&self, pat: &Pat, scrutinee: &Origin, body: &Expr) -> Origin {
        let bound = pattern_names(pat);
        if bound.is_empty() || !mentions_any(body, &bound) {
            return self.origin(body);
        }
        let pat = match pat {
            Pat::Guard(guarded) => &*guarded.pat,
            pat => pat,
        };
        let part = match (pat, scrutinee) {
            (Pat::Ident(p), origin) if p.subpat.is_none() => Some((&p.ident, origin.clone())),
            (Pat::TupleStruct(p), Origin::Parts(parts))
                if p.elems.len() == 1 && parts.len() == 1 =>
            {
                match &p.elems[0] {
                    Pat::Ident(inner) if inner.subpat.is_none() => {
                        Some((&inner.ident, parts[0].clone()))
                    }
                    _ => None,
                }
            }
            (Pat::TupleStruct(p), Origin::Newtype(inner)) if p.elems.len() == 1 => {
                match &p.elems[0] {
                    Pat::Ident(name) if name.subpat.is_none() => {
                        Some((&name.ident, (**inner).clone()))
                    }
                    _ => None,
                }
            }
            _ => None,
        };
        // The value judged as anywhere else, the bound name standing for its part: `d =>
        // d` is the scrutinee's, `d => d.checkout()` is a method's result.
        match part {
            Some((name, origin)) if bound.len() == 1 => self.origin_in(body, Some((name, &origin))),
            _ => Origin::Unknown,
        }
    }

    /// A block that is only a value: where that value comes from.
    fn origin_of_block(&self, block: &Block, over: Option<(&Ident, &Origin)>) -> Origin {
        match block.stmts.as_slice() {
            [Stmt::Expr(tail, None)] => self.origin_in(tail, over),
            _ => Origin::Unknown,
        }
    }

    /// Whether a value of this shape can only be something other than a connection: a
    /// literal, a closure, arithmetic, a comparison, a numeric cast, a range, an array, tuple or
    /// struct literal (whose parts are asked one by one), or one of our own questions.
    fn is_plainly_not_a_connection(&self, expr: &Expr) -> bool {
        match expr {
            Expr::Paren(e) => self.is_plainly_not_a_connection(&e.expr),
            // A cast to a reference or a pointer (`&mut *c as &mut dyn SimpleConnection`) may
            // be a connection; a numeric cast cannot.
            Expr::Cast(cast) => !matches!(
                &*cast.ty,
                syn::Type::Reference(_)
                    | syn::Type::Ptr(_)
                    | syn::Type::Paren(_)
                    | syn::Type::Group(_)
            ),
            Expr::Lit(_)
            | Expr::Infer(_)
            | Expr::Closure(_)
            | Expr::Binary(_)
            | Expr::Range(_)
            | Expr::Array(_)
            | Expr::Tuple(_)
            | Expr::Struct(_)
            | Expr::Async(_) => true,
            Expr::Unary(e) => !matches!(e.op, UnOp::Deref(_)),
            Expr::Macro(mac) => is_question(&mac.mac) || is_literal_macro(&mac.mac),
            _ => false,
        }
    }

    /// Asks about a value handed on, replacing it by the question where it is asked in place.
    fn hand(&mut self, expr: &mut Expr, handed: Handed) {
        if self.is_plainly_not_a_connection(expr) {
            return;
        }
        // A cast to a reference or a pointer (`&mut c as &mut dyn Any`): the value cast is
        // asked, at its own type, before it is erased.
        if let Expr::Cast(cast) = expr {
            return self.hand(&mut cast.expr, handed);
        }
        let origin = self.origin(expr);
        if origin.is_settled() {
            return;
        }
        // A name in a macro's arguments that is bound nowhere the guard sees may be one the
        // macro binds itself (`tokio::select! { r = fut => … }`), not a value.
        if handed == Handed::InMacro
            && let Expr::Path(path) = &*expr
            && path
                .path
                .get_ident()
                .is_some_and(|name| self.lookup(name).is_none() && !is_screaming(name))
        {
            return;
        }
        let shadowed = self.shadows(expr);
        match handed {
            Handed::ByPlace | Handed::InMacro if place(expr) == Place::Simple => {
                // A static is visible everywhere; a binding from where it was bound.
                let bound_at = place_root(expr)
                    .and_then(|root| self.lookup(root))
                    .map(|(at, _)| at);
                let question = self.ask_place(expr, shadowed);
                match self.frames.last_mut() {
                    Some(frame) if bound_at.is_none_or(|at| at < frame.visible) => {
                        frame.asked.push(question)
                    }
                    // Bound inside the statement itself (a `let` chain, a `match` guard): the
                    // method call is asked about in a block of its own, `{ vet!(…); c.m() }`.
                    _ if handed == Handed::ByPlace => self.receiver_question = Some(vec![question]),
                    _ => self.macro_questions.push(question),
                }
            }
            // A receiver indexed by a call (`conns[next()].execute(…)`): each index is
            // computed once, in a `let` of the block around the call, and the place asked
            // with those values.
            Handed::ByPlace if place(expr) == Place::Indexed => {
                let mut lets = Vec::new();
                hoist_indexes(expr, &mut lets);
                lets.push(self.ask_place(expr, shadowed));
                self.receiver_question = Some(lets);
            }
            // Asked in place, it would be moved out of its container; asked before the
            // macro, its index would run where the macro may not run it. See the limits on
            // `idempotent`.
            Handed::InMacro if place(expr) == Place::Indexed => {}
            // `&value`: the value is asked and the reference kept outside, so that a
            // temporary it borrows lives as long as it did (`S { f: &format!(…) }` in a `let`).
            _ => match expr {
                Expr::Reference(reference)
                    if handed == Handed::Extending && place(&reference.expr) == Place::No =>
                {
                    *reference.expr = self.ask(&reference.expr, shadowed)
                }
                _ => *expr = self.ask(expr, shadowed),
            },
        }
    }

    /// A value a `let` coerces to a trait object, asked at its own type: a place before
    /// the statement, `&mut place` as `&mut *vet!(&mut place)` (the dereference takes no
    /// expected type, so the question's is the reference's own, and the reborrow borrows
    /// what it did), `&mut value` as `&mut vet!(value)` (a temporary kept alive as long as
    /// the binding).
    fn hand_erased(&mut self, expr: &mut Expr) {
        if self.is_plainly_not_a_connection(expr) || self.origin(expr).is_settled() {
            return;
        }
        match expr {
            Expr::Reference(reference) if place(&reference.expr) == Place::Simple => {
                let (and, mutability) = (reference.and_token, reference.mutability);
                let question = self.ask(expr, self.shadows(expr));
                *expr = syn::parse_quote!(#and #mutability *#question);
            }
            Expr::Reference(_) => self.hand(expr, Handed::Extending),
            _ if place(expr) == Place::Simple => self.hand(expr, Handed::ByPlace),
            _ => self.hand(expr, Handed::ByValue),
        }
    }

    /// Whether the value's root is a name that shadows the connection parameter.
    fn shadows(&self, expr: &Expr) -> bool {
        place_root(expr)
            .and_then(|root| self.lookup(root))
            .is_some_and(|(_, binding)| binding.shadows)
    }

    /// `vet!(expr)`, spanned at the expression, so that the compiler's message points there.
    fn ask(&mut self, expr: &Expr, shadowed: bool) -> Expr {
        if matches!(self.kind, Kind::Read(_)) && !self.claim && !shadowed {
            self.read_asked = true;
        }
        let tokens = self.question(expr.to_token_stream(), shadowed);
        syn::parse2(tokens).expect("a question parses as an expression")
    }

    /// `vet!(&place);`, asked before the statement.
    fn ask_place(&self, place: &Expr, shadowed: bool) -> Stmt {
        let (first, _) = spans(place);
        let marker = quote_spanned!(first=> @place);
        let tokens = self.question(quote!(#marker #place), shadowed);
        syn::parse2(quote!(#tokens;)).expect("a question parses as a statement")
    }

    fn question(&self, value: TokenStream, shadowed: bool) -> TokenStream {
        let (first, last) = spans(&value);
        let (name, value) = match (self.claim, shadowed, &self.kind) {
            (true, _, _) => ("vet_claim", value),
            (false, true, _) => ("vet_shadowed", value),
            (false, false, Kind::Plain) => ("vet", value),
            (false, false, Kind::Checkout) => ("vet_checkout", value),
            (false, false, Kind::Read(query)) => ("vet_read", quote!(#query, #value)),
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
        self.visit_arguments_as(args, hands_over, Kind::Plain)
    }

    /// The arguments, each asked with the question `kind` (a read's connection).
    fn visit_arguments_as(
        &mut self,
        args: &mut Punctuated<Expr, Token![,]>,
        hands_over: bool,
        kind: Kind,
    ) {
        let extending = std::mem::take(&mut self.extending);
        for arg in args.iter_mut() {
            match arg {
                Expr::Closure(closure) => {
                    let origin = match hands_over {
                        true => Origin::Transaction,
                        false => Origin::Unknown,
                    };
                    self.visit_closure_as(closure, origin);
                }
                Expr::Path(path)
                    if !hands_over
                        && let Some(name) = path.path.get_ident()
                        && self
                            .lookup(name)
                            .is_some_and(|(_, b)| b.origin == Origin::CalledClosure) =>
                {
                    self.push_error(syn::Error::new_spanned(
                        &*path,
                        format!(
                            "#[idempotent] trusts the parameters of `{name}` because each call \
                             hands it a connection the guard checks; here it is handed to a \
                             call that is not a transaction method of the handler's transaction \
                             and may give it another connection: call it, or hand it to \
                             `conn.transaction({name})` on the handler's connection"
                        ),
                    ));
                }
                _ => {
                    self.extending = extending;
                    self.visit_expr_mut(arg);
                    let outer = std::mem::replace(&mut self.kind, kind.clone());
                    self.hand(arg, Handed::element(extending));
                    self.kind = outer;
                }
            }
        }
    }

    /// A macro invocation: arguments that parse as expressions are visited and asked.
    fn visit_macro(&mut self, mac: &mut syn::Macro) {
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

    fn visit_macro_arguments(&mut self, mac: &mut syn::Macro, patterns: bool) {
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

    fn macro_part(&mut self, part: TokenStream) -> TokenStream {
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
    fn rewrite_blocks(&mut self, tokens: TokenStream) -> TokenStream {
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
    fn ask_names_in(&mut self, tokens: TokenStream) {
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

    fn macro_argument(&mut self, arg: &mut Expr) {
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
    fn rebound_by(&mut self, mac: &syn::Macro) {
        let name = mac.path.segments.last().map(|s| s.ident.to_string());
        if name.is_some_and(|n| {
            STANDARD_MACROS.contains(&n.as_str()) || FORMATTING_MACROS.contains(&n.as_str())
        }) {
            return;
        }
        self.rebound_in(mac.tokens.clone());
    }

    fn rebound_in(&mut self, tokens: TokenStream) {
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

    /// Whether every later mention of `name` in `rest` calls it: then what its parameters
    /// are given is asked at those calls.
    fn only_called(name: &Ident, rest: &[Stmt]) -> bool {
        struct Mentions<'n> {
            name: &'n Ident,
            called: usize,
            all: usize,
        }
        impl Mentions<'_> {
            fn is_name(&self, expr: Option<&Expr>) -> bool {
                matches!(expr, Some(Expr::Path(path)) if path.path.is_ident(self.name))
            }
        }
        impl<'ast> Visit<'ast> for Mentions<'_> {
            fn visit_expr_call(&mut self, call: &'ast ExprCall) {
                if let Expr::Path(path) = &*call.func
                    && path.path.is_ident(self.name)
                {
                    self.called += 1;
                }
                // `Connection::transaction(conn, name)`: whether `conn` is the transaction is
                // checked where the call is visited.
                if let Expr::Path(path) = &*call.func
                    && let [.., owner, method] = segments(&path.path).as_slice()
                    && CONNECTION_TYPES.contains(&owner.as_str())
                    && TRANSACTION_METHODS.contains(&method.as_str())
                    && call.args.len() == 2
                    && self.is_name(call.args.last())
                {
                    self.called += 1;
                }
                syn::visit::visit_expr_call(self, call);
            }
            fn visit_expr_method_call(&mut self, call: &'ast ExprMethodCall) {
                // `conn.transaction(name)`, checked where the call is visited.
                if TRANSACTION_METHODS.contains(&call.method.to_string().as_str())
                    && call.args.len() == 1
                    && self.is_name(call.args.first())
                {
                    self.called += 1;
                }
                syn::visit::visit_expr_method_call(self, call);
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
                self.all += mentions(mac.tokens.clone(), self.name);
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
        let closure_tail = std::mem::take(&mut self.closure_tail);
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
                    let name = match &local.pat {
                        Pat::Ident(p) => Some(&p.ident),
                        Pat::Type(typed) => match &*typed.pat {
                            Pat::Ident(p) => Some(&p.ident),
                            _ => None,
                        },
                        _ => None,
                    };
                    let closure_called_here = match (name, local.init.as_ref()) {
                        (Some(name), Some(init)) if yields_closures(&init.expr) => {
                            Self::only_called(name, &stmts[at + 1..])
                        }
                        _ => false,
                    };
                    self.visit_local_as(local, closure_called_here);
                    // A mutable tuple, `Option` or struct keeps the origins of its parts while
                    // nothing replaces it whole.
                    if let Pat::Ident(p) = &local.pat
                        && p.mutability.is_some()
                        && let Some(init) = &local.init
                        && let origin @ (Origin::Parts(_) | Origin::Fields(_) | Origin::Newtype(_)) =
                            self.origin(&init.expr)
                        && !replaced_whole(&p.ident, &stmts[at + 1..])
                        && let Some(binding) = self.scope.last_mut()
                    {
                        binding.origin = origin;
                    }
                }
                // The block's value, when it is a closure the body only calls.
                Stmt::Expr(tail, None) if closure_tail && at + 1 == stmts.len() => {
                    self.visit_closures_called_later(tail)
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
        // Only the elements of a literal in an extending position are in one themselves.
        let extending = std::mem::take(&mut self.extending);
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
            // What a `return` hands back leaves the body: `return Err(e.into())` runs no
            // statement, and its type may not be settled yet (an `async fn`'s error). What
            // is computed on the way is visited as anywhere else.
            Expr::Return(ret) => match ret.expr.as_deref_mut() {
                Some(Expr::Call(call))
                    if call.args.len() == 1 && is_variant_constructor(&call.func) =>
                {
                    for arg in call.args.iter_mut() {
                        self.visit_expr_mut(arg);
                    }
                }
                Some(value) => self.visit_expr_mut(value),
                None => {}
            },
            // `query.load(conn).await`: the await stays with the call it awaits, in the arm
            // that binds the query's type, with the temporaries the connection borrows.
            Expr::Await(awaited) if matches!(&*awaited.base, Expr::MethodCall(call) if is_read(call)) =>
            {
                let Expr::MethodCall(call) = &mut *awaited.base else {
                    unreachable!("matched above")
                };
                let read = self.visit_method_call(call);
                let question = self.receiver_question.take();
                if let Some(read) = read {
                    let awaited = std::mem::replace(expr, Expr::Verbatim(TokenStream::new()));
                    *expr = bind_query_type(awaited, read);
                }
                if let Some(question) = question {
                    let call = std::mem::replace(expr, Expr::Verbatim(TokenStream::new()));
                    *expr = syn::parse_quote!({ #(#question)* #call });
                }
            }
            Expr::MethodCall(call) => {
                if let Some(read) = self.visit_method_call(call) {
                    let call = std::mem::replace(expr, Expr::Verbatim(TokenStream::new()));
                    *expr = bind_query_type(call, read);
                }
                if let Some(question) = self.receiver_question.take() {
                    let call = std::mem::replace(expr, Expr::Verbatim(TokenStream::new()));
                    *expr = syn::parse_quote!({ #(#question)* #call });
                }
            }
            Expr::Call(call) => {
                self.extending = extending && is_variant_constructor(&call.func);
                self.visit_call(call)
            }
            Expr::Macro(mac) => {
                let outer = std::mem::take(&mut self.macro_questions);
                self.visit_macro(&mut mac.mac);
                let asked = std::mem::replace(&mut self.macro_questions, outer);
                if !asked.is_empty() {
                    let call = std::mem::replace(expr, Expr::Verbatim(TokenStream::new()));
                    *expr = syn::parse_quote!({ #(#asked)* #call });
                }
            }
            Expr::Struct(literal) => {
                for field in literal.fields.iter_mut() {
                    self.extending = extending;
                    self.visit_expr_mut(&mut field.expr);
                    let before = field.expr.to_token_stream().to_string();
                    self.hand(&mut field.expr, Handed::element(extending));
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
                    self.extending = extending;
                    self.visit_expr_mut(elem);
                    self.hand(elem, Handed::element(extending));
                }
            }
            Expr::Array(array) => {
                for elem in array.elems.iter_mut() {
                    self.extending = extending;
                    self.visit_expr_mut(elem);
                    self.hand(elem, Handed::element(extending));
                }
            }
            // `&mut checkout as &mut dyn Store`: the value is asked at its own type, before
            // the cast erases it.
            Expr::Cast(cast) if mentions_trait_object(&cast.ty) => {
                self.visit_expr_mut(&mut cast.expr);
                self.hand_erased(&mut cast.expr);
            }
            // `[value; n]` copies its value (or evaluates a `const` block): a connection is
            // neither `Copy` nor made in a constant.
            Expr::Repeat(repeat) => self.visit_expr_mut(&mut repeat.expr),
            Expr::Assign(assign) => {
                // A destructuring assignee (`(a, b) = …`, `[x, y] = …`, `P { x, y } = …`) is
                // places, not values handed on: only what it computes (an index) is visited.
                match &mut *assign.left {
                    Expr::Tuple(_) | Expr::Array(_) | Expr::Struct(_) | Expr::Call(_) => {
                        self.visit_assignee(&mut assign.left)
                    }
                    left => self.visit_expr_mut(left),
                }
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
        // A macro that is a statement of its own sees only names bound before it: its
        // arguments are asked before the statement, never in a block around it (which would
        // scope what the macro binds).
        let outer = std::mem::take(&mut self.macro_questions);
        self.visit_macro(&mut mac.mac);
        let stray = std::mem::replace(&mut self.macro_questions, outer);
        if !stray.is_empty() {
            self.push_error(syn::Error::new_spanned(
                &mac.mac,
                "#[idempotent] cannot ask what this macro is given: a name in its arguments is \
                 bound where no question can stand before the macro; bind the value with a \
                 `let` of its own before this statement",
            ));
        }
        self.rebound_by(&mac.mac);
    }

    /// A nested item is its own world: its statements run wherever its caller says. A
    /// `macro_rules!` defined in the body is the body's code: its transcribers are rewritten.
    fn visit_item_mut(&mut self, item: &mut syn::Item) {
        match item {
            syn::Item::Macro(item) if item.mac.path.is_ident("macro_rules") => {
                item.mac.tokens = self.macro_rules(item.mac.tokens.clone());
            }
            // A `const` or `static` of the body may hold a closure the body calls: its code is
            // the body's (it can name no local, only what a `fn` item could).
            syn::Item::Const(constant) => self.in_frame(&mut constant.expr),
            syn::Item::Static(global) => self.in_frame(&mut global.expr),
            _ => {}
        }
    }
}

impl Guard {
    /// The places of a destructuring assignment: their parts, not asked.
    fn visit_assignee(&mut self, expr: &mut Expr) {
        match expr {
            Expr::Tuple(tuple) => tuple.elems.iter_mut().for_each(|e| self.visit_assignee(e)),
            Expr::Array(array) => array.elems.iter_mut().for_each(|e| self.visit_assignee(e)),
            Expr::Struct(literal) => literal
                .fields
                .iter_mut()
                .for_each(|f| self.visit_assignee(&mut f.expr)),
            Expr::Call(call) => call.args.iter_mut().for_each(|e| self.visit_assignee(e)),
            Expr::Paren(e) => self.visit_assignee(&mut e.expr),
            Expr::Index(index) => {
                self.visit_assignee(&mut index.expr);
                self.visit_expr_mut(&mut index.index);
            }
            _ => {}
        }
    }

    fn visit_local_as(&mut self, local: &mut Local, closure_called_here: bool) {
        let mut origin = Origin::Unknown;
        if let Some(init) = &mut local.init {
            match &mut *init.expr {
                expr if closure_called_here => self.visit_closures_called_later(expr),
                _ => {
                    self.extending = true;
                    self.visit_expr_mut(&mut init.expr);
                    // `let s: &mut dyn Store = &mut checkout;`: the value is asked at its own
                    // type, before the `let` erases it.
                    if let Pat::Type(typed) = &local.pat
                        && mentions_trait_object(&typed.ty)
                    {
                        self.hand_erased(&mut init.expr);
                    }
                }
            }
            origin = match closure_called_here {
                true => Origin::CalledClosure,
                false => self.origin(&init.expr),
            };
            if let Some((_, diverge)) = &mut init.diverge {
                self.visit_expr_mut(diverge);
            }
        }
        self.bind_pattern(&local.pat, origin);
    }

    /// The value of a `let` whose every value is a closure that the body only calls
    /// ([`yields_closures`]): each closure's parameters are asked at the calls; the rest of
    /// the expression is visited as usual.
    fn visit_closures_called_later(&mut self, expr: &mut Expr) {
        match expr {
            Expr::Closure(closure) => self.visit_closure_as(closure, Origin::CheckedAtCalls),
            Expr::Paren(e) => self.visit_closures_called_later(&mut e.expr),
            Expr::Block(block) => {
                self.closure_tail = true;
                self.visit_block_mut(&mut block.block);
            }
            Expr::If(branch) => {
                self.visit_expr_mut(&mut branch.cond);
                self.closure_tail = true;
                self.visit_block_mut(&mut branch.then_branch);
                if let Some((_, otherwise)) = &mut branch.else_branch {
                    self.visit_closures_called_later(otherwise);
                }
            }
            Expr::Match(matched) => {
                self.visit_expr_mut(&mut matched.expr);
                let origin = self.origin(&matched.expr);
                for arm in matched.arms.iter_mut() {
                    let depth = self.scope.len();
                    match &mut arm.pat {
                        Pat::Guard(guarded) => {
                            self.bind_pattern(&guarded.pat, origin.clone());
                            self.in_frame(&mut guarded.guard);
                        }
                        pat => self.bind_pattern(pat, origin.clone()),
                    }
                    self.frames.push(Frame {
                        visible: self.scope.len(),
                        asked: Vec::new(),
                    });
                    self.visit_closures_called_later(&mut arm.body);
                    let asked = self.frames.pop().map(|f| f.asked).unwrap_or_default();
                    if !asked.is_empty() {
                        let inner =
                            std::mem::replace(&mut *arm.body, Expr::Verbatim(TokenStream::new()));
                        *arm.body = syn::parse_quote!({ #(#asked)* #inner });
                    }
                    self.scope.truncate(depth);
                }
            }
            other => self.visit_expr_mut(other),
        }
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

    /// Visits a method call; for a read whose connection was asked as one
    /// ([`Kind::Read`]), returns the name its query's type must be bound to
    /// ([`bind_query_type`]).
    fn visit_method_call(&mut self, call: &mut ExprMethodCall) -> Option<Ident> {
        self.visit_expr_mut(&mut call.receiver);
        let method = call.method.to_string();
        let hands_over = TRANSACTION_METHODS.contains(&method.as_str())
            && transaction_receiver(&call.receiver, &method)
                .is_some_and(|root| self.origin(root) == Origin::Transaction);
        if SPAWN_FUNCTIONS.contains(&method.as_str()) {
            self.ask_captures(&call.args);
        }
        let receiver_kind = match CHECKOUT_METHODS.contains(&method.as_str()) {
            true => Kind::Checkout,
            false => Kind::Plain,
        };
        let outer = std::mem::replace(&mut self.kind, receiver_kind);
        self.hand(&mut call.receiver, Handed::ByPlace);
        self.kind = outer;
        // The arguments' own method calls must not take this call's question.
        let question = self.receiver_question.take();
        let read = is_read(call).then(|| Ident::new("__inbox_query", Span::mixed_site()));
        let outer_read = std::mem::take(&mut self.read_asked);
        match &read {
            Some(query) => {
                self.visit_arguments_as(&mut call.args, hands_over, Kind::Read(query.clone()))
            }
            None => self.visit_arguments(&mut call.args, hands_over),
        }
        let asked = std::mem::replace(&mut self.read_asked, outer_read);
        self.receiver_question = question;
        read.filter(|_| asked)
    }

    /// Asks, before the statement, about every binding of the body that a closure or an
    /// `async` block handed to a spawn captures: the handler's transaction and the run-time
    /// net stay on the handler's own thread or task.
    fn ask_captures(&mut self, args: &Punctuated<Expr, Token![,]>) {
        for arg in args {
            if !matches!(arg, Expr::Closure(_) | Expr::Async(_)) {
                continue;
            }
            for name in captured_names(arg) {
                let Some((at, binding)) = self.lookup(&name) else {
                    continue;
                };
                if matches!(binding.origin, Origin::Transaction | Origin::NoConnection) {
                    continue;
                }
                let (first, _) = spans(&name);
                let marker = quote_spanned!(first=> @place);
                let question: Stmt = syn::parse_quote_spanned!(first=>
                    ::inbox_diesel::__private::vet_spawn!(#marker #name);
                );
                match self.frames.last_mut() {
                    Some(frame) if at < frame.visible => frame.asked.push(question),
                    _ => self.push_error(syn::Error::new_spanned(
                        &name,
                        "#[idempotent] cannot ask what this spawned closure captures: the name \
                         is bound in the spawning statement itself; bind it with a `let` of its \
                         own before this statement",
                    )),
                }
            }
        }
    }

    fn visit_call(&mut self, call: &mut ExprCall) {
        let extending = std::mem::take(&mut self.extending);
        self.visit_expr_mut(&mut call.func);
        // `Connection::transaction(conn, |c| …)`, `AsyncConnection::transaction(…)`: a
        // function of the application's own named `transaction` is not trusted.
        let hands_over = match &*call.func {
            Expr::Path(path) => {
                let segments = segments(&path.path);
                matches!(segments.as_slice(), [.., owner, method]
                    if CONNECTION_TYPES.contains(&owner.as_str())
                        && TRANSACTION_METHODS.contains(&method.as_str()))
                    && call
                        .args
                        .first()
                        .is_some_and(|c| self.origin(c) == Origin::Transaction)
            }
            _ => false,
        };
        if let Expr::Path(path) = &*call.func
            && path
                .path
                .segments
                .last()
                .is_some_and(|last| SPAWN_FUNCTIONS.contains(&last.ident.to_string().as_str()))
        {
            self.ask_captures(&call.args);
        }
        // `Err(e.into())`: an error, whose type the closure's or the function's return
        // settles, is not a value a statement runs through.
        if let Expr::Path(path) = &*call.func
            && path.path.is_ident("Err")
        {
            for arg in call.args.iter_mut() {
                self.visit_expr_mut(arg);
            }
            return;
        }
        self.extending = extending;
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

/// Splits tokens at the top-level separators `is_separator` recognises; each piece comes with
/// the separator tokens that ended it.
fn split(
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
fn is_list_separator(tokens: &[TokenTree], at: usize) -> usize {
    usize::from(
        matches!(&tokens[at], TokenTree::Punct(p) if p.as_char() == ',' || p.as_char() == ';'),
    )
}

/// `=>`, and an `=` that is not part of `==`, `<=`, `>=`, `!=` or the like.
fn is_binding_separator(tokens: &[TokenTree], at: usize) -> usize {
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

/// Whether `name` is assigned whole, borrowed mutably whole or used as a method's receiver (so
/// possibly auto-borrowed mutably: `o.replace(…)`, `o.insert(…)`) in `rest`, or handed to a
/// macro, which may do any of these.
fn replaced_whole(name: &Ident, rest: &[Stmt]) -> bool {
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
fn same(a: Origin, b: Origin) -> Origin {
    match a == b {
        true => a,
        false => Origin::Unknown,
    }
}

/// A name written as statics and constants are: `POOL`, `AUDIT_DB`.
fn is_screaming(name: &Ident) -> bool {
    let name = name.to_string();
    name.chars().any(|c| c.is_uppercase()) && !name.chars().any(|c| c.is_lowercase())
}

/// `query.load(conn)`, `get_result`, `get_results`, `first`: one argument, a connection.
fn is_read(call: &ExprMethodCall) -> bool {
    call.args.len() == 1 && READ_METHODS.contains(&call.method.to_string().as_str())
}

/// The read `call` (or `call.await`), its query's type bound to `query` for the question
/// about its connection: `match query_type(&q) { query => q.load(…) }` when the receiver
/// is a place, which is borrowed for nothing but its type, and `match receiver { r => match
/// query_type(&r) { query => r.load(…) } }` when it is a value, evaluated first as before.
fn bind_query_type(mut call: Expr, query: Ident) -> Expr {
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
fn captured_names(expr: &Expr) -> Vec<Ident> {
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
fn mentions_trait_object(ty: &syn::Type) -> bool {
    fn tokens(stream: TokenStream) -> bool {
        stream.into_iter().any(|token| match token {
            TokenTree::Ident(name) => name == "dyn",
            TokenTree::Group(group) => tokens(group.stream()),
            _ => false,
        })
    }
    tokens(ty.to_token_stream())
}

fn is_lower_case(name: &Ident) -> bool {
    name.to_string()
        .chars()
        .find(|c| *c != '_')
        .is_some_and(|c| c.is_lowercase())
}

/// `Some`, `Ok`, `Err`: the standard library's, whatever they wrap.
fn is_std_variant(func: &Expr) -> bool {
    matches!(func, Expr::Path(path) if path.path.get_ident().is_some_and(|name| name == "Some" || name == "Ok" || name == "Err"))
}

/// `Some`, `Ok`, `Err`, and a tuple struct's or variant's constructor named in upper case
/// (`Tx(conn)`): the value they wrap is the value a pattern of them takes apart.
fn is_variant_constructor(func: &Expr) -> bool {
    matches!(func, Expr::Path(path) if path.qself.is_none() && path.path.get_ident().is_some_and(|name| !is_lower_case(name)))
}

/// The standard library's cells, locks and pointers, made with `new` (`RefCell::new(conn)`):
/// a value that holds the value it is given, and gives it back through [`ACCESSORS`].
const WRAPPERS: [&str; 8] = [
    "Box", "Rc", "Arc", "Cell", "RefCell", "Mutex", "RwLock", "OnceCell",
];

/// Methods of the standard library's wrappers, `Option` and `Result` that give back (a guard
/// of, a reference to) what they hold. Inherent methods of those types: a trait of the
/// application's cannot replace them.
const ACCESSORS: [&str; 14] = [
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
fn is_literal_macro(mac: &syn::Macro) -> bool {
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
fn segments(path: &syn::Path) -> Vec<String> {
    path.segments.iter().map(|s| s.ident.to_string()).collect()
}

/// `RefCell::new`, `std::sync::Mutex::new`, …: a constructor of one of [`WRAPPERS`].
fn is_wrapper_constructor(func: &Expr) -> bool {
    let Expr::Path(path) = func else { return false };
    match segments(&path.path).as_slice() {
        [.., wrapper, new] => new == "new" && WRAPPERS.contains(&wrapper.as_str()),
        _ => false,
    }
}

/// Whether `expr` mentions one of `names` (as a path of one segment, or in a macro's tokens).
fn mentions_any(expr: &Expr, names: &[Ident]) -> bool {
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
fn binds_names(cond: &Expr) -> bool {
    match cond {
        Expr::Let(test) => !pattern_names(&test.pat).is_empty(),
        Expr::Binary(binary) => binds_names(&binary.left) || binds_names(&binary.right),
        Expr::Paren(e) => binds_names(&e.expr),
        _ => false,
    }
}

/// Whether a block has a `break` with a value (for its own label or any other).
fn breaks_with_value(block: &Block) -> bool {
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
fn panics(mac: &syn::Macro) -> bool {
    mac.path.segments.last().is_some_and(|s| {
        ["panic", "unreachable", "todo", "unimplemented"].contains(&s.ident.to_string().as_str())
    })
}

/// Whether evaluating `expr` never yields a value: `return`, `break`, `continue`, a
/// panicking macro, or a block that ends in one.
fn diverges(expr: &Expr) -> bool {
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
fn yields_closures(expr: &Expr) -> bool {
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

fn block_yields_closures(block: &Block) -> bool {
    match block.stmts.last() {
        Some(Stmt::Expr(tail, None)) => yields_closures(tail) || diverges(tail),
        _ => false,
    }
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
fn hoist_indexes(expr: &mut Expr, lets: &mut Vec<Stmt>) {
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
fn is_pure(expr: &Expr) -> bool {
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

/// The connection a transaction method `method` is called on, when the call is diesel's:
/// `conn` in `conn.transaction(…)` and in `conn.build_transaction().read_only().run(…)`;
/// `None` for `conn.scope().run(…)`, whose `scope` is the application's own method.
fn transaction_receiver<'e>(receiver: &'e Expr, method: &str) -> Option<&'e Expr> {
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
