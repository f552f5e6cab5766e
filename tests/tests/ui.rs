//! Compile-fail and compile-pass tests of `#[idempotent]`. Each `ui/fail/*.stderr` is the
//! reviewed compiler output; refresh with `TRYBUILD=overwrite` and read the diff.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("ui/fail/*.rs");
    t.pass("ui/pass/*.rs");
}
