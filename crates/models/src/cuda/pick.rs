//! What a pass ends with besides its logits, picked on the device: each row's argmax (and its probability), each
//! row's largest logits for top-k sampling, and decode ahead (a lone greedy sequence's next step enqueued before its
//! pick comes back, fed with it on the device).

use super::fused::{Pick, event_err};
use super::runner::Ahead;
use super::{CudaRunner, DEVICE_CANDIDATES, TOPK_BLOCKS};
use crate::{Batch, Error, LogitsWanted, Result, Runner, SeqId};

/// The logit a `topk_rows` key came from (`fkey` in the kernels: its `total_cmp` order as an unsigned number), bit
/// for bit.
fn from_total_key(k: u32) -> f32 {
    f32::from_bits(if k & 0x8000_0000 != 0 { k & 0x7FFF_FFFF } else { !k })
}

/// The `n` largest of a row from its segments' lists (`words`: the lists of `c` keys each, as little-endian pairs of
/// u32; each list sorted descending, 0 padding): largest first, ties in id order, as [`crate::top_candidates`].
pub(super) fn merge_segment_keys(words: &[u32], c: usize, n: usize) -> Vec<(u32, f32)> {
    let lists: Vec<Vec<u64>> = words
        .chunks_exact(2 * c)
        .map(|l| l.chunks_exact(2).map(|w| w[0] as u64 | (w[1] as u64) << 32).take_while(|&k| k != 0).collect())
        .collect();
    let mut at = vec![0usize; lists.len()];
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let best = (0..lists.len()).filter(|&b| at[b] < lists[b].len()).max_by_key(|&b| lists[b][at[b]]);
        let Some(b) = best else { break };
        let key = lists[b][at[b]];
        at[b] += 1;
        out.push((!(key as u32), from_total_key((key >> 32) as u32)));
    }
    out
}

impl CudaRunner {
    /// Enqueues position `pos` of `seq` behind the pass in the stream, fed with that pass's pick ([`Ahead`]). Nothing
    /// when the sequence may not grow (its context or the KV cache is full): a call for that step then runs it and
    /// reports why it cannot.
    pub(super) fn start_ahead(&mut self, seq: SeqId, pos: usize) -> Result<()> {
        let fed_on_device = [0u32];
        let chunk = crate::SeqChunk { seq, tokens: &fed_on_device, start_pos: pos, logits: LogitsWanted::Last };
        let next = Batch { chunks: vec![chunk] };
        if self.validate(&next).is_err() {
            return Ok(());
        }
        self.run(&next, true, Pick::Argmax)?;
        self.ahead_done[pos % 2].record(&self.backend.gpu.stream).map_err(event_err)?;
        self.ahead = Some(Ahead { seq, pos, token: u32::MAX });
        Ok(())
    }

    /// The pass started ahead, when `batch` is exactly its step (one chunk: its sequence, the pick it was fed, its
    /// position, a logit row): it counts from now, and its position is returned (its pick: [`Self::ring_pick`]).
    /// Otherwise it stays where it is (any later pass drops it).
    pub(super) fn take_ahead(&mut self, batch: &Batch<'_>) -> Option<usize> {
        let a = self.ahead.as_ref()?;
        let [c] = batch.chunks.as_slice() else { return None };
        let same = c.seq == a.seq
            && c.start_pos == a.pos
            && c.tokens == [a.token]
            && c.logits != LogitsWanted::None
            && self.seq_len(a.seq) == a.pos;
        if !same {
            return None;
        }
        let pos = a.pos;
        self.ahead = None;
        self.table.commit(c.seq, c.tokens);
        Some(pos)
    }

    /// The pick of the one-row pass at position `pos` once it is done (`ahead_done[pos % 2]` recorded after it),
    /// from the ring `argmax_rows` writes.
    pub(super) fn ring_pick(&self, pos: usize) -> Result<u32> {
        self.ahead_done[pos % 2].synchronize().map_err(event_err)?;
        // A little-endian u64: the pick, then the position. (The next pass may be writing the other slot.)
        let ring = &self.backend.ahead_ring;
        let (pick, at) = (ring.read_volatile(2 * (pos % 2)), ring.read_volatile(2 * (pos % 2) + 1));
        if at as usize != pos {
            return Err(Error::Backend(format!("decode ahead: no pick for position {pos} (found {at})")));
        }
        Ok(pick)
    }

    /// The greedy token of each logit row, picked on the device (`argmax_rows` at the end of the graph): one u32
    /// per row comes back instead of the row's logits.
    pub(super) fn picks_argmax(&mut self, batch: &Batch<'_>) -> Result<Vec<u32>> {
        if let Some(pos) = self.take_ahead(batch) {
            return Ok(vec![self.ring_pick(pos)?]);
        }
        let r = self.run(batch, false, Pick::Argmax)?;
        let mut ids = vec![0u32; r];
        let b = &self.backend;
        if r > 0 {
            b.gpu.dtoh(&mut ids, b.scratch().ids.ptr)?;
        } else {
            b.gpu.sync()?;
        }
        Ok(ids)
    }

