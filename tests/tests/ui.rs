//! Compile-fail and compile-pass tests of `#[idempotent]`. Each `ui/fail/*.stderr` is the
//! reviewed compiler output; refresh with `TRYBUILD=overwrite` and read the diff.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("ui/fail/*.rs");
    t.pass("ui/pass/*.rs");
    // The compiler lists the connections that do implement `InboxConnection`, so this output
    // depends on the enabled backends; it is recorded for all of them (the README's test
    // command and CI).
    #[cfg(feature = "postgres")]
    t.compile_fail("ui/all-backends/*.rs");
}
