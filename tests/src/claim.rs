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
/// inside (`wait_inside`) and decides when it goes on (`open`).
pub struct Gate {
    inside: std::sync::Barrier,
    open: std::sync::Barrier,
}

impl Default for Gate {
    fn default() -> Self {
        Self {
            inside: std::sync::Barrier::new(2),
            open: std::sync::Barrier::new(2),
        }
    }
}

impl Gate {
    pub fn pass(&self) {
        self.inside.wait();
        self.open.wait();
    }

    pub fn wait_inside(&self) {
        self.inside.wait();
    }

    pub fn open(&self) {
        self.open.wait();
    }
}
