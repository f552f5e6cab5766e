//! The extractor: an idempotent request's key, scope, fingerprint and payload.

use axum::extract::{FromRequest, MatchedPath, Request};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, StatusCode};
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

/// What a request's fingerprint reads of its body: the bytes as sent (the default), or the
/// JSON they carry in its canonical form (RFC 8785, the JSON Canonicalization Scheme) — so
/// that a client that retries with the same JSON in another key order or other whitespace
/// (one that builds its body again on each try) is the same request, not 422; as Stripe
/// compares a retry's parameters, not its bytes. Numbers are compared as JSON's doubles: `1`
/// and `1.0` are one, and integers past 2^53 compare by the double they round to. The path
/// and query are read as sent either way.
///
/// The application puts it in the request's extensions, as it does the [`Principal`]; a
/// layer does it for a router or a route:
///
/// ```
/// use axum::{Extension, Router, routing::post};
/// use inbox_axum::Fingerprinting;
///
/// # async fn pay() {}
/// let app: Router = Router::new()
///     .route("/payments", post(pay))
///     .layer(Extension(Fingerprinting::CanonicalJson));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fingerprinting {
    /// The body's bytes as sent.
    #[default]
    AsSent,
    /// The body's JSON in RFC 8785's canonical form; a form body's fields decoded and in
    /// name order (a name's values in the order sent).
    CanonicalJson,
}

/// Who the request is from, as the application's authentication knows it: a tenant, an
/// account, an API client — the scope of its keys, so that a key sent by one principal never
/// answers another's request. An authentication layer puts it in the request's extensions,
/// and [`Idempotent`] refuses a request without one (500 `principal-missing`, logged): a route
/// whose keys every client shares says so with [`Principal::shared`].
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
///     let principal = match tenant.and_then(|t| Principal::new(t).ok()) {
///         Some(tenant) => tenant,
///         // Anonymous requests share one scope: a choice, made here.
///         None => Principal::shared(),
///     };
///     request.extensions_mut().insert(principal);
///     next.run(request).await
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Principal(Scope);

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Scope {
    Named(String),
    Shared,
}

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
        Ok(Principal(Scope::Named(name)))
    }

    /// Every client: the keys of requests under it are scoped by route alone, so two clients
    /// that send the same key with the same request get one answer. For routes without
    /// authentication, or whose keys are drawn so that clients never share one.
    pub fn shared() -> Self {
        Principal(Scope::Shared)
    }

    /// The principal's name; `None` for [`Principal::shared`].
    pub fn name(&self) -> Option<&str> {
        match &self.0 {
            Scope::Named(name) => Some(name),
            Scope::Shared => None,
        }
    }
}

/// A request under an `Idempotency-Key`, with its JSON payload `T`: the extractor of an
/// idempotent route, and what runs its body once ([`Idempotent::run`]).
///
/// Extracting it reads, in this order, and answers with a `problem+json` [`Problem`]
/// at the first that fails:
///
/// 1. the `Idempotency-Key` header: missing → 400 ([`MaybeIdempotent<T>`] for a route where
///    it is optional); empty, over [`MAX_KEY_LEN`], not visible ASCII → 400. The draft's form
///    is a structured-field string, `Idempotency-Key: "8e03978e…"` (parameters after it are
///    ignored); a bare token, as many clients send it, is taken as written.
/// 2. the key's scope: the route (the method and the path pattern it matched, `POST
///    /accounts/{id}/payments`) and the [`Principal`] the application put in the request's
///    extensions (500 without one). The same key on another route or from another principal
///    is another key.
/// 3. the request's fingerprint: SHA-256 of the method, the path and query as sent, and the
///    body's bytes as sent (a client that retries must send the same bytes) — or, with
///    [`Fingerprinting::CanonicalJson`] in the request's extensions, its JSON in canonical
///    form (other key order and whitespace are the same request). A second request
///    under the key with another fingerprint is refused with 422 once the first has
///    committed — never processed, never answered with the first's response; while the first
///    is in flight it is answered 409, like any request under that key.
/// 4. the body: `content-type: application/json`, JSON (400), a `T` (422) — or
///    `application/x-www-form-urlencoded`, a form read as a `T` as axum's `Form` reads it
///    (422) — and 415 for any other type. An empty body without a content type reads as JSON
///    `null`: `Idempotent<()>` for a `POST` that carries none. A body the server will not read (over axum's `DefaultBodyLimit`) is
///    refused with its status (413).
///
/// Put it last among the handler's extractors: it reads the body.
#[derive(Debug)]
pub struct Idempotent<T> {
    route: String,
    principal: Principal,
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

