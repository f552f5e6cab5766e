// The connection traits are sealed and their methods are the runtime's: importing
// `InboxConnection` gives a connection none of them, and no other crate can implement it.

use diesel::prelude::*;
use inbox_diesel::InboxConnection;

fn begin_by_hand(conn: &mut SqliteConnection) -> QueryResult<()> {
    conn.commit_inbox_transaction()
}

struct Tenant(SqliteConnection);

impl InboxConnection for Tenant {}

fn main() {
    let _ = begin_by_hand;
    // The backend of a connection type is public.
    let _ = <SqliteConnection as InboxConnection>::BACKEND;
}
