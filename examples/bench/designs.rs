//! The table-design section: the marker protocol written in SQL, on each design of the inbox
//! table (the shipped one, text keys, no surrogate key, …), against the same transaction
//! without a marker; with each design's bytes per row where the server says.

use super::*;

/// A design of the inbox table, for the table-design section: `ddl` creates it under the
/// name `{t}`, and `text_key` says whether the message id is stored as 36 characters of
/// text instead of 16 bytes.
pub(crate) struct Design {
    pub(crate) name: &'static str,
    pub(crate) ddl: String,
    pub(crate) text_key: bool,
}

impl Design {
    pub(crate) fn new(name: &'static str, ddl: &str) -> Self {
        Design {
            name,
            ddl: ddl.to_owned(),
            text_key: false,
        }
    }

    pub(crate) fn text_key(self) -> Self {
        Design {
            text_key: true,
            ..self
        }
    }

    /// The shipped table of `backend` under the name `{t}`.
    pub(crate) fn shipped(backend: inbox_diesel::schema::Backend) -> Self {
        let schema = InboxSchema::new("design", "ux_design").expect("plain identifiers");
        Design::new(
            "shipped",
            &backend.create_table_sql(&schema).replace("design", "{t}"),
        )
    }
}

/// One message of the table-design section: the connection, the design's table and whether
/// its key is text (none: the baseline without a marker), the key, the worker.
pub(crate) type Marker<C> =
    dyn Fn(&mut C, Option<(&str, bool)>, Uuid, usize) -> QueryResult<()> + Sync;

/// The bytes a design's table and its indexes take per row, where the server says.
pub(crate) type TableSize<C> = dyn Fn(&mut C, &str) -> i64;

/// The table-design section: the same marker protocol, written in SQL, on each design's
/// own table, against the same transaction without a marker. `mark` runs one message in
/// one transaction: the marker insert into the table it is given (none: the baseline),
/// then the business write.
pub(crate) fn designs<C: SimpleConnection + Send>(
    seconds: f64,
    connect: &(dyn Fn() -> C + Sync),
    designs: &[Design],
    mark: &Marker<C>,
    size: Option<&TableSize<C>>,
) {
    let mut conn = connect();
    let mut tables = Vec::new();
    for (n, design) in designs.iter().enumerate() {
        let table = format!("design_{n}");
        conn.batch_execute(&design.ddl.replace("{t}", &table))
            .unwrap_or_else(|e| panic!("{}: {e}", design.name));
        tables.push(table);
    }
    drop(conn);
    let mut rows = vec![Vec::new(); designs.len()];
    let mut baseline = Vec::new();
    for (round, clients) in CONCURRENCY.into_iter().enumerate() {
        baseline.push(measure(clients, seconds, connect, &|c, w, n| {
            mark(c, None, key(0, w, n), w).unwrap();
            1
        }));
        for (slot, design) in designs.iter().enumerate() {
            let table = tables[slot].as_str();
            let run = 2_000 + (round * designs.len() + slot) as u64;
            rows[slot].push(measure(clients, seconds, connect, &|c, w, n| {
                mark(c, Some((table, design.text_key)), key(run, w, n), w).unwrap();
                1
            }));
        }
    }
    let (size_head, size_rule) = match size {
        Some(_) => (" bytes per row (table and indexes) |", "---:|"),
        None => ("", ""),
    };
    println!(
        "\n| table design | 1 client | 4 clients | 16 clients |{size_head}\n|---|---:|---:|---:|{size_rule}"
    );
    print!("| no marker |");
    for per_second in &baseline {
        print!(" 1.00 ({per_second:.0}/s) |");
    }
    println!("{}", if size.is_some() { " |" } else { "" });
    let mut conn = connect();
    for ((design, row), table) in designs.iter().zip(&rows).zip(&tables) {
        print!("| {} |", design.name);
        for (per_second, plain) in row.iter().zip(&baseline) {
            print!(" {:.2} ({per_second:.0}/s) |", per_second / plain);
        }
        match size {
            Some(size) => println!(" {} |", size(&mut conn, table)),
            None => println!(),
        }
    }
}

