//! ggml's tensor element formats: byte layouts, reference dequantization and reference quantization.
//!
//! In: a [`GgmlType`] and raw little-endian bytes (to dequantize) or `f32` values (to quantize). Out: `f32` values
//! or bytes, in ggml's element order. Every function checks lengths and returns an [`Error`] instead of
//! panicking; non-finite inputs give unspecified (but never panicking) results, as in ggml.
//!
//! These are *reference* implementations: scalar and written to follow ggml's `dequantize_row_*` and
//! `quantize_row_*_ref` operation for operation, so that they are bit-identical with ggml (tested against ggml and
//! gguf-py in `tests/quant_parity.rs`). They are the oracle for the SIMD kernels in `backend` and the quantizer
//! for synthetic model files, so quantization allocates nothing per block.
//!
//! # Block layouts
//!
//! All multi-byte fields are little-endian; `f16` is IEEE half precision. "Element `e`" counts from 0 inside a
//! block. `QK` = 32, `QK_K` = 256.
//!
//! | type | elements | bytes | fields (byte offset) | element `e` |
//! |---|---|---|---|---|
//! | F32  | 1 | 4 | `f32` | |
//! | F16  | 1 | 2 | `f16` | |
//! | BF16 | 1 | 2 | upper half of an `f32` | |
//! | Q4_0 | 32 | 18 | `d: f16` (0), `qs: [u8; 16]` (2) | `d·(q−8)`, `q` = low nibble of `qs[e]` for `e<16`, high nibble of `qs[e−16]` |
//! | Q4_1 | 32 | 20 | `d: f16` (0), `m: f16` (2), `qs` (4) | `d·q + m`, `q` as Q4_0 |
//! | Q5_0 | 32 | 22 | `d: f16` (0), `qh: u32` (2), `qs` (6) | `d·(q−16)`, `q` = Q4_0's nibble + 16·bit `e` of `qh` |
//! | Q5_1 | 32 | 24 | `d: f16` (0), `m: f16` (2), `qh: u32` (4), `qs` (8) | `d·q + m`, `q` as Q5_0 |
//! | Q8_0 | 32 | 34 | `d: f16` (0), `qs: [i8; 32]` (2) | `d·qs[e]` |
//! | Q8_1 | 32 | 36 | `d: f16` (0), `s: f16` (2) = `d·Σqs`, `qs: [i8; 32]` (4) | `d·qs[e]` |
//! | Q2_K | 256 | 84 | `scales: [u8; 16]` (0), `qs: [u8; 64]` (16), `d: f16` (80), `dmin: f16` (82) | see [`k_low`] |
//! | Q3_K | 256 | 110 | `hmask: [u8; 32]` (0), `qs: [u8; 64]` (32), `scales: [u8; 12]` (96), `d: f16` (108) | see [`k_low`] |
//! | Q4_K | 256 | 144 | `d: f16` (0), `dmin: f16` (2), `scales: [u8; 12]` (4), `qs: [u8; 128]` (16) | see [`k_quants`] |
//! | Q5_K | 256 | 176 | `d: f16` (0), `dmin: f16` (2), `scales: [u8; 12]` (4), `qh: [u8; 32]` (16), `qs: [u8; 128]` (48) | see [`k_quants`] |
//! | Q6_K | 256 | 210 | `ql: [u8; 128]` (0), `qh: [u8; 64]` (128), `scales: [i8; 16]` (192), `d: f16` (208) | see [`k_quants`] |
//! | Q8_K | 256 | 292 | `d: f32` (0), `qs: [i8; 256]` (4), `bsums: [i16; 16]` (260) = sums of each 16 `qs` | `d·qs[e]` |
//!
//! Q8_1 and Q8_K are activation formats (the other operand of the integer dot products); they are never stored in
//! model files but are supported here so the kernels' activation quantizers have an oracle.

mod fit;
mod float;
pub mod k_low;
pub mod k_quants;
mod legacy;

use crate::{Error, GgmlType, Result};

pub use k_low::q3_k_scale;
pub use k_quants::k_scale_min;

/// Elements per block of the legacy formats (Q4_0 ... Q8_1).
pub const QK: usize = 32;
/// Elements per super-block of the K formats (Q2_K ... Q8_K).
pub const QK_K: usize = 256;

/// Whether [`dequantize`] and [`quantize`] handle `ty`.
pub fn is_supported(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(ty, F32 | F16 | BF16 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q8_1 | Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | Q8_K)
}

