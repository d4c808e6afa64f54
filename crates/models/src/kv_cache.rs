//! Paged KV cache bookkeeping, the same for every backend: fixed-size blocks (of [`BLOCK_TOKENS`] positions on the
//! CPU; a backend chooses its own size, the CUDA runner 64), per-sequence block tables, reference counts, and the
//! prefix cache.
//!
//! A backend owns the storage of each block (block `b`'s keys and values for every layer) and asks this table which
//! block and row hold a sequence's position. Full blocks are registered under a chained hash of all tokens up to their
//! end (so a block is found only after the same prefix), stay after their sequences end, are shared by any sequence
//! that starts with the same tokens, and are evicted least recently used when a block is needed. Partial blocks are
//! private to their sequence, so appending never writes into a shared block; rolling back into a registered block
//! unregisters it, or copies it when another sequence shares it.
//!
//! Memory: blocks are created as they are first needed, up to the pool's size. The unreferenced cached blocks (the
//! in-memory prefix cache) may be capped below the pool ([`BlockTable::set_max_cached_blocks`]); past the cap the
//! least recently used one is evicted. A block that is neither referenced nor cached needs no storage: the table says
//! which blocks gained or lost the need ([`BlockTable::take_storage_changes`]) so the backend allocates or frees
//! their storage, and memory follows what is in use plus the cap instead of the pool's high-water mark.
//!
//! With a disk tier, an evicted block may not be on disk yet (the idle writer had no idle time): the table then
//! reports it ([`BlockTable::take_spills`]) while its storage still holds it, so the backend writes it first.

use std::collections::{BTreeMap, HashMap};

use sha2::{Digest, Sha256};

use crate::SeqId;

/// Positions per block on the CPU (the memory plan's page size); [`BlockTable::with_block_tokens`] takes another.
pub const BLOCK_TOKENS: usize = 16;

/// Identity of a full block: a hash of every token from the start of the sequence to the block's end.
pub type BlockHash = [u8; 16];

/// The hash of the block after `prev` (the zero hash for the first block) holding `tokens`.
pub fn chain_hash(prev: &BlockHash, tokens: &[u32]) -> BlockHash {
    let mut h = Sha256::new();
    h.update(prev);
    for t in tokens {
        h.update(t.to_le_bytes());
    }
    let d = h.finalize();
    let mut out = [0u8; 16];
    out.copy_from_slice(&d[..16]);
    out
}

/// Counters for `/status` and `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvUsage {
    /// Positions per block.
    pub block_tokens: usize,
    /// Most blocks the cache may hold.
    pub capacity_blocks: usize,
    /// Blocks held by running sequences.
    pub used_blocks: usize,
    /// Unreferenced blocks kept for prefix reuse.
    pub cached_blocks: usize,
    /// Prompt tokens served from the prefix cache, and looked up, since start.
    pub hit_tokens: u64,
    pub lookup_tokens: u64,
    pub evicted_blocks: u64,
    /// Most unreferenced cached blocks kept in memory; `None` = as many as the pool holds.
    pub max_cached_blocks: Option<usize>,
    /// Blocks that hold storage now (referenced or cached).
    pub stored_blocks: usize,
    /// The recurrent state's checkpoints (hybrid models).
    pub state: Option<crate::state::StateUsage>,
}

#[derive(Debug, Default)]
struct SeqBlocks {
    blocks: Vec<u32>,
    tokens: Vec<u32>,
    /// Chained hash of each full block.
    hashes: Vec<BlockHash>,
}

#[derive(Debug, thiserror::Error)]
#[error("the KV cache is full: {needed} more blocks of {block_tokens} tokens needed, {available} available")]
pub struct CacheFull {
    pub needed: usize,
    pub available: usize,
    pub block_tokens: usize,
}

/// A block that must be copied before its sequence writes to it (copy-on-write after a rollback into a shared block).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockCopy {
    pub from: u32,
    pub to: u32,
}

