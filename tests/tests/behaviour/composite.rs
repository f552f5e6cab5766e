// Composite keys, as a port of a job runner writes them: the work is named by two values
// together (a crate version and an e-mail address), given as a tuple of the handler's
// parameters or as a `format!` with inline arguments. The tuple borrows each part: a
// `String` parameter stays the body's.
//
// Included with `Db` and `DbConnection` in scope.

use diesel::RunQueryDsl;
use inbox_diesel::{Error, idempotent};

#[idempotent(consumer = "notify-owner", key = (version_id, email))]
fn notify_owner(conn: &mut DbConnection, version_id: i32, email: String) -> Result<usize, Error> {
    diesel::sql_query("UPDATE accounts SET balance = balance + 1 WHERE id = 1").execute(conn)?;
    Ok(email.len() + usize::try_from(version_id).unwrap_or(0))
}

#[idempotent(consumer = "notify-owner-text", key = format!("{version_id}/{email}"))]
fn notify_owner_text(conn: &mut DbConnection, version_id: i32, email: &str) -> Result<(), Error> {
    let _ = email;
    diesel::sql_query("UPDATE accounts SET balance = balance + 1 WHERE id = 2").execute(conn)?;
    Ok(())
}

#[test]
fn a_tuple_of_parameters_is_one_key() {
    let db = Db::new("composite");
    let mut conn = db.connect();
    let ann = String::from("ann@example.com");
    assert_eq!(
        notify_owner(&mut conn, 7, ann.clone()).unwrap().processed(),
        Some(22)
    );
    assert!(
        notify_owner(&mut conn, 7, ann.clone())
            .unwrap()
            .is_duplicate()
    );
    // Either part changed is another key.
    assert!(
        notify_owner(&mut conn, 8, ann.clone())
            .unwrap()
            .is_processed()
    );
    assert!(
        notify_owner(&mut conn, 7, "bob@example.com".into())
            .unwrap()
            .is_processed()
    );
    assert_eq!(inbox_tests::balance(&mut db.connect(), 1), 3);
    // An empty part is refused before any SQL.
    assert!(matches!(
        notify_owner(&mut conn, 7, String::new()),
        Err(Error::InvalidKey(inbox_diesel::KeyError::Empty))
    ));
    assert_eq!(inbox_tests::balance(&mut db.connect(), 1), 3);
}

#[test]
fn inline_format_arguments_name_the_parameters() {
    let db = Db::new("composite_text");
    let mut conn = db.connect();
    assert!(
        notify_owner_text(&mut conn, 7, "ann@example.com")
            .unwrap()
            .is_processed()
    );
    assert!(
        notify_owner_text(&mut conn, 7, "ann@example.com")
            .unwrap()
            .is_duplicate()
    );
    assert!(
        notify_owner_text(&mut conn, 8, "ann@example.com")
            .unwrap()
            .is_processed()
    );
    assert_eq!(inbox_tests::balance(&mut db.connect(), 2), 2);
}
