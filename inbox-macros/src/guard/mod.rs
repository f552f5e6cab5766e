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

mod ask;
mod escape;
mod macros;
mod origin;
mod syntax;
mod visit;

use escape::*;
use macros::*;
use syntax::*;

pub use escape::strip_escapes;

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
}
