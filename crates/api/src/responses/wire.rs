//! OpenAI Responses on the wire: the create request as Codex and the SDKs send it, and the response object. Input
//! items, tools and `tool_choice` vary in shape and stay JSON values for `convert.rs` to check. Unknown fields
//! (`include`, `prompt_cache_key`, `client_metadata`, ...) are ignored.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `POST /v1/responses`.
#[derive(Debug, Clone, Deserialize)]
pub struct CreateRequest {
    #[serde(default)]
    pub model: Option<String>,
    /// A string (one user message) or an array of items.
    #[serde(default)]
    pub input: Option<Value>,
    #[serde(default)]
    pub instructions: Option<String>,
    #[serde(default)]
    pub tools: Option<Vec<Value>>,
    #[serde(default)]
    pub tool_choice: Option<Value>,
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    #[serde(default)]
    pub max_output_tokens: Option<u64>,
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub top_p: Option<f32>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub store: Option<bool>,
    #[serde(default)]
    pub previous_response_id: Option<String>,
    #[serde(default)]
    pub text: Option<Value>,
    #[serde(default)]
    pub metadata: Option<Value>,
    /// `{"effort": ..., "summary": ...}`: effort `none` turns a thinking model's reasoning off.
    #[serde(default)]
    pub reasoning: Option<Value>,
}

/// The response object (also the `response` of stream events).
#[derive(Debug, Clone, Serialize)]
pub struct Response {
    pub id: String,
    pub object: &'static str,
    pub created_at: u64,
    /// `in_progress`, `completed`, `incomplete` or `failed`.
    pub status: &'static str,
    pub model: String,
    pub output: Vec<Value>,
    pub usage: Option<Usage>,
    pub incomplete_details: Option<Value>,
    pub error: Option<Value>,
    pub instructions: Option<String>,
    pub previous_response_id: Option<String>,
    pub parallel_tool_calls: bool,
    pub tool_choice: Value,
    pub tools: Vec<Value>,
    pub store: bool,
    pub max_output_tokens: Option<u64>,
    pub temperature: f32,
    pub top_p: f32,
    pub text: Value,
    pub metadata: Value,
}

#[derive(Debug, Clone, Serialize)]
pub struct Usage {
    pub input_tokens: usize,
    pub input_tokens_details: Value,
    pub output_tokens: usize,
    pub output_tokens_details: Value,
    pub total_tokens: usize,
}