#[derive(Debug)]
pub struct BlockTable {
    /// Positions per block.
    block_tokens: usize,
    max_blocks: usize,
    /// Blocks that exist (have storage): ids `0..num_created`.
    num_created: usize,
    refs: Vec<u32>,
    hash_of: Vec<Option<BlockHash>>,
    last_use: Vec<u64>,
    by_hash: HashMap<BlockHash, u32>,
    /// Existing blocks that are unreferenced and not cached.
    free: Vec<u32>,
    /// Unreferenced cached blocks by last use.
    lru: BTreeMap<u64, u32>,
    tick: u64,
    seqs: HashMap<SeqId, SeqBlocks>,
    usage: KvUsage,
    /// Cap on `lru.len()`; `None` = the pool's size.
    max_cached: Option<usize>,
    /// Whether block `b` needs storage: it is referenced or cached (free blocks do not).
    stored: Vec<bool>,
    num_stored: usize,
    /// Blocks whose `stored` changed since [`Self::take_storage_changes`] was last called, each once (so the list is
    /// bounded by the pool even for a runner that never takes it, as the GPU's, whose pages are allocated up front).
    storage_changes: Vec<u32>,
    /// Whether block `b` is in `storage_changes`.
    change_pending: Vec<bool>,
    /// Whether evicted blocks are reported in `spills` (a disk tier takes them).
    spill: bool,
    /// Blocks evicted since [`Self::take_spills`]: hash and id.
    spills: Vec<(BlockHash, u32)>,
}

impl BlockTable {
    /// A table of blocks of [`BLOCK_TOKENS`] positions.
    pub fn new(max_blocks: usize) -> Self {
        Self::with_block_tokens(max_blocks, BLOCK_TOKENS)
    }

    /// A table of blocks of `block_tokens` positions (at least 1).
    pub fn with_block_tokens(max_blocks: usize, block_tokens: usize) -> Self {
        BlockTable {
            block_tokens: block_tokens.max(1),
            max_blocks,
            num_created: 0,
            refs: Vec::new(),
            hash_of: Vec::new(),
            last_use: Vec::new(),
            by_hash: HashMap::new(),
            free: Vec::new(),
            lru: BTreeMap::new(),
            tick: 0,
            seqs: HashMap::new(),
            usage: KvUsage::default(),
            max_cached: None,
            stored: Vec::new(),
            num_stored: 0,
            storage_changes: Vec::new(),
            change_pending: Vec::new(),
            spill: false,
            spills: Vec::new(),
        }
    }

    /// Reports evicted blocks from now on ([`Self::take_spills`]), or stops (and forgets those not taken).
    pub fn set_spill(&mut self, spill: bool) {
        self.spill = spill;
        if !spill {
            self.spills.clear();
        }
    }

    /// Blocks evicted from the prefix cache since the last call, with the hash they were cached under. Their storage
    /// still holds that content until the next [`Self::take_storage_changes`] is applied or the block is written to:
    /// take these first.
    pub fn take_spills(&mut self) -> Vec<(BlockHash, u32)> {
        std::mem::take(&mut self.spills)
    }

    /// Caps the unreferenced cached blocks kept in memory (`None`: as many as the pool holds), evicting the least
    /// recently used ones beyond it now.
    pub fn set_max_cached_blocks(&mut self, max_cached: Option<usize>) {
        self.max_cached = max_cached;
        self.enforce_cache_cap();
    }

    /// Blocks whose storage need changed since the last call: for each, allocate storage if [`Self::is_stored`]
    /// (its content is then written before it is read) and free it otherwise.
    pub fn take_storage_changes(&mut self) -> Vec<u32> {
        for &b in &self.storage_changes {
            self.change_pending[b as usize] = false;
        }
        std::mem::take(&mut self.storage_changes)
    }

    /// Whether block `b` needs storage (it is referenced or cached).
    pub fn is_stored(&self, b: u32) -> bool {
        self.stored.get(b as usize).copied().unwrap_or(false)
    }

    fn set_stored(&mut self, b: u32, stored: bool) {
        if self.stored[b as usize] != stored {
            self.stored[b as usize] = stored;
            if stored {
                self.num_stored += 1
            } else {
                self.num_stored -= 1
            }
            if !std::mem::replace(&mut self.change_pending[b as usize], true) {
                self.storage_changes.push(b);
            }
        }
    }

    /// Puts an unreferenced, uncached block on the free list; its storage is given back.
    fn push_free(&mut self, b: u32) {
        self.set_stored(b, false);
        self.free.push(b);
    }

