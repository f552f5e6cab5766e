#![allow(unused_variables, unused_imports, dead_code, unused_mut, irrefutable_let_patterns, unused_assignments, unreachable_code, unused_labels)]
// More escapes a new user tried: statics, pool fields, boxes of connections, macros. Each
// handler is refused. The handlers never run.
include!("../common/sync.rs");
pub struct AppPool(pub SqlitePool);
impl std::ops::Deref for AppPool { type Target = SqlitePool; fn deref(&self) -> &SqlitePool { &self.0 } }
fn add_with_app(p: &AppPool) -> QueryResult<usize> { add(&mut p.get().unwrap(), 1) }
pub struct Svc { pub pool: &'static SqlitePool }

fn reborrow(c: &mut Checkout) -> &mut SqliteConnection { c }
fn credit_one(c: &mut SqliteConnection) -> QueryResult<()> { add(c, 1).map(drop) }
// E23: a pool parameter behind LazyLock
#[idempotent(consumer = "e23", key = msg.id, conn = conn)]
fn e23(conn: &mut SqliteConnection, pool: &LazyLock<SqlitePool>, msg: &Msg) -> QueryResult<()> {
    add_with_pool(pool)?;
    Ok(())
}
// E24: an application pool newtype that derefs to the r2d2 pool
#[idempotent(consumer = "e24", key = msg.id, conn = conn)]
fn e24(conn: &mut SqliteConnection, app: &AppPool, msg: &Msg) -> QueryResult<()> {
    add_with_app(app)?;
    Ok(())
}
// E25: a static declared inside the body
#[idempotent(consumer = "e25", key = msg.id)]
fn e25(conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
    static LOCAL: LazyLock<SqlitePool> = LazyLock::new(|| Pool::builder().build_unchecked(ConnectionManager::new(":memory:")));
    add_with_pool(&LOCAL)?;
    Ok(())
}
// E26: a method handler: &'static pool field of &self
impl Svc {
    #[idempotent(consumer = "e26", key = msg.id, conn = conn)]
    fn e26(&self, conn: &mut SqliteConnection, msg: &Msg) -> QueryResult<()> {
        add_with_pool(self.pool)?;
        Ok(())
    }
}
// E28: pattern parameter (tuple) carrying a checkout
#[idempotent(consumer = "e28", key = msg.id, conn = conn)]
fn e28(conn: &mut SqliteConnection, (n, spare): (i64, &mut Checkout), msg: &Msg) -> QueryResult<()> {
    Ok(())
}
fn main() {}