    /// The principal the key is scoped by.
    pub fn principal(&self) -> &Principal {
        &self.principal
    }

    /// The request's fingerprint, stored with the key.
    pub fn fingerprint(&self) -> Fingerprint {
        self.fingerprint
    }

    /// The key the inbox stores the request under: the client's key within the principal's
    /// scope, within the route's; one it cannot be, as the error the request is answered by.
    pub(crate) fn message_key(&self) -> Result<MessageKey, crate::Error> {
        match self.principal.name() {
            Some(name) => Scoped(&self.route, Scoped(name, self.key.as_str())).to_message_key(),
            None => Scoped(&self.route, self.key.as_str()).to_message_key(),
        }
        .map_err(|e| crate::Error::Inbox(inbox_diesel::Error::InvalidKey(e)))
    }
}

/// The `Idempotency-Key`, unquoted; `None` when the request has none.
fn key_of(headers: &HeaderMap) -> Result<Option<String>, Problem> {
    key_in(
        headers
            .get_all(IDEMPOTENCY_KEY)
            .iter()
            .map(|v| v.as_bytes()),
    )
}

/// The key in the `Idempotency-Key` header's `values` (every value it was sent with),
/// unquoted; `None` when it has none.
fn key_in<'v>(values: impl IntoIterator<Item = &'v [u8]>) -> Result<Option<String>, Problem> {
    let invalid = |detail: &str| {
        Problem::new(
            StatusCode::BAD_REQUEST,
            "idempotency-key-invalid",
            format!("the Idempotency-Key header {detail}"),
        )
    };
    let mut values = values.into_iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(invalid("is sent more than once"));
    }
    // What `HeaderValue::to_str` takes: visible ASCII, spaces and tabs.
    let value = match value
        .iter()
        .all(|&b| b == b'\t' || (b' '..=b'~').contains(&b))
    {
        true => std::str::from_utf8(value).map_err(|_| invalid("is not visible ASCII"))?,
        false => return Err(invalid("is not visible ASCII")),
    }
    .trim();
    let key = match value.strip_prefix('"') {
        // A structured-field string (RFC 8941 §3.3.3): `\"` and `\\` are its only escapes.
        Some(quoted) => {
            let mut key = String::with_capacity(quoted.len());
            let mut chars = quoted.chars();
            loop {
                match chars.next() {
                    // Parameters after the string (`"k";p=1`) are the field's, not the key's.
                    Some('"') if chars.as_str().is_empty() || chars.as_str().starts_with(';') => {
                        break;
                    }
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
fn fingerprint(method: &str, path_and_query: &str, body: &[u8]) -> Fingerprint {
    Fingerprint::of_parts([method.as_bytes(), path_and_query.as_bytes(), body])
}

/// A form's fields decoded (`+` and `%20` alike), in name order — a name's values in the
/// order sent, which a list field's meaning depends on — and encoded again.
fn canonical_form(text: &[u8]) -> Vec<u8> {
    let mut fields: Vec<(String, String)> = serde_urlencoded::from_bytes(text).unwrap_or_default();
    fields.sort_by(|a, b| a.0.cmp(&b.0));
    serde_urlencoded::to_string(fields)
        .unwrap_or_default()
        .into_bytes()
}

/// The JSON of `text` — which the payload was read from: it parses — in RFC 8785's canonical
/// form ([`Fingerprinting::CanonicalJson`]).
fn canonical(text: &[u8]) -> Result<Vec<u8>, Problem> {
    serde_json::from_slice::<serde_json::Value>(text)
        .and_then(|value| serde_json_canonicalizer::to_vec(&value))
        .map_err(|e| {
            Problem::new(
                StatusCode::BAD_REQUEST,
                "body-malformed",
                format!("the request body: {e}"),
            )
        })
}

/// What a request under an `Idempotency-Key` is, short of its payload.
struct Parts {
    route: String,
    principal: Principal,
    key: String,
    fingerprint: Fingerprint,
}

/// A request as its framework hands it over, its body read.
struct Gathered<'a> {
    method: &'a str,
    /// The route's pattern as the router matched it, or the path as sent.
    pattern: &'a str,
    path_and_query: &'a str,
    content_type: Option<&'a str>,
    fingerprinting: Fingerprinting,
    principal: Option<Principal>,
    body: &'a [u8],
}

/// The request's payload, and the parts of `key` (the request's `Idempotency-Key`, read by
/// the caller) if it has one.
async fn extract<T, S>(
    request: Request,
    state: &S,
    key: Option<String>,
) -> Result<(Option<Parts>, T), Response>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    let principal = request.extensions().get::<Principal>().cloned();
    if key.is_some() && principal.is_none() {
        // Refused before the body is read.
        return Err(principal_missing(request.uri().path()).into_response());
    }
    let pattern = request
        .extensions()
        .get::<MatchedPath>()
        .map(|path| path.as_str().to_owned())
        // Outside a router (a handler served on its own): the path as sent.
        .unwrap_or_else(|| request.uri().path().to_owned());
    let method = request.method().clone();
    let path_and_query = request.uri().path_and_query().map_or_else(
        || request.uri().path().to_owned(),
        |pq| pq.as_str().to_owned(),
    );
    let content_type = request.headers().get(CONTENT_TYPE).cloned();
    let fingerprinting = request
        .extensions()
        .get::<Fingerprinting>()
        .copied()
        .unwrap_or_default();
    let body = Bytes::from_request(request, state)
        .await
        .map_err(|rejection| {
            Problem::new(rejection.status(), "body-unreadable", rejection.body_text())
                .into_response()
        })?;
    let assembled = assemble(
        Gathered {
            method: method.as_str(),
            pattern: &pattern,
            path_and_query: &path_and_query,
            content_type: content_type.as_ref().and_then(|v| v.to_str().ok()),
            fingerprinting,
            principal,
            body: &body,
        },
        key,
    );
    assembled.map_err(IntoResponse::into_response)
}

/// 500 `principal-missing`, logged: a request under a key on a route that does not say whose
/// keys they are.
fn principal_missing(path: &str) -> Problem {
    tracing::error!(
        path,
        "an idempotent request without a Principal in its extensions: insert one in the \
         authentication layer, or Principal::shared() where every client shares the keys"
    );
    inbox_diesel::telemetry::unseen(format_args!(
        "an idempotent request to {path} without a Principal in its extensions: insert one \
         in the authentication layer, or Principal::shared() where every client shares \
         the keys"
    ));
    Problem::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "principal-missing",
        "the server does not say whose keys this route's are; the request did not run",
    )
}

/// The payload of a gathered request, and the parts of `key` if it has one.
fn assemble<T: DeserializeOwned>(
    request: Gathered<'_>,
    key: Option<String>,
) -> Result<(Option<Parts>, T), Problem> {
    let Gathered {
        method,
        pattern,
        path_and_query,
        content_type,
        fingerprinting,
        principal,
        body,
    } = request;
    let principal = match (&key, principal) {
        (Some(_), None) => return Err(principal_missing(pattern)),
        (_, principal) => principal,
    };
    let route = format!("{method} {pattern}");
    let essence = content_type.and_then(|v| v.parse::<mime_type::Essence>().ok());
    let form = essence.as_ref().is_some_and(mime_type::Essence::is_form);
    let is_json = essence.as_ref().is_some_and(mime_type::Essence::is_json);
    let text: &[u8] = match (is_json || form, content_type.is_none() && body.is_empty()) {
        (true, _) => body,
        (false, true) => b"null",
        (false, false) => {
            return Err(Problem::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "body-type-unsupported",
                "the request body must be JSON (`content-type: application/json`) or a form \
                 (`application/x-www-form-urlencoded`)",
            ));
        }
    };
    let payload = if form {
        // What a form cannot be read as is the payload's fault or the encoding's; axum's
        // `Form` answers both 422 as well.
        serde_urlencoded::from_bytes::<T>(text).map_err(|e| {
            Problem::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "body-invalid",
                format!("the request's form: {e}"),
            )
        })?
    } else {
        serde_json::from_slice::<T>(text).map_err(|e| {
            let (status, problem) = match e.classify() {
                serde_json::error::Category::Data => {
                    (StatusCode::UNPROCESSABLE_ENTITY, "body-invalid")
                }
                _ => (StatusCode::BAD_REQUEST, "body-malformed"),
            };
            Problem::new(status, problem, format!("the request body: {e}"))
        })?
    };
    let parts = match (key, principal) {
        (Some(key), Some(principal)) => {
            let fingerprinted = match fingerprinting {
                Fingerprinting::AsSent => fingerprint(method, path_and_query, body),
                Fingerprinting::CanonicalJson if form => {
                    fingerprint(method, path_and_query, &canonical_form(text))
                }
                Fingerprinting::CanonicalJson => {
                    let canonical = canonical(text)?;
                    fingerprint(method, path_and_query, &canonical)
                }
            };
            Some(Parts {
                route,
                principal,
                fingerprint: fingerprinted,
                key,
            })
        }
        _ => None,
    };
    Ok((parts, payload))
}

