//! The parts of a composite key: each a text, bytes, an id or an integer, and the types that
//! are one (`ToKeyPart`), tuples of them among the keys.

use super::*;

/// One part of a composite key ([`MessageKey::composite`]): a value of one of the kinds a
/// key is made of. Integers are one kind whatever their Rust type (`7_i32` and `7_u64` are
/// the same part); text, integers, UUIDs and bytes are told apart (`"7"` is not `7`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KeyPart {
    /// Text; must not be empty.
    Text(String),
    /// An integer of any width up to 128 bits, signed or not.
    Integer(i128),
    /// An unsigned integer past `i128::MAX`.
    Unsigned(u128),
    /// A UUID.
    Uuid(Uuid),
    /// Bytes; must not be empty.
    Bytes(Vec<u8>),
}

impl KeyPart {
    /// What the part adds to the key's length: the bytes of text and bytes, the width of
    /// the fixed-size kinds.
    pub(crate) fn len(&self) -> usize {
        match self {
            KeyPart::Text(text) => text.len(),
            KeyPart::Bytes(bytes) => bytes.len(),
            KeyPart::Integer(_) | KeyPart::Unsigned(_) | KeyPart::Uuid(_) => 16,
        }
    }

    /// The part under the digest: its kind's tag, then its value — an integer as 16
    /// big-endian bytes (17 past `i128::MAX`, as [`MessageKey::unsigned`]).
    pub(crate) fn encoded(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(1 + self.len() + 1);
        match self {
            KeyPart::Text(text) => {
                out.push(b't');
                out.extend_from_slice(text.as_bytes());
            }
            KeyPart::Integer(value) => {
                out.push(b'i');
                out.extend_from_slice(&value.to_be_bytes());
            }
            KeyPart::Unsigned(value) => {
                out.push(b'i');
                out.push(0);
                out.extend_from_slice(&value.to_be_bytes());
            }
            KeyPart::Uuid(id) => {
                out.push(b'u');
                out.extend_from_slice(id.as_bytes());
            }
            KeyPart::Bytes(bytes) => {
                out.push(b'b');
                out.extend_from_slice(bytes);
            }
        }
        out
    }
}

impl fmt::Display for KeyPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyPart::Text(text) => f.write_str(text),
            KeyPart::Integer(value) => write!(f, "{value}"),
            KeyPart::Unsigned(value) => write!(f, "{value}"),
            KeyPart::Uuid(id) => write!(f, "{id}"),
            KeyPart::Bytes(bytes) => bytes.iter().try_for_each(|b| write!(f, "{b:02x}")),
        }
    }
}

/// A value that can be one part of a composite key: what the tuples of
/// [`ToMessageKey`] take. Implemented for text (`str`, `String`, `Cow<str>`), the integer
/// types, [`Uuid`], bytes (`[u8]`, `Vec<u8>`, `[u8; N]`), `url::Url` (feature `url`) and
/// references, `Box`es, `Rc`s and `Arc`s of any of these; implement it for an id type of
/// your own.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a part of a composite message key",
    label = "each part of a tuple key must be text, an integer, a Uuid or bytes",
    note = "implement `inbox_diesel::ToKeyPart` for your own id type"
)]
pub trait ToKeyPart {
    /// The part this value is.
    fn to_key_part(&self) -> KeyPart;
}

impl<P: ToKeyPart + ?Sized> ToKeyPart for &P {
    fn to_key_part(&self) -> KeyPart {
        (**self).to_key_part()
    }
}

impl ToKeyPart for str {
    fn to_key_part(&self) -> KeyPart {
        KeyPart::Text(self.to_owned())
    }
}

impl ToKeyPart for String {
    fn to_key_part(&self) -> KeyPart {
        KeyPart::Text(self.clone())
    }
}

impl ToKeyPart for Cow<'_, str> {
    fn to_key_part(&self) -> KeyPart {
        KeyPart::Text(self.to_string())
    }
}

impl ToKeyPart for Uuid {
    fn to_key_part(&self) -> KeyPart {
        KeyPart::Uuid(*self)
    }
}

impl ToKeyPart for [u8] {
    fn to_key_part(&self) -> KeyPart {
        KeyPart::Bytes(self.to_vec())
    }
}

impl ToKeyPart for Vec<u8> {
    fn to_key_part(&self) -> KeyPart {
        KeyPart::Bytes(self.clone())
    }
}

impl<const N: usize> ToKeyPart for [u8; N] {
    fn to_key_part(&self) -> KeyPart {
        KeyPart::Bytes(self.to_vec())
    }
}

impl ToKeyPart for u128 {
    fn to_key_part(&self) -> KeyPart {
        match i128::try_from(*self) {
            Ok(value) => KeyPart::Integer(value),
            Err(_) => KeyPart::Unsigned(*self),
        }
    }
}

#[cfg(feature = "url")]
impl ToKeyPart for url::Url {
    fn to_key_part(&self) -> KeyPart {
        KeyPart::Text(self.as_str().to_owned())
    }
}

/// Tuples of key parts: a composite key ([`MessageKey::composite`]).
macro_rules! composite_keys {
    ($(($($part:ident . $n:tt),+)),+) => {$(
        impl<$($part: ToKeyPart),+> ToMessageKey for ($($part,)+) {
            fn to_message_key(&self) -> Result<MessageKey, KeyError> {
                MessageKey::composite([$(self.$n.to_key_part()),+])
            }
        }
    )+};
}
composite_keys!(
    (A.0, B.1),
    (A.0, B.1, C.2),
    (A.0, B.1, C.2, D.3),
    (A.0, B.1, C.2, D.3, E.4),
    (A.0, B.1, C.2, D.3, E.4, F.5)
);
