// The connection traits are sealed: no other crate can implement them, and what the
// runtime does on a connection (its backend's session) is not reachable from outside.

use diesel::prelude::*;
use inbox_diesel::InboxConnection;

struct Tenant(SqliteConnection);

impl InboxConnection for Tenant {}

fn main() {
    // The backend of a connection type is public.
    let _ = <SqliteConnection as InboxConnection>::BACKEND;
}
