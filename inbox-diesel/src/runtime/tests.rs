//! The runtime against scripted steps: what it does on a deadlock, and with claims that
//! change under it — without a server, in the order it does it.

use std::collections::VecDeque;

use diesel::result::DatabaseErrorKind;
use inbox_core::{Consumer, InFlightOutcome, InboxSchema, RetryPolicy, StaleClaimOutcome};

use super::checked::*;
use super::claim_mode::*;
use super::steps::*;
use super::stored::*;
use super::transaction::*;
use std::time::Duration;

use diesel::QueryResult;
use diesel::result::Error as DieselError;
use inbox_core::{HandlerOutcome, MessageKey};

use crate::dialect::claim::{ClaimAnswer, ClaimState, ClaimStep};
use crate::dialect::layout::Layout;
use crate::error::Error;
use crate::io::complete_now;
use crate::runtime::claim::ClaimSpec;
use crate::runtime::found::Kept;
use crate::runtime::found::Presence;
use crate::runtime::sync::Immediate;
use crate::schema::check::SchemaError;
use crate::spec::HandlerSpec;
use crate::value::Fingerprint;
use inbox_core::Isolation;

#[test]
fn a_check_is_remembered_by_what_stays_with_the_connection() {
    // Inside the connection's bytes (an inline `NoInstrumentation`, at its end for a
    // zero-sized one): the connection's address.
    let pg = false;
    assert_eq!(identity(pg, 1000, 64, 1000), 1000);
    assert_eq!(identity(pg, 1000, 64, 1032), 1000);
    assert_eq!(identity(pg, 1000, 64, 1064), 1000);
    // Elsewhere (a box, an `Arc`): the instrumentation's, wherever the connection is.
    assert_eq!(identity(pg, 1000, 64, 5000), 5000);
    assert_eq!(identity(pg, 2000, 64, 5000), 5000);
    assert_eq!(identity(pg, 1000, 64, 999), 999);
    // MySQL and MariaDB: per handler; the session mark checks each session.
    let mysql = true;
    assert_eq!(
        identity(mysql, 1000, 64, 5000),
        identity(mysql, 2000, 64, 7000)
    );
}

static SPEC: HandlerSpec = HandlerSpec {
    consumer: Consumer::from_validated("credit"),
    schema: InboxSchema::DEFAULT,
    retry: RetryPolicy::new(3),
    isolation: Isolation::ServerDefault,
    sqlite_busy_timeout_ms: HandlerSpec::SQLITE_BUSY_TIMEOUT_MS,
    precheck: false,
    idle_in_transaction_ms: HandlerSpec::IDLE_IN_TRANSACTION_MS,
    in_flight_when_locked: false,
};

const CLAIM: ClaimSpec = ClaimSpec { lease_ms: 1_000 };

/// What the steps did (the body writes there too, as its "connection"), and what the
/// marker's claims answer, in turn.
#[derive(Default)]
struct Script {
    did: Vec<String>,
    claims: VecDeque<QueryResult<bool>>,
    claim_steps: VecDeque<ClaimAnswer>,
}

impl Steps for &mut Script {
    type Conn = Vec<String>;

    fn net(&mut self) -> Option<usize> {
        None
    }

    fn identity(&mut self) -> usize {
        std::ptr::from_mut(&mut self.did) as usize
    }

    fn discard(&mut self) {}

    fn conn(&mut self) -> &mut Vec<String> {
        &mut self.did
    }

    async fn begin(&mut self, _: &'static HandlerSpec, _: Layout) -> QueryResult<()> {
        self.did.push("begin".into());
        Ok(())
    }

    async fn end(&mut self, _: &'static HandlerSpec, _: Layout) -> QueryResult<()> {
        Ok(())
    }

    async fn claim(
        &mut self,
        _: &'static HandlerSpec,
        _: &MessageKey,
        _: Layout,
    ) -> QueryResult<bool> {
        self.did.push("claim".into());
        self.claims.pop_front().expect("scripted")
    }

    async fn claim_batch(
        &mut self,
        _: &'static HandlerSpec,
        _: &[uuid::Uuid],
        _: Option<&[String]>,
        _: Layout,
    ) -> QueryResult<Vec<uuid::Uuid>> {
        unreachable!("one message")
    }

