// `transaction = "caller"`: a job runner's shape — a job row taken in the runner's own
// transaction, its message applied by a handler that joins that transaction, the row deleted
// in it — on one backend: included by each backend's suite into a module that names `Db`
// (the fixture), `DbConnection` (what `Db::connect` returns) and `TAKE_JOB` (the statement
// that takes the next job, skipping those another worker holds where the backend can).
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use inbox_diesel::testing::{self, Crash};
use inbox_diesel::{Action, Outcome, idempotent};
use inbox_tests::{AppError, Credit, credits};

const JOBS: &str = "CREATE TABLE jobs (id BIGINT PRIMARY KEY, message BIGINT NOT NULL)";

/// The job's effect: its message's credit, written in the job's transaction.
#[idempotent(consumer = "jobs", key = msg.id, transaction = "caller")]
fn notify(conn: &mut DbConnection, msg: &Credit) -> Result<(), AppError> {
    write_credit(conn, msg)?;
    inbox_diesel::crash_point("in-the-body");
    Ok(())
}

/// The same effect, then a failure of the body's own.
#[idempotent(consumer = "jobs", key = msg.id, transaction = "caller")]
fn notify_then_fail(conn: &mut DbConnection, msg: &Credit) -> Result<(), AppError> {
    write_credit(conn, msg)?;
    Err(AppError::Rejected)
}

/// The job's effect: its message's credit row.
fn write_credit(conn: &mut DbConnection, msg: &Credit) -> QueryResult<usize> {
    diesel::insert_into(credits::table)
        .values((
            credits::message.eq(msg.id.to_string()),
            credits::account.eq(msg.account),
            credits::amount.eq(msg.amount),
        ))
        .execute(conn)
}

#[derive(QueryableByName)]
struct Job {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    id: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    message: i64,
}

/// One turn of the job runner: takes a job, applies its message, deletes it — one
/// transaction. `None` when no job was left.
fn work(conn: &mut DbConnection) -> Result<Option<Outcome<()>>, AppError> {
    let outcome = conn.transaction::<_, AppError, _>(|conn| {
        let Some(job) = diesel::sql_query(TAKE_JOB)
            .get_result::<Job>(conn)
            .optional()?
        else {
            return Ok(None);
        };
        inbox_diesel::crash_point("job-taken");
        let outcome = notify(conn, &Credit::new(job.message as u128))?;
        inbox_diesel::crash_point("effect-written");
        diesel::sql_query(format!("DELETE FROM jobs WHERE id = {}", job.id)).execute(conn)?;
        inbox_diesel::crash_point("job-deleted");
        Ok(Some(outcome))
    })?;
    inbox_diesel::crash_point("committed");
    Ok(outcome)
}

/// Whether the runner runs its transaction again: a deadlock, a busy database, a
/// serialization failure — the caller's to retry, as the handler cannot inside it.
fn transient(error: &AppError) -> bool {
    let action = match error {
        AppError::Db(e) => inbox_diesel::classify(e, &inbox_diesel::InboxSchema::DEFAULT).action(),
        AppError::Inbox(e) => e.action(),
        AppError::Rejected => Action::DeadLetter,
    };
    action == Action::RetryLater
}

/// The runner until no job is left; the outcomes it answered.
fn drain(conn: &mut DbConnection) -> Vec<Outcome<()>> {
    let mut outcomes = Vec::new();
    loop {
        match work(conn) {
            Ok(Some(outcome)) => outcomes.push(outcome),
            Ok(None) => return outcomes,
            Err(e) if transient(&e) => continue,
            Err(e) => panic!("the runner failed: {e:?}"),
        }
    }
}

fn credits_of(message: u128) -> String {
    format!(
        "SELECT count(*) FROM credits WHERE message = '{}'",
        Credit::new(message).id
    )
}

fn with_jobs(name: &str, jobs: &[(i64, i64)]) -> Db {
    let db = Db::new(name);
    let mut conn = db.connect();
    conn.batch_execute(JOBS).unwrap();
    for (id, message) in jobs {
        conn.batch_execute(&format!("INSERT INTO jobs VALUES ({id}, {message})"))
            .unwrap();
    }
    db
}

