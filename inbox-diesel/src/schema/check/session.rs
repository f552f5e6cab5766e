//! The session the check runs on: MySQL's `autocommit`, a pooler in statement mode, a
//! statement timeout too short for the check's reads, and the server's messages in English.

use super::*;

/// MySQL and MariaDB: whether `autocommit` is on for the session.
pub(crate) async fn autocommit_on<S: Io>(io: &mut S) -> QueryResult<bool> {
    #[derive(diesel::QueryableByName)]
    struct Autocommit {
        #[diesel(sql_type = BigInt)]
        n: i64,
    }
    let sql = Sql::new("SELECT CAST(@@SESSION.autocommit AS SIGNED) AS n");
    let rows = io.load::<Autocommit>(&sql).await?;
    Ok(rows.first().is_some_and(|row| row.n == 1))
}

/// The startup check told of claim handlers ([`Needs::claim`](crate::schema::Needs::claim)),
/// on MySQL and MariaDB: a session with `autocommit` off refused. Claim mode commits its
/// claim and its stamp each on its own; each delivery refuses such a session before it
/// writes (`SessionProblem::AutocommitOff`, an alert that halts a pump) — told at startup
/// instead, where a deploy pipeline reads it.
pub(crate) async fn refuse_autocommit_off<S: Io>(
    io: &mut S,
    schema: &InboxSchema,
) -> Result<(), SchemaError> {
    if S::Backend::BACKEND != Backend::Mysql {
        return Ok(());
    }
    if autocommit_on(io).await.map_err(SchemaError::Database)? {
        return Ok(());
    }
    Err(SchemaError::Session {
        table: schema.table(),
        problem: SchemaProblem::Unsupported {
            found: "autocommit is off on this session".into(),
            why: "claim mode commits its claim and its stamp each on its own: with autocommit \
                  off neither would commit, and the claim would vanish with the connection \
                  after the side effect ran",
            fix: "give claim mode connections with autocommit on: remove `SET autocommit = 0` \
                  from the pool's connection setup, or `SET GLOBAL autocommit = 1` (and in the \
                  server's configuration)"
                .into(),
        },
    })
}

/// PostgreSQL behind PgBouncer in statement mode (`pool_mode = statement`): it allows no
/// transaction of more than one statement and closes the client at the first, with a
/// `FATAL` neither driver hands on — every handler's transaction would fail as a lost
/// connection, on every new connection too, and a pump would retry each message until the
/// broker's delivery limit dead-letters it. [`verify`](crate::schema::verify) opens a
/// transaction of its own and rolls it back: a session that answered the catalog's read a
/// moment ago and is gone at that `BEGIN` is refused, naming the setting. Only outside any
/// transaction (diesel's, or one opened as SQL); elsewhere, and on the other backends,
/// nothing is sent.
pub(crate) async fn refuse_statement_pooling<S: Io>(
    io: &mut S,
    schema: &InboxSchema,
) -> Result<(), SchemaError> {
    if S::Backend::BACKEND != Backend::Postgres
        || !matches!(io.transaction_status().transaction_depth(), Ok(None))
    {
        return Ok(());
    }
    // A transaction opened as SQL, which diesel does not count, is left alone, and asked
    // about without an error that would abort it: a savepoint is refused only outside any
    // transaction (25P01), where there is nothing to abort.
    if io.batch("SAVEPOINT inbox_probe").await.is_ok() {
        return io
            .batch("RELEASE SAVEPOINT inbox_probe")
            .await
            .map_err(SchemaError::Database);
    }
    match io.batch("BEGIN").await {
        Ok(()) => io.batch("ROLLBACK").await.map_err(SchemaError::Database),
        // Sync, a lost connection (libpq drops the `FATAL`); async, PgBouncer's words.
        Err(e)
            if matches!(
                crate::classify(&e, schema),
                inbox_core::ErrorClass::ConnectionLost | inbox_core::ErrorClass::ServerSetting
            ) =>
        {
            Err(SchemaError::Mismatch {
                table: schema.table(),
                resolved: None,
                problems: vec![SchemaProblem::Unsupported {
                    found: "the session closed at a BEGIN of its own, right after it answered \
                            the catalog's read"
                        .into(),
                    why: "PgBouncer in statement mode (`pool_mode = statement`) allows no \
                          transaction and closes the client: every handler's transaction would \
                          fail as a lost connection, on every connection",
                    fix: "set `pool_mode = transaction` (with diesel's statement cache off) or \
                          `session` for the consumers' database; if no pooler is there, the \
                          server went away at that moment: verify again"
                        .into(),
                }],
            })
        }
        Err(e) => Err(SchemaError::Database(e)),
    }
}

