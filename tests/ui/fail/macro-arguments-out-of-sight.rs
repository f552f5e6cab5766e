#![allow(unused_variables, unused_imports, dead_code, unused_mut, irrefutable_let_patterns)]
// A connection handed to a macro defined elsewhere is asked whatever the syntax around it
// and wherever it was bound: a name in a piece that is not an expression (`audit!(db: "x")`),
// a name bound earlier in the same statement (a `let` chain, a `match` guard). The
// handlers never run.
include!("../common/sync.rs");

/// A macro of the application's: `name: label` writes an audit row through `name`.
macro_rules! audit {
    ($db:ident : $what:expr) => {
        diesel::sql_query("INSERT INTO audit VALUES (1)").execute($db)
    };
}

/// Writes through `c` and says whether it went through.
macro_rules! audited {
    ($c:expr) => {
        diesel::sql_query("INSERT INTO audit VALUES (1)").execute($c).is_ok()
    };
}

// M01: a checkout named in a `name: value` piece
#[idempotent(consumer = "m01", key = msg.id)]
fn m01(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let mut spare = checkout_opt();
    let db = spare.as_mut().unwrap();
    audit!(db: "m01")?;
    Ok(())
}

// M02: bound by a `let` chain in the same statement
#[idempotent(consumer = "m02", key = msg.id)]
fn m02(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let mut spare = checkout_opt();
    if let Some(c) = spare.as_mut() && audited!(c) {
        add(conn, 1)?;
    }
    Ok(())
}

// M03: bound by a `match` arm, used in its guard
#[idempotent(consumer = "m03", key = msg.id)]
fn m03(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let mut spare = checkout_opt();
    match spare.as_mut() {
        Some(c) if audited!(c) => add(conn, 1)?,
        _ => 0,
    };
    Ok(())
}

// M04: bound by a `while let` chain
#[idempotent(consumer = "m04", key = msg.id)]
fn m04(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let mut spare = checkout_opt();
    while let Some(c) = spare.as_mut() && audited!(c) {
        break;
    }
    Ok(())
}

fn main() {}
