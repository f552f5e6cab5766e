//! Get-or-create's vocabulary where the backends differ: the forms of an insert that meets
//! the row with its key ([`Conflicts`]) and the hash a key's lock is taken on. Each
//! backend's [`Dialect`](super::Dialect) names its form and its lock's statements
//! (`lock_key`, `unlock_key`); `unique` runs them.

/// How an insert meets the row its key duplicates, by the SQL the backend has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conflicts {
    /// `ON CONFLICT (<columns>) [WHERE <predicate>] DO …` naming the key, and `RETURNING`:
    /// an upsert yields the row's id in its own statement (PostgreSQL, SQLite).
    OnConflict,
    /// `ON DUPLICATE KEY UPDATE`, which cannot name the key, and no `RETURNING`: an upsert
    /// leaves the id in `LAST_INSERT_ID()` (MySQL, MariaDB); a multi-row upsert cannot
    /// yield every row's id.
    OnDuplicateKey,
}

/// A key's lock as a 64-bit number (PostgreSQL's advisory lock; MySQL's lock name is made
/// of it): a stable FNV-1a hash of the key, the same in every process
/// and version (the standard library's hasher promises neither).
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn lock_hash(key: &str) -> i64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in key.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash as i64
}
