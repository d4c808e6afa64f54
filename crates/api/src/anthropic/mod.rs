//! The Anthropic adapter: `POST /v1/messages` and `POST /v1/messages/count_tokens` (query strings such as
//! `?beta=true` ignored).
//!
//! `wire` holds the JSON shapes, `convert` checks requests and maps them to and from the neutral
//! [`ChatTurn`](crate::generate::ChatTurn), `stream` writes the event stream, `error` renders errors. It shares
//! nothing with the OpenAI adapter but the neutral request path.

pub mod convert;
pub mod error;
pub mod stream;
pub mod wire;

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::{IntoResponse, Response};

use crate::error::{ApiError, parse_json};
use crate::generate::{self, random_id};
use crate::{AppState, body_error};
pub use error::AnthropicError;

pub async fn messages(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, AnthropicError> {
    let body = body.map_err(body_error)?;
    let request: wire::MessagesRequest = parse_json(&body)?;
    let streaming = request.stream.unwrap_or(false);
    let model = request.model.clone().filter(|m| !m.is_empty()).unwrap_or_else(|| state.model_id.clone());
    let turn = convert::to_turn(request, &state.config.default_sampling)?;
    let reply = generate::start(&state, turn).await?;
    let id = random_id("msg_");
    if streaming {
        let start = wire::MessageResponse {
            id,
            kind: "message",
            role: "assistant",
            model,
            content: Vec::new(),
            stop_reason: None,
            stop_sequence: None,
            usage: convert::usage(&engine::Usage { prompt_tokens: reply.num_prompt_tokens(), ..Default::default() }),
        };
        return Ok(stream::sse(reply, start, state.config.keep_alive).into_response());
    }
    let collected = reply.collect().await?;
    Ok(Json(convert::message(collected, id, model)).into_response())
}

pub async fn count_tokens(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<wire::CountTokens>, AnthropicError> {
    let body = body.map_err(body_error)?;
    let request: wire::MessagesRequest = parse_json(&body)?;
    let turn = convert::to_turn(request, &state.config.default_sampling)?;
    let s = state.clone();
    let prepared = tokio::task::spawn_blocking(move || generate::prepare(&s, turn))
        .await
        .map_err(|e| ApiError::internal(format!("counting tokens failed: {e}")))??;
    Ok(Json(wire::CountTokens { input_tokens: prepared.request.prompt.len() }))
}
