//! What the check reads: the catalog's columns, index and facts of the table, the
//! server's version and limits, and the privileges the handler's statements take.

use super::*;

/// The privileges a handler's statements take, by column: reading and writing
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
    let (columns_sql, index_sql) = S::Backend::catalog_sql();
    let (qualifier, name) = match schema.table().rsplit_once('.') {
        Some((qualifier, name)) => (qualifier, name),
        None => ("", schema.table()),
    };
    let with_table = |sql: String| {
        let mut sql = Sql::new(sql);
        for _ in 0..S::Backend::QUALIFIER_BINDS {
            sql = sql.bind_text(qualifier);
        }
        sql.bind_text(name)
    };
    let (server, max_packet) = S::Backend::read_server(io).await?;
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
            &with_table(lifted(S::Backend::facts_sql(qualifier, &needs)))
                .bind_text(schema.constraint()),
        )
        .await?;
    if !columns.is_empty() {
        facts.extend(S::Backend::more_facts(io, schema, claim, key_text, &server).await?);
    }
    Ok(Catalog {
        columns,
        index,
        facts,
        server,
        max_packet,
    })
}
