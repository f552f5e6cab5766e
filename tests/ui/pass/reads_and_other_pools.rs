// Good code the guard lets through, decided by types: a `SELECT` built by diesel's query
// builder may read on another connection (a replica), sync and async; a pool's checkout is
// not a statement; pools of things that are not diesel connections (a cache, broker
// channels) are never called connection pools; a static atomic is read where it stands.
#![allow(unused_variables, dead_code)]

use std::sync::LazyLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use diesel::prelude::*;
use diesel::r2d2::{ConnectionManager, Pool};
use inbox_diesel::idempotent;

diesel::table! {
    accounts (id) {
        id -> BigInt,
        balance -> BigInt,
    }
}

pub struct Msg {
    pub id: u64,
}

type Replica = Pool<ConnectionManager<SqliteConnection>>;

static REPLICA: LazyLock<Replica> =
    LazyLock::new(|| Pool::builder().build_unchecked(ConnectionManager::new(":memory:")));

static CALLS: AtomicUsize = AtomicUsize::new(0);
const ORDER: Ordering = Ordering::Relaxed;

/// A cache client, pooled by r2d2.
pub struct Cache;
pub struct CacheManager;

impl diesel::r2d2::ManageConnection for CacheManager {
    type Connection = Cache;
    type Error = diesel::r2d2::Error;
    fn connect(&self) -> Result<Cache, Self::Error> {
        Ok(Cache)
    }
    fn is_valid(&self, _: &mut Cache) -> Result<(), Self::Error> {
        Ok(())
    }
    fn has_broken(&self, _: &mut Cache) -> bool {
        false
    }
}

/// A broker channel, pooled by deadpool.
pub struct Channel;
pub struct ChannelManager;

impl deadpool::managed::Manager for ChannelManager {
    type Type = Channel;
    type Error = std::io::Error;
    async fn create(&self) -> Result<Channel, std::io::Error> {
        Ok(Channel)
    }
    async fn recycle(
        &self,
        _: &mut Channel,
        _: &deadpool::managed::Metrics,
    ) -> deadpool::managed::RecycleResult<std::io::Error> {
        Ok(())
    }
}

fn remember(cache: &Pool<CacheManager>, id: u64) {
    let _ = cache.get();
}

async fn publish(channels: &deadpool::managed::Pool<ChannelManager>, id: u64) {
    let _ = channels.get().await;
}

pub struct Ctx {
    pub replica: Replica,
    pub cache: Pool<CacheManager>,
}

/// A replica's pool as a parameter, read through its checkouts.
#[idempotent(consumer = "replica-parameter", key = msg.id)]
fn replica_parameter(conn: &mut SqliteConnection, msg: &Msg, replica: &Replica) -> QueryResult<()> {
    let balance: i64 = accounts::table
        .find(msg.id as i64)
        .select(accounts::balance)
        .first(&mut replica.get().unwrap())?;
    diesel::update(accounts::table.find(msg.id as i64))
        .set(accounts::balance.eq(balance + 1))
        .execute(conn)?;
    Ok(())
}

#[idempotent(consumer = "reads", key = msg.id)]
fn reads(conn: &mut SqliteConnection, msg: &Msg, ctx: &Ctx) -> QueryResult<()> {
    let id = msg.id as i64;
    let rows: Vec<(i64, i64)> = accounts::table
        .filter(accounts::id.eq(id))
        .load(&mut ctx.replica.get().unwrap())?;
    let mut replica = ctx.replica.get().unwrap();
    let count: i64 = accounts::table.count().get_result(&mut replica)?;
    let query = accounts::table.select(accounts::balance).into_boxed();
    let balances: Vec<i64> = query.load(&mut replica)?;
    let first: (i64, i64) = accounts::table.order(accounts::id).first(&mut *replica)?;
    let found: Option<(i64, i64)> = accounts::table
        .find(id)
        .first(&mut REPLICA.get().unwrap())
        .optional()?;
    let locked: Vec<i64> = accounts::table
        .select(accounts::id)
        .get_results(&mut replica)?;
    remember(&ctx.cache, msg.id);
    CALLS.fetch_add(1, ORDER);
    self::CALLS.load(ORDER);
    diesel::update(accounts::table.find(id))
        .set(accounts::balance.eq(count))
        .execute(conn)?;
    let mine: Vec<(i64, i64)> = accounts::table.load(conn)?;
    Ok(())
}

mod asynchronous {
    use diesel::{ExpressionMethods, QueryDsl, QueryResult, SqliteConnection};
    use diesel_async::RunQueryDsl;
    use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
    use inbox_diesel::idempotent;

    use super::{ChannelManager, Msg, accounts, publish};

    type Conn = SyncConnectionWrapper<SqliteConnection>;

    pub struct Ctx {
        pub replica: diesel_async::pooled_connection::deadpool::Pool<Conn>,
        pub channels: deadpool::managed::Pool<ChannelManager>,
    }

    #[idempotent(consumer = "async-reads", key = msg.id)]
    async fn reads(conn: &mut Conn, msg: &Msg, ctx: &Ctx) -> QueryResult<()> {
        publish(&ctx.channels, msg.id).await;
        let theirs: Vec<(i64, i64)> = accounts::table
            .filter(accounts::id.eq(msg.id as i64))
            .load(&mut ctx.replica.get().await.unwrap())
            .await?;
        let mut replica = ctx.replica.get().await.unwrap();
        let count: i64 = accounts::table.count().get_result(&mut replica).await?;
        diesel::update(accounts::table)
            .set(accounts::balance.eq(count))
            .execute(conn)
            .await?;
        Ok(())
    }
}

fn main() {}