/// A size in bytes, as a query reports it: a design's table (PostgreSQL, MariaDB), the
/// stored-result section's table (every backend).
#[derive(QueryableByName)]
pub(crate) struct Bytes {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub(crate) n: i64,
}

/// The designs measured on `backend`: the shipped table's message id as text (`key_type`: its
/// type as shipped and as text), the backend's `extra` designs, the shipped table without its
/// `processed_at` index, the table without its surrogate key (`lean`) with and without that
/// index, and the shipped table.
pub(crate) fn designs_of(
    backend: inbox_diesel::schema::Backend,
    lean: &'static str,
    key_type: (&str, &str),
    extra: impl FnOnce(&Design) -> Vec<Design>,
) -> Vec<Design> {
    let shipped = Design::shipped(backend);
    let lean = Design::new(
        lean,
        &lean_schema(&backend.to_string()).replace("inbox", "{t}"),
    );
    // The shipped DDL's `processed_at` index, as it spells it (quoted, per backend): a line
    // of its own, or on MySQL a key inside the table, after the comma that precedes it.
    let index_line = shipped
        .ddl
        .lines()
        .find(|line| line.contains("_processed_at") && line.contains("(processed_at)"))
        .expect("the shipped table has a `processed_at` index");
    let purge_index = match backend {
        inbox_diesel::schema::Backend::Mysql => format!(",\n{index_line}"),
        _ => format!("{index_line}\n"),
    };
    let purge_index = purge_index.as_str();
    let mut list = vec![edited(&shipped, "message_id as text", &[key_type]).text_key()];
    list.extend(extra(&shipped));
    list.push(edited(
        &shipped,
        "no `processed_at` index",
        &[(purge_index, "")],
    ));
    list.push(edited(
        &lean,
        "no surrogate key, no `processed_at` index",
        &[(
            "CREATE INDEX ix_{t}_processed_at ON {t} (processed_at);",
            "",
        )],
    ));
    list.extend([lean, shipped]);
    list
}

/// `design` with `from` replaced by `to` in its SQL, under another name; `from` must occur.
pub(crate) fn edited(design: &Design, name: &'static str, edits: &[(&str, &str)]) -> Design {
    let mut ddl = design.ddl.clone();
    for (from, to) in edits {
        assert!(ddl.contains(from), "{name}: `{from}` is not in\n{ddl}");
        ddl = ddl.replace(from, to);
    }
    Design {
        name,
        ddl,
        text_key: design.text_key,
    }
}

/// One message in one transaction for the table-design section: the marker insert into
/// `$table` (with the key bound as `$key` or as text), then the business write.
macro_rules! marker_protocol {
    ($conn:ty, $begin:ident, $insert:literal, $update:literal, $key:ty, $bytes:expr) => {
        &|c: &mut $conn, table: Option<(&str, bool)>, id: Uuid, worker: usize| {
            use diesel::sql_types::{Integer, Text};
            c.$begin(|c| {
                if let Some((table, text_key)) = table {
                    let insert = diesel::sql_query(format!($insert, t = table));
                    let inserted = match text_key {
                        true => insert
                            .bind::<Text, _>(id.to_string())
                            .bind::<Text, _>(CONSUMER)
                            .execute(c)?,
                        false => insert
                            .bind::<$key, _>($bytes(id))
                            .bind::<Text, _>(CONSUMER)
                            .execute(c)?,
                    };
                    assert_eq!(inserted, 1, "every key is new");
                }
                diesel::sql_query($update)
                    .bind::<Integer, _>(worker as i32 + 1)
                    .execute(c)?;
                Ok(())
            })
        }
    };
}
pub(crate) use marker_protocol;