/// Decodes whole blocks of `ty` from `data` into `out`, which must hold exactly the elements `data` encodes.
pub fn dequantize(ty: GgmlType, data: &[u8], out: &mut [f32]) -> Result<()> {
    use GgmlType::*;
    check_lengths("dequantize", ty, out.len(), data.len())?;
    match ty {
        F32 => each_block(data, out, float::dequantize_f32),
        F16 => each_block(data, out, float::dequantize_f16),
        BF16 => each_block(data, out, float::dequantize_bf16),
        Q4_0 => each_block(data, out, legacy::dequantize_q4_0),
        Q4_1 => each_block(data, out, legacy::dequantize_q4_1),
        Q5_0 => each_block(data, out, legacy::dequantize_q5_0),
        Q5_1 => each_block(data, out, legacy::dequantize_q5_1),
        Q8_0 => each_block(data, out, legacy::dequantize_q8_0),
        Q8_1 => each_block(data, out, legacy::dequantize_q8_1),
        Q2_K => each_block(data, out, k_low::dequantize_q2_k),
        Q3_K => each_block(data, out, k_low::dequantize_q3_k),
        Q4_K => each_block(data, out, k_quants::dequantize_q4_k),
        Q5_K => each_block(data, out, k_quants::dequantize_q5_k),
        Q6_K => each_block(data, out, k_quants::dequantize_q6_k),
        Q8_K => each_block(data, out, k_quants::dequantize_q8_k),
        I8 | I16 | I32 | I64 | F64 => return Err(unsupported("dequantize", ty)),
    }
    Ok(())
}

/// Encodes `x` (a whole number of blocks) as `ty`, like ggml's `quantize_row_*_ref`.
pub fn quantize(ty: GgmlType, x: &[f32]) -> Result<Vec<u8>> {
    let num_bytes = checked_row_bytes("quantize", ty, x.len())?;
    let mut out = vec![0u8; num_bytes];
    quantize_into(ty, x, &mut out)?;
    Ok(out)
}

/// Like [`quantize`], into a caller's buffer of exactly the encoded size (every byte is overwritten).
pub fn quantize_into(ty: GgmlType, x: &[f32], out: &mut [u8]) -> Result<()> {
    use GgmlType::*;
    check_lengths("quantize", ty, x.len(), out.len())?;
    match ty {
        F32 => each_input_block(x, out, float::quantize_f32),
        F16 => each_input_block(x, out, float::quantize_f16),
        BF16 => each_input_block(x, out, float::quantize_bf16),
        Q4_0 => each_input_block(x, out, legacy::quantize_q4_0),
        Q4_1 => each_input_block(x, out, legacy::quantize_q4_1),
        Q5_0 => each_input_block(x, out, legacy::quantize_q5_0),
        Q5_1 => each_input_block(x, out, legacy::quantize_q5_1),
        Q8_0 => each_input_block(x, out, legacy::quantize_q8_0),
        Q8_1 => each_input_block(x, out, legacy::quantize_q8_1),
        Q2_K => each_input_block(x, out, k_low::quantize_q2_k),
        Q3_K => each_input_block(x, out, k_low::quantize_q3_k),
        Q4_K => each_input_block(x, out, k_quants::quantize_q4_k),
        Q5_K => each_input_block(x, out, k_quants::quantize_q5_k),
        Q6_K => each_input_block(x, out, k_quants::quantize_q6_k),
        Q8_K => each_input_block(x, out, k_quants::quantize_q8_k),
        I8 | I16 | I32 | I64 | F64 => return Err(unsupported("quantize", ty)),
    }
    Ok(())
}

/// Bytes that `num_elements` of `ty` take, or an error naming the problem.
fn checked_row_bytes(op: &str, ty: GgmlType, num_elements: usize) -> Result<usize> {
    if !is_supported(ty) {
        return Err(unsupported(op, ty));
    }
    ty.row_bytes(num_elements).ok_or_else(|| {
        Error::Quant(format!(
            "{op} {ty}: {num_elements} elements is not a whole number of {}-element blocks",
            ty.block_len()
        ))
    })
}

/// Checks that `num_elements` values and `num_bytes` bytes are the same whole number of blocks of `ty`.
fn check_lengths(op: &str, ty: GgmlType, num_elements: usize, num_bytes: usize) -> Result<()> {
    if !is_supported(ty) {
        return Err(unsupported(op, ty));
    }
    let (block_len, block_bytes) = (ty.block_len(), ty.block_bytes());
    if !num_bytes.is_multiple_of(block_bytes) {
        return Err(Error::Quant(format!(
            "{op} {ty}: {num_bytes} bytes is not a whole number of {block_bytes}-byte blocks"
        )));
    }
    if num_elements != num_bytes / block_bytes * block_len {
        return Err(Error::Quant(format!(
            "{op} {ty}: {num_bytes} bytes hold {} elements but the f32 side has {num_elements}",
            num_bytes / block_bytes * block_len
        )));
    }
    Ok(())
}

fn unsupported(op: &str, ty: GgmlType) -> Error {
    Error::Quant(format!(
        "cannot {op} {ty}: supported types are F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, \
         Q5_K, Q6_K, Q8_K"
    ))
}