    /// Evicts the least recently used cached blocks beyond the cap.
    fn enforce_cache_cap(&mut self) {
        let Some(max) = self.max_cached else { return };
        while self.lru.len() > max {
            let Some((_, b)) = self.lru.pop_first() else { break };
            self.evict(b);
            self.push_free(b);
        }
    }

    /// Drops cached block `b` (already off the LRU list) from the prefix cache, reporting it for spilling.
    fn evict(&mut self, b: u32) {
        if self.spill
            && let Some(h) = self.hash_of[b as usize]
            && self.by_hash.get(&h) == Some(&b)
        {
            self.spills.push((h, b));
        }
        self.unregister(b);
        self.usage.evicted_blocks += 1;
    }

    /// Positions per block.
    pub fn block_tokens(&self) -> usize {
        self.block_tokens
    }

    /// Blocks with storage so far; a backend allocates storage for new ids as this grows.
    pub fn num_created(&self) -> usize {
        self.num_created
    }

    pub fn set_max_blocks(&mut self, max_blocks: usize) {
        self.max_blocks = max_blocks.max(self.num_created);
    }

    pub fn usage(&self) -> KvUsage {
        KvUsage {
            block_tokens: self.block_tokens,
            capacity_blocks: self.max_blocks,
            used_blocks: self.refs.iter().filter(|&&r| r > 0).count(),
            cached_blocks: self.lru.len(),
            max_cached_blocks: self.max_cached,
            stored_blocks: self.num_stored,
            ..self.usage
        }
    }

    pub fn seq_len(&self, seq: SeqId) -> usize {
        self.seqs.get(&seq).map_or(0, |s| s.tokens.len())
    }

    /// The blocks of `seq`, in position order.
    pub fn blocks(&self, seq: SeqId) -> &[u32] {
        self.seqs.get(&seq).map_or(&[], |s| &s.blocks)
    }

    /// Blocks that can still be handed out: free, evictable, or not created yet.
    pub fn num_available(&self) -> usize {
        self.free.len() + self.lru.len() + self.max_blocks.saturating_sub(self.num_created)
    }

    /// New blocks `seq` needs to grow to `new_len` positions.
    pub fn blocks_needed(&self, seq: SeqId, new_len: usize) -> usize {
        new_len.div_ceil(self.block_tokens).saturating_sub(self.blocks(seq).len())
    }

    fn touch(&mut self, b: u32) {
        self.tick += 1;
        self.last_use[b as usize] = self.tick;
    }

    fn take_ref(&mut self, b: u32) {
        if self.refs[b as usize] == 0 {
            self.lru.remove(&self.last_use[b as usize]);
        }
        self.refs[b as usize] += 1;
        self.touch(b);
    }

    fn drop_ref(&mut self, b: u32) {
        let r = &mut self.refs[b as usize];
        *r -= 1;
        if *r == 0 {
            if self.hash_of[b as usize].is_some() {
                self.touch(b);
                self.lru.insert(self.last_use[b as usize], b);
                self.enforce_cache_cap();
            } else {
                self.push_free(b);
            }
        }
    }

    fn unregister(&mut self, b: u32) {
        if let Some(h) = self.hash_of[b as usize].take()
            && self.by_hash.get(&h) == Some(&b)
        {
            self.by_hash.remove(&h);
        }
    }

    /// A block with no content and one reference. `force` may exceed the capacity by creating a block.
    fn alloc(&mut self, force: bool) -> Option<u32> {
        let b = if let Some(b) = self.free.pop() {
            b
        } else if self.num_created < self.max_blocks || (force && self.lru.is_empty()) {
            self.num_created += 1;
            self.refs.push(0);
            self.hash_of.push(None);
            self.last_use.push(0);
            self.stored.push(false);
            self.change_pending.push(false);
            (self.num_created - 1) as u32
        } else {
            let (_, b) = self.lru.pop_first()?;
            self.evict(b);
            b
        };
        self.refs[b as usize] = 1;
        self.set_stored(b, true);
        self.touch(b);
        Some(b)
    }

    /// Starts `seq` (which must hold nothing) with the cached blocks of the longest prefix of `tokens` made of full
    /// cached blocks; returns the number of tokens they cover.
    pub fn attach_prefix(&mut self, seq: SeqId, tokens: &[u32]) -> usize {
        self.attach_prefix_upto(seq, tokens, tokens.len())
    }