    /// Decode ahead: one sequence's single token is run (or found under way, started by the call before), the next
    /// position is enqueued behind it, fed on the device with this pick ([`Ahead`]), and only then is this pick
    /// waited for. The GPU goes from one step to the next without waiting for the host.
    pub(super) fn picks_argmax_ahead(&mut self, batch: &Batch<'_>) -> Result<Vec<u32>> {
        let one = match batch.chunks.as_slice() {
            [c] if c.tokens.len() == 1 && c.logits != LogitsWanted::None => Some(c),
            _ => None,
        };
        let Some(c) = one.filter(|_| self.backend.opts.ahead && self.backend.step_timer.is_none()) else {
            return self.picks_argmax(batch);
        };
        let (seq, pos) = (c.seq, c.start_pos);
        if self.take_ahead(batch).is_none() {
            self.run(batch, false, Pick::Argmax)?;
            self.ahead_done[pos % 2].record(&self.backend.gpu.stream).map_err(event_err)?;
        }
        self.start_ahead(seq, pos + 1)?;
        let pick = self.ring_pick(pos)?;
        if let Some(a) = self.ahead.as_mut() {
            a.token = pick;
        }
        Ok(vec![pick])
    }

    /// The greedy token of each logit row and its softmax probability, both computed on the device (`argmax_rows`
    /// with its second pass over the row): two values per row come back instead of the logits.
    pub(super) fn picks_top(&mut self, batch: &Batch<'_>) -> Result<Vec<(u32, f32)>> {
        let r = self.run(batch, false, Pick::Top)?;
        let mut ids = vec![0u32; r];
        let mut probs = vec![0f32; r];
        let b = &self.backend;
        if r > 0 {
            b.gpu.dtoh(&mut ids, b.scratch().ids.ptr)?;
            b.gpu.dtoh(&mut probs, b.scratch().probs.ptr)?;
        } else {
            b.gpu.sync()?;
        }
        Ok(ids.into_iter().zip(probs).collect())
    }

    /// Each row's `n` largest logits, selected on the device (`topk_rows` at the end of the graph) when `n` is at
    /// most [`DEVICE_CANDIDATES`]: `n` pairs per row come back instead of the row. A row the device could not select
    /// from (more than 2,048 logits tied at its threshold) and a larger `n` are selected on the host from the copied
    /// logits; the pairs are the same either way ([`crate::top_candidates`]).
    pub(super) fn picks_candidates(&mut self, batch: &Batch<'_>, n: usize) -> Result<Vec<Vec<(u32, f32)>>> {
        let vocab = self.cfg.vocab_size;
        if n > DEVICE_CANDIDATES || !self.backend.opts.device_candidates {
            return Ok(self.forward(batch)?.chunks_exact(vocab).map(|row| crate::top_candidates(row, n)).collect());
        }
        let r = self.run(batch, false, Pick::Candidates)?;
        let c = DEVICE_CANDIDATES.min(vocab);
        let (gpu, cand, logits_at) = (&self.backend.gpu, self.backend.scratch().cand.ptr, self.model.logits().buf.ptr);
        if r == 0 {
            gpu.sync()?;
            return Ok(Vec::new());
        }
        let mut buf = vec![0u32; r * TOPK_BLOCKS * (1 + 2 * c)];
        gpu.dtoh(&mut buf, cand)?;
        let (flags, keys) = buf.split_at(r * TOPK_BLOCKS);
        let mut out = Vec::with_capacity(r);
        for row in 0..r {
            if flags[row * TOPK_BLOCKS..(row + 1) * TOPK_BLOCKS].iter().any(|&f| f != 0) {
                self.host_selected += 1;
                let mut logits = vec![0f32; vocab];
                gpu.dtoh(&mut logits, logits_at + (row * vocab * 4) as u64)?;
                out.push(crate::top_candidates(&logits, n));
            } else {
                out.push(merge_segment_keys(&keys[row * TOPK_BLOCKS * 2 * c..(row + 1) * TOPK_BLOCKS * 2 * c], c, n));
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `fkey` of the kernels.
    fn total_key(v: f32) -> u32 {
        let b = v.to_bits();
        if b & 0x8000_0000 != 0 { !b } else { b | 0x8000_0000 }
    }

    /// The host's half of `topk_rows`: each segment's largest keys (made here as the kernel makes them) merge into
    /// the row's largest logits, the same pairs and bits as `top_candidates`; keys give back their logits' bits.
    #[test]
    fn segment_lists_merge_into_the_rows_largest_logits() {
        for v in [0.0f32, -0.0, 1.5, -1.5, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, -f32::NAN, f32::MIN_POSITIVE] {
            assert_eq!(from_total_key(total_key(v)).to_bits(), v.to_bits());
        }
        let mut x = 0x1234_5678u64;
        let mut next = || {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (x >> 33) as u32
        };
        for (len, blocks, c) in [(151_936usize, 8usize, 256usize), (1000, 8, 64), (300, 8, 64), (20, 8, 16)] {
            let row: Vec<f32> = (0..len)
                .map(|_| if next() % 3 == 0 { (next() % 5) as f32 } else { next() as f32 / 1e9 - 2.0 })
                .collect();
            let seg = len.div_ceil(blocks);
            let mut words = Vec::new();
            for b in 0..blocks {
                let (s0, s1) = ((b * seg).min(len), ((b + 1) * seg).min(len));
                let top = crate::top_candidates(&row[s0..s1], c);
                for j in 0..c {
                    let key = top.get(j).map_or(0u64, |&(i, v)| (total_key(v) as u64) << 32 | !(s0 as u32 + i) as u64);
                    words.extend([key as u32, (key >> 32) as u32]);
                }
            }
            for n in [1, 20, c.min(len)] {
                let got = merge_segment_keys(&words, c, n);
                let want = crate::top_candidates(&row, n);
                let bits = |v: &[(u32, f32)]| v.iter().map(|&(i, l)| (i, l.to_bits())).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "len {len} n {n}");
            }
        }
    }
}
