use std::borrow::Cow;
use std::fmt;
use std::rc::Rc;
use std::sync::Arc;

use uuid::Uuid;

mod convert;
mod part;

pub use convert::{Scoped, ToMessageKey};
pub use part::{KeyPart, ToKeyPart};

/// The deduplication key of a message: together with the [`Consumer`](crate::Consumer) it
/// names one unit of work that must happen once.
///
/// A key is built from what the broker or the message carries:
///
/// | source | constructor | `ToMessageKey` for |
/// |---|---|---|
/// | a UUID message id | [`MessageKey::uuid`], `From<Uuid>` | `Uuid` |
/// | a string id (AMQP `message-id`, SQS `MessageId`, …) | [`MessageKey::text`] | `str`, `String`, `Cow<str>` |
/// | an integer sequence number | `From<i64>`, `From<u64>`, …, [`MessageKey::unsigned`] | the integer types, `i128` and `u128` |
/// | a binary id, a hash | [`MessageKey::bytes`] | `[u8]`, `Vec<u8>`, `[u8; N]` |
/// | a URL (an ActivityPub id), feature `url` | [`MessageKey::text`] of its serialisation | `url::Url` |
/// | several values that name the work together (`(version_id, email)`) | [`MessageKey::composite`] | tuples of 2 to 6 [`ToKeyPart`]s |
/// | Kafka `(topic, partition, offset)` | [`MessageKey::kafka`] | the tuple `(topic, partition, offset)` |
/// | CloudEvents `(source, id)` | [`MessageKey::cloud_event`] | the tuple `(source, id)` |
/// | any of these within a tenant's or principal's scope | [`MessageKey::scoped`] | [`Scoped`]`(scope, key)` |
///
/// # Stored form
///
/// The inbox stores a fixed 128-bit id ([`MessageKey::stored_id`]), which keeps the unique
/// index narrow (a native `uuid` on PostgreSQL). A UUID key is stored as itself; every other
/// key is stored as a name-based UUID (version 5, SHA-1) of its kind and its length-prefixed
/// parts under [`MessageKey::NAMESPACE`].
///
/// Text is never read as a UUID unless the handler asks for it ([`MessageKey::uuid_text`]):
/// a sender who controls a text key cannot send the stored id of another message's key as
/// text and have it stored as that id. Two distinct keys of one kind share a row only if
/// their digests collide: about one chance in 2⁶¹ among 2⁶¹ keys by chance (122 bits of
/// SHA-1), and pre-empting a given key takes a SHA-1 second preimage, which nobody knows how
/// to compute. Keys of different kinds (text, integer, Kafka, CloudEvents) are tagged apart;
/// a UUID key is stored as itself, so give one consumer one kind of key.
///
/// # Limits
///
/// A key's text (all its parts together) must not be empty and must not exceed
/// [`MessageKey::MAX_LEN`] bytes. Both are checked when the key is built, before any SQL runs.
///
/// ```
/// use inbox_core::{KeyError, MessageKey};
///
/// let id = uuid::Uuid::parse_str("7f1c6b52-4d5e-4c1e-9a56-1b0e4c1d2f3a")?;
/// assert_eq!(MessageKey::from(id).stored_id(), id);
/// // Text is text, even when it looks like a UUID; the handler may ask for the UUID.
/// assert_ne!(MessageKey::text("7f1c6b52-4d5e-4c1e-9a56-1b0e4c1d2f3a")?.stored_id(), id);
/// assert_eq!(MessageKey::uuid_text("7f1c6b52-4d5e-4c1e-9a56-1b0e4c1d2f3a")?.stored_id(), id);
///
/// let long = "x".repeat(MessageKey::MAX_LEN + 1);
/// assert!(matches!(MessageKey::text(long), Err(KeyError::TooLong { .. })));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct MessageKey {
    kind: KeyKind,
    stored_id: Uuid,
}

#[derive(Clone, PartialEq, Eq, Hash)]
enum KeyKind {
    Uuid,
    Text(String),
    Integer(i128),
    Kafka {
        topic: String,
        partition: i32,
        offset: i64,
    },
    CloudEvent {
        source: String,
        id: String,
    },
    Bytes(Vec<u8>),
    Sequence {
        stream: String,
        sequence: u64,
    },
    Scoped {
        scope: String,
        key: Box<MessageKey>,
    },
    Composite(Vec<KeyPart>),
}

