//! OpenAI Chat Completions ⇄ the neutral [`ChatTurn`]: checks every field of a request (each problem is a 400 that
//! names the field) and turns a finished reply into OpenAI's response shape.

use chat::{Content, Conversation, Message, Role, ToolCall};
use engine::{SamplingParams, Usage};
use serde_json::{Map, Value, json};

use super::wire;
use crate::error::ApiError;
use crate::generate::{ChatTurn, Collected, OutputFormat, StopReason, Thinking, TokenLogprob, random_id};
use crate::tools::OpenAiApi;

/// Most stop strings in one request.
const MAX_STOP_STRINGS: usize = 16;
/// Most choices (`n`) in one request; each is a sequence of its own in the engine.
pub const MAX_CHOICES: u64 = 16;
/// Most `top_logprobs` (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: u64 = 20;

/// The number of choices a request asks for (`n`, default 1).
pub fn num_choices(req: &wire::ChatRequest) -> Result<usize, ApiError> {
    match req.n {
        None => Ok(1),
        Some(n) if (1..=MAX_CHOICES).contains(&n) => Ok(n as usize),
        Some(n) => Err(ApiError::invalid_param("n", format!("n = {n} must be between 1 and {MAX_CHOICES}."))),
    }
}

/// Choice `index` of a turn: the same request, with `seed + index` when a seed is given (so choices differ but
/// each is reproducible).
pub fn choice_turn(turn: &ChatTurn, index: usize) -> ChatTurn {
    let mut t = turn.clone();
    if let Some(seed) = t.sampling.seed {
        t.sampling.seed = Some(seed.wrapping_add(index as u64));
    }
    t
}

/// Checks a request and converts it; `defaults` fills the sampling parameters the request leaves out.
pub fn to_turn(req: wire::ChatRequest, defaults: &SamplingParams) -> Result<ChatTurn, ApiError> {
    num_choices(&req)?;
    let logprobs = match (req.logprobs.unwrap_or(false), req.top_logprobs) {
        (_, Some(n)) if n > MAX_TOP_LOGPROBS => {
            return Err(ApiError::invalid_param(
                "top_logprobs",
                format!("top_logprobs = {n} is more than the maximum of {MAX_TOP_LOGPROBS}."),
            ));
        }
        (false, Some(n)) if n > 0 => {
            return Err(ApiError::invalid_param("top_logprobs", "top_logprobs needs logprobs to be true."));
        }
        (true, n) => Some(n.unwrap_or(0) as usize),
        (false, _) => None,
    };
    if req.logit_bias.as_ref().is_some_and(|m| !m.is_empty()) {
        return Err(ApiError::invalid_param("logit_bias", "logit_bias is not supported."));
    }
    let output_format = match &req.response_format {
        None => OutputFormat::Text,
        Some(f) => match f.kind.as_str() {
            "text" => OutputFormat::Text,
            "json_object" => OutputFormat::JsonObject,
            // `{"json_schema": {"name", "schema", "strict"?}}`; no schema means any JSON.
            "json_schema" => match f.json_schema.as_ref().and_then(|j| j.get("schema")) {
                Some(s) if s.is_object() => OutputFormat::JsonSchema(s.clone()),
                Some(_) => {
                    return Err(ApiError::invalid_param(
                        "response_format.json_schema.schema",
                        "The schema must be a JSON object.",
                    ));
                }
                None => OutputFormat::JsonObject,
            },
            other => {
                return Err(ApiError::invalid_param(
                    "response_format.type",
                    format!("Unknown response_format type '{other}'; expected 'text', 'json_object' or 'json_schema'."),
                ));
            }
        },
    };
    let max_tokens = match req.max_completion_tokens.or(req.max_tokens) {
        Some(0) => return Err(ApiError::invalid_param("max_tokens", "max_tokens must be at least 1.")),
        Some(n) => Some(usize::try_from(n).unwrap_or(usize::MAX)),
        None => None,
    };
    let requested = RequestSampling {
        seed: parse_seed(req.seed.as_ref())?,
        temperature: req.temperature,
        top_p: req.top_p,
        top_k: req.top_k,
        min_p: req.min_p,
        presence_penalty: req.presence_penalty,
        frequency_penalty: req.frequency_penalty,
        repetition_penalty: req.repetition_penalty,
    };
    let tools = convert_tools(req.tools.unwrap_or_default())?;
    let tool_choice = crate::tools::openai_tool_choice(req.tool_choice.as_ref(), OpenAiApi::ChatCompletions)?;
    let messages =
        req.messages.into_iter().enumerate().map(|(i, m)| convert_message(i, m)).collect::<Result<Vec<_>, _>>()?;
    let mut sampling = sampling(&requested, defaults)?;
    sampling.logprobs = logprobs;
    let template_kwargs = req.chat_template_kwargs.unwrap_or_default();
    let thinking = match template_kwargs.get("enable_thinking").and_then(Value::as_bool) {
        Some(false) => Thinking::Off,
        _ => reasoning_effort(req.reasoning_effort.as_deref())?,
    };
    Ok(ChatTurn {
        conversation: Conversation { messages, tools },
        tool_choice,
        parallel_tool_calls: req.parallel_tool_calls.unwrap_or(true),
        sampling,
        max_tokens,
        stop: convert_stop(req.stop.as_ref())?,
        output_format,
        thinking,
        template_kwargs,
    })
}

