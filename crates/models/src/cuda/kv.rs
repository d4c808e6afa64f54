//! The GPU's KV pages under the shared KV system (`kv_cache::BlockTable`, pages of [`PAGE_SIZE`] positions): prefix
//! reuse across requests (full pages are registered under their chained hash as a pass fills them, stay cached after
//! their sequence ends, and are evicted least recently used), copy-on-write after a rollback into a shared page, and
//! the disk tier (`prefix_store`): cached pages written to disk while idle and read back into device pages when a
//! prompt's prefix is no longer in memory, so a restarted server finds them.
//!
//! A page on disk holds `[layer][k | v][PAGE_SIZE][kv_dim]` f16 values (the CPU's block layout at the GPU's page
//! size), in a directory of its own: the model's identity with the generated kernel source and the switches that
//! change the KV's bits, so neither the CPU's blocks nor another build's pages are ever read.
//!
//! Per-sequence state beyond K and V (a recurrent layer's state, checkpointed at page boundaries) would be keyed the
//! same way: by the chained hash of the page it ends, next to that page, so prefix reuse and the disk tier carry it.

use sha2::{Digest, Sha256};

use super::{CudaOptions, CudaRunner, PAGE_SIZE};
use backend::Backend;
use backend::cuda::Pinned;

use crate::SeqId;
use crate::kv_cache::chain_hash;
use crate::prefix_store::{PrefixStore, model_identity};

/// Pages read back from disk (on several threads) into one half of the staging while the other half's are copied to
/// the device, two batches of at most half this many ...
const LOAD_BATCH: usize = 32;
/// ... in at most this many bytes of page-locked staging (a 32B model's page is 16 MiB).
const STAGE_BYTES: usize = 256 << 20;

/// The disk tier's identity of a model on this backend: the file's identity, the kernel source (every constant and
/// instantiation) and the switches that change which kernels write the KV.
pub(super) fn identity(file_bytes: &[u8], source: &str, opts: &CudaOptions) -> String {
    let mut h = Sha256::new();
    h.update(model_identity(file_bytes).as_bytes());
    h.update(source.as_bytes());
    h.update(format!("gemm={} q8={} exact={} page={PAGE_SIZE}", opts.gemm, opts.q8, opts.exact_activations));
    let d = h.finalize();
    let hex: String = d[..12].iter().map(|b| format!("{b:02x}")).collect();
    format!("{hex}-cuda")
}

impl CudaRunner {
    /// Keeps cached prefix pages on disk under `root` (at most `max_bytes`), in this model's own directory: written
    /// while idle, read back when a prompt's prefix is not in device memory.
    pub fn enable_prefix_store(&mut self, root: &std::path::Path, max_bytes: u64) -> std::io::Result<&PrefixStore> {
        let store = PrefixStore::open(root, &self.identity, max_bytes)?;
        let restarted = store.num_blocks() > 0;
        self.store = Some(store);
        if restarted {
            self.ensure_stage();
        }
        Ok(self.store.as_ref().expect("INVARIANT: set above"))
    }

    /// Drops every cached prefix page no sequence is using.
    pub fn evict_prefix_cache(&mut self) {
        self.table.evict_all();
    }

    /// u16 values of one page over every layer (K and V): what a page on disk holds.
    fn page_values(&self) -> usize {
        self.kv.layout.block_words()
    }

    /// [`crate::Runner::attach_prefix`]: the longest prefix of `tokens` in cached pages, then from disk while the
    /// next page is there and intact and a page is free (`attach_from_disk`).
    pub(super) fn attach_cached_prefix(&mut self, seq: SeqId, tokens: &[u32]) -> usize {
        let n = self.table.attach_prefix(seq, tokens);
        if self.store.is_none() {
            return n;
        }
        let mut stage = self.stage.take();
        let n = self.attach_from_disk(seq, tokens, n, &mut stage);
        // The copies read the staging: done before it is written again.
        if let Err(e) = self.backend.gpu.sync() {
            eprintln!("warning: reading prefix pages back onto the GPU failed: {e}");
        }
        self.stage = stage;
        n
    }

    /// Pages per half of the staging ([`STAGE_BYTES`], at most [`LOAD_BATCH`] / 2).
    fn stage_half(&self) -> usize {
        (STAGE_BYTES / (4 * self.page_values())).clamp(1, LOAD_BATCH / 2)
    }

    /// The page-locked staging, allocated once (before the first request when the disk already holds pages: a
    /// restarted server's first prompt does not wait for it).
    fn ensure_stage(&mut self) {
        if self.stage.is_none() {
            match self.backend.gpu.alloc_pinned::<u16>(2 * self.stage_half() * self.page_values()) {
                Ok(s) => self.stage = Some(s),
                Err(e) => eprintln!("warning: no page-locked memory for reading prefix pages back: {e}"),
            }
        }
    }

