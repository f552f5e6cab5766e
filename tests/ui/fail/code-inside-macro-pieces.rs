#![allow(unused_variables, unused_imports, dead_code, unused_mut)]
// Code that a macro runs although it does not parse as one of the macro's expressions: the
// blocks of `tokio::select!` arms written without commas, the guard of a `matches!` pattern,
// a closure in a `const` of the body. The handlers never run.
include!("../common/sync.rs");

type Db = diesel_async::sync_connection_wrapper::SyncConnectionWrapper<SqliteConnection>;

// P01: a `matches!` guard that writes through a checkout
#[idempotent(consumer = "p01", key = msg.id)]
fn p01(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let mut spare = checkout();
    let _ = matches!(1, n if add(&mut spare, n).is_ok());
    Ok(())
}

// P02: a closure in a `const` of the body
#[idempotent(consumer = "p02", key = msg.id)]
fn p02(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    const WRITE: fn(i64) = |n| {
        add(&mut checkout(), n).unwrap();
    };
    WRITE(1);
    Ok(())
}

// P03: the first arm of a `select!` whose arms have no commas
#[idempotent(consumer = "p03", key = msg.id)]
async fn p03(conn: &mut Db, msg: &Msg) -> QueryResult<()> {
    tokio::select! {
        _ = async { 1 } => { add(&mut checkout(), 1).unwrap(); }
        _ = tokio::time::sleep(std::time::Duration::from_millis(1)) => {}
    }
    Ok(())
}

fn main() {}
