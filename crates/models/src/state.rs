//! Per-sequence recurrent state of the hybrid models (Gated DeltaNet layers), kept beside the sequence's KV blocks,
//! and its exact checkpoints.
//!
//! A recurrent state cannot be cut back to a shorter prefix, so this module keeps copies of it at chosen token
//! boundaries, taken inside the forward pass itself ([`backend::StateSnapshot`], bitwise the state after that row):
//! - **checkpoints** at block boundaries, keyed by the chained hash of the KV block ending there
//!   (`kv_cache::BlockTable`): every [`StateCache::set_checkpoint_every`] tokens of a prefill, at the end of each
//!   prompt (the last two boundaries before its last token, which the engine always recomputes: "before the reply";
//!   a prompt ends with its sequence's first chunk that wants logits), and at the end of every request (the last
//!   boundary it crossed). A request resumes from the longest prefix that has both its KV blocks and a checkpoint; a
//!   checkpoint whose block left the prefix cache is dropped, and the least recently used ones go when their number
//!   passes the cap (the memory plan's); the disk tier keeps them too (`cpu/hybrid.rs`);
//! - **boundaries**: each sequence's states at the last two block boundaries it crossed;
//! - **rollback rows**: after each row of a chunk of at most [`MAX_ROLLBACK_ROWS`] rows (a decode step, the k + 1
//!   rows of a speculative verification), so that rolling back to any accepted length restores a copy instead of
//!   recomputing.
//!
//! Any other cut back restores the nearest boundary or checkpoint at or before the new length (or the zero state)
//! and replays the tokens from there ([`Restore`]): exact in every case, cheap in the common ones.
//!
//! In: batches (which rows each sequence runs), the block table's hashes. Out: the states and snapshot buffers the
//! forward pass reads and writes ([`StateRefs`]). The backend owns the buffers' memory ([`Backend::Tensor`]).

use std::collections::HashMap;

use backend::{Backend, RecurrentSpec};

use crate::kv_cache::{BlockHash, BlockTable, chain_hash};
use crate::{Error, Result, SeqId};

/// Chunks of at most this many rows keep the state after each row, for rollback (a verification of up to 32 drafts).
pub const MAX_ROLLBACK_ROWS: usize = 33;

/// Checkpoints of a long prefill, every this many tokens, unless the runner is told otherwise.
pub const DEFAULT_CHECKPOINT_EVERY: usize = 1024;

/// Checkpoints kept in memory unless the memory plan says otherwise.
pub const DEFAULT_MAX_CHECKPOINTS: usize = 32;

/// The recurrent layers of a model: one spec per Gated DeltaNet layer, in layer order.
#[derive(Debug, Clone, PartialEq)]
pub struct StateShape {
    pub layers: Vec<RecurrentSpec>,
}

impl StateShape {
    /// Bytes of one sequence's state (f32: every recurrent layer's conv tail and state matrices).
    pub fn bytes(&self) -> u64 {
        self.layers.iter().map(|s| 4 * s.state_len() as u64).sum()
    }
}

/// One sequence's recurrent state on a backend: per recurrent layer, `[1, state_len]`.
pub struct SeqState<B: Backend> {
    pub layers: Vec<B::Tensor>,
}

impl<B: Backend> SeqState<B> {
    /// A zero state (a sequence before its first token).
    pub fn zeroed(b: &mut B, shape: &StateShape) -> Result<Self> {
        let mut layers = Vec::with_capacity(shape.layers.len());
        for s in &shape.layers {
            let mut t = b.alloc(1, s.state_len())?;
            b.write(&mut t, &vec![0.0; s.state_len()])?;
            layers.push(t);
        }
        Ok(SeqState { layers })
    }

    /// Overwrites this state with `src`.
    pub fn copy_from(&mut self, b: &mut B, src: &SeqState<B>) -> Result<()> {
        for (d, s) in self.layers.iter_mut().zip(&src.layers) {
            let v = b.read(s, 1)?;
            b.write(d, &v)?;
        }
        Ok(())
    }

