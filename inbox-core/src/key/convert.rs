//! What a key can be made from (`ToMessageKey`): ids, text, bytes, integers, URLs, a scoped
//! key, and the pointers and options that hold one.

use super::*;

impl From<Uuid> for MessageKey {
    fn from(id: Uuid) -> Self {
        Self::uuid(id)
    }
}

macro_rules! integer_keys {
    ($($int:ty),*) => {$(
        impl From<$int> for MessageKey {
            fn from(value: $int) -> Self {
                Self::integer(value)
            }
        }
        impl ToMessageKey for $int {
            fn to_message_key(&self) -> Result<MessageKey, KeyError> {
                Ok(MessageKey::integer(*self))
            }
        }
        impl ToKeyPart for $int {
            fn to_key_part(&self) -> KeyPart {
                KeyPart::Integer(i128::from(*self))
            }
        }
    )*};
}
integer_keys!(i8, i16, i32, i64, i128, u8, u16, u32, u64);

impl ToMessageKey for u128 {
    fn to_message_key(&self) -> Result<MessageKey, KeyError> {
        Ok(MessageKey::unsigned(*self))
    }
}

impl ToMessageKey for [u8] {
    fn to_message_key(&self) -> Result<MessageKey, KeyError> {
        MessageKey::bytes(self)
    }
}

impl ToMessageKey for Vec<u8> {
    fn to_message_key(&self) -> Result<MessageKey, KeyError> {
        MessageKey::bytes(self.as_slice())
    }
}

impl<const N: usize> ToMessageKey for [u8; N] {
    fn to_message_key(&self) -> Result<MessageKey, KeyError> {
        MessageKey::bytes(self.as_slice())
    }
}

/// An ActivityPub id, a webhook's event URL: the URL's text is the key.
#[cfg(feature = "url")]
impl ToMessageKey for url::Url {
    fn to_message_key(&self) -> Result<MessageKey, KeyError> {
        MessageKey::text(self.as_str())
    }
}

impl TryFrom<&str> for MessageKey {
    type Error = KeyError;
    fn try_from(text: &str) -> Result<Self, KeyError> {
        Self::text(text)
    }
}

impl TryFrom<String> for MessageKey {
    type Error = KeyError;
    fn try_from(text: String) -> Result<Self, KeyError> {
        Self::text(text)
    }
}

/// A value that names a message: what `key = …` of `#[idempotent]` accepts.
///
/// Implemented for [`Uuid`], text (`str`, `String`, `Cow<str>`), bytes (`[u8]`, `Vec<u8>`,
/// `[u8; N]`), the integer types up to `i128` and `u128`, `url::Url` (feature `url`: the
/// URL's serialisation as text — normalised by the `url` crate, so `https://Example.social`
/// is the key `https://example.social/`), tuples of 2 to 6 [`ToKeyPart`]s (a composite key,
/// [`MessageKey::composite`] — a Kafka `(topic, partition, offset)` and a CloudEvents
/// `(source, id)` among them), [`MessageKey`] itself, and references, `Box`es, `Rc`s and
/// `Arc`s of any of these (`Arc<str>`), and `Option`s of them (`None` is a missing id).
/// Implement it for your own message id type to use that type directly as a key.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be used as a message key",
    label = "`key = …` must be a message id",
    note = "a key is a Uuid, text (a URL with the feature `url`), bytes, an integer, or a tuple of \
            those (a composite key); implement `inbox_diesel::ToMessageKey` for your own id type",
    note = "an id type that is a `ToKeyPart` is a whole key with \
            `fn to_message_key(&self) -> Result<MessageKey, KeyError> {{ self.to_key_part().to_message_key() }}`"
)]
pub trait ToMessageKey {
    /// Builds the key, checking its length.
    ///
    /// # Errors
    /// A [`KeyError`] for an empty or over-long key.
    fn to_message_key(&self) -> Result<MessageKey, KeyError>;
}

impl ToMessageKey for MessageKey {
    fn to_message_key(&self) -> Result<MessageKey, KeyError> {
        Ok(self.clone())
    }
}

