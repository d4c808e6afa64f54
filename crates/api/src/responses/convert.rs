//! OpenAI Responses ⇄ the neutral [`ChatTurn`]: `input` as a string or items (message, function_call,
//! function_call_output, custom_tool_call, custom_tool_call_output, reasoning — a reasoning item's `reasoning_text`
//! content goes to the template as the next assistant turn's `reasoning_content`; without content it is dropped),
//! `instructions`, function and custom tools (`namespace` tools flattened into their members; hosted tools such as
//! `web_search` left out), `tool_choice`, `max_output_tokens`, `reasoning.effort`. Output items (`reasoning` with
//! `reasoning_text` for thinking models, `message` with `output_text`, `function_call`, `custom_tool_call`) are built
//! here; a call of a tool declared inside a namespace carries that `namespace`, as clients route calls by both.
//!
//! A custom tool (`{"type": "custom", "name", "description", "format"}`, e.g. Codex's freeform `apply_patch`) takes one
//! string instead of JSON arguments. The model sees it as a function with one string parameter, `input`, whose
//! description carries the format (`text`, or the `lark`/`regex` grammar the string must follow; the grammar is shown,
//! not enforced). A call of it goes back to the client as a `custom_tool_call` whose `input` is that string, and a
//! `custom_tool_call` the client sends back becomes the same function call in the conversation.

use std::collections::{HashMap, HashSet};

use chat::{Conversation, Message, Role, ToolCall};
use engine::SamplingParams;
use serde_json::{Map, Value, json};

use super::wire;
use crate::error::ApiError;
use crate::generate::{ChatTurn, OutputFormat, Thinking, random_id};

/// The conversation items of an `input` (no instructions), appended to `out`.
pub fn input_messages(input: Option<&Value>, out: &mut Vec<Message>) -> Result<(), ApiError> {
    let items = match input {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::String(s)) => {
            out.push(Message::user(s.as_str()));
            return Ok(());
        }
        Some(Value::Array(items)) => items,
        Some(_) => return Err(ApiError::invalid_param("input", "input must be a string or an array of items.")),
    };
    // The reasoning of the assistant turn that comes next.
    let mut reasoning: Option<String> = None;
    for (i, item) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        let kind =
            item.get("type").and_then(Value::as_str).unwrap_or(if item.get("role").is_some() { "message" } else { "" });
        match kind {
            "message" => {
                let role = match item.get("role").and_then(Value::as_str) {
                    Some("user") => Role::User,
                    Some("assistant") => Role::Assistant,
                    Some("system" | "developer") => Role::System,
                    _ => {
                        return Err(ApiError::invalid_param(
                            format!("{at}.role"),
                            "role must be 'user', 'assistant', 'system' or 'developer'.",
                        ));
                    }
                };
                let text = content_text(item.get("content"), &format!("{at}.content"))?;
                let reasoning_content = if role == Role::Assistant { reasoning.take() } else { None };
                out.push(Message { reasoning_content, ..Message::new(role, text) });
            }
            "function_call" | "custom_tool_call" => {
                let name = str_field(item, "name", &at)?;
                let call_id = item.get("call_id").and_then(Value::as_str).map(str::to_owned);
                let arguments = if kind == "custom_tool_call" {
                    // The model saw the custom tool as a function taking `input`.
                    json!({ CUSTOM_INPUT: str_field(item, "input", &at)? })
                } else {
                    match item.get("arguments") {
                        None | Some(Value::Null) => Value::Object(Map::new()),
                        Some(a @ (Value::String(_) | Value::Object(_))) => a.clone(),
                        Some(_) => {
                            return Err(ApiError::invalid_param(
                                format!("{at}.arguments"),
                                "arguments must be a JSON string.",
                            ));
                        }
                    }
                };
                let call = ToolCall { id: call_id, name: name.to_owned(), arguments };
                // Calls in a row belong to one assistant turn.
                match out.last_mut() {
                    Some(m) if m.role == Role::Assistant && !m.tool_calls.is_empty() => {
                        m.tool_calls.push(call);
                        if m.reasoning_content.is_none() {
                            m.reasoning_content = reasoning.take();
                        }
                    }
                    _ => out.push(Message {
                        reasoning_content: reasoning.take(),
                        ..Message::assistant_tool_calls(None, vec![call])
                    }),
                }
            }
            "function_call_output" | "custom_tool_call_output" => {
                let call_id = str_field(item, "call_id", &at)?;
                let output = match item.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    Some(v @ Value::Array(_)) => content_text(Some(v), &format!("{at}.output"))?,
                    None | Some(Value::Null) => String::new(),
                    Some(_) => {
                        return Err(ApiError::invalid_param(
                            format!("{at}.output"),
                            "output must be a string or parts.",
                        ));
                    }
                };
                out.push(Message::tool_result(call_id, output));
            }
            // Reasoning echoed back by clients: its text (when it has any) goes with the assistant turn after it.
            "reasoning" => {
                let text = reasoning_text(item.get("content"), &format!("{at}.content"))?;
                if !text.is_empty() {
                    reasoning = Some(text);
                }
            }
            "" => return Err(ApiError::invalid_param(format!("{at}.type"), "Each input item needs a 'type'.")),
            other => {
                return Err(ApiError::invalid_param(
                    format!("{at}.type"),
                    format!("Input items of type '{other}' are not supported."),
                ));
            }
        }
    }
    Ok(())
}

