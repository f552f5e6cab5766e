// Get-or-create (`inbox_diesel::unique`), sync, on one backend: included into a module naming
// `Db` (the fixture), `Conn` (its connection), `TABLES` (the backend's tables), `SETUP` (SQL
// run on every connection), and `PK` and `HANDLE` (what the server calls the primary key and
// the handle's unique index in a violation).
use std::sync::{Barrier, Mutex};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use inbox_diesel::InboxConnection;
use inbox_diesel::unique::{self, Created, UniqueError};
use inbox_tests::unique::{CALLERS, SIGNUPS_EMAIL, signups, tenant_settings, tenants};

fn fixture(test: &str) -> Db {
    let db = <Db>::new(test);
    connect(&db).batch_execute(TABLES).unwrap();
    db
}

fn connect(db: &Db) -> Conn {
    let mut conn = db.connect();
    conn.batch_execute(SETUP).unwrap();
    conn
}

/// The sign-up through `insert_or_get`: the insert returns the id (PostgreSQL,
/// SQLite) or is followed by `LAST_INSERT_ID()` (MySQL).
fn register(conn: &mut Conn, email: &str, handle: &str) -> Result<Created<i64>, UniqueError> {
    unique::insert_or_get(
        conn,
        &SIGNUPS_EMAIL,
        |c| insert_signup(c, None, email, handle),
        |c| id_of(c, email),
    )
}

/// Inserts a sign-up, with `id` or the table's next one; its id.
fn insert_signup(conn: &mut Conn, id: Option<i64>, email: &str, handle: &str) -> QueryResult<i64> {
    let row = (signups::email.eq(email), signups::handle.eq(handle));
    match id {
        Some(id) => diesel::insert_into(signups::table)
            .values((signups::id.eq(id), row))
            .execute(conn)?,
        None => diesel::insert_into(signups::table)
            .values(row)
            .execute(conn)?,
    };
    match id {
        Some(id) => Ok(id),
        None => id_of(conn, email),
    }
}

/// The id of the sign-up with `email`: the re-read of every `insert_or_get` here.
fn id_of(conn: &mut Conn, email: &str) -> QueryResult<i64> {
    signups::table
        .filter(signups::email.eq(email))
        .select(signups::id)
        .first(conn)
}

fn signups_with(conn: &mut Conn, email: &str) -> i64 {
    signups::table
        .filter(signups::email.eq(email))
        .count()
        .get_result(conn)
        .unwrap()
}

/// `CALLERS` threads, each with its own connection, wait at a barrier and then
/// run `call` at once; their results, in thread order. The connections are opened
/// first, one after the other: a thread that failed before the barrier would leave
/// the others waiting at it for ever.
fn race<T: Send>(db: &Db, call: impl Fn(&mut Conn) -> T + Sync) -> Vec<T> {
    let start = Barrier::new(CALLERS);
    let results = Mutex::new(Vec::new());
    let conns: Vec<Conn> = (0..CALLERS).map(|_| connect(db)).collect();
    std::thread::scope(|scope| {
        for (n, mut conn) in conns.into_iter().enumerate() {
            let (start, results, call) = (&start, &results, &call);
            scope.spawn(move || {
                start.wait();
                let result = call(&mut conn);
                results.lock().unwrap().push((n, result));
            });
        }
    });
    let mut results = results.into_inner().unwrap();
    results.sort_by_key(|(n, _)| *n);
    results.into_iter().map(|(_, result)| result).collect()
}

/// Sixteen callers register one e-mail at once: one row, sixteen successes, one
/// of them new, every one with the same id.
#[test]
fn sixteen_callers_create_one_row() {
    let db = fixture("unique_race");
    let results = race(&db, |c| register(c, "ada@example.com", "ada"));
    let created: Vec<Created<i64>> = results
        .into_iter()
        .map(|r| r.expect("every caller succeeds"))
        .collect();
    assert_eq!(
        created.iter().filter(|c| c.is_new()).count(),
        1,
        "{created:?}"
    );
    let id = created[0].into_inner();
    assert!(created.iter().all(|c| c.into_inner() == id), "{created:?}");
    assert_eq!(signups_with(&mut connect(&db), "ada@example.com"), 1);
}