    /// [`Self::attach_prefix`] over at most the first `max_tokens` of `tokens` (a hybrid model resumes only where
    /// it has a state checkpoint), counted as a lookup of all of `tokens`.
    pub fn attach_prefix_upto(&mut self, seq: SeqId, tokens: &[u32], max_tokens: usize) -> usize {
        if self.seqs.get(&seq).is_some_and(|s| !s.tokens.is_empty()) {
            return 0;
        }
        let mut s = SeqBlocks::default();
        let mut prev = [0u8; 16];
        for chunk in tokens[..max_tokens.min(tokens.len())].chunks_exact(self.block_tokens) {
            let h = chain_hash(&prev, chunk);
            let Some(&b) = self.by_hash.get(&h) else { break };
            self.take_ref(b);
            s.blocks.push(b);
            s.tokens.extend_from_slice(chunk);
            s.hashes.push(h);
            prev = h;
        }
        let n = s.tokens.len();
        self.usage.lookup_tokens += tokens.len() as u64;
        self.usage.hit_tokens += n as u64;
        self.seqs.insert(seq, s);
        n
    }

    /// The chained hashes of the cached blocks that start `tokens`, in order (what [`Self::attach_prefix`] would
    /// attach), without attaching them.
    pub fn cached_chain(&self, tokens: &[u32]) -> Vec<BlockHash> {
        let mut chain: Vec<BlockHash> = Vec::new();
        for chunk in tokens.chunks_exact(self.block_tokens) {
            let h = chain_hash(chain.last().unwrap_or(&[0; 16]), chunk);
            if !self.by_hash.contains_key(&h) {
                break;
            }
            chain.push(h);
        }
        chain
    }

    /// Whether a block is cached under `hash`.
    pub fn is_registered(&self, hash: &BlockHash) -> bool {
        self.by_hash.contains_key(hash)
    }

    /// The chained hash of each full block of `seq`, in order.
    pub fn hashes(&self, seq: SeqId) -> &[BlockHash] {
        self.seqs.get(&seq).map_or(&[], |s| &s.hashes)
    }

    /// The tokens `seq` holds.
    pub fn tokens(&self, seq: SeqId) -> &[u32] {
        self.seqs.get(&seq).map_or(&[], |s| &s.tokens)
    }

    /// The chained hash of `seq`'s last full block (the zero hash when it has none).
    pub fn last_hash(&self, seq: SeqId) -> BlockHash {
        self.seqs.get(&seq).and_then(|s| s.hashes.last().copied()).unwrap_or([0; 16])
    }

    /// Appends to `seq` (which holds only full blocks) a new block for `tokens` whose content the caller fills in
    /// (loaded from disk), registered under `hash`. `None` when no block is available.
    pub fn attach_loaded(&mut self, seq: SeqId, hash: BlockHash, tokens: &[u32]) -> Option<u32> {
        let s = self.seqs.get(&seq)?;
        if tokens.len() != self.block_tokens
            || !s.tokens.len().is_multiple_of(self.block_tokens)
            || self.by_hash.contains_key(&hash)
        {
            return None;
        }
        if self.num_available() == 0 {
            return None;
        }
        let b = self.alloc(false)?;
        self.by_hash.insert(hash, b);
        self.hash_of[b as usize] = Some(hash);
        let s = self.seqs.get_mut(&seq).expect("INVARIANT: checked above");
        s.blocks.push(b);
        s.tokens.extend_from_slice(tokens);
        s.hashes.push(hash);
        self.usage.hit_tokens += self.block_tokens as u64;
        Some(b)
    }

    /// Undoes the last [`Self::attach_loaded`] of `seq` when its content could not be filled in: the block is
    /// unregistered and freed.
    pub fn detach_loaded(&mut self, seq: SeqId) {
        let Some(s) = self.seqs.get_mut(&seq) else { return };
        let Some(b) = s.blocks.pop() else { return };
        s.tokens.truncate(s.blocks.len() * self.block_tokens);
        s.hashes.truncate(s.blocks.len());
        self.usage.hit_tokens -= self.block_tokens as u64;
        self.unregister(b);
        self.drop_ref(b);
    }

