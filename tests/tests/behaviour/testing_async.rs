// `inbox_diesel::testing`'s async helpers on one backend: included by each backend's async
// suite into a module that names `Db` (the fixture) and `AsyncConnection` (what
// `Db::connect_async` returns).
use diesel::{ExpressionMethods, QueryDsl};
use diesel_async::RunQueryDsl;
use inbox_diesel::idempotent;
use inbox_diesel::testing::{self, Crash};
use inbox_tests::{AppError, Credit, accounts, credits};

#[idempotent(consumer = "credit", key = msg.id)]
async fn credit(conn: &mut AsyncConnection, msg: &Credit) -> Result<(), AppError> {
    diesel::insert_into(credits::table)
        .values((
            credits::message.eq(msg.id.to_string()),
            credits::account.eq(msg.account),
            credits::amount.eq(msg.amount),
        ))
        .execute(conn)
        .await?;
    diesel::update(accounts::table.find(msg.account))
        .set(accounts::balance.eq(accounts::balance + msg.amount))
        .execute(conn)
        .await?;
    Ok(())
}

fn credits_of(msg: &Credit) -> String {
    format!("SELECT count(*) FROM credits WHERE message = '{}'", msg.id)
}

/// Copies raced on four connections, a crash before the commit and one after it: each
/// message has one credit, and each redelivery's answer is what the crash left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn races_and_crashes_of_an_async_handler_leave_one_effect() {
    let db = Db::new("testing_async");
    let mut connections = Vec::new();
    for _ in 0..4 {
        connections.push(db.connect_async().await);
    }
    let mut check = db.connect_async().await;
    for n in 0..20 {
        let msg = Credit::new(n);
        let answers =
            testing::race_async(&mut connections, async |conn| credit(conn, &msg).await).await;
        let processed = answers
            .iter()
            .filter(|a| a.as_ref().is_ok_and(|o| o.is_processed()))
            .count();
        assert_eq!(processed, 1, "message {n}: {answers:?}");
        testing::assert_once_async(&mut check, &credits_of(&msg)).await;
    }

    let before = Credit::new(100);
    let crashed = testing::crash_async(
        db.connect_async().await,
        Crash::BeforeCommit,
        async |conn| credit(conn, &before).await,
    )
    .await;
    assert_eq!(crashed, testing::Crashed(Crash::BeforeCommit));
    assert_eq!(
        testing::count_async(&mut check, &credits_of(&before)).await,
        0
    );
    assert!(credit(&mut check, &before).await.unwrap().is_processed());
    testing::assert_once_async(&mut check, &credits_of(&before)).await;

    let after = Credit::new(101);
    testing::crash_async(db.connect_async().await, Crash::AfterCommit, async |conn| {
        credit(conn, &after).await
    })
    .await;
    assert!(credit(&mut check, &after).await.unwrap().is_duplicate());
    testing::assert_once_async(&mut check, &credits_of(&after)).await;
}