/// The runner dies in each window of a job — with the job taken, inside the body after its
/// write, as the handler returns its work to the runner's transaction (the kit's
/// `BeforeCommit`), after the effect, after the row's deletion, after the commit — and runs
/// again:
/// each message applied once, each job gone, one marker each. Before the commit nothing of
/// the job stayed; after it, the job was gone with its effect.
#[test]
fn a_job_runner_applies_each_message_once_whatever_window_it_dies_in() {
    let points = inbox_tests::JOB_WINDOWS;
    let db = with_jobs("joined_windows", &[]);
    for (n, point) in points.into_iter().enumerate() {
        let message = n as u128 + 1;
        db.connect()
            .batch_execute(&format!("INSERT INTO jobs VALUES ({message}, {message})"))
            .unwrap();
        testing::crash(db.connect(), point, work);
        let committed = point == Crash::At("committed");
        assert_eq!(
            testing::count(&mut db.connect(), &credits_of(message)),
            i64::from(committed),
            "{point:?}: what the crash left"
        );
        assert_eq!(
            testing::count(
                &mut db.connect(),
                &format!("SELECT count(*) FROM jobs WHERE id = {message}")
            ),
            i64::from(!committed),
            "{point:?}: the job"
        );
        // The runner again: the job it left, as if nothing had happened. A server ends the
        // dead runner's session — and lets go of its lock on the job — when it reads the
        // closed connection, which may be after the count above: until then `SKIP LOCKED`
        // passes the job over, and a runner polls again.
        let mut outcomes = drain(&mut db.connect());
        for _ in 0..200 {
            if !outcomes.is_empty() || committed {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(25));
            outcomes = drain(&mut db.connect());
        }
        let processed: Vec<bool> = outcomes.iter().map(Outcome::is_processed).collect();
        assert_eq!(processed, vec![true; usize::from(!committed)], "{point:?}");
        testing::assert_once(&mut db.connect(), &credits_of(message));
    }
    assert_eq!(
        testing::count(&mut db.connect(), "SELECT count(*) FROM jobs"),
        0
    );
    assert_eq!(
        testing::count(&mut db.connect(), "SELECT count(*) FROM inbox"),
        points.len() as i64
    );
}

/// Two jobs carry the same message (the producer enqueued it twice): the second is a
/// duplicate — its body not run — and its row is deleted as well.
#[test]
fn a_job_whose_message_was_applied_is_a_duplicate_and_goes() {
    let db = with_jobs("joined_duplicate", &[(1, 7), (2, 7), (3, 8)]);
    let outcomes = drain(&mut db.connect());
    let processed: Vec<bool> = outcomes.iter().map(Outcome::is_processed).collect();
    assert_eq!(processed, [true, false, true]);
    testing::assert_once(&mut db.connect(), &credits_of(7));
    testing::assert_once(&mut db.connect(), &credits_of(8));
    assert_eq!(
        testing::count(&mut db.connect(), "SELECT count(*) FROM jobs"),
        0
    );
}

/// Copies of one message in jobs that two workers take at the same moment, each from its
/// own connection, released by a barrier: one applies it; the other meets its marker —
/// waiting for the first's commit, or failing as a busy database and running its
/// transaction again — and answers a duplicate. Many rounds.
#[test]
fn workers_racing_over_copies_of_a_message_apply_it_once() {
    let rounds: i64 = 25;
    let jobs: Vec<(i64, i64)> = (0..rounds)
        .flat_map(|r| [(2 * r, r), (2 * r + 1, r)])
        .collect();
    let db = with_jobs("joined_race", &jobs);
    let mut workers = [db.connect(), db.connect()];
    let mut processed = 0;
    for _ in 0..rounds {
        let answers = testing::race(&mut workers, |conn| {
            loop {
                match work(conn) {
                    Ok(outcome) => return outcome,
                    Err(e) if transient(&e) => continue,
                    Err(e) => panic!("{e:?}"),
                }
            }
        });
        processed += answers
            .iter()
            .filter(|a| matches!(a, Some(Outcome::Processed(()))))
            .count();
    }
    // Leftovers of rounds where one worker took both jobs of a message and the other none.
    processed += drain(&mut db.connect())
        .iter()
        .filter(|a| matches!(a, Outcome::Processed(())))
        .count();
    assert_eq!(processed, rounds as usize);
    for r in 0..rounds {
        testing::assert_once(&mut db.connect(), &credits_of(r as u128));
    }
    assert_eq!(
        testing::count(&mut db.connect(), "SELECT count(*) FROM jobs"),
        0
    );
}

/// The caller's transaction rolls back after the handler answered `Processed`: the marker
/// goes with the effect, and the message is new to the next run.
#[test]
fn the_callers_rollback_takes_the_marker_with_it() {
    let db = with_jobs("joined_rollback", &[]);
    let mut conn = db.connect();
    let msg = Credit::new(1);
    let rolled = conn.transaction::<(), AppError, _>(|conn| {
        assert!(notify(conn, &msg)?.is_processed());
        Err(AppError::Rejected)
    });
    assert!(matches!(rolled, Err(AppError::Rejected)));
    assert_eq!(testing::count(&mut conn, &credits_of(1)), 0);
    assert_eq!(testing::count(&mut conn, "SELECT count(*) FROM inbox"), 0);
    let again = conn.transaction::<_, AppError, _>(|conn| notify(conn, &msg));
    assert!(again.unwrap().is_processed());
    testing::assert_once(&mut conn, &credits_of(1));
}

