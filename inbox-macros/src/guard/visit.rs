//! The walk over the body: scopes, closures, calls, arguments and statements, each value
//! handed on asked where it is handed.

use super::*;

impl Guard {
    /// Visits a closure whose parameters come from `origin`.
    pub(super) fn visit_closure_as(&mut self, closure: &mut ExprClosure, origin: Origin) {
        let depth = self.scope.len();
        for input in &closure.inputs {
            self.bind_pattern(input, origin.clone());
        }
        self.in_frame(&mut closure.body);
        self.scope.truncate(depth);
    }

    /// Visits an expression that is a scope of statements of its own (a closure's or an
    /// arm's body, a guard); the questions about places go in front of it.
    pub(super) fn in_frame(&mut self, expr: &mut Expr) {
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
    pub(super) fn visit_arguments(
        &mut self,
        args: &mut Punctuated<Expr, Token![,]>,
        hands_over: bool,
    ) {
        self.visit_arguments_as(args, hands_over, Kind::Plain)
    }

    /// The arguments, each asked with the question `kind` (a read's connection).
    pub(super) fn visit_arguments_as(
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

    /// Whether every later mention of `name` in `rest` calls it: then what its parameters
    /// are given is asked at those calls.
    pub(super) fn only_called(name: &Ident, rest: &[Stmt]) -> bool {
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
    pub(super) fn visit_assignee(&mut self, expr: &mut Expr) {
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

    pub(super) fn visit_local_as(&mut self, local: &mut Local, closure_called_here: bool) {
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
    pub(super) fn visit_closures_called_later(&mut self, expr: &mut Expr) {
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

    pub(super) fn visit_arm(&mut self, arm: &mut Arm, origin: Origin) {
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
    pub(super) fn visit_method_call(&mut self, call: &mut ExprMethodCall) -> Option<Ident> {
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
    pub(super) fn ask_captures(&mut self, args: &Punctuated<Expr, Token![,]>) {
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

    pub(super) fn visit_call(&mut self, call: &mut ExprCall) {
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

    pub(super) fn check_escape(&mut self, stmt: &Stmt) {
        for attr in stmt_attrs(stmt).iter().filter(|a| is_escape(a)) {
            if let Err(error) = escape_reason(attr) {
                self.push_error(error);
            }
        }
    }
}
