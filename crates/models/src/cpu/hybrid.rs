//! The CPU runner's part for the hybrid models' recurrent state (`crate::state`): resuming a request where both its
//! KV blocks and a state checkpoint are (in memory or in the disk tier), rebuilding a state that was cut back by
//! replaying its tokens from the nearest checkpoint, and writing checkpoints to the disk tier while idle.

use backend::{AttnRows, SeqRows};

use super::CpuRunner;
use crate::kv_cache::{self, BLOCK_TOKENS, BlockHash};
use crate::state::{StateRefs, disk_key};
use crate::{Result, SeqId};

impl CpuRunner {
    /// [`crate::Runner::attach_prefix`] for a hybrid: the longest prefix of `tokens` whose blocks are cached (in
    /// memory, then on disk) and whose end has a state checkpoint (in memory or on disk); the state resumes there.
    pub(super) fn attach_hybrid(&mut self, seq: SeqId, tokens: &[u32]) -> usize {
        let bt = BLOCK_TOKENS;
        let mut chain = self.table.cached_chain(tokens);
        let in_memory = chain.len();
        if let Some(store) = &self.store {
            while (chain.len() + 1) * bt <= tokens.len() {
                let h = kv_cache::chain_hash(chain.last().unwrap_or(&[0; 16]), &tokens[chain.len() * bt..][..bt]);
                if !store.contains(&h) {
                    break;
                }
                chain.push(h);
            }
        }
        let Some(st) = self.state.as_ref() else { return 0 };
        let store = &self.store;
        let blocks = st.longest_checkpoint(&chain, |h| store.as_ref().is_some_and(|s| s.contains(&disk_key(h))));
        let mut n = self.table.attach_prefix_upto(seq, tokens, blocks.min(in_memory) * bt);
        if n < blocks * bt {
            n = self.attach_from_disk(seq, tokens, n, blocks * bt);
        }
        // The state at the longest attached block with a checkpoint that loads (the zero state at worst).
        let resumed = (1..=n / bt).rev().find(|&i| self.resume_at(seq, chain[i - 1], i * bt)).map_or(0, |i| i * bt);
        if resumed == 0
            && let Some(st) = self.state.as_mut()
            && st.resume(&mut self.backend, seq, &[], 0).is_err()
        {
            // No memory for even a zero state: the next pass makes one (or reports the failure).
            st.release(seq, &self.table);
        }
        if resumed < n {
            self.table.truncate(seq, resumed);
            self.free_kv();
        }
        resumed
    }

    /// Starts `seq`'s state from the checkpoint of block `hash` (`len` tokens), in memory or on disk; false when
    /// there is none or it does not load.
    fn resume_at(&mut self, seq: SeqId, hash: BlockHash, len: usize) -> bool {
        let Some(st) = self.state.as_mut() else { return false };
        if st.has_checkpoint(&hash) {
            return st.resume(&mut self.backend, seq, &[hash], 1).is_ok_and(|l| l == len);
        }
        let Some(store) = self.store.as_mut() else { return false };
        let key = disk_key(&hash);
        let mut words = vec![0u16; 2 * st.state_len()];
        store.contains(&key)
            && store.load(&key, &mut words)
            && st.resume_from_words(&mut self.backend, seq, len, hash, &words).is_ok()
    }

    /// Writes one state checkpoint that is not on disk yet (the idle work after the blocks); true if more remain.
    pub(super) fn save_checkpoint(&mut self) -> bool {
        let (Some(st), Some(store)) = (self.state.as_ref(), self.store.as_mut()) else { return false };
        let pending: Vec<BlockHash> =
            st.checkpoint_hashes().into_iter().filter(|h| !store.contains(&disk_key(h))).collect();
        let Some(h) = pending.first() else { return false };
        let saved: std::result::Result<(), String> = match st.checkpoint_words(&mut self.backend, h) {
            Ok(Some(words)) => store.save(&disk_key(h), &words).map_err(|e| e.to_string()),
            Ok(None) => Ok(()),
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = saved {
            self.disable_store(&e);
            return false;
        }
        pending.len() > 1
    }

    /// Runs `seq`'s tokens `from..to` (already in its blocks) through the model again, which brings its recurrent
    /// state from `from` tokens to `to`: no logits, each position's keys and values rewritten as they were (the CPU
    /// backend computes a position bitwise the same in any batch).
    fn replay(&mut self, seq: SeqId, from: usize, to: usize) -> Result<()> {
        let head = (self.output_head.as_ref(), self.output_rows());
        let Some(states) = self.state.as_mut() else { return Ok(()) };
        let tokens = self.table.tokens(seq)[from..to].to_vec();
        let positions: Vec<usize> = (from..to).collect();
        let slots: Vec<(u32, usize)> = positions.iter().map(|&p| self.table.slot(seq, p)).collect();
        let seqs = [SeqRows { blocks: self.table.blocks(seq), start_pos: from, num_rows: to - from }];
        let rows = AttnRows { positions: &positions, slots: &slots, seqs: &seqs };
        let refs = StateRefs { states: vec![states.state_mut(&mut self.backend, seq)?], snapshots: Vec::new() };
        self.model.forward_states(&mut self.backend, &mut self.kv, refs, &tokens, &rows, &[], head)?;
        Ok(())
    }

    /// Cuts `seq`'s recurrent state back to its block table's length (or rebuilds a state a failed pass left
    /// half-advanced): a snapshot when one is at that length, else a checkpoint or the start and a replay.
    pub(super) fn sync_state(&mut self, seq: SeqId) -> Result<()> {
        let len = self.table.seq_len(seq);
        let Some(states) = self.state.as_mut() else { return Ok(()) };
        if let Some(r) = states.truncate(&mut self.backend, seq, len, &self.table)? {
            self.replay(seq, r.from, r.to)?;
        }
        Ok(())
    }
}
