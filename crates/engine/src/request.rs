//! The one internal request type every API adapter translates into, and the events a request produces.

use crate::sampler::SamplingParams;

/// Identifies a request inside the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// Restricts which tokens may come next (structured output, forced tool calls). Called on the engine thread, once
/// per generated token: `allowed_tokens` before sampling, `commit` with the token chosen.
pub trait TokenConstraint: Send {
    /// Clears the bits of the tokens that may not come next in `allowed` (bit `t % 32` of word `t / 32` is token `t`;
    /// every bit starts set).
    fn allowed_tokens(&mut self, allowed: &mut [u32]) -> Result<(), String>;
    /// Advances past `token`.
    fn commit(&mut self, token: u32) -> Result<(), String>;
    /// The output is complete: nothing more may follow, and generation stops.
    fn is_finished(&self) -> bool;
    /// The constraint allows every token now and only watches the output (a lazy grammar waiting for its trigger):
    /// the engine may skip the mask and speculate, committing every accepted token in order. A constraint that
    /// wakes up on a committed token masks from the next position on.
    fn is_dormant(&self) -> bool {
        false
    }
}

/// A generation request: token ids in, tokens and text out. Knows nothing about HTTP or chat formats.
pub struct GenerateRequest {
    pub prompt: Vec<u32>,
    pub sampling: SamplingParams,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Generation ends before any of these strings; the string itself is not output.
    pub stop_strings: Vec<String>,
    /// Generation ends at any of these tokens (in addition to the model's end-of-generation tokens).
    pub stop_tokens: Vec<u32>,
    /// Keep going past the model's end-of-generation tokens.
    pub ignore_eos: bool,
    /// Limits the output to what this constraint allows (e.g. a JSON schema). Requests with a constraint are not
    /// speculated.
    pub constraint: Option<Box<dyn TokenConstraint>>,
}

impl std::fmt::Debug for GenerateRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GenerateRequest")
            .field("prompt_tokens", &self.prompt.len())
            .field("sampling", &self.sampling)
            .field("max_tokens", &self.max_tokens)
            .field("stop_strings", &self.stop_strings)
            .field("stop_tokens", &self.stop_tokens)
            .field("ignore_eos", &self.ignore_eos)
            .field("constraint", &self.constraint.is_some())
            .finish()
    }
}

impl GenerateRequest {
    pub fn new(prompt: Vec<u32>, sampling: SamplingParams, max_tokens: usize) -> Self {
        GenerateRequest {
            prompt,
            sampling,
            max_tokens,
            stop_strings: Vec::new(),
            stop_tokens: Vec::new(),
            ignore_eos: false,
            constraint: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token, a stop token, a stop string, or the output constraint is complete (or could not
    /// continue: no token allowed).
    Stop,
    /// `max_tokens` reached, or the model's context is full.
    Length,
    /// Cancelled by the caller.
    Aborted,
}

/// Token counts and timings of a finished request.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    pub prompt_tokens: usize,
    /// Prompt tokens whose KV came from the prefix cache instead of being computed.
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    /// From admission to the first sampled token.
    pub prefill_ms: f64,
    /// From the first sampled token to the last.
    pub decode_ms: f64,
}

impl Usage {
    pub fn prefill_tok_s(&self) -> f64 {
        self.prompt_tokens as f64 / (self.prefill_ms / 1000.0).max(1e-9)
    }

    /// Decode speed over the tokens after the first (the first comes out of prefill).
    pub fn decode_tok_s(&self) -> f64 {
        self.completion_tokens.saturating_sub(1) as f64 / (self.decode_ms / 1000.0).max(1e-9)
    }
}

/// Log-probabilities of a generated token under the model (log-softmax of the raw logits, before penalties and
/// temperature), with the most likely alternatives.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    pub logprob: f32,
    /// The `SamplingParams::logprobs` most likely tokens, most likely first.
    pub top: Vec<(u32, f32)>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A generated token and the text it completes (may be empty while a UTF-8 sequence or a possible stop string
    /// is incomplete). `logprobs` is set when the request asked for them.
    Token { id: u32, text: String, logprobs: Option<TokenLogprobs> },
    /// The request is done; no more events follow. `matched_stop` is the stop string that ended it, if one did.
    Finished { reason: FinishReason, text: String, usage: Usage, matched_stop: Option<String> },
}