/// The text of a reasoning item's `content`: `reasoning_text` parts joined by newlines (none: empty).
fn reasoning_text(content: Option<&Value>, param: &str) -> Result<String, ApiError> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::Array(parts)) => {
            let mut texts = Vec::new();
            for (j, p) in parts.iter().enumerate() {
                match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                    (Some("reasoning_text"), Some(t)) => texts.push(t),
                    _ => {
                        return Err(ApiError::invalid_param(
                            format!("{param}[{j}]"),
                            "Reasoning content parts must be {\"type\": \"reasoning_text\", \"text\": ...}.",
                        ));
                    }
                }
            }
            Ok(texts.join("\n"))
        }
        Some(_) => Err(ApiError::invalid_param(param, "A reasoning item's content must be an array of parts.")),
    }
}

fn str_field<'a>(item: &'a Value, key: &str, at: &str) -> Result<&'a str, ApiError> {
    item.get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::invalid_param(format!("{at}.{key}"), format!("'{key}' must be a string.")))
}

/// A message's content: a string or parts (`input_text`, `output_text`, `text`), joined by newlines.
fn content_text(content: Option<&Value>, param: &str) -> Result<String, ApiError> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut texts = Vec::new();
            for (j, p) in parts.iter().enumerate() {
                let kind = p.get("type").and_then(Value::as_str).unwrap_or("");
                match (kind, p.get("text").and_then(Value::as_str)) {
                    ("input_text" | "output_text" | "text", Some(t)) => texts.push(t),
                    ("refusal", _) => {}
                    _ => {
                        return Err(ApiError::invalid_param(
                            format!("{param}[{j}]"),
                            format!("Content parts of type '{kind}' are not supported: this model reads text only."),
                        ));
                    }
                }
            }
            Ok(texts.join("\n"))
        }
        Some(_) => Err(ApiError::invalid_param(param, "content must be a string or an array of parts.")),
    }
}

/// The parameter a custom tool's string goes in when the model sees the tool as a function.
pub const CUSTOM_INPUT: &str = "input";

