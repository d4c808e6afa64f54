//! The contract between the engine and a model on a backend: run one batch of token chunks, get logits back.
//!
//! A batch holds chunks from any number of sequences: a prefill chunk, a single decode token, or k+1 rows to verify
//! speculative tokens. The runner owns each sequence's KV cache; `truncate` rolls it back (rejected draft tokens) and
//! `release` frees it.

use crate::{Error, ModelConfig, Result};

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

    /// The checks every runner makes before changing anything: each sequence at most once, each chunk starting at
    /// its sequence's length (`seq_len`), within the context, with tokens inside the vocabulary.
    pub fn validate(&self, cfg: &ModelConfig, seq_len: impl Fn(SeqId) -> usize) -> Result<()> {
        let mut ids: Vec<SeqId> = self.chunks.iter().map(|c| c.seq).collect();
        ids.sort();
        if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
            return Err(Error::DuplicateSeq(w[0].0));
        }
        for c in &self.chunks {
            let len = seq_len(c.seq);
            if c.start_pos != len {
                return Err(Error::BadPosition { seq: c.seq.0, start: c.start_pos, len });
            }
            if len + c.tokens.len() > cfg.max_context {
                return Err(Error::ContextOverflow(c.seq.0, cfg.max_context));
            }
            if let Some(&t) = c.tokens.iter().find(|&&t| t as usize >= cfg.vocab_size) {
                return Err(Error::BadToken(t));
            }
        }
        Ok(())
    }
}

/// Index of the largest value (the first on ties; NaN never wins; 0 for an empty slice).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// The largest logit's index (as [`argmax`]) and its softmax probability: how sure a greedy pick is.
pub fn top_prob(logits: &[f32]) -> (u32, f32) {
    let best = argmax(logits);
    let Some(&max) = logits.get(best as usize) else { return (0, 0.0) };
    // The maximum's own term is exactly 1, so the sum is at least 1 (a NaN row gives NaN, "not sure").
    (best, 1.0 / backend::cpu::ops::sum_exp(logits, max))
}

/// The `n` largest logits of a row as (id, logit), largest first, ties in id order: the order of
/// `f32::total_cmp` (NaN above +inf, -0.0 below +0.0), so the same list whatever finds it (the sampler here, a
/// device's `topk_rows`). One pass with a threshold: candidates go to a buffer only when they beat the n-th best of
/// those kept so far, and the buffer is cut back to `n` when it fills.
pub fn top_candidates(logits: &[f32], n: usize) -> Vec<(u32, f32)> {
    let n = n.min(logits.len());
    let order = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    let mut buf: Vec<(u32, f32)> = Vec::with_capacity(if n == 0 { 0 } else { 4 * n });
    if n == 0 {
        return buf;
    }
    // Ids only grow, so a later logit equal to the threshold ranks below it: only strictly larger ones enter.
    let mut threshold: Option<f32> = None;
    for (i, &l) in logits.iter().enumerate() {
        if threshold.is_some_and(|t| l.total_cmp(&t).is_le()) {
            continue;
        }
        buf.push((i as u32, l));
        if buf.len() == buf.capacity() {
            buf.select_nth_unstable_by(n - 1, order);
            buf.truncate(n);
            threshold = Some(buf[n - 1].1);
        }
    }
    if buf.len() > n {
        buf.select_nth_unstable_by(n - 1, order);
        buf.truncate(n);
    }
    buf.sort_unstable_by(order);
    buf
}

/// What a caller knows of the step after a greedy one ([`Runner::forward_argmax_then`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NextStep {
    /// Nothing known, or nothing follows (the output limit).
    Unknown,
    /// Each sequence of the batch comes back with this step's pick as its one token, at the next position (greedy
    /// decoding that goes on, with no draft tokens that could lengthen the step).
    FedPicks,
}

pub trait Runner: Send {
    fn config(&self) -> &ModelConfig;

