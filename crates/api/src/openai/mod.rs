//! The OpenAI adapter: `POST /v1/chat/completions` and `GET /v1/models[/{id}]`.
//!
//! `wire` holds the JSON shapes, `convert` checks requests and maps them to and from the neutral
//! [`ChatTurn`](crate::generate::ChatTurn), `stream` writes the event stream, `error` renders errors. Handlers only
//! wire these together.

pub mod convert;
pub mod error;
pub mod stream;
pub mod wire;

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};

use crate::error::parse_json;
use crate::generate::{self, random_id};
use crate::{AppState, body_error};
pub use error::OpenAiError;

/// Sent as `system_fingerprint`.
pub const SYSTEM_FINGERPRINT: &str = concat!("splash-", env!("CARGO_PKG_VERSION"));

pub async fn chat_completions(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, OpenAiError> {
    let body = body.map_err(body_error)?;
    let request: wire::ChatRequest = parse_json(&body)?;
    let streaming = request.stream.unwrap_or(false);
    let include_usage = request.stream_options.as_ref().and_then(|o| o.include_usage).unwrap_or(false);
    let num_choices = convert::num_choices(&request)?;
    let turn = convert::to_turn(request, &state.config.default_sampling)?;
    let want_logprobs = turn.sampling.logprobs.is_some();
    // `n` choices are `n` engine requests (seeds `seed + i`), batched like any concurrent requests.
    let mut replies = Vec::with_capacity(num_choices);
    for i in 0..num_choices {
        replies.push(generate::start(&state, convert::choice_turn(&turn, i)).await?);
    }
    let id = random_id("chatcmpl-");
    let created = crate::unix_now();
    let model = state.model_id.clone();
    if streaming {
        let meta = stream::ChunkMeta { id, created, model, include_usage, logprobs: want_logprobs };
        return Ok(stream::sse(replies, meta, state.config.keep_alive).into_response());
    }
    let collected = futures::future::try_join_all(replies.into_iter().map(generate::Reply::collect)).await?;
    Ok(Json(convert::completion(collected, want_logprobs, id, created, model)).into_response())
}

fn model_entry(state: &AppState, id: &str) -> wire::Model {
    let max_context = state.engine.limits().max_context;
    wire::Model {
        id: id.to_owned(),
        object: "model",
        created: state.created_unix,
        owned_by: "splash",
        context_length: max_context,
        max_model_len: max_context,
        kind: "model",
        display_name: id.to_owned(),
        created_at: chrono::DateTime::from_timestamp(state.created_unix as i64, 0)
            .map_or_else(String::new, |t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
    }
}

pub async fn list_models(State(state): State<Arc<AppState>>) -> Json<wire::ModelList> {
    let data: Vec<wire::Model> = state.model_ids().map(|id| model_entry(&state, id)).collect();
    let first_id = data.first().map(|m| m.id.clone());
    let last_id = data.last().map(|m| m.id.clone());
    Json(wire::ModelList { object: "list", data, has_more: false, first_id, last_id })
}

pub async fn get_model(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<wire::Model>, OpenAiError> {
    if !state.model_ids().any(|m| m == id) {
        return Err(crate::error::ApiError::not_found(format!("The model '{id}' does not exist."))
            .with_code("model_not_found")
            .into());
    }
    Ok(Json(model_entry(&state, &id)))
}
