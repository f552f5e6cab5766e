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
        Err(Error::InvalidKey(inbox_diesel::KeyError::EmptyPart {
            part: 2,
            of: 2
        }))
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

// An application that keeps its ids in shared pointers (`Arc<str>`, as media servers do for
// file identifiers) names them as they are, alone or as a part.
#[idempotent(consumer = "remove-file", key = identifier)]
fn remove_file(
    conn: &mut DbConnection,
    identifier: &std::sync::Arc<str>,
    owner: std::rc::Rc<i64>,
) -> Result<(), Error> {
    let _ = owner;
    diesel::sql_query("UPDATE accounts SET balance = balance + 1 WHERE id = 1").execute(conn)?;
    Ok(())
}

#[idempotent(consumer = "remove-owned-file", key = (owner, identifier))]
fn remove_owned_file(
    conn: &mut DbConnection,
    identifier: &std::sync::Arc<str>,
    owner: Box<i64>,
) -> Result<(), Error> {
    diesel::sql_query("UPDATE accounts SET balance = balance + 1 WHERE id = 2").execute(conn)?;
    Ok(())
}

#[test]
fn ids_in_shared_pointers_are_keys() {
    let db = Db::new("pointer_keys");
    let mut conn = db.connect();
    let identifier: std::sync::Arc<str> = "files/2f/ab.webp".into();
    assert!(
        remove_file(&mut conn, &identifier, 1.into())
            .unwrap()
            .is_processed()
    );
    // The same text in another pointer, or none, is the same key.
    assert!(
        remove_file(
            &mut conn,
            &std::sync::Arc::from("files/2f/ab.webp"),
            1.into()
        )
        .unwrap()
        .is_duplicate()
    );
    assert!(
        remove_owned_file(&mut conn, &identifier, Box::new(7))
            .unwrap()
            .is_processed()
    );
    assert!(
        remove_owned_file(&mut conn, &identifier, Box::new(7))
            .unwrap()
            .is_duplicate()
    );
    assert!(
        remove_owned_file(&mut conn, &identifier, Box::new(8))
            .unwrap()
            .is_processed()
    );
    assert_eq!(inbox_tests::balance(&mut db.connect(), 1), 1);
    assert_eq!(inbox_tests::balance(&mut db.connect(), 2), 2);
}

// An id the message may lack (an activity's `id`, an optional header): `None` is a missing
// key, refused before any SQL and dead-lettered, never keyed on something made up.
#[idempotent(consumer = "activities", key = activity.get("id").copied())]
fn receive(
    conn: &mut DbConnection,
    activity: &std::collections::BTreeMap<&str, &str>,
) -> Result<(), Error> {
    diesel::sql_query("UPDATE accounts SET balance = balance + 1 WHERE id = 1").execute(conn)?;
    Ok(())
}

#[test]
fn an_optional_id_is_the_key_or_a_missing_one() {
    let db = Db::new("optional_key");
    let mut conn = db.connect();
    let like = [("id", "https://example.social/likes/1"), ("type", "Like")].into();
    assert!(receive(&mut conn, &like).unwrap().is_processed());
    assert!(receive(&mut conn, &like).unwrap().is_duplicate());
    let anonymous = [("type", "Like")].into();
    let refused = receive(&mut conn, &anonymous).unwrap_err();
    assert!(
        matches!(
            refused,
            Error::InvalidKey(inbox_diesel::KeyError::Missing { .. })
        ),
        "{refused:?}"
    );
    assert_eq!(refused.action(), inbox_diesel::Action::DeadLetter);
    assert_eq!(inbox_tests::balance(&mut db.connect(), 1), 1);
}
