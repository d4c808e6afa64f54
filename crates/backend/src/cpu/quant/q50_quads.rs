//! Q5_0 weights regrouped at load for the AVX-512 row kernels ("quads" layout).
//!
//! Each row stays in place and keeps its size; its blocks are taken four at a time (128 weights, 88 bytes) and
//! rewritten as one group:
//!
//! | bytes | content |
//! |---|---|
//! | 0..64 | the four blocks' 16 `qs` bytes, block `j` at `16 j` |
//! | 64..80 | the four blocks' `qh` (u32), block `j` at `64 + 4 j` |
//! | 80..88 | the four scales `d` (f16) |
//!
//! One 64-byte load then gives the low nibbles of all four blocks (weights 0..16 of each) and, shifted, the high
//! ones (16..32); one byte shuffle of the 16 `qh` bytes gathers each half's fifth bits into a 64-bit mask. The GGUF
//! blocks need two broadcasts, a blend, two scalar loads and a scale gather per two blocks instead. Each block's
//! fields stay whole (the 16-row panels gather them like GGUF's). The values, scales and so every product are
//! GGUF's, so results are bitwise those of the file's layout.
//!
//! Rows whose length is not a multiple of 128 keep the file's layout.

use super::blocks::{Q5_0_BYTES, QK};

/// Blocks per group.
pub const GROUP_BLOCKS: usize = 4;
/// Bytes per group (four Q5_0 blocks).
pub const GROUP_BYTES: usize = GROUP_BLOCKS * Q5_0_BYTES;

/// Whether rows of `k` elements can take this layout.
pub fn fits(k: usize) -> bool {
    k > 0 && k.is_multiple_of(GROUP_BLOCKS * QK)
}

/// Regroups one GGUF Q5_0 row (`src`) into `dst` (the same length).
///
/// # Panics
/// If the row length is not a whole number of groups or the lengths differ.
pub fn pack_row(src: &[u8], dst: &mut [u8]) {
    assert!(src.len().is_multiple_of(GROUP_BYTES), "Q5_0 quads: a row of {} bytes", src.len());
    assert_eq!(src.len(), dst.len(), "Q5_0 quads: destination size");
    for (g, out) in src.chunks_exact(GROUP_BYTES).zip(dst.chunks_exact_mut(GROUP_BYTES)) {
        for j in 0..GROUP_BLOCKS {
            let b = &g[j * Q5_0_BYTES..][..Q5_0_BYTES];
            out[16 * j..16 * j + 16].copy_from_slice(&b[6..22]);
            out[64 + 4 * j..68 + 4 * j].copy_from_slice(&b[2..6]);
            out[80 + 2 * j..82 + 2 * j].copy_from_slice(&b[0..2]);
        }
    }
}

/// Restores one regrouped row (`packed`) to GGUF Q5_0 blocks in `dst` (the same length).
pub fn unpack_row(packed: &[u8], dst: &mut [u8]) {
    assert_eq!(packed.len(), dst.len(), "Q5_0 quads: destination size");
    for (g, out) in packed.chunks_exact(GROUP_BYTES).zip(dst.chunks_exact_mut(GROUP_BYTES)) {
        for j in 0..GROUP_BLOCKS {
            let b = &mut out[j * Q5_0_BYTES..][..Q5_0_BYTES];
            b[0..2].copy_from_slice(&g[80 + 2 * j..82 + 2 * j]);
            b[2..6].copy_from_slice(&g[64 + 4 * j..68 + 4 * j]);
            b[6..22].copy_from_slice(&g[16 * j..16 * j + 16]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpack_restores_every_row() {
        for groups in [1usize, 2, 7, 38] {
            let rb = groups * GROUP_BYTES;
            let src: Vec<u8> = (0..rb).map(|i| (i * 7 + i / 251) as u8).collect();
            let mut packed = vec![0u8; rb];
            pack_row(&src, &mut packed);
            assert_ne!(packed, src);
            let mut back = vec![0u8; rb];
            unpack_row(&packed, &mut back);
            assert_eq!(back, src, "{groups} groups");
        }
    }

    #[test]
    fn groups_follow_the_documented_layout() {
        // Block j: d = 0x1100 + j, qh = bits j and 16 + j, qs byte i = 16 j + i.
        let mut src = vec![0u8; GROUP_BYTES];
        for j in 0..GROUP_BLOCKS {
            let b = &mut src[j * Q5_0_BYTES..][..Q5_0_BYTES];
            b[0..2].copy_from_slice(&(0x1100u16 + j as u16).to_le_bytes());
            b[2..6].copy_from_slice(&((1u32 << j) | (1u32 << (16 + j))).to_le_bytes());
            for i in 0..16 {
                b[6 + i] = (16 * j + i) as u8;
            }
        }
        let mut g = vec![0u8; GROUP_BYTES];
        pack_row(&src, &mut g);
        assert_eq!(g[..64], (0..64u8).collect::<Vec<_>>()[..]);
        for j in 0..GROUP_BLOCKS {
            let qh = u32::from_le_bytes(g[64 + 4 * j..68 + 4 * j].try_into().unwrap());
            assert_eq!(qh, (1 << j) | (1 << (16 + j)));
        }
        assert_eq!(g[80..88], [0x00, 0x11, 0x01, 0x11, 0x02, 0x11, 0x03, 0x11]);
    }
}
