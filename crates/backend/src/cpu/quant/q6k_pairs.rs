//! Q6_K weights interleaved at load for the AVX-512 row kernels ("pairs" layout).
//!
//! The rows of a pair `(2p, 2p+1)` alternate super-block by super-block: A's block 0, B's block 0, A's block 1, …
//! (a missing last row counts as zeros). The blocks themselves are GGUF's, unchanged. A kernel then unpacks both
//! rows' block `s` and loads each prepared activation vector once for both, and the bytes still arrive as one
//! ascending stream (two rows read side by side from the file's layout are two streams, which the hardware
//! prefetchers serve badly; see `q4k_pairs`).

use super::blocks::{Q6_K_BYTES, QK_K};

/// Bytes per pair of rows of `k` elements.
pub fn pair_bytes(k: usize) -> usize {
    2 * (k / QK_K) * Q6_K_BYTES
}

/// Packs pairs `pairs` of the GGUF Q6_K matrix `w` (`rows` rows of `k` elements) into `dst`, which holds exactly
/// those pairs.
///
/// # Panics
/// If `k` is not a multiple of 256, `w` is too short, or `dst` is not `pairs.len()` pairs long.
pub fn pack_pairs(w: &[u8], rows: usize, k: usize, pairs: std::ops::Range<usize>, dst: &mut [u8]) {
    assert!(k.is_multiple_of(QK_K), "Q6_K pairs: k = {k} is not a multiple of {QK_K}");
    let nsb = k / QK_K;
    let rb = nsb * Q6_K_BYTES;
    assert!(w.len() >= rows * rb, "Q6_K pairs: weights too short");
    assert_eq!(dst.len(), pairs.len() * pair_bytes(k), "Q6_K pairs: destination size");
    for (i, p) in pairs.enumerate() {
        for half in 0..2 {
            let r = 2 * p + half;
            for sb in 0..nsb {
                let to = &mut dst[(i * 2 * nsb + 2 * sb + half) * Q6_K_BYTES..][..Q6_K_BYTES];
                if r < rows {
                    to.copy_from_slice(&w[r * rb + sb * Q6_K_BYTES..][..Q6_K_BYTES]);
                } else {
                    to.fill(0);
                }
            }
        }
    }
}

/// Row `r`'s GGUF blocks (`k / 256 · 210` bytes) from the packed matrix `packed`.
pub fn unpack_row(packed: &[u8], k: usize, r: usize, dst: &mut [u8]) {
    let nsb = k / QK_K;
    let pair = &packed[(r / 2) * pair_bytes(k)..][..pair_bytes(k)];
    for sb in 0..nsb {
        dst[sb * Q6_K_BYTES..][..Q6_K_BYTES].copy_from_slice(&pair[(2 * sb + r % 2) * Q6_K_BYTES..][..Q6_K_BYTES]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpack_restores_every_row() {
        for nsb in [1usize, 2, 6, 35] {
            let k = nsb * QK_K;
            for rows in [1usize, 2, 3, 6] {
                let rb = nsb * Q6_K_BYTES;
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
}