/// Runs `f` over matching blocks of bytes and elements (lengths already checked).
fn each_block<const BYTES: usize, const LEN: usize>(
    data: &[u8],
    out: &mut [f32],
    f: impl Fn(&[u8; BYTES], &mut [f32; LEN]),
) {
    let (blocks, _) = data.as_chunks::<BYTES>();
    let (outs, _) = out.as_chunks_mut::<LEN>();
    blocks.iter().zip(outs).for_each(|(b, y)| f(b, y));
}

/// Runs `f` over matching blocks of elements and bytes (lengths already checked).
fn each_input_block<const LEN: usize, const BYTES: usize>(
    x: &[f32],
    out: &mut [u8],
    f: impl Fn(&[f32; LEN], &mut [u8; BYTES]),
) {
    let (inputs, _) = x.as_chunks::<LEN>();
    let (blocks, _) = out.as_chunks_mut::<BYTES>();
    inputs.iter().zip(blocks).for_each(|(x, b)| f(x, b));
}

/// The `N` bytes at `b[off..]`, as an array (callers pass constant in-range offsets).
fn array_at<const N: usize>(b: &[u8], off: usize) -> &[u8; N] {
    b[off..off + N].try_into().expect("INVARIANT: the range is N bytes long")
}

/// The `f16` at `b[off..off + 2]`, widened (exactly) to `f32`.
fn f16_at(b: &[u8], off: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[off], b[off + 1]])).to_f32()
}

/// Stores `v` rounded to `f16` (nearest, ties to even, like ggml) and returns the stored value as `f32`, which
/// is what ggml reads back when it requantizes against the stored scale.
fn put_f16(b: &mut [u8], off: usize, v: f32) -> f32 {
    let h = half::f16::from_f32(v);
    b[off..off + 2].copy_from_slice(&h.to_bits().to_le_bytes());
    h.to_f32()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_are_checked() {
        let mut out = [0f32; 32];
        let err = dequantize(GgmlType::Q4_0, &[0u8; 17], &mut out).unwrap_err().to_string();
        assert!(err.contains("17 bytes is not a whole number of 18-byte blocks"), "{err}");
        let err = dequantize(GgmlType::Q4_0, &[0u8; 36], &mut out).unwrap_err().to_string();
        assert!(err.contains("hold 64 elements but the f32 side has 32"), "{err}");
        let err = quantize(GgmlType::Q4_K, &[0f32; 100]).unwrap_err().to_string();
        assert!(err.contains("100 elements is not a whole number of 256-element blocks"), "{err}");
        let err = quantize_into(GgmlType::Q8_0, &[0f32; 32], &mut [0u8; 33]).unwrap_err().to_string();
        assert!(err.contains("33 bytes"), "{err}");
    }

    #[test]
    fn unsupported_types_are_errors() {
        for ty in [GgmlType::I8, GgmlType::I32, GgmlType::F64] {
            let err = dequantize(ty, &[0u8; 8], &mut [0f32; 8]).unwrap_err().to_string();
            assert!(err.contains(&format!("cannot dequantize {ty}")), "{err}");
            assert!(quantize(ty, &[0f32; 8]).is_err());
        }
    }

    #[test]
    fn empty_input_is_fine() {
        assert_eq!(quantize(GgmlType::Q6_K, &[]).unwrap(), Vec::<u8>::new());
        dequantize(GgmlType::Q6_K, &[], &mut []).unwrap();
    }

    const ALL: [GgmlType; 15] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q8_K,
    ];

    /// Arbitrary bit patterns as floats (NaNs, infinities, subnormals) and as blocks (NaN scales) never panic.
    #[test]
    fn arbitrary_bits_never_panic() {
        let mut state = 0x0123_4567_89ab_cdefu64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..50 {
            let x: Vec<f32> = (0..512).map(|_| f32::from_bits(next() as u32)).collect();
            for ty in ALL {
                let q = quantize(ty, &x).unwrap();
                let raw: Vec<u8> = (0..q.len()).map(|_| next() as u8).collect();
                dequantize(ty, &raw, &mut vec![0f32; x.len()]).unwrap();
            }
        }
    }

    #[test]
    fn non_finite_inputs_do_not_panic() {
        let mut x = vec![0.5f32; 256];
        x[3] = f32::NAN;
        x[9] = f32::INFINITY;
        x[77] = f32::NEG_INFINITY;
        x[200] = f32::MAX;
        x[201] = f32::MIN_POSITIVE / 8.0;
        for ty in ALL {
            let q = quantize(ty, &x).unwrap();
            let mut y = vec![0f32; x.len()];
            dequantize(ty, &q, &mut y).unwrap();
        }
    }
}