    /// Every layer's values (for tests and the disk tier).
    pub fn to_host(&self, b: &mut B) -> Result<Vec<f32>> {
        let mut out = Vec::new();
        for t in &self.layers {
            out.extend(b.read(t, 1)?);
        }
        Ok(out)
    }
}

/// The recurrent state a forward pass reads and advances: per sequence of the batch (in `AttnRows::seqs` order)
/// its state, and the snapshots to take: `(sequence index, rows done, destination)`, ordered by sequence then row.
pub struct StateRefs<'a, B: Backend> {
    pub states: Vec<&'a mut SeqState<B>>,
    pub snapshots: Vec<(usize, usize, &'a mut SeqState<B>)>,
}

impl<B: Backend> StateRefs<'_, B> {
    /// No state (models without recurrent layers).
    pub fn none() -> Self {
        StateRefs { states: Vec::new(), snapshots: Vec::new() }
    }
}

/// Why a snapshot is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Roles {
    /// A rollback row of a short chunk.
    rollback: bool,
    /// A block boundary at a multiple of the checkpoint interval.
    periodic: bool,
    /// One of the last two block boundaries the sequence has crossed.
    boundary: bool,
    /// One of the last two block boundaries before the prompt's last token.
    prompt: bool,
}

/// Block boundaries of a sequence whose states it keeps (the last ones crossed), and those before the end of a
/// prompt that become checkpoints: a next turn that re-renders the end of the prompt (a thinking template drops
/// `<think>` from history) still finds one within a block of where it diverges.
const NUM_BOUNDARIES: usize = 2;

/// One sequence's part of a prepared forward: its chunk, the snapshots' rows and their buffers.
struct Pending<B: Backend> {
    seq: SeqId,
    start: usize,
    num_rows: usize,
    /// `(rows done, roles, buffer)`, by row.
    snaps: Vec<(usize, Roles, SeqState<B>)>,
    /// When the chunk ends the sequence's prompt (its first that wants logits): the last block boundaries before the
    /// prompt's last token, which become checkpoints (taken in this chunk, or held from earlier ones).
    prompt_at: Vec<usize>,
    /// The chunk wants logits: the prompt is done.
    wants_logits: bool,
}

/// The snapshots a forward pass takes ([`StateCache::prepare`]); given back to [`StateCache::finish`] or
/// [`StateCache::abandon`].
pub struct Prepared<B: Backend> {
    pending: Vec<Pending<B>>,
}

struct Entry<B: Backend> {
    state: SeqState<B>,
    /// Tokens `state` has consumed.
    len: usize,
    /// The state after each row of the last short chunk: `(sequence length, state)`.
    rollback: Vec<(usize, SeqState<B>)>,
    /// The states at the last [`NUM_BOUNDARIES`] block boundaries the sequence crossed, `(length, state)` in
    /// order; the last becomes a checkpoint at the end of the request.
    boundaries: Vec<(usize, SeqState<B>)>,
    /// A forward pass failed part way: the state must be rebuilt before the next one.
    dirty: bool,
    /// The prompt has been run (a chunk wanted logits).
    prompt_done: bool,
}

impl<B: Backend> Entry<B> {
    fn new(state: SeqState<B>, len: usize) -> Self {
        Entry { state, len, rollback: Vec::new(), boundaries: Vec::new(), dirty: false, prompt_done: false }
    }

    /// The held boundary state at `len` tokens.
    fn boundary(&self, len: usize) -> Option<&SeqState<B>> {
        self.boundaries.iter().find(|(l, _)| *l == len).map(|(_, s)| s)
    }
}

struct Checkpoint<B: Backend> {
    len: usize,
    state: SeqState<B>,
    last_use: u64,
}

/// Counters for `/status`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StateUsage {
    /// Checkpoints held now, and their cap.
    pub checkpoints: usize,
    pub max_checkpoints: usize,
    /// Bytes of one sequence's state.
    pub state_bytes: u64,
    /// Requests resumed from a checkpoint, and the tokens those checkpoints covered.
    pub checkpoint_hits: u64,
    pub checkpoint_hit_tokens: u64,
    /// Tokens recomputed to rebuild a state after a cut back no snapshot covered.
    pub replayed_tokens: u64,
}

