//! The extractor: an idempotent request's key, scope, fingerprint and payload.

use axum::extract::{FromRequest, MatchedPath, OptionalFromRequest, Request};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use inbox_diesel::{Fingerprint, MessageKey, Scoped, ToMessageKey};
use serde::de::DeserializeOwned;

use crate::problem::Problem;

/// The request header that carries the key (IETF httpapi, `draft-ietf-httpapi-idempotency-key-header`).
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The longest `Idempotency-Key` taken, in bytes: 255, Stripe's limit, room for any UUID,
/// ULID or client-built key; a longer one is answered 400 before anything else runs.
pub const MAX_KEY_LEN: usize = 255;

/// Who the request is from, as the application's authentication knows it: a tenant, an
/// account, an API client. An authentication layer puts it in the request's extensions;
/// [`Idempotent`] scopes the key by it, so that a key sent by one principal never answers
/// another's request.
///
/// ```
/// use axum::extract::Request;
/// use axum::middleware::Next;
/// use axum::response::Response;
/// use inbox_axum::Principal;
///
/// async fn authenticate(mut request: Request, next: Next) -> Response {
///     // Whatever the application's authentication decides; a header, here.
///     let tenant = request.headers().get("x-tenant").and_then(|v| v.to_str().ok());
///     if let Some(tenant) = tenant.and_then(|t| Principal::new(t).ok()) {
///         request.extensions_mut().insert(tenant);
///     }
///     next.run(request).await
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Principal(String);

impl Principal {
    /// The principal named `name`.
    ///
    /// # Errors
    /// [`inbox_diesel::KeyError`] for an empty name or one over
    /// [`MessageKey::MAX_LEN`] bytes.
    pub fn new(name: impl Into<String>) -> Result<Self, inbox_diesel::KeyError> {
        let name = name.into();
        // The same rules as the key's scope, checked here rather than on each request.
        MessageKey::text("-")?.scoped(name.as_str())?;
        Ok(Principal(name))
    }

    /// The principal's name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A request under an `Idempotency-Key`, with its JSON payload `T`: the extractor of an
/// idempotent route, and what runs its body once ([`Idempotent::run`]).
///
/// Extracting it reads, in this order, and answers with a `problem+json` [`Problem`]
/// at the first that fails:
///
/// 1. the `Idempotency-Key` header: missing → 400 (`Option<Idempotent<T>>` makes it optional:
///    `None` without the header); empty, over [`MAX_KEY_LEN`], not visible ASCII → 400. The
///    draft's form is a structured-field string, `Idempotency-Key: "8e03978e…"`; a bare token,
///    as many clients send it, is taken as written.
/// 2. the key's scope: the route (the method and the path pattern it matched, `POST
///    /accounts/{id}/payments`) and the [`Principal`] the application put in the request's
///    extensions, if any. The same key on another route or from another principal is
///    another key.
/// 3. the request's fingerprint: SHA-256 of the method, the path and query as sent, and the
///    body's bytes. A second request under the key with another fingerprint is refused with
///    422, never processed and never answered with the first's response.
/// 4. the body: `content-type: application/json` (415 otherwise), JSON (400), a `T` (422).
///
/// Put it last among the handler's extractors: it reads the body.
#[derive(Debug)]
pub struct Idempotent<T> {
    route: String,
    principal: Option<Principal>,
    key: String,
    fingerprint: Fingerprint,
    /// The request's payload.
    pub payload: T,
}

impl<T> Idempotent<T> {
    /// The key as the client sent it (unquoted).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The route the key is scoped by: the method and the matched path pattern.
    pub fn route(&self) -> &str {
        &self.route
    }

    /// The principal the key is scoped by, if the application supplied one.
    pub fn principal(&self) -> Option<&Principal> {
        self.principal.as_ref()
    }

    /// The request's fingerprint, stored with the key.
    pub fn fingerprint(&self) -> Fingerprint {
        self.fingerprint
    }