impl MessageKey {
    /// The longest key accepted, in bytes (all parts together): 64 KiB. A key is stored as a
    /// 128-bit digest whatever its length, so a long id — an ActivityPub URL, a composite
    /// name — costs the inbox nothing; the limit is there to catch a payload passed where its
    /// id was meant.
    pub const MAX_LEN: usize = 64 * 1024;

    /// How many characters of a key its `Debug` shows, escaped, before it is cut.
    pub const DEBUG_CHARS: usize = 128;

    /// The namespace under which non-UUID keys are turned into their stored id.
    pub const NAMESPACE: Uuid = Uuid::from_u128(0x6a1f_0e3c_9d7b_4f4e_b1c2_5e8d_2a70_c913);

    /// A key that is a UUID; it is stored as itself.
    pub fn uuid(id: Uuid) -> Self {
        Self {
            kind: KeyKind::Uuid,
            stored_id: id,
        }
    }

    /// A UUID given as text (`key = MessageKey::uuid_text(&msg.id)`), for ids that are UUIDs
    /// by contract: stored as the UUID, as [`MessageKey::uuid`] would.
    ///
    /// # Errors
    /// [`KeyError::NotAUuid`] for text that [`Uuid::try_parse`] does not accept.
    pub fn uuid_text(text: &str) -> Result<Self, KeyError> {
        Uuid::try_parse(text)
            .map(Self::uuid)
            .map_err(|_| KeyError::NotAUuid)
    }

    /// A key given as text, stored as a digest of the text — also when it looks like a UUID
    /// (see "Stored form"; [`MessageKey::uuid_text`] reads it as one).
    ///
    /// # Errors
    /// [`KeyError::Empty`] for an empty string, [`KeyError::TooLong`] past [`MessageKey::MAX_LEN`].
    pub fn text(text: impl Into<String>) -> Result<Self, KeyError> {
        let text = text.into();
        check_len(text.len())?;
        let stored_id = derive(b't', &[text.as_bytes()]);
        Ok(Self {
            kind: KeyKind::Text(text),
            stored_id,
        })
    }

    /// A key given as bytes (a binary message id, a hash), stored as a digest of them.
    ///
    /// # Errors
    /// [`KeyError::Empty`] for no bytes, [`KeyError::TooLong`] past [`MessageKey::MAX_LEN`].
    pub fn bytes(bytes: impl Into<Vec<u8>>) -> Result<Self, KeyError> {
        let bytes = bytes.into();
        check_len(bytes.len())?;
        Ok(Self {
            stored_id: derive(b'b', &[&bytes]),
            kind: KeyKind::Bytes(bytes),
        })
    }

    /// A key that is an unsigned 128-bit integer: the same key as the signed integer of the
    /// same value, where there is one.
    pub fn unsigned(value: u128) -> Self {
        match i128::try_from(value) {
            Ok(value) => Self::integer(value),
            // Past i128: 17 bytes, so that no 16-byte i128 encoding can meet it.
            Err(_) => {
                let mut wide = [0_u8; 17];
                wide[1..].copy_from_slice(&value.to_be_bytes());
                Self {
                    stored_id: derive(b'i', &[&wide]),
                    kind: KeyKind::Text(value.to_string()),
                }
            }
        }
    }

    /// A key that is an integer (a sequence number, a database id).
    pub fn integer(value: impl Into<i128>) -> Self {
        let value = value.into();
        Self {
            stored_id: derive(b'i', &[&value.to_be_bytes()]),
            kind: KeyKind::Integer(value),
        }
    }

    /// A Kafka record's position: topic, partition and offset name a record exactly once.
    ///
    /// # Errors
    /// [`KeyError::Empty`] for an empty topic, [`KeyError::TooLong`] past [`MessageKey::MAX_LEN`].
    pub fn kafka(topic: impl Into<String>, partition: i32, offset: i64) -> Result<Self, KeyError> {
        let topic = topic.into();
        if topic.is_empty() {
            return Err(KeyError::Empty);
        }
        check_len(topic.len())?;
        let stored_id = derive(
            b'k',
            &[
                topic.as_bytes(),
                &partition.to_be_bytes(),
                &offset.to_be_bytes(),
            ],
        );
        Ok(Self {
            kind: KeyKind::Kafka {
                topic,
                partition,
                offset,
            },
            stored_id,
        })
    }

