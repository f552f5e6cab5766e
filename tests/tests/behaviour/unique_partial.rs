// Get-or-create on a partial unique index, for the backends that have them (PostgreSQL,
// SQLite): included into a module that names `Db` (the fixture), `ID_SQL` (the id column's
// SQL) and `NO_MATCH` (what the server says when the conflict target lacks the predicate).

/// The conflict target carries the index's predicate: an archived row with the same
/// name does not count, a live one does; without the predicate the server refuses the
/// statement, with the error the documentation names.
#[test]
fn a_partial_unique_index_needs_its_predicate() {
    use diesel::connection::SimpleConnection;
    use diesel::prelude::*;
    use inbox_diesel::unique::{self, UniqueError};
    use inbox_tests::unique::{LIVE_ALIAS, LIVE_ALIAS_WITHOUT_PREDICATE, aliases};

    let db = Db::new("unique_partial");
    let mut conn = db.connect();
    conn.batch_execute(&format!(
        "CREATE TABLE aliases (id {ID_SQL}, name TEXT NOT NULL, deleted INTEGER NOT NULL DEFAULT 0);
         CREATE UNIQUE INDEX ux_aliases_live ON aliases (name) WHERE deleted = 0;
         INSERT INTO aliases (name, deleted) VALUES ('ada', 1);"
    ))
    .unwrap();
    let archived: i64 = aliases::table.select(aliases::id).first(&mut conn).unwrap();
    let insert = diesel::insert_into(aliases::table).values(aliases::name.eq("ada"));
    let live = unique::upsert(&mut conn, &LIVE_ALIAS, insert, aliases::id).unwrap();
    assert_ne!(live, archived, "the archived row is outside the index");
    let again = unique::upsert(&mut conn, &LIVE_ALIAS, insert, aliases::id).unwrap();
    assert_eq!(again, live);
    assert!(!unique::insert_if_absent(&mut conn, &LIVE_ALIAS, insert).unwrap());

    let refused = unique::upsert(
        &mut conn,
        &LIVE_ALIAS_WITHOUT_PREDICATE,
        insert,
        aliases::id,
    );
    match refused {
        Err(UniqueError::Database(error)) => {
            assert!(error.to_string().contains(NO_MATCH), "{error}")
        }
        other => panic!("expected the server's refusal, got {other:?}"),
    }
    let rows: i64 = aliases::table.count().get_result(&mut conn).unwrap();
    assert_eq!(rows, 2);
}
