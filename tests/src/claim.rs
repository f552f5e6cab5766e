//! What claim mode's behaviour files (`tests/tests/behaviour/claim.rs`, `claim_async.rs`)
//! share.
//!
//! The side effect is a counter the test owns (`sent`): it is what must happen once. The
//! inbox rows are read back through the shipped `table!` of the backend.

/// Signals from an async claim-mode body to the test: what the body does around its side
/// effect.
#[derive(Clone, Default)]
pub struct ClaimHook {
    /// The side effect: counted when the body gets past `hold` and `fail`.
    pub sent: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// Fail before the side effect: the body returns `AppError::Rejected`.
    pub fail: bool,
    /// Signal the first, then wait for the second, before the side effect.
    pub hold: Option<(
        std::sync::Arc<tokio::sync::Notify>,
        std::sync::Arc<tokio::sync::Notify>,
    )>,
}

/// A two-party gate for sync bodies: the body `pass`es it, the test knows when the body is
/// inside (`wait_inside`) and decides when it goes on (`open`). Each wait is bounded: a body
/// that never comes inside (the runtime did not run it) fails the test instead of hanging
/// it, and so does a body the test never opens.
#[derive(Default)]
pub struct Gate {
    /// (the body is inside, the test opened the gate)
    state: std::sync::Mutex<(bool, bool)>,
    changed: std::sync::Condvar,
}

impl Gate {
    /// How long either side waits for the other.
    pub const WAIT: std::time::Duration = std::time::Duration::from_secs(60);

    fn wait_for(&self, what: &str, done: impl Fn(&(bool, bool)) -> bool) {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (_state, waited) = self
            .changed
            .wait_timeout_while(state, Self::WAIT, |state| !done(state))
            .unwrap_or_else(|e| e.into_inner());
        assert!(!waited.timed_out(), "{what} within {:?}", Self::WAIT);
    }

    fn set(&self, change: impl Fn(&mut (bool, bool))) {
        change(&mut self.state.lock().unwrap_or_else(|e| e.into_inner()));
        self.changed.notify_all();
    }

    pub fn pass(&self) {
        self.set(|state| state.0 = true);
        self.wait_for("the test opened the gate", |state| state.1);
    }

    pub fn wait_inside(&self) {
        self.wait_for("the body came inside the gate", |state| state.0);
    }

    pub fn open(&self) {
        self.set(|state| state.1 = true);
    }
}

/// How long the holder's claim lasts yet, as a claim-mode `InFlight` says — at most
/// `lease` (and a millisecond the read rounds up by). Panics on any other answer.
#[track_caller]
pub fn lease_left(
    answer: &inbox_diesel::InFlightOutcome<()>,
    lease: std::time::Duration,
) -> std::time::Duration {
    let inbox_diesel::InFlightOutcome::InFlight {
        lease_left: Some(lease_left),
        ..
    } = answer
    else {
        panic!("in flight, with the lease left: {answer:?}")
    };
    assert!(
        *lease_left <= lease + std::time::Duration::from_millis(1),
        "{lease_left:?} left of a {lease:?} lease"
    );
    *lease_left
}