    /// A CloudEvents event: the specification makes `(source, id)` unique per distinct event.
    ///
    /// # Errors
    /// [`KeyError::Empty`] when either part is empty, [`KeyError::TooLong`] when both together
    /// exceed [`MessageKey::MAX_LEN`].
    pub fn cloud_event(source: impl Into<String>, id: impl Into<String>) -> Result<Self, KeyError> {
        let (source, id) = (source.into(), id.into());
        if source.is_empty() || id.is_empty() {
            return Err(KeyError::Empty);
        }
        check_len(source.len() + id.len())?;
        let stored_id = derive(b'c', &[source.as_bytes(), id.as_bytes()]);
        Ok(Self {
            kind: KeyKind::CloudEvent { source, id },
            stored_id,
        })
    }

    /// A message's position in a stream that numbers its messages once — a NATS JetStream
    /// stream and its stream sequence — tagged apart from every other kind. (A stream
    /// recreated under the same name numbers from 1 again: see `broker::jetstream`.)
    ///
    /// # Errors
    /// [`KeyError::Empty`] for an empty stream name, [`KeyError::TooLong`] past
    /// [`MessageKey::MAX_LEN`].
    pub fn sequence(stream: impl Into<String>, sequence: u64) -> Result<Self, KeyError> {
        let stream = stream.into();
        if stream.is_empty() {
            return Err(KeyError::Empty);
        }
        check_len(stream.len())?;
        let stored_id = derive(b'q', &[stream.as_bytes(), &sequence.to_be_bytes()]);
        Ok(Self {
            kind: KeyKind::Sequence { stream, sequence },
            stored_id,
        })
    }

    /// A key made of several values that together name the work — `(version_id, email)`,
    /// `(tenant, order, line)` — as `key = (a, b)` of `#[idempotent]` builds it from a tuple
    /// of [`ToKeyPart`]s.
    ///
    /// # Stored form
    ///
    /// The name-based UUID (version 5) under [`MessageKey::NAMESPACE`] of the byte `p`
    /// followed by each part in order, as its length (4 bytes, big-endian) and then its
    /// kind's tag and value: `t` and the text's UTF-8, `i` and the integer as 16 big-endian
    /// bytes of two's complement (past `i128::MAX`, a zero byte and the 16 bytes of the
    /// `u128`), `u` and the UUID's 16 bytes, `b` and the bytes. So `("a", "bc")` and
    /// `("ab", "c")` differ, so do `(7, "x")`, `("7", "x")` and `("x", 7)`, and no composite
    /// key meets a key of another kind; an integer part is the same part whatever its Rust
    /// type. Two shapes keep the stored form the
    /// tuples had before composite keys: two text parts are stored as
    /// [`MessageKey::cloud_event`] stores them, and text followed by two integers, the first
    /// in `i32`'s range and the second in `i64`'s, as [`MessageKey::kafka`] does (its
    /// `(topic, partition, offset)`). The key's text (`Display`, the `key_text` column) is
    /// the parts joined by `/` (a `/` or `\` inside a text part escaped with `\`; two text
    /// parts read `source#id`, a `#` in the first escaped the same way) — for reading only:
    /// it is not what is stored, and `7` reads as `"7"` does.
    ///
    /// ```
    /// use inbox_core::{KeyPart, MessageKey, ToMessageKey};
    ///
    /// let key = (7_i32, "ann@example.com").to_message_key()?;
    /// assert_eq!(key.to_string(), "7/ann@example.com");
    /// assert_eq!(key, (7_u64, String::from("ann@example.com")).to_message_key()?);
    /// assert_ne!(key, ("7", "ann@example.com").to_message_key()?);
    /// assert_eq!(
    ///     key,
    ///     MessageKey::composite([KeyPart::Integer(7), KeyPart::Text("ann@example.com".into())])?
    /// );
    /// # Ok::<(), inbox_core::KeyError>(())
    /// ```
    ///
    /// # Errors
    /// [`KeyError::Empty`] for no parts, [`KeyError::EmptyPart`] for an empty text or bytes
    /// part,
    /// [`KeyError::TooLong`] when the parts together exceed [`MessageKey::MAX_LEN`].
    pub fn composite(parts: impl IntoIterator<Item = KeyPart>) -> Result<Self, KeyError> {
        // An unsigned part within `i128` is that integer, however it was built.
        let parts: Vec<KeyPart> = parts
            .into_iter()
            .map(|part| match part {
                KeyPart::Unsigned(value) => value.to_key_part(),
                part => part,
            })
            .collect();
        if parts.is_empty() {
            return Err(KeyError::Empty);
        }
        if let Some(at) = parts.iter().position(|part| {
            matches!(part, KeyPart::Text(_) | KeyPart::Bytes(_)) && part.len() == 0
        }) {
            return Err(KeyError::EmptyPart {
                part: at + 1,
                of: parts.len(),
            });
        }
        check_len(parts.iter().map(KeyPart::len).sum())?;
        match parts.as_slice() {
            [KeyPart::Text(source), KeyPart::Text(id)] => {
                return Self::cloud_event(source.as_str(), id.as_str());
            }
            [
                KeyPart::Text(topic),
                KeyPart::Integer(partition),
                KeyPart::Integer(offset),
            ] => {
                if let (Ok(partition), Ok(offset)) =
                    (i32::try_from(*partition), i64::try_from(*offset))
                {
                    return Self::kafka(topic.as_str(), partition, offset);
                }
            }
            _ => {}
        }
        let encoded: Vec<Vec<u8>> = parts.iter().map(KeyPart::encoded).collect();
        let slices: Vec<&[u8]> = encoded.iter().map(Vec::as_slice).collect();
        Ok(Self {
            stored_id: derive(b'p', &slices),
            kind: KeyKind::Composite(parts),
        })
    }

