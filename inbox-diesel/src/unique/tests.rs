//! The steps against a scripted connection: what they do on a deadlock, inside and outside a
//! transaction, and on the key's own violation — without a server, in the order they do it.

use std::time::Duration;

use diesel::connection::{TransactionDepthChange, TransactionManagerStatus};
use diesel::result::DatabaseErrorKind;

use super::*;
use crate::dialect::Row;

const EMAIL: UniqueKey = UniqueKey::new("users", "ux_users_email", &["email"]);

/// SQLite's dialect, whose key lock and probe send no statement: the script is what
/// the steps did with the transaction, and what the caller's closures did.
#[derive(Default)]
struct Script {
    status: TransactionManagerStatus,
    did: Vec<&'static str>,
}

impl Script {
    fn depth(&mut self, change: TransactionDepthChange) -> QueryResult<()> {
        match &mut self.status {
            TransactionManagerStatus::Valid(status) => status.change_transaction_depth(change),
            TransactionManagerStatus::InError => Err(DieselError::BrokenTransactionManager),
        }
    }
}

impl Io for Script {
    type Backend = diesel::sqlite::Sqlite;

    async fn execute(&mut self, _: &Sql) -> QueryResult<usize> {
        unreachable!("no statement on SQLite's path")
    }

    async fn load<R: Row>(&mut self, _: &Sql) -> QueryResult<Vec<R>> {
        unreachable!("no query on SQLite's path")
    }

    async fn batch(&mut self, _: &str) -> QueryResult<()> {
        unreachable!("not claim mode")
    }

    async fn execute_claim(
        &mut self,
        _: crate::dialect::claim::ClaimSql<'_, Self::Backend>,
    ) -> QueryResult<usize> {
        unreachable!("not claim mode")
    }

    async fn read_claim(
        &mut self,
        _: crate::dialect::claim::ClaimRead<'_, Self::Backend>,
    ) -> QueryResult<Vec<crate::dialect::claim::ClaimRow>> {
        unreachable!("not claim mode")
    }

    async fn run<Q>(&mut self, _: Q) -> QueryResult<usize>
    where
        Q: diesel::query_builder::QueryFragment<Self::Backend>
            + diesel::query_builder::QueryId
            + Send,
    {
        unreachable!("no statement on SQLite's path")
    }

    async fn insert_marker(
        &mut self,
        _: crate::dialect::marker::ClaimMarker<'_, Self::Backend>,
    ) -> QueryResult<usize> {
        unreachable!("no marker here")
    }

    async fn insert_markers(
        &mut self,
        _: crate::dialect::marker::ClaimMarkers<'_, Self::Backend, diesel::sql_types::Binary>,
    ) -> QueryResult<Vec<uuid::Uuid>> {
        unreachable!("no marker here")
    }

    async fn begin_sql(&mut self, _: &str) -> QueryResult<()> {
        unreachable!("the steps open transactions through the manager")
    }

    async fn begin_transaction(&mut self) -> QueryResult<()> {
        self.did.push("begin");
        self.depth(TransactionDepthChange::IncreaseDepth)
    }

    async fn commit_transaction(&mut self) -> QueryResult<()> {
        self.did.push("commit");
        self.depth(TransactionDepthChange::DecreaseDepth)
    }

    async fn rollback_transaction(&mut self) -> QueryResult<()> {
        self.did.push("roll back");
        self.depth(TransactionDepthChange::DecreaseDepth)
    }

    fn transaction_status(&mut self) -> &mut TransactionManagerStatus {
        &mut self.status
    }

    async fn sleep(&mut self, _: Duration) {
        self.did.push("sleep");
    }
}

impl Transactions for Script {
    type Conn = Vec<&'static str>;

    fn conn(&mut self) -> &mut Vec<&'static str> {
        &mut self.did
    }

    async fn begin_write(&mut self) -> QueryResult<()> {
        self.did.push("begin write");
        self.depth(TransactionDepthChange::IncreaseDepth)
    }
}