    /// Runs the batch. Returns `[batch.num_logit_rows(), logits_width()]` logits, rows in chunk order. On error no
    /// sequence has changed.
    fn forward(&mut self, batch: &Batch<'_>) -> Result<&[f32]>;

    /// Runs the batch like [`Runner::forward`] and returns, per logit row, the index of its largest logit (the
    /// first on ties, as [`argmax`]): greedy decoding. Runners on a GPU pick it there and copy back one id per row
    /// instead of the logits.
    fn forward_argmax(&mut self, batch: &Batch<'_>) -> Result<Vec<u32>> {
        let width = self.logits_width().max(1);
        Ok(self.forward(batch)?.chunks_exact(width).map(argmax).collect())
    }

    /// Runs the batch like [`Runner::forward_argmax`], told what the caller will ask for next ([`NextStep`]). How to
    /// use that is the runner's: the CUDA one, when the batch is one sequence's next token and its pick is fed back,
    /// starts that step before this pick comes back, fed with it on the device, so that the GPU does not wait for
    /// the host between steps (decode ahead). A next call whose batch is exactly that step finds it under way; any
    /// other call drops it, and nothing of it is kept (the sequence's length counts only the steps asked for).
    fn forward_argmax_then(&mut self, batch: &Batch<'_>, next: NextStep) -> Result<Vec<u32>> {
        let _ = next;
        self.forward_argmax(batch)
    }

    /// Runs the batch like [`Runner::forward_argmax`] and also returns each pick's softmax probability
    /// ([`top_prob`]): a greedy draft's confidence, from which the engine decides how far to draft.
    fn forward_top(&mut self, batch: &Batch<'_>) -> Result<Vec<(u32, f32)>> {
        let width = self.logits_width().max(1);
        Ok(self.forward(batch)?.chunks_exact(width).map(top_prob).collect())
    }

    /// Runs the batch like [`Runner::forward`] and returns, per logit row, its `n` largest logits as (id, logit)
    /// ([`top_candidates`]: largest first, ties in id order): what a sampler with a top-k limit needs. Runners on a
    /// GPU select them there and copy back `n` pairs per row instead of the whole row.
    fn forward_candidates(&mut self, batch: &Batch<'_>, n: usize) -> Result<Vec<Vec<(u32, f32)>>> {
        let width = self.logits_width().max(1);
        Ok(self.forward(batch)?.chunks_exact(width).map(|row| top_candidates(row, n)).collect())
    }

    /// Whether [`Runner::forward_top`] costs about what [`Runner::forward_argmax`] does: true where the logits are on
    /// the host anyway. A runner that picks on a device and would have to copy the logits back for the probability
    /// says false, and the engine then drafts without confidences.
    fn top_prob_is_cheap(&self) -> bool {
        true
    }

    /// Logits per row that [`Runner::forward`] returns: the vocabulary, or up to the largest id kept by
    /// [`Runner::limit_logits`].
    fn logits_width(&self) -> usize {
        self.config().vocab_size
    }

    /// Computes logits only for `n` token ids: a draft model's output head over the most common tokens
    /// ([`crate::draft_head::head_ids`]; `n` 0 or past the vocabulary means all). [`Runner::forward`] still returns
    /// rows indexed by token id, `-inf` for the ids left out; the picks of [`Runner::forward_argmax`] and
    /// [`Runner::forward_top`] come from the computed ids alone. Returns the new [`Runner::logits_width`] (the largest
    /// computed id + 1). Runners that cannot narrow the head keep all of it.
    fn limit_logits(&mut self, _n: usize) -> usize {
        self.logits_width()
    }

    /// Asks every later pass to keep the hidden rows (the residual stream) after each of `layers` (0-based; the
    /// last layer's output is `num_layers - 1`) for every token of its batch, for a proposer that drafts from the
    /// target's own states (an MTP head, a block drafter); empty asks for none. An error when a layer is out of
    /// range or the runner cannot keep them; runners that cannot keep any say so for every non-empty list.
    fn set_hidden_layers(&mut self, layers: &[usize]) -> Result<()> {
        match layers {
            [] => Ok(()),
            _ => Err(Error::Unsupported("this runner keeps no hidden rows".into())),
        }
    }

    /// The hidden rows the last pass kept ([`Runner::set_hidden_layers`]): `[layers][batch.num_tokens()][hidden]`,
    /// layer-major in the order asked, tokens in chunk order. Empty when none were asked for.
    fn hidden_rows(&self) -> &[f32] {
        &[]
    }

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

#[cfg(test)]
mod tests {
    /// The first of equal maxima wins, NaN never wins, an empty row gives 0 (what `argmax_rows` on the GPU does).
    #[test]
    fn argmax_takes_the_first_maximum() {
        assert_eq!(super::argmax(&[1.0, 3.0, -2.0, 3.0]), 1);
        assert_eq!(super::argmax(&[f32::NEG_INFINITY, f32::NAN, 0.5, f32::NAN]), 2);
        assert_eq!(super::argmax(&[]), 0);
        assert_eq!(super::argmax(&[-1.0, -1.0]), 0);
    }

    /// The candidates are the first `n` of the row sorted by (logit descending in `total_cmp` order, id), on rows
    /// with ties, NaN, infinities and signed zeros, for `n` from 0 to past the row's length.
    #[test]
    fn top_candidates_are_the_sorted_rows_head() {
        let mut x = 0x9E37_79B9u64;
        let mut next = || {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (x >> 33) as u32
        };
        for len in [0usize, 1, 5, 37, 1000, 5000] {
            let row: Vec<f32> = (0..len)
                .map(|_| match next() % 50 {
                    0 => f32::NAN,
                    1 => f32::NEG_INFINITY,
                    2 => f32::INFINITY,
                    3 => -0.0,
                    4 => 0.0,
                    // Few distinct values: many ties.
                    k if k < 25 => (next() % 8) as f32,
                    _ => (next() % 100_000) as f32 / 1000.0 - 50.0,
                })
                .collect();
            let mut sorted: Vec<(u32, f32)> = row.iter().enumerate().map(|(i, &l)| (i as u32, l)).collect();
            sorted.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            for n in [0usize, 1, 2, 20, 84, 256, len, len + 3] {
                let got = super::top_candidates(&row, n);
                let want = &sorted[..n.min(len)];
                assert_eq!(got.len(), want.len(), "len {len} n {n}");
                for (g, w) in got.iter().zip(want) {
                    assert_eq!((g.0, g.1.to_bits()), (w.0, w.1.to_bits()), "len {len} n {n}");
                }
            }
        }
    }

    /// The pick is the argmax and its probability the softmax's (checked in f64).
    #[test]
    fn top_prob_is_the_softmax_of_the_argmax() {
        let logits = [0.5f32, 2.0, -1.0, 2.0, 1.25];
        let (t, p) = super::top_prob(&logits);
        let z: f64 = logits.iter().map(|&l| (l as f64 - 2.0).exp()).sum();
        assert_eq!(t, 1);
        assert!((p as f64 - 1.0 / z).abs() < 1e-6, "{p}");
        assert_eq!(super::top_prob(&[7.0]), (0, 1.0));
        assert_eq!(super::top_prob(&[]), (0, 0.0));
    }
}
