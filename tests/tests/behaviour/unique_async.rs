// Get-or-create (`inbox_diesel::unique`), async, on one backend: included into a module
// naming `Db` (the fixture), `AsyncConnection` (its diesel-async connection), `TABLES`,
// `SETUP` and `PK` (as in `unique.rs`).
use std::sync::Arc;

use diesel::connection::SimpleConnection;
use diesel::{ExpressionMethods, OptionalExtension, QueryDsl};
use diesel_async::RunQueryDsl;
use inbox_diesel::unique::{self, Created, UniqueError};
use inbox_tests::unique::{CALLERS, SIGNUPS_EMAIL, signups, tenant_settings, tenants};

fn fixture(test: &str) -> Arc<Db> {
    let db = <Db>::new(test);
    let mut conn = db.connect();
    conn.batch_execute(TABLES).unwrap();
    Arc::new(db)
}

async fn connect(db: &Db) -> AsyncConnection {
    let mut conn = db.connect_async().await;
    diesel_async::SimpleAsyncConnection::batch_execute(&mut conn, SETUP)
        .await
        .unwrap();
    conn
}

/// `CALLERS` tasks on a multi-threaded runtime, each with its own connection
/// (opened first, so that no task can fail before the barrier), wait at a barrier
/// and then run `call` at once.
async fn race<T, F, Fut>(db: &Arc<Db>, call: F) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(AsyncConnection, Arc<tokio::sync::Barrier>) -> Fut,
    Fut: std::future::Future<Output = T> + Send + 'static,
{
    let start = Arc::new(tokio::sync::Barrier::new(CALLERS));
    let mut conns = Vec::new();
    for _ in 0..CALLERS {
        conns.push(connect(db).await);
    }
    let tasks: Vec<_> = conns
        .into_iter()
        .map(|conn| tokio::spawn(call(conn, start.clone())))
        .collect();
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.expect("the task completes"));
    }
    results
}

/// Sixteen tasks register one e-mail at once: one row, sixteen successes, one
/// new, one id.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_tasks_create_one_row() {
    let db = fixture("async_unique_race");
    let created = race(&db, |mut conn, start| async move {
        start.wait().await;
        unique::insert_or_get_async(
            &mut conn,
            &SIGNUPS_EMAIL,
            async |c| {
                diesel::insert_into(signups::table)
                    .values((
                        signups::email.eq("ada@example.com"),
                        signups::handle.eq("ada"),
                    ))
                    .execute(c)
                    .await?;
                signups::table
                    .filter(signups::email.eq("ada@example.com"))
                    .select(signups::id)
                    .first::<i64>(c)
                    .await
            },
            async |c| {
                signups::table
                    .filter(signups::email.eq("ada@example.com"))
                    .select(signups::id)
                    .first::<i64>(c)
                    .await
            },
        )
        .await
    })
    .await;
    let created: Vec<Created<i64>> = created
        .into_iter()
        .map(|r| r.expect("every task succeeds"))
        .collect();
    assert_eq!(
        created.iter().filter(|c| c.is_new()).count(),
        1,
        "{created:?}"
    );
    assert!(
        created
            .iter()
            .all(|c| c.into_inner() == created[0].into_inner())
    );
    let rows: i64 = signups::table
        .count()
        .get_result(&mut connect(&db).await)
        .await
        .unwrap();
    assert_eq!(rows, 1);
}

/// Sixteen upserts yield one id; a primary-key collision surfaces by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_upserts_yield_one_id() {
    let db = fixture("async_unique_upsert");
    let ids = race(&db, |mut conn, start| async move {
        start.wait().await;
        unique::upsert_async(
            &mut conn,
            &SIGNUPS_EMAIL,
            diesel::insert_into(signups::table).values((
                signups::email.eq("ada@example.com".to_owned()),
                signups::handle.eq("ada".to_owned()),
            )),
            signups::id,
        )
        .await
    })
    .await;
    let ids: Vec<i64> = ids
        .into_iter()
        .map(|r| r.expect("every task succeeds"))
        .collect();
    assert!(ids.iter().all(|&id| id == ids[0]), "{ids:?}");

    let mut conn = connect(&db).await;
    let pk = unique::insert_if_absent_async(
        &mut conn,
        &SIGNUPS_EMAIL,
        diesel::insert_into(signups::table).values((
            signups::id.eq(ids[0]),
            signups::email.eq("bob@example.com"),
            signups::handle.eq("bob"),
        )),
    )
    .await;
    match pk {
        Err(UniqueError::OtherViolation { constraint, .. }) => {
            assert_eq!(constraint.as_deref(), Some(PK))
        }
        other => panic!("expected the primary key's violation, got {other:?}"),
    }
    let rows: i64 = signups::table.count().get_result(&mut conn).await.unwrap();
    assert_eq!(rows, 1);
}

