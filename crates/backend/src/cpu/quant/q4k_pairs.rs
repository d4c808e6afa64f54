//! Q4_K weights repacked at load for the AVX-512 row kernels ("pairs" layout).
//!
//! The row kernels regroup four super-blocks of a weight row so that one vector lane meets one sub-block scale
//! (lane `4g+c` holds dword `d` of 32-byte chunk `c` of super-block `g`, vector `d` of 8). Done per call, that
//! regrouping was a 16×8 dword transpose per group, 30% of a one-row product. Here it is done once, at load, and
//! two weight rows are interleaved group by group, so a kernel loads each activation vector once for both rows.
//!
//! Layout, per pair of rows `(2p, 2p+1)` (a missing last row counts as zeros), with `nsb = 4·G + rem` super-blocks
//! per row: G units of both rows' groups of super-blocks `4g..4g+4`, then the tail: for `rem` 1 or 2 one mixed group
//! (slots `0..rem` row A's last super-blocks, slots `2..2+rem` row B's), for `rem` 3 one more unit of both rows'
//! last groups (slot 3 empty). A group has a 64-byte head line (the 16-byte head `d`, `dmin`, 12 scale bytes of each
//! slot) and 8 vectors of quants (lane `4g+c` of vector `d` = dword `d` of 32-byte chunk `c` of slot `g`). A unit of
//! two groups interleaves them line by line in the order the kernels read them: head A, head B, then vector `d` of A
//! and of B for `d = 0..8` (one ascending stream: two interleaved streams defeated the hardware prefetchers). Empty
//! slots are zeros. The bytes are those of the GGUF blocks, moved: [`unpack_row`] restores a row exactly.

use super::blocks::{Q4_K_BYTES, QK_K};

/// Bytes of one group of four super-block slots.
pub const GROUP_BYTES: usize = 576;

/// Where super-block `sb` of row `row_in_pair` lies inside its pair: the byte offset of its group's head line, of
/// its group's quant vector 0, the distance between its quant vectors, and its slot in the group.
pub(super) fn locate(nsb: usize, row_in_pair: usize, sb: usize) -> (usize, usize, usize, usize) {
    let (full, rem) = (nsb / 4, nsb % 4);
    let unit = 2 * GROUP_BYTES;
    if sb < 4 * full || rem == 3 {
        let base = (sb / 4) * unit;
        (base + 64 * row_in_pair, base + 128 + 64 * row_in_pair, 128, sb % 4)
    } else {
        let base = full * unit;
        (base, base + 64, 64, sb - 4 * full + 2 * row_in_pair)
    }
}

/// Groups per pair of rows.
fn pair_groups(nsb: usize) -> usize {
    let (full, rem) = (nsb / 4, nsb % 4);
    2 * full + [0, 1, 1, 2][rem]
}

/// Bytes per pair of rows of `k` elements.
pub fn pair_bytes(k: usize) -> usize {
    pair_groups(k / QK_K) * GROUP_BYTES
}

/// Packs pairs `pairs` of the GGUF Q4_K matrix `w` (`rows` rows of `k` elements) into `dst`, which holds exactly
/// those pairs.
///
/// # Panics
/// If `k` is not a multiple of 256, `w` is too short, or `dst` is not `pairs.len()` pairs long.
pub fn pack_pairs(w: &[u8], rows: usize, k: usize, pairs: std::ops::Range<usize>, dst: &mut [u8]) {
    assert!(k.is_multiple_of(QK_K), "Q4_K pairs: k = {k} is not a multiple of {QK_K}");
    let nsb = k / QK_K;
    let rb = nsb * Q4_K_BYTES;
    let pb = pair_bytes(k);
    assert!(w.len() >= rows * rb, "Q4_K pairs: weights too short");
    assert_eq!(dst.len(), pairs.len() * pb, "Q4_K pairs: destination size");
    dst.fill(0);
    for (i, p) in pairs.enumerate() {
        let pair = &mut dst[i * pb..(i + 1) * pb];
        for half in 0..2 {
            let r = 2 * p + half;
            if r >= rows {
                continue;
            }
            for sb in 0..nsb {
                let blk = &w[r * rb + sb * Q4_K_BYTES..][..Q4_K_BYTES];
                let (head, q0, stride, s) = locate(nsb, half, sb);
                pair[head + 16 * s..][..16].copy_from_slice(&blk[..16]);
                // Vector d's slot lane gets dword d of chunks 0..4: 16 contiguous bytes per vector.
                let qs: &[u8; 128] = blk[16..].try_into().expect("INVARIANT: 128 quant bytes");
                for d in 0..8 {
                    let lane: &mut [u8; 16] =
                        (&mut pair[q0 + stride * d + 16 * s..][..16]).try_into().expect("INVARIANT: 16 bytes");
                    for c in 0..4 {
                        lane[4 * c..4 * c + 4].copy_from_slice(&qs[32 * c + 4 * d..32 * c + 4 * d + 4]);
                    }
                }
            }
        }
    }
}

/// Row `r`'s GGUF blocks (`k / 256 · 144` bytes) from the packed matrix `packed`.
pub fn unpack_row(packed: &[u8], k: usize, r: usize, dst: &mut [u8]) {
    let nsb = k / QK_K;
    let pair = &packed[(r / 2) * pair_bytes(k)..][..pair_bytes(k)];
    for sb in 0..nsb {
        let blk = &mut dst[sb * Q4_K_BYTES..][..Q4_K_BYTES];
        let (head, q0, stride, s) = locate(nsb, r % 2, sb);
        blk[..16].copy_from_slice(&pair[head + 16 * s..][..16]);
        for c in 0..4 {
            for d in 0..8 {
                blk[16 + 32 * c + 4 * d..][..4].copy_from_slice(&pair[q0 + stride * d + 4 * (4 * s + c)..][..4]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpack_restores_every_row() {
        for nsb in 1..=9 {
            let k = nsb * QK_K;
            for rows in [1usize, 2, 3, 6] {
                let rb = nsb * Q4_K_BYTES;
                let w: Vec<u8> = (0..rows * rb).map(|i| (i * 7 + i / 251) as u8).collect();
                let mut packed = vec![0u8; rows.div_ceil(2) * pair_bytes(k)];
                pack_pairs(&w, rows, k, 0..rows.div_ceil(2), &mut packed);
                let mut row = vec![0u8; rb];
                for r in 0..rows {
                    unpack_row(&packed, k, r, &mut row);
                    assert_eq!(row, w[r * rb..(r + 1) * rb], "nsb {nsb}, rows {rows}, row {r}");
                }
            }
        }
    }

    #[test]
    fn tails_fill_the_groups() {
        // k = 1536 (6 super-blocks): 2 full groups and one mixed group per pair, no padding beyond the pairing.
        assert_eq!(pair_groups(6), 3);
        assert_eq!(pair_bytes(1536), 3 * GROUP_BYTES);
        assert_eq!(pair_groups(35), 18);
        assert_eq!(pair_groups(8), 4);
    }
}