    /// This key within `scope` — a tenant, a principal, a route: the same key in two scopes
    /// is two keys, so that a key one tenant sends never answers another's. The stored id is
    /// the name-based UUID of the scope and this key's stored id, tagged apart from every
    /// other kind; a scoped UUID key is hashed too.
    ///
    /// ```
    /// use inbox_core::{MessageKey, Scoped, ToMessageKey};
    ///
    /// let key = MessageKey::text("order-7")?;
    /// let (a, b) = (key.clone().scoped("tenant-a")?, key.clone().scoped("tenant-b")?);
    /// assert_ne!(a.stored_id(), b.stored_id());
    /// assert_ne!(a.stored_id(), key.stored_id());
    /// assert_eq!(Scoped("tenant-a", "order-7").to_message_key()?, a);
    /// # Ok::<(), inbox_core::KeyError>(())
    /// ```
    ///
    /// # Errors
    /// [`KeyError::Empty`] for an empty scope, [`KeyError::TooLong`] for a scope over
    /// [`MessageKey::MAX_LEN`].
    pub fn scoped(self, scope: impl Into<String>) -> Result<Self, KeyError> {
        let scope = scope.into();
        check_len(scope.len())?;
        let stored_id = derive(b's', &[scope.as_bytes(), self.stored_id.as_bytes()]);
        Ok(Self {
            kind: KeyKind::Scoped {
                scope,
                key: Box::new(self),
            },
            stored_id,
        })
    }

    /// The 128-bit id the inbox row is stored under (see "Stored form" above).
    pub fn stored_id(&self) -> Uuid {
        self.stored_id
    }
}

fn check_len(len: usize) -> Result<(), KeyError> {
    match len {
        0 => Err(KeyError::Empty),
        len if len > MessageKey::MAX_LEN => Err(KeyError::TooLong {
            len,
            max: MessageKey::MAX_LEN,
        }),
        _ => Ok(()),
    }
}

