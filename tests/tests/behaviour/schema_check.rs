// The startup check, on one backend: included by `schema_check.rs` into a module that names
// `Db` (the fixture), `Conn` and `DROP_UNIQUE_INDEX`.

use diesel::connection::SimpleConnection;
use diesel::{QueryResult, RunQueryDsl};
use inbox_diesel::{ErrorClass, InboxSchema, idempotent};

#[idempotent(consumer = "checked", key = *id)]
fn apply(conn: &mut Conn, id: &u64) -> QueryResult<()> {
    conn.batch_execute("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
}

fn balance(db: &Db) -> i64 {
    #[derive(diesel::QueryableByName)]
    struct Balance {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        balance: i64,
    }
    diesel::sql_query("SELECT balance FROM accounts WHERE id = 1")
        .get_result::<Balance>(&mut db.connect())
        .unwrap()
        .balance
}

fn class(result: &QueryResult<inbox_diesel::Outcome<()>>) -> Option<ErrorClass> {
    result
        .as_ref()
        .err()
        .map(|e| inbox_diesel::classify(e, &InboxSchema::DEFAULT))
}

/// A connection is checked once, and remembered by its address (a sync connection without an
/// instrumentation; on MySQL and MariaDB, per handler); a new connection can take a dropped
/// one's address, or find a check remembered for another. One connection at a time, each in the same place: a checked
/// database, one whose table lost its unique index, another checked one, the broken one
/// again. The broken table is refused every time and its body never runs — on MySQL and
/// MariaDB, where a plain insert would not notice the missing index, too — and the good
/// ones process.
#[test]
fn a_new_connection_in_a_dropped_ones_place_is_checked() {
    let (first, broken, second) = (
        Db::new("reuse_first"),
        Db::new("reuse_broken"),
        Db::new("reuse_second"),
    );
    broken.connect().batch_execute(DROP_UNIQUE_INDEX).unwrap();
    let mut places = Vec::new();
    for (db, works) in [
        (&first, true),
        (&broken, false),
        (&second, true),
        (&broken, false),
    ] {
        let mut conn = db.connect();
        places.push(std::ptr::from_ref(&conn) as usize);
        let result = apply(&mut conn, &1);
        match works {
            true => assert!(
                matches!(result, Ok(ref o) if o.is_processed()),
                "{result:?}"
            ),
            false => assert_eq!(class(&result), Some(ErrorClass::Schema), "{result:?}"),
        }
    }
    assert!(
        places.windows(2).all(|pair| pair[0] == pair[1]),
        "the connections did not share one place, so this test does not exercise it: {places:x?}"
    );
    assert_eq!(balance(&broken), 0, "the broken table's body never ran");
    assert_eq!((balance(&first), balance(&second)), (1, 1));
}

/// The unique index dropped under a connection that had checked the table: its next
/// delivery is refused as a schema fault (`Alert`), not dead-lettered as an unknown error —
/// on PostgreSQL and SQLite, whose `ON CONFLICT` fails without the index. (MySQL and MariaDB
/// notice only on a new session: the documented limit.)
#[test]
fn an_index_dropped_under_a_checked_connection_is_a_schema_fault() {
    let db = Db::new("index_dropped");
    let mut conn = db.connect();
    assert!(apply(&mut conn, &1).unwrap().is_processed());
    db.connect().batch_execute(DROP_UNIQUE_INDEX).unwrap();
    let result = apply(&mut conn, &2);
    if !NOTICES_AN_INDEX_DROPPED_UNDER_A_CHECKED_SESSION {
        // MySQL and MariaDB: the documented limit, asserted so that a change shows.
        assert!(result.unwrap().is_processed());
        assert_eq!(balance(&db), 2);
        return;
    }
    assert_eq!(class(&result), Some(ErrorClass::Schema), "{result:?}");
    assert_eq!(balance(&db), 1);
}

/// The startup check told what the handlers need: a table without the `result` and
/// `fingerprint` columns that `store_result` and `fingerprint = …` handlers write is refused
/// at startup, naming both, instead of each of their deliveries; once added, it passes.
#[test]
fn the_startup_check_told_what_handlers_need_refuses_a_table_without_it() {
    use inbox_diesel::schema::{self, Needs};
    let db = <Db>::new("startup_needs");
    let mut conn = db.connect();
    schema::verify(&mut conn, &InboxSchema::DEFAULT).unwrap();
    let needs = Needs::default().result().fingerprint().claim();
    let refusal = schema::verify_for(&mut conn, &InboxSchema::DEFAULT, needs)
        .unwrap_err()
        .to_string();
    assert!(
        refusal.contains("no `result` column") && refusal.contains("no `fingerprint` column"),
        "{refusal}"
    );
    let backend = <Conn as inbox_diesel::InboxConnection>::BACKEND;
    let (result, fingerprint) = (
        backend.add_result_sql(&InboxSchema::DEFAULT),
        backend.add_fingerprint_sql(&InboxSchema::DEFAULT),
    );
    conn.batch_execute(&result).unwrap();
    conn.batch_execute(&fingerprint).unwrap();
    schema::verify_for(&mut db.connect(), &InboxSchema::DEFAULT, needs).unwrap();
}