/// `reasoning_effort`: `none` turns thinking off; any other level leaves it on (the model decides how long), including
/// levels newer than this server: clients add them, and refusing one would break a working agent.
fn reasoning_effort(effort: Option<&str>) -> Result<Thinking, ApiError> {
    Ok(match effort {
        None => Thinking::Default,
        Some("none") => Thinking::Off,
        Some(_) => Thinking::On,
    })
}

/// The sampling fields of a request, as given.
#[derive(Debug, Default)]
struct RequestSampling {
    seed: Option<u64>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i64>,
    min_p: Option<f32>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    repetition_penalty: Option<f32>,
}

fn parse_seed(seed: Option<&Value>) -> Result<Option<u64>, ApiError> {
    let bad = || ApiError::invalid_param("seed", "seed must be an integer.");
    match seed {
        None | Some(Value::Null) => Ok(None),
        // Negative seeds are accepted as OpenAI accepts them; only the bits matter.
        Some(Value::Number(n)) => n.as_u64().or_else(|| n.as_i64().map(|i| i as u64)).map(Some).ok_or_else(bad),
        Some(_) => Err(bad()),
    }
}

fn sampling(r: &RequestSampling, defaults: &SamplingParams) -> Result<SamplingParams, ApiError> {
    let range = |name: &str, v: Option<f32>, lo: f32, hi: f32| -> Result<Option<f32>, ApiError> {
        match v {
            Some(x) if !(x.is_finite() && (lo..=hi).contains(&x)) => {
                Err(ApiError::invalid_param(name, format!("{name} must be between {lo} and {hi}; got {x}.")))
            }
            _ => Ok(v),
        }
    };
    let mut p = defaults.clone();
    if let Some(t) = range("temperature", r.temperature, 0.0, 2.0)? {
        p.temperature = t;
    }
    if let Some(t) = range("top_p", r.top_p, 0.0, 1.0)? {
        // top_p = 0 keeps only the most likely token, as in OpenAI's API.
        p.top_p = t.max(f32::MIN_POSITIVE);
    }
    if let Some(k) = r.top_k {
        p.top_k = match k {
            -1 | 0 => 0,
            k if k > 0 => usize::try_from(k).unwrap_or(usize::MAX),
            k => return Err(ApiError::invalid_param("top_k", format!("top_k must be -1, 0 or positive; got {k}."))),
        };
    }
    if let Some(m) = range("min_p", r.min_p, 0.0, 1.0)? {
        p.min_p = m;
    }
    if let Some(x) = range("presence_penalty", r.presence_penalty, -2.0, 2.0)? {
        p.presence_penalty = x;
    }
    if let Some(x) = range("frequency_penalty", r.frequency_penalty, -2.0, 2.0)? {
        p.frequency_penalty = x;
    }
    if let Some(x) = range("repetition_penalty", r.repetition_penalty, f32::MIN_POSITIVE, 10.0)? {
        p.repetition_penalty = x;
    }
    if r.seed.is_some() {
        p.seed = r.seed;
    }
    p.validate().map_err(ApiError::invalid)?;
    Ok(p)
}

