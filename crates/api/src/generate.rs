//! The protocol-neutral path of a chat request: [`ChatTurn`] in, a stream of [`Output`]s out.
//!
//! Every protocol adapter converts its wire request into a [`ChatTurn`] (a `chat::Conversation` plus tool choice,
//! sampling, limits and stop strings), calls [`start`], and renders the [`Reply`]'s outputs in its own shape. Here the
//! conversation is rendered with the model's chat template and tokenized into an `engine::GenerateRequest`; the
//! engine's token events go through the one output pipeline on the way back: for a thinking model (its template
//! writes `<think>` … `</think>`) the reasoning is split off first (`chat::ReasoningParser`), then the content goes
//! through the output parser (text / tool calls). No protocol types appear in this module.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use chat::tool_parser::{JsonEnd, JsonScanner};
use chat::{
    Content, Conversation, ParseEvent, ReasoningEvent, ReasoningParser, RenderInput, Role, ToolCall, ToolCallParser,
};
use engine::service::RequestStream;
use engine::{Event, FinishReason, GenerateRequest, SamplingParams, Usage};

use crate::constraint::Constraint;
pub use crate::constraint::OutputFormat;
use crate::error::ApiError;
use crate::lazy_call::{CallStarts, LazyToolCalls};
use crate::{AppState, ReasoningFormat};

/// Which tool calls the reply may or must contain.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ToolChoice {
    /// The model decides.
    #[default]
    Auto,
    /// No calls: the tools are not shown to the model.
    None,
    /// At least one call.
    Required,
    /// A call of this tool.
    Named(String),
}

/// Whether the model should think, for templates that can switch it (Qwen3's `enable_thinking`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Thinking {
    /// The template's default.
    #[default]
    Default,
    On,
    /// No reasoning: the switch is turned off, and a reasoning block the prompt opens is closed at once.
    Off,
}

/// One chat request, as every protocol adapter describes it.
#[derive(Debug, Clone)]
pub struct ChatTurn {
    pub conversation: Conversation,
    pub tool_choice: ToolChoice,
    pub parallel_tool_calls: bool,
    pub sampling: SamplingParams,
    /// `None`: the server's default (always lowered to what fits the context).
    pub max_tokens: Option<usize>,
    pub stop: Vec<String>,
    /// What the text must be (JSON, a schema), enforced while decoding.
    pub output_format: OutputFormat,
    pub thinking: Thinking,
    /// Extra keyword arguments for the chat template (`chat_template_kwargs`).
    pub template_kwargs: serde_json::Map<String, serde_json::Value>,
}

/// Why a reply ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The model ended its turn, or a stop string was hit.
    EndTurn,
    /// The output limit or the context was reached.
    Length,
    /// The reply is one or more tool calls.
    ToolCalls,
}

/// One piece of a reply, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// Reasoning of a thinking model; all of it comes before any other text or call.
    Reasoning(String),
    Text(String),
    /// A complete call (`id` is `None`: each protocol names its own ids). After `ToolCallBegin` it closes that call
    /// (its arguments were sent as `ToolCallArgs`).
    ToolCall(ToolCall),
    /// A forced call has started: its name is known, its arguments follow as they are generated.
    ToolCallBegin {
        name: String,
    },
    /// The next piece of the started call's arguments (JSON text; the pieces join to the arguments).
    ToolCallArgs(String),
    /// Log-probabilities of generated tokens (when the request asked for them), in order, each before the text it
    /// is part of is released (text may be held back by the output parser, so a `Text` can follow several).
    Logprobs(Vec<TokenLogprob>),
    /// The last output. `matched_stop`: the request's stop string that ended the reply. `num_reasoning_tokens`: the
    /// generated tokens that were reasoning (part of `usage.completion_tokens`).
    Done {
        reason: StopReason,
        usage: Usage,
        matched_stop: Option<String>,
        num_reasoning_tokens: usize,
    },
}

/// One generated token's log-probability, with the most likely alternatives, as text and bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub token: String,
    pub bytes: Vec<u8>,
    pub logprob: f32,
    /// Most likely first.
    pub top: Vec<TopLogprob>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TopLogprob {
    pub token: String,
    pub bytes: Vec<u8>,
    pub logprob: f32,
}

impl TokenLogprob {
    fn new(tokenizer: &tokenizer::Tokenizer, id: u32, lp: &engine::TokenLogprobs) -> Self {
        let text = |id: u32| {
            let bytes = tokenizer.piece(id, true).to_vec();
            (String::from_utf8_lossy(&bytes).into_owned(), bytes)
        };
        let (token, bytes) = text(id);
        let top = lp
            .top
            .iter()
            .map(|&(id, logprob)| {
                let (token, bytes) = text(id);
                TopLogprob { token, bytes, logprob }
            })
            .collect();
        TokenLogprob { token, bytes, logprob: lp.logprob, top }
    }
}

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
    /// Where the calls held by the lazy grammar (auto tool choice) start: their arguments are streamed too.
    pub call_starts: Option<CallStarts>,
    /// The reasoning is split from the content: `Some(prompt_opened)` (the prompt ends inside the reasoning).
    pub reasoning: Option<bool>,
}

