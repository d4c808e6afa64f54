//! Anthropic Messages ⇄ the neutral [`ChatTurn`]: system as a string or text blocks (Claude Code's
//! `x-anthropic-billing-header:` block dropped so the prompt prefix stays stable), `role: "system"` turns inside
//! `messages` (those before the first assistant turn moved ahead of the user turns, see [`hoist_opening_system_turns`]),
//! text / tool_use / tool_result / thinking blocks (an assistant turn's thinking goes to the template as its
//! `reasoning_content`; redacted thinking is dropped), tools, `tool_choice` and `thinking`. Every problem is a 400
//! naming the field. Replies put a thinking model's reasoning in a `thinking` block ahead of the others.

use std::collections::HashSet;

use chat::{Conversation, Message, Role, ToolCall};
use engine::SamplingParams;
use serde_json::{Map, Value, json};

use super::wire;
use crate::error::ApiError;
use crate::generate::{ChatTurn, Collected, StopReason, Thinking, ToolChoice, random_id};

/// Prefix of the per-request attribution block Claude Code puts first in `system`.
const BILLING_HEADER: &str = "x-anthropic-billing-header:";
const MAX_STOP_SEQUENCES: usize = 16;
/// The `signature` of the thinking blocks this server writes: there is nothing to sign (and signatures sent back
/// are not checked).
pub const THINKING_SIGNATURE: &str = "splash-unsigned";

pub fn to_turn(req: wire::MessagesRequest, defaults: &SamplingParams) -> Result<ChatTurn, ApiError> {
    let mut messages = Vec::new();
    if let Some(system) = system_text(req.system.as_ref(), "system")?
        && !system.is_empty()
    {
        messages.push(Message::system(system));
    }
    let referenced = referenced_tools(&req.messages);
    for (i, m) in req.messages.into_iter().enumerate() {
        convert_message(i, m, &mut messages)?;
    }
    hoist_opening_system_turns(&mut messages);
    let tools = convert_tools(req.tools.unwrap_or_default(), &referenced)?;
    let (tool_choice, parallel_tool_calls) = convert_tool_choice(req.tool_choice.as_ref())?;
    let mut sampling = defaults.clone();
    if let Some(t) = req.temperature {
        if !(t.is_finite() && (0.0..=1.0).contains(&t)) {
            return Err(ApiError::invalid_param(
                "temperature",
                format!("temperature must be between 0 and 1; got {t}."),
            ));
        }
        sampling.temperature = t;
    }
    if let Some(p) = req.top_p {
        if !(p.is_finite() && p > 0.0 && p <= 1.0) {
            return Err(ApiError::invalid_param("top_p", format!("top_p must be in (0, 1]; got {p}.")));
        }
        sampling.top_p = p;
    }
    if let Some(k) = req.top_k {
        sampling.top_k = usize::try_from(k).unwrap_or(usize::MAX);
    }
    let max_tokens = match req.max_tokens {
        Some(0) => return Err(ApiError::invalid_param("max_tokens", "max_tokens must be at least 1.")),
        Some(n) => Some(usize::try_from(n).unwrap_or(usize::MAX)),
        None => None,
    };
    let stop = req.stop_sequences.unwrap_or_default();
    if stop.len() > MAX_STOP_SEQUENCES {
        return Err(ApiError::invalid_param(
            "stop_sequences",
            format!("At most {MAX_STOP_SEQUENCES} stop sequences are allowed."),
        ));
    }
    Ok(ChatTurn {
        conversation: Conversation { messages, tools },
        tool_choice,
        parallel_tool_calls,
        sampling,
        max_tokens,
        stop: stop.into_iter().filter(|s| !s.is_empty()).collect(),
        output_format: Default::default(),
        thinking: convert_thinking(req.thinking.as_ref())?,
        template_kwargs: Map::new(),
    })
}

