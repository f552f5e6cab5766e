// The function API's claim-mode body, `guarded!(|| …)`, has no connection: a pool it reaches
// is refused with claim mode's message, as a claim-mode handler's body is.
#![allow(unused_variables, unused_imports)]

use std::sync::LazyLock;

use diesel::prelude::*;
use inbox_diesel::guarded;
use inbox_diesel::handler::{ClaimHandler, claim_once};

type Pool = diesel::r2d2::Pool<diesel::r2d2::ConnectionManager<SqliteConnection>>;

static MAIL: LazyLock<ClaimHandler> = LazyLock::new(|| ClaimHandler::new("mail").unwrap());

fn send(pool: &Pool, user_id: i64) -> Result<(), inbox_diesel::Error> {
    claim_once(pool, &MAIL, &user_id, guarded!(|| {
        let mut conn = pool.get().unwrap();
        diesel::sql_query("UPDATE users SET mailed = 1").execute(&mut conn)?;
        Ok::<_, inbox_diesel::Error>(())
    }))?;
    Ok(())
}

fn main() {}