    /// The key the inbox stores the request under: the client's key within the principal's
    /// scope, within the route's.
    pub(crate) fn message_key(&self) -> Result<MessageKey, inbox_diesel::KeyError> {
        match &self.principal {
            Some(principal) => {
                Scoped(&self.route, Scoped(principal.as_str(), self.key.as_str())).to_message_key()
            }
            None => Scoped(&self.route, self.key.as_str()).to_message_key(),
        }
    }
}

/// The `Idempotency-Key`, unquoted; `None` when the request has none.
fn key_of(headers: &HeaderMap) -> Result<Option<String>, Problem> {
    let invalid = |detail: &str| {
        Problem::new(
            StatusCode::BAD_REQUEST,
            "idempotency-key-invalid",
            format!("the Idempotency-Key header {detail}"),
        )
    };
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(invalid("is sent more than once"));
    }
    let value = value
        .to_str()
        .map_err(|_| invalid("is not visible ASCII"))?
        .trim();
    let key = match value.strip_prefix('"') {
        // A structured-field string (RFC 8941 §3.3.3): `\"` and `\\` are its only escapes.
        Some(quoted) => {
            let mut key = String::with_capacity(quoted.len());
            let mut chars = quoted.chars();
            loop {
                match chars.next() {
                    Some('"') if chars.as_str().is_empty() => break,
                    Some('\\') => match chars.next() {
                        Some(c @ ('"' | '\\')) => key.push(c),
                        _ => return Err(invalid("is a quoted string with a bad escape")),
                    },
                    Some('"') | None => return Err(invalid("is a malformed quoted string")),
                    Some(c) if c.is_ascii_graphic() || c == ' ' => key.push(c),
                    Some(_) => return Err(invalid("is not visible ASCII")),
                }
            }
            key
        }
        None if value.chars().all(|c| c.is_ascii_graphic()) => value.to_owned(),
        None => return Err(invalid("has spaces or control characters outside quotes")),
    };
    if key.is_empty() {
        return Err(invalid("is empty"));
    }
    if key.len() > MAX_KEY_LEN {
        return Err(invalid(&format!(
            "is {} bytes long; the longest taken is {MAX_KEY_LEN}",
            key.len()
        )));
    }
    Ok(Some(key))
}

fn missing() -> Problem {
    Problem::new(
        StatusCode::BAD_REQUEST,
        "idempotency-key-missing",
        "this request needs an Idempotency-Key header: a unique value per request, the same \
         on each retry of it",
    )
}

/// SHA-256 over the method, the path and query as sent, and the body, each length-prefixed
/// so that no two requests share their concatenation.
fn fingerprint(method: &Method, path_and_query: &str, body: &[u8]) -> Fingerprint {
    let mut bytes = Vec::with_capacity(32 + path_and_query.len() + body.len());
    for part in [method.as_str().as_bytes(), path_and_query.as_bytes(), body] {
        bytes.extend_from_slice(&(part.len() as u64).to_be_bytes());
        bytes.extend_from_slice(part);
    }
    Fingerprint::of(&bytes)
}

async fn extract<T, S>(request: Request, state: &S) -> Result<Option<Idempotent<T>>, Response>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    let Some(key) = key_of(request.headers()).map_err(IntoResponse::into_response)? else {
        return Ok(None);
    };
    let matched = request
        .extensions()
        .get::<MatchedPath>()
        .map(|path| path.as_str().to_owned())
        // Outside a router (a handler served on its own): the path as sent.
        .unwrap_or_else(|| request.uri().path().to_owned());
    let route = format!("{} {matched}", request.method());
    let principal = request.extensions().get::<Principal>().cloned();
    let method = request.method().clone();
    let path_and_query = request.uri().path_and_query().map_or_else(
        || request.uri().path().to_owned(),
        |pq| pq.as_str().to_owned(),
    );
    let is_json = request
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<mime_type::Essence>().ok())
        .is_some_and(|essence| essence.is_json());
    let body = Bytes::from_request(request, state)
        .await
        .map_err(IntoResponse::into_response)?;
    if !is_json {
        return Err(Problem::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "body-not-json",
            "the request body must be JSON, sent with `content-type: application/json`",
        )
        .into_response());
    }
    let payload = serde_json::from_slice::<T>(&body).map_err(|e| {
        let (status, problem) = match e.classify() {
            serde_json::error::Category::Data => (StatusCode::UNPROCESSABLE_ENTITY, "body-invalid"),
            _ => (StatusCode::BAD_REQUEST, "body-malformed"),
        };
        Problem::new(status, problem, format!("the request body: {e}")).into_response()
    })?;
    Ok(Some(Idempotent {
        route,
        principal,
        fingerprint: fingerprint(&method, &path_and_query, &body),
        key,
        payload,
    }))
}

