//! The `#[idempotent(…)]` attribute's parser and its validation, compiled from inbox-macros'
//! own sources: whatever the arguments, an error or a handler, never a panic (a panic in a
//! proc macro is a compiler error without a span).
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../inbox-macros/src/attr.rs"]
#[allow(dead_code)]
mod attr;
#[path = "../../inbox-macros/src/valid.rs"]
#[allow(dead_code)]
mod valid;

fuzz_target!(|text: &str| {
    let Ok(tokens) = syn::parse_str::<proc_macro2::TokenStream>(text) else {
        return;
    };
    let Ok(args) = syn::parse2::<attr::Args>(tokens) else {
        return;
    };
    let item: syn::ItemFn = syn::parse_quote! {
        fn credit(conn: &mut SqliteConnection, msg: &Credit, msgs: &[Credit]) -> Result<(), AppError> {
            Ok(())
        }
    };
    let _ = valid::validate(args, &item);
});