    /// Every registered (full, cached) block: its hash and id.
    pub fn registered(&self) -> impl Iterator<Item = (&BlockHash, u32)> {
        self.by_hash.iter().map(|(h, &b)| (h, b))
    }

    /// Makes room for `seq` to grow to `new_len` positions (allocating blocks). Fails without changing anything
    /// when the cache cannot supply them; call [`Self::num_available`] first to check a whole batch.
    pub fn reserve(&mut self, seq: SeqId, new_len: usize) -> Result<(), CacheFull> {
        let needed = self.blocks_needed(seq, new_len);
        if needed > self.num_available() {
            return Err(CacheFull { needed, available: self.num_available(), block_tokens: self.block_tokens });
        }
        for _ in 0..needed {
            let b = self.alloc(false).expect("INVARIANT: availability checked above");
            self.seqs.entry(seq).or_default().blocks.push(b);
        }
        self.seqs.entry(seq).or_default();
        Ok(())
    }

    /// Block and row of `seq`'s position `pos` (reserved).
    pub fn slot(&self, seq: SeqId, pos: usize) -> (u32, usize) {
        (self.blocks(seq)[pos / self.block_tokens], pos % self.block_tokens)
    }

    /// Records that `tokens` were written after `seq`'s current end, and registers the blocks they complete.
    pub fn commit(&mut self, seq: SeqId, tokens: &[u32]) {
        let bt = self.block_tokens;
        let Some(s) = self.seqs.get_mut(&seq) else { return };
        s.tokens.extend_from_slice(tokens);
        let mut fresh = Vec::new();
        while s.hashes.len() < s.tokens.len() / bt {
            let i = s.hashes.len();
            let prev = if i == 0 { [0u8; 16] } else { s.hashes[i - 1] };
            let h = chain_hash(&prev, &s.tokens[i * bt..(i + 1) * bt]);
            s.hashes.push(h);
            fresh.push((s.blocks[i], h));
        }
        for (b, h) in fresh {
            // The same content computed twice (two sequences with one prefix at once): keep the first.
            if self.hash_of[b as usize].is_none() && !self.by_hash.contains_key(&h) {
                self.by_hash.insert(h, b);
                self.hash_of[b as usize] = Some(h);
            }
        }
    }

    /// Drops `seq`'s positions from `len` on. Returns a copy the backend must make when the block now partly kept
    /// was shared (its rows before `len` must be copied to the new block).
    pub fn truncate(&mut self, seq: SeqId, len: usize) -> Option<BlockCopy> {
        let bt = self.block_tokens;
        let s = self.seqs.get_mut(&seq)?;
        if len >= s.tokens.len() {
            return None;
        }
        s.tokens.truncate(len);
        s.hashes.truncate(len / bt);
        let dropped: Vec<u32> = s.blocks.drain(len.div_ceil(bt)..).collect();
        let partial = (!len.is_multiple_of(bt)).then(|| *s.blocks.last().expect("INVARIANT: len > 0 has a block"));
        for b in dropped {
            self.drop_ref(b);
        }
        let b = partial?;
        if self.refs[b as usize] > 1 {
            // Shared: give this sequence its own copy to write into.
            let to = self.alloc(true).expect("INVARIANT: forced allocation always succeeds");
            self.refs[b as usize] -= 1;
            let s = self.seqs.get_mut(&seq).expect("INVARIANT: present above");
            *s.blocks.last_mut().expect("INVARIANT: present above") = to;
            return Some(BlockCopy { from: b, to });
        }
        self.unregister(b);
        None
    }

    /// Frees `seq`; its full registered blocks stay cached.
    pub fn release(&mut self, seq: SeqId) {
        if let Some(s) = self.seqs.remove(&seq) {
            for b in s.blocks {
                self.drop_ref(b);
            }
        }
    }

