//! The startup check's cache: which connection and database a handler was checked on, what
//! the check found, and when to check again.

use diesel::result::Error as DieselError;
use inbox_core::ErrorClass;

use crate::classify;
use crate::dialect::layout::Layout;
use crate::error::Error;
use crate::runtime::failure::discard;
use crate::runtime::steps::Steps;
use crate::schema::check::SchemaError;
use crate::spec::HandlerSpec;
use crate::telemetry;

/// Checks, the first time a connection runs a handler, that the handler's inbox table can
/// recognise a duplicate, and reads which optional columns it has (its [`Layout`]): on MySQL and MariaDB a plain `INSERT` of the marker succeeds twice
/// on a table whose unique index was dropped or made non-unique, and the body would run
/// twice; PostgreSQL and SQLite refuse `ON CONFLICT` without the index, but with an error that
/// does not say what to fix. The check reads the catalog, outside any transaction; it is
/// remembered per thread for the connection (by its [`identity`]) and the handler, so later
/// deliveries pay a lookup in a short list — until a statement fails for a missing table or
/// column ([`forget_check`]), when the next delivery reads the catalog again. Returns the
/// layout and the settings the handler's statements run with ([`pinned`]), both remembered
/// with the check.
pub(super) async fn schema_checked<S: Steps, E>(
    steps: &mut S,
    spec: &'static HandlerSpec,
    claim: bool,
    inbox_error: fn(Error) -> E,
) -> Result<(Layout, &'static HandlerSpec), E> {
    let key = check_key(steps, spec);
    let known = CHECKED.with_borrow(|checked| {
        checked
            .iter()
            .find(|(checked, _, _)| *checked == key)
            .map(|&(_, layout, run)| (layout, run))
    });
    if let Some(known) = known {
        return Ok(known);
    }
    let verified = match steps.verify(spec, claim).await {
        // The check's own statements met a transaction-mode pooler's shared server
        // connection (diesel's statement names taken or missing there): uncached, once more.
        Err(SchemaError::Database(e))
            if classify(&e, &spec.schema) == ErrorClass::StatementLost =>
        {
            steps.stop_caching_statements();
            steps.verify(spec, claim).await
        }
        verified => verified,
    };
    match verified {
        Ok(layout) => {
            tracing::debug!(
                target: "inbox::check",
                table = spec.schema.table(),
                consumer = %spec.consumer,
                "checked the inbox table on this connection"
            );
            let run = pinned(spec, layout);
            CHECKED.with_borrow_mut(|checked| {
                // Bounded: connections come and go in a pool; forgetting them all costs one
                // check each of those still in use.
                if checked.len() == CHECKED_MAX {
                    checked.clear();
                }
                checked.push((key, layout, run));
            });
            Ok((layout, run))
        }
        Err(SchemaError::Database(source)) => {
            // The check's own reads failed for a reason the runtime cannot read (a session
            // setting its catalog queries meet, `max_join_size`): nothing about the message —
            // an alert, never a dead letter.
            let class = match classify(&source, &spec.schema) {
                ErrorClass::Other | ErrorClass::UniqueViolation { .. } => ErrorClass::Schema,
                class => class,
            };
            // Outside a transaction only: a joined handler's check runs inside the caller's,
            // whose own rollback must still run.
            if steps.depth() == 0 {
                discard(steps, Some(&class));
            }
            telemetry::failed(spec, class.label());
            Err(inbox_error(Error::Database {
                class,
                attempts: 1,
                source,
            }))
        }
        Err(problem) => {
            tracing::error!(error = %problem, "the inbox table or its session is not as the runtime needs it; refusing to process");
            let error = Error::Schema(problem);
            telemetry::failed(spec, error.class().label());
            Err(inbox_error(error))
        }
    }
}

/// The handler's settings with its table named as the check found it ([`Layout::pinned`]):
/// what its statements run with. The check itself, and what is remembered of it, go by the
/// handler's own settings. Looked up once per check ([`schema_checked`] remembers it), not
/// per delivery.
pub(super) fn pinned(spec: &'static HandlerSpec, layout: Layout) -> &'static HandlerSpec {
    type Pinned = (usize, &'static str, &'static HandlerSpec);
    static PINNED: std::sync::Mutex<Vec<Pinned>> = std::sync::Mutex::new(Vec::new());
    let Some(table) = layout.pinned else {
        return spec;
    };
    let address = std::ptr::from_ref(spec) as usize;
    let mut pinned = PINNED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&(_, _, found)) = pinned
        .iter()
        .find(|&&(at, name, _)| at == address && name == table)
    {
        return found;
    }
    // One per handler and table, for the life of the process.
    let found: &'static HandlerSpec = Box::leak(Box::new(HandlerSpec {
        schema: inbox_core::InboxSchema::new_unchecked(table, spec.schema.constraint()),
        ..spec.clone()
    }));
    pinned.push((address, table, found));
    found
}

/// The connection (by its [`identity`]) and the handler a check is remembered for.
pub(super) fn check_key<S: Steps>(steps: &mut S, spec: &HandlerSpec) -> (usize, usize) {
    (steps.identity(), std::ptr::from_ref(spec) as usize)
}