/// What [`StateCache::truncate`] leaves to the runner: the state now stands at `from` tokens, and the tokens
/// `from..to` of the sequence must be run through the model again (no logits, their KV rewritten as it was).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Restore {
    pub from: usize,
    pub to: usize,
}

/// Every sequence's state and the checkpoints (see the module docs).
pub struct StateCache<B: Backend> {
    shape: StateShape,
    every: usize,
    max_checkpoints: usize,
    seqs: HashMap<SeqId, Entry<B>>,
    checkpoints: HashMap<BlockHash, Checkpoint<B>>,
    tick: u64,
    /// Buffers no longer used, handed out again before allocating.
    spare: Vec<SeqState<B>>,
    usage: StateUsage,
}

impl<B: Backend> StateCache<B> {
    pub fn new(shape: StateShape) -> Self {
        StateCache {
            usage: StateUsage { state_bytes: shape.bytes(), ..Default::default() },
            shape,
            every: DEFAULT_CHECKPOINT_EVERY,
            max_checkpoints: DEFAULT_MAX_CHECKPOINTS,
            seqs: HashMap::new(),
            checkpoints: HashMap::new(),
            tick: 0,
            spare: Vec::new(),
        }
    }

    pub fn shape(&self) -> &StateShape {
        &self.shape
    }

    /// Values of one state ([`StateShape`]).
    pub fn state_len(&self) -> usize {
        self.shape.layers.iter().map(|s| s.state_len()).sum()
    }

    /// Checkpoints every `tokens` tokens of a prefill (rounded up to whole blocks of `block_tokens`; 0 turns the
    /// periodic ones off).
    pub fn set_checkpoint_every(&mut self, tokens: usize, block_tokens: usize) {
        self.every = if tokens == 0 { 0 } else { tokens.div_ceil(block_tokens) * block_tokens };
    }

    /// Caps the checkpoints kept (the least recently used go first).
    pub fn set_max_checkpoints(&mut self, max: usize) {
        self.max_checkpoints = max;
        self.enforce_cap();
    }

    pub fn usage(&self) -> StateUsage {
        StateUsage { checkpoints: self.checkpoints.len(), max_checkpoints: self.max_checkpoints, ..self.usage }
    }

    fn buffer(&mut self, b: &mut B) -> Result<SeqState<B>> {
        match self.spare.pop() {
            Some(s) => Ok(s),
            None => SeqState::zeroed(b, &self.shape),
        }
    }

    /// A new buffer holding a copy of `src` (one of this cache's own states, named by `get`).
    fn copy_of(&mut self, b: &mut B, get: impl Fn(&Self) -> Option<&SeqState<B>>) -> Result<Option<SeqState<B>>> {
        if get(self).is_none() {
            return Ok(None);
        }
        let mut copy = self.buffer(b)?;
        if let Some(src) = get(self) {
            copy.copy_from(b, src)?;
        }
        Ok(Some(copy))
    }

    /// Keeps `s` for reuse (as many as one sequence holds at once: the rest is freed).
    fn recycle(&mut self, s: SeqState<B>) {
        if self.spare.len() < plan::STATES_PER_SEQUENCE {
            self.spare.push(s);
        }
    }

    /// The state of `seq`, created zeroed for a sequence the cache does not hold yet.
    fn entry(&mut self, b: &mut B, seq: SeqId) -> Result<&mut Entry<B>> {
        if !self.seqs.contains_key(&seq) {
            let state = SeqState::zeroed(b, &self.shape)?;
            self.seqs.insert(seq, Entry::new(state, 0));
        }
        Ok(self.seqs.get_mut(&seq).expect("INVARIANT: inserted above"))
    }

    /// Whether `seq`'s state must be rebuilt ([`StateCache::truncate`]) before its next forward pass.
    pub fn is_dirty(&self, seq: SeqId) -> bool {
        self.seqs.get(&seq).is_some_and(|e| e.dirty)
    }