/// Inside a diesel-async transaction: the lost race rolls back to its savepoint
/// only, and the transaction commits its other writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inside_a_transaction_the_other_writes_commit() {
    use diesel_async::AsyncConnection;
    let db = fixture("async_unique_savepoint");
    let mut conn = connect(&db).await;
    let ada = unique::upsert_async(
        &mut conn,
        &SIGNUPS_EMAIL,
        diesel::insert_into(signups::table).values((
            signups::email.eq("ada@example.com".to_owned()),
            signups::handle.eq("ada".to_owned()),
        )),
        signups::id,
    )
    .await
    .unwrap();
    conn.transaction::<_, UniqueError, _>(async |c| {
        diesel::insert_into(tenants::table)
            .values(tenants::name.eq("before"))
            .execute(c)
            .await?;
        let again = unique::insert_or_get_async(
            c,
            &SIGNUPS_EMAIL,
            async |c| {
                diesel::insert_into(signups::table)
                    .values((
                        signups::email.eq("ada@example.com"),
                        signups::handle.eq("ada2"),
                    ))
                    .execute(c)
                    .await?;
                Ok(0)
            },
            async |c| {
                signups::table
                    .filter(signups::email.eq("ada@example.com"))
                    .select(signups::id)
                    .first::<i64>(c)
                    .await
            },
        )
        .await?;
        assert_eq!(again, Created::Existing(ada));
        diesel::insert_into(tenants::table)
            .values(tenants::name.eq("after"))
            .execute(c)
            .await?;
        Ok(())
    })
    .await
    .unwrap();
    let names: Vec<String> = tenants::table
        .select(tenants::name)
        .order(tenants::id)
        .load(&mut conn)
        .await
        .unwrap();
    assert_eq!(names, ["before", "after"]);
}

/// Sixteen tasks under the key lock create one tenant and one settings row.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_key_lock_serialises_a_multi_statement_creation() {
    let db = fixture("async_unique_lock");
    let ids = race(&db, |mut conn, start| async move {
        start.wait().await;
        unique::serialize_on_async(&mut conn, "tenant:acme", async |c| {
            let existing: Option<i64> = tenants::table
                .filter(tenants::name.eq("acme"))
                .select(tenants::id)
                .first(c)
                .await
                .optional()?;
            if let Some(id) = existing {
                return Ok::<_, UniqueError>(id);
            }
            diesel::insert_into(tenants::table)
                .values(tenants::name.eq("acme"))
                .execute(c)
                .await?;
            let id: i64 = tenants::table
                .filter(tenants::name.eq("acme"))
                .select(tenants::id)
                .first(c)
                .await?;
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            diesel::insert_into(tenant_settings::table)
                .values((
                    tenant_settings::tenant.eq(id),
                    tenant_settings::plan.eq("free"),
                ))
                .execute(c)
                .await?;
            Ok(id)
        })
        .await
    })
    .await;
    let ids: Vec<i64> = ids
        .into_iter()
        .map(|r| r.expect("every task succeeds"))
        .collect();
    assert!(ids.iter().all(|&id| id == ids[0]), "{ids:?}");
    let mut conn = connect(&db).await;
    let tenants: i64 = tenants::table.count().get_result(&mut conn).await.unwrap();
    let settings: i64 = tenant_settings::table
        .count()
        .get_result(&mut conn)
        .await
        .unwrap();
    assert_eq!((tenants, settings), (1, 1));
}