/// The start of a Hermes-style call, written into the prompt when a call is required; the grammar of the call
/// (name, arguments under the tool's schema, closing tag) constrains the rest from the first generated token.
const FORCED_CALL_PREFIX: &str = "<tool_call>\n";
/// Without a grammar (it could not be built), the prompt also opens the JSON so the model can only name a tool.
const FORCED_CALL_PREFIX_UNCONSTRAINED: &str = "<tool_call>\n{\"name\": \"";

/// A turn rendered with the chat template.
#[derive(Debug, Clone, PartialEq)]
pub struct Rendered {
    /// The whole prompt text, prefill included.
    pub text: String,
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
    let mut text = match template.render(&input(&conversation)) {
        // Strict templates refuse a system turn after the first message or two turns of one role in a row, which
        // agents send: retry once with the conversation reshaped to what such templates accept.
        Err(chat::Error::Raised(_)) => {
            reshape_for_strict_templates(&mut conversation);
            template.render(&input(&conversation))?
        }
        other => other?,
    };
    let thinks = chat::reasoning::template_thinks(template.source());
    if thinks && thinking == Thinking::Off && chat::reasoning::prompt_opens_reasoning(&text) {
        // No switch in the template (or it opens the reasoning anyway): close the block, as Qwen3 does when off.
        text.push_str(if text.ends_with('\n') { "\n</think>\n\n" } else { "\n\n</think>\n\n" });
    }
    let reasoning = (thinks && !constrained && state.config.reasoning_format == ReasoningFormat::Auto)
        .then(|| chat::reasoning::prompt_opens_reasoning(&text));
    let schema = |t: &chat::Tool| (t.name.clone(), t.parameters.clone());
    let tools = if use_tools { turn.conversation.tools.iter().map(schema).collect() } else { Vec::new() };
    let forced_tools: Vec<(String, serde_json::Value)> = match &turn.tool_choice {
        _ if !forced => Vec::new(),
        ToolChoice::Required => conversation.tools.iter().map(schema).collect(),
        ToolChoice::Named(name) => conversation.tools.iter().filter(|t| &t.name == name).map(schema).collect(),
        ToolChoice::Auto | ToolChoice::None => Vec::new(),
    };
    let prefill = if forced_tools.is_empty() { String::new() } else { FORCED_CALL_PREFIX.to_string() };
    text.push_str(&prefill);
    Ok(Rendered { text, prefill, tools, forced_tools, reasoning })
}

/// The grammar of a forced call of one of `tools`. A tool whose parameters schema cannot be compiled is the request's
/// fault, a 400 (as an unusable `response_format` schema is); `None` when no grammar can be built at all (the model
/// lacks what constrained decoding needs), and the call is then opened in the prompt instead.
fn forced_call_constraint(
    tokenizer: &Arc<tokenizer::Tokenizer>,
    tools: &[(String, serde_json::Value)],
) -> Result<Option<Constraint>, ApiError> {
    let e = match Constraint::for_tool_call(tokenizer, tools) {
        Ok(c) => return Ok(Some(c)),
        Err(e) => e,
    };
    let loose: Vec<_> = tools.iter().map(|(n, _)| (n.clone(), serde_json::json!({"type": "object"}))).collect();
    if Constraint::for_tool_call(tokenizer, &loose).is_err() {
        return Ok(None);
    }
    let bad = tools.iter().find(|t| Constraint::for_tool_call(tokenizer, std::slice::from_ref(*t)).is_err());
    let name = bad.map_or_else(|| tools[0].0.as_str(), |(n, _)| n.as_str());
    let why = e.message.strip_prefix("The schema cannot be used: ").unwrap_or(&e.message);
    Err(ApiError::invalid_param("tools", format!("The parameters schema of tool '{name}' cannot be used: {why}"))
        .with_code("invalid_tool_schema"))
}