    /// The snapshots a forward pass of these chunks (`(seq, start position, rows, wants logits)`) takes, with
    /// their buffers, for blocks of `block_tokens`.
    pub fn prepare(
        &mut self,
        b: &mut B,
        chunks: &[(SeqId, usize, usize, bool)],
        block_tokens: usize,
    ) -> Result<Prepared<B>> {
        let bt = block_tokens;
        let mut pending = Vec::with_capacity(chunks.len());
        for &(seq, start, n, wants_logits) in chunks {
            let e = self.entry(b, seq)?;
            let (len, prompt_done) = (e.len, e.prompt_done);
            if len != start {
                return Err(Error::Unsupported(format!(
                    "sequence {seq}: a chunk at {start} on a recurrent state of {len} tokens"
                )));
            }
            // The chunk's last boundaries, and the prompt's last before its last token.
            let last_boundary = (start + n) / bt * bt;
            let last_before_end = (start + n).saturating_sub(1) / bt * bt;
            let prompt_at: Vec<usize> = if wants_logits && !prompt_done && n > 0 {
                (0..NUM_BOUNDARIES).filter_map(|i| last_before_end.checked_sub(i * bt)).filter(|&p| p > 0).collect()
            } else {
                Vec::new()
            };
            let mut rows: Vec<(usize, Roles)> = Vec::new();
            for j in 1..=n {
                let pos = start + j;
                let at_boundary = pos.is_multiple_of(bt);
                let roles = Roles {
                    // After the last row the state itself is that length's: no copy.
                    rollback: n <= MAX_ROLLBACK_ROWS && j < n,
                    periodic: at_boundary && self.every > 0 && pos.is_multiple_of(self.every),
                    boundary: at_boundary && pos + NUM_BOUNDARIES * bt > last_boundary,
                    prompt: prompt_at.contains(&pos),
                };
                if roles.rollback || roles.periodic || roles.boundary || roles.prompt {
                    rows.push((j, roles));
                }
            }
            let mut snaps = Vec::with_capacity(rows.len());
            for (j, roles) in rows {
                snaps.push((j, roles, self.buffer(b)?));
            }
            pending.push(Pending { seq, start, num_rows: n, snaps, prompt_at, wants_logits });
        }
        Ok(Prepared { pending })
    }

    /// The states and snapshot buffers of a prepared forward pass, in the order of its chunks.
    pub fn refs<'a>(&'a mut self, prepared: &'a mut Prepared<B>) -> StateRefs<'a, B> {
        let mut refs = StateRefs::none();
        let ids: Vec<SeqId> = prepared.pending.iter().map(|p| p.seq).collect();
        // One mutable borrow per sequence of the map (a batch names each sequence once).
        let mut by_id: HashMap<SeqId, &'a mut Entry<B>> =
            self.seqs.iter_mut().filter(|(id, _)| ids.contains(*id)).map(|(id, e)| (*id, e)).collect();
        for (i, p) in prepared.pending.iter_mut().enumerate() {
            let e = by_id.remove(&p.seq).expect("INVARIANT: prepare made an entry for every chunk");
            refs.states.push(&mut e.state);
            for (j, _, buf) in &mut p.snaps {
                refs.snapshots.push((i, *j, buf));
            }
        }
        refs
    }