/// The one-statement forms under the same race: every upsert yields the one row's
/// id; exactly one `insert_if_absent` inserts.
#[test]
fn sixteen_upserts_yield_one_id() {
    let db = fixture("unique_upsert_race");
    let ids = race(&db, |c| {
        unique::upsert(
            c,
            &SIGNUPS_EMAIL,
            diesel::insert_into(signups::table).values((
                signups::email.eq("ada@example.com"),
                signups::handle.eq("ada"),
            )),
            signups::id,
        )
    });
    let ids: Vec<i64> = ids
        .into_iter()
        .map(|r| r.expect("no caller fails"))
        .collect();
    assert!(ids.iter().all(|&id| id == ids[0]), "{ids:?}");
    let mut conn = connect(&db);
    assert_eq!(signups_with(&mut conn, "ada@example.com"), 1);
    let stored: i64 = signups::table.select(signups::id).first(&mut conn).unwrap();
    assert_eq!(stored, ids[0]);

    let inserted = race(&db, |c| {
        unique::insert_if_absent(
            c,
            &SIGNUPS_EMAIL,
            diesel::insert_into(signups::table).values((
                signups::email.eq("bob@example.com"),
                signups::handle.eq("bob"),
            )),
        )
    });
    let inserted: Vec<bool> = inserted
        .into_iter()
        .map(|r| r.expect("no caller fails"))
        .collect();
    assert_eq!(inserted.iter().filter(|&&i| i).count(), 1, "{inserted:?}");
    assert_eq!(signups_with(&mut conn, "bob@example.com"), 1);
}

/// A primary key collision — an id the table's sequence would hand out again —
/// is not "someone else created it": it surfaces, named.
#[test]
fn a_primary_key_violation_is_not_swallowed() {
    let db = fixture("unique_pk");
    let mut conn = connect(&db);
    insert_signup(&mut conn, Some(7), "ada@example.com", "ada").unwrap();
    let result = unique::insert_or_get(
        &mut conn,
        &SIGNUPS_EMAIL,
        |c| insert_signup(c, Some(7), "bob@example.com", "bob"),
        |c| id_of(c, "bob@example.com"),
    );
    match result {
        Err(UniqueError::OtherViolation { constraint, .. }) => {
            assert_eq!(constraint.as_deref(), Some(PK))
        }
        other => panic!("expected the primary key's violation, got {other:?}"),
    }
    assert_eq!(signups_with(&mut conn, "bob@example.com"), 0);
}

/// Another unique index's violation surfaces with its name, from every form that
/// can name the key (MySQL's upsert cannot: documented, and shown here).
#[test]
fn another_unique_index_surfaces_with_its_name() {
    let db = fixture("unique_other");
    let mut conn = connect(&db);
    let ada = register(&mut conn, "ada@example.com", "ada")
        .unwrap()
        .into_inner();
    let taken = register(&mut conn, "bob@example.com", "ada");
    match &taken {
        Err(UniqueError::OtherViolation { constraint, .. }) => {
            assert_eq!(constraint.as_deref(), Some(HANDLE))
        }
        other => panic!("expected the handle's violation, got {other:?}"),
    }
    assert!(taken.unwrap_err().to_string().contains(HANDLE));
    let insert = diesel::insert_into(signups::table).values((
        signups::email.eq("bob@example.com"),
        signups::handle.eq("ada"),
    ));
    let upserted = unique::upsert(&mut conn, &SIGNUPS_EMAIL, insert, signups::id);
    let absent = unique::insert_if_absent(&mut conn, &SIGNUPS_EMAIL, insert);
    if <Conn as InboxConnection>::BACKEND == inbox_diesel::schema::Backend::Mysql {
        // ON DUPLICATE KEY UPDATE resolves a collision on any unique index.
        assert_eq!(upserted.unwrap(), ada);
    } else {
        assert!(
            matches!(&upserted, Err(UniqueError::OtherViolation { constraint: Some(c), .. }) if c == HANDLE),
            "{upserted:?}"
        );
    }
    assert!(
        matches!(&absent, Err(UniqueError::OtherViolation { constraint: Some(c), .. }) if c == HANDLE),
        "{absent:?}"
    );
    assert_eq!(signups_with(&mut conn, "bob@example.com"), 0);
}

/// Inside a larger transaction: the lost race and a failed insert each roll back
/// to their savepoint only, and the transaction commits its other writes.
#[test]
fn inside_a_transaction_the_other_writes_commit() {
    let db = fixture("unique_savepoint");
    let ada = register(&mut connect(&db), "ada@example.com", "ada")
        .unwrap()
        .into_inner();
    let mut conn = connect(&db);
    conn.transaction::<_, UniqueError, _>(|c| {
        diesel::insert_into(tenants::table)
            .values(tenants::name.eq("before"))
            .execute(c)?;
        let again = register(c, "ada@example.com", "ada2")?;
        assert_eq!(again, Created::Existing(ada));
        let pk = unique::insert_or_get(
            c,
            &SIGNUPS_EMAIL,
            |c| insert_signup(c, Some(ada), "eve@example.com", "eve"),
            |c| id_of(c, "eve@example.com"),
        );
        assert!(
            matches!(pk, Err(UniqueError::OtherViolation { .. })),
            "{pk:?}"
        );
        let bob = register(c, "bob@example.com", "bob")?;
        assert!(bob.is_new());
        diesel::insert_into(tenants::table)
            .values(tenants::name.eq("after"))
            .execute(c)?;
        Ok(())
    })
    .unwrap();
    let names: Vec<String> = tenants::table
        .select(tenants::name)
        .order(tenants::id)
        .load(&mut conn)
        .unwrap();
    assert_eq!(names, ["before", "after"]);
    assert_eq!(signups_with(&mut conn, "bob@example.com"), 1);
    assert_eq!(signups_with(&mut conn, "eve@example.com"), 0);
}

