//! Protocol-neutral conversation types: what a chat request says, before any protocol's wire format or any model's
//! template.
//!
//! API adapters (OpenAI, Responses, Anthropic) convert their requests into a [`Conversation`]; the template renderer
//! takes it as JSON values in the shape Hugging Face chat templates expect (OpenAI-style messages, see
//! [`Message::to_template_value`]). The serde forms of these types are that same OpenAI-style JSON, so fixtures and
//! tests can be written in it.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
    /// The result of a tool call.
    Tool,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

/// A message's content: plain text or a list of parts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// One part of a multi-part content. Only text is supported; other part types fail to deserialize.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentPart {
    Text { text: String },
}

impl Content {
    /// The content as one string: text parts joined by `"\n"`, as vLLM does for templates that expect a string.
    pub fn to_text(&self) -> String {
        match self {
            Content::Text(text) => text.clone(),
            Content::Parts(parts) => {
                parts.iter().map(|ContentPart::Text { text }| text.as_str()).collect::<Vec<_>>().join("\n")
            }
        }
    }
}

impl From<&str> for Content {
    fn from(text: &str) -> Self {
        Content::Text(text.to_owned())
    }
}

impl From<String> for Content {
    fn from(text: String) -> Self {
        Content::Text(text)
    }
}

/// A function call the assistant made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(from = "WireToolCall", into = "WireToolCall")]
pub struct ToolCall {
    pub id: Option<String>,
    pub name: String,
    /// The arguments: a JSON object, or a JSON string as OpenAI clients send it (parsed before rendering when it
    /// is valid JSON).
    pub arguments: Value,
}

/// OpenAI's shape of a tool call: `{"id", "type": "function", "function": {"name", "arguments"}}`.
#[derive(Serialize, Deserialize)]
struct WireToolCall {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    id: Option<String>,
    #[serde(rename = "type", default = "function_type")]
    kind: String,
    function: WireFunctionCall,
}

#[derive(Serialize, Deserialize)]
struct WireFunctionCall {
    name: String,
    #[serde(default)]
    arguments: Value,
}

fn function_type() -> String {
    "function".into()
}

impl From<WireToolCall> for ToolCall {
    fn from(w: WireToolCall) -> Self {
        ToolCall { id: w.id, name: w.function.name, arguments: w.function.arguments }
    }
}

impl From<ToolCall> for WireToolCall {
    fn from(c: ToolCall) -> Self {
        WireToolCall {
            id: c.id,
            kind: function_type(),
            function: WireFunctionCall { name: c.name, arguments: c.arguments },
        }
    }
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    /// `None` for an assistant message that only calls tools.
    #[serde(default)]
    pub content: Option<Content>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// For a tool result: the id of the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// For a tool result: the function's name; for other roles, the author's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// For an assistant message: the reasoning that came before it (thinking models' templates show it as
    /// `reasoning_content`; other templates ignore it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

impl Message {
    pub fn new(role: Role, content: impl Into<Content>) -> Self {
        Message {
            role,
            content: Some(content.into()),
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
            reasoning_content: None,
        }
    }

    pub fn system(content: impl Into<Content>) -> Self {
        Self::new(Role::System, content)
    }

    pub fn user(content: impl Into<Content>) -> Self {
        Self::new(Role::User, content)
    }

    pub fn assistant(content: impl Into<Content>) -> Self {
        Self::new(Role::Assistant, content)
    }

    /// An assistant message calling tools, with optional text before the calls.
    pub fn assistant_tool_calls(content: Option<String>, tool_calls: Vec<ToolCall>) -> Self {
        Message {
            role: Role::Assistant,
            content: content.map(Content::Text),
            tool_calls,
            tool_call_id: None,
            name: None,
            reasoning_content: None,
        }
    }

    /// A tool result answering call `tool_call_id`.
    pub fn tool_result(tool_call_id: impl Into<String>, content: impl Into<Content>) -> Self {
        Message { tool_call_id: Some(tool_call_id.into()), ..Self::new(Role::Tool, content) }
    }

    /// The message as chat templates see it: `{"role", "content", "tool_calls"?, "tool_call_id"?, "name"?,
    /// "reasoning_content"?}`, content flattened to a string (`null` when absent), tool calls in OpenAI's shape.
    pub fn to_template_value(&self) -> Value {
        let mut m = Map::new();
        m.insert("role".into(), Value::from(self.role.as_str()));
        m.insert("content".into(), self.content.as_ref().map_or(Value::Null, |c| Value::from(c.to_text())));
        if !self.tool_calls.is_empty() {
            let calls = self
                .tool_calls
                .iter()
                .map(|c| {
                    let mut call = Map::new();
                    if let Some(id) = &c.id {
                        call.insert("id".into(), Value::from(id.as_str()));
                    }
                    call.insert("type".into(), Value::from("function"));
                    call.insert("function".into(), json!({"name": c.name, "arguments": c.arguments}));
                    Value::Object(call)
                })
                .collect();
            m.insert("tool_calls".into(), Value::Array(calls));
        }
        if let Some(id) = &self.tool_call_id {
            m.insert("tool_call_id".into(), Value::from(id.as_str()));
        }
        if let Some(name) = &self.name {
            m.insert("name".into(), Value::from(name.as_str()));
        }
        if let Some(reasoning) = &self.reasoning_content {
            m.insert("reasoning_content".into(), Value::from(reasoning.as_str()));
        }
        Value::Object(m)
    }
}

/// A function the model may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(from = "WireTool", into = "WireTool")]
pub struct Tool {
    pub name: String,
    pub description: Option<String>,
    /// JSON Schema of the arguments; its key order is kept into the prompt.
    pub parameters: Value,
}

/// OpenAI's shape of a tool: `{"type": "function", "function": {"name", "description"?, "parameters"}}`.
#[derive(Serialize, Deserialize)]
struct WireTool {
    #[serde(rename = "type", default = "function_type")]
    kind: String,
    function: WireFunction,
}

#[derive(Serialize, Deserialize)]
struct WireFunction {
    name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    description: Option<String>,
    #[serde(default = "empty_object")]
    parameters: Value,
}

fn empty_object() -> Value {
    Value::Object(Map::new())
}

impl From<WireTool> for Tool {
    fn from(w: WireTool) -> Self {
        Tool { name: w.function.name, description: w.function.description, parameters: w.function.parameters }
    }
}

impl From<Tool> for WireTool {
    fn from(t: Tool) -> Self {
        WireTool {
            kind: function_type(),
            function: WireFunction { name: t.name, description: t.description, parameters: t.parameters },
        }
    }
}

impl Tool {
    /// The tool as chat templates see it: `{"type": "function", "function": {"name", "description", "parameters"}}`.
    pub fn to_template_value(&self) -> Value {
        let mut function = Map::new();
        function.insert("name".into(), Value::from(self.name.as_str()));
        if let Some(description) = &self.description {
            function.insert("description".into(), Value::from(description.as_str()));
        }
        function.insert("parameters".into(), self.parameters.clone());
        let mut tool = Map::new();
        tool.insert("type".into(), Value::from("function"));
        tool.insert("function".into(), Value::Object(function));
        Value::Object(tool)
    }
}

/// A whole chat: the messages so far and the tools on offer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Conversation {
    pub messages: Vec<Message>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<Tool>,
}
