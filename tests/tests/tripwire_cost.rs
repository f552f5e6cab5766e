//! What the tripwire costs a pool checkout outside any handler, counted in instructions:
//! `n` checkouts (each returned at once) of one pool, plain, guarded, or with the hook, on
//! SQLite. Ignored by `cargo test`; run under callgrind as BENCHMARKS.md shows, subtracting
//! the count of `n = 0`. The async pools check connections with `RecyclingMethod::Fast`,
//! so that no query — run on a blocking thread, whose scheduling callgrind counts — blurs
//! the difference.

use diesel::SqliteConnection;
use diesel::r2d2::ConnectionManager;
use diesel_async::pooled_connection::{
    AsyncDieselConnectionManager, ManagerConfig, RecyclingMethod,
};
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use inbox_diesel::tripwire::{self, OnTrip};

type Conn = SyncConnectionWrapper<SqliteConnection>;
type Manager = AsyncDieselConnectionManager<Conn>;

/// `TRIPWIRE_COST=<pool>-<plain|guarded|hook> N=<checkouts>`, pool one of r2d2, deadpool, bb8.
#[test]
#[ignore = "an instruction count, run under callgrind"]
fn checkouts() {
    let variant = std::env::var("TRIPWIRE_COST").expect("TRIPWIRE_COST=<pool>-<variant>");
    let n: u64 = std::env::var("N").expect("N=<checkouts>").parse().unwrap();
    let (pool, variant) = variant.split_once('-').expect("<pool>-<variant>");
    let (guarded, hook) = match variant {
        "plain" => (false, false),
        "guarded" => (true, false),
        "hook" => (false, true),
        other => panic!("plain, guarded or hook, not {other}"),
    };
    let audit = inbox_tests::tripwire::AuditDb::new();
    let url = audit.url();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    match pool {
        "r2d2" => {
            let builder = diesel::r2d2::Pool::builder().max_size(1);
            let builder = match hook {
                true => builder.event_handler(Box::new(tripwire::r2d2::Tripwire::new(OnTrip::Log))),
                false => builder,
            };
            let plain = builder
                .build(ConnectionManager::<SqliteConnection>::new(url))
                .unwrap();
            let pool = tripwire::r2d2::GuardedPool::new(plain.clone());
            for _ in 0..n {
                match guarded {
                    true => drop(pool.get().unwrap()),
                    false => drop(plain.get().unwrap()),
                }
            }
        }
        "deadpool" => runtime.block_on(async {
            let mut config = ManagerConfig::default();
            config.recycling_method = RecyclingMethod::Fast;
            let builder = diesel_async::pooled_connection::deadpool::Pool::<Conn>::builder(
                Manager::new_with_config(url, config),
            )
            .max_size(1);
            let builder = match hook {
                true => builder
                    .post_create(tripwire::deadpool::hook(OnTrip::Log))
                    .post_recycle(tripwire::deadpool::hook(OnTrip::Log)),
                false => builder,
            };
            let plain = builder.build().unwrap();
            drop(plain.get().await.unwrap());
            let pool = tripwire::deadpool::GuardedPool::new(plain.clone());
            for _ in 0..n {
                match guarded {
                    true => drop(pool.get().await.unwrap()),
                    false => drop(plain.get().await.unwrap()),
                }
            }
        }),
        "bb8" => runtime.block_on(async {
            let mut config = ManagerConfig::default();
            config.recycling_method = match hook {
                true => tripwire::bb8::recycling_method(OnTrip::Log, RecyclingMethod::Fast),
                false => RecyclingMethod::Fast,
            };
            let plain = diesel_async::pooled_connection::bb8::Pool::<Conn>::builder()
                .max_size(1)
                .build(Manager::new_with_config(url, config))
                .await
                .unwrap();
            drop(plain.get().await.unwrap());
            let pool = tripwire::bb8::GuardedPool::new(plain.clone());
            for _ in 0..n {
                match guarded {
                    true => drop(pool.get().await.unwrap()),
                    false => drop(plain.get().await.unwrap()),
                }
            }
        }),
        other => panic!("r2d2, deadpool or bb8, not {other}"),
    }
}