/// Name-based id of a non-UUID key. Every part is length-prefixed and the kind is tagged, so
/// `("a", "bc")` and `("ab", "c")`, or the text `"42"` and the integer `42`, differ.
fn derive(kind: u8, parts: &[&[u8]]) -> Uuid {
    let mut name = Vec::with_capacity(1 + parts.iter().map(|p| p.len() + 4).sum::<usize>());
    name.push(kind);
    for part in parts {
        let len = u32::try_from(part.len()).expect("key parts are bounded by MAX_LEN");
        name.extend_from_slice(&len.to_be_bytes());
        name.extend_from_slice(part);
    }
    Uuid::new_v5(&MessageKey::NAMESPACE, &name)
}

impl fmt::Display for MessageKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            KeyKind::Uuid => write!(f, "{}", self.stored_id),
            KeyKind::Text(text) => f.write_str(text),
            KeyKind::Integer(value) => write!(f, "{value}"),
            KeyKind::Kafka {
                topic,
                partition,
                offset,
            } => write!(f, "{topic}/{partition}@{offset}"),
            // A `#` or `\` in the source is escaped with `\`: the first `#` that is not
            // ends it, so `("h#", "x")` and `("h", "#x")` read apart (`h\##x`, `h##x`).
            KeyKind::CloudEvent { source, id } => {
                escaped(f, source, '#')?;
                write!(f, "#{id}")
            }
            KeyKind::Bytes(bytes) => bytes.iter().try_for_each(|b| write!(f, "{b:02x}")),
            KeyKind::Sequence { stream, sequence } => write!(f, "{stream}:{sequence}"),
            KeyKind::Scoped { scope, key } => write!(f, "[{scope}] {key}"),
            // Parts joined by `/`; a `/` or `\` inside a text part is escaped with `\`, so
            // that `("a/", "b")` and `("a", "/b")` read apart (`a\//b`, `a/\/b`).
            KeyKind::Composite(parts) => {
                for (n, part) in parts.iter().enumerate() {
                    if n > 0 {
                        f.write_str("/")?;
                    }
                    match part {
                        KeyPart::Text(text) => escaped(f, text, '/')?,
                        part => write!(f, "{part}")?,
                    }
                }
                Ok(())
            }
        }
    }
}

/// `text` with each `separator` and `\` in it escaped by a `\`.
fn escaped(f: &mut fmt::Formatter<'_>, text: &str, separator: char) -> fmt::Result {
    if !text.contains([separator, '\\']) {
        return f.write_str(text);
    }
    text.chars().try_for_each(|c| match c {
        '\\' => f.write_str("\\\\"),
        c if c == separator => write!(f, "\\{c}"),
        c => write!(f, "{c}"),
    })
}

/// The key for logs: its text quoted and escaped as Rust escapes a string (a newline is `\n`,
/// an escape sequence `\u{1b}`), and cut after [`MessageKey::DEBUG_CHARS`] characters with the
/// length of the whole, so that a key a sender chose cannot forge log lines, drive a
/// terminal, or write 64 KiB into one line. `Display` is the key's text as it is.
///
/// ```
/// use inbox_core::MessageKey;
///
/// let key = MessageKey::text("a\nINFO forged line\u{1b}[2J")?;
/// assert_eq!(format!("{key:?}"), r#"MessageKey("a\nINFO forged line\u{1b}[2J")"#);
///
/// let long = MessageKey::text("x".repeat(MessageKey::MAX_LEN))?;
/// let logged = format!("{long:?}");
/// assert!(logged.len() < 200);
/// assert!(logged.ends_with("… (65536 bytes))"));
/// # Ok::<(), inbox_core::KeyError>(())
/// ```
impl fmt::Debug for MessageKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = self.to_string();
        f.write_str("MessageKey(\"")?;
        let mut chars = text.chars();
        for c in chars.by_ref().take(Self::DEBUG_CHARS) {
            write!(f, "{}", c.escape_debug())?;
        }
        match chars.next() {
            None => f.write_str("\")"),
            Some(_) => write!(f, "\"… ({} bytes))", text.len()),
        }
    }
}

