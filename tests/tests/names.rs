//! Table names are written the same way by every path — the migration's DDL, the handlers,
//! the startup check and the purge: a keyword (`order`) and, on PostgreSQL, a name with
//! capitals (`Inbox`) mean one table everywhere; a long name gets an index name every backend
//! takes. SQLite always; PostgreSQL and MariaDB with their features.

use std::time::Duration;

use diesel::connection::SimpleConnection;
use inbox_diesel::purge::{Purge, purge};
use inbox_diesel::schema::{Backend, verify};
use inbox_diesel::{InboxSchema, idempotent};

/// A name 60 bytes long: `ix_<name>_processed_at` would be 76.
const LONG: &str = "inbox_of_the_settlement_service_for_the_payments_of_customer";

/// Creates the table for `schema` with the shipped DDL, delivers a message twice through a
/// handler on it, checks it and purges it.
macro_rules! round_trip {
    ($conn:expr, $conn_ty:ty, $table:literal) => {{
        #[idempotent(consumer = "names", key = *id, table = $table, constraint = "ux_names")]
        fn handle(conn: &mut $conn_ty, id: &u64) -> diesel::QueryResult<()> {
            conn.batch_execute("SELECT 1")
        }
        let conn = $conn;
        let schema = InboxSchema::new($table, "ux_names").unwrap();
        let backend = <$conn_ty as inbox_diesel::InboxConnection>::BACKEND;
        conn.batch_execute(&backend.create_table_sql(&schema))
            .unwrap();
        verify(conn, &schema).unwrap();
        assert!(handle(conn, &1).unwrap().is_processed(), "{}", $table);
        assert!(handle(conn, &1).unwrap().is_duplicate(), "{}", $table);
        let report = purge(conn, &schema, &Purge::older_than(Duration::from_secs(3600))).unwrap();
        assert!(report.ran, "{}: {report:?}", $table);
        conn.batch_execute(&backend.drop_table_sql(&schema))
            .unwrap();
    }};
}

#[test]
fn sqlite_keyword_table() {
    let db = inbox_tests::sqlite::SqliteDb::new("names");
    round_trip!(&mut db.connect(), diesel::SqliteConnection, "order");
}

/// The application's inbox named once, as a `const`, for every handler and the function
/// API: each handler's marker goes there, its duplicate is read there.
pub const BILLING: InboxSchema = InboxSchema::named("billing_inbox", "ux_billing_inbox");

#[idempotent(consumer = "invoices", key = *id, schema = BILLING)]
fn invoice(conn: &mut diesel::SqliteConnection, id: &u64) -> diesel::QueryResult<()> {
    conn.batch_execute("SELECT 1")
}

#[idempotent(consumer = "refunds", key = *id, schema = self::BILLING)]
fn refund(conn: &mut diesel::SqliteConnection, id: &u64) -> diesel::QueryResult<()> {
    conn.batch_execute("SELECT 1")
}

#[test]
fn one_schema_constant_for_every_handler() {
    use inbox_diesel::handler::{Handler, run_once};
    let db = inbox_tests::sqlite::SqliteDb::new("schema_constant");
    let mut conn = db.connect();
    conn.batch_execute(&inbox_diesel::schema::sqlite::create_table_sql(&BILLING))
        .unwrap();
    assert!(invoice(&mut conn, &1).unwrap().is_processed());
    assert!(invoice(&mut conn, &1).unwrap().is_duplicate());
    assert!(refund(&mut conn, &1).unwrap().is_processed());
    static CREDITS: std::sync::LazyLock<Handler> =
        std::sync::LazyLock::new(|| Handler::new("credits").unwrap().schema(BILLING));
    let body =
        inbox_diesel::guarded!(|tx: &mut diesel::SqliteConnection| tx.batch_execute("SELECT 1"));
    assert!(
        run_once(&mut conn, &CREDITS, "c-1", body)
            .unwrap()
            .is_processed()
    );
    let n = inbox_tests::count(&mut conn, "SELECT count(*) AS n FROM billing_inbox");
    assert_eq!(n, 3, "every marker in the application's table");
}

#[test]
fn derived_index_names_fit_every_backend() {
    let name = inbox_diesel::schema::processed_at_index(LONG);
    assert!(name.len() <= InboxSchema::MAX_IDENTIFIER_LEN, "{name}");
    let other = inbox_diesel::schema::processed_at_index(&format!("{}x", &LONG[..59]));
    assert_ne!(name, other, "two long names keep different index names");
    assert_eq!(
        inbox_diesel::schema::processed_at_index("inbox"),
        "ix_inbox_processed_at"
    );
    assert_eq!(
        Backend::Postgres.quote_table("billing.Inbox"),
        "\"billing\".\"Inbox\""
    );
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_keyword_capitals_and_long_tables() {
    let db = inbox_tests::postgres::PgDb::new("names");
    round_trip!(&mut db.connect(), diesel::PgConnection, "order");
    round_trip!(&mut db.connect(), diesel::PgConnection, "Inbox");
}

#[cfg(feature = "mysql")]
#[test]
fn mysql_keyword_and_long_tables() {
    let db = inbox_tests::mysql::MysqlDb::new("names");
    round_trip!(&mut db.connect(), diesel::MysqlConnection, "order");
    round_trip!(
        &mut db.connect(),
        diesel::MysqlConnection,
        "inbox_of_the_settlement_service_for_the_payments_of_customer"
    );
}

/// A second inbox table given the first one's index name: PostgreSQL's index names are per
/// schema, so `CREATE UNIQUE INDEX IF NOT EXISTS` finds the first table's index and creates
/// none on the second. The startup check then refuses the second table's handler, naming the
/// missing index, instead of letting its deliveries run twice.
#[cfg(feature = "postgres")]
#[test]
fn a_second_table_under_the_first_ones_index_name_is_refused() {
    #[idempotent(consumer = "second", key = *id, table = "inbox_second")]
    fn handle(conn: &mut diesel::PgConnection, id: &u64) -> diesel::QueryResult<()> {
        conn.batch_execute("SELECT 1")
    }
    let db = inbox_tests::postgres::PgDb::new("second_table");
    let mut conn = db.connect();
    let second = InboxSchema::new("inbox_second", InboxSchema::DEFAULT_CONSTRAINT).unwrap();
    conn.batch_execute(&Backend::Postgres.create_table_sql(&second))
        .unwrap();
    let refused = handle(&mut conn, &1).unwrap_err();
    let chain = inbox_tests::error_chain(&refused);
    assert!(
        chain.contains("unique index `ux_inbox_message_consumer`"),
        "{chain}"
    );
}