/// `thinking`: `disabled` turns a thinking model's reasoning off (where its template can), `enabled` on, any other
/// type (`adaptive`) leaves the template's default. The budget is not enforced (the output limit is).
fn convert_thinking(thinking: Option<&Value>) -> Result<Thinking, ApiError> {
    match thinking {
        None | Some(Value::Null) => Ok(Thinking::Default),
        Some(t) => match t.get("type").and_then(Value::as_str) {
            Some("enabled") => Ok(Thinking::On),
            Some("disabled") => Ok(Thinking::Off),
            // `adaptive`, and types newer than this server (refusing one would break a working client).
            Some(_) => Ok(Thinking::Default),
            None => Err(ApiError::invalid_param("thinking.type", "thinking.type must be a string such as 'enabled'.")),
        },
    }
}

/// Moves the `role: "system"` turns that come before the first assistant turn ahead of the user turns there, keeping
/// the order within each kind.
///
/// Claude Code sends its context block (working directory, platform, OS, skills, today's date: ~2K tokens that are the
/// same on every turn in one project on one day) as a system turn right after the user's first message. Rendered
/// where it stands, it follows the user's prompt, so the prefix cache can never reuse it and every new conversation
/// prefills it again behind a ~10K-token prefix (about 20 s on the 0.5B on 2 cores). Ahead of the user turn it joins
/// the cached system prompt and tools. The model reads the same text, as system context before the request it
/// qualifies instead of after it; nothing is added or dropped, and system turns after the first assistant turn stay
/// where they are (they belong to that point of the conversation).
fn hoist_opening_system_turns(messages: &mut [Message]) {
    let end = messages.iter().position(|m| m.role == Role::Assistant).unwrap_or(messages.len());
    let first_other = messages.iter().position(|m| m.role != Role::System).unwrap_or(messages.len());
    if first_other < end {
        // Stable: system turns keep their order, and so do the user (and tool) turns.
        messages[first_other..end].sort_by_key(|m| m.role != Role::System);
    }
}

/// `system` (or a system turn's content): a string or text blocks, joined by blank lines; billing blocks dropped.
fn system_text(value: Option<&Value>, param: &str) -> Result<Option<String>, ApiError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(if s.starts_with(BILLING_HEADER) { String::new() } else { s.clone() })),
        Some(Value::Array(blocks)) => {
            let mut texts = Vec::new();
            for (j, b) in blocks.iter().enumerate() {
                let text =
                    b.get("text").and_then(Value::as_str).filter(|_| block_type(b) == "text").ok_or_else(|| {
                        ApiError::invalid_param(format!("{param}[{j}]"), "System blocks must be text blocks.")
                    })?;
                if !text.starts_with(BILLING_HEADER) {
                    texts.push(text);
                }
            }
            Ok(Some(texts.join("\n\n")))
        }
        Some(_) => Err(ApiError::invalid_param(param, "system must be a string or an array of text blocks.")),
    }
}

fn block_type(block: &Value) -> &str {
    block.get("type").and_then(Value::as_str).unwrap_or("")
}

/// Names of the tools that `tool_reference` blocks inside tool results point at (Claude Code's ToolSearch answers
/// with them): on Anthropic's API such a block loads the referenced tool's definition, deferred or not.
fn referenced_tools(messages: &[wire::Message]) -> HashSet<String> {
    let mut names = HashSet::new();
    for m in messages {
        for b in m.content.as_array().into_iter().flatten() {
            if block_type(b) != "tool_result" {
                continue;
            }
            for r in b.get("content").and_then(Value::as_array).into_iter().flatten() {
                if block_type(r) == "tool_reference"
                    && let Some(name) = r.get("tool_name").and_then(Value::as_str)
                {
                    names.insert(name.to_owned());
                }
            }
        }
    }
    names
}

/// Text of a `tool_result`'s content: a string, or text and `tool_reference` blocks (a reference reads as the line
/// "Tool loaded: NAME"; the tool's definition joins the prompt's tools, see [`referenced_tools`]).
fn tool_result_text(content: Option<&Value>, param: &str) -> Result<String, ApiError> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(blocks)) => {
            let mut texts = Vec::new();
            for (k, b) in blocks.iter().enumerate() {
                match (block_type(b), b.get("text").and_then(Value::as_str)) {
                    ("text", Some(t)) => texts.push(t.to_owned()),
                    ("tool_reference", _) => {
                        let name = b.get("tool_name").and_then(Value::as_str).ok_or_else(|| {
                            ApiError::invalid_param(
                                format!("{param}[{k}].tool_name"),
                                "A tool_reference block needs a 'tool_name' string.",
                            )
                        })?;
                        texts.push(format!("Tool loaded: {name}"));
                    }
                    (kind, _) => {
                        return Err(ApiError::invalid_param(
                            format!("{param}[{k}]"),
                            format!(
                                "Tool result blocks of type '{kind}' are not supported: this model reads text only."
                            ),
                        ));
                    }
                }
            }
            Ok(texts.join("\n"))
        }
        Some(_) => Err(ApiError::invalid_param(param, "A tool result's content must be a string or text blocks.")),
    }
}

