//! Where a value comes from: the transaction, a value that is plainly no connection, or
//! anything else, which is asked.

use super::*;

impl Guard {
    /// Where a value comes from.
    pub(super) fn origin(&self, expr: &Expr) -> Origin {
        self.origin_in(expr, None)
    }

    /// Where a value comes from, a name bound by an arm's pattern (`over`) taking the
    /// origin of the part of the scrutinee it binds.
    pub(super) fn origin_in(&self, expr: &Expr, over: Option<(&Ident, &Origin)>) -> Origin {
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
    pub(super) fn origin_in_arm(&self, pat: &Pat, scrutinee: &Origin, body: &Expr) -> Origin {
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
    pub(super) fn origin_of_block(&self, block: &Block, over: Option<(&Ident, &Origin)>) -> Origin {
        match block.stmts.as_slice() {
            [Stmt::Expr(tail, None)] => self.origin_in(tail, over),
            _ => Origin::Unknown,
        }
    }

    /// Whether a value of this shape can only be something other than a connection: a
    /// literal, a closure, arithmetic, a comparison, a numeric cast, a range, an array, tuple or
    /// struct literal (whose parts are asked one by one), or one of our own questions.
    pub(super) fn is_plainly_not_a_connection(&self, expr: &Expr) -> bool {
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
}
