//! A fresh PostgreSQL database per test on the server `INBOX_TEST_PG` names, dropped after.

use diesel::connection::SimpleConnection;
use diesel::{Connection, PgConnection};
use inbox_diesel::{InboxSchema, schema};

/// The server's URL. This suite is compiled only with the `postgres` feature, and then it
/// must run: a missing URL fails every test instead of skipping it.
pub fn server_url() -> String {
    std::env::var("INBOX_TEST_PG").expect(
        "INBOX_TEST_PG must name a PostgreSQL server for the postgres suite, e.g. \
         INBOX_TEST_PG=postgres://postgres@127.0.0.1:5432/postgres",
    )
}

pub struct PgDb {
    admin_url: String,
    name: String,
    url: String,
}

pub const BUSINESS_SCHEMA: &str = "
    CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance BIGINT NOT NULL);
    CREATE TABLE credits (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, message TEXT NOT NULL,
                          account INTEGER NOT NULL, amount BIGINT NOT NULL);
    CREATE TABLE users (id INTEGER GENERATED ALWAYS AS IDENTITY PRIMARY KEY, email TEXT NOT NULL,
                        CONSTRAINT ux_users_email UNIQUE (email));
    INSERT INTO accounts (id, balance) VALUES (1, 0), (2, 0);
";

impl PgDb {
    pub fn new(test: &str) -> Self {
        let admin_url = server_url();
        let name = format!(
            "inbox_{}_{}",
            test.chars().take(40).collect::<String>(),
            std::process::id()
        );
        let base = admin_url
            .split('?')
            .next()
            .and_then(|url| url.rsplit_once('/'))
            .map(|(base, _)| base.to_owned())
            .expect("INBOX_TEST_PG is a postgres:// URL with a database");
        let url = format!("{base}/{name}");
        let mut admin = PgConnection::establish(&admin_url).unwrap_or_else(|e| {
            panic!("cannot reach PostgreSQL at INBOX_TEST_PG={admin_url}: {e}")
        });
        // Two calls: in one string they would form one implicit transaction, which
        // DROP/CREATE DATABASE refuse.
        admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .unwrap();
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .unwrap();
        let db = Self {
            admin_url,
            name,
            url,
        };
        let mut conn = db.connect();
        conn.batch_execute(&schema::postgres::create_table_sql(&InboxSchema::DEFAULT))
            .unwrap();
        conn.batch_execute(BUSINESS_SCHEMA).unwrap();
        db
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    pub async fn connect_async(&self) -> diesel_async::AsyncPgConnection {
        use diesel_async::AsyncConnection;
        diesel_async::AsyncPgConnection::establish(&self.url)
            .await
            .expect("connect to the test database")
    }

    pub fn connect(&self) -> PgConnection {
        PgConnection::establish(&self.url).expect("connect to the test database")
    }

    /// How many sessions of this database are waiting for a lock, as the server sees it.
    pub fn waiting_for_a_lock(&self) -> i64 {
        #[derive(diesel::QueryableByName)]
        struct Waiting {
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            n: i64,
        }
        use diesel::RunQueryDsl;
        diesel::sql_query(
            "SELECT count(*) AS n FROM pg_stat_activity \
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .get_result::<Waiting>(&mut self.connect())
        .unwrap()
        .n
    }
}

impl Drop for PgDb {
    fn drop(&mut self) {
        if let Ok(mut admin) = PgConnection::establish(&self.admin_url) {
            let _ = admin.batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ));
        }
    }
}