fn convert_message(i: usize, m: wire::Message, out: &mut Vec<Message>) -> Result<(), ApiError> {
    let param = format!("messages[{i}].content");
    if m.role == wire::Role::System {
        out.push(Message::system(system_text(Some(&m.content), &param)?.unwrap_or_default()));
        return Ok(());
    }
    let blocks = match m.content {
        Value::String(s) => vec![json!({"type": "text", "text": s})],
        Value::Array(blocks) => blocks,
        _ => return Err(ApiError::invalid_param(param, "content must be a string or an array of content blocks.")),
    };
    let mut texts: Vec<String> = Vec::new();
    let mut thoughts: Vec<String> = Vec::new();
    let mut calls = Vec::new();
    for (j, b) in blocks.into_iter().enumerate() {
        let at = format!("{param}[{j}]");
        match block_type(&b) {
            "text" => texts.push(
                b.get("text")
                    .and_then(Value::as_str)
                    .ok_or_else(|| {
                        ApiError::invalid_param(format!("{at}.text"), "A text block needs a 'text' string.")
                    })?
                    .to_owned(),
            ),
            "tool_use" if m.role == wire::Role::Assistant => {
                let name = b
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| ApiError::invalid_param(format!("{at}.name"), "A tool_use block needs a 'name'."))?;
                let input = match b.get("input") {
                    None | Some(Value::Null) => Value::Object(Map::new()),
                    Some(v @ Value::Object(_)) => v.clone(),
                    Some(_) => {
                        return Err(ApiError::invalid_param(
                            format!("{at}.input"),
                            "A tool_use input must be an object.",
                        ));
                    }
                };
                let id = b.get("id").and_then(Value::as_str).map(str::to_owned);
                calls.push(ToolCall { id, name: name.to_owned(), arguments: input });
            }
            "tool_result" if m.role == wire::Role::User => {
                let id = b.get("tool_use_id").and_then(Value::as_str).ok_or_else(|| {
                    ApiError::invalid_param(format!("{at}.tool_use_id"), "A tool_result block needs a 'tool_use_id'.")
                })?;
                let mut text = tool_result_text(b.get("content"), &format!("{at}.content"))?;
                if b.get("is_error").and_then(Value::as_bool) == Some(true) {
                    text = format!("Error: {text}");
                }
                out.push(Message::tool_result(id, text));
            }
            "thinking" if m.role == wire::Role::Assistant => match b.get("thinking") {
                Some(Value::String(t)) => thoughts.push(t.clone()),
                None | Some(Value::Null) => {}
                Some(_) => {
                    return Err(ApiError::invalid_param(
                        format!("{at}.thinking"),
                        "A thinking block's 'thinking' must be a string.",
                    ));
                }
            },
            // Encrypted reasoning of another model: nothing to show.
            "redacted_thinking" if m.role == wire::Role::Assistant => {}
            kind @ ("image" | "document" | "search_result") => {
                return Err(ApiError::invalid_param(
                    at,
                    format!("Content blocks of type '{kind}' are not supported: this model reads text only."),
                ));
            }
            kind => {
                let role = if m.role == wire::Role::User { "user" } else { "assistant" };
                return Err(ApiError::invalid_param(
                    format!("{at}.type"),
                    format!("Content blocks of type '{kind}' are not allowed in a {role} message."),
                ));
            }
        }
    }
    let text = texts.join("\n");
    let reasoning_content = Some(thoughts.join("\n")).filter(|t| !t.is_empty());
    match m.role {
        wire::Role::Assistant if !calls.is_empty() => out.push(Message {
            reasoning_content,
            ..Message::assistant_tool_calls((!text.is_empty()).then_some(text), calls)
        }),
        wire::Role::Assistant => out.push(Message { reasoning_content, ..Message::assistant(text) }),
        // A user message holding only tool results adds no empty user turn.
        _ if text.is_empty() && out.last().is_some_and(|m| m.role == Role::Tool) => {}
        _ => out.push(Message::user(text)),
    }
    Ok(())
}

