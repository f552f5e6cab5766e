#![allow(unused_variables, unused_assignments, dead_code)]
// Destructuring assignments and the standard library's literal macros (`concat!`, `env!`,
// `stringify!`, `include_str!`) inside other macros compile: an assignee is a place, not a
// value handed on, and a literal macro is left for the macro around it.
include!("../common/sync.rs");

pub struct Point {
    pub x: i64,
    pub y: i64,
}

#[idempotent(consumer = "assignments-and-literal-macros", key = msg.id)]
fn assignments_and_literal_macros(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let (mut a, mut b);
    (a, b) = (1i64, 2i64);
    (a, b) = (b, a);
    let [mut c, mut d] = [0i64; 2];
    [c, d] = [a, b];
    let mut p = Point { x: 0, y: 0 };
    Point { x: p.x, y: p.y } = Point { x: c, y: d };
    let mut pair = (0i64, 0i64);
    (pair.0, pair.1) = (p.x, p.y);
    let sql = concat!("UPDATE accounts SET balance = ", stringify!(balance + 1));
    diesel::sql_query(sql).execute(conn)?;
    let manifest = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"));
    println!(concat!("message ", "{}"), msg.id);
    add(conn, pair.0 + pair.1)?;
    Ok(())
}

fn main() {}
