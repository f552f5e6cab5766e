//! The response a handler commits with its work, and the form it is stored in.

use axum::http::header::{CONTENT_TYPE, HeaderName, HeaderValue};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use crate::Error;

/// The response of an idempotent request, stored with its key in the handler's transaction
/// and sent again, as it was, to every retry of the request.
///
/// Its status, its body and the headers the handler marks with [`Reply::header`] are stored,
/// as JSON an operator can read in the inbox table's `result` column:
///
/// ```json
/// {"status":201,"headers":[["location","/payments/7"]],"json":{"id":7,"amount_cents":500}}
/// ```
///
/// Only what the handler puts here is replayed: headers another layer adds (a date, a
/// trace id, CORS) are added to the replay by that layer again, and are not part of the
/// stored answer.
///
/// A JSON body is sent with its objects' keys sorted (as a `serde_json::Value` keeps them), on the
/// first answer and on every replay alike: a replay is the same bytes whatever the `result`
/// column keeps — PostgreSQL's `jsonb` and MySQL's `JSON` store objects in an order of
/// their own, with whitespace of their own. An axum `Json` answer without a key keeps the
/// order its value serializes them in: a client that compares a keyed answer with an
/// unkeyed one by its text sees the keys in another order, the same fields and values.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    status: StatusCode,
    headers: Vec<(HeaderName, HeaderValue)>,
    body: Body,
}

#[derive(Debug, Clone, PartialEq)]
enum Body {
    Empty,
    Json(serde_json::Value),
    Text(String),
}

impl Reply {
    /// A response with `value` as its JSON body (`content-type: application/json`).
    ///
    /// # Errors
    /// [`Error::Internal`] when `value` does not serialize to JSON (a map with non-string
    /// keys, a failing `Serialize` impl).
    pub fn json<T: Serialize + ?Sized>(status: StatusCode, value: &T) -> Result<Self, Error> {
        let value = serde_json::to_value(value).map_err(Error::internal)?;
        Ok(Self {
            status,
            headers: Vec::new(),
            body: Body::Json(value),
        })
    }

    /// A response with a text body (`content-type: text/plain; charset=utf-8`).
    pub fn text(status: StatusCode, text: impl Into<String>) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: Body::Text(text.into()),
        }
    }

    /// A response without a body.
    pub fn empty(status: StatusCode) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: Body::Empty,
        }
    }

    /// The response with `name: value` among its headers — stored, and replayed to retries.
    /// A header of the same name given twice is sent twice; a `content-type` replaces the
    /// body's own. The stored form is text: a value that is not visible ASCII fails the
    /// request (500, nothing committed) when the reply is stored.
    pub fn header(mut self, name: HeaderName, value: HeaderValue) -> Self {
        self.headers.push((name, value));
        self
    }

    /// The response's status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The response's JSON body, if it has one.
    pub fn json_body(&self) -> Option<&serde_json::Value> {
        match &self.body {
            Body::Json(value) => Some(value),
            _ => None,
        }
    }
}

impl IntoResponse for Reply {
    fn into_response(self) -> Response {
        let mut headers = HeaderMap::new();
        let body = match self.body {
            Body::Empty => axum::body::Body::empty(),
            Body::Json(value) => {
                headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                // A `Value` always serializes.
                axum::body::Body::from(serde_json::to_vec(&value).unwrap_or_default())
            }
            Body::Text(text) => {
                headers.insert(
                    CONTENT_TYPE,
                    HeaderValue::from_static("text/plain; charset=utf-8"),
                );
                axum::body::Body::from(text)
            }
        };
        let mut typed = false;
        for (name, value) in self.headers {
            // The handler's own content type replaces the body's default.
            if name == CONTENT_TYPE && !std::mem::replace(&mut typed, true) {
                headers.insert(name, value);
            } else {
                headers.append(name, value);
            }
        }
        (self.status, headers, body).into_response()
    }
}

/// The stored form: names and values as text, the body as JSON or text.
#[derive(Serialize, Deserialize)]
struct Stored {
    status: u16,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    headers: Vec<(String, String)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    json: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    text: Option<String>,
}

impl Serialize for Reply {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let headers = self
            .headers
            .iter()
            .map(|(name, value)| {
                value
                    .to_str()
                    .map(|value| (name.as_str().to_owned(), value.to_owned()))
                    .map_err(|_| {
                        serde::ser::Error::custom(format_args!(
                            "the value of the marked header `{name}` is not visible ASCII"
                        ))
                    })
            })
            .collect::<Result<_, _>>()?;
        let (json, text) = match &self.body {
            Body::Empty => (None, None),
            Body::Json(value) => (Some(value.clone()), None),
            Body::Text(text) => (None, Some(text.clone())),
        };
        Stored {
            status: self.status.as_u16(),
            headers,
            json,
            text,
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Reply {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        let stored = Stored::deserialize(deserializer)?;
        let status = StatusCode::from_u16(stored.status).map_err(D::Error::custom)?;
        let headers = stored
            .headers
            .into_iter()
            .map(|(name, value)| {
                Ok((
                    HeaderName::try_from(name).map_err(D::Error::custom)?,
                    HeaderValue::try_from(value).map_err(D::Error::custom)?,
                ))
            })
            .collect::<Result<_, D::Error>>()?;
        let body = match (stored.json, stored.text) {
            (None, None) => Body::Empty,
            (Some(json), None) => Body::Json(json),
            (None, Some(text)) => Body::Text(text),
            (Some(_), Some(_)) => {
                return Err(D::Error::custom(
                    "a stored reply with both a JSON and a text body",
                ));
            }
        };
        Ok(Reply {
            status,
            headers,
            body,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_reads_back_as_it_was_stored() {
        let reply = Reply::json(StatusCode::CREATED, &serde_json::json!({"id": 7}))
            .unwrap()
            .header(
                HeaderName::from_static("location"),
                HeaderValue::from_static("/payments/7"),
            );
        let stored = serde_json::to_string(&reply).unwrap();
        assert_eq!(
            stored,
            r#"{"status":201,"headers":[["location","/payments/7"]],"json":{"id":7}}"#
        );
        assert_eq!(serde_json::from_str::<Reply>(&stored).unwrap(), reply);
        let text = Reply::text(StatusCode::PAYMENT_REQUIRED, "insufficient funds");
        let stored = serde_json::to_string(&text).unwrap();
        assert_eq!(serde_json::from_str::<Reply>(&stored).unwrap(), text);
        let empty = Reply::empty(StatusCode::NO_CONTENT);
        assert_eq!(serde_json::to_string(&empty).unwrap(), r#"{"status":204}"#);
    }

    #[test]
    fn a_header_value_that_is_not_text_is_refused_when_stored_not_mangled() {
        let reply = Reply::empty(StatusCode::OK).header(
            HeaderName::from_static("x-raw"),
            HeaderValue::from_bytes(b"caf\xe9").unwrap(),
        );
        let error = serde_json::to_string(&reply).unwrap_err().to_string();
        assert!(error.contains("x-raw"), "{error}");
    }

    #[test]
    fn a_tampered_row_is_an_error_not_a_reply() {
        for row in [
            r#"{"status":99}"#,
            r#"{"status":200,"headers":[["bad name","x"]]}"#,
            r#"{"status":200,"json":1,"text":"x"}"#,
        ] {
            assert!(serde_json::from_str::<Reply>(row).is_err(), "{row}");
        }
    }
}
