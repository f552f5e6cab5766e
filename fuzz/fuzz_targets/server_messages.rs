//! The parsers that read a constraint or key name out of a server's message, and the
//! classification built on them: no input panics them, and a name written into a message in
//! a server's format is read back exactly, whatever the duplicate value around it holds
//! (quotes, `for key '`, anything: MySQL does not escape it).
#![no_main]

use arbitrary::Arbitrary;
use inbox_core::server_message::{
    MysqlKey, ServerError, ServerErrorKind, SqliteUnique, mysql_duplicate_key,
    sqlite_unique_violation,
};
use inbox_core::{ErrorClass, InboxSchema};
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
struct Input {
    message: String,
    constraint: Option<String>,
    table: Option<String>,
    kind: u8,
    /// A duplicate value, as MySQL writes it into its message: unescaped.
    value: String,
    /// Names, kept to what a server prints unquoted.
    name: Vec<u8>,
    qualifier: Vec<u8>,
    columns: Vec<Vec<u8>>,
}

/// `[A-Za-z0-9_]+` from arbitrary bytes, or `None`.
fn identifier(bytes: &[u8]) -> Option<String> {
    const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_";
    let name: String = bytes
        .iter()
        .take(64)
        .map(|b| CHARS[usize::from(*b) % CHARS.len()] as char)
        .collect();
    (!name.is_empty()).then_some(name)
}

fuzz_target!(|input: Input| {
    let schema = InboxSchema::DEFAULT;
    // Anything: no panic.
    let _ = sqlite_unique_violation(&input.message);
    let _ = mysql_duplicate_key(&input.message);
    let kind = match input.kind % 4 {
        0 => ServerErrorKind::UniqueViolation,
        1 => ServerErrorKind::SerializationFailure,
        2 => ServerErrorKind::ConnectionLost,
        _ => ServerErrorKind::Other,
    };
    let error = ServerError {
        kind,
        constraint: input.constraint.as_deref(),
        table: input.table.as_deref(),
        message: &input.message,
    };
    let _ = error.classify(&schema);
    let _ = error.violated_index();

    // MySQL and MariaDB: the key name read back from behind any value.
    if let Some(name) = identifier(&input.name) {
        let mariadb = format!("Duplicate entry '{}' for key '{name}'", input.value);
        assert_eq!(
            mysql_duplicate_key(&mariadb),
            Some(MysqlKey {
                table: None,
                name: &name
            }),
            "{mariadb:?}"
        );
        let class = ServerError {
            kind: ServerErrorKind::UniqueViolation,
            constraint: None,
            table: None,
            message: &mariadb,
        }
        .classify(&schema);
        assert_eq!(
            class == ErrorClass::InboxDuplicate,
            name == InboxSchema::DEFAULT_CONSTRAINT,
            "{mariadb:?}: {class:?}"
        );
        if let Some(table) = identifier(&input.qualifier) {
            let mysql8 = format!("Duplicate entry '{}' for key '{table}.{name}'", input.value);
            assert_eq!(
                mysql_duplicate_key(&mysql8),
                Some(MysqlKey {
                    table: Some(&table),
                    name: &name
                }),
                "{mysql8:?}"
            );
            let class = ServerError {
                kind: ServerErrorKind::UniqueViolation,
                constraint: None,
                table: None,
                message: &mysql8,
            }
            .classify(&schema);
            // Only the inbox's own index of the inbox's own table is the inbox's duplicate.
            assert_eq!(
                class == ErrorClass::InboxDuplicate,
                name == InboxSchema::DEFAULT_CONSTRAINT && table == InboxSchema::DEFAULT_TABLE,
                "{mysql8:?}: {class:?}"
            );
        }
    }

    // SQLite: the table and columns read back.
    if let Some(table) = identifier(&input.qualifier) {
        let columns: Vec<String> = input
            .columns
            .iter()
            .filter_map(|c| identifier(c))
            .take(8)
            .collect();
        if !columns.is_empty() {
            let listed: Vec<String> = columns.iter().map(|c| format!("{table}.{c}")).collect();
            let message = format!("UNIQUE constraint failed: {}", listed.join(", "));
            assert_eq!(
                sqlite_unique_violation(&message),
                Some(SqliteUnique::Columns {
                    table: &table,
                    columns: columns.iter().map(String::as_str).collect(),
                }),
                "{message:?}"
            );
        }
    }
});