/// What a check is remembered by for a connection at `at`, `size` bytes long, whose diesel
/// instrumentation is at `instrumentation`. `per_handler` (MySQL and MariaDB, whose sessions
/// the check marks, [`Catalogs::MARKS_SESSIONS`](crate::dialect::catalog::Catalogs)):
/// nothing (`0`), the check is remembered per handler — the server refuses the marker of a session that was
/// not checked for the statements it is given ([`SessionMark`](crate::dialect::layout::SessionMark)),
/// and that session is checked then. PostgreSQL and SQLite: the instrumentation's address where it lives
/// outside the connection's own bytes — on the heap, where it stays while the connection
/// moves (diesel-async's `AsyncPgConnection` and `SyncConnectionWrapper` keep it behind an
/// `Arc`; any connection given one with `set_instrumentation`, or by
/// `set_default_instrumentation`, such as the [`Net`](crate::tripwire::net::Net), keeps it
/// in a `Box`) — and otherwise the connection's own address. A pool moves its connections
/// in and out of its idle list, so a connection's address changes with each checkout; keyed
/// by it, the check ran again on most deliveries of a busy pool. An address, a heap one like
/// a connection's, can be taken by a connection to another database after the old one is
/// gone: what is remembered here only names the statements to send, and the server decides
/// whether they may run — each marker insert requires the database and table the check read
/// ([`DatabaseMark`](crate::dialect::layout::DatabaseMark)), and the connection is checked
/// where they are not this session's.
pub(crate) fn identity(per_handler: bool, at: usize, size: usize, instrumentation: usize) -> usize {
    if per_handler {
        return 0;
    }
    match (at..=at.saturating_add(size)).contains(&instrumentation) {
        true => at,
        false => instrumentation,
    }
}

/// Forgets the check of this connection and handler: a statement failed for a missing table
/// or column, so the table changed since (a `key_text` column dropped, the table recreated),
/// and the next delivery reads the catalog again rather than writing what it remembered.
pub(super) fn forget_check<S: Steps>(steps: &mut S, spec: &HandlerSpec) {
    let key = check_key(steps, spec);
    CHECKED.with_borrow_mut(|checked| checked.retain(|(checked, _, _)| *checked != key));
}

/// Whether a failed statement of the handler's own (begin, claim, commit) says that the table
/// is not what this connection's check found — a column or the unique index gone, the table
/// recreated — or that the server session was not checked for the statements it was given
/// ([`SessionMark`](crate::dialect::layout::SessionMark)), or is an error nothing recognises:
/// on a session the check has not seen, the server speaks whatever language the session
/// was given, not yet English ([`check_table`](crate::schema::check::check_table)); the
/// check sets that, and the next attempt's error, if any, reads as what it is. Once per
/// delivery.
pub(super) fn needs_recheck(error: &DieselError, spec: &HandlerSpec) -> bool {
    // The runtime's own refusal of a stored result (over its limit, not JSON), not the
    // server's: the same again on any session.
    if let DieselError::QueryBuilderError(inner) = error
        && matches!(inner.downcast_ref::<Error>(), Some(Error::StoredResult(_)))
    {
        return false;
    }
    if crate::dialect::layout::unchecked_session(error) {
        // Every session a MySQL pool opens, once: not news.
        tracing::debug!("this session has not checked the inbox table; checking it");
        return true;
    }
    match classify(error, &spec.schema) {
        ErrorClass::Schema => {
            tracing::info!("a statement found the inbox table not as checked; checking it again");
            true
        }
        ErrorClass::Other => {
            tracing::info!(error = %error, "an error of the runtime's own statement not recognised; checking the session");
            true
        }
        _ => false,
    }
}

/// Checks the table again on this connection, once per delivery: the attempt then runs
/// again with what the check finds, or the delivery fails with `Error::Schema`.
pub(super) async fn rechecked_layout<S: Steps, E>(
    steps: &mut S,
    spec: &'static HandlerSpec,
    claim: bool,
    inbox_error: fn(Error) -> E,
) -> Result<(Layout, &'static HandlerSpec), E> {
    forget_check(steps, spec);
    schema_checked(steps, spec, claim, inbox_error).await
}

/// A check remembered: the connection and handler, the layout found, the settings the
/// handler's statements run with.
pub(super) type Checked = ((usize, usize), Layout, &'static HandlerSpec);

/// How many (connection, handler) pairs a thread remembers as checked.
pub(super) const CHECKED_MAX: usize = 256;

thread_local! {
    static CHECKED: std::cell::RefCell<Vec<Checked>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// Whether `error` is a prepared statement lost or clashing on the server (a
/// transaction-mode pooler): then the connection stops caching statements, and the caller
/// runs the statement again, once.
pub(super) fn statement_lost<S: Steps>(
    steps: &mut S,
    error: &DieselError,
    spec: &HandlerSpec,
) -> bool {
    if classify(error, &spec.schema) != ErrorClass::StatementLost {
        return false;
    }
    stop_caching(steps);
    true
}

/// The connection stops caching prepared statements (diesel's cache: unnamed statements
/// then), and says so.
pub(super) fn stop_caching<S: Steps>(steps: &mut S) {
    tracing::warn!(
        "a prepared statement was missing or taken on the server (a transaction-mode \
         pooler?): this connection no longer caches prepared statements"
    );
    steps.stop_caching_statements();
}
