//! The OpenAI Responses adapter: `POST /v1/responses`, `GET` and `DELETE /v1/responses/{id}`.
//!
//! `wire` holds the JSON shapes, `convert` checks requests and builds output items, `stream` writes the event stream
//! Codex needs, `store` keeps finished responses for `previous_response_id` and retrieval. Errors use OpenAI's shape.

pub mod convert;
pub mod store;
pub mod stream;
pub mod wire;

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::error::{ApiError, parse_json};
use crate::generate::{self, random_id};
use crate::openai::OpenAiError;
use crate::{AppState, body_error};

/// Usage; `num_reasoning_tokens` of the output tokens were reasoning.
pub fn usage(u: &engine::Usage, num_reasoning_tokens: usize) -> wire::Usage {
    wire::Usage {
        input_tokens: u.prompt_tokens,
        input_tokens_details: json!({"cached_tokens": u.cached_tokens}),
        output_tokens: u.completion_tokens,
        output_tokens_details: json!({"reasoning_tokens": num_reasoning_tokens}),
        total_tokens: u.prompt_tokens + u.completion_tokens,
    }
}

fn not_found(id: &str) -> ApiError {
    ApiError::not_found(format!("No response with id '{id}' is stored (responses are kept in memory only)."))
}

pub async fn create(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, OpenAiError> {
    let body = body.map_err(body_error)?;
    let request: wire::CreateRequest = parse_json(&body)?;
    let history = match request.previous_response_id.as_deref() {
        Some(id) => match state.responses.get(id) {
            Some(stored) => stored.conversation,
            None => return Err(ApiError { param: Some("previous_response_id".into()), ..not_found(id) }.into()),
        },
        None => Vec::new(),
    };
    let turn = convert::to_turn(&request, history, &state.config.default_sampling)?;
    let has_instructions = request.instructions.as_deref().is_some_and(|s| !s.is_empty());
    let conversation = turn.conversation.messages[usize::from(has_instructions)..].to_vec();
    let tools = request.tools.clone().unwrap_or_default();
    let tool_index = convert::ToolIndex::new(&tools);
    let reply = generate::start(&state, turn).await?;
    let response = wire::Response {
        id: random_id("resp_"),
        object: "response",
        created_at: crate::unix_now(),
        status: "in_progress",
        model: request.model.clone().filter(|m| !m.is_empty()).unwrap_or_else(|| state.model_id.clone()),
        output: Vec::new(),
        usage: None,
        incomplete_details: None,
        error: None,
        instructions: request.instructions.clone(),
        previous_response_id: request.previous_response_id.clone(),
        parallel_tool_calls: request.parallel_tool_calls.unwrap_or(true),
        tool_choice: request.tool_choice.clone().unwrap_or_else(|| json!("auto")),
        tools,
        store: request.store.unwrap_or(true),
        max_output_tokens: request.max_output_tokens,
        temperature: request.temperature.unwrap_or(state.config.default_sampling.temperature),
        top_p: request.top_p.unwrap_or(state.config.default_sampling.top_p),
        text: request.text.clone().unwrap_or_else(|| json!({"format": {"type": "text"}})),
        metadata: request.metadata.clone().unwrap_or_else(|| json!({})),
    };
    if request.stream.unwrap_or(false) {
        let keep_alive = state.config.keep_alive;
        let pending = stream::Pending { state, response, conversation, tools: tool_index };
        return Ok(stream::sse(reply, pending, keep_alive).into_response());
    }
    let collected = reply.collect().await?;
    let (output, history) =
        convert::output_items(&collected.reasoning, &collected.text, &collected.tool_calls, &tool_index);
    let mut response = response;
    response.output = output;
    response.usage = Some(usage(&collected.usage, collected.num_reasoning_tokens));
    if collected.reason == generate::StopReason::Length {
        response.status = "incomplete";
        response.incomplete_details = Some(json!({"reason": "max_output_tokens"}));
    } else {
        response.status = "completed";
    }
    let value = serde_json::to_value(&response).map_err(|e| ApiError::internal(e.to_string()))?;
    if response.store {
        let mut conversation = conversation;
        conversation.extend(history);
        state.responses.put(response.id.clone(), value.clone(), conversation);
    }
    Ok(Json(value).into_response())
}

pub async fn retrieve(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Json<Value>, OpenAiError> {
    state.responses.get(&id).map(|s| Json(s.response)).ok_or_else(|| not_found(&id).into())
}

pub async fn delete(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Json<Value>, OpenAiError> {
    if !state.responses.delete(&id) {
        return Err(not_found(&id).into());
    }
    Ok(Json(json!({"id": id, "object": "response", "deleted": true})))
}