    /// After a successful forward pass (its tokens committed to `table`): keeps the rollback rows and the
    /// boundaries, and stores the checkpoints the pass took.
    pub fn finish(&mut self, b: &mut B, prepared: Prepared<B>, table: &BlockTable) -> Result<()> {
        let bt = table.block_tokens();
        for p in prepared.pending {
            // A prompt boundary an earlier chunk crossed: its held state is the checkpoint.
            for &at in p.prompt_at.iter().filter(|&&at| at <= p.start) {
                let seq = p.seq;
                if let Some(copy) = self.copy_of(b, |c| c.seqs.get(&seq).and_then(|e| e.boundary(at)))? {
                    self.insert_checkpoint(table, seq, at / bt, copy);
                }
            }
            let mut rollback = Vec::new();
            let mut boundaries = Vec::new();
            for (j, roles, buf) in p.snaps {
                let len = p.start + j;
                let checkpoint = roles.periodic || roles.prompt;
                let uses = [checkpoint, roles.boundary, roles.rollback].iter().filter(|&&u| u).count();
                // The snapshot for its first use, copies for the others.
                let mut bufs = Vec::with_capacity(uses.max(1));
                bufs.push(buf);
                for _ in 1..uses {
                    let mut copy = self.buffer(b)?;
                    copy.copy_from(b, &bufs[0])?;
                    bufs.push(copy);
                }
                if checkpoint && let Some(s) = bufs.pop() {
                    self.insert_checkpoint(table, p.seq, len / bt, s);
                }
                if roles.boundary
                    && let Some(s) = bufs.pop()
                {
                    boundaries.push((len, s));
                }
                if roles.rollback
                    && let Some(s) = bufs.pop()
                {
                    rollback.push((len, s));
                }
                for s in bufs {
                    self.recycle(s);
                }
            }
            let e = self.seqs.get_mut(&p.seq).expect("INVARIANT: prepared sequences have entries");
            e.len = p.start + p.num_rows;
            e.prompt_done |= p.wants_logits;
            let mut old: Vec<SeqState<B>> =
                std::mem::replace(&mut e.rollback, rollback).into_iter().map(|r| r.1).collect();
            e.boundaries.extend(boundaries);
            let over = e.boundaries.len().saturating_sub(NUM_BOUNDARIES);
            old.extend(e.boundaries.drain(..over).map(|r| r.1));
            for s in old {
                self.recycle(s);
            }
        }
        self.prune(table);
        Ok(())
    }

    /// After a failed forward pass: the states may have advanced part way, so they are rebuilt before their next
    /// pass; the buffers are kept.
    pub fn abandon(&mut self, prepared: Prepared<B>) {
        for p in prepared.pending {
            if let Some(e) = self.seqs.get_mut(&p.seq) {
                e.dirty = true;
            }
            for (_, _, s) in p.snaps {
                self.recycle(s);
            }
        }
    }

    /// Marks `seq`'s state for a rebuild before its next pass (a replay failed).
    pub fn abandon_seq(&mut self, seq: SeqId) {
        if let Some(e) = self.seqs.get_mut(&seq) {
            e.dirty = true;
        }
    }

    /// Stores `state` as the checkpoint after the first `blocks` blocks of `seq` (their hash from `table`).
    fn insert_checkpoint(&mut self, table: &BlockTable, seq: SeqId, blocks: usize, state: SeqState<B>) {
        let Some(&hash) = blocks.checked_sub(1).and_then(|i| table.hashes(seq).get(i)) else {
            return self.recycle(state);
        };
        if self.max_checkpoints == 0 || !table.is_registered(&hash) {
            return self.recycle(state);
        }
        self.put_checkpoint(hash, blocks * table.block_tokens(), state);
    }

    fn put_checkpoint(&mut self, hash: BlockHash, len: usize, state: SeqState<B>) {
        self.tick += 1;
        if let Some(old) = self.checkpoints.insert(hash, Checkpoint { len, state, last_use: self.tick }) {
            self.recycle(old.state);
        }
        self.enforce_cap();
    }

    fn enforce_cap(&mut self) {
        while self.checkpoints.len() > self.max_checkpoints {
            let oldest = self.checkpoints.iter().min_by_key(|(_, c)| c.last_use).map(|(h, _)| *h);
            let Some(h) = oldest else { break };
            if let Some(c) = self.checkpoints.remove(&h) {
                self.recycle(c.state);
            }
        }
    }

    /// Drops the checkpoints whose block left the prefix cache (evicted, or cut back into).
    pub fn prune(&mut self, table: &BlockTable) {
        let gone: Vec<BlockHash> = self.checkpoints.keys().filter(|h| !table.is_registered(h)).copied().collect();
        for h in gone {
            if let Some(c) = self.checkpoints.remove(&h) {
                self.recycle(c.state);
            }
        }
    }

    /// Whether a checkpoint is held for the block `hash`.
    pub fn has_checkpoint(&self, hash: &BlockHash) -> bool {
        self.checkpoints.contains_key(hash)
    }

