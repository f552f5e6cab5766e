#![allow(unused_variables, unused_imports, dead_code, unused_mut, irrefutable_let_patterns, unused_assignments, unreachable_code, unused_labels)]
//! Temporaries borrowed by a binding's literal live as long as the binding.
include!("../common/sync.rs");
pub struct Labels<'a> { pub a: &'a str, pub b: &'a [i64] }
// G25: array of borrowed temporaries
#[idempotent(consumer = "g25", key = msg.id)]
fn g25(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let names = [&msg.name.to_lowercase(), &msg.name.to_uppercase()];
    println!("{names:?}");
    Ok(())
}
// G26: Some(&temporary)
#[idempotent(consumer = "g26", key = msg.id)]
fn g26(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let o = Some(&msg.name.to_lowercase());
    println!("{o:?}");
    Ok(())
}
// G27: a struct of borrowed slices of temporaries
#[idempotent(consumer = "g27", key = msg.id)]
fn g27(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let l = Labels { a: &format!("id-{}", msg.id), b: &[1, 2, 3] };
    println!("{}", l.a);
    Ok(())
}
// G28: a borrowed literal array / constant (no temporaries that need calls)
#[idempotent(consumer = "g28", key = msg.id)]
fn g28(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let l = Labels { a: "x", b: &msg.amounts };
    println!("{}", l.a);
    Ok(())
}
fn main() {}
