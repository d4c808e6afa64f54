//! The weights' device layout: padded blocks and the field-by-field regrouping of Q4_K / Q6_K rows that the 8-bit
//! kernels load from.

use gguf::GgmlType;

/// The device layout of a matrix's bytes (rows of `cols` values): Q6_K blocks padded from 210 to 224 bytes (every
/// block 16-byte aligned); Q8_0 and Q5_0 blocks with two zero bytes after the f16 scale (36 and 24 bytes: the rest
/// 4-byte aligned); other types as stored. With `repack`, Q4_K and Q6_K rows are regrouped field by field instead
/// (same row sizes, [`repack_row`]).
pub(super) fn device_layout(ty: GgmlType, cols: usize, bytes: &[u8], repack: bool) -> std::borrow::Cow<'_, [u8]> {
    if repack && matches!(ty, GgmlType::Q4_K | GgmlType::Q6_K) && cols.is_multiple_of(256) {
        let (from, to) = if ty == GgmlType::Q4_K { (144, 144) } else { (210, 224) };
        let nsb = cols / 256;
        let mut out = vec![0u8; bytes.len() / from * to];
        for (src, dst) in bytes.chunks_exact(nsb * from).zip(out.chunks_exact_mut(nsb * to)) {
            repack_row(ty, nsb, src, dst);
        }
        return std::borrow::Cow::Owned(out);
    }
    let (from, to, at) = match ty {
        GgmlType::Q6_K => (210, 224, 210),
        GgmlType::Q8_0 => (34, 36, 2),
        GgmlType::Q5_0 => (22, 24, 2),
        _ => return std::borrow::Cow::Borrowed(bytes),
    };
    let mut out = Vec::with_capacity(bytes.len() / from * to);
    for b in bytes.chunks_exact(from) {
        out.extend_from_slice(&b[..at]);
        out.extend(std::iter::repeat_n(0u8, to - from));
        out.extend_from_slice(&b[at..]);
    }
    std::borrow::Cow::Owned(out)
}

/// Bytes of one row of `cols` values of a `ty` matrix in its device layout ([`device_layout`]: padded Q6_K, Q8_0 and
/// Q5_0 blocks; rows repacked in place keep their size).
pub(super) fn device_row_bytes(ty: GgmlType, cols: usize) -> usize {
    let per_block = match ty {
        GgmlType::Q6_K => 224,
        GgmlType::Q8_0 => 36,
        GgmlType::Q5_0 => 24,
        _ => ty.block_bytes(),
    };
    cols / ty.block_len() * per_block
}

