use std::fmt;

/// Where the inbox lives: the table and the unique index the classifier matches.
///
/// The defaults are the table `inbox` and the index `ux_inbox_message_consumer` on
/// `(message_id, consumer)`, as the shipped schema creates them. `#[idempotent(table = "…",
/// constraint = "…")]` names others.
///
/// ```
/// use inbox_core::InboxSchema;
///
/// let schema = InboxSchema::new("billing.inbox", "ux_billing_inbox")?;
/// assert_eq!(schema.table_name(), "inbox");
/// assert!(InboxSchema::new("inbox; DROP TABLE x", "ux").is_err());
/// # Ok::<(), inbox_core::IdentifierError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InboxSchema {
    table: &'static str,
    constraint: &'static str,
}

impl InboxSchema {
    /// The default table name.
    pub const DEFAULT_TABLE: &'static str = "inbox";
    /// The default name of the unique index on `(message_id, consumer)`.
    pub const DEFAULT_CONSTRAINT: &'static str = "ux_inbox_message_consumer";
    /// The columns of the unique index, in index order.
    pub const KEY_COLUMNS: [&'static str; 2] = ["message_id", "consumer"];
    /// The longest identifier accepted (PostgreSQL truncates names past 63 bytes).
    pub const MAX_IDENTIFIER_LEN: usize = 63;

    /// The shipped schema: `inbox` with `ux_inbox_message_consumer`.
    pub const DEFAULT: InboxSchema = InboxSchema {
        table: Self::DEFAULT_TABLE,
        constraint: Self::DEFAULT_CONSTRAINT,
    };

    /// A schema with other names. `table` may be qualified (`billing.inbox`).
    ///
    /// # Errors
    /// An [`IdentifierError`] when a name is not a plain SQL identifier.
    pub fn new(table: &'static str, constraint: &'static str) -> Result<Self, IdentifierError> {
        Self::validate_table(table)?;
        Self::validate_identifier(constraint)?;
        Ok(Self { table, constraint })
    }

    /// The schema of a table and index named once for a whole application, as a `const`
    /// that `#[idempotent(schema = INBOX, …)]` and [`Handler::schema`] take: names that are
    /// not identifiers ([`validate_table`](Self::validate_table),
    /// [`validate_identifier`](Self::validate_identifier)) fail the build where the
    /// constant is evaluated.
    ///
    /// ```
    /// use inbox_core::InboxSchema;
    ///
    /// pub const INBOX: InboxSchema = InboxSchema::named("billing.inbox", "ux_billing_inbox");
    /// assert_eq!(INBOX.table_name(), "inbox");
    /// ```
    ///
    /// ```compile_fail
    /// # use inbox_core::InboxSchema;
    /// const INBOX: InboxSchema = InboxSchema::named("billing inbox", "ux_billing_inbox");
    /// # let _ = INBOX;
    /// ```
    ///
    /// # Panics
    /// Where a name is not an identifier: at compile time in a `const`.
    ///
    /// [`Handler::schema`]: https://docs.rs/inbox-diesel/latest/inbox_diesel/handler/struct.Handler.html#method.schema
    pub const fn named(table: &'static str, constraint: &'static str) -> Self {
        let bytes = table.as_bytes();
        let (mut at, mut dot, mut dots) = (0, 0, 0);
        while at < bytes.len() {
            if bytes[at] == b'.' {
                dots += 1;
                dot = at;
            }
            at += 1;
        }
        let table_ok = match dots {
            0 => Self::is_identifier(bytes, 0, bytes.len()),
            1 => {
                Self::is_identifier(bytes, 0, dot)
                    && Self::is_identifier(bytes, dot + 1, bytes.len())
            }
            _ => false,
        };
        if !table_ok {
            panic!(
                "InboxSchema::named: the table must be an identifier (an ASCII letter or `_`, \
                 then letters, digits or `_`, at most 63 bytes), optionally qualified \
                 (`billing.inbox`)"
            );
        }
        if !Self::is_identifier(constraint.as_bytes(), 0, constraint.len()) {
            panic!(
                "InboxSchema::named: the constraint must be an identifier (an ASCII letter or \
                 `_`, then letters, digits or `_`, at most 63 bytes)"
            );
        }
        Self { table, constraint }
    }

    /// [`validate_identifier`](Self::validate_identifier) of `bytes[from..to]`, in a `const`.
    const fn is_identifier(bytes: &[u8], from: usize, to: usize) -> bool {
        if from >= to || to - from > Self::MAX_IDENTIFIER_LEN {
            return false;
        }
        if !(bytes[from].is_ascii_alphabetic() || bytes[from] == b'_') {
            return false;
        }
        let mut at = from + 1;
        while at < to {
            if !(bytes[at].is_ascii_alphanumeric() || bytes[at] == b'_') {
                return false;
            }
            at += 1;
        }
        true
    }

    /// Builds a schema from names already validated (the macro checks them at compile time).
    #[doc(hidden)]
    pub const fn new_unchecked(table: &'static str, constraint: &'static str) -> Self {
        Self { table, constraint }
    }

    /// The table as written, possibly qualified (`billing.inbox`).
    pub fn table(&self) -> &'static str {
        self.table
    }

