//! The isolation level of a handler's transaction.

/// The isolation level of a handler's transaction on PostgreSQL, MySQL and MariaDB
/// (`isolation = "…"`).
///
/// The inbox is correct at every level: the unique index, not a snapshot, decides who
/// processes a message. Choose the level the body's own work needs; at `repeatable read` and
/// `serializable`, concurrent deliveries of one message end in a serialization failure that
/// the runtime retries, and the retry then sees the duplicate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Isolation {
    /// The server's `default_transaction_isolation` (`read committed` unless configured).
    #[default]
    ServerDefault,
    /// `READ COMMITTED`.
    ReadCommitted,
    /// `REPEATABLE READ`.
    RepeatableRead,
    /// `SERIALIZABLE`.
    Serializable,
}

impl Isolation {
    /// The level an attribute's `isolation = "…"` names, in any case; `None` for any other
    /// text (the server's default is the option left out).
    pub fn from_name(name: &str) -> Option<Self> {
        match name.to_ascii_lowercase().as_str() {
            "read committed" => Some(Isolation::ReadCommitted),
            "repeatable read" => Some(Isolation::RepeatableRead),
            "serializable" => Some(Isolation::Serializable),
            _ => None,
        }
    }
}