/// Renders and tokenizes a turn. CPU-bound (templates, tokenizer): call from a blocking thread.
pub fn prepare(state: &AppState, turn: ChatTurn) -> Result<Prepared, ApiError> {
    let Rendered { mut text, mut prefill, tools, forced_tools, reasoning } = render(state, &turn)?;
    let constraint = if forced_tools.is_empty() {
        Constraint::for_format(&state.tokenizer, &turn.output_format, "response_format")?
    } else {
        let c = forced_call_constraint(&state.tokenizer, &forced_tools)?;
        if c.is_none() {
            // No grammar: fall back to opening the call in the prompt.
            text.truncate(text.len() - prefill.len());
            prefill = match &turn.tool_choice {
                ToolChoice::Named(name) => format!("{FORCED_CALL_PREFIX_UNCONSTRAINED}{name}\", \"arguments\": "),
                _ => FORCED_CALL_PREFIX_UNCONSTRAINED.to_string(),
            };
            text.push_str(&prefill);
        }
        c
    };
    let streams_call = !forced_tools.is_empty() && constraint.is_some();
    let mut constraint = constraint.map(|c| Box::new(c) as Box<dyn engine::TokenConstraint>);
    let mut call_starts = None;
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
    let prompt = encode(&state.tokenizer, &text)?;
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
    let xml = state.template.as_ref().is_some_and(|t| t.source().contains("<function="));
    LazyToolCalls::new(&state.tokenizer, &tools, xml, turn.parallel_tool_calls).ok()
}