impl<T> Idempotent<T> {
    fn of(parts: Parts, payload: T) -> Self {
        Idempotent {
            route: parts.route,
            principal: parts.principal,
            key: parts.key,
            fingerprint: parts.fingerprint,
            payload,
        }
    }
}

impl<T, S> FromRequest<S> for Idempotent<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = Response;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        // The key is looked for first: a request without one is answered 400 before its body
        // is read.
        let Some(key) = key_of(request.headers()).map_err(IntoResponse::into_response)? else {
            return Err(missing().into_response());
        };
        match MaybeIdempotent::of(extract(request, state, Some(key)).await?) {
            MaybeIdempotent::Idempotent(request) => Ok(request),
            MaybeIdempotent::Plain(_) => Err(missing().into_response()),
        }
    }
}

/// A request as another web framework hands it over — actix-web, Rocket, warp, poem, a
/// `hyper` service — made into an [`Idempotent`] with every check of the axum extractor:
/// the same key rules, scope, fingerprint, payload formats and refusals. Then
/// [`Idempotent::run`] (or `run_blocking`) answers as under axum, and
/// [`Answer`](crate::Answer) takes the answer apart into the status, headers and body the
/// framework builds its own response from.
///
/// ```
/// use std::sync::LazyLock;
///
/// use diesel::prelude::*;
/// use diesel_async::RunQueryDsl;
/// use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
/// use inbox_axum::http::StatusCode;
/// use inbox_axum::{Answer, Incoming, Principal, Reply};
/// use inbox_diesel::guarded;
/// use inbox_diesel::handler::Handler;
///
/// type Conn = SyncConnectionWrapper<SqliteConnection>;
///
/// diesel::table! {
///     payments (id) {
///         id -> Integer,
///         cents -> BigInt,
///     }
/// }
///
/// #[derive(serde::Deserialize)]
/// struct NewPayment {
///     cents: i64,
/// }
///
/// static PAYMENTS: LazyLock<Handler> =
///     LazyLock::new(|| Handler::new("payments").expect("a valid consumer name"));
///
/// /// What the route gets from its framework: the method, the path and query as sent, the
/// /// values of `Idempotency-Key` and `Content-Type`, who the client is, the body's bytes.
/// /// What it gives back: the parts of its framework's response.
/// async fn create(
///     conn: &mut Conn,
///     method: &str,
///     path_and_query: &str,
///     keys: Vec<&[u8]>,
///     content_type: Option<&str>,
///     principal: Principal,
///     body: &[u8],
/// ) -> Result<Answer, inbox_axum::Error> {
///     let request = Incoming::new(method, "/payments", path_and_query)
///         .idempotency_key(keys)
///         .content_type(content_type)
///         .principal(principal)
///         .idempotent::<NewPayment>(body);
///     let request = match request {
///         Ok(request) => request,
///         // 400, 415, 422: a problem+json answer, before any SQL.
///         Err(refused) => return Answer::of(refused).await.map_err(inbox_axum::Error::internal),
///     };
///     let cents = request.payload.cents;
///     let answer = request
///         .run(conn, &PAYMENTS, guarded!(async |tx: &mut Conn| {
///             let id: i32 = diesel::insert_into(payments::table)
///                 .values(payments::cents.eq(cents))
///                 .returning(payments::id)
///                 .get_result(tx)
///                 .await?;
///             Reply::json(StatusCode::CREATED, &serde_json::json!({ "id": id }))
///         }))
///         .await;
///     Answer::of(answer).await.map_err(inbox_axum::Error::internal)
/// }
/// # fn main() {}
/// ```
///
/// The route is the route's pattern as the framework's router names it (`/payments/{id}`,
/// not `/payments/7`): a key is scoped by the method and the pattern, and the fingerprint
/// reads the path and query as sent. A principal is required once the request has a key, as
/// under axum ([`Principal::shared`] where every client shares the keys). The body is read by
/// the framework first; take it as bytes, before any deserialisation, since the fingerprint
/// reads them as sent. A framework on `http` 0.2 (actix-web 4, Rocket 0.5) builds its
/// response from the answer's `u16` status and its headers' names and bytes.
#[derive(Debug, Clone)]
pub struct Incoming<'a> {
    method: &'a str,
    pattern: &'a str,
    path_and_query: &'a str,
    keys: Vec<&'a [u8]>,
    content_type: Option<&'a str>,
    principal: Option<Principal>,
    fingerprinting: Fingerprinting,
}