    async fn commit(&mut self, _: &'static HandlerSpec, _: Layout) -> QueryResult<()> {
        self.did.push("commit".into());
        Ok(())
    }

    async fn roll_back_and_end(&mut self, _: &'static HandlerSpec, _: Layout) -> QueryResult<()> {
        self.did.push("roll back".into());
        Ok(())
    }

    async fn roll_back(&mut self) -> QueryResult<()> {
        self.did.push("roll back".into());
        Ok(())
    }

    async fn verify(&mut self, _: &'static HandlerSpec, _: bool) -> Result<Layout, SchemaError> {
        Ok(Layout::default())
    }

    async fn wait_for_locks(&mut self, _: &'static HandlerSpec, _: bool) -> QueryResult<()> {
        Ok(())
    }

    async fn ended_by_server(&mut self) -> bool {
        false
    }

    fn stop_caching_statements(&mut self) {}

    async fn prepare_claim(&mut self, _: &'static HandlerSpec) -> QueryResult<()> {
        Ok(())
    }

    async fn claim_step(
        &mut self,
        _: &'static HandlerSpec,
        _: &MessageKey,
        step: ClaimStep,
    ) -> QueryResult<ClaimAnswer> {
        let name = match step {
            ClaimStep::Insert { .. } => "insert".to_owned(),
            ClaimStep::Read | ClaimStep::Precheck { .. } => "read".to_owned(),
            ClaimStep::TakeOver { seen, .. } => format!("take over {seen}"),
            ClaimStep::Stamp { attempt, .. } => format!("stamp {attempt}"),
            ClaimStep::Release { attempt, .. } => format!("release {attempt}"),
        };
        self.did.push(name);
        Ok(self.claim_steps.pop_front().expect("scripted"))
    }

    async fn markers_present(
        &mut self,
        _: &'static HandlerSpec,
        ids: &[uuid::Uuid],
        _: bool,
    ) -> QueryResult<Presence> {
        self.did.push("confirm".into());
        Ok(Presence {
            present: ids.len(),
            completed: ids.len(),
            live_claims: 0,
        })
    }

    fn depth(&mut self) -> u32 {
        0
    }

    async fn savepoint(&mut self) -> QueryResult<()> {
        unreachable!("not scripted")
    }

    async fn release(&mut self) -> QueryResult<()> {
        unreachable!("not scripted")
    }

    async fn store_result(
        &mut self,
        _: &'static HandlerSpec,
        _: &MessageKey,
        text: String,
        fingerprint: Option<Fingerprint>,
        _: Option<u32>,
    ) -> QueryResult<usize> {
        let with = if fingerprint.is_some() {
            " and fingerprint"
        } else {
            ""
        };
        self.did.push(format!("store {text}{with}"));
        Ok(1)
    }

    async fn read_kept(
        &mut self,
        _: &'static HandlerSpec,
        _: &MessageKey,
        _: (bool, bool),
        _: bool,
    ) -> QueryResult<Kept> {
        self.did.push("read kept".into());
        Ok(Kept::default())
    }

    async fn write_fingerprint(
        &mut self,
        _: &'static HandlerSpec,
        _: &MessageKey,
        _: Fingerprint,
    ) -> QueryResult<usize> {
        self.did.push("fingerprint".into());
        Ok(1)
    }

    async fn pause(&mut self, _: Duration) {
        self.did.push("pause".into());
    }
}

fn body(did: &mut Vec<String>) -> Result<(), Error> {
    did.push("body".into());
    Ok(())
}

fn deadlock() -> DieselError {
    DieselError::DatabaseError(
        DatabaseErrorKind::Unknown,
        Box::new("deadlock detected".to_owned()),
    )
}

