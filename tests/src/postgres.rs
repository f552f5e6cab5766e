//! The PostgreSQL fixture: a fresh database per test on the server `INBOX_TEST_PG` names.

use diesel::PgConnection;
use inbox_diesel::{InboxSchema, schema};

use crate::server::{Server, ServerDb, count};

pub struct Postgres;

pub type PgDb = ServerDb<Postgres>;

impl Server for Postgres {
    type Conn = PgConnection;
    const ENV: &'static str = "INBOX_TEST_PG";
    const EXAMPLE: &'static str = "postgres://postgres@127.0.0.1:5432/postgres";

    fn schema() -> Vec<String> {
        vec![
            schema::postgres::create_table_sql(&InboxSchema::DEFAULT),
            "CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance BIGINT NOT NULL)".into(),
            "CREATE TABLE credits (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                 message TEXT NOT NULL, account INTEGER NOT NULL, amount BIGINT NOT NULL)"
                .into(),
            "CREATE TABLE users (id INTEGER GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                 email TEXT NOT NULL, CONSTRAINT ux_users_email UNIQUE (email))"
                .into(),
            "INSERT INTO accounts (id, balance) VALUES (1, 0), (2, 0)".into(),
        ]
    }

    fn archive(n: u32) -> Vec<String> {
        vec![
            format!(
                "INSERT INTO inbox (message_id, consumer, received_at, processed_at) \
                 SELECT md5(i::text)::uuid, 'archive', now() - interval '10 days', \
                 now() - interval '10 days' FROM generate_series(1, {n}) AS i"
            ),
            "INSERT INTO inbox (message_id, consumer, received_at) \
             SELECT md5('stale' || i)::uuid, 'archive', now() - interval '10 days' \
             FROM generate_series(1, 3) AS i"
                .into(),
        ]
    }
}

impl PgDb {
    pub async fn connect_async(&self) -> diesel_async::AsyncPgConnection {
        use diesel_async::AsyncConnection;
        diesel_async::AsyncPgConnection::establish(self.url())
            .await
            .expect("connect to the test database")
    }

    /// How many sessions of this database are waiting for a lock, as the server sees it.
    pub fn waiting_for_a_lock(&self) -> i64 {
        count(
            &mut self.connect(),
            "SELECT count(*) AS n FROM pg_stat_activity \
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
    }
}