impl<'a> Incoming<'a> {
    /// A request to `pattern` (the route as the router names it) with `method`, sent to
    /// `path_and_query`; without a key, a content type or a principal until they are given.
    pub fn new(method: &'a str, pattern: &'a str, path_and_query: &'a str) -> Self {
        Incoming {
            method,
            pattern,
            path_and_query,
            keys: Vec::new(),
            content_type: None,
            principal: None,
            fingerprinting: Fingerprinting::default(),
        }
    }

    /// Every value of the request's `Idempotency-Key` header, as sent: none for a request
    /// without one, more than one is refused (400).
    pub fn idempotency_key(mut self, values: impl IntoIterator<Item = &'a [u8]>) -> Self {
        self.keys = values.into_iter().collect();
        self
    }

    /// The request's `Content-Type`: JSON (`application/json`, `…+json`) or a form
    /// (`application/x-www-form-urlencoded`); a body of another type is refused (415).
    pub fn content_type(mut self, value: Option<&'a str>) -> Self {
        self.content_type = value;
        self
    }

    /// Who the request is from: the scope of its keys.
    pub fn principal(mut self, principal: Principal) -> Self {
        self.principal = Some(principal);
        self
    }

    /// What the fingerprint reads of the body ([`Fingerprinting::AsSent`] unless given).
    pub fn fingerprinting(mut self, fingerprinting: Fingerprinting) -> Self {
        self.fingerprinting = fingerprinting;
        self
    }

