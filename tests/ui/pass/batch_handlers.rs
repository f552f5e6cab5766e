//! The batch form: sync and async, a `Vec` parameter, text keys, and a spawned async
//! handler (its future is `Send`).
#![allow(unused_variables)]

use diesel::prelude::*;
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use inbox_diesel::{BatchOutcome, idempotent};

diesel::table! {
    accounts (id) {
        id -> Integer,
        balance -> BigInt,
    }
}

pub struct Record {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub amount: i64,
}

#[idempotent(consumer = "ledger", batch = records, key = |r| (r.topic.as_str(), r.partition, r.offset))]
fn on_records(conn: &mut SqliteConnection, records: &[Record]) -> QueryResult<i64> {
    let total: i64 = records.iter().map(|r| r.amount).sum();
    diesel::update(accounts::table.find(1))
        .set(accounts::balance.eq(accounts::balance + total))
        .execute(conn)?;
    Ok(total)
}

#[idempotent(consumer = "ledger", batch = records, key = |r| r.offset)]
fn on_owned_records(conn: &mut SqliteConnection, records: Vec<Record>) -> QueryResult<usize> {
    Ok(records.len())
}

mod on_async {
    use diesel::{ExpressionMethods, QueryDsl, QueryResult, SqliteConnection};
    use diesel_async::RunQueryDsl;
    use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
    use inbox_diesel::idempotent;

    use super::{Record, accounts};

    #[idempotent(consumer = "ledger", batch = records, key = |r| r.offset)]
    pub async fn on_records_async(
        conn: &mut SyncConnectionWrapper<SqliteConnection>,
        records: &[Record],
    ) -> QueryResult<usize> {
        for record in records {
            diesel::update(accounts::table.find(1))
                .set(accounts::balance.eq(accounts::balance + record.amount))
                .execute(conn)
                .await?;
        }
        Ok(records.len())
    }
}

fn acked(outcome: BatchOutcome<usize>) -> bool {
    outcome.should_ack()
}

fn main() {
    let _spawned = async {
        tokio::spawn(async move {
            let mut conn = SyncConnectionWrapper::new(SqliteConnection::establish(":memory:").unwrap());
            let records = Vec::new();
            on_async::on_records_async(&mut conn, &records).await.map(acked)
        })
    };
}
