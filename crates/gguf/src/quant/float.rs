//! The float formats as one-element "blocks": F32 (a copy), F16 and BF16 (rounded to nearest, ties to even).

pub(super) fn dequantize_f32(b: &[u8; 4], y: &mut [f32; 1]) {
    y[0] = f32::from_le_bytes(*b);
}

pub(super) fn dequantize_f16(b: &[u8; 2], y: &mut [f32; 1]) {
    y[0] = half::f16::from_le_bytes(*b).to_f32();
}

/// A bf16 is the upper 16 bits of an f32.
pub(super) fn dequantize_bf16(b: &[u8; 2], y: &mut [f32; 1]) {
    y[0] = f32::from_bits((u16::from_le_bytes(*b) as u32) << 16);
}

pub(super) fn quantize_f32(x: &[f32; 1], b: &mut [u8; 4]) {
    *b = x[0].to_le_bytes();
}

pub(super) fn quantize_f16(x: &[f32; 1], b: &mut [u8; 2]) {
    *b = half::f16::from_f32(x[0]).to_le_bytes();
}

/// ggml's `ggml_compute_fp32_to_bf16`: NaN becomes a quiet NaN, everything else rounds to nearest even.
pub(super) fn quantize_bf16(x: &[f32; 1], b: &mut [u8; 2]) {
    let u = x[0].to_bits();
    let h = if u & 0x7fff_ffff > 0x7f80_0000 { (u >> 16) | 64 } else { u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16 };
    *b = (h as u16).to_le_bytes();
}