/// PostgreSQL: a session's `statement_timeout` shorter than the check's catalog reads may
/// take (several milliseconds each, more on a loaded server, the first statements of a new
/// session most) — a role's `statement_timeout = '5ms'` timed the check out on every new
/// session, and every delivery failed as a transient timeout. A row where the session has
/// such a bound.
pub(super) const PG_TIGHT_TIMEOUT: &str = "SELECT setting AS version FROM pg_settings \
     WHERE name = 'statement_timeout' AND setting::bigint BETWEEN 1 AND 29999";

/// The check's reads then run in a transaction of their own, with the bound lifted for it
/// alone (`SET LOCAL`: gone at its end, so nothing of the session changes, also where a
/// transaction-mode pooler hands each transaction another server session). Only where the
/// `BEGIN` opened it: in the simple protocol a statement in `BEGIN`'s message has its
/// timestamp ([`HandlerSpec::POSTGRES_NONE_OPEN`]); in a transaction the application opened
/// as SQL the `BEGIN` only warns, nothing is set, and the check reads as it did.
///
/// [`HandlerSpec::POSTGRES_NONE_OPEN`]: crate::spec::HandlerSpec::POSTGRES_NONE_OPEN
pub(super) const PG_LIFT_TIMEOUT: &str = "BEGIN; SELECT set_config('statement_timeout', '30s', true), \
     set_config('inbox.check', 'lifted', true) \
     WHERE transaction_timestamp() = statement_timestamp()";

/// Whether [`PG_LIFT_TIMEOUT`] began the transaction it lifted the bound in.
pub(super) const PG_LIFTED: &str =
    "SELECT coalesce(current_setting('inbox.check', true), '') AS version";

/// Lifts a short `statement_timeout` for the check's reads ([`PG_TIGHT_TIMEOUT`]): whether
/// it began the transaction that does, which the check then ends. Not inside a transaction
/// diesel knows of (a handler that joins the caller's): the caller's transaction keeps its
/// bound.
pub(super) async fn lift_statement_timeout<S: Io>(io: &mut S) -> bool {
    if S::Backend::BACKEND != Backend::Postgres
        || !matches!(io.transaction_status().transaction_depth(), Ok(None))
    {
        return false;
    }
    let tight = io
        .load::<ServerRow>(&Sql::new(PG_TIGHT_TIMEOUT))
        .await
        .is_ok_and(|rows| !rows.is_empty());
    if !tight {
        return false;
    }
    if io.batch(PG_LIFT_TIMEOUT).await.is_err() {
        // Its `BEGIN` may have opened the transaction its `SELECT` then failed in (timed
        // out under the very bound it lifts): ended here, or every read of the check after
        // it would fail as an aborted transaction's (25P02, an alert) instead of as itself.
        let _ = io.batch("ROLLBACK").await;
        return false;
    }
    io.load::<ServerRow>(&Sql::new(PG_LIFTED))
        .await
        .is_ok_and(|rows| rows.iter().any(|row| row.version == "lifted"))
}

/// MySQL and MariaDB: the session's messages in English, unless they are already (`en_GB`
/// stays `en_GB`). Any session may set its own `lc_messages`.
pub(super) const MYSQL_ENGLISH: &str =
    "SET SESSION lc_messages = IF(@@lc_messages LIKE 'en\\_%', @@lc_messages, 'en_US')";

/// PostgreSQL: the session's messages in English where the setting names another language
/// (or none: an empty `lc_messages` takes the server's environment), now or after a `RESET`
/// (`reset_val`: the role's, the database's or the server's setting). A row where either
/// does: the handler's transactions then set English for themselves. Only a superuser, or
/// a role granted `SET` on the parameter, may; see [`english_messages`]. Read from the reset
/// value as well, because a session can be English already without being so by default: the
/// marker's statement prepared on it set English before a check ran there
/// (`PgMarker::prepared_and`).
pub(super) const PG_ENGLISH: &str = "SELECT set_config('lc_messages', 'C', false) FROM pg_settings \
     WHERE name = 'lc_messages' AND (reset_val !~ '^(C|POSIX|en)([._@]|$)' \
     OR current_setting('lc_messages') !~ '^(C|POSIX|en)([._@]|$)')";

