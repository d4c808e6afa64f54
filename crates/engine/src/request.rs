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

/// A generation request: token ids in, tokens and text out. Knows nothing about HTTP or chat formats.
#[derive(Debug, Clone)]
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
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token, a stop token or a stop string.
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

#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A generated token and the text it completes (may be empty while a UTF-8 sequence or a possible stop string
    /// is incomplete).
    Token { id: u32, text: String },
    /// The request is done; no more events follow.
    Finished { reason: FinishReason, text: String, usage: Usage },
}
