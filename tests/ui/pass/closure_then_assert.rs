#![allow(unused_variables, unused_imports, dead_code, unused_mut, irrefutable_let_patterns, unused_assignments, unreachable_code, unused_labels)]
//! The same with `assert!`.
include!("../common/sync.rs");
#[idempotent(consumer = "g01d", key = msg.id)]
fn g01d(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let credit = |c: &mut SqliteConnection, n: i64| add(c, n);
    for n in [1i64, 2] { credit(conn, n)?; }
    msg.amounts.iter().try_for_each(|a| credit(conn, *a).map(drop))?;
    Ok(())
}
fn main() {}
