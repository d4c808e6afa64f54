//! Anthropic Messages on the wire: the request as Claude Code and the SDKs send it and the response shapes they
//! expect. Plain serde types; checking and conversion are in `convert.rs`.
//!
//! `system`, `content`, `tool_choice` and `thinking` vary in shape and stay JSON values for `convert.rs` to check with
//! precise messages. Unknown fields (`metadata`, `context_management`, `output_config`, `safeguards`, ...) are
//! ignored.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `POST /v1/messages` (and, without `max_tokens`, `/v1/messages/count_tokens`).
#[derive(Debug, Clone, Deserialize)]
pub struct MessagesRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub messages: Vec<Message>,
    #[serde(default)]
    pub system: Option<Value>,
    #[serde(default)]
    pub max_tokens: Option<u64>,
    #[serde(default)]
    pub stop_sequences: Option<Vec<String>>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub top_p: Option<f32>,
    #[serde(default)]
    pub top_k: Option<u64>,
    #[serde(default)]
    pub tools: Option<Vec<Tool>>,
    #[serde(default)]
    pub tool_choice: Option<Value>,
    /// `{"type": "enabled", "budget_tokens": N}`, `{"type": "adaptive"}` or `{"type": "disabled"}`.
    #[serde(default)]
    pub thinking: Option<Value>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Message {
    pub role: Role,
    pub content: Value,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    User,
    Assistant,
    /// Not in Anthropic's API, but Claude Code sends system turns mid-conversation.
    System,
}

/// A client tool (`input_schema`) or a server tool (`type` such as `web_search_20250305`, which is ignored).
#[derive(Debug, Clone, Deserialize)]
pub struct Tool {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub input_schema: Option<Value>,
    /// Claude Code marks tools to be loaded later; they are not shown to the model.
    #[serde(default)]
    pub defer_loading: Option<bool>,
}

/// A non-streaming reply, also the `message` of `message_start`.
#[derive(Debug, Clone, Serialize)]
pub struct MessageResponse {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub role: &'static str,
    pub model: String,
    pub content: Vec<ContentBlock>,
    pub stop_reason: Option<&'static str>,
    pub stop_sequence: Option<String>,
    pub usage: Usage,
}

#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock {
    /// A thinking model's reasoning; `signature` is opaque (this server does not check the ones sent back).
    Thinking {
        thinking: String,
        signature: String,
    },
    Text {
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
        input: Value,
    },
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Usage {
    pub input_tokens: usize,
    pub output_tokens: usize,
    pub cache_creation_input_tokens: usize,
    pub cache_read_input_tokens: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct CountTokens {
    pub input_tokens: usize,
}
