//! Prefix-cache blocks on disk, so a coding agent's fixed system prompt and tools are warm again after a restart.
//!
//! One directory per model identity (a hash of the file's size, header and sampled contents, the KV layout version,
//! the engine version and the CPU attention kernel): anything else's blocks are never seen. One file per full block,
//! named by the block's chained hash, holding a header (magic, version, length, checksum of the data) and the block's
//! f16 keys and values. A file that fails any check is deleted and treated as missing (the checksum is CRC-32C-class
//! `crc32fast`: it guards against torn and corrupt files, not against someone who can write the user's own cache
//! directory; SHA-256 here cost ~10 ms per 16 MiB page of a 32B model, stalling the engine thread). Files are written to a
//! temporary name and renamed, so a crash leaves no torn block. The directory is kept under a byte budget by deleting
//! the oldest files.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use sha2::{Digest, Sha256};

use crate::kv_cache::{BlockHash, BlockTable};

/// How long one [`PrefixStore::save_pending`] call writes (at least one block), so a request that arrives while the
/// engine is idle waits at most about this long for the engine thread.
const SAVE_SLICE: Duration = Duration::from_millis(3);

const MAGIC: &[u8; 4] = b"SPKV";
/// Bumped whenever the block layout or the KV numerics change.
pub const KV_FORMAT_VERSION: u32 = 3;
const HEADER_BYTES: usize = 4 + 4 + 8 + 4;

