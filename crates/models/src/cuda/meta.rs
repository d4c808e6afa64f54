//! A pass's metadata on the device (tokens, positions, sequence slots, logit rows, page tables) and the segments
//! a batch's rows are enqueued in.

use crate::{Batch, LogitsWanted};

/// Where a pass's metadata lies in `Scratch::meta` (device addresses), packed for its rows `m`, logit rows `r` and
/// sequences: tokens, positions and slots (`m` each), logit rows (`r`), then a page table per sequence. Graphs are
/// kept per (m, r, sequences), so a replay finds the same places.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Meta {
    pub tokens: u64,
    pub pos: u64,
    pub slot: u64,
    pub out_rows: u64,
    pub table: u64,
}

impl Meta {
    /// The layout for `m` rows, `r` logit rows, from `base`; and the u32 words it takes with `nchunks` page tables of
    /// `max_pages`.
    pub fn packed(base: u64, m: usize, r: usize, nchunks: usize, max_pages: usize) -> (Meta, usize) {
        let at = |words: usize| base + 4 * words as u64;
        let meta = Meta { tokens: at(0), pos: at(m), slot: at(2 * m), out_rows: at(3 * m), table: at(3 * m + r) };
        (meta, 3 * m + r + nchunks * max_pages)
    }
}

/// Writes a pass's metadata in the [`Meta::packed`] layout into `w`: each row's token, position and sequence slot,
/// the logit rows, then each sequence's page table (`pages(chunk)`, zero-padded to `max_pages`).
pub(super) fn pack_meta<'p>(batch: &Batch<'_>, pages: impl Fn(usize) -> &'p [u32], max_pages: usize, w: &mut [u32]) {
    let (m, r) = (batch.num_tokens(), batch.num_logit_rows());
    let mut put = |at: usize, v: u32| w[at] = v;
    let (mut t0, mut o) = (0usize, 0usize);
    for (ci, c) in batch.chunks.iter().enumerate() {
        for (j, &tok) in c.tokens.iter().enumerate() {
            put(t0 + j, tok);
            put(m + t0 + j, (c.start_pos + j) as u32);
            put(2 * m + t0 + j, ci as u32);
        }
        let pg = pages(ci);
        for p in 0..max_pages {
            put(3 * m + r + ci * max_pages + p, pg.get(p).copied().unwrap_or(0));
        }
        let n = c.tokens.len();
        let rows = match c.logits {
            LogitsWanted::Last if n > 0 => t0 + n - 1..t0 + n,
            LogitsWanted::None | LogitsWanted::Last => 0..0,
            LogitsWanted::All => t0..t0 + n,
        };
        for t in rows {
            put(3 * m + o, t as u32);
            o += 1;
        }
        t0 += n;
    }
}

/// A run of batch rows that goes through the layers together.
#[derive(Debug, Clone, Copy)]
pub(super) struct Seg {
    pub r0: usize,
    pub n: usize,
    /// Some: one long chunk, on tensor cores.
    pub gemm: Option<GemmChunk>,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct GemmChunk {
    /// Index of the chunk in the batch (its page table row).
    pub ci: usize,
    pub start_pos: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SeqId;

    /// What decode ahead relies on: a one-row pass's metadata is its token in word 0 and its position in word 1
    /// (`argmax_rows` writes the pick and the next position there), and the next position's metadata differs from
    /// it in those two words alone while the page table is the same (so a pass started ahead needs no copy), and
    /// only in the table and those words when it needs a new page (the copy then leaves word 0, the fed token).
    #[test]
    fn a_one_row_pass_differs_from_the_next_in_its_token_and_position() {
        let (max_pages, pages) = (4, vec![3u32, 9]);
        let packed = |pos: usize, token: u32, pages: &[u32]| {
            let toks = [token];
            let chunk = crate::SeqChunk { seq: SeqId(7), tokens: &toks, start_pos: pos, logits: LogitsWanted::Last };
            let batch = Batch { chunks: vec![chunk] };
            let (meta, words) = Meta::packed(4096, 1, 1, 1, max_pages);
            assert_eq!((meta.tokens, meta.pos), (4096, 4100));
            let mut w = vec![u32::MAX; words];
            pack_meta(&batch, |_| pages, max_pages, &mut w);
            w
        };
        let (a, b) = (packed(100, 11, &pages), packed(101, 12, &pages));
        assert_eq!((a[0], a[1], b[0], b[1]), (11, 100, 12, 101));
        assert_eq!(a[2..], b[2..]);
        let grown = [3u32, 9, 5];
        let c = packed(128, 13, &grown);
        assert_eq!(c[1], 128);
        assert_ne!(c[2..], a[2..]);
    }

    /// A pass's metadata lands where the kernels look for it: for each row its token, position and slot, the logit
    /// rows each chunk asks for, and each sequence's pages then zeros (written out here without `pack_meta`).
    #[test]
    fn pass_metadata_is_packed_where_the_kernels_read_it() {
        let toks: [&[u32]; 4] = [&[11, 12, 13], &[21, 22], &[31], &[]];
        let wants = [LogitsWanted::Last, LogitsWanted::All, LogitsWanted::None, LogitsWanted::Last];
        let chunks = (0..4)
            .map(|i| crate::SeqChunk { seq: SeqId(i as u64), tokens: toks[i], start_pos: 100 * i, logits: wants[i] })
            .collect();
        let batch = Batch { chunks };
        let (m, r, max_pages) = (batch.num_tokens(), batch.num_logit_rows(), 3);
        assert_eq!((m, r), (6, 3));
        let pages: [Vec<u32>; 4] = [vec![7], vec![8, 9], vec![], vec![4, 5, 6]];
        let (meta, words) = Meta::packed(1000, m, r, 4, max_pages);
        let mut w = vec![u32::MAX; words];
        pack_meta(&batch, |ci| &pages[ci], max_pages, &mut w);
        let at = |addr: u64, i: usize| w[(addr - 1000) as usize / 4 + i];
        let (tokens, pos, slot): (Vec<u32>, Vec<u32>, Vec<u32>) = (
            (0..m).map(|i| at(meta.tokens, i)).collect(),
            (0..m).map(|i| at(meta.pos, i)).collect(),
            (0..m).map(|i| at(meta.slot, i)).collect(),
        );
        assert_eq!(tokens, [11, 12, 13, 21, 22, 31]);
        assert_eq!(pos, [0, 1, 2, 100, 101, 200]);
        assert_eq!(slot, [0, 0, 0, 1, 1, 2]);
        assert_eq!((0..r).map(|i| at(meta.out_rows, i)).collect::<Vec<_>>(), [2, 3, 4]);
        let table: Vec<u32> = (0..4 * max_pages).map(|i| at(meta.table, i)).collect();
        assert_eq!(table, [7, 0, 0, 8, 9, 0, 0, 0, 0, 4, 5, 6]);
        assert_eq!(words, 3 * m + r + 4 * max_pages);
    }
}