/// Client tools for the prompt; a deferred one (`defer_loading`) only once a `tool_reference` loaded it.
fn convert_tools(tools: Vec<wire::Tool>, referenced: &HashSet<String>) -> Result<Vec<chat::Tool>, ApiError> {
    let mut out = Vec::new();
    for (i, t) in tools.into_iter().enumerate() {
        // Server tools (web search, code execution, ...) carry a versioned type and are not ours to run.
        let loaded = t.name.as_ref().is_some_and(|n| referenced.contains(n));
        if t.kind.as_deref().is_some_and(|k| k != "custom") || (t.defer_loading == Some(true) && !loaded) {
            continue;
        }
        let name = t
            .name
            .filter(|n| !n.is_empty())
            .ok_or_else(|| ApiError::invalid_param(format!("tools[{i}].name"), "A tool needs a non-empty 'name'."))?;
        crate::tools::check_name(&name, &format!("tools[{i}].name"))?;
        let parameters = match t.input_schema {
            None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
            Some(s @ Value::Object(_)) => s,
            Some(_) => {
                return Err(ApiError::invalid_param(
                    format!("tools[{i}].input_schema"),
                    "input_schema must be an object.",
                ));
            }
        };
        out.push(chat::Tool { name, description: t.description, parameters });
    }
    Ok(out)
}

fn convert_tool_choice(choice: Option<&Value>) -> Result<(ToolChoice, bool), ApiError> {
    let Some(Value::Object(o)) = choice else {
        return match choice {
            None | Some(Value::Null) => Ok((ToolChoice::Auto, true)),
            Some(_) => Err(ApiError::invalid_param("tool_choice", "tool_choice must be an object.")),
        };
    };
    let parallel = o.get("disable_parallel_tool_use").and_then(Value::as_bool) != Some(true);
    let choice = match o.get("type").and_then(Value::as_str) {
        Some("auto") => ToolChoice::Auto,
        Some("any") => ToolChoice::Required,
        Some("none") => ToolChoice::None,
        Some("tool") => match o.get("name").and_then(Value::as_str) {
            Some(name) => ToolChoice::Named(name.to_owned()),
            None => return Err(ApiError::invalid_param("tool_choice.name", "tool_choice 'tool' needs a 'name'.")),
        },
        _ => {
            return Err(ApiError::invalid_param(
                "tool_choice.type",
                "tool_choice.type must be 'auto', 'any', 'tool' or 'none'.",
            ));
        }
    };
    Ok((choice, parallel))
}

/// `stop_sequence` when one of the request's stop sequences ended the reply.
pub fn stop_reason(reason: StopReason, matched_stop: Option<&str>) -> &'static str {
    match reason {
        StopReason::EndTurn if matched_stop.is_some() => "stop_sequence",
        StopReason::EndTurn => "end_turn",
        StopReason::Length => "max_tokens",
        StopReason::ToolCalls => "tool_use",
    }
}

/// Anthropic's accounting: `input_tokens` are the prompt tokens computed, `cache_read_input_tokens` those reused
/// from the prefix cache (their sum is the prompt).
pub fn usage(u: &engine::Usage) -> wire::Usage {
    let cached = u.cached_tokens.min(u.prompt_tokens);
    wire::Usage {
        input_tokens: u.prompt_tokens - cached,
        output_tokens: u.completion_tokens,
        cache_read_input_tokens: cached,
        ..Default::default()
    }
}

pub fn tool_use(call: ToolCall) -> wire::ContentBlock {
    wire::ContentBlock::ToolUse { id: random_id("toolu_"), name: call.name, input: call.arguments }
}

