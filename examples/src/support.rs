//! What the examples share: which database `DATABASE_URL` names, and the statements they set
//! up with.

use diesel::connection::SimpleConnection;

/// The database an example runs on.
pub enum Target {
    /// `DATABASE_URL` unset or empty: an embedded SQLite file.
    Sqlite,
    /// A `postgres://` or `postgresql://` URL.
    #[cfg(feature = "postgres")]
    Postgres(String),
    /// A `mysql://` URL.
    #[cfg(feature = "mysql")]
    Mysql(String),
}

/// The database `DATABASE_URL` names; exits with status 2, saying why, when the example was
/// built without that backend's feature or the URL names none.
pub fn target() -> Target {
    let url = std::env::var("DATABASE_URL").unwrap_or_default();
    if url.is_empty() {
        return Target::Sqlite;
    }
    let (backend, feature) = if url.starts_with("postgres") {
        ("PostgreSQL", "postgres")
    } else if url.starts_with("mysql") {
        ("MySQL", "mysql")
    } else {
        eprintln!(
            "DATABASE_URL={url}: the examples run on SQLite (unset), PostgreSQL (postgres://…) \
             or MySQL/MariaDB (mysql://…)"
        );
        std::process::exit(2);
    };
    #[cfg(feature = "postgres")]
    if feature == "postgres" {
        return Target::Postgres(url);
    }
    #[cfg(feature = "mysql")]
    if feature == "mysql" {
        return Target::Mysql(url);
    }
    eprintln!("DATABASE_URL is a {backend} URL: run with `--features inbox-examples/{feature}`");
    std::process::exit(2);
}

/// `url` with its database replaced by `database` (MySQL: the examples create their own).
#[allow(dead_code)]
pub fn with_database(url: &str, database: &str) -> String {
    let base = url
        .split('?')
        .next()
        .and_then(|u| u.rsplit_once('/'))
        .map_or(url, |(base, _)| base);
    format!("{base}/{database}")
}

/// Creates the schema `schema` afresh on the PostgreSQL server at `url` (dropping one left by
/// an earlier run), and returns how to connect to it.
#[cfg(feature = "postgres")]
pub fn postgres_schema<'a>(
    url: &'a str,
    schema: &'a str,
) -> impl Fn() -> diesel::PgConnection + Sync + 'a {
    use diesel::Connection;
    let connect = move || {
        diesel::PgConnection::establish(url).unwrap_or_else(|e| panic!("connect to {url}: {e}"))
    };
    connect()
        .batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema};"
        ))
        .unwrap_or_else(|e| panic!("create the schema {schema}: {e}"));
    move || {
        let mut conn = connect();
        conn.batch_execute(&format!("SET search_path TO {schema}"))
            .expect("search_path");
        conn
    }
}

/// Runs each statement on its own (MySQL takes no multi-statement strings here).
pub fn run_each(conn: &mut impl SimpleConnection, statements: &[&str]) {
    for statement in statements {
        conn.batch_execute(statement)
            .unwrap_or_else(|e| panic!("{statement}: {e}"));
    }
}