/// PostgreSQL: `lc_messages` as a new session of the role starts with it (`reset_val`: the
/// role's, the database's or the server's setting), or `english` where that is English.
pub(super) const PG_DEFAULT_MESSAGES: &str = "SELECT CASE WHEN reset_val ~ \
     '^(C|POSIX|en)([._@]|$)' THEN 'english' ELSE reset_val END AS version FROM pg_settings \
     WHERE name = 'lc_messages'";

/// The one value `sql` reads (as `version`), empty where it reads no row.
async fn read_setting<S: Io>(io: &mut S, sql: &'static str) -> Result<String, SchemaError> {
    Ok(io
        .load::<ServerRow>(&Sql::new(sql))
        .await
        .map_err(SchemaError::Database)?
        .into_iter()
        .next()
        .map(|row| row.version)
        .unwrap_or_default())
}

/// PostgreSQL, claim mode: refused where a new session of the role speaks another language.
///
/// The startup check sets its own session's messages to English, and each handler
/// transaction sets them again for itself (`SET LOCAL`). Claim mode's statements run outside
/// any transaction, each on whichever server session a transaction-mode pooler has free:
/// one the check never ran on, or one reset since (`DISCARD ALL`), where the role's default
/// holds. There a wait before the statement runs — for a migration's lock on the table — or
/// a prepared statement the reset dropped fails in that language, read as an unknown error:
/// a schema fault, an alert that halts a pump (an operator's trial: a Japanese server behind
/// PgBouncer, three in three). Each claim statement sets English for its server session
/// before it waits for a row, but not before the statement starts. The role's own default,
/// `ALTER ROLE … SET lc_messages = 'C'`, holds on every session from its first statement.
pub(super) async fn refuse_default_messages_for_claims<S: Io>(
    io: &mut S,
    schema: &InboxSchema,
) -> Result<(), SchemaError> {
    if S::Backend::BACKEND != Backend::Postgres {
        return Ok(());
    }
    let default = read_setting(io, PG_DEFAULT_MESSAGES).await?;
    if default == "english" {
        return Ok(());
    }
    Err(SchemaError::Session {
        table: schema.table(),
        problem: SchemaProblem::Unsupported {
            found: format!(
                "claim mode, for a role whose sessions start with their server messages in \
                 `lc_messages = '{default}'`"
            ),
            why: "claim mode's statements run outside any transaction, each on whichever \
                  server session a transaction-mode pooler has free, where the role's default \
                  language holds: a wait for a migration's table lock or a prepared statement \
                  the pooler's reset dropped would fail in that language, read as an unknown \
                  error — a schema fault, an alert",
            fix: "give the role English messages by default: `ALTER ROLE <role> SET \
                  lc_messages = 'C'` (or `ALTER DATABASE <database> SET lc_messages = 'C'`), \
                  which sessions take when they start — a pooler's server sessions open \
                  before it keep their language until they are opened again (PgBouncer: \
                  `RECONNECT` on its console, or `server_lifetime`); the grant of `SET` on \
                  the parameter is not enough for claim mode"
                .into(),
        },
    })
}

/// `lc_messages` as the session has it.
pub(super) const PG_MESSAGES: &str = "SELECT current_setting('lc_messages') AS version";

/// Whether the session's role is a superuser, and the server's version number.
pub(super) const PG_SUPERUSER: &str = "SELECT CASE WHEN rolsuper THEN 'superuser' \
     ELSE current_setting('server_version_num') END AS version \
     FROM pg_roles WHERE rolname = current_user";

/// PostgreSQL 15+: whether the session's role was granted `SET` on `lc_messages`.
pub(super) const PG_MAY_SET_MESSAGES: &str = "SELECT CASE WHEN has_parameter_privilege('lc_messages', \
     'SET') THEN 'granted' ELSE '' END AS version";

/// PostgreSQL: whether the session's role may set `lc_messages` (a superuser, or a role
/// granted `SET` on it); `false` where that cannot be read either.
pub(super) async fn may_set_messages<S: Io>(io: &mut S) -> bool {
    let read = |rows: QueryResult<Vec<ServerRow>>| {
        rows.ok()
            .and_then(|rows| rows.into_iter().next())
            .map(|row| row.version)
            .unwrap_or_default()
    };
    let role = read(io.load::<ServerRow>(&Sql::new(PG_SUPERUSER)).await);
    match role.as_str() {
        "superuser" => true,
        version if version.parse::<u32>().is_ok_and(|v| v >= 150_000) => {
            read(io.load::<ServerRow>(&Sql::new(PG_MAY_SET_MESSAGES)).await) == "granted"
        }
        _ => false,
    }
}

