//! A turn into an engine request: the conversation rendered with the model's chat template, tokenized, and the
//! output constraint (a forced call's grammar, a response format, the lazy tool-call grammar) attached.
//!
//! Only the template's own text writes control tokens: every string of the conversation (messages, tool results,
//! tool names, descriptions and schemas, system prompts, template arguments) goes into the template through
//! `Tokenizer::protect`, and the prompt is tokenized by `Tokenizer::encode_prompt`, so `<|im_start|>` written in
//! content is plain text (see the `tokenizer` crate's `prompt` module for why template transforms keep it so).

use std::sync::Arc;

use chat::{Content, Conversation, RenderInput, Role};
use engine::GenerateRequest;

use super::{ChatTurn, Thinking, ToolChoice};
use crate::constraint::{Constraint, OutputFormat};
use crate::error::ApiError;
use crate::lazy_call::{CallStart, CallStarts, LazyToolCalls};
use crate::{AppState, ReasoningFormat};

/// The engine request built from a turn, and what is needed to read its output.
#[derive(Debug)]
pub struct Prepared {
    pub request: GenerateRequest,
    /// Text appended to the prompt after the generation prompt (the start of a forced tool call).
    pub prefill: String,
    /// The declared tools (name, parameter schema) whose calls are parsed out of the output; empty = no parsing.
    pub tools: Vec<(String, serde_json::Value)>,
    pub parallel_tool_calls: bool,
    /// A grammar forces the reply to be one call: its arguments can be streamed as they are generated.
    pub streams_call: bool,
    /// Where the calls held by the lazy grammar (auto tool choice) start, or the forced XML call's (at 0: the
    /// prefill's `<tool_call>`, the reply's text counted from the prefill): their arguments are streamed too.
    pub call_starts: Option<CallStarts>,
    /// The reasoning is split from the content: `Some(prompt_opened)` (the prompt ends inside the reasoning).
    pub reasoning: Option<bool>,
}

/// The start of a call, written into the prompt when a call is required; the grammar of the call (name, arguments
/// under the tool's schema, closing tag) constrains the rest from the first generated token: Hermes' JSON form, or
/// Qwen3-Coder's XML form where the template shows that one.
const FORCED_CALL_PREFIX: &str = "<tool_call>\n";
/// Without a grammar (it could not be built), the prompt also opens the JSON so the model can only name a tool.
const FORCED_CALL_PREFIX_UNCONSTRAINED: &str = "<tool_call>\n{\"name\": \"";
/// The same for the XML form.
const FORCED_XML_CALL_PREFIX_UNCONSTRAINED: &str = "<tool_call>\n<function=";

/// A turn rendered with the chat template.
#[derive(Debug, Clone, PartialEq)]
pub struct Rendered {
    /// The whole prompt, prefill included, with its content protected (marks in it: tokenize it with
    /// `Tokenizer::encode_prompt`, show it with [`Rendered::text`]).
    pub prompt: String,
    /// Text appended after the generation prompt (the start of a forced tool call).
    pub prefill: String,
    /// The tools shown to the model, with their parameter schemas (empty when there are none or `tool_choice` is
    /// `none`).
    pub tools: Vec<(String, serde_json::Value)>,
    /// The tools a forced call may name, with their parameter schemas (empty when no call is forced).
    pub forced_tools: Vec<(String, serde_json::Value)>,
    /// The reasoning is split from the content: `Some(prompt_opened)` (the prompt ends inside the reasoning).
    pub reasoning: Option<bool>,
}

impl Rendered {
    /// The prompt's text, as the model reads it.
    pub fn text(&self) -> String {
        tokenizer::unmark(&self.prompt).into_owned()
    }
}