    /// The request under its key, its payload read from `body`; or the [`Problem`] that
    /// refuses it (`into_response()` answers it): 400 for a missing or bad key or a malformed body, 415 for a body of
    /// another type, 422 for a payload `T` cannot be, 500 without a principal.
    pub fn idempotent<T: DeserializeOwned>(self, body: &[u8]) -> Result<Idempotent<T>, Problem> {
        let Some(key) = key_in(self.keys.iter().copied())? else {
            return Err(missing());
        };
        match MaybeIdempotent::of(self.assemble(body, Some(key))?) {
            MaybeIdempotent::Idempotent(request) => Ok(request),
            MaybeIdempotent::Plain(_) => Err(missing()),
        }
    }

    /// As [`idempotent`](Self::idempotent), for a route where the key is optional: a
    /// request without one is its payload alone ([`MaybeIdempotent::Plain`]).
    pub fn maybe_idempotent<T: DeserializeOwned>(
        self,
        body: &[u8],
    ) -> Result<MaybeIdempotent<T>, Problem> {
        let key = key_in(self.keys.iter().copied())?;
        Ok(MaybeIdempotent::of(self.assemble(body, key)?))
    }

    fn assemble<T: DeserializeOwned>(
        self,
        body: &[u8],
        key: Option<String>,
    ) -> Result<(Option<Parts>, T), Problem> {
        assemble(
            Gathered {
                method: self.method,
                pattern: self.pattern,
                path_and_query: self.path_and_query,
                content_type: self.content_type,
                fingerprinting: self.fingerprinting,
                principal: self.principal,
                body,
            },
            key,
        )
    }
}