/// Why a message key was refused. Raised when the key is built, before any SQL runs.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyError {
    /// The key is empty, or has no parts: almost always a message that lost its id.
    Empty,
    /// One text or bytes part of a composite key is empty — which one, counted from 1, of
    /// how many: almost always a field of the message left unset.
    EmptyPart {
        /// The empty part's place in the key, counted from 1.
        part: usize,
        /// How many parts the key has.
        of: usize,
    },
    /// The key is longer than [`MessageKey::MAX_LEN`] bytes: almost always a payload passed
    /// where its id was meant.
    TooLong {
        /// The key's length in bytes.
        len: usize,
        /// The limit, [`MessageKey::MAX_LEN`].
        max: usize,
    },
    /// [`MessageKey::uuid_text`] was given text that is not a UUID.
    NotAUuid,
    /// The key's text, which an inbox table with `key_text` keeps beside the marker, makes
    /// the marker's statement larger than the server takes in one packet (MySQL and
    /// MariaDB `max_allowed_packet`). Sent, the server would drop the connection, and every
    /// redelivery would do the same: refused before it is sent.
    TooLongForServer {
        /// The key's length in bytes.
        len: usize,
        /// The server's `max_allowed_packet`, in bytes.
        max_packet: u64,
    },
    /// The message carries no id where its broker's key is read from (an AMQP message
    /// without `message_id`, say). The consumer must not make one up: every redelivery of
    /// the message would get another and be processed again. The publisher sets it.
    Missing {
        /// What is missing, e.g. `"AMQP message_id"`.
        field: &'static str,
    },
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyError::Empty => f.write_str("message key is empty"),
            KeyError::EmptyPart { part, of } => {
                write!(f, "part {part} of the {of}-part message key is empty")
            }
            KeyError::TooLong { len, max } => {
                write!(
                    f,
                    "message key is {len} bytes long; the limit is {max} bytes"
                )
            }
            KeyError::NotAUuid => f.write_str("message key is not a UUID"),
            KeyError::TooLongForServer { len, max_packet } => write!(
                f,
                "message key is {len} bytes long: with its text in `key_text`, the marker's \
                 statement is larger than the server's max_allowed_packet of {max_packet} \
                 bytes (raise max_allowed_packet, or key the message on a shorter id)"
            ),
            KeyError::Missing { field } => write!(
                f,
                "the message has no {field}: the publisher must set it (an id the consumer \
                 made up would be new on every redelivery)"
            ),
        }
    }
}