/// A key part as a whole key: the key its value is alone (`7.to_key_part()` is the key `7`,
/// a text part the text key). An id type of your own that is a [`ToKeyPart`] is a whole key
/// through it, with one line:
///
/// ```
/// use inbox_core::{KeyError, KeyPart, MessageKey, ToKeyPart, ToMessageKey};
///
/// struct UserId(String);
///
/// impl ToKeyPart for UserId {
///     fn to_key_part(&self) -> KeyPart {
///         self.0.to_key_part()
///     }
/// }
///
/// impl ToMessageKey for UserId {
///     fn to_message_key(&self) -> Result<MessageKey, KeyError> {
///         self.to_key_part().to_message_key()
///     }
/// }
///
/// let id = UserId("ann".into());
/// assert_eq!(id.to_message_key()?, "ann".to_message_key()?);
/// assert_eq!((&id, 7).to_message_key()?, ("ann", 7).to_message_key()?);
/// # Ok::<(), KeyError>(())
/// ```
impl ToMessageKey for KeyPart {
    fn to_message_key(&self) -> Result<MessageKey, KeyError> {
        match self {
            KeyPart::Text(text) => MessageKey::text(text.as_str()),
            KeyPart::Integer(value) => Ok(MessageKey::integer(*value)),
            KeyPart::Unsigned(value) => Ok(MessageKey::unsigned(*value)),
            KeyPart::Uuid(id) => Ok(MessageKey::uuid(*id)),
            KeyPart::Bytes(bytes) => MessageKey::bytes(bytes.as_slice()),
        }
    }
}

impl ToMessageKey for Uuid {
    fn to_message_key(&self) -> Result<MessageKey, KeyError> {
        Ok(MessageKey::uuid(*self))
    }
}

impl ToMessageKey for str {
    fn to_message_key(&self) -> Result<MessageKey, KeyError> {
        MessageKey::text(self)
    }
}

impl ToMessageKey for String {
    fn to_message_key(&self) -> Result<MessageKey, KeyError> {
        MessageKey::text(self.as_str())
    }
}

impl ToMessageKey for Cow<'_, str> {
    fn to_message_key(&self) -> Result<MessageKey, KeyError> {
        MessageKey::text(self.as_ref())
    }
}

/// A key within a scope the application supplies — a tenant, a principal
/// ([`MessageKey::scoped`]): `key = Scoped(&msg.tenant, msg.id)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Scoped<S, K>(pub S, pub K);

impl<S: AsRef<str>, K: ToMessageKey> ToMessageKey for Scoped<S, K> {
    fn to_message_key(&self) -> Result<MessageKey, KeyError> {
        self.1.to_message_key()?.scoped(self.0.as_ref())
    }
}

impl<K: ToMessageKey + ?Sized> ToMessageKey for &K {
    fn to_message_key(&self) -> Result<MessageKey, KeyError> {
        (**self).to_message_key()
    }
}

/// An id the message may lack (`msg["id"].as_str()`, an optional header): `None` is refused
/// as a missing id ([`KeyError::Missing`], dead-lettered) before any SQL — never keyed on
/// something the consumer makes up.
impl<K: ToMessageKey> ToMessageKey for Option<K> {
    fn to_message_key(&self) -> Result<MessageKey, KeyError> {
        match self {
            Some(key) => key.to_message_key(),
            None => Err(KeyError::Missing {
                field: "id (the handler's key is `None`)",
            }),
        }
    }
}

/// The shared and owned pointers applications keep ids in (`Arc<str>`, `Box<str>`,
/// `Rc<Uuid>`, …): the key of what they point to.
macro_rules! pointer_keys {
    ($($pointer:ident),*) => {$(
        impl<K: ToMessageKey + ?Sized> ToMessageKey for $pointer<K> {
            fn to_message_key(&self) -> Result<MessageKey, KeyError> {
                (**self).to_message_key()
            }
        }
        impl<P: ToKeyPart + ?Sized> ToKeyPart for $pointer<P> {
            fn to_key_part(&self) -> KeyPart {
                (**self).to_key_part()
            }
        }
    )*};
}
pointer_keys!(Box, Rc, Arc);
