//! Sixteen requests register the same e-mail address at the same moment.
//!
//! ```text
//! cargo run --example signup                      # embedded SQLite in a temporary file
//! DATABASE_URL=postgres://postgres@127.0.0.1/test \
//!     cargo run --example signup --features inbox-examples/postgres
//! DATABASE_URL=mysql://root@127.0.0.1:3306/test \
//!     cargo run --example signup --features inbox-examples/mysql
//! ```
//!
//! First the handler everybody writes ("is the address taken? no — insert"), alone and in a
//! transaction; then each fix in `inbox_diesel::unique`; then a creation in several
//! statements ("the tenant, then its settings") without and with the key lock. Every
//! scenario starts its sixteen threads at a barrier; the naive ones also wait at a second
//! barrier between their check and their insert, which makes the gap that load opens now and
//! then open every time.

#[path = "support.rs"]
mod support;

use std::sync::{Barrier, Mutex};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use inbox_diesel::unique::{self, UniqueError, UniqueKey};
use support::{Target, run_each};

diesel::table! {
    users (id) {
        id -> BigInt,
        email -> Text,
    }
}

diesel::table! {
    /// No unique index on the name: nothing but the key lock keeps a tenant single.
    tenants (id) {
        id -> BigInt,
        name -> Text,
    }
}

diesel::table! {
    tenant_settings (tenant) {
        tenant -> BigInt,
        plan -> Text,
    }
}

const USERS_EMAIL: UniqueKey = UniqueKey::new("users", "ux_users_email", &["email"]);
const REQUESTS: usize = 16;

/// What one scenario left behind.
struct Row {
    scenario: &'static str,
    ok: usize,
    errors: Vec<String>,
    rows: i64,
    ids: usize,
}