/// A batch with repeated keys: collapsed first, then one row per key in one
/// transaction, the batch's repeats and an existing row resolved to the same ids.
#[test]
fn a_batch_with_repeated_keys() {
    let db = fixture("unique_batch");
    let mut conn = connect(&db);
    let carol = register(&mut conn, "carol@example.com", "carol")
        .unwrap()
        .into_inner();
    let batch = vec![
        ("ada@example.com", "ada"),
        ("bob@example.com", "bob"),
        ("ada@example.com", "ada-again"),
        ("carol@example.com", "carol-again"),
        ("bob@example.com", "bob-again"),
    ];
    let distinct = unique::collapse(batch.clone(), |row| row.0);
    assert_eq!(distinct.len(), 3);
    let created = conn
        .transaction::<_, UniqueError, _>(|c| {
            distinct
                .iter()
                .map(|(email, handle)| register(c, email, handle))
                .collect::<Result<Vec<_>, _>>()
        })
        .unwrap();
    assert_eq!(created.iter().filter(|c| c.is_new()).count(), 2);
    assert_eq!(created[2], Created::Existing(carol));
    for (email, _) in &batch {
        assert_eq!(signups_with(&mut conn, email), 1, "{email}");
    }
    let handles: Vec<String> = signups::table
        .select(signups::handle)
        .order(signups::email)
        .load(&mut conn)
        .unwrap();
    assert_eq!(
        handles,
        ["ada", "bob", "carol"],
        "the first of each key wins"
    );
}

/// The body's error rolls its writes back, and leaves no transaction open: the
/// next creation under the same key runs and commits.
#[test]
fn the_key_lock_rolls_back_a_failed_body() {
    #[derive(Debug)]
    enum Creation {
        GaveUp,
        // Read by `Debug`, when an `unwrap` fails the test.
        Failed(#[allow(dead_code)] UniqueError),
    }
    impl From<UniqueError> for Creation {
        fn from(error: UniqueError) -> Self {
            Creation::Failed(error)
        }
    }
    impl From<diesel::result::Error> for Creation {
        fn from(error: diesel::result::Error) -> Self {
            Creation::Failed(UniqueError::Database(error))
        }
    }
    let db = fixture("unique_lock_rollback");
    let mut conn = connect(&db);
    let create = |c: &mut Conn, give_up: bool| {
        unique::serialize_on(c, "tenant:acme", |c| {
            diesel::insert_into(tenants::table)
                .values(tenants::name.eq("acme"))
                .execute(c)?;
            match give_up {
                true => Err(Creation::GaveUp),
                false => Ok(()),
            }
        })
    };
    assert!(matches!(create(&mut conn, true), Err(Creation::GaveUp)));
    let tenants: i64 = tenants::table.count().get_result(&mut conn).unwrap();
    assert_eq!(tenants, 0);
    create(&mut conn, false).unwrap();
    let tenants: i64 = tenants::table
        .count()
        .get_result(&mut connect(&db))
        .unwrap();
    assert_eq!(tenants, 1, "committed, seen by another connection");
}

/// A creation in several statements, on a table with no unique index: sixteen
/// callers under the key lock create one tenant and one settings row.
#[test]
fn the_key_lock_serialises_a_multi_statement_creation() {
    let db = fixture("unique_lock");
    let ids = race(&db, |c| {
        unique::serialize_on(c, "tenant:acme", |c| {
            let existing: Option<i64> = tenants::table
                .filter(tenants::name.eq("acme"))
                .select(tenants::id)
                .first(c)
                .optional()?;
            if let Some(id) = existing {
                return Ok::<_, UniqueError>(id);
            }
            diesel::insert_into(tenants::table)
                .values(tenants::name.eq("acme"))
                .execute(c)?;
            let id: i64 = tenants::table
                .filter(tenants::name.eq("acme"))
                .select(tenants::id)
                .first(c)?;
            // Time for every other caller to arrive and wait.
            std::thread::sleep(std::time::Duration::from_millis(50));
            diesel::insert_into(tenant_settings::table)
                .values((
                    tenant_settings::tenant.eq(id),
                    tenant_settings::plan.eq("free"),
                ))
                .execute(c)?;
            Ok(id)
        })
    });
    let ids: Vec<i64> = ids
        .into_iter()
        .map(|r| r.expect("every caller succeeds"))
        .collect();
    assert!(ids.iter().all(|&id| id == ids[0]), "{ids:?}");
    let mut conn = connect(&db);
    let tenants: i64 = tenants::table.count().get_result(&mut conn).unwrap();
    let settings: i64 = tenant_settings::table
        .count()
        .get_result(&mut conn)
        .unwrap();
    assert_eq!((tenants, settings), (1, 1));
}
