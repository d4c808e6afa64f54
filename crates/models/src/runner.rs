//! The contract between the engine and a model on a backend: run one batch of token chunks, get logits back.
//!
//! A batch holds chunks from any number of sequences: a prefill chunk, a single decode token, or k+1 rows to verify
//! speculative tokens. The runner owns each sequence's KV cache; `truncate` rolls it back (rejected draft tokens) and
//! `release` frees it.

use crate::{ModelConfig, Result};

/// Identifies a sequence (one generation stream) across batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u64);

impl std::fmt::Display for SeqId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// Which rows of a chunk need logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitsWanted {
    None,
    Last,
    All,
}

/// Tokens of one sequence to append at `start_pos`, which must equal the sequence's current length.
#[derive(Debug, Clone)]
pub struct SeqChunk<'a> {
    pub seq: SeqId,
    pub tokens: &'a [u32],
    pub start_pos: usize,
    pub logits: LogitsWanted,
}

impl SeqChunk<'_> {
    pub fn num_logit_rows(&self) -> usize {
        match self.logits {
            LogitsWanted::None => 0,
            LogitsWanted::Last => usize::from(!self.tokens.is_empty()),
            LogitsWanted::All => self.tokens.len(),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct Batch<'a> {
    pub chunks: Vec<SeqChunk<'a>>,
}

impl Batch<'_> {
    pub fn num_tokens(&self) -> usize {
        self.chunks.iter().map(|c| c.tokens.len()).sum()
    }

    pub fn num_logit_rows(&self) -> usize {
        self.chunks.iter().map(|c| c.num_logit_rows()).sum()
    }
}

pub trait Runner: Send {
    fn config(&self) -> &ModelConfig;

    /// Runs the batch. Returns `[batch.num_logit_rows(), vocab_size]` logits, rows in chunk order. On error no
    /// sequence has changed.
    fn forward(&mut self, batch: &Batch<'_>) -> Result<&[f32]>;

    /// Number of tokens held for `seq` (0 for an unknown sequence).
    fn seq_len(&self, seq: SeqId) -> usize;

    /// Drops the cached state of `seq` past its first `len` tokens.
    fn truncate(&mut self, seq: SeqId, len: usize);

    /// Frees everything held for `seq`.
    fn release(&mut self, seq: SeqId);

    /// Starts `seq` (which must hold nothing yet) with the cached KV of the longest prefix of `tokens` that the
    /// runner still has from earlier sequences; returns how many tokens that covers (0 without a prefix cache).
    fn attach_prefix(&mut self, _seq: SeqId, _tokens: &[u32]) -> usize {
        0
    }

    /// Background work while no request runs (e.g. writing cached prefix blocks to disk), a little at a time; true
    /// if more remains.
    fn idle_work(&mut self) -> bool {
        false
    }

    /// KV cache occupancy and prefix-cache counters.
    fn kv_usage(&self) -> crate::KvUsage {
        crate::KvUsage::default()
    }
}