/// One row of `nsb` Q4_K or Q6_K superblocks (`src`, as stored) into the repacked layout (`dst`, zeroed). Pair p of
/// the row is its 64 weights that one thread of the 8-bit kernels takes (superblock p / 4); its 32 quant bytes are
/// split into two 16-byte halves stored in two regions, so threads p and p + 1 load neighbouring 16 bytes.
/// Q4_K: [first halves: nsb * 64][second halves: nsb * 64][headers d, dmin, scales: nsb * 16].
/// Q6_K: [ql first halves: nsb * 64][ql second halves: nsb * 64][qh first halves: nsb * 32][qh second halves:
/// nsb * 32][scales: nsb * 16][d: nsb * 2][zero padding: nsb * 14] (qh run r = 2 sb + hf is shared by two pairs).
fn repack_row(ty: GgmlType, nsb: usize, src: &[u8], dst: &mut [u8]) {
    let mut put = |at: usize, from: &[u8]| dst[at..at + from.len()].copy_from_slice(from);
    if ty == GgmlType::Q4_K {
        for (sb, b) in src.chunks_exact(144).enumerate() {
            for j in 0..4 {
                let p = 4 * sb + j;
                put(16 * p, &b[16 + 32 * j..32 + 32 * j]);
                put(nsb * 64 + 16 * p, &b[32 + 32 * j..48 + 32 * j]);
            }
            put(nsb * 128 + 16 * sb, &b[..16]);
        }
    } else {
        for (sb, b) in src.chunks_exact(210).enumerate() {
            for p4 in 0..4 {
                let p = 4 * sb + p4;
                put(16 * p, &b[32 * p4..32 * p4 + 16]);
                put(nsb * 64 + 16 * p, &b[32 * p4 + 16..32 * p4 + 32]);
            }
            for hf in 0..2 {
                let r = 2 * sb + hf;
                put(nsb * 128 + 16 * r, &b[128 + 32 * hf..144 + 32 * hf]);
                put(nsb * 160 + 16 * r, &b[144 + 32 * hf..160 + 32 * hf]);
            }
            put(nsb * 192 + 16 * sb, &b[192..208]);
            put(nsb * 208 + 2 * sb, &b[208..210]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The padded device layouts keep every field of every block, in order.
    #[test]
    fn device_layout_pads_blocks() {
        let q8: Vec<u8> = (0..68).map(|i| i as u8).collect();
        let out = device_layout(GgmlType::Q8_0, 64, &q8, true);
        assert_eq!(out.len(), 72);
        assert_eq!(&out[..4], &[0, 1, 0, 0]);
        assert_eq!(&out[4..36], &q8[2..34]);
        assert_eq!(&out[36..40], &[34, 35, 0, 0]);
        let q5: Vec<u8> = (0..22).map(|i| i as u8).collect();
        let out = device_layout(GgmlType::Q5_0, 32, &q5, true);
        assert_eq!((&out[..4], &out[4..]), (&[0u8, 1, 0, 0][..], &q5[2..]));
        let q6: Vec<u8> = (0..210).map(|i| i as u8).collect();
        let out = device_layout(GgmlType::Q6_K, 256, &q6, false);
        assert_eq!((out.len(), &out[..210], &out[210..]), (224, &q6[..], &[0u8; 14][..]));
        assert!(matches!(device_layout(GgmlType::Q4_K, 256, &q6[..144], false), std::borrow::Cow::Borrowed(_)));
    }

    /// The repacked Q4_K / Q6_K rows hold every byte of the row once, at the place the kernels read it from (the
    /// field offsets of ggml's block_q4_K / block_q6_K, written out here independently of `repack_row`).
    #[test]
    fn repacked_rows_are_permutations_with_fields_in_place() {
        let nsb = 3;
        for (ty, from, to) in [(GgmlType::Q4_K, 144usize, 144usize), (GgmlType::Q6_K, 210, 224)] {
            // Two rows; every byte distinct as a u16 tag (row, superblock, offset) kept in a side table.
            let rows = 2;
            let src: Vec<u8> = (0..rows * nsb * from).map(|i| (i * 7 % 251) as u8).collect();
            let out = device_layout(ty, nsb * 256, &src, true);
            assert_eq!(out.len(), rows * nsb * to);
            for r in 0..rows {
                let (s, o) = (&src[r * nsb * from..(r + 1) * nsb * from], &out[r * nsb * to..(r + 1) * nsb * to]);
                for sb in 0..nsb {
                    let b = &s[sb * from..(sb + 1) * from];
                    if ty == GgmlType::Q4_K {
                        // d, dmin, scales[12] at 0..16, qs[128] at 16..144; pair j of the superblock: qs[32j..32j+32).
                        assert_eq!(&o[nsb * 128 + 16 * sb..nsb * 128 + 16 * sb + 16], &b[0..16]);
                        for j in 0..4 {
                            let p = 4 * sb + j;
                            assert_eq!(&o[16 * p..16 * p + 16], &b[16 + 32 * j..16 + 32 * j + 16]);
                            assert_eq!(&o[nsb * 64 + 16 * p..nsb * 64 + 16 * p + 16], &b[32 + 32 * j..48 + 32 * j]);
                        }
                    } else {
                        // ql[128] at 0, qh[64] at 128, scales[16] at 192, d at 208.
                        for hf in 0..2 {
                            for pp in 0..2 {
                                let p = 4 * sb + 2 * hf + pp;
                                let ql = 64 * hf + 32 * pp;
                                assert_eq!(&o[16 * p..16 * p + 16], &b[ql..ql + 16]);
                                assert_eq!(&o[nsb * 64 + 16 * p..nsb * 64 + 16 * p + 16], &b[ql + 16..ql + 32]);
                            }
                            let q = 2 * sb + hf;
                            assert_eq!(
                                &o[nsb * 128 + 16 * q..nsb * 128 + 16 * q + 16],
                                &b[128 + 32 * hf..144 + 32 * hf]
                            );
                            assert_eq!(
                                &o[nsb * 160 + 16 * q..nsb * 160 + 16 * q + 16],
                                &b[144 + 32 * hf..160 + 32 * hf]
                            );
                        }
                        assert_eq!(&o[nsb * 192 + 16 * sb..nsb * 192 + 16 * sb + 16], &b[192..208]);
                        assert_eq!(&o[nsb * 208 + 2 * sb..nsb * 208 + 2 * sb + 2], &b[208..210]);
                    }
                }
                if ty == GgmlType::Q6_K {
                    assert!(o[nsb * 210..].iter().all(|&v| v == 0), "padding is zero");
                }
                let (mut a, mut c) = (s.to_vec(), o[..nsb * from].to_vec());
                a.sort_unstable();
                c.sort_unstable();
                assert_eq!(a, c, "{ty:?}: the same bytes");
            }
        }
    }
}
