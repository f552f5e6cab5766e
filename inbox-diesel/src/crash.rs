//! The application's own crash points, which the test kit's crash plans stop at.

/// A crash point of the application's own, named: where a test's
/// `testing::crash(conn, Crash::At(name), …)` stops the call it runs, as a killed process
/// would stop there — between two e-mails of one job, between a job's effect and its row's
/// deletion, inside a handler's body or around it, sync or async. Without the `testing`
/// feature (a production build, where only `[dev-dependencies]` turn it on) it does
/// nothing and is compiled away; with it, it costs one thread-local read unless a crash
/// plan names it.
///
/// ```
/// fn run_job(job: &str) {
///     // … the first e-mail …
///     inbox_diesel::crash_point("between-emails");
///     // … the second e-mail …
/// }
/// # run_job("welcome");
/// ```
#[inline(always)]
pub fn crash_point(name: &'static str) {
    #[cfg(feature = "testing")]
    crate::testing::reached(crate::testing::Crash::At(name));
    #[cfg(not(feature = "testing"))]
    let _ = name;
}
