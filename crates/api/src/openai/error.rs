//! [`ApiError`] in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}` with the kind's status code and
//! `Retry-After` when the client should come back later.

use axum::Json;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::error::{ApiError, ErrorKind};

/// An error that renders in OpenAI's shape.
#[derive(Debug)]
pub struct OpenAiError(pub ApiError);

impl<E: Into<ApiError>> From<E> for OpenAiError {
    fn from(e: E) -> Self {
        OpenAiError(e.into())
    }
}

/// OpenAI's `type` for each kind.
fn error_type(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::InvalidRequest
        | ErrorKind::ContextLength
        | ErrorKind::Authentication
        | ErrorKind::Forbidden
        | ErrorKind::NotFound
        | ErrorKind::MethodNotAllowed
        | ErrorKind::PayloadTooLarge
        | ErrorKind::UnsupportedMediaType => "invalid_request_error",
        ErrorKind::Overloaded => "rate_limit_error",
        ErrorKind::Internal | ErrorKind::Unavailable => "server_error",
    }
}

/// The JSON body (also sent as a stream event when a stream fails).
pub fn body(e: &ApiError) -> Value {
    json!({"error": {"message": e.message, "type": error_type(e.kind), "param": e.param, "code": e.code}})
}

impl IntoResponse for OpenAiError {
    fn into_response(self) -> Response {
        let mut response = (self.0.status(), Json(body(&self.0))).into_response();
        if let Some(s) = self.0.retry_after_s {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        response
    }
}