impl<T, S> FromRequest<S> for Idempotent<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = Response;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        extract(request, state)
            .await?
            .ok_or_else(|| missing().into_response())
    }
}

impl<T, S> OptionalFromRequest<S> for Idempotent<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = Response;

    async fn from_request(request: Request, state: &S) -> Result<Option<Self>, Self::Rejection> {
        extract(request, state).await
    }
}

/// The media type's essence, `type/subtype` without parameters, as the JSON check needs it.
mod mime_type {
    pub struct Essence(String);

    impl std::str::FromStr for Essence {
        type Err = ();
        fn from_str(value: &str) -> Result<Self, ()> {
            let essence = value.split(';').next().ok_or(())?.trim();
            Ok(Essence(essence.to_ascii_lowercase()))
        }
    }

    impl Essence {
        /// `application/json`, or a `+json` type (`application/merge-patch+json`).
        pub fn is_json(&self) -> bool {
            let (kind, subtype) = self.0.split_once('/').unwrap_or(("", ""));
            kind == "application" && (subtype == "json" || subtype.ends_with("+json"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(values: &[&[u8]]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append(IDEMPOTENCY_KEY, HeaderValue::from_bytes(value).unwrap());
        }
        headers
    }

    #[test]
    fn the_drafts_quoted_form_and_a_bare_token_are_both_keys() {
        let key = |v: &[u8]| key_of(&headers(&[v])).map_err(|p| p.problem());
        assert_eq!(key(b"\"8e03978e-40d5\"").unwrap().unwrap(), "8e03978e-40d5");
        assert_eq!(key(b"8e03978e-40d5").unwrap().unwrap(), "8e03978e-40d5");
        assert_eq!(key(br#""a \"b\" \\ c""#).unwrap().unwrap(), r#"a "b" \ c"#);
        assert_eq!(key_of(&HeaderMap::new()).unwrap(), None);
    }

    #[test]
    fn a_key_that_cannot_be_one_is_refused_before_anything_runs() {
        let long = "k".repeat(MAX_KEY_LEN + 1);
        for value in [
            &b"\"\""[..],
            b"\"unterminated",
            b"\"a\"b\"",
            b"\"bad \\n escape\"",
            b"two words",
            b"caf\xe9",
            long.as_bytes(),
        ] {
            let problem = key_of(&headers(&[value])).unwrap_err();
            assert_eq!(problem.status(), StatusCode::BAD_REQUEST);
            assert_eq!(problem.problem(), "idempotency-key-invalid", "{value:?}");
        }
        let twice = key_of(&headers(&[b"a", b"b"])).unwrap_err();
        assert!(twice.detail().contains("more than once"));
        let longest = "k".repeat(MAX_KEY_LEN);
        assert_eq!(
            key_of(&headers(&[longest.as_bytes()])).unwrap().unwrap(),
            longest
        );
    }

    #[test]
    fn requests_that_differ_in_method_path_or_body_differ_in_fingerprint() {
        let base = fingerprint(&Method::POST, "/payments", b"{\"cents\":500}");
        assert_eq!(
            base,
            fingerprint(&Method::POST, "/payments", b"{\"cents\":500}")
        );
        for other in [
            fingerprint(&Method::PUT, "/payments", b"{\"cents\":500}"),
            fingerprint(&Method::POST, "/payments?x=1", b"{\"cents\":500}"),
            fingerprint(&Method::POST, "/payments", b"{\"cents\":501}"),
            // The length prefixes keep the parts apart.
            fingerprint(&Method::POST, "/payments{", b"\"cents\":500}"),
        ] {
            assert_ne!(base, other);
        }
    }

    #[test]
    fn json_media_types() {
        for (value, json) in [
            ("application/json", true),
            ("application/json; charset=utf-8", true),
            ("Application/JSON", true),
            ("application/merge-patch+json", true),
            ("text/json", false),
            ("application/jsonp", false),
            ("text/plain", false),
        ] {
            assert_eq!(
                value.parse::<mime_type::Essence>().unwrap().is_json(),
                json,
                "{value}"
            );
        }
    }
}
