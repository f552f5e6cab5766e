//! `#[derive(MultiConnection)]`: an application's enum of connections (diesel's
//! `MultiConnection`) as a handler's connection. The runtime runs its statements on the
//! variant the enum holds; the body is given the enum.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Data, DeriveInput, Fields};

pub fn derive(input: TokenStream) -> TokenStream {
    let input: DeriveInput = match syn::parse2(input) {
        Ok(input) => input,
        Err(e) => return e.to_compile_error(),
    };
    let Data::Enum(data) = &input.data else {
        return syn::Error::new(
            input.ident.span(),
            "`inbox_diesel::MultiConnection` is derived on the enum that derives \
             `diesel::MultiConnection`: one variant per connection, `Pg(PgConnection)`",
        )
        .to_compile_error();
    };
    let name = &input.ident;
    if !input.generics.params.is_empty() {
        return syn::Error::new(
            input.generics.span(),
            "`inbox_diesel::MultiConnection` takes an enum without generic parameters, as \
             `diesel::MultiConnection` does",
        )
        .to_compile_error();
    }
    if data.variants.is_empty() {
        return syn::Error::new(
            name.span(),
            "an enum of connections has at least one variant: `Pg(PgConnection)`",
        )
        .to_compile_error();
    }
    let mut arms = Vec::new();
    for variant in &data.variants {
        let ident = &variant.ident;
        let ty = match &variant.fields {
            Fields::Unnamed(fields) if fields.unnamed.len() == 1 => &fields.unnamed[0].ty,
            _ => {
                return syn::Error::new(
                    variant.span(),
                    "each variant holds one connection: `Pg(PgConnection)`",
                )
                .to_compile_error();
            }
        };
        // Spanned at the variant's type: one that is not a connection the runtime runs on
        // (a backend feature of inbox-diesel not enabled) is reported there.
        let project = quote_spanned!(ty.span()=>
            {
                fn project(conn: &mut #name) -> &mut #ty {
                    #[allow(unreachable_patterns)]
                    match conn {
                        #name::#ident(conn) => conn,
                        _ => ::inbox_diesel::__private::variant_replaced(),
                    }
                }
                project
            }
        );
        arms.push(quote! {
            #name::#ident(_) => visit.visit(self, #project),
        });
    }
    quote! {
        impl ::inbox_diesel::HandlerConnection for #name {
            fn __inbox_visit<V: ::inbox_diesel::__private::Visit<Self>>(
                &mut self,
                visit: V,
            ) -> V::Output {
                match self {
                    #(#arms)*
                }
            }
        }
    }
}
