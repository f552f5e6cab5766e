//! Values every layer may name: a request's fingerprint and the largest result a handler
//! stores.

/// The largest result a handler stores, in bytes of its JSON text: 1 MiB. A larger one is
/// refused before any SQL with [`StoredResultProblem::TooLarge`](crate::StoredResultProblem::TooLarge).
pub const MAX_STORED_RESULT_BYTES: usize = 1 << 20;

/// A request's fingerprint: the SHA-256 digest of the bytes the caller says identify it
/// (RustCrypto's `sha2`). SHA-256 is a fixed standard (FIPS 180-4): the same bytes give the
/// same 32 bytes in every version of this library, on every platform, so fingerprints
/// stored by one release are compared correctly by the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// The fingerprint of `bytes`: the request body, or a canonical encoding of the fields
    /// that make two requests the same.
    ///
    /// ```
    /// use inbox_diesel::Fingerprint;
    ///
    /// assert_eq!(Fingerprint::of("amount=500"), Fingerprint::of(b"amount=500"));
    /// assert_ne!(Fingerprint::of("amount=500"), Fingerprint::of("amount=501"));
    /// ```
    pub fn of<B: AsRef<[u8]> + ?Sized>(bytes: &B) -> Self {
        use sha2::Digest;
        Fingerprint(sha2::Sha256::digest(bytes.as_ref()).into())
    }

    /// The fingerprint of a request made of parts — an HTTP request's method, path and
    /// query, and body —, each length-prefixed (8 bytes, big-endian) so that no two
    /// requests share their concatenation (`"ab" + "c"` is not `"a" + "bc"`). What
    /// `inbox-axum` takes of a request, for another web framework to take the same.
    ///
    /// ```
    /// use inbox_diesel::Fingerprint;
    ///
    /// let first = Fingerprint::of_parts(["POST", "/payments?account=7", r#"{"amount":500}"#]);
    /// let retry = Fingerprint::of_parts(["POST", "/payments?account=7", r#"{"amount":500}"#]);
    /// assert_eq!(first, retry);
    /// assert_ne!(Fingerprint::of_parts(["ab", "c"]), Fingerprint::of_parts(["a", "bc"]));
    /// ```
    pub fn of_parts<I, B>(parts: I) -> Self
    where
        I: IntoIterator<Item = B>,
        B: AsRef<[u8]>,
    {
        use sha2::Digest;
        let mut digest = sha2::Sha256::new();
        for part in parts {
            let part = part.as_ref();
            digest.update((part.len() as u64).to_be_bytes());
            digest.update(part);
        }
        Fingerprint(digest.finalize().into())
    }

    /// Its 32 bytes, as stored.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}