    /// The blocks checkpoints are held for.
    pub fn checkpoint_hashes(&self) -> Vec<BlockHash> {
        self.checkpoints.keys().copied().collect()
    }

    /// The checkpoint of block `hash` in its host form ([`state_to_words`]), if held.
    pub fn checkpoint_words(&self, b: &mut B, hash: &BlockHash) -> Result<Option<Vec<u16>>> {
        match self.checkpoints.get(hash) {
            Some(c) => Ok(Some(state_to_words(&c.state.to_host(b)?))),
            None => Ok(None),
        }
    }

    /// The longest prefix of `chain` (the hashes of a prompt's cached blocks, in order) that ends on a checkpoint
    /// held here or where `elsewhere` says one is (the disk tier): its length in blocks (0: none).
    pub fn longest_checkpoint(&self, chain: &[BlockHash], elsewhere: impl Fn(&BlockHash) -> bool) -> usize {
        (1..=chain.len()).rev().find(|&i| self.has_checkpoint(&chain[i - 1]) || elsewhere(&chain[i - 1])).unwrap_or(0)
    }

    /// Starts `seq` at the checkpoint after the first `blocks` blocks of `chain` (the zero state for 0, or when
    /// that checkpoint is gone). Returns the tokens the state stands at.
    pub fn resume(&mut self, b: &mut B, seq: SeqId, chain: &[BlockHash], blocks: usize) -> Result<usize> {
        let found = blocks.checked_sub(1).and_then(|i| chain.get(i)).copied().filter(|h| self.has_checkpoint(h));
        let (state, len) = match found {
            Some(h) => {
                let state = self.copy_of(b, |c| c.checkpoints.get(&h).map(|cp| &cp.state))?;
                let state = state.expect("INVARIANT: checked above");
                self.tick += 1;
                let cp = self.checkpoints.get_mut(&h).expect("INVARIANT: checked above");
                cp.last_use = self.tick;
                self.usage.checkpoint_hits += 1;
                self.usage.checkpoint_hit_tokens += cp.len as u64;
                (state, cp.len)
            }
            None => (SeqState::zeroed(b, &self.shape)?, 0),
        };
        if let Some(old) = self.seqs.insert(seq, Entry::new(state, len)) {
            self.drop_entry(old);
        }
        Ok(len)
    }

    /// Starts `seq` at `len` tokens from a state in host form (a checkpoint read from the disk tier), which also
    /// becomes the checkpoint of block `hash`.
    pub fn resume_from_words(
        &mut self,
        b: &mut B,
        seq: SeqId,
        len: usize,
        hash: BlockHash,
        words: &[u16],
    ) -> Result<()> {
        let values = words_to_state(words);
        let mut state = self.buffer(b)?;
        let mut at = 0;
        for (t, s) in state.layers.iter_mut().zip(&self.shape.layers) {
            b.write(t, &values[at..at + s.state_len()])?;
            at += s.state_len();
        }
        let mut cp = self.buffer(b)?;
        cp.copy_from(b, &state)?;
        self.put_checkpoint(hash, len, cp);
        self.usage.checkpoint_hits += 1;
        self.usage.checkpoint_hit_tokens += len as u64;
        if let Some(old) = self.seqs.insert(seq, Entry::new(state, len)) {
            self.drop_entry(old);
        }
        Ok(())
    }

    fn drop_entry(&mut self, e: Entry<B>) {
        for (_, s) in e.rollback.into_iter().chain(e.boundaries) {
            self.recycle(s);
        }
        self.recycle(e.state);
    }