fn convert_stop(stop: Option<&Value>) -> Result<Vec<String>, ApiError> {
    let stops = match stop {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| v.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| ApiError::invalid_param("stop", "stop must be a string or an array of strings."))?,
        Some(_) => return Err(ApiError::invalid_param("stop", "stop must be a string or an array of strings.")),
    };
    if stops.len() > MAX_STOP_STRINGS {
        return Err(ApiError::invalid_param("stop", format!("At most {MAX_STOP_STRINGS} stop strings are allowed.")));
    }
    Ok(stops.into_iter().filter(|s| !s.is_empty()).collect())
}

fn convert_tools(tools: Vec<wire::Tool>) -> Result<Vec<chat::Tool>, ApiError> {
    let mut out = Vec::new();
    for (i, tool) in tools.into_iter().enumerate() {
        if tool.kind != "function" {
            // Hosted tools (web search, ...) are not ours to run: leave them out.
            continue;
        }
        let f = tool.function.ok_or_else(|| {
            ApiError::invalid_param(format!("tools[{i}].function"), "A function tool needs a 'function' object.")
        })?;
        crate::tools::check_name(&f.name, &format!("tools[{i}].function.name"))?;
        let parameters = match f.parameters {
            None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
            Some(p @ Value::Object(_)) => p,
            Some(_) => {
                return Err(ApiError::invalid_param(
                    format!("tools[{i}].function.parameters"),
                    "Tool parameters must be a JSON Schema object.",
                ));
            }
        };
        out.push(chat::Tool { name: f.name, description: f.description, parameters });
    }
    Ok(out)
}

/// Text of a `content` value: a string, or an array of text parts (joined by newlines).
fn content_text(i: usize, content: Option<Value>) -> Result<Option<String>, ApiError> {
    let param = || format!("messages[{i}].content");
    match content {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(Value::Array(parts)) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (j, part) in parts.into_iter().enumerate() {
                let kind = part.get("type").and_then(Value::as_str).unwrap_or("");
                match kind {
                    "text" | "input_text" | "output_text" => match part.get("text").and_then(Value::as_str) {
                        Some(t) => texts.push(t.to_owned()),
                        None => {
                            return Err(ApiError::invalid_param(
                                format!("messages[{i}].content[{j}].text"),
                                "A text part needs a 'text' string.",
                            ));
                        }
                    },
                    "image_url" | "input_image" | "input_audio" | "file" | "input_file" => {
                        return Err(ApiError::invalid_param(
                            format!("messages[{i}].content[{j}]"),
                            format!("Content parts of type '{kind}' are not supported: this model reads text only."),
                        ));
                    }
                    _ => {
                        return Err(ApiError::invalid_param(
                            format!("messages[{i}].content[{j}].type"),
                            format!("Unknown content part type '{kind}'."),
                        ));
                    }
                }
            }
            Ok(Some(texts.join("\n")))
        }
        Some(_) => Err(ApiError::invalid_param(param(), "content must be a string, an array of parts or null.")),
    }
}

fn convert_message(i: usize, m: wire::Message) -> Result<Message, ApiError> {
    let text = content_text(i, m.content)?;
    let role = match m.role {
        wire::Role::System | wire::Role::Developer => Role::System,
        wire::Role::User => Role::User,
        wire::Role::Assistant => Role::Assistant,
        wire::Role::Tool | wire::Role::Function => Role::Tool,
    };
    let mut tool_calls = Vec::new();
    if let Some(calls) = m.tool_calls {
        if role != Role::Assistant {
            return Err(ApiError::invalid_param(
                format!("messages[{i}].tool_calls"),
                "Only assistant messages carry tool_calls.",
            ));
        }
        for (j, c) in calls.into_iter().enumerate() {
            if c.kind.as_deref().is_some_and(|k| k != "function") {
                return Err(ApiError::invalid_param(
                    format!("messages[{i}].tool_calls[{j}].type"),
                    "Tool calls must be of type 'function'.",
                ));
            }
            let arguments = match c.function.arguments {
                Value::Null => Value::Object(Map::new()),
                a @ (Value::String(_) | Value::Object(_)) => a,
                _ => {
                    return Err(ApiError::invalid_param(
                        format!("messages[{i}].tool_calls[{j}].function.arguments"),
                        "Arguments must be a JSON string.",
                    ));
                }
            };
            tool_calls.push(ToolCall { id: c.id, name: c.function.name, arguments });
        }
    }
    Ok(Message {
        role,
        content: text.map(Content::Text),
        tool_calls,
        tool_call_id: m.tool_call_id,
        name: if role == Role::Tool { m.name } else { None },
        reasoning_content: m.reasoning_content.or(m.reasoning).filter(|r| role == Role::Assistant && !r.is_empty()),
    })
}