pub fn message(reply: Collected, id: String, model: String) -> wire::MessageResponse {
    let mut content = Vec::new();
    if !reply.reasoning.is_empty() {
        content.push(wire::ContentBlock::Thinking {
            thinking: reply.reasoning,
            signature: THINKING_SIGNATURE.to_string(),
        });
    }
    // A reply cut off while thinking is only its thinking block, as streamed.
    if !reply.text.is_empty() || (reply.tool_calls.is_empty() && content.is_empty()) {
        content.push(wire::ContentBlock::Text { text: reply.text });
    }
    content.extend(reply.tool_calls.into_iter().map(tool_use));
    wire::MessageResponse {
        id,
        kind: "message",
        role: "assistant",
        model,
        content,
        stop_reason: Some(stop_reason(reply.reason, reply.matched_stop.as_deref())),
        stop_sequence: reply.matched_stop.filter(|_| reply.reason == StopReason::EndTurn),
        usage: usage(&reply.usage),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_splits_cached_prompt_tokens() {
        let u =
            usage(&engine::Usage { prompt_tokens: 30, cached_tokens: 12, completion_tokens: 5, ..Default::default() });
        assert_eq!((u.input_tokens, u.cache_read_input_tokens, u.output_tokens), (18, 12, 5));
        let o = crate::openai::convert::usage(
            &engine::Usage { prompt_tokens: 30, cached_tokens: 12, ..Default::default() },
            0,
        );
        assert_eq!((o.prompt_tokens, o.prompt_tokens_details.cached_tokens), (30, 12));
        let t = crate::openai::convert::timings(&engine::Usage {
            prompt_tokens: 30,
            cached_tokens: 12,
            ..Default::default()
        });
        assert_eq!((t.cache_n, t.prompt_n), (12, 18));
        assert_eq!(stop_reason(StopReason::EndTurn, Some("END")), "stop_sequence");
        assert_eq!(stop_reason(StopReason::EndTurn, None), "end_turn");
    }
    use crate::error::parse_json;

    fn turn(body: Value) -> Result<ChatTurn, ApiError> {
        to_turn(parse_json(body.to_string().as_bytes())?, &SamplingParams::default())
    }

    /// Two new Claude Code conversations in one project (same system prompt, tools and environment block, different
    /// requests) share every turn before the user's request, so the second one is served from the prefix cache.
    #[test]
    fn claude_code_environment_block_is_part_of_the_shared_prefix() {
        let request = |prompt: &str| {
            turn(json!({
                "model": "m", "max_tokens": 100,
                "system": [{"type": "text", "text": "You are an agent."}],
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "<system-reminder>attribution</system-reminder>"},
                                                 {"type": "text", "text": prompt}]},
                    {"role": "system", "content": [{"type": "text", "text": "# Environment\n - Primary working directory: /p\nToday's date is 2026-11-30."}]}
                ],
                "tools": [{"name": "Bash", "description": "run", "input_schema": {"type": "object"}}]
            }))
            .unwrap()
        };
        let (a, b) = (request("What is 2+3?"), request("Create hello.txt"));
        let (a, b) = (&a.conversation.messages, &b.conversation.messages);
        // The template renders turn by turn, so equal leading turns render to an equal prompt prefix.
        let shared = a.iter().zip(b.iter()).take_while(|(x, y)| x == y).count();
        assert_eq!(shared, 2, "system prompt and environment block shared: {a:?}");
        assert_eq!(
            a[1].content,
            Some(chat::Content::Text(
                "# Environment\n - Primary working directory: /p\nToday's date is 2026-11-30.".into()
            ))
        );
        assert_eq!(a[2].role, Role::User);
        assert_eq!(a.len(), 3);
    }

    /// Claude Code's ToolSearch answers with `tool_reference` blocks (captured from 2.1.332, 07:15 run): the request
    /// carrying them converts, each reads as a line naming the tool, and a deferred tool it names joins the tools.
    #[test]
    fn tool_search_results_with_tool_references_convert() {
        let body = |reference: Value| {
            json!({
                "model": "m", "max_tokens": 100,
                "messages": [
                    {"role": "user", "content": "find the edit tool"},
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "ToolSearch",
                                                        "input": {"query": "select:Edit"}}]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                                  "content": [reference, {"type": "text", "text": "done"}]}]}
                ],
                "tools": [{"name": "ToolSearch", "input_schema": {"type": "object"}},
                          {"name": "Edit", "defer_loading": true, "input_schema": {"type": "object"}},
                          {"name": "NotebookEdit", "defer_loading": true, "input_schema": {"type": "object"}}]
            })
        };
        let t = turn(body(json!({"type": "tool_reference", "tool_name": "Edit"}))).expect("converts");
        let result = t.conversation.messages.last().expect("tool result");
        assert_eq!(result.role, Role::Tool);
        assert_eq!(result.content, Some(chat::Content::Text("Tool loaded: Edit\ndone".into())));
        let names: Vec<&str> = t.conversation.tools.iter().map(|x| x.name.as_str()).collect();
        assert_eq!(names, ["ToolSearch", "Edit"], "the referenced deferred tool is loaded, the other stays out");
        let err = turn(body(json!({"type": "tool_reference"}))).expect_err("no tool_name");
        assert!(format!("{err:?}").contains("tool_name"), "{err:?}");
    }

    #[test]
    fn claude_code_shapes_convert() {
        let t = turn(json!({
            "model": "m", "max_tokens": 32000, "stream": true,
            "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=1;"},
                       {"type": "text", "text": "You are an agent.", "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "<reminder>"}, {"type": "text", "text": "write a file"}]},
                {"role": "system", "content": [{"type": "text", "text": "# Environment"}]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "s"},
                    {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt", "is_error": false,
                     "cache_control": {"type": "ephemeral"}}]},
                {"role": "system", "content": "reminder as a string"}
            ],
            "tools": [{"name": "Bash", "description": "run", "input_schema": {"type": "object"}},
                      {"name": "DeferredToolPlaceholder", "defer_loading": true, "input_schema": {}},
                      {"type": "web_search_20250305", "name": "web_search"}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "thinking": {"type": "adaptive"}, "metadata": {"user_id": "{}"}, "output_config": {"effort": "high"},
            "context_management": {"edits": []}
        }))
        .unwrap();
        let m = &t.conversation.messages;
        let roles: Vec<Role> = m.iter().map(|m| m.role).collect();
        // The opening system turn (the environment block) goes ahead of the user turn; the one after the
        // assistant turn stays put.
        assert_eq!(roles, [Role::System, Role::System, Role::User, Role::Assistant, Role::Tool, Role::System]);
        assert_eq!(m[0].content, Some(chat::Content::Text("You are an agent.".into())));
        assert_eq!(m[1].content, Some(chat::Content::Text("# Environment".into())));
        assert_eq!(m[5].content, Some(chat::Content::Text("reminder as a string".into())));
        assert_eq!(m[2].content, Some(chat::Content::Text("<reminder>\nwrite a file".into())));
        assert_eq!(m[3].tool_calls[0].arguments, json!({"command": "ls"}));
        assert_eq!(m[3].reasoning_content.as_deref(), Some("hmm"));
        assert_eq!(t.thinking, Thinking::Default, "adaptive leaves the template's default");
        assert_eq!(m[4].tool_call_id.as_deref(), Some("toolu_1"));
        assert_eq!(t.conversation.tools.len(), 1);
        assert_eq!((t.tool_choice, t.parallel_tool_calls), (ToolChoice::Required, false));
    }

    #[test]
    fn bad_fields_are_named() {
        let ok = json!([{"role": "user", "content": "x"}]);
        let cases = [
            (json!({"messages": "nope"}), "messages"),
            (json!({"messages": [{"role": "user", "content": 3}]}), "messages[0].content"),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}),
                "messages[0].content[0]",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "tool_use", "name": "x"}]}]}),
                "messages[0].content[0].type",
            ),
            (json!({"messages": ok, "system": 5}), "system"),
            (json!({"messages": ok, "tool_choice": {"type": "sometimes"}}), "tool_choice.type"),
            (json!({"messages": ok, "temperature": 1.5}), "temperature"),
            (json!({"messages": ok, "max_tokens": 0}), "max_tokens"),
            (json!({"messages": ok, "tools": [{"description": "no name"}]}), "tools[0].name"),
        ];
        for (body, param) in cases {
            let e = turn(body.clone()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {e:?}");
        }
    }
}
