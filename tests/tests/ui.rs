//! Compile-fail and compile-pass tests of `#[idempotent]`. Each `ui/fail/*.stderr` is the
//! reviewed compiler output; refresh with `TRYBUILD=overwrite` and read the diff.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("ui/fail/*.rs");
    t.pass("ui/pass/*.rs");
    // These need every backend: the compiler's lists of the connections that implement
    // `InboxConnection` or diesel's `Connection` depend on the enabled ones, and PostgreSQL's
    // async connection exists only with the `postgres` feature. They run under the README's test command and in CI.
    #[cfg(all(feature = "postgres", feature = "mysql"))]
    {
        t.compile_fail("ui/all-backends/fail/*.rs");
        t.pass("ui/all-backends/pass/*.rs");
    }
}
