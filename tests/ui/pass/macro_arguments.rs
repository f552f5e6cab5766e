#![allow(unused_variables, dead_code, irrefutable_let_patterns)]
// Macro arguments that are not connections compile, wherever they were bound and whatever
// syntax surrounds them; the transaction itself is never asked.
include!("../common/sync.rs");

macro_rules! note {
    ($name:ident : $what:expr) => {
        format!("{}: {}", $name, $what)
    };
}

macro_rules! positive {
    ($n:expr) => {
        *$n > 0
    };
}

macro_rules! on {
    ($c:ident => $sql:expr) => {
        diesel::sql_query($sql).execute($c)
    };
}

#[idempotent(consumer = "macro-arguments", key = msg.id)]
fn macro_arguments(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let label = &msg.name;
    let text = note!(label: "seen");
    if let Some(first) = msg.amounts.first() && positive!(first) {
        add(conn, *first)?;
    }
    match msg.amounts.get(1) {
        Some(n) if positive!(n) => add(conn, *n)?,
        _ => 0,
    };
    on!(conn => "UPDATE accounts SET balance = balance")?;
    Ok(())
}

fn main() {}
