//! A fresh database per test on a database server whose URL an environment variable names,
//! dropped after the test: the fixture of the PostgreSQL and MySQL/MariaDB suites.

use std::marker::PhantomData;

use diesel::Connection;
use diesel::connection::SimpleConnection;

/// What differs between the servers the fixture creates databases on.
pub trait Server {
    type Conn: Connection;
    /// The variable naming the server, e.g. `INBOX_TEST_PG`.
    const ENV: &'static str;
    /// An example of its value, for the message when it is missing.
    const EXAMPLE: &'static str;
    /// The statements creating the inbox and the business tables, one each.
    fn schema() -> Vec<String>;
    /// The statements adding `n` markers completed ten days ago, and three claims opened ten
    /// days ago and never completed.
    fn archive(n: u32) -> Vec<String>;
}

pub struct ServerDb<S: Server> {
    admin_url: String,
    name: String,
    url: String,
    server: PhantomData<S>,
}

impl<S: Server> ServerDb<S> {
    /// The server's URL. A suite is compiled only with its feature, and then it must run: a
    /// missing URL fails every test instead of skipping it.
    pub fn server_url() -> String {
        std::env::var(S::ENV).unwrap_or_else(|_| {
            panic!(
                "{} must name the server of this suite, e.g. {}={}",
                S::ENV,
                S::ENV,
                S::EXAMPLE
            )
        })
    }

    pub fn new(test: &str) -> Self {
        Self::with_options(test, "")
    }

    /// A fresh database created with `options` after `CREATE DATABASE name` (an encoding,
    /// say).
    pub fn with_options(test: &str, options: &str) -> Self {
        let admin_url = Self::server_url();
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
            .unwrap_or_else(|| panic!("{} is a URL with a database: {admin_url}", S::ENV));
        let url = format!("{base}/{name}");
        let mut admin = S::Conn::establish(&admin_url)
            .unwrap_or_else(|e| panic!("cannot reach the server at {}={admin_url}: {e}", S::ENV));
        // One statement a call: PostgreSQL runs a multi-statement string as one transaction,
        // which CREATE DATABASE refuses, and diesel's MySQL connection sends none.
        admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name}"))
            .unwrap();
        admin
            .batch_execute(&format!("CREATE DATABASE {name} {options}"))
            .unwrap();
        let db = Self {
            admin_url,
            name,
            url,
            server: PhantomData,
        };
        let mut conn = db.connect();
        for statement in S::schema() {
            conn.batch_execute(&statement)
                .unwrap_or_else(|e| panic!("{statement}: {e}"));
        }
        db
    }

    /// Adds `n` markers completed ten days ago and three stale claims.
    pub fn seed_archive(&self, n: u32) {
        let mut conn = self.connect();
        for statement in S::archive(n) {
            conn.batch_execute(&statement)
                .unwrap_or_else(|e| panic!("{statement}: {e}"));
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// The database's name on the server.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The database's URL with another user (no password: the test servers trust local
    /// connections).
    pub fn url_as(&self, user: &str) -> String {
        let (scheme, rest) = self.url.split_once("://").expect("a URL");
        let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
        format!("{scheme}://{user}@{host}")
    }

    /// A connection as another user ([`url_as`](Self::url_as)).
    pub fn connect_as(&self, user: &str) -> S::Conn {
        let url = self.url_as(user);
        S::Conn::establish(&url).unwrap_or_else(|e| panic!("connect as {user}: {e}"))
    }

    pub fn connect(&self) -> S::Conn {
        S::Conn::establish(&self.url).expect("connect to the test database")
    }
}

impl<S: Server> Drop for ServerDb<S> {
    fn drop(&mut self) {
        if let Ok(mut admin) = S::Conn::establish(&self.admin_url) {
            let _ = admin.batch_execute(&format!("DROP DATABASE IF EXISTS {}", self.name));
        }
    }
}

pub use crate::count;