/// Makes the server speak English on this session, before anything else of the check.
///
/// The runtime decides what a failure means by its code (SQLSTATE, MySQL's error number)
/// where the driver reports one — a unique violation, a serialization failure, a read-only
/// transaction, a `NOT NULL` violation, a lost connection —, but diesel's error carries no
/// code for the others (a deadlock, a lock or statement timeout, a cancelled statement, a
/// missing table or privilege): for those the server's message is all there is, and the
/// server writes it in the session's `lc_messages`. A server installed on a German system
/// reports a deadlock as `Verklemmung (Deadlock) entdeckt`; read as English, that is an
/// unknown error, dead-lettered instead of retried. So the session's messages are set to
/// English (a session setting; the server's and other sessions' stay as they are), the same
/// on every driver, sync and async.
///
/// MySQL and MariaDB let every session do that. PostgreSQL lets only a superuser, or a
/// role granted `SET` on the parameter (PostgreSQL 15+): for any other role whose messages
/// are in another language the check refuses, naming the two fixes (`ALTER ROLE … SET
/// lc_messages = 'C'`, or the grant). A role that may not set it, on a server whose messages
/// are English anyway (built without translations), passes: its refusal came in English.
///
/// `in_transaction`: the check's reads run in a transaction of their own
/// ([`lift_statement_timeout`]), which a refusal here must not leave aborted: the attempt
/// runs under a savepoint.
pub(super) async fn english_messages<S: Io>(
    io: &mut S,
    schema: &InboxSchema,
    in_transaction: bool,
) -> Result<bool, SchemaError> {
    if in_transaction {
        io.batch("SAVEPOINT inbox_english")
            .await
            .map_err(SchemaError::Database)?;
    }
    let pinned = match S::Backend::BACKEND {
        Backend::Sqlite => return Ok(false),
        Backend::Mysql => io.execute(&Sql::new(MYSQL_ENGLISH)).await,
        Backend::Postgres => io.execute(&Sql::new(PG_ENGLISH)).await,
    };
    let refused = match pinned {
        // PostgreSQL: the row `set_config` returned, where it changed the setting.
        Ok(rows) => return Ok(rows > 0),
        Err(refused) => refused,
    };
    if in_transaction {
        io.batch("ROLLBACK TO SAVEPOINT inbox_english")
            .await
            .map_err(SchemaError::Database)?;
    }
    let english = crate::classify::with_server_error(&refused, |server| {
        server
            .message
            .starts_with("permission denied to set parameter")
    });
    // Refused in English: the messages are English already (a server without
    // translations). An error the runtime reads otherwise (a lost connection, a statement a
    // pooler lost) is that error; only one it cannot read is the refusal in another language.
    let unread = crate::classify::class_of(&refused, schema) == inbox_core::ErrorClass::Other;
    match (S::Backend::BACKEND, english) {
        (Backend::Postgres, Some(true)) => return Ok(false),
        (Backend::Postgres, Some(false)) if unread => {}
        _ => return Err(SchemaError::Database(refused)),
    }
    // Unread, it may be another failure in the session's language — a statement timeout, a
    // session ended — of a role that may set the parameter: that failure, not a refusal
    // (whose advice would be wrong, and an alert).
    if may_set_messages(io).await {
        return Err(SchemaError::Database(refused));
    }
    let setting = read_setting(io, PG_MESSAGES).await?;
    Err(SchemaError::Session {
        table: schema.table(),
        problem: SchemaProblem::Unsupported {
            found: format!(
                "the session's server messages are in `lc_messages = '{setting}'`, which its \
                 role may not change"
            ),
            why: "the runtime reads deadlocks, timeouts and cancellations from the server's \
                  English messages (diesel reports no SQLSTATE for them): in another language \
                  they would be dead-lettered instead of retried",
            fix: "give the role English messages as a superuser: `ALTER ROLE <role> SET \
                  lc_messages = 'C'` (or `ALTER DATABASE <database> SET lc_messages = 'C'`), \
                  or let it set them itself: `GRANT SET ON PARAMETER lc_messages TO <role>` \
                  (PostgreSQL 15+; transaction mode only: claim mode needs the role's \
                  default)"
                .into(),
        },
    })
}
