//! The protocol-neutral path of a chat request: [`ChatTurn`] in, a stream of [`Output`]s out.
//!
//! Every protocol adapter converts its wire request into a [`ChatTurn`] (a `chat::Conversation` plus tool choice,
//! sampling, limits and stop strings), calls [`start`], and renders the [`Reply`]'s outputs in its own shape. Here the
//! conversation is rendered with the model's chat template and tokenized into an `engine::GenerateRequest`; the
//! engine's token events go through the one output pipeline on the way back: for a thinking model (its template
//! writes `<think>` … `</think>`) the reasoning is split off first (`chat::ReasoningParser`), then the content goes
//! through the output parser (text / tool calls). No protocol types appear in this module.
//!
//! The work is split by job: [`prepare`] (template, tokenizer, constraints: the engine request), [`reply`] (the
//! output pipeline of a running request) and `calls` (streaming the arguments of tool calls as they are written).

use serde_json::Value;

use chat::{Conversation, ToolCall};
use engine::{SamplingParams, Usage};

pub use crate::constraint::OutputFormat;

mod calls;
pub mod prepare;
pub mod reply;

pub use prepare::{Prepared, Rendered, encode_prompt, prepare, render};
pub use reply::{LoopGuard, Reply, start};

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
    pub template_kwargs: serde_json::Map<String, Value>,
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