/// A custom tool as the function the model sees: one required string parameter, [`CUSTOM_INPUT`], described by the
/// tool's `format`.
fn custom_tool(t: &Value, at: &str) -> Result<chat::Tool, ApiError> {
    let name = str_field(t, "name", at)?;
    crate::tools::check_name(name, &format!("{at}.name"))?;
    let input = match t.get("format") {
        None | Some(Value::Null) => "Free-form text.".to_owned(),
        Some(format) => match format.get("type").and_then(Value::as_str) {
            Some("text") => "Free-form text.".to_owned(),
            Some("grammar") => {
                let syntax = match format.get("syntax").and_then(Value::as_str) {
                    Some(s @ ("lark" | "regex")) => s,
                    _ => {
                        return Err(ApiError::invalid_param(
                            format!("{at}.format.syntax"),
                            "A grammar format's syntax must be 'lark' or 'regex'.",
                        ));
                    }
                };
                let definition = str_field(format, "definition", &format!("{at}.format"))?;
                let grammar = if syntax == "lark" { "Lark grammar" } else { "regular expression" };
                format!("Free-form text (not JSON) that matches this {grammar}:\n{definition}")
            }
            _ => {
                return Err(ApiError::invalid_param(
                    format!("{at}.format.type"),
                    "A custom tool's format.type must be 'text' or 'grammar'.",
                ));
            }
        },
    };
    let description = t.get("description").and_then(Value::as_str).map(str::to_owned);
    let parameters = json!({
        "type": "object",
        "properties": {CUSTOM_INPUT: {"type": "string", "description": input}},
        "required": [CUSTOM_INPUT],
    });
    Ok(chat::Tool { name: name.to_owned(), description, parameters })
}

/// Function and custom tools, with `namespace` groups flattened; other tool types are left out.
fn convert_tools(tools: &[Value], param: &str, out: &mut Vec<chat::Tool>) -> Result<(), ApiError> {
    for (i, t) in tools.iter().enumerate() {
        let at = format!("{param}[{i}]");
        match t.get("type").and_then(Value::as_str) {
            Some("function") => {
                let name = str_field(t, "name", &at)?;
                crate::tools::check_name(name, &format!("{at}.name"))?;
                let parameters = match t.get("parameters") {
                    None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
                    Some(p @ Value::Object(_)) => p.clone(),
                    Some(_) => {
                        return Err(ApiError::invalid_param(
                            format!("{at}.parameters"),
                            "parameters must be an object.",
                        ));
                    }
                };
                let description = t.get("description").and_then(Value::as_str).map(str::to_owned);
                out.push(chat::Tool { name: name.to_owned(), description, parameters });
            }
            Some("custom") => out.push(custom_tool(t, &at)?),
            Some("namespace") => {
                let members = t.get("tools").and_then(Value::as_array).map_or(&[][..], Vec::as_slice);
                convert_tools(members, &format!("{at}.tools"), out)?;
            }
            // web_search, image_generation, file_search, ...: hosted tools are not offered.
            _ => {}
        }
    }
    Ok(())
}

/// What the client needs to recognise a call of each declared tool (the model sees every tool flattened, by name
/// alone, as a function).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolIndex {
    /// The namespace of each tool declared only inside a `namespace` tool. A name also declared at the top level, or
    /// in two namespaces, is left out: it cannot be told apart.
    pub namespaces: HashMap<String, String>,
    /// The custom tools: their calls are `custom_tool_call` items.
    pub custom: HashSet<String>,
}

impl ToolIndex {
    pub fn new(tools: &[Value]) -> Self {
        fn declared(t: &Value) -> Option<(&str, bool)> {
            let custom = match t.get("type").and_then(Value::as_str) {
                Some("function") => false,
                Some("custom") => true,
                _ => return None,
            };
            Some((t.get("name").and_then(Value::as_str)?, custom))
        }
        let mut index = ToolIndex::default();
        let mut found: HashMap<String, Option<String>> = HashMap::new();
        for t in tools {
            if let Some((name, custom)) = declared(t) {
                found.insert(name.to_owned(), None);
                if custom {
                    index.custom.insert(name.to_owned());
                }
            } else if t.get("type").and_then(Value::as_str) == Some("namespace")
                && let Some(namespace) = t.get("name").and_then(Value::as_str)
            {
                for member in t.get("tools").and_then(Value::as_array).map_or(&[][..], Vec::as_slice) {
                    if let Some((name, custom)) = declared(member) {
                        found
                            .entry(name.to_owned())
                            .and_modify(|n| *n = None)
                            .or_insert_with(|| Some(namespace.to_owned()));
                        if custom {
                            index.custom.insert(name.to_owned());
                        }
                    }
                }
            }
        }
        index.namespaces = found.into_iter().filter_map(|(name, namespace)| Some((name, namespace?))).collect();
        index
    }
}