/// The scenarios, for one connection type.
macro_rules! demo {
    ($conn:ty) => {
        type Conn = $conn;

        /// `REQUESTS` threads, each with its own connection, start `request` together.
        fn race<T: Send>(
            connect: &(dyn Fn() -> Conn + Sync),
            request: &(dyn Fn(&mut Conn, &Barrier) -> Result<T, String> + Sync),
        ) -> Vec<Result<T, String>> {
            let (start, gap) = (Barrier::new(REQUESTS), Barrier::new(REQUESTS));
            let results = Mutex::new(Vec::new());
            // Connected first: a thread that failed before the barrier would hold the others.
            let conns: Vec<Conn> = (0..REQUESTS).map(|_| connect()).collect();
            std::thread::scope(|scope| {
                for mut conn in conns {
                    let (start, gap, results) = (&start, &gap, &results);
                    scope.spawn(move || {
                        start.wait();
                        let result = request(&mut conn, gap);
                        results.lock().unwrap().push(result);
                    });
                }
            });
            results.into_inner().unwrap()
        }

        fn find(conn: &mut Conn, email: &str) -> QueryResult<Option<i64>> {
            users::table
                .filter(users::email.eq(email))
                .select(users::id)
                .first(conn)
                .optional()
        }

        fn insert(conn: &mut Conn, email: &str) -> QueryResult<i64> {
            diesel::insert_into(users::table)
                .values(users::email.eq(email))
                .execute(conn)?;
            find(conn, email)?.ok_or(diesel::result::Error::NotFound)
        }

        /// The first attempt: check, then insert.
        fn naive(conn: &mut Conn, gap: &Barrier, email: &str) -> QueryResult<i64> {
            // Every request reaches the gap, even one whose check failed.
            let existing = find(conn, email);
            gap.wait();
            match existing? {
                Some(id) => Ok(id),
                None => insert(conn, email),
            }
        }

        /// A tenant, then its settings: only the first request may create them.
        fn create_tenant(conn: &mut Conn, gap: Option<&Barrier>) -> QueryResult<i64> {
            let existing: QueryResult<Option<i64>> = tenants::table
                .filter(tenants::name.eq("acme"))
                .select(tenants::id)
                .first(conn)
                .optional();
            if let Some(gap) = gap {
                gap.wait();
            }
            if let Some(id) = existing? {
                return Ok(id);
            }
            diesel::insert_into(tenants::table)
                .values(tenants::name.eq("acme"))
                .execute(conn)?;
            let id = tenants::table
                .filter(tenants::name.eq("acme"))
                .select(diesel::dsl::max(tenants::id))
                .first::<Option<i64>>(conn)?
                .ok_or(diesel::result::Error::NotFound)?;
            diesel::insert_into(tenant_settings::table)
                .values((
                    tenant_settings::tenant.eq(id),
                    tenant_settings::plan.eq("free"),
                ))
                .execute(conn)?;
            Ok(id)
        }

        fn tally(scenario: &'static str, results: Vec<Result<i64, String>>, rows: i64) -> Row {
            let mut ids: Vec<i64> = results
                .iter()
                .filter_map(|r| r.as_ref().ok().copied())
                .collect();
            ids.sort_unstable();
            ids.dedup();
            let errors: Vec<String> = results.into_iter().filter_map(Result::err).collect();
            Row {
                scenario,
                ok: REQUESTS - errors.len(),
                errors,
                rows,
                ids: ids.len(),
            }
        }

        pub fn run_demo(connect: &(dyn Fn() -> Conn + Sync)) -> Vec<Row> {
            let mut rows = Vec::new();
            let users_with = |email: &str| -> i64 {
                users::table
                    .filter(users::email.eq(email))
                    .count()
                    .get_result(&mut connect())
                    .expect("count users")
            };
            let scenarios: [(&'static str, &'static str); 5] = [
                ("check, then insert", "naive@example.com"),
                (
                    "check, then insert, in a transaction",
                    "naive-tx@example.com",
                ),
                ("unique::insert_or_get", "get@example.com"),
                ("unique::upsert", "upsert@example.com"),
                ("unique::insert_if_absent", "absent@example.com"),
            ];
            for (n, (scenario, email)) in scenarios.into_iter().enumerate() {
                let results = race(connect, &|conn, gap| {
                    let fail = |e: UniqueError| e.to_string();
                    match n {
                        0 => naive(conn, gap, email).map_err(|e| e.to_string()),
                        1 => conn
                            .transaction(|c| naive(c, gap, email))
                            .map_err(|e| e.to_string()),
                        2 => unique::insert_or_get(
                            conn,
                            &USERS_EMAIL,
                            |c| insert(c, email),
                            |c| find(c, email)?.ok_or(diesel::result::Error::NotFound),
                        )
                        .map(|created| created.into_inner())
                        .map_err(fail),
                        3 => unique::upsert(
                            conn,
                            &USERS_EMAIL,
                            diesel::insert_into(users::table).values(users::email.eq(email)),
                            users::id,
                        )
                        .map_err(fail),
                        _ => unique::insert_if_absent(
                            conn,
                            &USERS_EMAIL,
                            diesel::insert_into(users::table).values(users::email.eq(email)),
                        )
                        .map(i64::from)
                        .map_err(fail),
                    }
                });
                rows.push(tally(scenario, results, users_with(email)));
            }

            let tenant_rows = || -> i64 {
                tenants::table
                    .count()
                    .get_result(&mut connect())
                    .expect("count tenants")
            };
            let results = race(connect, &|conn, gap| {
                conn.transaction(|c| create_tenant(c, Some(gap)))
                    .map_err(|e| e.to_string())
            });
            rows.push(tally(
                "tenant + settings, in a transaction",
                results,
                tenant_rows(),
            ));
            connect()
                .batch_execute("DELETE FROM tenant_settings; DELETE FROM tenants")
                .expect("clear the tenants");
            let results = race(connect, &|conn, _| {
                unique::serialize_on(conn, "tenant:acme", |c| {
                    create_tenant(c, None).map_err(UniqueError::from)
                })
                .map_err(|e| e.to_string())
            });
            rows.push(tally("unique::serialize_on", results, tenant_rows()));
            rows
        }
    };
}

mod sqlite {
    use super::*;
    demo!(SqliteConnection);