    /// Cuts `seq`'s state back to `len` tokens, its block table already cut (`table`). A rollback row or a held
    /// boundary at exactly `len` is restored at once (`None`); otherwise the nearest held boundary or checkpoint
    /// before (or the zero state) is, and the tokens after it must be replayed ([`Restore`]). Also rebuilds a
    /// dirty state.
    pub fn truncate(&mut self, b: &mut B, seq: SeqId, len: usize, table: &BlockTable) -> Result<Option<Restore>> {
        let Some(mut e) = self.seqs.remove(&seq) else { return Ok(None) };
        if !e.dirty && e.len == len {
            self.seqs.insert(seq, e);
            return Ok(None);
        }
        let restored = self.restore(b, &mut e, seq, len, table);
        e.dirty |= restored.is_err();
        // Whatever the outcome, nothing held past `len` is this sequence's any more.
        let mut old: Vec<SeqState<B>> = e.rollback.drain(..).map(|r| r.1).collect();
        let keep = e.boundaries.iter().take_while(|(l, _)| *l <= len).count();
        old.extend(e.boundaries.drain(keep..).map(|r| r.1));
        for s in old {
            self.recycle(s);
        }
        self.seqs.insert(seq, e);
        let from = restored?;
        if from < len {
            self.usage.replayed_tokens += (len - from) as u64;
            return Ok(Some(Restore { from, to: len }));
        }
        Ok(None)
    }

    /// Restores `e` (of `seq`) to the nearest state at or before `len` this cache holds; returns its length.
    fn restore(&mut self, b: &mut B, e: &mut Entry<B>, seq: SeqId, len: usize, table: &BlockTable) -> Result<usize> {
        e.len = len;
        e.dirty = false;
        if let Some(i) = e.rollback.iter().position(|(l, _)| *l == len) {
            let (_, s) = e.rollback.swap_remove(i);
            let old = std::mem::replace(&mut e.state, s);
            self.recycle(old);
            return Ok(len);
        }
        // The nearest starting point at or before `len`: a held boundary, a checkpoint on this sequence's chain,
        // or the start.
        let bt = table.block_tokens();
        let hashes = table.hashes(seq);
        let blocks = (1..=(len / bt).min(hashes.len())).rev().find(|&i| self.has_checkpoint(&hashes[i - 1]));
        let from_cp = blocks.map_or(0, |i| i * bt);
        if let Some((l, s)) = e.boundaries.iter().rev().find(|(l, _)| *l <= len && *l >= from_cp) {
            e.state.copy_from(b, s)?;
            return Ok(*l);
        }
        match blocks {
            Some(i) => {
                self.tick += 1;
                let cp = self.checkpoints.get_mut(&hashes[i - 1]).expect("INVARIANT: found above");
                cp.last_use = self.tick;
                e.state.copy_from(b, &cp.state)?;
            }
            None => {
                let zero = SeqState::zeroed(b, &self.shape)?;
                let old = std::mem::replace(&mut e.state, zero);
                self.recycle(old);
            }
        }
        Ok(from_cp)
    }

    /// The state `seq` runs on (created zeroed if the cache does not hold it), for a replay.
    pub fn state_mut(&mut self, b: &mut B, seq: SeqId) -> Result<&mut SeqState<B>> {
        Ok(&mut self.entry(b, seq)?.state)
    }

    /// The state of `seq`, if held.
    pub fn state(&self, seq: SeqId) -> Option<&SeqState<B>> {
        self.seqs.get(&seq).map(|e| &e.state)
    }

    /// Ends `seq`: its last block boundary becomes a checkpoint (the end of the request), the rest is freed.
    pub fn release(&mut self, seq: SeqId, table: &BlockTable) {
        let Some(mut e) = self.seqs.remove(&seq) else { return };
        if let Some((len, s)) = e.boundaries.pop() {
            self.insert_checkpoint(table, seq, len / table.block_tokens(), s);
        }
        self.drop_entry(e);
        self.prune(table);
    }
}

/// The disk tier's key of the checkpoint at the end of block `hash` (not a block's: a block's hash chains 16 tokens).
pub fn disk_key(hash: &BlockHash) -> BlockHash {
    chain_hash(hash, &[u32::MAX])
}

/// A state's values as u16 words, each f32's bits low half first (the f32 KV cache's host form).
pub fn state_to_words(values: &[f32]) -> Vec<u16> {
    values.iter().flat_map(|v| [v.to_bits() as u16, (v.to_bits() >> 16) as u16]).collect()
}

/// [`state_to_words`] undone.
pub fn words_to_state(words: &[u16]) -> Vec<f32> {
    words.chunks_exact(2).map(|w| f32::from_bits(w[0] as u32 | (w[1] as u32) << 16)).collect()
}