/// Renders a turn's conversation into prompt text. CPU-bound: call from a blocking thread.
pub fn render(state: &AppState, turn: &ChatTurn) -> Result<Rendered, ApiError> {
    let template = state
        .template
        .as_ref()
        .ok_or_else(|| ApiError::invalid("This model has no chat template, so it cannot take chat requests."))?;
    if turn.conversation.messages.is_empty() {
        return Err(ApiError::invalid_param("messages", "At least one message is required."));
    }
    let tool_names: Vec<String> = turn.conversation.tools.iter().map(|t| t.name.clone()).collect();
    match &turn.tool_choice {
        ToolChoice::Required if tool_names.is_empty() => {
            return Err(ApiError::invalid_param("tool_choice", "tool_choice 'required' needs at least one tool."));
        }
        ToolChoice::Named(name) if !tool_names.contains(name) => {
            return Err(ApiError::invalid_param(
                "tool_choice",
                format!("tool_choice names '{name}', which is not among the tools."),
            ));
        }
        _ => {}
    }
    let mut conversation = turn.conversation.clone();
    patch_for_templates(&mut conversation);
    let use_tools = turn.tool_choice != ToolChoice::None && !conversation.tools.is_empty();
    if !use_tools {
        conversation.tools.clear();
    }
    let forced = use_tools && template.source().contains("<tool_call>");
    // A forced call or a format is enforced from the first generated token: there is no room to think.
    let constrained = (forced && matches!(turn.tool_choice, ToolChoice::Required | ToolChoice::Named(_)))
        || turn.output_format != OutputFormat::Text;
    let thinking = if constrained { Thinking::Off } else { turn.thinking };
    let mut extra = turn.template_kwargs.clone();
    if chat::reasoning::template_has_thinking_switch(template.source()) {
        match thinking {
            Thinking::Off => _ = extra.insert("enable_thinking".into(), false.into()),
            Thinking::On => _ = extra.entry("enable_thinking").or_insert(true.into()),
            Thinking::Default => {}
        }
    }
    let input = |conversation: &Conversation| RenderInput {
        extra: extra.clone(),
        ..RenderInput::from_conversation(conversation, true)
    };
    let protect = |s: &str| protect(&state.tokenizer, s);
    let mut prompt = match template.render_protected(&input(&conversation), &protect) {
        // Strict templates refuse a system turn after the first message or two turns of one role in a row, which
        // agents send: retry once with the conversation reshaped to what such templates accept.
        Err(chat::Error::Raised(_)) => {
            reshape_for_strict_templates(&mut conversation);
            template.render_protected(&input(&conversation), &protect)?
        }
        other => other?,
    };
    let thinks = chat::reasoning::template_thinks(template.source());
    if thinks && thinking == Thinking::Off && chat::reasoning::prompt_opens_reasoning(&tokenizer::unmark(&prompt)) {
        // No switch in the template (or it opens the reasoning anyway): close the block, as Qwen3 does when off.
        let newline = tokenizer::unmark(&prompt).ends_with('\n');
        prompt.push_str(if newline { "\n</think>\n\n" } else { "\n\n</think>\n\n" });
    }
    let reasoning = (thinks && !constrained && state.config.reasoning_format == ReasoningFormat::Auto)
        .then(|| chat::reasoning::prompt_opens_reasoning(&tokenizer::unmark(&prompt)));
    let schema = |t: &chat::Tool| (t.name.clone(), t.parameters.clone());
    let tools = if use_tools { turn.conversation.tools.iter().map(schema).collect() } else { Vec::new() };
    let forced_tools: Vec<(String, serde_json::Value)> = match &turn.tool_choice {
        _ if !forced => Vec::new(),
        ToolChoice::Required => conversation.tools.iter().map(schema).collect(),
        ToolChoice::Named(name) => conversation.tools.iter().filter(|t| &t.name == name).map(schema).collect(),
        ToolChoice::Auto | ToolChoice::None => Vec::new(),
    };
    let prefill = if forced_tools.is_empty() { String::new() } else { FORCED_CALL_PREFIX.to_string() };
    prompt.push_str(&prefill);
    Ok(Rendered { prompt, prefill, tools, forced_tools, reasoning })
}

/// `Tokenizer::protect` in the shape the template takes: `None` when the string goes in unchanged.
fn protect(tokenizer: &tokenizer::Tokenizer, s: &str) -> Option<String> {
    match tokenizer.protect(s) {
        std::borrow::Cow::Owned(p) => Some(p),
        std::borrow::Cow::Borrowed(_) => None,
    }
}

