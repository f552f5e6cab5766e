// A `macro_rules!` defined in the handler is the handler's code: its transcribers are checked
// like the body. The handlers never run; only the errors are under test.
#![allow(unused_variables, unused_imports, dead_code, unused_mut, unused_macros)]

use std::sync::LazyLock;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::r2d2::{ConnectionManager, Pool};
use inbox_diesel::idempotent;

pub struct Msg {
    pub id: u64,
}

static POOL: LazyLock<Pool<ConnectionManager<SqliteConnection>>> =
    LazyLock::new(|| Pool::builder().build_unchecked(ConnectionManager::new(":memory:")));

#[idempotent(consumer = "macro-write", key = msg.id)]
fn write_in_a_local_macro(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    macro_rules! wipe {
        ($sql:expr) => {
            diesel::sql_query($sql).execute(&mut POOL.get().unwrap())
        };
    }
    wipe!("DELETE FROM t")?;
    Ok(())
}

#[idempotent(consumer = "macro-establish", key = msg.id)]
fn establish_in_a_local_macro(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    macro_rules! audit {
        ($url:expr, $sql:expr) => {{
            let mut audit = SqliteConnection::establish($url).unwrap();
            audit.batch_execute($sql)
        }};
    }
    audit!(":memory:", "INSERT INTO audit VALUES (1)")?;
    Ok(())
}

#[idempotent(consumer = "macro-argument", key = msg.id)]
fn connection_given_to_a_local_macro(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    macro_rules! run_on {
        ($c:expr) => {
            diesel::sql_query("DELETE FROM t").execute($c)
        };
    }
    run_on!(conn)?;
    run_on!(&mut POOL.get().unwrap())?;
    Ok(())
}

fn main() {}