impl std::error::Error for KeyError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_and_parts_never_share_a_stored_id() {
        let ids = [
            MessageKey::text("42").unwrap().stored_id(),
            MessageKey::integer(42).stored_id(),
            MessageKey::cloud_event("a", "bc").unwrap().stored_id(),
            MessageKey::cloud_event("ab", "c").unwrap().stored_id(),
            MessageKey::kafka("t", 0, 1).unwrap().stored_id(),
            MessageKey::kafka("t", 1, 0).unwrap().stored_id(),
        ];
        for (i, a) in ids.iter().enumerate() {
            for b in &ids[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }

    #[test]
    fn stored_id_is_stable_across_releases() {
        // The stored id is persisted: changing the derivation would let every message in
        // existing inboxes be processed a second time.
        assert_eq!(
            MessageKey::text("order-1").unwrap().stored_id(),
            Uuid::parse_str(STORED_ORDER_1).unwrap()
        );
    }

    #[test]
    fn pointers_are_the_keys_they_point_to() {
        let text = MessageKey::text("files/ab.webp").unwrap();
        let shared: Arc<str> = "files/ab.webp".into();
        assert_eq!(shared.to_message_key().unwrap(), text);
        assert_eq!(
            Box::<str>::from("files/ab.webp").to_message_key().unwrap(),
            text
        );
        assert_eq!(
            Rc::new(String::from("files/ab.webp"))
                .to_message_key()
                .unwrap(),
            text
        );
        assert_eq!(
            (Arc::new(7_i64), shared).to_message_key().unwrap(),
            (7_i64, "files/ab.webp").to_message_key().unwrap()
        );
    }

    #[test]
    fn an_optional_id_is_its_key_or_missing() {
        assert_eq!(
            Some("order-1").to_message_key().unwrap(),
            MessageKey::text("order-1").unwrap()
        );
        let missing = None::<&str>.to_message_key().unwrap_err();
        assert!(matches!(missing, KeyError::Missing { .. }), "{missing:?}");
        assert!(missing.to_string().contains("`None`"), "{missing}");
    }

    const STORED_ORDER_1: &str = "4c4f1b35-a5fe-56db-9f13-c3e78c6a6818";

    /// The tuples that meant a Kafka position and a CloudEvents pair before composite keys
    /// keep those keys' stored ids: messages processed before stay processed.
    #[test]
    fn tuples_keep_the_kafka_and_cloud_event_stored_ids() {
        assert_eq!(
            ("payments", 3_i32, 1_204_i64).to_message_key().unwrap(),
            MessageKey::kafka("payments", 3, 1_204).unwrap()
        );
        assert_eq!(
            (String::from("payments"), 3_u8, 1_204_u64)
                .to_message_key()
                .unwrap(),
            MessageKey::kafka("payments", 3, 1_204).unwrap()
        );
        assert_eq!(
            ("https://source", "id-1").to_message_key().unwrap(),
            MessageKey::cloud_event("https://source", "id-1").unwrap()
        );
        // Past i32, the partition is not one: a composite key of its own.
        let wide = ("payments", i64::from(i32::MAX) + 1, 1_i64)
            .to_message_key()
            .unwrap();
        assert_ne!(
            wide.stored_id(),
            MessageKey::kafka("payments", i32::MAX, 1)
                .unwrap()
                .stored_id()
        );
    }

    /// A composite key's stored id is persisted: fixed here as the text key's is.
    #[test]
    fn composite_stored_id_is_stable() {
        let key = (7_i32, "ann@example.com", Uuid::from_u128(1))
            .to_message_key()
            .unwrap();
        assert_eq!(
            key.to_string(),
            "7/ann@example.com/00000000-0000-0000-0000-000000000001"
        );
        assert_eq!(key.stored_id(), Uuid::parse_str(STORED_COMPOSITE).unwrap());
    }

    const STORED_COMPOSITE: &str = "99197f18-4c86-5d97-b99a-204fae96d530";

    #[test]
    fn composite_text_reads_apart_where_a_part_holds_the_separator() {
        let text = |parts: &[&str]| {
            MessageKey::composite(parts.iter().map(|part| KeyPart::Text((*part).into())))
                .unwrap()
                .to_string()
        };
        assert_eq!(
            text(&["v7", "ann@example.com", "x"]),
            "v7/ann@example.com/x"
        );
        assert_eq!(text(&["a/", "b", "c"]), "a\\//b/c");
        assert_eq!(text(&["a", "/b", "c"]), "a/\\/b/c");
        assert_eq!(text(&["a\\", "b", "c"]), "a\\\\/b/c");
        // Two text parts: a CloudEvents pair's form, `source#id`.
        assert_eq!(text(&["h#", "thumb"]), "h\\##thumb");
        assert_eq!(text(&["h", "#thumb"]), "h##thumb");
        assert_eq!(text(&["https://a.example/", "7"]), "https://a.example/#7");
    }

    #[test]
    fn composite_parts_are_told_apart() {
        let keys = [
            (7_i32, "x").to_message_key().unwrap(),
            ("x", 7_i32).to_message_key().unwrap(),
            ("7", 7_i32).to_message_key().unwrap(),
            (7_i32, 7_i32).to_message_key().unwrap(),
            (7_i32, 7_i32, 7_i32).to_message_key().unwrap(),
            (7_i32, b"x".as_slice()).to_message_key().unwrap(),
            (Uuid::from_u128(7), "x").to_message_key().unwrap(),
            (u128::MAX, "x").to_message_key().unwrap(),
            MessageKey::composite([KeyPart::Unsigned(u128::MAX), KeyPart::Text("y".into())])
                .unwrap(),
            MessageKey::text("7/x").unwrap(),
            MessageKey::integer(7),
        ];
        for (i, a) in keys.iter().enumerate() {
            for b in &keys[i + 1..] {
                assert_ne!(a.stored_id(), b.stored_id(), "{a:?} {b:?}");
            }
        }
        assert_eq!(
            (7_u8, "x").to_message_key().unwrap(),
            (7_i128, String::from("x")).to_message_key().unwrap()
        );
        assert_eq!(
            MessageKey::composite([KeyPart::Unsigned(7), KeyPart::Text("x".into())]).unwrap(),
            (7_i32, "x").to_message_key().unwrap()
        );
        assert_eq!(
            (1_i32, "").to_message_key(),
            Err(KeyError::EmptyPart { part: 2, of: 2 })
        );
        assert_eq!(
            (1_i32, "").to_message_key().unwrap_err().to_string(),
            "part 2 of the 2-part message key is empty"
        );
        assert_eq!(MessageKey::composite([]), Err(KeyError::Empty));
        let half = "x".repeat(MessageKey::MAX_LEN / 2);
        assert!(matches!(
            (1_i32, half.as_str(), half.as_str()).to_message_key(),
            Err(KeyError::TooLong { .. })
        ));
    }

    #[test]
    fn length_limit_counts_every_part() {
        let half = "x".repeat(MessageKey::MAX_LEN / 2);
        assert!(MessageKey::cloud_event(half.clone(), half.clone()).is_ok());
        assert_eq!(
            MessageKey::cloud_event(half.clone(), format!("{half}y")),
            Err(KeyError::TooLong {
                len: MessageKey::MAX_LEN + 1,
                max: MessageKey::MAX_LEN
            })
        );
        assert_eq!(MessageKey::text(""), Err(KeyError::Empty));
        assert_eq!(MessageKey::kafka("", 0, 0), Err(KeyError::Empty));
        assert_eq!(MessageKey::cloud_event("s", ""), Err(KeyError::Empty));
    }

    /// A part alone is the whole key its value is, however it is given.
    #[test]
    fn a_part_alone_is_the_key_its_value_is() {
        let id = Uuid::from_u128(7);
        assert_eq!(id.to_key_part().to_message_key(), id.to_message_key());
        assert_eq!("a".to_key_part().to_message_key(), "a".to_message_key());
        assert_eq!(7_i32.to_key_part().to_message_key(), 7_i32.to_message_key());
        assert_eq!(
            u128::MAX.to_key_part().to_message_key(),
            u128::MAX.to_message_key()
        );
        assert_eq!(
            vec![1_u8, 2].to_key_part().to_message_key(),
            vec![1_u8, 2].to_message_key()
        );
        assert_eq!("".to_key_part().to_message_key(), Err(KeyError::Empty));
    }

    /// A sender who controls a text key sends the stored id of another message's key as
    /// text: it is stored as the digest of that text, not as the id.
    #[test]
    fn text_is_never_read_as_a_uuid() {
        let victim = MessageKey::text("order-2").unwrap().stored_id();
        for forged in [victim.to_string(), victim.simple().to_string()] {
            assert_ne!(MessageKey::text(forged).unwrap().stored_id(), victim);
        }
        let id = Uuid::from_u128(7);
        assert_eq!(
            MessageKey::uuid_text(&id.to_string()).unwrap(),
            MessageKey::uuid(id)
        );
        assert_eq!(MessageKey::uuid_text("order-2"), Err(KeyError::NotAUuid));
    }

    /// Bytes, 128-bit integers and long ids are keys; the kinds never meet.
    #[test]
    fn bytes_wide_integers_and_long_keys() {
        let bytes = MessageKey::bytes(*b"42").unwrap();
        assert_ne!(
            bytes.stored_id(),
            MessageKey::text("42").unwrap().stored_id()
        );
        assert_eq!(
            [1_u8, 2].to_message_key().unwrap(),
            vec![1_u8, 2].to_message_key().unwrap()
        );
        assert_eq!(bytes.to_string(), "3432");
        assert_eq!(MessageKey::unsigned(7), MessageKey::integer(7_i64));
        assert_ne!(
            MessageKey::unsigned(u128::MAX).stored_id(),
            MessageKey::integer(-1_i128).stored_id()
        );
        let activity = format!("https://example.social/{}", "a".repeat(1_039));
        assert!(MessageKey::text(activity).is_ok(), "a long id is a key");
        assert_eq!(MessageKey::bytes(Vec::new()), Err(KeyError::Empty));
    }

    #[test]
    fn conversions_through_references() {
        let topic = String::from("payments");
        let key = (&topic, 3, 7_i64).to_message_key().unwrap();
        assert_eq!(key.to_string(), "payments/3@7");
        assert_eq!((&&5_u32).to_message_key().unwrap(), MessageKey::integer(5));
    }
}
