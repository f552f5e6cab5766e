//! What the check reads: the catalog's columns, index and facts of the table, the
//! server's version and limits, and the privileges the handler's statements take.

use super::*;
use crate::dialect::catalog::{catalog_sql, facts_sql, mysql_durability_sql};

/// MySQL and MariaDB: the privileges the handler's statements take, asked of the server by
/// `EXPLAIN`ing them — which needs the statement's privileges and writes nothing — rather
/// than read from grants (roles, wildcard databases and column grants are the server's to
/// weigh). A `privilege` fact for each refused; any other failure of an `EXPLAIN` is no
/// answer, and the check goes on without it.
pub(super) async fn mysql_privileges<S: Io>(
    io: &mut S,
    schema: &InboxSchema,
    claim: bool,
    key_text: bool,
) -> Vec<FactRow> {
    let table = Backend::Mysql.quote_table(schema.table());
    let mut columns = String::from("message_id, consumer, received_at, processed_at");
    if claim {
        columns.push_str(", claimed_until, attempts");
    }
    if key_text {
        columns.push_str(", key_text");
    }
    let mut read = String::from("message_id, consumer, processed_at");
    if claim {
        read.push_str(", claimed_until, attempts");
    }
    let nulls = vec!["NULL"; columns.split(", ").count()].join(", ");
    // Each privilege by a statement that needs it alone: an `INSERT … SELECT` refused for
    // want of SELECT would be reported as INSERT.
    let mut statements = vec![
        (
            "SELECT",
            format!("EXPLAIN SELECT {read} FROM {table} WHERE 1 = 0"),
        ),
        (
            "INSERT",
            format!("EXPLAIN INSERT INTO {table} ({columns}) VALUES ({nulls})"),
        ),
    ];
    if claim {
        statements.push((
            "UPDATE",
            format!(
                "EXPLAIN UPDATE {table} SET claimed_until = NULL, processed_at = NULL, \
                 attempts = attempts WHERE id = 0"
            ),
        ));
    }
    let mut refused = Vec::new();
    for (privilege, sql) in statements {
        if let Err(e) = io.load::<ExplainRow>(&Sql::new(sql)).await
            && crate::classify::class_of(&e, schema) == inbox_core::ErrorClass::PermissionDenied
        {
            // The command the server names (`SELECT command denied … for column 'id'`: the
            // UPDATE's `WHERE` reads), where it names one.
            let named = crate::classify::with_server_error(&e, |server| {
                server
                    .message
                    .split_once(" command denied")
                    .map(|(command, _)| command.to_owned())
            })
            .flatten()
            .filter(|command| ["SELECT", "INSERT", "UPDATE"].contains(&command.as_str()));
            let detail = named.unwrap_or_else(|| privilege.to_owned());
            if !refused.iter().any(|fact: &FactRow| fact.detail == detail) {
                refused.push(FactRow {
                    kind: "privilege".into(),
                    detail,
                });
            }
        }
    }
    refused
}

/// A row of MySQL's `EXPLAIN`, of which only its being there matters.
#[derive(Debug, diesel::QueryableByName)]
pub(crate) struct ExplainRow {
    #[diesel(sql_type = diesel::sql_types::Nullable<Text>)]
    #[allow(dead_code)]
    select_type: Option<String>,
}

/// The privileges a handler's statements take, by column (PostgreSQL): reading and writing
/// the marker; in claim mode also updating the claim.
pub(super) fn needed_privileges(claim: bool, key_text: bool) -> Vec<(&'static str, &'static str)> {
    let mut needs = vec![
        ("SELECT", "message_id"),
        ("SELECT", "consumer"),
        ("SELECT", "processed_at"),
        ("INSERT", "message_id"),
        ("INSERT", "consumer"),
        ("INSERT", "received_at"),
        ("INSERT", "processed_at"),
    ];
    if key_text {
        needs.push(("INSERT", "key_text"));
    }
    if claim {
        needs.extend([
            ("SELECT", "claimed_until"),
            ("SELECT", "attempts"),
            ("INSERT", "claimed_until"),
            ("INSERT", "attempts"),
            ("UPDATE", "claimed_until"),
            ("UPDATE", "processed_at"),
            ("UPDATE", "attempts"),
        ]);
    }
    needs
}

/// Reads the [`Catalog`] of `schema`'s table.
pub(super) async fn read_catalog<S: Io>(
    io: &mut S,
    schema: &InboxSchema,
    claim: bool,
) -> QueryResult<Catalog> {
    let backend = S::Backend::BACKEND;
    let (columns_sql, index_sql) = catalog_sql(backend);
    let (qualifier, name) = match schema.table().rsplit_once('.') {
        Some((qualifier, name)) => (qualifier, name),
        None => ("", schema.table()),
    };
    let mysql = backend == Backend::Mysql;
    // MySQL binds are positional: the qualifier is bound twice.
    let with_table = |sql: String| {
        let sql = Sql::new(sql).bind_text(qualifier);
        match mysql {
            true => sql.bind_text(qualifier),
            false => sql,
        }
        .bind_text(name)
    };
    let (server, max_packet) = match backend {
        Backend::Mysql => io
            .load::<ServerInfo>(&Sql::new(SERVER_VERSION_SQL))
            .await?
            .into_iter()
            .next()
            .map(|row| (row.version, u64::try_from(row.max_packet).unwrap_or(0)))
            .unwrap_or_default(),
        Backend::Postgres | Backend::Sqlite => (String::new(), 0),
    };
    // MariaDB: the catalog's reads free of a session's tight `max_statement_time` (a
    // `0.001` timed the check out on every session), for themselves alone.
    let lifted = |sql: String| match server.contains("MariaDB") {
        true => format!("SET STATEMENT max_statement_time = 30 FOR {sql}"),
        false => sql,
    };
    let columns: Vec<ColumnRow> = io.load(&with_table(lifted(columns_sql))).await?;
    let index = io
        .load(&with_table(lifted(index_sql)).bind_text(schema.constraint()))
        .await?;
    let key_text = columns.iter().any(|c| c.name == KEY_TEXT.0);
    let needs = needed_privileges(claim, key_text);
    let mut facts: Vec<FactRow> = io
        .load(
            &with_table(lifted(facts_sql(backend, qualifier, &needs)))
                .bind_text(schema.constraint()),
        )
        .await?;
    if backend == Backend::Mysql && !columns.is_empty() {
        facts.extend(mysql_privileges(io, schema, claim, key_text).await);
        facts.extend(io.load(&Sql::new(mysql_durability_sql(&server))).await?);
    }
    Ok(Catalog {
        columns,
        index,
        facts,
        server,
        max_packet,
    })
}