/// Whether the template shows Qwen3-Coder's XML call form (`<function=NAME>` inside the tags): forced calls and the
/// lazy grammar write that form then.
fn template_calls_in_xml(state: &AppState) -> bool {
    state.template.as_ref().is_some_and(|t| t.source().contains("<function="))
}

/// The grammar of a forced call of one of `tools`, in the XML form when `xml`. A tool whose parameters schema cannot
/// be compiled is the request's fault, a 400 (as an unusable `response_format` schema is); `None` when no grammar can
/// be built at all (the model lacks what constrained decoding needs), and the call is then opened in the prompt
/// instead.
fn forced_call_constraint(
    tokenizer: &Arc<tokenizer::Tokenizer>,
    tools: &[(String, serde_json::Value)],
    xml: bool,
) -> Result<Option<Constraint>, ApiError> {
    // `loose`: any object as the arguments (JSON), any text as a value (XML).
    let compile = |tools: &[(String, serde_json::Value)], loose: bool| {
        if xml {
            return Constraint::for_xml_tool_call(tokenizer, tools, loose);
        }
        let loosened: Vec<_>;
        let tools = if loose {
            loosened = tools.iter().map(|(n, _)| (n.clone(), serde_json::json!({"type": "object"}))).collect();
            &loosened[..]
        } else {
            tools
        };
        Constraint::for_tool_call(tokenizer, tools)
    };
    let e = match compile(tools, false) {
        Ok(c) => return Ok(Some(c)),
        Err(e) => e,
    };
    if compile(tools, true).is_err() {
        return Ok(None);
    }
    let bad = tools.iter().find(|t| compile(std::slice::from_ref(*t), false).is_err());
    let name = bad.map_or_else(|| tools[0].0.as_str(), |(n, _)| n.as_str());
    let why = e.message.strip_prefix("The schema cannot be used: ").unwrap_or(&e.message);
    Err(ApiError::invalid_param("tools", format!("The parameters schema of tool '{name}' cannot be used: {why}"))
        .with_code("invalid_tool_schema"))
}

/// Renders and tokenizes a turn. CPU-bound (templates, tokenizer): call from a blocking thread.
pub fn prepare(state: &AppState, turn: ChatTurn) -> Result<Prepared, ApiError> {
    let Rendered { mut prompt, mut prefill, tools, forced_tools, reasoning } = render(state, &turn)?;
    let xml = template_calls_in_xml(state);
    let constraint = if forced_tools.is_empty() {
        Constraint::for_format(&state.tokenizer, &turn.output_format, "response_format")?
    } else {
        let c = forced_call_constraint(&state.tokenizer, &forced_tools, xml)?;
        if c.is_none() {
            // No grammar: fall back to opening the call in the prompt (the tool's name is content: protected).
            prompt.truncate(prompt.len() - prefill.len());
            let open = if xml { FORCED_XML_CALL_PREFIX_UNCONSTRAINED } else { FORCED_CALL_PREFIX_UNCONSTRAINED };
            let (written, protected) = match &turn.tool_choice {
                ToolChoice::Named(name) => {
                    let protected = state.tokenizer.protect(name);
                    let call = |name: &str| {
                        if xml { format!("{open}{name}>\n") } else { format!("{open}{name}\", \"arguments\": ") }
                    };
                    (call(name), call(&protected))
                }
                _ => (open.to_string(), open.to_string()),
            };
            prefill = written;
            prompt.push_str(&protected);
        }
        c
    };
    let forced_call = !forced_tools.is_empty() && constraint.is_some();
    // A forced JSON call streams through `ForcedCall`; a forced XML call as the lazy grammar's XML calls do, from a
    // call that starts at the prefill's `<tool_call>` (the reply's text starts with the prefill).
    let streams_call = forced_call && !xml;
    let mut call_starts = (forced_call && xml).then(|| {
        let start = CallStart { offset: 0, tagged: true, xml: true };
        CallStarts::new(std::sync::Mutex::new(vec![start]))
    });
    let mut constraint = constraint.map(|c| Box::new(c) as Box<dyn engine::TokenConstraint>);
    if constraint.is_none()
        && state.config.tool_grammar
        && turn.tool_choice == ToolChoice::Auto
        && !tools.is_empty()
        && turn.output_format == OutputFormat::Text
        && let Some(mut lazy) = lazy_tool_grammar(state, &turn)
    {
        if let Some(prompt_opened) = reasoning {
            lazy.wait_for_reasoning(prompt_opened);
        }
        call_starts = Some(lazy.call_starts());
        constraint = Some(Box::new(lazy));
    }
    let prompt = encode_prompt(&state.tokenizer, &prompt)?;
    let mut request =
        GenerateRequest::new(prompt, turn.sampling, turn.max_tokens.unwrap_or(state.config.default_max_tokens));
    request.stop_strings = turn.stop;
    request.constraint = constraint;
    Ok(Prepared {
        request,
        prefill,
        tools,
        parallel_tool_calls: turn.parallel_tool_calls,
        streams_call,
        call_starts,
        reasoning,
    })
}