pub fn finish_reason(reason: StopReason) -> &'static str {
    match reason {
        StopReason::EndTurn => "stop",
        StopReason::Length => "length",
        StopReason::ToolCalls => "tool_calls",
    }
}

/// Usage; `num_reasoning_tokens` of the completion tokens were reasoning.
pub fn usage(u: &Usage, num_reasoning_tokens: usize) -> wire::Usage {
    wire::Usage {
        prompt_tokens: u.prompt_tokens,
        completion_tokens: u.completion_tokens,
        total_tokens: u.prompt_tokens + u.completion_tokens,
        prompt_tokens_details: wire::PromptTokensDetails { cached_tokens: u.cached_tokens },
        completion_tokens_details: wire::CompletionTokensDetails { reasoning_tokens: num_reasoning_tokens },
    }
}

pub fn timings(u: &Usage) -> wire::Timings {
    let per_token = |ms: f64, n: usize| if n == 0 { 0.0 } else { ms / n as f64 };
    let per_second = |ms: f64, n: usize| if ms <= 0.0 { 0.0 } else { n as f64 * 1000.0 / ms };
    // The first output token comes out of the prefill; decode time covers the rest.
    let num_decoded = u.completion_tokens.saturating_sub(1);
    wire::Timings {
        cache_n: u.cached_tokens,
        prompt_n: u.prompt_tokens - u.cached_tokens.min(u.prompt_tokens),
        prompt_ms: u.prefill_ms,
        prompt_per_token_ms: per_token(u.prefill_ms, u.prompt_tokens),
        prompt_per_second: per_second(u.prefill_ms, u.prompt_tokens),
        predicted_n: u.completion_tokens,
        predicted_ms: u.decode_ms,
        predicted_per_token_ms: per_token(u.decode_ms, num_decoded),
        predicted_per_second: per_second(u.decode_ms, num_decoded),
    }
}

/// A call as OpenAI writes it; `index` only in chunks.
pub fn tool_call(call: ToolCall, index: Option<usize>) -> wire::OutToolCall {
    wire::OutToolCall {
        index,
        id: random_id("call_"),
        kind: "function",
        function: wire::OutFunction { name: call.name, arguments: call.arguments.to_string() },
    }
}

/// OpenAI's `logprobs` object of a choice: `{"content": [{token, logprob, bytes, top_logprobs}], "refusal": null}`.
pub fn logprobs(entries: &[TokenLogprob]) -> Value {
    let content: Vec<Value> = entries
        .iter()
        .map(|e| {
            let top: Vec<Value> =
                e.top.iter().map(|t| json!({"token": t.token, "logprob": t.logprob, "bytes": t.bytes})).collect();
            json!({"token": e.token, "logprob": e.logprob, "bytes": e.bytes, "top_logprobs": top})
        })
        .collect();
    json!({"content": content, "refusal": null})
}

/// Usage of `n` choices of one prompt: the prompt counted once, the outputs summed, timings of the slowest.
pub fn combined_usage(usages: &[Usage]) -> Usage {
    let mut total = usages.first().copied().unwrap_or_default();
    for u in usages.iter().skip(1) {
        total.completion_tokens += u.completion_tokens;
        total.cached_tokens = total.cached_tokens.min(u.cached_tokens);
        total.prefill_ms = total.prefill_ms.max(u.prefill_ms);
        total.decode_ms = total.decode_ms.max(u.decode_ms);
    }
    total
}

