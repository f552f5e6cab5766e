use std::borrow::Cow;
use std::fmt;

/// The name of the handler that consumes a message, stored beside the message key.
///
/// Two handlers that consume the same message (a credit and an audit, say) each keep their
/// own marker, so each must have its own name. A name is non-empty, at most
/// [`Consumer::MAX_LEN`] bytes and free of control characters; `#[idempotent]` checks its
/// `consumer = "…"` literal against the same rule at compile time.
///
/// ```
/// use inbox_core::{Consumer, ConsumerError};
///
/// assert_eq!(Consumer::new("credit")?.as_str(), "credit");
/// assert_eq!(Consumer::new(""), Err(ConsumerError::Empty));
/// # Ok::<(), ConsumerError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Consumer(Cow<'static, str>);

impl Consumer {
    /// The longest consumer name accepted, in bytes.
    pub const MAX_LEN: usize = 200;

    /// A validated consumer name.
    ///
    /// # Errors
    /// A [`ConsumerError`] saying which rule the name breaks.
    pub fn new(name: impl Into<Cow<'static, str>>) -> Result<Self, ConsumerError> {
        let name = name.into();
        Self::validate(&name)?;
        Ok(Self(name))
    }

    /// A consumer from a name already validated at compile time by `#[idempotent]`.
    #[doc(hidden)]
    pub const fn from_validated(name: &'static str) -> Self {
        Self(Cow::Borrowed(name))
    }

    /// Checks a name against the rules without building a `Consumer`.
    ///
    /// # Errors
    /// A [`ConsumerError`] saying which rule the name breaks.
    pub fn validate(name: &str) -> Result<(), ConsumerError> {
        if name.is_empty() {
            return Err(ConsumerError::Empty);
        }
        if name.len() > Self::MAX_LEN {
            return Err(ConsumerError::TooLong {
                len: name.len(),
                max: Self::MAX_LEN,
            });
        }
        if let Some(at) = name.char_indices().find(|(_, c)| c.is_control()) {
            return Err(ConsumerError::ControlCharacter { at: at.0 });
        }
        // MySQL and MariaDB compare `utf8mb4_bin` text with trailing spaces ignored (PAD
        // SPACE): `credit` and `credit ` would share markers there and not elsewhere.
        if name.trim() != name {
            return Err(ConsumerError::SurroundingWhitespace);
        }
        Ok(())
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Consumer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Consumer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Consumer({:?})", self.0)
    }
}

impl AsRef<str> for Consumer {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// Why a consumer name was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConsumerError {
    /// The name is empty.
    Empty,
    /// The name is longer than [`Consumer::MAX_LEN`] bytes.
    TooLong {
        /// The name's length in bytes.
        len: usize,
        /// The limit, [`Consumer::MAX_LEN`].
        max: usize,
    },
    /// The name contains a control character (a newline, a tab, a NUL, …).
    ControlCharacter {
        /// Byte offset of the first control character.
        at: usize,
    },
    /// The name starts or ends with whitespace: MySQL and MariaDB would compare `credit ` equal
    /// to `credit`, so two consumers would share markers there.
    SurroundingWhitespace,
}

impl fmt::Display for ConsumerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConsumerError::Empty => f.write_str("consumer name is empty"),
            ConsumerError::TooLong { len, max } => {
                write!(
                    f,
                    "consumer name is {len} bytes long; the limit is {max} bytes"
                )
            }
            ConsumerError::ControlCharacter { at } => {
                write!(f, "consumer name contains a control character at byte {at}")
            }
            ConsumerError::SurroundingWhitespace => f.write_str(
                "consumer name starts or ends with whitespace, which MySQL and MariaDB ignore \
                 when they compare names",
            ),
        }
    }
}

impl std::error::Error for ConsumerError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules() {
        assert!(Consumer::new("credit.v2 (EU)").is_ok());
        assert_eq!(
            Consumer::new("credit "),
            Err(ConsumerError::SurroundingWhitespace)
        );
        assert_eq!(
            Consumer::new(" credit"),
            Err(ConsumerError::SurroundingWhitespace)
        );
        assert!(Consumer::new("x".repeat(Consumer::MAX_LEN)).is_ok());
        assert_eq!(
            Consumer::new("x".repeat(Consumer::MAX_LEN + 1)),
            Err(ConsumerError::TooLong { len: 201, max: 200 })
        );
        assert_eq!(
            Consumer::new("a\tb"),
            Err(ConsumerError::ControlCharacter { at: 1 })
        );
        assert_eq!(
            Consumer::new("é\u{85}"),
            Err(ConsumerError::ControlCharacter { at: 2 })
        );
    }
}
