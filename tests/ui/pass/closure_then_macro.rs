#![allow(unused_variables, unused_imports, dead_code, unused_mut, irrefutable_let_patterns, unused_assignments, unreachable_code, unused_labels)]
//! A closure given the transaction stays the transaction when a macro follows it.
include!("../common/sync.rs");
#[idempotent(consumer = "g01a", key = msg.id)]
fn g01a(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let credit = |c: &mut SqliteConnection, n: i64| add(c, n);
    credit(conn, 1)?;
    Ok(())
}
#[idempotent(consumer = "g01b", key = msg.id)]
fn g01b(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let credit = |c: &mut SqliteConnection, n: i64| add(c, n);
    credit(conn, 1)?;
    assert!(msg.id > 0);
    Ok(())
}
#[idempotent(consumer = "g01c", key = msg.id)]
fn g01c(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let credit = |c: &mut SqliteConnection, n: i64| add(c, n);
    let v = vec![1i64, 2];
    for n in v { credit(conn, n)?; }
    Ok(())
}
fn main() {}