fn server_error(kind: DatabaseErrorKind, message: &str) -> DieselError {
    DieselError::DatabaseError(kind, Box::new(message.to_owned()))
}

fn deadlock() -> DieselError {
    server_error(DatabaseErrorKind::Unknown, "deadlock detected")
}

fn the_keys_violation() -> DieselError {
    server_error(
        DatabaseErrorKind::UniqueViolation,
        "UNIQUE constraint failed: users.email",
    )
}

/// An insert that answers `answers` in turn.
fn insert(
    mut answers: Vec<QueryResult<i64>>,
) -> Immediate<impl FnMut(&mut Vec<&'static str>) -> QueryResult<i64>> {
    answers.reverse();
    Immediate(move |did: &mut Vec<&'static str>| {
        did.push("insert");
        answers.pop().expect("no more attempts than answers")
    })
}

fn reread(row: i64) -> Immediate<impl FnMut(&mut Vec<&'static str>) -> QueryResult<i64>> {
    Immediate(move |did: &mut Vec<&'static str>| {
        did.push("re-read");
        Ok(row)
    })
}

/// `insert_or_get` of [`EMAIL`] on `script`, its insert answering `answers` in turn and its
/// re-read `row`.
fn insert_or_get(
    script: &mut Script,
    answers: Vec<QueryResult<i64>>,
    row: i64,
) -> Result<Created<i64>, UniqueError> {
    complete_now(insert_or_get_steps(
        script,
        &EMAIL,
        &mut insert(answers),
        &mut reread(row),
    ))
}

#[test]
fn a_deadlock_outside_a_transaction_is_retried_in_a_fresh_one() {
    let mut script = Script::default();
    let created = insert_or_get(&mut script, vec![Err(deadlock()), Ok(7)], 0);
    assert_eq!(created.unwrap(), Created::New(7));
    assert_eq!(
        script.did,
        [
            "begin",
            "insert",
            "roll back",
            "sleep",
            "begin",
            "insert",
            "commit"
        ]
    );
}

#[test]
fn a_deadlock_inside_the_callers_transaction_is_returned_after_its_savepoint() {
    let mut script = Script::default();
    script.depth(TransactionDepthChange::IncreaseDepth).unwrap();
    let created = insert_or_get(&mut script, vec![Err(deadlock()), Ok(7)], 0);
    assert!(
        matches!(created, Err(ref e) if e.is_transient()),
        "{created:?}"
    );
    assert_eq!(script.did, ["begin", "insert", "roll back"]);
    // The caller's transaction is still open, for the caller to roll back and run again.
    assert_eq!(in_transaction(&mut script).ok(), Some(true));
}

#[test]
fn the_keys_violation_reads_the_winners_row_after_the_rollback() {
    let mut script = Script::default();
    let created = insert_or_get(&mut script, vec![Err(the_keys_violation())], 42);
    assert_eq!(created.unwrap(), Created::Existing(42));
    assert_eq!(script.did, ["begin", "insert", "roll back", "re-read"]);
}

#[test]
fn retries_stop_after_the_last_one() {
    let mut script = Script::default();
    let answers = (0..=UniqueKey::RETRIES).map(|_| Err(deadlock())).collect();
    let created = insert_or_get(&mut script, answers, 0);
    assert!(created.is_err());
    let sleeps = script.did.iter().filter(|&&d| d == "sleep").count();
    assert_eq!(sleeps, UniqueKey::RETRIES as usize);
}

#[test]
fn serialize_on_runs_its_body_in_the_write_transaction_and_commits() {
    let mut script = Script::default();
    let mut body = once(|did: &mut Vec<&'static str>| {
        did.push("body");
        Ok::<_, UniqueError>(1)
    });
    let result = complete_now(serialize_on_steps(&mut script, "tenant:acme", &mut body));
    assert_eq!(result.unwrap(), 1);
    assert_eq!(script.did, ["begin write", "body", "commit"]);
}
