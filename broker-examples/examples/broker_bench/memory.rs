//! Memory per delivery in flight: the allocator that counts what the process holds, the gate
//! that holds the deliveries while it is counted, and what each delivery held.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, Semaphore};

/// The measurement tool for memory per delivery in flight: every allocation of the process
/// goes through `System`, and this wrapper keeps the bytes and blocks currently allocated.
/// It counts exactly what the consumer's code asks for — the broker client's buffers, the
/// deliveries, the futures — where the resident set size would add the allocator's
/// fragmentation and its per-thread caches, which move by more than the 1 000 deliveries
/// weigh. Its two relaxed atomic additions per allocation cost every variant alike.
struct Counting;

static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);
static LIVE_BLOCKS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to `System` with its arguments unchanged; the counters
// are only read by the bench.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc`, passed on.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed);
            LIVE_BLOCKS.fetch_add(1, Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc_zeroed`, passed on.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed);
            LIVE_BLOCKS.fetch_add(1, Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract for `dealloc`, passed on.
        unsafe { System.dealloc(ptr, layout) };
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        LIVE_BLOCKS.fetch_sub(1, Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract for `realloc`, passed on.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            LIVE_BYTES.fetch_add(new_size, Ordering::Relaxed);
            LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        new
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The bytes and blocks allocated now.
pub(crate) fn allocated() -> (usize, usize) {
    (
        LIVE_BYTES.load(Ordering::Relaxed),
        LIVE_BLOCKS.load(Ordering::Relaxed),
    )
}

/// How long the process is left alone before and while the deliveries are held: the
/// broker clients' reads and the runtime's timers settle.
pub(crate) const SETTLE: Duration = Duration::from_millis(300);

/// Holds every handler until `in_flight` of them wait, measures, then lets them all go.
pub(crate) struct Gate {
    in_flight: usize,
    entered: AtomicUsize,
    done: AtomicUsize,
    all_in: Notify,
    all_done: Notify,
    release: Semaphore,
}

impl Gate {
    pub(crate) fn new(in_flight: usize) -> Self {
        Self {
            in_flight,
            entered: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            all_in: Notify::new(),
            all_done: Notify::new(),
            release: Semaphore::new(0),
        }
    }

    /// A handler's body: waits, holding its delivery's payload, until every delivery is in.
    pub(crate) async fn hold(&self, payload: &[u8]) {
        if self.entered.fetch_add(1, Ordering::SeqCst) + 1 == self.in_flight {
            self.all_in.notify_one();
        }
        drop(self.release.acquire().await);
        std::hint::black_box(payload);
        if self.done.fetch_add(1, Ordering::SeqCst) + 1 == self.in_flight {
            self.all_done.notify_one();
        }
    }

    pub(crate) async fn all_done(&self) {
        self.all_done.notified().await;
    }

    /// The allocation counters once every delivery is held, then the handlers released.
    pub(crate) async fn measure(&self) -> (usize, usize) {
        self.all_in.notified().await;
        tokio::time::sleep(SETTLE).await;
        let held = allocated();
        self.release.add_permits(self.in_flight);
        held
    }
}

/// What the consumer held per delivery in flight.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Held {
    pub(crate) bytes: f64,
    pub(crate) blocks: f64,
}

impl Held {
    pub(crate) fn between(before: (usize, usize), held: (usize, usize), in_flight: u16) -> Self {
        let per = |after: usize, before: usize| {
            after.wrapping_sub(before) as isize as f64 / f64::from(in_flight)
        };
        Self {
            bytes: per(held.0, before.0),
            blocks: per(held.1, before.1),
        }
    }
}