/// The response for `n` collected choices (in choice order); `want_logprobs`: the request asked for them.
pub fn completion(
    replies: Vec<Collected>,
    want_logprobs: bool,
    id: String,
    created: u64,
    model: String,
) -> wire::ChatCompletion {
    let usages: Vec<Usage> = replies.iter().map(|r| r.usage).collect();
    let total = combined_usage(&usages);
    let num_reasoning_tokens = replies.iter().map(|r| r.num_reasoning_tokens).sum();
    let choices = replies
        .into_iter()
        .enumerate()
        .map(|(index, reply)| {
            let content = if reply.text.is_empty() && !reply.tool_calls.is_empty() { None } else { Some(reply.text) };
            wire::Choice {
                index: index as u32,
                message: wire::AssistantMessage {
                    role: "assistant",
                    reasoning_content: (!reply.reasoning.is_empty()).then_some(reply.reasoning),
                    content,
                    tool_calls: reply.tool_calls.into_iter().map(|c| tool_call(c, None)).collect(),
                    refusal: None,
                },
                logprobs: want_logprobs.then(|| logprobs(&reply.logprobs)),
                finish_reason: finish_reason(reply.reason),
            }
        })
        .collect();
    wire::ChatCompletion {
        id,
        object: "chat.completion",
        created,
        model,
        choices,
        usage: usage(&total, num_reasoning_tokens),
        system_fingerprint: super::SYSTEM_FINGERPRINT,
        timings: timings(&total),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::parse_json;
    use crate::generate::ToolChoice;

    fn turn(body: Value) -> Result<ChatTurn, ApiError> {
        to_turn(parse_json(body.to_string().as_bytes())?, &SamplingParams::default())
    }

    #[test]
    fn full_request_converts() {
        let t = turn(json!({
            "model": "m",
            "messages": [
                {"role": "developer", "content": [{"type": "text", "text": "be brief"}]},
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": "{\"cmd\": \"ls\"}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "name": "bash", "content": "a.txt"}
            ],
            "tools": [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}},
                      {"type": "web_search"}],
            "tool_choice": {"type": "function", "function": {"name": "bash"}},
            "stop": "END", "seed": 7, "max_completion_tokens": 20, "max_tokens": 99,
            "temperature": 0.5, "top_k": -1, "top_p": 0, "presence_penalty": 1.5,
            "parallel_tool_calls": false, "reasoning_effort": "low", "user": "ignored"
        }))
        .unwrap();
        assert_eq!(t.conversation.messages.len(), 4);
        assert_eq!(t.conversation.messages[0].role, Role::System);
        assert_eq!(t.conversation.messages[2].tool_calls[0].name, "bash");
        assert_eq!(t.conversation.messages[3].tool_call_id.as_deref(), Some("call_1"));
        assert_eq!(t.conversation.tools.len(), 1);
        assert_eq!(t.tool_choice, ToolChoice::Named("bash".into()));
        assert_eq!(t.stop, vec!["END".to_string()]);
        assert_eq!((t.max_tokens, t.sampling.seed, t.sampling.top_k), (Some(20), Some(7), 0));
        assert_eq!((t.sampling.temperature, t.sampling.presence_penalty), (0.5, 1.5));
        assert!(t.sampling.top_p > 0.0 && t.sampling.top_p < 1e-6);
        assert!(!t.parallel_tool_calls);
    }

    #[test]
    fn bad_fields_are_named() {
        let cases = [
            (json!({"messages": [{"role": "user", "content": "x"}], "n": 0}), "n"),
            (json!({"messages": [{"role": "user", "content": "x"}], "n": 17}), "n"),
            (
                json!({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21}),
                "top_logprobs",
            ),
            (json!({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}), "top_logprobs"),
            (json!({"messages": [{"role": "user", "content": "x"}], "temperature": 3}), "temperature"),
            (json!({"messages": [{"role": "user", "content": "x"}], "top_k": -5}), "top_k"),
            (json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}), "max_tokens"),
            (json!({"messages": [{"role": "user", "content": "x"}], "stop": [1]}), "stop"),
            (json!({"messages": [{"role": "user", "content": "x"}], "seed": "x"}), "seed"),
            (json!({"messages": [{"role": "user", "content": "x"}], "tool_choice": "always"}), "tool_choice"),
            (
                json!({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}}),
                "response_format.type",
            ),
            (json!({"messages": [{"role": "user", "content": 5}]}), "messages[0].content"),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}),
                "messages[0].content[0]",
            ),
            (json!({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}), "messages[0].tool_calls"),
            (
                json!({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}),
                "tools[0].function",
            ),
        ];
        for (body, param) in cases {
            let e = turn(body.clone()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {e:?}");
            assert_eq!(e.status(), axum::http::StatusCode::BAD_REQUEST);
        }
        let e = turn(json!({"messages": [{"role": "bot", "content": "x"}]})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].role"));
        let e = turn(json!({"messages": "nope"})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages"));
    }
}