/// Tokenizes a rendered prompt (special tokens parsed), adding BOS where the model wants it.
pub fn encode(tokenizer: &tokenizer::Tokenizer, text: &str) -> Result<Vec<u32>, ApiError> {
    let mut ids = tokenizer.encode(text, true)?;
    if let Some(bos) = tokenizer.bos().filter(|_| tokenizer.add_bos())
        && ids.first() != Some(&bos)
    {
        ids.insert(0, bos);
    }
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

/// Prepares and submits a turn.
pub async fn start(state: &Arc<AppState>, turn: ChatTurn) -> Result<Reply, ApiError> {
    let s = state.clone();
    let prepared = tokio::task::spawn_blocking(move || prepare(&s, turn))
        .await
        .map_err(|e| ApiError::internal(format!("preparing the prompt failed: {e}")))??;
    let Prepared { request, prefill, tools, parallel_tool_calls, streams_call, call_starts, reasoning } = prepared;
    let stream = state.engine.submit(request)?;
    let mut reply = Reply::new(stream, &prefill, &tools, parallel_tool_calls);
    if streams_call {
        reply.forced_call = Some(ForcedCall::default());
    }
    reply.auto_calls = call_starts.map(AutoCalls::new);
    reply.reasoning = reasoning.map(ReasoningParser::new);
    reply.tokenizer = Some(state.tokenizer.clone());
    reply.loop_guard = state.config.max_repeated_chars.map(LoopGuard::new);
    Ok(reply)
}

/// The outputs of one running request. Dropping it aborts the request.
#[derive(Debug)]
pub struct Reply {
    stream: Option<RequestStream>,
    parser: Option<ToolCallParser>,
    parallel_tool_calls: bool,
    pending: VecDeque<Output>,
    finished: bool,
    num_prompt_tokens: usize,
    num_output_tokens: usize,
    num_calls: usize,
    /// Name and arguments of each call of this reply so far.
    calls_made: Vec<(String, serde_json::Value)>,
    t_start: Instant,
    t_first_token: Option<Instant>,
    /// Stops a reply that has started repeating itself.
    pub loop_guard: Option<LoopGuard>,
    /// Spells out the tokens of log-probabilities.
    pub tokenizer: Option<Arc<tokenizer::Tokenizer>>,
    /// Streams the arguments of a grammar-forced call.
    forced_call: Option<ForcedCall>,
    /// Streams the arguments of the calls the lazy grammar holds.
    auto_calls: Option<AutoCalls>,
    /// Splits a thinking model's reasoning from its content.
    reasoning: Option<ReasoningParser>,
    num_reasoning_tokens: usize,
    /// Tokens at the start whose text may still open the reasoning (blanks, part of `<think>`).
    num_undecided_tokens: usize,
}

/// The arguments of a grammar-forced call as they are generated. The grammar fixes the text around them:
/// `{"name": "NAME", "arguments": ARGS}\n</tool_call>`, so the name is known once its closing quote is written, and
/// everything after it except the possible closing tail is argument text.
#[derive(Debug, Default)]
struct ForcedCall {
    text: String,
    /// Byte offset of the arguments in `text`, once the name is known.
    args_start: Option<usize>,
    /// Bytes of `text` sent as arguments so far.
    sent: usize,
    done: bool,
}

impl ForcedCall {
    const HEAD: &'static str = "{\"name\": \"";
    const AFTER_NAME: &'static str = "\", \"arguments\": ";
    const TAIL: &'static str = "}\n</tool_call>";

    fn push(&mut self, text: &str, out: &mut VecDeque<Output>) {
        if self.done {
            return;
        }
        self.text.push_str(text);
        if self.args_start.is_none()
            && let Some(rest) = self.text.strip_prefix(Self::HEAD)
            && let Some(end) = rest.find(Self::AFTER_NAME)
        {
            let start = Self::HEAD.len() + end + Self::AFTER_NAME.len();
            out.push_back(Output::ToolCallBegin { name: rest[..end].to_string() });
            self.args_start = Some(start);
            self.sent = start;
        }
        if self.args_start.is_some() {
            // Hold back what could be the start of the closing tail.
            let mut upto = self.text.len().saturating_sub(Self::TAIL.len()).max(self.sent);
            while !self.text.is_char_boundary(upto) {
                upto -= 1;
            }
            if upto > self.sent {
                out.push_back(Output::ToolCallArgs(self.text[self.sent..upto].to_string()));
                self.sent = upto;
            }
        }
    }

    /// The rest of the arguments, before the parser's complete call.
    fn finish(&mut self, out: &mut VecDeque<Output>) {
        if self.done {
            return;
        }
        self.done = true;
        if self.args_start.is_some() {
            let end = self.text.rfind(Self::TAIL).unwrap_or(self.text.len()).max(self.sent);
            if end > self.sent {
                out.push_back(Output::ToolCallArgs(self.text[self.sent..end].to_string()));
                self.sent = end;
            }
        }
    }
}

impl Reply {
    /// `tools`: the declared tools (name, parameter schema) whose calls are read out of the output.
    pub fn new(
        stream: RequestStream,
        prefill: &str,
        tools: &[(String, serde_json::Value)],
        parallel_tool_calls: bool,
    ) -> Self {
        let mut parser = (!tools.is_empty())
            .then(|| ToolCallParser::new(tools.iter().map(|(name, _)| name.clone())).with_schemas(tools));
        if let Some(p) = &mut parser {
            // The forced start of a call is part of the reply as far as the parser is concerned; it yields no text.
            let _ = p.push(prefill);
        }
        Reply {
            num_prompt_tokens: stream.num_prompt_tokens(),
            stream: Some(stream),
            parser,
            parallel_tool_calls,
            pending: VecDeque::new(),
            finished: false,
            num_output_tokens: 0,
            num_calls: 0,
            calls_made: Vec::new(),
            t_start: Instant::now(),
            t_first_token: None,
            loop_guard: None,
            tokenizer: None,
            forced_call: None,
            auto_calls: None,
            reasoning: None,
            num_reasoning_tokens: 0,
            num_undecided_tokens: 0,
        }
    }

    pub fn num_prompt_tokens(&self) -> usize {
        self.num_prompt_tokens
    }

    /// The next output; `None` after `Done` or an error.
    pub async fn next(&mut self) -> Option<Result<Output, ApiError>> {
        loop {
            if let Some(o) = self.pending.pop_front() {
                return Some(Ok(o));
            }
            if self.finished {
                return None;
            }
            let Some(stream) = self.stream.as_mut() else {
                self.finished = true;
                return None;
            };
            match stream.next().await {
                Some(Ok(Event::Token { id, text, logprobs })) => {
                    self.num_output_tokens += 1;
                    // End-of-generation tokens are not part of the reply (OpenAI leaves them out too).
                    if let (Some(lp), Some(tok)) = (&logprobs, &self.tokenizer)
                        && !tok.is_eog(id)
                    {
                        self.pending.push_back(Output::Logprobs(vec![TokenLogprob::new(tok, id, lp)]));
                    }
                    self.t_first_token.get_or_insert_with(Instant::now);
                    let was_reasoning = self.reasoning.as_ref().is_some_and(ReasoningParser::in_reasoning);
                    self.feed(&text);
                    self.count_reasoning_token(was_reasoning);
                    if self.loop_guard.as_mut().is_some_and(|g| g.push(&text)) {
                        // The model is looping: stop it and report the output limit.
                        let usage = self.cut_short();
                        self.finish_reasoning();
                        if let Some(p) = &mut self.parser {
                            let events = p.finish();
                            self.take(events);
                        }
                        let reason = if self.num_calls > 0 { StopReason::ToolCalls } else { StopReason::Length };
                        self.finish(reason, usage, None);
                    } else if self.parser.as_ref().is_some_and(ToolCallParser::is_done) {
                        // The calls are complete and the model has moved on: stop it here.
                        let usage = self.cut_short();
                        self.finish(StopReason::ToolCalls, usage, None);
                    }
                }
                Some(Ok(Event::Finished { reason, text, usage, matched_stop })) => {
                    self.stream = None;
                    self.feed(&text);
                    self.finish_reasoning();
                    if let Some(p) = &mut self.parser {
                        let events = p.finish();
                        self.take(events);
                    }
                    let reason = match reason {
                        _ if self.num_calls > 0 => StopReason::ToolCalls,
                        FinishReason::Length => StopReason::Length,
                        FinishReason::Stop | FinishReason::Aborted => StopReason::EndTurn,
                    };
                    let matched_stop = matched_stop.filter(|_| reason == StopReason::EndTurn);
                    self.finish(reason, usage, matched_stop);
                }
                Some(Err(e)) => {
                    self.finished = true;
                    self.stream = None;
                    return Some(Err(e.into()));
                }
                None => {
                    self.finished = true;
                    self.stream = None;
                    return Some(Err(ApiError::internal("The engine ended the request without finishing it.")));
                }
            }
        }
    }

    /// Reads the whole reply: text, calls, and how it ended.
    pub async fn collect(mut self) -> Result<Collected, ApiError> {
        let mut out = Collected {
            reasoning: String::new(),
            num_reasoning_tokens: 0,
            text: String::new(),
            tool_calls: Vec::new(),
            reason: StopReason::EndTurn,
            usage: Usage::default(),
            matched_stop: None,
            logprobs: Vec::new(),
        };
        while let Some(item) = self.next().await {
            match item? {
                Output::Reasoning(t) => out.reasoning.push_str(&t),
                Output::Text(t) => out.text.push_str(&t),
                Output::ToolCall(c) => out.tool_calls.push(c),
                Output::Logprobs(l) => out.logprobs.extend(l),
                Output::ToolCallBegin { .. } | Output::ToolCallArgs(_) => {}
                Output::Done { reason, usage, matched_stop, num_reasoning_tokens } => {
                    out.num_reasoning_tokens = num_reasoning_tokens;
                    out.reason = reason;
                    out.usage = usage;
                    out.matched_stop = matched_stop;
                }
            }
        }
        Ok(out)
    }

    fn feed(&mut self, text: &str) {
        let content = match &mut self.reasoning {
            Some(r) => {
                let events = r.push(text);
                self.split_reasoning(events)
            }
            None => text.to_string(),
        };
        if let Some(f) = &mut self.forced_call {
            f.push(text, &mut self.pending);
        }
        // The lazy grammar's call starts are offsets in the whole output, reasoning included.
        if let Some(a) = &mut self.auto_calls {
            a.push(text, &mut self.pending);
        }
        self.feed_content(&content);
    }

    /// Queues the reasoning of `events`; returns their content.
    fn split_reasoning(&mut self, events: Vec<ReasoningEvent>) -> String {
        let mut content = String::new();
        for e in events {
            match e {
                ReasoningEvent::Reasoning(t) => self.pending.push_back(Output::Reasoning(t)),
                ReasoningEvent::Content(t) => content.push_str(&t),
            }
        }
        content
    }

    /// The output has ended: releases what the reasoning splitter holds.
    fn finish_reasoning(&mut self) {
        if let Some(r) = &mut self.reasoning {
            let events = r.finish();
            let content = self.split_reasoning(events);
            self.feed_content(&content);
        }
    }

    /// Counts a generated token as reasoning when it was written inside the reasoning (or ended it). Tokens of an
    /// undecided start count once the start is decided.
    fn count_reasoning_token(&mut self, was_reasoning: bool) {
        let Some(r) = &self.reasoning else { return };
        if r.is_undecided() {
            self.num_undecided_tokens += 1;
        } else if was_reasoning || r.in_reasoning() {
            self.num_reasoning_tokens += 1 + std::mem::take(&mut self.num_undecided_tokens);
        } else {
            self.num_undecided_tokens = 0;
        }
    }

    fn feed_content(&mut self, text: &str) {
        match &mut self.parser {
            Some(p) => {
                let events = p.push(text);
                self.take(events);
            }
            None if !text.is_empty() => self.pending.push_back(Output::Text(text.to_string())),
            None => {}
        }
    }

    fn take(&mut self, events: Vec<ParseEvent>) {
        let mut repeated = false;
        for e in events {
            match e {
                ParseEvent::Text(t) => self.pending.push_back(Output::Text(t)),
                ParseEvent::ToolCall(_) if (!self.parallel_tool_calls && self.num_calls > 0) || repeated => {}
                ParseEvent::ToolCall(c) => {
                    if let Some(f) = &mut self.forced_call {
                        f.finish(&mut self.pending);
                    }
                    // A call the reply already made, word for word: the model is looping (the small models repeat
                    // a call dozens of times in one reply). It still goes out (its start may have been streamed),
                    // and generation stops after it.
                    repeated = self.calls_made.iter().any(|(name, args)| *name == c.name && *args == c.arguments);
                    self.calls_made.push((c.name.clone(), c.arguments.clone()));
                    self.num_calls += 1;
                    self.pending.push_back(Output::ToolCall(c));
                }
            }
        }
        if (repeated || (!self.parallel_tool_calls && self.num_calls > 0)) && self.stream.is_some() {
            // One call is all the client wants, or the calls repeat: stop generating.
            let usage = self.cut_short();
            self.finish(StopReason::ToolCalls, usage, None);
        }
    }

    fn finish(&mut self, reason: StopReason, usage: Usage, matched_stop: Option<String>) {
        if !self.finished {
            let num_reasoning_tokens = self.num_reasoning_tokens;
            self.pending.push_back(Output::Done { reason, usage, matched_stop, num_reasoning_tokens });
            self.finished = true;
        }
    }

    /// Stops the engine's stream (which aborts the request) and returns the usage measured here, for a reply cut
    /// short before the engine's `Finished`.
    fn cut_short(&mut self) -> Usage {
        let cached_tokens = self.stream.take().map_or(0, |s| s.num_cached_tokens());
        let now = Instant::now();
        let first = self.t_first_token.unwrap_or(now);
        Usage {
            prompt_tokens: self.num_prompt_tokens,
            cached_tokens,
            completion_tokens: self.num_output_tokens,
            prefill_ms: (first - self.t_start).as_secs_f64() * 1000.0,
            decode_ms: (now - first).as_secs_f64() * 1000.0,
        }
    }
}

/// The arguments of the calls the lazy tool grammar holds (auto tool choice), streamed as they are generated. The
/// grammar (`lazy_call`) lists where each call starts and fixes its shape from there: `[<tool_call>] {"name": NAME,
/// "arguments": ARGS}` with JSON whitespace, so once `"arguments":` is written the name is known, and ARGS is an
/// object whose end is found by counting brackets outside strings. The output parser still reports each complete
/// call (`Output::ToolCall` then closes the streamed call).
#[derive(Debug)]
struct AutoCalls {
    starts: CallStarts,
    /// The output so far.
    text: String,
    /// Calls started (streamed or skipped) so far.
    num_seen: usize,
    state: AutoState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AutoState {
    /// Waiting for the next listed start.
    Idle,
    /// A call starts at this offset; its name and arguments key are not complete yet.
    Head { start: usize, tagged: bool },
    /// Streaming arguments: `sent` bytes of `text` are out (and scanned: the scanner holds the bracket depth).
    Args { sent: usize, scanner: JsonScanner },
}

impl AutoCalls {
    fn new(starts: CallStarts) -> Self {
        AutoCalls { starts, text: String::new(), num_seen: 0, state: AutoState::Idle }
    }

    fn push(&mut self, text: &str, out: &mut VecDeque<Output>) {
        self.text.push_str(text);
        loop {
            match self.state {
                AutoState::Idle => {
                    let next = self.starts.lock().unwrap_or_else(|e| e.into_inner()).get(self.num_seen).copied();
                    match next {
                        Some(s) if s.offset <= self.text.len() => {
                            self.num_seen += 1;
                            self.state = AutoState::Head { start: s.offset, tagged: s.tagged };
                        }
                        _ => return,
                    }
                }
                // (`get`: the offset counts the bytes the grammar saw; text that was not valid UTF-8 may have
                // been replaced here, and then the shape check below fails instead of slicing mid-character.)
                AutoState::Head { start, tagged } => {
                    match self.text.get(start..).map_or(Head::NotStreamable, |s| call_head(s, tagged)) {
                        Head::Incomplete => return,
                        Head::NotStreamable => self.state = AutoState::Idle,
                        Head::Args { name, offset } => {
                            out.push_back(Output::ToolCallBegin { name });
                            let at = start + offset;
                            self.state = AutoState::Args { sent: at, scanner: JsonScanner::default() };
                        }
                    }
                }
                AutoState::Args { sent, mut scanner } => {
                    // Everything past `sent` is unscanned: the scanner keeps its state between pieces.
                    let end = match scanner.feed(&self.text.as_bytes()[sent..]) {
                        JsonEnd::Closed(end) => Some(sent + end),
                        // (The grammar never lets this happen; end the arguments there rather than run on.)
                        JsonEnd::Stray(i) => Some(sent + i + 1),
                        JsonEnd::Open => None,
                    };
                    let upto = end.unwrap_or(self.text.len());
                    if upto > sent {
                        out.push_back(Output::ToolCallArgs(self.text[sent..upto].to_string()));
                    }
                    if end.is_some() {
                        self.state = AutoState::Idle;
                    } else {
                        self.state = AutoState::Args { sent: upto, scanner };
                        return;
                    }
                }
            }
        }
    }
}

/// What the start of a held call shows so far.
#[derive(Debug, PartialEq)]
enum Head {
    Incomplete,
    /// Not the `{"name": ..., "arguments": {` shape this streams (left to the output parser).
    NotStreamable,
    /// The name, and where the arguments object starts (offset of its `{`).
    Args {
        name: String,
        offset: usize,
    },
}

/// Reads `[<tool_call>] { "name" : "NAME" , "arguments" : {` (JSON whitespace anywhere) at the start of `s`.
fn call_head(s: &str, tagged: bool) -> Head {
    let b = s.as_bytes();
    let mut i = 0;
    let ws = |i: &mut usize| {
        while *i < b.len() && b[*i].is_ascii_whitespace() {
            *i += 1;
        }
    };
    // Expects `lit` at `i`: Some(true) matched, Some(false) mismatch, None too short.
    let lit = |i: &mut usize, lit: &[u8]| -> Option<bool> {
        let n = lit.len().min(b.len() - *i);
        if b[*i..*i + n] != lit[..n] {
            return Some(false);
        }
        if n < lit.len() {
            return None;
        }
        *i += n;
        Some(true)
    };
    macro_rules! expect {
        ($lit:expr) => {
            ws(&mut i);
            match lit(&mut i, $lit) {
                Some(true) => {}
                Some(false) => return Head::NotStreamable,
                None => return Head::Incomplete,
            }
        };
    }
    if tagged {
        expect!(b"<tool_call>");
    }
    expect!(b"{");
    expect!(b"\"name\"");
    expect!(b":");
    ws(&mut i);
    // The name: a JSON string.
    let Some(rest) = s.get(i..) else { return Head::Incomplete };
    let mut values = serde_json::Deserializer::from_str(rest).into_iter::<String>();
    let name = match values.next() {
        Some(Ok(name)) => name,
        Some(Err(e)) if e.is_eof() => return Head::Incomplete,
        None => return Head::Incomplete,
        Some(Err(_)) => return Head::NotStreamable,
    };
    i += values.byte_offset();
    expect!(b",");
    expect!(b"\"arguments\"");
    expect!(b":");
    ws(&mut i);
    match b.get(i) {
        None => Head::Incomplete,
        Some(b'{') => Head::Args { name, offset: i },
        Some(_) => Head::NotStreamable,
    }
}

/// Detects output that repeats itself exactly: the tail of the text is periodic (period up to
/// [`LoopGuard::MAX_PERIOD`] bytes) over at least `max_repeated_chars` bytes.
#[derive(Debug, Clone)]
pub struct LoopGuard {
    max_repeated_chars: usize,
    /// The last `max_repeated_chars + MAX_PERIOD` bytes of the output.
    tail: Vec<u8>,
}

impl LoopGuard {
    pub const MAX_PERIOD: usize = 512;

    pub fn new(max_repeated_chars: usize) -> Self {
        LoopGuard { max_repeated_chars: max_repeated_chars.max(1), tail: Vec::new() }
    }

    /// Adds output; true when the output now ends in a loop.
    pub fn push(&mut self, text: &str) -> bool {
        if text.is_empty() {
            return false;
        }
        self.tail.extend_from_slice(text.as_bytes());
        let keep = self.max_repeated_chars + Self::MAX_PERIOD;
        if self.tail.len() > 2 * keep {
            self.tail.drain(..self.tail.len() - keep);
        }
        let b = &self.tail;
        let n = b.len();
        (1..=Self::MAX_PERIOD.min(n / 2)).any(|p| {
            // Length of the periodic run ending at the end of the text.
            let run = (p..n).rev().take_while(|&i| b[i] == b[i - p]).count() + p;
            run >= self.max_repeated_chars && run >= 4 * p
        })
    }
}

/// A whole reply, for non-streaming responses.
#[derive(Debug, Clone, PartialEq)]
pub struct Collected {
    /// A thinking model's reasoning (empty for other models).
    pub reasoning: String,
    /// The generated tokens that were reasoning.
    pub num_reasoning_tokens: usize,
    pub text: String,
    pub tool_calls: Vec<ToolCall>,
    pub reason: StopReason,
    pub usage: Usage,
    /// The stop string that ended the reply.
    pub matched_stop: Option<String>,
    /// Per generated token, when the request asked for log-probabilities.
    pub logprobs: Vec<TokenLogprob>,
}

/// A random id with a protocol's prefix: `call_3f9a…`.
pub fn random_id(prefix: &str) -> String {
    format!("{prefix}{:016x}{:08x}", rand::random::<u64>(), rand::random::<u32>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forced_call_streams_exactly_the_arguments_at_any_split() {
        let args = r#"{"path": "src/ü.rs", "content": "fn main() {}\n}"}"#;
        let text = format!("{{\"name\": \"write_file\", \"arguments\": {args}}}\n</tool_call>");
        let run = |pieces: &[&str]| {
            let mut f = ForcedCall::default();
            let mut out = VecDeque::new();
            for p in pieces {
                f.push(p, &mut out);
            }
            f.finish(&mut out);
            let mut name = None;
            let mut joined = String::new();
            for o in out {
                match o {
                    Output::ToolCallBegin { name: n } => {
                        assert!(name.is_none() && joined.is_empty(), "begin comes first, once");
                        name = Some(n);
                    }
                    Output::ToolCallArgs(a) => joined.push_str(&a),
                    other => panic!("unexpected {other:?}"),
                }
            }
            (name, joined)
        };
        let want = (Some("write_file".to_string()), args.to_string());
        assert_eq!(run(&[&text]), want);
        for i in (1..text.len()).filter(|&i| text.is_char_boundary(i)) {
            assert_eq!(run(&[&text[..i], &text[i..]]), want, "split at {i}");
        }
        let chars: Vec<String> = text.chars().map(String::from).collect();
        assert_eq!(run(&chars.iter().map(String::as_str).collect::<Vec<_>>()), want, "one char at a time");
    }

    /// Runs `AutoCalls` over `pieces` with the call starts the grammar would list; returns (name, joined arguments)
    /// per streamed call, checking that each call's name comes before its arguments.
    fn auto_calls(starts: &[(usize, bool)], pieces: &[&str]) -> Vec<(String, String)> {
        let shared = CallStarts::default();
        let mut a = AutoCalls::new(shared.clone());
        let mut out = VecDeque::new();
        let mut seen = 0;
        for p in pieces {
            // The engine lists a start before the reply sees its text.
            seen += p.len();
            let mut list = shared.lock().unwrap();
            for &(offset, tagged) in starts {
                let start = crate::lazy_call::CallStart { offset, tagged };
                if offset < seen && !list.contains(&start) {
                    list.push(start);
                }
            }
            drop(list);
            a.push(p, &mut out);
        }
        let mut calls: Vec<(String, String)> = Vec::new();
        for o in out {
            match o {
                Output::ToolCallBegin { name } => calls.push((name, String::new())),
                Output::ToolCallArgs(x) => calls.last_mut().expect("begin comes first").1.push_str(&x),
                other => panic!("unexpected {other:?}"),
            }
        }
        calls
    }

    #[test]
    fn auto_calls_stream_exactly_the_arguments_at_any_split() {
        let args1 = "{\n    \"file_path\": \"a/ü.txt\",\n    \"content\": \"}{ \\\" ]\"\n  }";
        let args2 = r#"{"command": "ls", "env": {"A": [1, {"b": 2}]}}"#;
        let text = format!(
            "Sure.\n```json\n{{\n  \"name\": \"Write\",\n  \"arguments\": {args1}\n}}\n```\n<tool_call>\n{{\"name\": \"Bash\", \"arguments\": {args2}}}\n</tool_call>"
        );
        let first = text.find('{').unwrap();
        let second = text.find("<tool_call>").unwrap();
        let starts = [(first, false), (second, true)];
        let want = vec![("Write".to_string(), args1.to_string()), ("Bash".to_string(), args2.to_string())];
        assert_eq!(auto_calls(&starts, &[&text]), want);
        for i in (1..text.len()).filter(|&i| text.is_char_boundary(i)) {
            assert_eq!(auto_calls(&starts, &[&text[..i], &text[i..]]), want, "split at {i}");
        }
        let chars: Vec<String> = text.chars().map(String::from).collect();
        assert_eq!(auto_calls(&starts, &chars.iter().map(String::as_str).collect::<Vec<_>>()), want);
        // A held call in another shape (arguments first) is left to the output parser.
        let odd = "{\"arguments\": {}, \"name\": \"Bash\"}";
        assert!(auto_calls(&[(0, false)], &[odd]).is_empty());
    }

    #[test]
    fn loop_guard_trips_on_exact_repetition_only() {
        let mut g = LoopGuard::new(200);
        let prose = "The quick brown fox jumps over the lazy dog while the cat sleeps. ";
        let varied: String = (0..40).map(|i| format!("{prose}{i}\n")).collect();
        assert!(!g.push(&varied), "text with a counter is not a loop");
        let line = "A thousand times,\n";
        let mut tripped_after = None;
        for i in 0..100 {
            if g.push(line) {
                tripped_after = Some(i);
                break;
            }
        }
        let n = tripped_after.expect("a repeated line trips the guard");
        assert!((n + 1) * line.len() >= 200 && n * line.len() < 200 + line.len(), "{n}");
        let mut g = LoopGuard::new(64);
        assert!(g.push(&"ab".repeat(40)));
        let mut g = LoopGuard::new(64);
        assert!(!g.push(&"ab".repeat(20)));
    }
}