/// The extractor of a route where the `Idempotency-Key` is optional: a request with one is
/// [`Idempotent`], with every check of that extractor; one without is its payload alone,
/// which the handler runs as it would without this crate.
#[derive(Debug)]
pub enum MaybeIdempotent<T> {
    /// The request has an `Idempotency-Key`.
    Idempotent(Idempotent<T>),
    /// The request has none: its payload.
    Plain(T),
}

impl<T> MaybeIdempotent<T> {
    /// A request's payload, under its key's parts if it has them.
    fn of((parts, payload): (Option<Parts>, T)) -> Self {
        match parts {
            Some(parts) => MaybeIdempotent::Idempotent(Idempotent::of(parts, payload)),
            None => MaybeIdempotent::Plain(payload),
        }
    }
}

impl<T, S> FromRequest<S> for MaybeIdempotent<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = Response;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let key = key_of(request.headers()).map_err(IntoResponse::into_response)?;
        Ok(MaybeIdempotent::of(extract(request, state, key).await?))
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

        /// `application/x-www-form-urlencoded`: an HTML form's body, and the body of APIs
        /// in Stripe's style.
        pub fn is_form(&self) -> bool {
            self.0 == "application/x-www-form-urlencoded"
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
    fn a_canonical_form_is_one_for_every_field_order_and_spelling() {
        let one = canonical_form(b"b=2&a=1&a=0&x=milk+and+eggs");
        assert_eq!(one, canonical_form(b"a=1&x=milk%20and%20eggs&a=0&b=2"));
        assert_eq!(one, b"a=1&a=0&b=2&x=milk+and+eggs");
        // A list's order is its meaning.
        assert_ne!(one, canonical_form(b"a=0&a=1&b=2&x=milk+and+eggs"));
    }

    #[test]
    fn canonical_json_is_one_form_for_every_spelling() {
        let one = canonical(br#"{"b": [1, 2.0, "x"], "a": {"d": null, "c": true}}"#).unwrap();
        let other = canonical(b"{\"a\":{\"c\":true,\"d\":null},\n \"b\":[1.0,2,\"x\"]}").unwrap();
        assert_eq!(one, other);
        assert_eq!(one, br#"{"a":{"c":true,"d":null},"b":[1,2,"x"]}"#);
        assert_ne!(
            canonical(br#"{"a": 1}"#).unwrap(),
            canonical(br#"{"a": 2}"#).unwrap()
        );
    }

    #[test]
    fn requests_that_differ_in_method_path_or_body_differ_in_fingerprint() {
        let base = fingerprint("POST", "/payments", b"{\"cents\":500}");
        assert_eq!(base, fingerprint("POST", "/payments", b"{\"cents\":500}"));
        for other in [
            fingerprint("PUT", "/payments", b"{\"cents\":500}"),
            fingerprint("POST", "/payments?x=1", b"{\"cents\":500}"),
            fingerprint("POST", "/payments", b"{\"cents\":501}"),
            // The length prefixes keep the parts apart.
            fingerprint("POST", "/payments{", b"\"cents\":500}"),
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