    /// Drops every cached block that no sequence holds (tests, and memory pressure from outside).
    pub fn evict_all(&mut self) {
        while let Some((_, b)) = self.lru.pop_first() {
            self.evict(b);
            self.push_free(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(n: usize, salt: u32) -> Vec<u32> {
        (0..n as u32).map(|i| i * 7 + salt).collect()
    }

    fn write(t: &mut BlockTable, seq: SeqId, tokens: &[u32]) {
        let len = t.seq_len(seq);
        t.reserve(seq, len + tokens.len()).expect("room");
        t.commit(seq, tokens);
    }

    #[test]
    fn prefix_is_shared_after_release_and_evicted_lru() {
        let mut t = BlockTable::new(8);
        let a = toks(40, 0); // 2 full blocks + 8
        write(&mut t, SeqId(1), &a);
        assert_eq!(t.blocks(SeqId(1)).len(), 3);
        t.release(SeqId(1));
        assert_eq!(t.usage().cached_blocks, 2);
        // Same first 35 tokens: both full blocks reused.
        assert_eq!(t.attach_prefix(SeqId(2), &a[..35]), 32);
        assert_eq!(t.blocks(SeqId(2)).len(), 2);
        // A different first block: nothing reused, even though block 2 matches.
        let mut b = a.clone();
        b[0] = 999;
        assert_eq!(t.attach_prefix(SeqId(3), &b), 0);
        t.release(SeqId(2));
        t.release(SeqId(3));
        // Fill the cache with other content: the old blocks are evicted.
        write(&mut t, SeqId(4), &toks(8 * 16, 5));
        assert_eq!(t.attach_prefix(SeqId(5), &a), 0);
        assert!(t.usage().evicted_blocks >= 2);
        assert!(t.reserve(SeqId(5), 16).is_err(), "all 8 blocks are in use by sequence 4");
    }

    #[test]
    fn the_cache_cap_evicts_lru_and_free_blocks_give_their_storage_back() {
        let mut t = BlockTable::new(64);
        t.set_max_cached_blocks(Some(3));
        // Storage follows allocation: 3 blocks for 40 tokens.
        write(&mut t, SeqId(1), &toks(40, 0));
        let created: Vec<u32> = t.take_storage_changes();
        assert_eq!(created.len(), 3);
        assert!(created.iter().all(|&b| t.is_stored(b)));
        assert_eq!(t.usage().stored_blocks, 3);
        // Released: the 2 full blocks stay cached (stored), the partial one is freed.
        t.release(SeqId(1));
        let changes = t.take_storage_changes();
        assert_eq!(changes.len(), 1);
        assert!(!t.is_stored(changes[0]));
        assert_eq!((t.usage().cached_blocks, t.usage().stored_blocks), (2, 2));
        // Many distinct prompts: never more than 3 cached blocks, and storage only for those.
        for salt in 1..20 {
            write(&mut t, SeqId(10 + salt as u64), &toks(64, salt * 1000));
            t.release(SeqId(10 + salt as u64));
            let u = t.usage();
            assert!(u.cached_blocks <= 3, "{u:?}");
            assert_eq!(u.stored_blocks, u.cached_blocks, "{u:?}");
        }
        let u = t.usage();
        assert_eq!((u.max_cached_blocks, u.used_blocks), (Some(3), 0));
        assert!(u.evicted_blocks >= 19 * 4 - 3);
        // The most recent prompt's last 3 blocks are the ones kept: its first block went first.
        let last = toks(64, 19_000);
        assert_eq!(t.attach_prefix(SeqId(99), &last), 0);
        // Lowering the cap evicts at once.
        t.release(SeqId(99));
        t.set_max_cached_blocks(Some(1));
        assert_eq!((t.usage().cached_blocks, t.usage().stored_blocks), (1, 1));
        t.set_max_cached_blocks(Some(0));
        assert_eq!((t.usage().cached_blocks, t.usage().stored_blocks), (0, 0));
    }

    /// With spilling on, every block evicted (past the cap, to make room, or all at once) is reported with the hash
    /// it was cached under, before its storage change is taken; with it off, none is.
    #[test]
    fn evicted_blocks_are_reported_for_the_disk_tier() {
        let mut t = BlockTable::new(4);
        t.set_spill(true);
        t.set_max_cached_blocks(Some(1));
        let a = toks(32, 0);
        write(&mut t, SeqId(1), &a);
        let hashes = t.seqs[&SeqId(1)].hashes.clone();
        let blocks = t.blocks(SeqId(1)).to_vec();
        t.release(SeqId(1));
        assert_eq!(t.take_spills(), vec![(hashes[0], blocks[0])], "past the cap");
        // Room for 4 new blocks: the one cached block is handed out again.
        write(&mut t, SeqId(2), &toks(64, 9));
        assert_eq!(t.take_spills(), vec![(hashes[1], blocks[1])], "to make room");
        t.set_max_cached_blocks(None);
        t.release(SeqId(2));
        t.evict_all();
        assert_eq!(t.take_spills().len(), 4, "all at once");
        t.set_spill(false);
        write(&mut t, SeqId(3), &a);
        t.release(SeqId(3));
        t.evict_all();
        assert_eq!(t.take_spills(), vec![]);
    }

    /// A block attached from disk whose content could not be written is undone: no longer cached under its hash.
    #[test]
    fn a_failed_load_is_detached() {
        let mut t = BlockTable::new(4);
        let a = toks(32, 0);
        assert_eq!(t.attach_prefix(SeqId(1), &a), 0, "nothing cached");
        let h = chain_hash(&t.last_hash(SeqId(1)), &a[..16]);
        let b = t.attach_loaded(SeqId(1), h, &a[..16]).expect("a block");
        assert_eq!((t.seq_len(SeqId(1)), t.usage().hit_tokens), (16, 16));
        t.detach_loaded(SeqId(1));
        assert_eq!((t.seq_len(SeqId(1)), t.blocks(SeqId(1)).len(), t.usage().hit_tokens), (0, 0, 0));
        assert!(!t.is_stored(b) && t.registered().count() == 0, "freed, not cached");
        assert_eq!(t.attach_prefix(SeqId(2), &a), 0);
    }

    #[test]
    fn rollback_unregisters_or_copies() {
        let mut t = BlockTable::new(16);
        let a = toks(32, 1);
        write(&mut t, SeqId(1), &a);
        // Roll back into the second block: it no longer holds what its hash says.
        assert_eq!(t.truncate(SeqId(1), 20), None);
        t.release(SeqId(1));
        assert_eq!(t.attach_prefix(SeqId(2), &a), 16);
        // Shared block: the rolled-back sequence gets a copy.
        write(&mut t, SeqId(2), &a[16..]);
        assert_eq!(t.attach_prefix(SeqId(3), &a), 32);
        let shared = t.blocks(SeqId(3))[1];
        let copy = t.truncate(SeqId(2), 20).expect("a copy");
        assert_eq!(copy.from, shared);
        assert_ne!(t.blocks(SeqId(2))[1], shared);
        assert_eq!(t.blocks(SeqId(3))[1], shared);
        assert_eq!(t.seq_len(SeqId(2)), 20);
    }

    /// A table of 64-position blocks (the GPU's pages) shares, hashes and rolls back by its own block size: the
    /// same chained hashes as 16-position blocks would never match them.
    #[test]
    fn block_size_is_the_tables_own() {
        let mut t = BlockTable::with_block_tokens(4, 64);
        assert_eq!((t.block_tokens(), t.usage().block_tokens), (64, 64));
        let a = toks(150, 3); // 2 full blocks + 22
        assert_eq!(t.blocks_needed(SeqId(1), 150), 3);
        write(&mut t, SeqId(1), &a);
        assert_eq!(t.blocks(SeqId(1)).len(), 3);
        assert_eq!(t.slot(SeqId(1), 130), (t.blocks(SeqId(1))[2], 2));
        t.release(SeqId(1));
        assert_eq!(t.usage().cached_blocks, 2);
        assert_eq!(t.attach_prefix(SeqId(2), &a[..127]), 64, "only whole 64-position blocks are shared");
        assert_eq!(t.attach_prefix(SeqId(3), &a), 128);
        let h = chain_hash(&t.last_hash(SeqId(3)), &toks(64, 9));
        assert_eq!(t.attach_loaded(SeqId(3), h, &toks(16, 9)), None, "a loaded block holds 64 positions");
        assert!(t.attach_loaded(SeqId(3), h, &toks(64, 9)).is_some());
        assert_eq!(t.seq_len(SeqId(3)), 192);
        let err = t.reserve(SeqId(4), 2 * 64).expect_err("one block left");
        assert_eq!((err.needed, err.available, err.block_tokens), (2, 1, 64));
        // Rolling back into the second block, which sequence 2 does not share: unregistered, no copy.
        assert_eq!(t.truncate(SeqId(3), 100), None);
        t.release(SeqId(3));
        assert_eq!(t.attach_prefix(SeqId(5), &a), 64);
    }
}
