//! The escape hatch, `#[inbox::outside_transaction("reason")]`: recognised, its reason
//! required, and removed from the expansion.

use super::*;

pub(super) fn stmt_attrs(stmt: &Stmt) -> &[Attribute] {
    match stmt {
        Stmt::Local(local) => &local.attrs,
        Stmt::Expr(expr, _) => expr_attrs(expr),
        Stmt::Macro(mac) => &mac.attrs,
        Stmt::Item(_) => &[],
    }
}

pub(super) fn expr_attrs(expr: &Expr) -> &[Attribute] {
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

pub(super) fn is_escape(attr: &Attribute) -> bool {
    let path = attr.path();
    path.segments.len() == 2
        && path.segments[0].ident == "inbox"
        && path.segments[1].ident == "outside_transaction"
}

/// `#[inbox::outside_transaction("reason")]`: the reason is required and may not be blank.
pub(super) fn escape_reason(attr: &Attribute) -> syn::Result<String> {
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

pub(super) fn expr_attrs_mut(expr: &mut Expr) -> Option<&mut Vec<Attribute>> {
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
