//! The question asked of a value handed on, and where it is asked.

use super::*;

impl Guard {
    /// Asks about a value handed on, replacing it by the question where it is asked in place.
    pub(super) fn hand(&mut self, expr: &mut Expr, handed: Handed) {
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
    pub(super) fn hand_erased(&mut self, expr: &mut Expr) {
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
    pub(super) fn shadows(&self, expr: &Expr) -> bool {
        place_root(expr)
            .and_then(|root| self.lookup(root))
            .is_some_and(|(_, binding)| binding.shadows)
    }

    /// `vet!(expr)`, spanned at the expression, so that the compiler's message points there.
    pub(super) fn ask(&mut self, expr: &Expr, shadowed: bool) -> Expr {
        if matches!(self.kind, Kind::Read(_)) && !self.claim && !shadowed {
            self.read_asked = true;
        }
        let tokens = self.question(expr.to_token_stream(), shadowed);
        syn::parse2(tokens).expect("a question parses as an expression")
    }

    /// `vet!(&place);`, asked before the statement.
    pub(super) fn ask_place(&self, place: &Expr, shadowed: bool) -> Stmt {
        let (first, _) = spans(place);
        let marker = quote_spanned!(first=> @place);
        let tokens = self.question(quote!(#marker #place), shadowed);
        syn::parse2(quote!(#tokens;)).expect("a question parses as a statement")
    }

    pub(super) fn question(&self, value: TokenStream, shadowed: bool) -> TokenStream {
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
}