    pub fn main() -> Vec<Row> {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("signup.sqlite").display().to_string();
        let mut conn = SqliteConnection::establish(&path).expect("create the SQLite database");
        conn.batch_execute("PRAGMA journal_mode = WAL;")
            .expect("WAL mode");
        run_each(
            &mut conn,
            &[
                "CREATE TABLE users (id INTEGER PRIMARY KEY, email TEXT NOT NULL)",
                "CREATE UNIQUE INDEX ux_users_email ON users (email)",
                "CREATE TABLE tenants (id INTEGER PRIMARY KEY, name TEXT NOT NULL)",
                "CREATE TABLE tenant_settings (tenant INTEGER NOT NULL, plan TEXT NOT NULL)",
            ],
        );
        println!("SQLite database: {path}\n");
        run_demo(&|| {
            let mut conn = SqliteConnection::establish(&path).expect("open the SQLite database");
            conn.batch_execute("PRAGMA busy_timeout = 10000;")
                .expect("busy timeout");
            conn
        })
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;
    demo!(PgConnection);

    pub fn main(url: &str) -> Vec<Row> {
        let connect = support::postgres_schema(url, "signup_example");
        run_each(
            &mut connect(),
            &[
                "CREATE TABLE users (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, \
                 email TEXT NOT NULL)",
                "CREATE UNIQUE INDEX ux_users_email ON users (email)",
                "CREATE TABLE tenants (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, \
                 name TEXT NOT NULL)",
                "CREATE TABLE tenant_settings (tenant BIGINT NOT NULL, plan TEXT NOT NULL)",
            ],
        );
        println!("PostgreSQL: {url} (schema signup_example)\n");
        run_demo(&connect)
    }
}

#[cfg(feature = "mysql")]
mod mysql {
    use super::*;
    demo!(MysqlConnection);

    pub fn main(url: &str) -> Vec<Row> {
        run_each(
            &mut MysqlConnection::establish(url)
                .unwrap_or_else(|e| panic!("connect to {url}: {e}")),
            &[
                "DROP DATABASE IF EXISTS signup_example",
                "CREATE DATABASE signup_example",
            ],
        );
        let example_url = support::with_database(url, "signup_example");
        let connect = || {
            MysqlConnection::establish(&example_url)
                .unwrap_or_else(|e| panic!("connect to {example_url}: {e}"))
        };
        run_each(
            &mut connect(),
            &[
                "CREATE TABLE users (id BIGINT AUTO_INCREMENT PRIMARY KEY, \
                 email VARCHAR(200) NOT NULL, UNIQUE KEY ux_users_email (email))",
                "CREATE TABLE tenants (id BIGINT AUTO_INCREMENT PRIMARY KEY, \
                 name VARCHAR(200) NOT NULL)",
                "CREATE TABLE tenant_settings (tenant BIGINT NOT NULL, plan VARCHAR(200) NOT NULL)",
            ],
        );
        println!("MySQL/MariaDB: {example_url}\n");
        run_demo(&connect)
    }
}

fn main() {
    let rows = match support::target() {
        Target::Sqlite => sqlite::main(),
        #[cfg(feature = "postgres")]
        Target::Postgres(url) => postgres::main(&url),
        #[cfg(feature = "mysql")]
        Target::Mysql(url) => mysql::main(&url),
    };
    println!(
        "{REQUESTS} requests at the same moment, one e-mail address (or one tenant) each \
         scenario; answers: the distinct ids returned (insert_if_absent: inserted or not)\n"
    );
    println!(
        "{:<38} {:>9} {:>7} {:>5} {:>8}",
        "approach", "succeeded", "failed", "rows", "answers"
    );
    let mut fixes_held = true;
    for row in &rows {
        println!(
            "{:<38} {:>9} {:>7} {:>5} {:>8}",
            row.scenario,
            row.ok,
            row.errors.len(),
            row.rows,
            row.ids
        );
        if row.scenario.starts_with("unique::") {
            // `insert_if_absent` answers whether it inserted, not an id.
            let ids = if row.scenario.ends_with("insert_if_absent") {
                2
            } else {
                1
            };
            fixes_held &= row.errors.is_empty() && row.rows == 1 && row.ids <= ids;
        }
    }
    for row in &rows {
        if let Some(first) = row.errors.first() {
            println!(
                "\n{}: {} errors, the first: {first}",
                row.scenario,
                row.errors.len()
            );
        }
    }
    if !fixes_held {
        eprintln!("\na fix did not hold: one row and {REQUESTS} successes expected");
        std::process::exit(1);
    }
}
