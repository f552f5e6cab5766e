//! The table compared with what the runtime needs: each column's type, the unique index,
//! and every fact that is refused, with its fix.

use super::*;

/// Each column the runtime uses, and what it must be: each backend's
/// [`Catalogs::accepts`] lists the type names it works with. Times are UTC everywhere: on
/// PostgreSQL `timestamp with time zone` (a `timestamp` column is compared in each session's
/// `TimeZone`), on MySQL and MariaDB `DATETIME` written with `UTC_TIMESTAMP()` (a `TIMESTAMP`
/// column converts from and to each session's `time_zone`).
pub(super) const COLUMNS: [(&str, &str); 7] = [
    ("id", "a 64-bit integer key"),
    (
        "message_id",
        "UUID (PostgreSQL), BINARY(16) (MySQL), BLOB (SQLite)",
    ),
    ("consumer", "text of at least 200 characters"),
    ("received_at", TIMESTAMP),
    ("processed_at", TIMESTAMP),
    ("claimed_until", TIMESTAMP),
    ("attempts", "an integer"),
];

pub(super) const TIMESTAMP: &str = "a time the runtime writes and compares in UTC: TIMESTAMPTZ \
    (PostgreSQL; `timestamp without time zone` is read in each session's TimeZone), DATETIME \
    (MySQL, MariaDB; `TIMESTAMP` converts with each session's time_zone), TIMESTAMP (SQLite)";

/// The optional column the runtime fills when the table has it: the key as text, for
/// operators and for migrating from a table of text ids
/// (`inbox-diesel migration generate --with key_text`). A key is up to 64 KiB of text, a
/// bytes key twice that in hex: no bounded type holds every key.
pub(super) const KEY_TEXT: (&str, &str) = (
    "key_text",
    "unbounded text in UTF-8: TEXT (PostgreSQL, SQLite), MEDIUMTEXT with a utf8mb4 collation \
     (MySQL, MariaDB)",
);

/// The optional column where a handler with `store_result` keeps its `Ok` value, as JSON
/// (`inbox-diesel migration generate --with result`).
pub(super) const RESULT: (&str, &str) = (
    "result",
    "JSON text: jsonb (PostgreSQL), JSON (MySQL; MariaDB's JSON is LONGTEXT), TEXT (SQLite)",
);

/// The optional column where a handler with `fingerprint = …` keeps the request's SHA-256
/// digest (`inbox-diesel migration generate --with fingerprint`).
pub(super) const FINGERPRINT: (&str, &str) = (
    "fingerprint",
    "32 bytes: BYTEA (PostgreSQL), BINARY(32) (MySQL, MariaDB), BLOB (SQLite)",
);