/// The string a custom tool gets from the arguments the model wrote (JSON text): their `input` when it is a string,
/// else the arguments as written (the client's tool then reports what is wrong with them).
pub fn custom_input(arguments: &str) -> String {
    fn input_of(v: &Value) -> Option<&str> {
        v.as_object()?.get(CUSTOM_INPUT)?.as_str()
    }
    match serde_json::from_str::<Value>(arguments) {
        Ok(v @ Value::Object(_)) => input_of(&v).map_or_else(|| arguments.to_owned(), str::to_owned),
        // Arguments written as a JSON string: the object inside, or the string itself.
        Ok(Value::String(inner)) => match serde_json::from_str::<Value>(&inner) {
            Ok(v) if input_of(&v).is_some() => input_of(&v).unwrap_or_default().to_owned(),
            _ => inner,
        },
        _ => arguments.to_owned(),
    }
}

/// Checks a request and converts it; `history` is the stored conversation of `previous_response_id`.
pub fn to_turn(
    req: &wire::CreateRequest,
    history: Vec<Message>,
    defaults: &SamplingParams,
) -> Result<ChatTurn, ApiError> {
    let mut messages = Vec::new();
    if let Some(instructions) = req.instructions.as_deref().filter(|s| !s.is_empty()) {
        messages.push(Message::system(instructions));
    }
    messages.extend(history);
    input_messages(req.input.as_ref(), &mut messages)?;
    if messages.is_empty() {
        // Codex's warm-up probe sends `"input": ""`; an empty conversation is one empty user turn.
        messages.push(Message::user(""));
    }
    let mut tools = Vec::new();
    convert_tools(req.tools.as_deref().unwrap_or_default(), "tools", &mut tools)?;
    let mut sampling = defaults.clone();
    if let Some(t) = req.temperature {
        if !(t.is_finite() && (0.0..=2.0).contains(&t)) {
            return Err(ApiError::invalid_param(
                "temperature",
                format!("temperature must be between 0 and 2; got {t}."),
            ));
        }
        sampling.temperature = t;
    }
    if let Some(p) = req.top_p {
        if !(p.is_finite() && (0.0..=1.0).contains(&p)) {
            return Err(ApiError::invalid_param("top_p", format!("top_p must be between 0 and 1; got {p}.")));
        }
        sampling.top_p = p.max(f32::MIN_POSITIVE);
    }
    let output_format = text_format(req.text.as_ref().and_then(|t| t.get("format")))?;
    let thinking = match req.reasoning.as_ref().and_then(|r| r.get("effort")) {
        None | Some(Value::Null) => Thinking::Default,
        Some(Value::String(e)) if e == "none" => Thinking::Off,
        // Any other level (newer ones too: refusing one would break a working client) leaves thinking on.
        Some(Value::String(_)) => Thinking::On,
        Some(_) => {
            return Err(ApiError::invalid_param(
                "reasoning.effort",
                "reasoning.effort must be a string such as 'low'.",
            ));
        }
    };
    let max_tokens = match req.max_output_tokens {
        Some(0) => return Err(ApiError::invalid_param("max_output_tokens", "max_output_tokens must be at least 1.")),
        Some(n) => Some(usize::try_from(n).unwrap_or(usize::MAX)),
        None => None,
    };
    Ok(ChatTurn {
        conversation: Conversation { messages, tools },
        tool_choice: crate::tools::openai_tool_choice(req.tool_choice.as_ref(), crate::tools::OpenAiApi::Responses)?,
        parallel_tool_calls: req.parallel_tool_calls.unwrap_or(true),
        sampling,
        max_tokens,
        stop: Vec::new(),
        output_format,
        thinking,
        template_kwargs: Map::new(),
    })
}

