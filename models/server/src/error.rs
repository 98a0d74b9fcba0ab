//! The server's errors: what stops it ([`ServerError`]) and what a request gets back
//! ([`ApiError`], OpenAI's error object with an HTTP status).

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// Why the server could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The model could not be loaded (the loader's own error, for the caller to classify).
    #[error("{0}")]
    Load(Box<dyn std::error::Error + Send + Sync>),
    /// The address could not be bound or served.
    #[error("{what}: {source}")]
    Io {
        /// What was being done (`binding 127.0.0.1:8000`).
        what: String,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The engine's thread ended before the server was ready.
    #[error("the engine thread stopped before the model was loaded")]
    EngineGone,
}

/// An error a request gets back: an HTTP status and OpenAI's error object,
/// `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// OpenAI's `type` (`invalid_request_error`, `rate_limit_error`, `server_error`).
    pub kind: &'static str,
    /// What went wrong, for a person.
    pub message: String,
    /// The request field at fault, if one is.
    pub param: Option<String>,
    /// A machine-readable code (`invalid_api_key`, `context_length_exceeded`, ...).
    pub code: Option<&'static str>,
}

/// Messages echo request text (a stop string, a role); this bounds what one can carry back.
const MAX_MESSAGE_BYTES: usize = 1024;

fn bounded(mut s: String) -> String {
    if s.len() > MAX_MESSAGE_BYTES {
        let mut cut = MAX_MESSAGE_BYTES;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str("...");
    }
    s
}

impl ApiError {
    /// A 400 `invalid_request_error` about `param`.
    pub fn invalid(param: Option<&str>, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            message: bounded(message.into()),
            param: param.map(str::to_string),
            code: None,
        }
    }

    /// A request whose prompt and `max_tokens` do not fit the KV cache.
    pub fn context(message: impl Into<String>) -> ApiError {
        ApiError {
            code: Some("context_length_exceeded"),
            ..ApiError::invalid(Some("max_tokens"), message)
        }
    }

    /// A missing or wrong API key (401).
    pub fn unauthorized() -> ApiError {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            kind: "invalid_request_error",
            message: "missing or incorrect API key: send 'Authorization: Bearer KEY'".into(),
            param: None,
            code: Some("invalid_api_key"),
        }
    }

    /// A full queue (429).
    pub fn busy(depth: usize) -> ApiError {
        ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            kind: "rate_limit_error",
            message: format!(
                "the server is busy: {depth} requests are waiting already; retry later"
            ),
            param: None,
            code: Some("rate_limit_exceeded"),
        }
    }

    /// No such route or model (404).
    pub fn not_found(message: impl Into<String>, code: &'static str) -> ApiError {
        ApiError {
            status: StatusCode::NOT_FOUND,
            kind: "invalid_request_error",
            message: bounded(message.into()),
            param: None,
            code: Some(code),
        }
    }

    /// A failure of the server itself (500), or of its engine (503 when it is gone).
    pub fn server(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            kind: "server_error",
            message: bounded(message.into()),
            param: None,
            code: None,
        }
    }

    /// The error object, as OpenAI writes it.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body())).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_error_object_has_openais_fields() {
        let e = ApiError::context("too long");
        let b = e.body();
        assert_eq!(b["error"]["type"], "invalid_request_error");
        assert_eq!(b["error"]["code"], "context_length_exceeded");
        assert_eq!(b["error"]["param"], "max_tokens");
        assert_eq!(b["error"]["message"], "too long");
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
    }

    #[test]
    fn messages_are_bounded_on_a_char_boundary() {
        let long = "é".repeat(2000);
        let e = ApiError::invalid(None, long);
        assert!(e.message.len() <= MAX_MESSAGE_BYTES + 3);
        assert!(e.message.ends_with("..."));
    }
}