/// Compares what the catalog says with what the runtime needs, and says which optional
/// columns the table has.
pub(crate) fn check<D: Catalogs>(
    schema: &InboxSchema,
    catalog: Catalog,
    claim: bool,
) -> Result<Layout, SchemaError> {
    let mut layout = Layout {
        key_text: false,
        result: false,
        fingerprint: false,
        mariadb: catalog.server.contains("MariaDB"),
        session_mark: None,
        database_mark: None,
        pinned: None,
        max_packet: catalog.max_packet,
        english: false,
    };
    let resolved = catalog
        .facts
        .iter()
        .find(|fact| fact.kind == "table")
        .map(|fact| fact.detail.clone());
    let mut problems = Vec::new();
    if catalog.columns.is_empty() {
        problems.push(SchemaProblem::MissingTable {
            table: schema.table().to_owned(),
        });
        // PostgreSQL: tables of the name in schemas the session's `search_path` leaves out.
        let elsewhere: Vec<&str> = catalog
            .facts
            .iter()
            .filter(|f| f.kind == "same name")
            .map(|f| f.detail.as_str())
            .collect();
        if let [first, ..] = elsewhere[..] {
            let table = schema.table();
            problems.push(SchemaProblem::Unsupported {
                found: format!(
                    "a table `{table}` in {}, which this session's search_path leaves out",
                    elsewhere
                        .iter()
                        .map(|s| format!("`{s}.{table}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                why: "an unqualified name is looked up only in the schemas of the session's \
                      search_path (a role's or a database's setting, a pool's connection setup)",
                fix: format!(
                    "name the table with its schema (`table = \"{first}.{table}\"`), or put \
                     `{first}` on the session's search_path"
                ),
            });
        }
    } else {
        layout.key_text = catalog.columns.iter().any(|c| c.name == KEY_TEXT.0);
        layout.result = catalog.columns.iter().any(|c| c.name == RESULT.0);
        layout.fingerprint = catalog.columns.iter().any(|c| c.name == FINGERPRINT.0);
        // The optional columns are checked only when the table has them.
        let optional = [
            layout.key_text.then_some(&KEY_TEXT),
            layout.result.then_some(&RESULT),
            layout.fingerprint.then_some(&FINGERPRINT),
        ];
        for &(column, expected) in COLUMNS.iter().chain(optional.into_iter().flatten()) {
            match catalog.columns.iter().find(|c| c.name == column) {
                None if column == "id" && D::ID_OPTIONAL => {}
                None => problems.push(SchemaProblem::MissingColumn { column }),
                Some(found) => {
                    let type_name = found.type_name.to_ascii_lowercase();
                    if !D::accepts(column).iter().any(|t| type_name.starts_with(t))
                        || !D::holds(column, &type_name)
                    {
                        problems.push(SchemaProblem::WrongType {
                            column,
                            found: found.type_name.clone(),
                            expected: D::expected(column).unwrap_or(expected),
                        });
                    } else if found.nullable != 0 && matches!(column, "message_id" | "consumer") {
                        problems.push(SchemaProblem::Nullable { column });
                    }
                }
            }
        }
        let index = schema.constraint().to_owned();
        let columns: Vec<String> = catalog.index.iter().map(|r| r.name.clone()).collect();
        if catalog.index.is_empty() {
            problems.push(SchemaProblem::MissingUniqueIndex { index });
        } else if catalog.index.iter().any(|r| r.is_unique == 0) {
            problems.push(SchemaProblem::IndexNotUnique { index });
        } else if columns != InboxSchema::KEY_COLUMNS {
            problems.push(SchemaProblem::IndexColumns {
                index,
                found: columns,
            });
        }
        let index_missing = catalog.index.is_empty();
        problems.extend(
            refusals::<D>(schema, &catalog.facts, layout.key_text, claim)
                .into_iter()
                // The inbox's index under another name: the missing index's problem says so.
                .filter(|problem| {
                    !(index_missing
                        && matches!(problem, SchemaProblem::Unsupported { found, .. }
                            if found.ends_with(" (message_id, consumer)`")))
                }),
        );
    }
    if D::PINS_TABLE && !schema.table().contains('.') {
        layout.pinned = resolved
            .as_deref()
            .filter(|name| InboxSchema::validate_table(name).is_ok())
            .map(intern);
    }
    let oids = catalog.facts.iter().find(|fact| fact.kind == "oids");
    D::mark(
        &mut layout,
        schema,
        claim,
        oids.map(|fact| fact.detail.as_str()),
    );
    match problems.is_empty() {
        true => Ok(layout),
        false => Err(SchemaError::Mismatch {
            table: schema.table(),
            resolved,
            problems,
        }),
    }
}

/// Whether another unique index of the inbox table (`name (columns)`) is harmless
/// ([`Catalogs::harmless_unique`]).
fn harmless_unique<D: Catalogs>(detail: &str) -> bool {
    let columns: Vec<&str> = detail
        .rsplit_once(" (")
        .and_then(|(_, columns)| columns.strip_suffix(')'))
        .map(|columns| columns.split(", ").collect())
        .unwrap_or_default();
    D::harmless_unique(&columns)
}

/// The facts the check refuses, each with what it breaks and the fix.
pub(super) fn refusals<D: Catalogs>(
    schema: &InboxSchema,
    facts: &[FactRow],
    key_text: bool,
    claim: bool,
) -> Vec<SchemaProblem> {
    let table = schema.table();
    let index = schema.constraint();
    let mut problems = Vec::new();
    let mut privileges = Vec::new();
    let same_name: Vec<&str> = facts
        .iter()
        .filter(|f| f.kind == "same name")
        .map(|f| f.detail.as_str())
        .collect();
    if same_name.len() > 1 {
        // The schema this session's name resolved to: the table it means now, which a
        // tenant's own handler names (not the first of the others).
        let own = facts
            .iter()
            .find(|fact| fact.kind == "table")
            .and_then(|fact| fact.detail.rsplit_once('.'))
            .map_or(same_name[0], |(qualifier, _)| qualifier);
        problems.push(SchemaProblem::Unsupported {
            found: format!(
                "tables named `{table}` in the schemas {}",
                same_name.join(", ")
            ),
            why: "which one an unqualified name means depends on each session's search_path: \
                  instances with different settings would each keep markers in their own \
                  table and apply a message once in each",
            fix: format!(
                "name the table with its schema — this session's is `{own}.{table}` (`table = \
                 \"{own}.{table}\"`, a handler per tenant schema), or give each tenant a role \
                 that may use its own schema only; tenants that share one table and number \
                 their messages each on their own must key by the tenant too \
                 (`key = Scoped(tenant, msg.id)`), or one tenant's message is another's \
                 duplicate"
            ),
        });
    }
    for fact in facts {
        let detail = fact.detail.as_str();
        let problem = |found: String, why: &'static str, fix: String| SchemaProblem::Unsupported {
            found,
            why,
            fix,
        };
        match fact.kind.as_str() {
            "persistence" => problems.push(match detail {
                "u" => problem(
                    "an UNLOGGED table".into(),
                    "a crash empties it and replicas do not have it, so every message \
                     processed before a crash or failover would be applied again",
                    format!("ALTER TABLE {table} SET LOGGED"),
                ),
                _ => problem(
                    "a temporary table".into(),
                    "its markers are gone with the session (and it hides the table of that \
                     name from this session)",
                    format!("drop the temporary table `{table}`"),
                ),
            }),
            "relkind" | "engine" => problems.push(problem(
                match (fact.kind.as_str(), detail) {
                    ("engine", "VIEW") | (_, "v") | (_, "view") => "a view".into(),
                    ("engine", engine) => format!("the {engine} storage engine"),
                    (_, "f") => "a foreign table".into(),
                    (_, "m") => "a materialized view".into(),
                    (_, other) => format!("a relation of kind `{other}`"),
                },
                "the marker must be a row of a transactional table, written and rolled back \
                 with the business change (MyISAM and Aria keep a marker whose transaction \
                 rolled back: the message would never be applied)",
                match fact.kind.as_str() {
                    "engine" => format!("ALTER TABLE {table} ENGINE = InnoDB"),
                    _ => "use a plain table (`inbox-diesel migration generate`)".into(),
                },
            )),
            "trigger" => problems.push(problem(
                match detail.split_once(" ON ") {
                    Some((name, on)) => format!("trigger `{name}` on `{on}`"),
                    None => format!("trigger `{detail}`"),
                },
                "a trigger can swallow, rewrite or move the marker row, and a new message \
                 would then be answered Duplicate and never applied, or two consumers share \
                 markers",
                format!(
                    "drop it (`DROP TRIGGER {detail}`); keep audit triggers off the inbox and \
                     its partitions"
                ),
            )),
            "row security" => problems.push(problem(
                format!("row-level security on `{detail}`, applied to this role"),
                "its policies hide other sessions' markers from this role: the inbox's unique \
                 index still refuses a marker of the same key and consumer, but the duplicate's \
                 marker reads as absent, and every such delivery fails as a fault instead of \
                 answering Duplicate",
                format!(
                    "ALTER TABLE {detail} DISABLE ROW LEVEL SECURITY (key each tenant's \
                     messages by the tenant, `(tenant, id)`, or give each tenant its own \
                     consumer name), or run the consumers as a role with BYPASSRLS"
                ),
            )),
            "rule" => problems.push(problem(
                format!("rule `{detail}`"),
                "a rule can rewrite or swallow the marker's insert",
                format!("DROP RULE {detail} ON {table}"),
            )),
            "child" => problems.push(problem(
                format!("inheritance child `{detail}`"),
                "the unique index does not cover a child's rows, and statements on the \
                 parent read them",
                format!("ALTER TABLE {detail} NO INHERIT {table}"),
            )),
            "index invalid" => problems.push(problem(
                format!("index `{index}` is invalid"),
                "an index left by a failed CREATE UNIQUE INDEX CONCURRENTLY enforces nothing \
                 reliably and cannot serve ON CONFLICT",
                format!("REINDEX INDEX CONCURRENTLY {index}"),
            )),
            "index partial" => problems.push(problem(
                format!("index `{index}` is partial"),
                "ON CONFLICT (message_id, consumer) does not match a partial index, and it \
                 would not cover rows outside its predicate: every delivery would fail",
                format!("recreate it without WHERE (`CREATE UNIQUE INDEX … ON {table} (message_id, consumer)`)"),
            )),
            "index deferrable" => problems.push(problem(
                format!("constraint `{detail}` is DEFERRABLE"),
                "ON CONFLICT does not work with a deferrable constraint, and a deferred check \
                 would find a duplicate only at COMMIT, after the body ran",
                format!("ALTER TABLE {table} ALTER CONSTRAINT {detail} NOT DEFERRABLE"),
            )),
            "index prefix" => problems.push(problem(
                format!("index `{index}` is on a prefix of `{detail}`"),
                "keys (or consumer names) that share the prefix would share one marker",
                format!("recreate it on the whole columns (`UNIQUE KEY {index} (message_id, consumer)`)"),
            )),
            "other unique" if !harmless_unique::<D>(detail) => problems.push(problem(
                format!("the unique index `{detail}`"),
                "a marker insert that violates another unique index is not a duplicate to the \
                 runtime: every delivery (or every redelivery) of such a message would fail, \
                 where the inbox's index alone decides",
                D::OTHER_UNIQUE_FIX.into(),
            )),
            // MariaDB's duplicate-key error names the index but not its table: a business
            // table's violation of an index of the same name would read as the inbox's own,
            // and the message be acknowledged as a duplicate and lost.
            "index name elsewhere" => problems.push(problem(
                format!("`{detail}` has a unique index named `{index}` too"),
                "MariaDB's duplicate-key error names the index, not its table: a violation of \
                 that table's index inside a handler would be taken for the inbox's duplicate, \
                 and the message acknowledged without its change",
                format!("rename one of them (`ALTER TABLE {detail} RENAME INDEX {index} TO …`), or give the inbox's another name (`constraint = \"…\"` on the handler and in the migration)"),
            )),
            "index collation" => problems.push(problem(
                format!("index `{index}` compares with the collation `{detail}`, not byte by byte"),
                "the index would call a new consumer's marker (`Credit`) a duplicate of \
                 another's (`credit`): its messages answered Duplicate, or never processed",
                format!("recreate it without COLLATE (`CREATE UNIQUE INDEX {index} ON {table} (message_id, consumer)`)"),
            )),
            "flush log" => problems.push(problem(
                "innodb_flush_log_at_trx_commit = 0 on a server outside a Galera cluster".into(),
                "a commit the server acknowledged can vanish when the server crashes (about a \
                 second of commits): a message acknowledged to the broker would be lost, a \
                 claim or a stamp would vanish after its side effect ran, and the effect run \
                 again",
                "SET GLOBAL innodb_flush_log_at_trx_commit = 1 (and in the server's \
                 configuration); 2 keeps commits through a crash of the server, not of the \
                 machine"
                    .into(),
            )),
            "clock" => problems.push(problem(
                format!("the session's clock set to {detail} (`SET timestamp`)"),
                "leases and processed_at are written with the session's clock: a live claim \
                 would be taken over, a fresh marker purged",
                "SET timestamp = DEFAULT on the session".into(),
            )),
            // Read-only by a setting of the consumers' role, on a server that takes writes:
            // every connection of the role gets it, and it does not pass. A standby's
            // sessions, a primary fenced by its configuration (`ALTER SYSTEM`, as failover
            // tools do), a database frozen for maintenance (`ALTER DATABASE`) or a session
            // set so are not refused: a new connection may reach the new primary, or the
            // freeze end (`Reconnect`, paused by the pumps' outage gate).
            "read only" => problems.push(problem(
                format!(
                    "default_transaction_read_only = on, set for the role{} on a server that \
                     takes writes",
                    match detail {
                        "user" => "",
                        _ => " in this database",
                    }
                ),
                "every handler's transaction would be refused its first write, and a new \
                 connection gets the same setting: each delivery answered Reconnect until the \
                 broker's delivery limit dead-lettered it",
                "remove it from the role, database or pool setup (`ALTER ROLE … RESET \
                 default_transaction_read_only`), or point the consumers at a server meant \
                 for writes"
                    .into(),
            )),
            "synchronous_commit" => problems.push(problem(
                "synchronous_commit = off on this session".into(),
                "a commit the server acknowledged can vanish in a crash: a message acknowledged \
                 to the broker would be lost, a claim would vanish after its side effect ran",
                "remove it from the role, database or pool setup (`SET synchronous_commit = on`)"
                    .into(),
            )),
            // Claim mode stamps, takes over and releases its claims with `UPDATE` and
            // `DELETE`, which the server refuses on such a table after the side effect ran.
            "unidentified" if claim => problems.push(problem(
                format!(
                    "`{detail}` is published for updates or deletes without a replica identity"
                ),
                "claim mode stamps its claims with UPDATE and releases them with DELETE, which \
                 the server then refuses — after the side effect ran, so that it would run \
                 again once the lease ends",
                format!(
                    "give it one (`ALTER TABLE {detail} REPLICA IDENTITY FULL`, or a primary \
                     key), or leave it out of the publication"
                ),
            )),
            "unidentified" => {}
            "exit_on_error" => problems.push(problem(
                "exit_on_error = on on this session".into(),
                "the runtime meets errors it expects — a redelivery's unique violation, its \
                 marker statement not yet prepared on a new server session — and the server \
                 would end the session at each: every delivery would fail as a lost \
                 connection, for ever",
                "remove it from the role, database or pool setup (`ALTER ROLE … RESET \
                 exit_on_error`, `SET exit_on_error = off`)"
                    .into(),
            )),
            "collation" => problems.push(problem(
                format!("`consumer` has the nondeterministic collation `{detail}`"),
                "names that the collation calls equal (`Credit`, `credit`) would share \
                 markers",
                format!("ALTER TABLE {table} ALTER COLUMN consumer TYPE TEXT COLLATE \"C\""),
            )),
            "encoding" if key_text => problems.push(problem(
                format!("the database encoding {detail}"),
                "`key_text` must hold any key's text, and a key with a character the \
                 encoding lacks would fail on every delivery",
                "drop `key_text` (nothing reads it) or use a UTF8 database".into(),
            )),
            "shadowed" => problems.push(problem(
                format!("a temporary table `{detail}`"),
                "it hides the table from this connection's statements; its markers are gone \
                 with the connection",
                format!("drop the temporary table, or name the table `main.{table}`"),
            )),
            "privilege" => privileges.push(detail.to_owned()),
            _ => {}
        }
    }
    if !privileges.is_empty() {
        problems.push(SchemaProblem::Unsupported {
            found: format!("no privilege {}", privileges.join(", ")),
            why: "the handler's statements would be refused on every delivery",
            fix: format!(
                "GRANT SELECT, INSERT{} ON {table} TO the handler's role",
                match privileges.iter().any(|p| p.starts_with("UPDATE")) {
                    true => ", UPDATE",
                    false => "",
                }
            ),
        });
    }
    problems
}
