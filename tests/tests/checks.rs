//! The startup check, counted: how often the runtime reads the catalog for connections that
//! a pool hands out. A global subscriber counts the runtime's `inbox::check` events per
//! thread; each test runs on a current-thread runtime and reads its own thread's count.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::thread::ThreadId;

use tracing_subscriber::layer::SubscriberExt;

/// The checks counted on each thread.
static CHECKS: OnceLock<Mutex<HashMap<ThreadId, usize>>> = OnceLock::new();

struct CountChecks;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for CountChecks {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if event.metadata().target() == "inbox::check" {
            let mut checks = CHECKS.get().unwrap().lock().unwrap();
            *checks.entry(std::thread::current().id()).or_default() += 1;
        }
    }
}

/// The checks counted on this thread so far; installs the subscriber the first time.
fn checks_on_this_thread() -> usize {
    CHECKS.get_or_init(|| {
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(CountChecks))
            .expect("the only subscriber of this test binary");
        Mutex::new(HashMap::new())
    });
    let checks = CHECKS.get().unwrap().lock().unwrap();
    checks
        .get(&std::thread::current().id())
        .copied()
        .unwrap_or(0)
}

/// SQLite through diesel-async's `SyncConnectionWrapper`.
mod sqlite {
    type Db = inbox_tests::sqlite::SqliteDb;
    type AsyncConnection =
        diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>;

    include!("behaviour/checks_async.rs");
}

/// PostgreSQL through `AsyncPgConnection`. Needs `INBOX_TEST_PG`.
#[cfg(feature = "postgres")]
mod postgres {
    type Db = inbox_tests::postgres::PgDb;
    type AsyncConnection = diesel_async::AsyncPgConnection;

    include!("behaviour/checks_async.rs");
}

/// MySQL and MariaDB through `AsyncMysqlConnection`. Needs `INBOX_TEST_MYSQL`.
#[cfg(feature = "mysql")]
mod mysql {
    type Db = inbox_tests::mysql::MysqlDb;
    type AsyncConnection = diesel_async::AsyncMysqlConnection;

    include!("behaviour/checks_async.rs");
}