    /// The table's own name, without a schema qualifier: what SQLite's messages name.
    pub fn table_name(&self) -> &'static str {
        self.table.rsplit('.').next().unwrap_or(self.table)
    }

    /// The name of the unique index on `(message_id, consumer)`.
    pub fn constraint(&self) -> &'static str {
        self.constraint
    }

    /// Checks a table name: one identifier, or two joined by a dot.
    ///
    /// # Errors
    /// An [`IdentifierError`] for the first part that is not an identifier.
    pub fn validate_table(table: &str) -> Result<(), IdentifierError> {
        let mut parts = table.split('.');
        let (first, second, rest) = (parts.next(), parts.next(), parts.next());
        if rest.is_some() {
            return Err(IdentifierError::new(table, "has more than one `.`"));
        }
        Self::validate_identifier(first.unwrap_or_default())?;
        second.map_or(Ok(()), Self::validate_identifier)
    }

    /// Checks one identifier: an ASCII letter or `_`, then letters, digits or `_`, at most
    /// [`InboxSchema::MAX_IDENTIFIER_LEN`] bytes. Such names need no quoting on any backend.
    ///
    /// # Errors
    /// An [`IdentifierError`] saying which rule the name breaks.
    pub fn validate_identifier(name: &str) -> Result<(), IdentifierError> {
        let mut bytes = name.bytes();
        match bytes.next() {
            None => Err(IdentifierError::new(name, "is empty")),
            Some(b) if !(b.is_ascii_alphabetic() || b == b'_') => Err(IdentifierError::new(
                name,
                "must start with an ASCII letter or `_`",
            )),
            _ if name.len() > Self::MAX_IDENTIFIER_LEN => {
                Err(IdentifierError::new(name, "is longer than 63 bytes"))
            }
            _ if !bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_') => Err(
                IdentifierError::new(name, "may contain only ASCII letters, digits and `_`"),
            ),
            _ => Ok(()),
        }
    }
}

impl Default for InboxSchema {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// A table or index name that is not a plain SQL identifier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentifierError {
    name: String,
    problem: &'static str,
}

impl IdentifierError {
    fn new(name: &str, problem: &'static str) -> Self {
        Self {
            name: name.to_owned(),
            problem,
        }
    }

    /// What is wrong with the name, as a phrase (`is empty`, `must start with …`).
    pub fn problem(&self) -> &'static str {
        self.problem
    }
}

impl fmt::Display for IdentifierError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}` {}", self.name, self.problem)
    }
}

impl std::error::Error for IdentifierError {}