#[test]
fn a_deadlock_on_the_marker_is_retried_in_a_fresh_transaction() {
    let mut script = Script {
        claims: VecDeque::from([Err(deadlock()), Ok(true)]),
        ..Script::default()
    };
    let key = MessageKey::integer(1);
    let decided = complete_now(drive(
        &mut script,
        &key,
        Handling {
            spec: &SPEC,
            body: Immediate(body),
            probe: |_: &mut _, _, _| None,
            in_flight: None::<std::convert::Infallible>,
            remembered: Remembered::nothing(),
            inbox_error: std::convert::identity,
        },
    ));
    assert!(matches!(decided, Ok(Decided::Processed(()))));
    assert_eq!(
        script.did,
        [
            "begin",
            "claim",
            "roll back",
            "pause",
            "begin",
            "claim",
            "body",
            "commit"
        ]
    );
}

/// Message 1 in claim mode, against the script, answered in the outcome type `A`.
fn claim<A: HandlerOutcome<(), InFlightWitness = ()>>(script: &mut Script) -> Result<A, Error> {
    complete_now(drive_claim(
        script,
        CLAIM,
        MessageKey::integer(1),
        Handling {
            spec: &SPEC,
            body: Immediate(body),
            probe: (),
            in_flight: None,
            remembered: Remembered::nothing(),
            inbox_error: std::convert::identity,
        },
    ))
}

/// A script whose claim steps answer `answers`, in turn.
fn claim_steps<const N: usize>(answers: [ClaimAnswer; N]) -> Script {
    Script {
        claim_steps: VecDeque::from(answers),
        ..Script::default()
    }
}

/// A claim read in `state`, at `attempt`.
fn read(state: ClaimState, attempt: u32) -> ClaimAnswer {
    ClaimAnswer::Read(Some((state, attempt, Duration::ZERO)))
}

/// A claim of attempt 1 in `state`, read after the insert found the row; the takeover and
/// the stamp that follow, where the runtime sends them, each change a row.
fn taken_over(state: ClaimState) -> Script {
    claim_steps([
        ClaimAnswer::Rows(0),
        read(state, 1),
        ClaimAnswer::Rows(1),
        ClaimAnswer::Rows(1),
    ])
}

#[test]
fn a_claim_taken_over_between_the_read_and_the_takeover_is_in_flight() {
    let mut script = claim_steps([
        ClaimAnswer::Rows(0),
        read(ClaimState::Released, 1),
        // Another delivery took it over first: the next round finds its live claim.
        ClaimAnswer::Rows(0),
        ClaimAnswer::Rows(0),
        read(ClaimState::Live, 2),
    ]);
    let outcome = claim(&mut script);
    assert!(
        matches!(outcome, Ok(InFlightOutcome::InFlight { .. })),
        "{outcome:?}"
    );
    assert_eq!(
        script.did,
        ["insert", "read", "take over 1", "insert", "read"]
    );
}

/// A released claim, and an expired one when the outcome type has no stale claims, are
/// taken over by the next attempt, which stamps them.
#[test]
fn a_released_or_expired_claim_is_taken_over_and_stamped_by_its_attempt() {
    for state in [ClaimState::Released, ClaimState::Expired] {
        let mut script = taken_over(state);
        let outcome = claim(&mut script);
        assert!(
            matches!(outcome, Ok(InFlightOutcome::Processed(()))),
            "{state:?}: {outcome:?}"
        );
        assert_eq!(
            script.did,
            ["insert", "read", "take over 1", "body", "stamp 2"],
            "{state:?}"
        );
    }
}

#[test]
fn a_stamp_that_finds_the_claim_taken_over_is_claim_lost() {
    let mut script = claim_steps([ClaimAnswer::Rows(1), ClaimAnswer::Rows(0)]);
    let outcome: Result<InFlightOutcome<()>, _> = claim(&mut script);
    assert!(
        matches!(outcome, Err(Error::ClaimLost { attempt: 1 })),
        "{outcome:?}"
    );
    assert_eq!(script.did, ["insert", "body", "stamp 1"]);
}

#[test]
fn an_expired_claim_is_reported_when_the_outcome_type_holds_stale_claims() {
    let mut script = taken_over(ClaimState::Expired);
    let outcome = claim(&mut script);
    assert!(
        matches!(
            outcome,
            Ok(StaleClaimOutcome::StaleClaim { attempts: 1, .. })
        ),
        "{outcome:?}"
    );
    assert_eq!(script.did, ["insert", "read"]);
}
