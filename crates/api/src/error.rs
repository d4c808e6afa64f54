//! [`ApiError`]: what went wrong with a request, independent of the protocol that reports it.
//!
//! Every handler fails with an `ApiError`; each protocol adapter renders it in its own shape (OpenAI's
//! `{"error": {...}}` in `openai/error.rs`). The status code is decided here, once, from the error's [`ErrorKind`].

use axum::http::StatusCode;
use engine::service::ServiceError;

/// The classes of failure a client can tell apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// 400: the request is malformed or asks for something unsupported.
    InvalidRequest,
    /// 400: the prompt does not fit the context.
    ContextLength,
    /// 401: missing or wrong API key.
    Authentication,
    /// 403: the Host or Origin is not allowed (DNS-rebinding guard).
    Forbidden,
    /// 404: no such route, model or object.
    NotFound,
    /// 405: the route exists, the method does not.
    MethodNotAllowed,
    /// 413: the body is larger than the server accepts.
    PayloadTooLarge,
    /// 415: a POST body that is not declared as JSON.
    UnsupportedMediaType,
    /// 429: the queue is full.
    Overloaded,
    /// 500: a bug or a model failure.
    Internal,
    /// 503: the engine is not running.
    Unavailable,
}

impl ErrorKind {
    pub fn status(self) -> StatusCode {
        match self {
            ErrorKind::InvalidRequest | ErrorKind::ContextLength => StatusCode::BAD_REQUEST,
            ErrorKind::Authentication => StatusCode::UNAUTHORIZED,
            ErrorKind::Forbidden => StatusCode::FORBIDDEN,
            ErrorKind::NotFound => StatusCode::NOT_FOUND,
            ErrorKind::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ErrorKind::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorKind::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ErrorKind::Overloaded => StatusCode::TOO_MANY_REQUESTS,
            ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

/// A failed request: its kind, a message for humans, and what the protocols may add.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub kind: ErrorKind,
    pub message: String,
    /// The request field at fault (`messages[2].content`), when known.
    pub param: Option<String>,
    /// A machine-readable code (`context_length_exceeded`, `invalid_api_key`, ...).
    pub code: Option<&'static str>,
    /// Seconds to wait before retrying (sent as `Retry-After`).
    pub retry_after_s: Option<u64>,
    /// For `ContextLength`: the prompt's tokens and the limit (Anthropic words its message from these).
    pub num_prompt_tokens: Option<(usize, usize)>,
}

impl ApiError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        ApiError {
            kind,
            message: message.into(),
            param: None,
            code: None,
            retry_after_s: None,
            num_prompt_tokens: None,
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidRequest, message)
    }

    /// An invalid value of request field `param`.
    pub fn invalid_param(param: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError { param: Some(param.into()), ..Self::invalid(message) }
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }

    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    pub fn status(&self) -> StatusCode {
        self.kind.status()
    }
}

impl From<ServiceError> for ApiError {
    fn from(e: ServiceError) -> Self {
        match e {
            ServiceError::InvalidRequest(m) => ApiError::invalid(m),
            ServiceError::PromptTooLong { num_tokens, max_context } => ApiError {
                num_prompt_tokens: Some((num_tokens, max_context)),
                ..ApiError::new(
                    ErrorKind::ContextLength,
                    format!(
                        "This model's maximum context length is {max_context} tokens. However, your messages \
                         resulted in {num_tokens} tokens. Please reduce the length of the messages."
                    ),
                )
                .with_code("context_length_exceeded")
            },
            ServiceError::QueueFull { num_waiting, retry_after_s } => ApiError {
                retry_after_s: Some(retry_after_s),
                ..ApiError::new(
                    ErrorKind::Overloaded,
                    format!("The server is busy ({num_waiting} requests waiting); retry in {retry_after_s} s."),
                )
                .with_code("queue_full")
            },
            ServiceError::ShutDown => ApiError {
                retry_after_s: Some(1),
                ..ApiError::new(ErrorKind::Unavailable, "The engine is not running.").with_code("engine_unavailable")
            },
            ServiceError::Cancelled => ApiError {
                retry_after_s: Some(1),
                ..ApiError::new(ErrorKind::Unavailable, "The server is shutting down; the request was cancelled.")
                    .with_code("server_shutting_down")
            },
            ServiceError::Engine(m) => ApiError::internal(format!("The model failed: {m}")),
        }
    }
}

impl From<chat::Error> for ApiError {
    fn from(e: chat::Error) -> Self {
        match e {
            chat::Error::Raised(m) => ApiError::invalid(format!("The chat template rejected the conversation: {m}")),
            chat::Error::BadInput(m) | chat::Error::Render(m) => {
                ApiError::invalid(format!("The conversation could not be rendered with the chat template: {m}"))
            }
            e @ (chat::Error::Syntax(_) | chat::Error::NoTemplate | chat::Error::Gguf(_)) => {
                ApiError::internal(e.to_string())
            }
        }
    }
}

impl From<tokenizer::Error> for ApiError {
    fn from(e: tokenizer::Error) -> Self {
        ApiError::internal(format!("Tokenizing the prompt failed: {e}"))
    }
}

/// Parses a JSON request body into `T`; the error names the field at fault and says what was expected.
pub fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let message = if inner.is_eof() && body.iter().all(u8::is_ascii_whitespace) {
            "The request body is empty; expected a JSON object.".to_string()
        } else if inner.is_syntax() || inner.is_eof() {
            format!("The request body is not valid JSON: {inner}")
        } else if path == "." {
            format!("Invalid request body: {inner}")
        } else {
            format!("Invalid value for '{path}': {inner}")
        };
        ApiError { param: (path != ".").then_some(path), ..ApiError::invalid(message) }
    })?;
    de.end().map_err(|e| ApiError::invalid(format!("The request body is not valid JSON: {e}")))?;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug)]
    #[allow(dead_code)]
    struct Body {
        messages: Vec<Inner>,
    }

    #[derive(serde::Deserialize, Debug)]
    #[allow(dead_code)]
    struct Inner {
        role: String,
    }

    #[test]
    fn json_errors_name_the_field() {
        let e = parse_json::<Body>(br#"{"messages": [{"role": 3}]}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].role"));
        assert!(e.message.contains("invalid type: integer"), "{}", e.message);
        let e = parse_json::<Body>(b"{\"messages\": [").unwrap_err();
        assert!(e.message.contains("not valid JSON"), "{}", e.message);
        let e = parse_json::<Body>(b"").unwrap_err();
        assert!(e.message.contains("empty"), "{}", e.message);
        let e = parse_json::<Body>(b"{\"messages\": []} x").unwrap_err();
        assert!(e.message.contains("not valid JSON"), "{}", e.message);
        let e = parse_json::<Body>(b"{}").unwrap_err();
        assert!(e.message.contains("missing field `messages`"), "{}", e.message);
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
    }
}
