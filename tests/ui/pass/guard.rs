//! Forms the transaction guard must accept: every statement runs on the handler's
//! connection, however it is reached.

use std::sync::atomic::{AtomicUsize, Ordering};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use inbox_diesel::idempotent;

diesel::table! {
    accounts (id) {
        id -> Integer,
        balance -> BigInt,
    }
}

pub struct Msg {
    pub id: u64,
    pub amounts: Vec<i64>,
}

static CALLS: AtomicUsize = AtomicUsize::new(0);

fn add(conn: &mut SqliteConnection, amount: i64) -> QueryResult<usize> {
    diesel::update(accounts::table.find(1))
        .set(accounts::balance.eq(accounts::balance + amount))
        .execute(conn)
}

#[idempotent(consumer = "credit", key = msg.id)]
pub fn every_form(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<i64> {
    // The parameter itself, and a reborrow.
    add(conn, 1)?;
    diesel::update(accounts::table).set(accounts::balance.eq(0)).execute(&mut *conn)?;
    // Aliases, also of aliases.
    let alias = &mut *conn;
    let again = alias;
    accounts::table.count().get_result::<i64>(again)?;
    // A loop and a closure that capture the connection.
    for amount in &msg.amounts {
        add(conn, *amount)?;
    }
    msg.amounts.iter().try_for_each(|amount| add(conn, *amount).map(drop))?;
    // A closure that takes the connection, called with it.
    let reset = |c: &mut SqliteConnection| diesel::update(accounts::table).set(accounts::balance.eq(0)).execute(c);
    reset(conn)?;
    // Nested transactions hand their closure the same connection.
    conn.transaction(|inner| {
        add(inner, 1)?;
        inner.transaction(|innermost| add(innermost, 1))
    })?;
    conn.immediate_transaction(|c| c.batch_execute("UPDATE accounts SET balance = balance"))?;
    // The fully qualified forms.
    RunQueryDsl::execute(diesel::delete(accounts::table.find(2)), conn)?;
    SimpleConnection::batch_execute(conn, "SELECT 1")?;
    conn.batch_execute("SELECT 1")?;
    // Methods of the same names that are not queries.
    CALLS.load(Ordering::Relaxed);
    self::CALLS.load(Ordering::Relaxed);
    let first = msg.amounts.first().copied().unwrap_or_default();
    accounts::table.select(accounts::balance).first(conn).map(|b: i64| b + first)
}

#[idempotent(consumer = "audit", key = msg.id)]
pub fn with_a_justified_exception(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    #[inbox::outside_transaction("the audit trail records attempts, including rolled-back ones")]
    {
        let mut audit = SqliteConnection::establish(":memory:")
            .map_err(|e| diesel::result::Error::QueryBuilderError(Box::new(e)))?;
        diesel::update(accounts::table).set(accounts::balance.eq(0)).execute(&mut audit)?;
    }
    add(conn, 1).map(drop)
}

fn main() {}