/// A short, stable identity of a model file: size, the first MiB (header, metadata, tensor table) and 16 samples
/// of 64 KiB spread over the weights; with the KV format and engine versions and the CPU attention kernel in use.
pub fn model_identity(bytes: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update((bytes.len() as u64).to_le_bytes());
    h.update(&bytes[..bytes.len().min(1 << 20)]);
    for i in 0..16 {
        let at = bytes.len() / 16 * i;
        h.update(&bytes[at..(at + (64 << 10)).min(bytes.len())]);
    }
    h.update(KV_FORMAT_VERSION.to_le_bytes());
    h.update(env!("CARGO_PKG_VERSION").as_bytes());
    // The attention kernel's rounding (f32 or bf16 products) shapes every layer's keys and values after the first.
    h.update(format!("{:?}", backend::cpu::attention::AttnKernel::selected()).as_bytes());
    hex(&h.finalize()[..12])
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn checksum(data: &[u8]) -> [u8; 4] {
    crc32fast::hash(data).to_le_bytes()
}

fn as_bytes(v: &[u16]) -> &[u8] {
    // SAFETY: u16 has no padding and any byte pattern is a valid u8; the length is exact.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

pub struct PrefixStore {
    dir: PathBuf,
    max_bytes: u64,
    /// Blocks on disk: file size and last write, for the budget.
    files: HashMap<BlockHash, (u64, SystemTime)>,
    total_bytes: u64,
}

impl PrefixStore {
    /// Opens (creating) the store for a model under `root`, keeping at most `max_bytes` of blocks.
    pub fn open(root: &Path, identity: &str, max_bytes: u64) -> std::io::Result<Self> {
        let dir = root.join(identity);
        std::fs::create_dir_all(&dir)?;
        let mut files = HashMap::new();
        let mut total_bytes = 0;
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.ends_with(".tmp") {
                let _ = std::fs::remove_file(entry.path());
                continue;
            }
            let Some(h) = name.strip_suffix(".kv").and_then(parse_hash) else { continue };
            let meta = entry.metadata()?;
            total_bytes += meta.len();
            files.insert(h, (meta.len(), meta.modified().unwrap_or(SystemTime::UNIX_EPOCH)));
        }
        let mut store = PrefixStore { dir, max_bytes, files, total_bytes };
        store.enforce_budget();
        Ok(store)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn contains(&self, h: &BlockHash) -> bool {
        self.files.contains_key(h)
    }

    pub fn num_blocks(&self) -> usize {
        self.files.len()
    }

    pub fn total_bytes(&self) -> u64 {
        self.total_bytes
    }

    fn path(&self, h: &BlockHash) -> PathBuf {
        self.dir.join(format!("{}.kv", hex(h)))
    }

    /// Reads block `h` into `dst`; false (and the file removed) when it is missing or fails a check.
    pub fn load(&mut self, h: &BlockHash, dst: &mut [u16]) -> bool {
        if !self.contains(h) {
            return false;
        }
        let ok = self.read(h, dst).unwrap_or(false);
        if !ok {
            self.remove(h);
        }
        ok
    }

    /// Reads blocks `hs[i]` into `dsts[i]` on several threads (reading and checking a block is independent of the
    /// others); returns how many of the first blocks loaded before the first that failed (missing or failing a
    /// check; those are removed as in [`Self::load`]).
    pub fn load_many<D: AsMut<[u16]> + Send>(&mut self, hs: &[BlockHash], dsts: &mut [D]) -> usize {
        let ok = self.read_many(hs, dsts);
        self.forget_failed(hs, &ok)
    }

    /// [`Self::load_many`]'s reads alone, which share the store (a reader thread can run them while another
    /// thread uses what an earlier call read): whether each block loaded.
    pub fn read_many<D: AsMut<[u16]> + Send>(&self, hs: &[BlockHash], dsts: &mut [D]) -> Vec<bool> {
        let threads = std::thread::available_parallelism().map_or(4, |n| n.get()).clamp(1, 16);
        let per = hs.len().div_ceil(threads).max(1);
        std::thread::scope(|sc| {
            let jobs: Vec<_> = hs
                .chunks(per)
                .zip(dsts.chunks_mut(per))
                .map(|(hs, ds)| {
                    sc.spawn(move || {
                        hs.iter()
                            .zip(ds)
                            .map(|(h, d)| self.contains(h) && self.read(h, d.as_mut()).unwrap_or(false))
                            .collect::<Vec<bool>>()
                    })
                })
                .collect();
            jobs.into_iter().flat_map(|j| j.join().unwrap_or_default()).collect::<Vec<bool>>()
        })
    }

    /// After [`Self::read_many`]: removes the blocks that failed, and returns how many of the first loaded.
    pub fn forget_failed(&mut self, hs: &[BlockHash], ok: &[bool]) -> usize {
        for (h, _) in hs.iter().zip(ok).filter(|(_, ok)| !**ok) {
            if self.contains(h) {
                self.remove(h);
            }
        }
        ok.iter().take_while(|&&o| o).count()
    }

    fn read(&self, h: &BlockHash, dst: &mut [u16]) -> std::io::Result<bool> {
        let mut f = std::fs::File::open(self.path(h))?;
        let mut header = [0u8; HEADER_BYTES];
        f.read_exact(&mut header)?;
        let len = u64::from_le_bytes(header[8..16].try_into().expect("INVARIANT: 8 bytes"));
        if &header[..4] != MAGIC
            || u32::from_le_bytes(header[4..8].try_into().expect("INVARIANT: 4 bytes")) != KV_FORMAT_VERSION
            || len != std::mem::size_of_val(dst) as u64
        {
            return Ok(false);
        }
        // SAFETY: as `as_bytes`, mutably; every byte pattern is a valid u16.
        let bytes = unsafe { std::slice::from_raw_parts_mut(dst.as_mut_ptr() as *mut u8, std::mem::size_of_val(dst)) };
        f.read_exact(bytes)?;
        let mut rest = [0u8; 1];
        Ok(f.read(&mut rest)? == 0 && checksum(bytes) == header[16..20])
    }

    /// Writes block `h` (no-op if present), then trims the store to its budget.
    pub fn save(&mut self, h: &BlockHash, data: &[u16]) -> std::io::Result<()> {
        if self.contains(h) || self.max_bytes == 0 {
            return Ok(());
        }
        let bytes = as_bytes(data);
        let path = self.path(h);
        let tmp = path.with_extension("tmp");
        {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(MAGIC)?;
            f.write_all(&KV_FORMAT_VERSION.to_le_bytes())?;
            f.write_all(&(bytes.len() as u64).to_le_bytes())?;
            f.write_all(&checksum(bytes))?;
            f.write_all(bytes)?;
        }
        std::fs::rename(&tmp, &path)?;
        let size = (HEADER_BYTES + bytes.len()) as u64;
        self.files.insert(*h, (size, SystemTime::now()));
        self.total_bytes += size;
        self.enforce_budget();
        Ok(())
    }

    /// The runners' idle work: writes blocks of `table`'s prefix cache that are not on disk yet, for about
    /// [`SAVE_SLICE`] (at least one block), reading each through `fetch(block, buf)`; true if more remain. An error
    /// (a failed copy, a full or read-only disk) is the caller's to report; it then drops the store.
    pub fn save_pending(
        &mut self,
        table: &BlockTable,
        buf: &mut Vec<u16>,
        mut fetch: impl FnMut(u32, &mut Vec<u16>) -> Result<(), String>,
    ) -> Result<bool, String> {
        let start = Instant::now();
        let pending: Vec<(BlockHash, u32)> =
            table.registered().filter(|(h, _)| !self.contains(h)).map(|(h, b)| (*h, b)).take(64).collect();
        for (i, (h, b)) in pending.iter().enumerate() {
            fetch(*b, buf)?;
            self.save(h, buf).map_err(|e| e.to_string())?;
            if start.elapsed() >= SAVE_SLICE {
                return Ok(i + 1 < pending.len() || pending.len() == 64);
            }
        }
        Ok(pending.len() == 64)
    }

    fn remove(&mut self, h: &BlockHash) {
        let _ = std::fs::remove_file(self.path(h));
        if let Some((size, _)) = self.files.remove(h) {
            self.total_bytes -= size;
        }
    }

    fn enforce_budget(&mut self) {
        if self.total_bytes <= self.max_bytes {
            return;
        }
        let mut by_age: Vec<(SystemTime, BlockHash)> = self.files.iter().map(|(h, (_, t))| (*t, *h)).collect();
        by_age.sort();
        for (_, h) in by_age {
            if self.total_bytes <= self.max_bytes {
                break;
            }
            self.remove(&h);
        }
    }
}

fn parse_hash(s: &str) -> Option<BlockHash> {
    if s.len() != 32 {
        return None;
    }
    let mut h = [0u8; 16];
    for (i, b) in h.iter_mut().enumerate() {
        *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_corruption_and_budget() {
        let root = std::env::temp_dir().join(format!("splash-prefix-store-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let block: Vec<u16> = (0..1000u16).collect();
        let size = (HEADER_BYTES + 2000) as u64;
        let h = |i: u8| [i; 16];
        {
            let mut s = PrefixStore::open(&root, "m", 3 * size).expect("open");
            for i in 0..4 {
                s.save(&h(i), &block).expect("save");
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            // Over budget: the oldest went.
            assert_eq!(s.num_blocks(), 3);
            assert!(!s.contains(&h(0)));
        }
        let mut s = PrefixStore::open(&root, "m", 3 * size).expect("reopen");
        let mut out = vec![0u16; 1000];
        assert!(s.load(&h(3), &mut out));
        assert_eq!(out, block);
        // Wrong size asked: refused and dropped.
        assert!(!s.load(&h(2), &mut vec![0u16; 999]));
        assert!(!s.contains(&h(2)));
        // A flipped byte fails the checksum.
        let p = s.path(&h(1));
        let mut bytes = std::fs::read(&p).expect("read");
        bytes[HEADER_BYTES + 10] ^= 1;
        std::fs::write(&p, bytes).expect("write");
        assert!(!s.load(&h(1), &mut out));
        assert!(!p.exists());
        // Several at once: the loaded prefix stops at the first missing block.
        let mut outs = vec![vec![0u16; 1000]; 3];
        assert_eq!(s.load_many(&[h(3), h(4), h(3)], &mut outs), 1);
        assert_eq!(outs[0], block);
        s.save(&h(5), &block).expect("save");
        let mut outs = vec![vec![0u16; 1000]; 2];
        assert_eq!(s.load_many(&[h(5), h(3)], &mut outs), 2);
        assert!(outs.iter().all(|o| *o == block));
        // Another model's directory sees nothing.
        assert_eq!(PrefixStore::open(&root, "other", size).expect("open").num_blocks(), 0);
        let _ = std::fs::remove_dir_all(&root);
    }
}