/// `text.format`: `{"type": "text"}`, `{"type": "json_object"}` or `{"type": "json_schema", "name", "schema",
/// "strict"?}` (the schema flat in the format object, as Responses has it).
fn text_format(format: Option<&Value>) -> Result<OutputFormat, ApiError> {
    let Some(format) = format.filter(|f| !f.is_null()) else { return Ok(OutputFormat::Text) };
    match format.get("type").and_then(Value::as_str) {
        None | Some("text") => Ok(OutputFormat::Text),
        Some("json_object") => Ok(OutputFormat::JsonObject),
        Some("json_schema") => match format.get("schema") {
            Some(s) if s.is_object() => Ok(OutputFormat::JsonSchema(s.clone())),
            _ => Err(ApiError::invalid_param("text.format.schema", "A json_schema format needs a 'schema' object.")),
        },
        Some(_) => Err(ApiError::invalid_param(
            "text.format.type",
            "text.format.type must be 'text', 'json_schema' or 'json_object'.",
        )),
    }
}

/// An assistant `message` output item.
pub fn message_item(id: &str, text: &str, status: &str) -> Value {
    let content = if status == "in_progress" {
        json!([])
    } else {
        json!([{"type": "output_text", "text": text, "annotations": [], "logprobs": []}])
    };
    json!({"type": "message", "id": id, "status": status, "role": "assistant", "content": content})
}

/// The output item of a tool call: a `custom_tool_call` (its `input` from [`custom_input`]) for a custom tool, else a
/// `function_call`; a tool declared in a namespace adds its `namespace`. `arguments` is the JSON text the model wrote.
pub fn call_item(id: &str, call_id: &str, name: &str, arguments: &str, status: &str, tools: &ToolIndex) -> Value {
    let mut item = if tools.custom.contains(name) {
        let input = if arguments.is_empty() { String::new() } else { custom_input(arguments) };
        json!({"type": "custom_tool_call", "id": id, "call_id": call_id, "name": name, "input": input, "status": status})
    } else {
        json!({"type": "function_call", "id": id, "call_id": call_id, "name": name, "arguments": arguments, "status": status})
    };
    if let Some(namespace) = tools.namespaces.get(name) {
        item["namespace"] = Value::from(namespace.as_str());
    }
    item
}

/// A `reasoning` output item: no summary, the reasoning as one `reasoning_text` part (none while in progress).
pub fn reasoning_item(id: &str, text: &str, status: &str) -> Value {
    let content = if status == "in_progress" { json!([]) } else { json!([{"type": "reasoning_text", "text": text}]) };
    json!({"type": "reasoning", "id": id, "summary": [], "content": content, "status": status})
}

