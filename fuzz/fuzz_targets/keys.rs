//! Key encoding: two keys that are not the same key never get the same stored id (the
//! encoding under the digest is unambiguous across kinds and parts), and the same key built
//! twice gets the same one.
#![no_main]

use arbitrary::Arbitrary;
use inbox_core::MessageKey;
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
enum Key {
    Uuid(u128),
    UuidText(String),
    Text(String),
    Bytes(Vec<u8>),
    Unsigned(u128),
    Integer(i128),
    Kafka(String, i32, i64),
    CloudEvent(String, String),
    Sequence(String, u64),
    Scoped(String, Box<Key>),
    Composite(Vec<Part>),
}

#[derive(Debug, Arbitrary)]
enum Part {
    Text(String),
    Integer(i128),
    Unsigned(u128),
    Uuid(u128),
    Bytes(Vec<u8>),
}

impl Part {
    fn build(&self) -> inbox_core::KeyPart {
        use inbox_core::{KeyPart, ToKeyPart};
        match self {
            Part::Text(text) => KeyPart::Text(text.clone()),
            Part::Integer(n) => n.to_key_part(),
            Part::Unsigned(n) => n.to_key_part(),
            Part::Uuid(n) => KeyPart::Uuid(uuid::Uuid::from_u128(*n)),
            Part::Bytes(bytes) => KeyPart::Bytes(bytes.clone()),
        }
    }
}

impl Key {
    fn build(&self) -> Option<MessageKey> {
        match self {
            Key::Uuid(n) => Some(MessageKey::uuid(uuid::Uuid::from_u128(*n))),
            Key::UuidText(text) => MessageKey::uuid_text(text).ok(),
            Key::Text(text) => MessageKey::text(text.clone()).ok(),
            Key::Bytes(bytes) => MessageKey::bytes(bytes.clone()).ok(),
            Key::Unsigned(n) => Some(MessageKey::unsigned(*n)),
            Key::Integer(n) => Some(MessageKey::integer(*n)),
            Key::Kafka(topic, partition, offset) => {
                MessageKey::kafka(topic.clone(), *partition, *offset).ok()
            }
            Key::CloudEvent(source, id) => MessageKey::cloud_event(source.clone(), id.clone()).ok(),
            Key::Sequence(stream, n) => MessageKey::sequence(stream.clone(), *n).ok(),
            Key::Scoped(scope, key) => key.build()?.scoped(scope.clone()).ok(),
            Key::Composite(parts) => MessageKey::composite(parts.iter().map(Part::build)).ok(),
        }
    }
}

fuzz_target!(|pair: (Key, Key)| {
    let (Some(a), Some(b)) = (pair.0.build(), pair.1.build()) else {
        return;
    };
    assert_eq!(pair.0.build().map(|k| k.stored_id()), Some(a.stored_id()));
    if a.stored_id() == b.stored_id() {
        assert_eq!(
            a,
            b,
            "{:?} and {:?} share the stored id {}",
            pair.0,
            pair.1,
            a.stored_id()
        );
    }
});