/// The lazy grammar of an auto tool choice: free text until the model starts a call, then a well-formed call of a
/// declared tool. `None` when no grammar can be built (the output parser still reads what the model writes).
fn lazy_tool_grammar(state: &AppState, turn: &ChatTurn) -> Option<LazyToolCalls> {
    let tools: Vec<(String, serde_json::Value)> =
        turn.conversation.tools.iter().map(|t| (t.name.clone(), t.parameters.clone())).collect();
    LazyToolCalls::new(&state.tokenizer, &tools, template_calls_in_xml(state), turn.parallel_tool_calls).ok()
}

/// Tokenizes a rendered prompt ([`Rendered::prompt`]): control tokens only from the template's text, content as
/// plain text; BOS where the model wants it.
pub fn encode_prompt(tokenizer: &tokenizer::Tokenizer, prompt: &str) -> Result<Vec<u32>, ApiError> {
    let mut ids = tokenizer.encode_prompt(prompt)?;
    tokenizer.prepend_bos(&mut ids);
    Ok(ids)
}

/// Fixes what agents send and templates choke on: a missing `content` becomes `""` (templates concatenate it),
/// except on an assistant message that only calls tools.
fn patch_for_templates(conversation: &mut Conversation) {
    for m in &mut conversation.messages {
        let only_calls = m.role == Role::Assistant && !m.tool_calls.is_empty();
        if m.content.is_none() && !only_calls {
            m.content = Some(Content::Text(String::new()));
        }
    }
}

/// Reshapes a conversation for templates that insist on one leading system message and alternating turns: leading
/// system messages are merged; a later system message becomes a user turn (its text marked as a system note); then
/// neighbouring turns of the same role without tool calls or results are merged.
fn reshape_for_strict_templates(conversation: &mut Conversation) {
    let text = |m: &chat::Message| m.content.as_ref().map(Content::to_text).unwrap_or_default();
    let mut out: Vec<chat::Message> = Vec::with_capacity(conversation.messages.len());
    for (i, mut m) in std::mem::take(&mut conversation.messages).into_iter().enumerate() {
        if m.role == Role::System && i > 0 {
            if out.iter().all(|p| p.role == Role::System) {
                // Still in the leading block: merge below.
            } else {
                m = chat::Message::user(format!("[System note]\n{}", text(&m)));
            }
        }
        let mergeable = |a: &chat::Message, b: &chat::Message| {
            a.role == b.role
                && a.role != Role::Tool
                && a.tool_calls.is_empty()
                && b.tool_calls.is_empty()
                && a.tool_call_id.is_none()
        };
        match out.last_mut() {
            Some(prev) if mergeable(prev, &m) => {
                let joined = format!("{}\n\n{}", text(prev), text(&m));
                prev.content = Some(Content::Text(joined));
            }
            _ => out.push(m),
        }
    }
    conversation.messages = out;
}