/// The output items of a reply, and the same as conversation messages (for `previous_response_id`).
pub fn output_items(reasoning: &str, text: &str, calls: &[ToolCall], tools: &ToolIndex) -> (Vec<Value>, Vec<Message>) {
    let mut items = Vec::new();
    if !reasoning.is_empty() {
        items.push(reasoning_item(&random_id("rs_"), reasoning, "completed"));
    }
    // A reply cut off while thinking is only its reasoning item, as streamed.
    if !text.is_empty() || (calls.is_empty() && items.is_empty()) {
        items.push(message_item(&random_id("msg_"), text, "completed"));
    }
    let mut history_calls = Vec::new();
    for c in calls {
        let call_id = random_id("call_");
        let arguments = c.arguments.to_string();
        let prefix = if tools.custom.contains(&c.name) { "ctc_" } else { "fc_" };
        items.push(call_item(&random_id(prefix), &call_id, &c.name, &arguments, "completed", tools));
        history_calls.push(ToolCall { id: Some(call_id), ..c.clone() });
    }
    let mut message = if history_calls.is_empty() {
        Message::assistant(text)
    } else {
        Message::assistant_tool_calls((!text.is_empty()).then(|| text.to_owned()), history_calls)
    };
    message.reasoning_content = (!reasoning.is_empty()).then(|| reasoning.to_owned());
    (items, vec![message])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::parse_json;
    use crate::generate::ToolChoice;

    fn turn(body: Value) -> Result<ChatTurn, ApiError> {
        let req: wire::CreateRequest = parse_json(body.to_string().as_bytes())?;
        to_turn(&req, Vec::new(), &SamplingParams::default())
    }

    #[test]
    fn codex_request_converts() {
        let t = turn(json!({
            "model": "m", "stream": true, "store": false, "parallel_tool_calls": true,
            "input": [
                {"type": "message", "id": "msg_1", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "<env>"}, {"type": "input_text", "text": "write a file"}]},
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {"type": "function_call", "status": "completed", "id": "fc_1", "name": "exec_command", "arguments": "{\"cmd\": \"ls\"}", "call_id": "call_1"},
                {"type": "function_call", "id": "fc_2", "name": "exec_command", "arguments": "{\"cmd\": \"pwd\"}", "call_id": "call_2"},
                {"type": "function_call_output", "id": "fco_1", "call_id": "call_1", "output": "a.txt"},
                {"type": "function_call_output", "call_id": "call_2", "output": "/tmp"}
            ],
            "tools": [
                {"type": "function", "name": "exec_command", "description": "Runs a command", "strict": false, "parameters": {"type": "object"}},
                {"type": "namespace", "name": "multi_agent_v1", "tools": [{"type": "function", "name": "close_agent", "parameters": {}}]},
                {"type": "web_search", "external_web_access": false}
            ],
            "tool_choice": "auto", "reasoning": {"summary": "auto"}, "include": ["reasoning.encrypted_content"],
            "prompt_cache_key": "s", "client_metadata": {"turn_id": "t"}
        }))
        .unwrap();
        let m = &t.conversation.messages;
        let roles: Vec<Role> = m.iter().map(|m| m.role).collect();
        assert_eq!(roles, [Role::System, Role::User, Role::Assistant, Role::Tool, Role::Tool]);
        assert_eq!(m[2].tool_calls.len(), 2);
        assert_eq!(m[2].reasoning_content, None, "a reasoning item without content adds nothing");
        assert_eq!(m[3].tool_call_id.as_deref(), Some("call_1"));
        let names: Vec<&str> = t.conversation.tools.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["exec_command", "close_agent"]);
    }

    #[test]
    fn reasoning_items_go_with_the_next_assistant_turn() {
        let t = turn(json!({"reasoning": {"effort": "none"}, "input": [
            {"role": "user", "content": "q"},
            {"type": "reasoning", "id": "rs_1", "summary": [],
             "content": [{"type": "reasoning_text", "text": "a"}, {"type": "reasoning_text", "text": "b"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "x"}]},
            {"type": "reasoning", "id": "rs_2", "summary": [], "content": [{"type": "reasoning_text", "text": "c"}]},
            {"type": "function_call", "name": "f", "arguments": "{}", "call_id": "c1"},
            {"type": "function_call_output", "call_id": "c1", "output": "ok"},
            {"type": "reasoning", "id": "rs_3", "summary": [], "content": [{"type": "reasoning_text", "text": "lost"}]},
            {"role": "user", "content": "next"}
        ]}))
        .unwrap();
        let m = &t.conversation.messages;
        let reasoning: Vec<Option<&str>> = m.iter().map(|m| m.reasoning_content.as_deref()).collect();
        assert_eq!(reasoning, [None, Some("a\nb"), Some("c"), None, None]);
        assert_eq!(t.thinking, Thinking::Off);
        let (items, history) = output_items("r", "t", &[], &ToolIndex::default());
        assert_eq!(items[0]["type"], "reasoning");
        assert_eq!(items[0]["content"], json!([{"type": "reasoning_text", "text": "r"}]));
        assert_eq!(items[1]["type"], "message");
        assert_eq!(history[0].reasoning_content.as_deref(), Some("r"));
    }

    #[test]
    fn namespaced_calls_carry_their_namespace() {
        let tools = json!([
            {"type": "function", "name": "exec_command", "parameters": {}},
            {"type": "namespace", "name": "multi_agent_v1", "description": "agents", "tools": [
                {"type": "function", "name": "spawn_agent", "parameters": {}},
                {"type": "function", "name": "exec_command", "parameters": {}}]},
            {"type": "namespace", "name": "a", "tools": [{"type": "function", "name": "twice"}]},
            {"type": "namespace", "name": "b", "tools": [{"type": "function", "name": "twice"}]},
            {"type": "web_search"}
        ]);
        let index = ToolIndex::new(tools.as_array().unwrap());
        // Ambiguous names (top level and namespace, or two namespaces) are left out.
        assert_eq!(index.namespaces, HashMap::from([("spawn_agent".to_owned(), "multi_agent_v1".to_owned())]));
        assert!(index.custom.is_empty());
        let calls = [
            ToolCall { id: None, name: "spawn_agent".into(), arguments: json!({"message": "go"}) },
            ToolCall { id: None, name: "exec_command".into(), arguments: json!({"cmd": "ls"}) },
        ];
        let (items, history) = output_items("", "", &calls, &index);
        assert_eq!(items[0]["namespace"], "multi_agent_v1");
        assert_eq!(items[0]["name"], "spawn_agent");
        assert!(items[1].get("namespace").is_none());
        // The call as the client sends it back (namespace and all) converts to the flattened name the model saw.
        let mut echoed = items[0].clone();
        echoed["call_id"] = json!("call_1");
        let t = turn(json!({"input": [echoed, {"type": "function_call_output", "call_id": "call_1", "output": "ok"}],
                            "tools": tools}))
        .unwrap();
        assert_eq!(t.conversation.messages[0].tool_calls[0].name, "spawn_agent");
        assert_eq!(history[0].tool_calls.len(), 2);
    }

    const LARK: &str = "start: begin_patch hunk+ end_patch\nbegin_patch: \"*** Begin Patch\" LF\n";

    fn apply_patch_tool() -> Value {
        json!({"type": "custom", "name": "apply_patch",
               "description": "The `apply_patch` tool can be used to edit files. This is a FREEFORM tool.",
               "format": {"type": "grammar", "syntax": "lark", "definition": LARK}})
    }

    #[test]
    fn custom_tools_are_functions_of_one_string_for_the_model() {
        let t = turn(json!({"input": "x", "tools": [
            apply_patch_tool(),
            {"type": "custom", "name": "note"},
            {"type": "custom", "name": "digits", "format": {"type": "grammar", "syntax": "regex", "definition": "[0-9]+"}},
            {"type": "custom", "name": "plain", "description": "d", "format": {"type": "text"}}
        ], "tool_choice": {"type": "custom", "name": "apply_patch"}}))
        .unwrap();
        let tools = &t.conversation.tools;
        assert_eq!(tools[0].name, "apply_patch");
        assert_eq!(tools[0].description.as_deref(), apply_patch_tool()["description"].as_str());
        let input = |i: usize| tools[i].parameters["properties"]["input"]["description"].as_str().unwrap().to_owned();
        assert_eq!(
            tools[0].parameters,
            json!({"type": "object", "required": ["input"], "properties": {"input": {"type": "string",
                   "description": format!("Free-form text (not JSON) that matches this Lark grammar:\n{LARK}")}}})
        );
        assert_eq!(input(1), "Free-form text.");
        assert_eq!(input(2), "Free-form text (not JSON) that matches this regular expression:\n[0-9]+");
        assert_eq!(input(3), "Free-form text.");
        assert_eq!(t.tool_choice, ToolChoice::Named("apply_patch".into()));
        let bad = [
            (json!({"type": "custom"}), "tools[0].name"),
            (
                json!({"type": "custom", "name": "a", "format": {"type": "grammar", "syntax": "ebnf", "definition": "x"}}),
                "tools[0].format.syntax",
            ),
            (
                json!({"type": "custom", "name": "a", "format": {"type": "grammar", "syntax": "lark"}}),
                "tools[0].format.definition",
            ),
            (json!({"type": "custom", "name": "a", "format": {"type": "yaml"}}), "tools[0].format.type"),
        ];
        for (tool, param) in bad {
            let e = turn(json!({"input": "x", "tools": [tool]})).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{tool}: {e:?}");
        }
    }

    #[test]
    fn custom_tool_calls_go_out_as_custom_tool_call_items_and_come_back() {
        let patch = "*** Begin Patch\n*** Add File: hello.txt\n+hi\n*** End Patch\n";
        let tools = json!([apply_patch_tool(), {"type": "function", "name": "exec_command", "parameters": {}},
                           {"type": "namespace", "name": "ns", "tools": [{"type": "custom", "name": "inner"}]}]);
        let index = ToolIndex::new(tools.as_array().unwrap());
        assert_eq!(index.custom, HashSet::from(["apply_patch".to_owned(), "inner".to_owned()]));
        let calls = [
            ToolCall { id: None, name: "apply_patch".into(), arguments: json!({"input": patch}) },
            ToolCall { id: None, name: "exec_command".into(), arguments: json!({"cmd": "ls"}) },
            ToolCall { id: None, name: "inner".into(), arguments: json!({"input": "x"}) },
        ];
        let (items, history) = output_items("", "", &calls, &index);
        let call_id = items[0]["call_id"].as_str().unwrap();
        assert_eq!(
            items[0],
            json!({"type": "custom_tool_call", "id": items[0]["id"], "call_id": call_id, "name": "apply_patch",
                   "input": patch, "status": "completed"})
        );
        assert!(items[0]["id"].as_str().unwrap().starts_with("ctc_"));
        assert_eq!(items[1]["type"], "function_call");
        assert_eq!((items[2]["type"].as_str(), items[2]["namespace"].as_str()), (Some("custom_tool_call"), Some("ns")));
        assert_eq!(history[0].tool_calls[0].id.as_deref(), Some(call_id));
        // The client sends the call and its output back: the model sees its own function call again.
        let t = turn(json!({"tools": tools, "input": [
            {"role": "user", "content": "write hello.txt"},
            {"type": "custom_tool_call", "id": "ctc_1", "call_id": "call_1", "name": "apply_patch", "input": patch},
            {"type": "custom_tool_call_output", "call_id": "call_1", "output": "Success. Updated the following files:\nA hello.txt"},
            {"type": "custom_tool_call_output", "call_id": "call_2",
             "output": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]}
        ]}))
        .unwrap();
        let m = &t.conversation.messages;
        assert_eq!(
            m[1].tool_calls,
            vec![ToolCall {
                id: Some("call_1".into()),
                name: "apply_patch".into(),
                arguments: json!({"input": patch})
            }]
        );
        assert_eq!((m[2].role, m[2].tool_call_id.as_deref()), (Role::Tool, Some("call_1")));
        assert_eq!(m[2].content, Some("Success. Updated the following files:\nA hello.txt".into()));
        assert_eq!(m[3].content, Some("a\nb".into()));
        let e =
            turn(json!({"input": [{"type": "custom_tool_call", "call_id": "c", "name": "apply_patch"}]})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("input[0].input"));
    }

    #[test]
    fn custom_input_is_the_input_string_or_the_arguments_as_written() {
        assert_eq!(custom_input(r#"{"input": "a\nb"}"#), "a\nb");
        assert_eq!(custom_input(r#""{\"input\": \"x\"}""#), "x", "arguments sent as a JSON string");
        assert_eq!(custom_input(r#""just text""#), "just text");
        assert_eq!(custom_input(r#"{"patch": "p"}"#), r#"{"patch": "p"}"#);
        assert_eq!(custom_input(r#"{"input": 5}"#), r#"{"input": 5}"#);
        assert_eq!(custom_input("{\"input\": \"cut"), "{\"input\": \"cut");
    }

    #[test]
    fn probe_and_errors() {
        let t = turn(json!({"model": "m", "input": "", "max_output_tokens": 1})).unwrap();
        assert_eq!(t.conversation.messages.len(), 1);
        assert_eq!(t.max_tokens, Some(1));
        let cases = [
            (json!({"input": 5}), "input"),
            (json!({"input": [{"type": "message", "role": "robot", "content": "x"}]}), "input[0].role"),
            (json!({"input": [{"type": "input_image"}]}), "input[0].type"),
            (
                json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
                "input[0].content[0]",
            ),
            (json!({"input": "x", "tool_choice": "maybe"}), "tool_choice"),
            (json!({"input": "x", "max_output_tokens": 0}), "max_output_tokens"),
            (json!({"input": "x", "text": {"format": {"type": "yaml"}}}), "text.format.type"),
        ];
        for (body, param) in cases {
            let e = turn(body.clone()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {e:?}");
        }
    }
}
