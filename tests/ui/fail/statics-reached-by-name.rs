// A static pool reached by its name, wherever the name stands: given bare to an
// application's macro defined in another module, the receiver of a method of the
// application's extension trait, named by its path.
#![allow(unused_variables, dead_code)]

use std::sync::LazyLock;

use diesel::prelude::*;
use diesel::r2d2::{ConnectionManager, Pool};
use inbox_diesel::idempotent;

pub struct Msg {
    pub id: u64,
}

type DbPool = Pool<ConnectionManager<SqliteConnection>>;

mod db {
    use super::*;

    pub static POOL: LazyLock<DbPool> =
        LazyLock::new(|| Pool::builder().build_unchecked(ConnectionManager::new(":memory:")));

    #[macro_export]
    macro_rules! bump {
        ($pool:expr) => {
            diesel::sql_query("UPDATE accounts SET balance = balance + 1")
                .execute(&mut $pool.get().unwrap())
        };
    }

    pub trait PoolExt {
        fn bump(&self) -> QueryResult<usize>;
    }

    impl PoolExt for DbPool {
        fn bump(&self) -> QueryResult<usize> {
            diesel::sql_query("UPDATE accounts SET balance = balance + 1")
                .execute(&mut self.get().unwrap())
        }
    }
}

use db::{POOL, PoolExt};

#[idempotent(consumer = "by-macro", key = msg.id)]
fn by_macro(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    bump!(POOL)?;
    Ok(())
}

#[idempotent(consumer = "by-trait", key = msg.id)]
fn by_trait(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    POOL.bump()?;
    Ok(())
}

#[idempotent(consumer = "by-path", key = msg.id)]
fn by_path(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    crate::db::POOL.bump()?;
    Ok(())
}

fn main() {}