    /// The pages on disk that continue `seq`'s `n` cached positions of `tokens`, attached and copied to the device:
    /// batches of pages read and checked on several threads into one half of the staging while the pages of the
    /// batch before are attached and copied out of the other half (one batch of copies, asynchronous, at the link's
    /// speed). Returns the positions `seq` holds then.
    fn attach_from_disk(&mut self, seq: SeqId, tokens: &[u32], mut n: usize, stage: &mut Option<Pinned<u16>>) -> usize {
        let (values, half) = (self.page_values(), self.stage_half());
        // The chain of pages the disk has from here on.
        let mut hashes = Vec::new();
        let mut prev = self.table.last_hash(seq);
        let store = self.store.as_ref().expect("INVARIANT: checked by the caller");
        while n + (hashes.len() + 1) * PAGE_SIZE <= tokens.len() {
            let at = n + hashes.len() * PAGE_SIZE;
            let h = chain_hash(&prev, &tokens[at..at + PAGE_SIZE]);
            if !store.contains(&h) {
                break;
            }
            hashes.push(h);
            prev = h;
        }
        if hashes.is_empty() {
            return n;
        }
        if stage.is_none() {
            self.ensure_stage();
            *stage = self.stage.take();
        }
        let Some(staging) = stage.as_mut() else { return n };
        let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DISABLE_TIMING);
        let copied = match (self.backend.gpu.ctx.new_event(flags), self.backend.gpu.ctx.new_event(flags)) {
            (Ok(a), Ok(b)) => [a, b],
            (Err(e), _) | (_, Err(e)) => {
                eprintln!("warning: reading prefix pages back: no CUDA event: {e:?}");
                return n;
            }
        };
        let Self { store, table, backend, kv, .. } = self;
        let store_ref = store.as_ref().expect("INVARIANT: checked by the caller");
        let (h0, h1) = staging.as_mut_slice()[..2 * half * values].split_at_mut(half * values);
        let mut halves = [h0, h1];
        let batches: Vec<&[_]> = hashes.chunks(half).collect();
        let mut ok = {
            let mut bufs: Vec<&mut [u16]> = halves[0].chunks_mut(values).take(batches[0].len()).collect();
            store_ref.read_many(batches[0], &mut bufs)
        };
        let mut failed: Vec<(crate::kv_cache::BlockHash, bool)> = Vec::new();
        for (i, batch) in batches.iter().enumerate() {
            let next = batches.get(i + 1).copied();
            let [a, b] = &mut halves;
            let (cur, other) = if i % 2 == 0 { (&**a, &mut **b) } else { (&**b, &mut **a) };
            // The copies of batch i - 1 read the other half: done before it is read into again.
            if next.is_some() && copied[(i + 1) % 2].synchronize().is_err() {
                break;
            }
            let loaded = ok.iter().take_while(|&&o| o).count();
            failed.extend(batch.iter().zip(&ok).map(|(h, o)| (*h, *o)));
            let (attached, next_ok) = std::thread::scope(|sc| {
                let reader = next.map(|nb| {
                    sc.spawn(move || {
                        let mut bufs: Vec<&mut [u16]> = other.chunks_mut(values).take(nb.len()).collect();
                        store_ref.read_many(nb, &mut bufs)
                    })
                });
                let start = n;
                let mut pages = Vec::with_capacity(loaded);
                for (h, buf) in batch.iter().zip(cur.chunks(values)).take(loaded) {
                    let Some(b) = table.attach_loaded(seq, *h, &tokens[n..n + PAGE_SIZE]) else { break };
                    pages.push((b, buf));
                    n += PAGE_SIZE;
                }
                let mut all = pages.len() == batch.len();
                if let Err(e) = backend.kv_blocks_from_host(kv, &pages) {
                    eprintln!("warning: reading prefix pages back onto the GPU failed: {e}");
                    // The pages hold nothing valid: the sequence keeps only the pages before them, and the pages
                    // (cached under their hashes once dropped) are evicted with the other unused ones.
                    table.truncate(seq, start);
                    table.evict_all();
                    n = start;
                    all = false;
                }
                all &= copied[i % 2].record(&backend.gpu.stream).is_ok();
                let next_ok = reader.map(|r| r.join().unwrap_or_default());
                (all, next_ok)
            });
            match next_ok {
                Some(o) if attached => ok = o,
                _ => break,
            }
        }
        let store = store.as_mut().expect("INVARIANT: checked by the caller");
        let (hs, oks): (Vec<_>, Vec<_>) = failed.into_iter().unzip();
        store.forget_failed(&hs, &oks);
        n
    }

    /// [`crate::Runner::idle_work`]: cached pages not yet on disk written there for a few milliseconds
    /// ([`PrefixStore::save_pending`]); true if more remain.
    pub(super) fn save_idle_pages(&mut self) -> bool {
        let Some(mut store) = self.store.take() else { return false };
        let mut buf = vec![0u16; self.page_values()];
        let (backend, kv) = (&mut self.backend, &self.kv);
        let saved = store.save_pending(&self.table, &mut buf, |b, buf| {
            backend.kv_block_to_host(kv, b, buf).map_err(|e| e.to_string())
        });
        match saved {
            Ok(more) => {
                self.store = Some(store);
                more
            }
            Err(e) => {
                // A full or read-only disk (or a failed copy) only costs the warm restart; stop trying.
                eprintln!("warning: prefix cache on disk disabled: {e}");
                false
            }
        }
    }
}
