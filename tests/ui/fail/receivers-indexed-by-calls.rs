#![allow(unused_variables, unused_imports, dead_code, unused_mut)]
// A method's receiver indexed by something that must not run twice — a call, another index,
// a method of the container — is a connection like any other: each index is computed once
// and the place asked. And a name of the transaction given to a statement macro inside
// brackets may be bound again by it. Each is refused; the handlers never run.
include!("../common/sync.rs");

fn two() -> Vec<Checkout> {
    vec![checkout(), checkout()]
}

fn next() -> usize {
    1
}

// R1: indexed by another index
#[idempotent(consumer = "r1", key = msg.id)]
fn r1(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let mut lanes = two();
    let route = [1usize, 0];
    lanes[route[0]].batch_execute("DELETE FROM accounts")?;
    lanes[route[route[1]]].batch_execute("DELETE FROM accounts")?;
    Ok(())
}

// R2: indexed by a call, and by a method of the container
#[idempotent(consumer = "r2", key = msg.id)]
fn r2(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let mut lanes = two();
    lanes[next()].batch_execute("DELETE FROM accounts")?;
    lanes[lanes.len() - 1].batch_execute("DELETE FROM accounts")?;
    Ok(())
}

// R3: through a field and a dereference, in a chain
pub struct Lanes {
    pub all: Vec<Checkout>,
}

#[idempotent(consumer = "r3", key = msg.id)]
fn r3(conn: &mut SqliteConnection, msg: &Msg, lanes: &mut Lanes) -> QueryResult<()> {
    (*lanes).all[msg.amounts.len() % 2].transaction(|c| add(c, 1))?;
    Ok(())
}

macro_rules! lease {
    (($c:ident) = $pool:expr) => {
        let mut $c = $pool.get().unwrap();
    };
}

// R4: a statement macro given a name of the transaction in brackets binds it again
#[idempotent(consumer = "r4", key = msg.id)]
fn r4(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    let tx = &mut *conn;
    add(tx, 1)?;
    lease!((tx) = POOL);
    add(&mut tx, 1)?;
    Ok(())
}

fn main() {}