/// A body that fails rolls back to the handler's savepoint: its write and its marker go, the
/// caller's own writes around it stay, and its transaction goes on to commit.
#[test]
fn a_failed_body_rolls_back_only_its_own_part() {
    let db = with_jobs("joined_failed", &[]);
    let mut conn = db.connect();
    conn.transaction::<(), AppError, _>(|conn| {
        conn.batch_execute("INSERT INTO jobs VALUES (1, 1)")?;
        assert!(matches!(
            notify_then_fail(conn, &Credit::new(1)),
            Err(AppError::Rejected)
        ));
        conn.batch_execute("INSERT INTO jobs VALUES (2, 2)")?;
        Ok(())
    })
    .unwrap();
    assert_eq!(testing::count(&mut conn, "SELECT count(*) FROM jobs"), 2);
    assert_eq!(testing::count(&mut conn, &credits_of(1)), 0);
    assert_eq!(testing::count(&mut conn, "SELECT count(*) FROM inbox"), 0);
}

/// Called with no transaction open, the handler refuses before anything is written: its
/// marker and effect would have committed apart from the caller's work.
#[test]
fn a_joining_handler_without_a_transaction_is_refused() {
    let db = with_jobs("joined_none", &[]);
    let mut conn = db.connect();
    let refused = notify(&mut conn, &Credit::new(1));
    let Err(AppError::Inbox(error)) = refused else {
        panic!("{refused:?}")
    };
    assert!(
        matches!(error, inbox_diesel::Error::NoTransactionToJoin),
        "{error:?}"
    );
    assert_eq!(error.action(), Action::Alert);
    assert_eq!(testing::count(&mut conn, &credits_of(1)), 0);
    assert_eq!(testing::count(&mut conn, "SELECT count(*) FROM inbox"), 0);
}

/// The same effect for callers with a transaction and callers without:
/// `transaction = "caller_or_own"` — a message handler a job runner also calls inside its
/// job's transaction, or an HTTP body that applies a message on its request's transaction.
#[idempotent(consumer = "jobs", key = msg.id, transaction = "caller_or_own")]
fn apply(conn: &mut DbConnection, msg: &Credit) -> Result<(), AppError> {
    write_credit(conn, msg)?;
    Ok(())
}

/// One handler for both callers: inside the caller's transaction it joins it (the caller's
/// rollback takes the marker, its commit keeps it), outside any it commits on its own; a
/// message applied either way is a duplicate to the other.
#[test]
fn a_handler_joins_a_callers_transaction_or_runs_its_own() {
    let db = with_jobs("joined_or_own", &[]);
    let mut conn = db.connect();
    // Joined, and rolled back with the caller: nothing stays.
    let rolled = conn.transaction::<(), AppError, _>(|conn| {
        assert!(apply(conn, &Credit::new(1))?.is_processed());
        conn.batch_execute("INSERT INTO jobs VALUES (1, 1)")?;
        Err(AppError::Rejected)
    });
    assert!(matches!(rolled, Err(AppError::Rejected)));
    assert_eq!(testing::count(&mut conn, &credits_of(1)), 0);
    assert_eq!(testing::count(&mut conn, "SELECT count(*) FROM inbox"), 0);
    // On its own: committed at once.
    assert!(apply(&mut conn, &Credit::new(1)).unwrap().is_processed());
    assert_eq!(testing::count(&mut db.connect(), &credits_of(1)), 1);
    // Joined again: the message is a duplicate there, and a new one commits with the
    // caller's write.
    conn.transaction::<(), AppError, _>(|conn| {
        assert!(apply(conn, &Credit::new(1))?.is_duplicate());
        assert!(apply(conn, &Credit::new(2))?.is_processed());
        conn.batch_execute("INSERT INTO jobs VALUES (2, 2)")?;
        Ok(())
    })
    .unwrap();
    assert!(apply(&mut conn, &Credit::new(2)).unwrap().is_duplicate());
    testing::assert_once(&mut conn, &credits_of(1));
    testing::assert_once(&mut conn, &credits_of(2));
    assert_eq!(testing::count(&mut conn, "SELECT count(*) FROM jobs"), 1);
}
