//! [`ApiError`] in Anthropic's shape: `{"type": "error", "error": {"type", "message"}}`, with the kind's status code
//! and `Retry-After` when the client should come back later. An over-long prompt is worded as Anthropic words it
//! (`prompt is too long: N tokens > M maximum`), which Claude Code reacts to by compacting.

use axum::Json;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::error::{ApiError, ErrorKind};

/// An error that renders in Anthropic's shape.
#[derive(Debug)]
pub struct AnthropicError(pub ApiError);

impl<E: Into<ApiError>> From<E> for AnthropicError {
    fn from(e: E) -> Self {
        AnthropicError(e.into())
    }
}

fn error_type(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::InvalidRequest
        | ErrorKind::ContextLength
        | ErrorKind::MethodNotAllowed
        | ErrorKind::UnsupportedMediaType => "invalid_request_error",
        ErrorKind::Authentication => "authentication_error",
        ErrorKind::Forbidden => "permission_error",
        ErrorKind::NotFound => "not_found_error",
        ErrorKind::PayloadTooLarge => "request_too_large",
        ErrorKind::Overloaded => "rate_limit_error",
        ErrorKind::Internal => "api_error",
        ErrorKind::Unavailable => "overloaded_error",
    }
}

/// The JSON body (also the data of a stream's `error` event).
pub fn body(e: &ApiError) -> Value {
    let message = match e.num_prompt_tokens {
        Some((n, max)) if e.kind == ErrorKind::ContextLength => {
            format!("prompt is too long: {n} tokens > {max} maximum")
        }
        _ => e.message.clone(),
    };
    json!({"type": "error", "error": {"type": error_type(e.kind), "message": message}})
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        let mut response = (self.0.status(), Json(body(&self.0))).into_response();
        if let Some(s) = self.0.retry_after_s {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        response
    }
}
