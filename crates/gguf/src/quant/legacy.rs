//! The 32-element block formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (weights) and Q8_1 (activations).
//!
//! In the 4- and 5-bit formats, byte `qs[j]` holds element `j` in its low nibble and element `j + 16` in its high
//! nibble; the fifth bit of element `e` is bit `e` of the little-endian `u32` `qh`. Quantization follows ggml's
//! `quantize_row_*_ref`: one scale per block from the largest magnitude (or from min and max), then truncation of
//! `x/d + offset + 0.5` (Q4/Q5) or `roundf` (Q8).

use super::{f16_at, put_f16};

pub(super) fn dequantize_q4_0(b: &[u8; 18], y: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    for (j, &q) in b[2..].iter().enumerate() {
        y[j] = ((q & 0x0F) as i32 - 8) as f32 * d;
        y[j + 16] = ((q >> 4) as i32 - 8) as f32 * d;
    }
}

pub(super) fn dequantize_q4_1(b: &[u8; 20], y: &mut [f32; 32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    for (j, &q) in b[4..].iter().enumerate() {
        y[j] = (q & 0x0F) as f32 * d + m;
        y[j + 16] = (q >> 4) as f32 * d + m;
    }
}

pub(super) fn dequantize_q5_0(b: &[u8; 22], y: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    for (j, &q) in b[6..].iter().enumerate() {
        let (lo, hi) = five_bit_pair(q, qh, j);
        y[j] = (lo as i32 - 16) as f32 * d;
        y[j + 16] = (hi as i32 - 16) as f32 * d;
    }
}

pub(super) fn dequantize_q5_1(b: &[u8; 24], y: &mut [f32; 32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    for (j, &q) in b[8..].iter().enumerate() {
        let (lo, hi) = five_bit_pair(q, qh, j);
        y[j] = lo as f32 * d + m;
        y[j + 16] = hi as f32 * d + m;
    }
}

/// Elements `j` and `j + 16` of a 5-bit block: the nibbles of `qs[j]` plus bits `j` and `j + 16` of `qh`.
fn five_bit_pair(q: u8, qh: u32, j: usize) -> (u8, u8) {
    let lo = (q & 0x0F) | (((qh >> j) & 1) as u8) << 4;
    let hi = (q >> 4) | (((qh >> (j + 16)) & 1) as u8) << 4;
    (lo, hi)
}

pub(super) fn dequantize_q8_0(b: &[u8; 34], y: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    for (v, &q) in y.iter_mut().zip(&b[2..]) {
        *v = q as i8 as f32 * d;
    }
}

pub(super) fn dequantize_q8_1(b: &[u8; 36], y: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    for (v, &q) in y.iter_mut().zip(&b[4..]) {
        *v = q as i8 as f32 * d;
    }
}

/// The element of largest magnitude (the first of equals; 0 for an all-zero block), as ggml picks it.
fn signed_absmax(x: &[f32]) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

/// Smallest and largest element, as ggml's loop finds them.
fn min_max(x: &[f32]) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

fn inverse(d: f32) -> f32 {
    if d != 0.0 { 1.0 / d } else { 0.0 }
}

pub(super) fn quantize_q4_0(x: &[f32; 32], b: &mut [u8; 18]) {
    let d = signed_absmax(x) / -8.0;
    let id = inverse(d);
    put_f16(b, 0, d);
    for j in 0..16 {
        let lo = ((x[j] * id + 8.5) as i8).min(15) as u8;
        let hi = ((x[j + 16] * id + 8.5) as i8).min(15) as u8;
        b[2 + j] = lo | hi << 4;
    }
}

pub(super) fn quantize_q4_1(x: &[f32; 32], b: &mut [u8; 20]) {
    let (min, max) = min_max(x);
    let d = (max - min) / 15.0;
    let id = inverse(d);
    put_f16(b, 0, d);
    put_f16(b, 2, min);
    for j in 0..16 {
        let lo = (((x[j] - min) * id + 0.5) as i8).min(15) as u8;
        let hi = (((x[j + 16] - min) * id + 0.5) as i8).min(15) as u8;
        b[4 + j] = lo | hi << 4;
    }
}

pub(super) fn quantize_q5_0(x: &[f32; 32], b: &mut [u8; 22]) {
    let d = signed_absmax(x) / -16.0;
    let id = inverse(d);
    put_f16(b, 0, d);
    let mut qh = 0u32;
    for j in 0..16 {
        let lo = ((x[j] * id + 16.5) as i8).min(31) as u8;
        let hi = ((x[j + 16] * id + 16.5) as i8).min(31) as u8;
        b[6 + j] = (lo & 0x0F) | (hi & 0x0F) << 4;
        qh |= ((lo as u32 & 0x10) >> 4) << j | ((hi as u32 & 0x10) >> 4) << (j + 16);
    }
    b[2..6].copy_from_slice(&qh.to_le_bytes());
}

pub(super) fn quantize_q5_1(x: &[f32; 32], b: &mut [u8; 24]) {
    let (min, max) = min_max(x);
    let d = (max - min) / 31.0;
    let id = inverse(d);
    put_f16(b, 0, d);
    put_f16(b, 2, min);
    let mut qh = 0u32;
    for j in 0..16 {
        let lo = ((x[j] - min) * id + 0.5) as u8;
        let hi = ((x[j + 16] - min) * id + 0.5) as u8;
        b[8 + j] = (lo & 0x0F) | (hi & 0x0F) << 4;
        qh |= ((lo as u32 & 0x10) >> 4) << j | ((hi as u32 & 0x10) >> 4) << (j + 16);
    }
    b[4..8].copy_from_slice(&qh.to_le_bytes());
}

/// Largest magnitude, with ggml's `MAX` (a NaN poisons it, as in ggml).
fn absmax(x: &[f32]) -> f32 {
    x.iter().fold(0f32, |amax, v| if amax > v.abs() { amax } else { v.abs() })
}

pub(super) fn quantize_q8_0(x: &[f32; 32], b: &mut [u8; 34]) {
    let d = absmax(x) / 127.0;
    let id = inverse(d);
    put_f16(b, 0, d);
    for (q, &v) in b[2..].iter_mut().zip(x) {
        *q = (v * id).round() as i8 as u8;
    }
}

/// Q8_0 plus `s = d·Σq` (ggml's `quantize_row_q8_1_ref`).
pub(super) fn quantize_q8_1(x: &[f32; 32], b: &mut [u8; 36]) {
    let d = absmax(x) / 127.0;
    let id = inverse(d);
    put_f16(b, 0, d);
    let mut sum = 0i32;
    for (q, &v) in b[4..].iter_mut().zip(x) {
        let qi = (v * id).round() as i8;
        sum += qi as i32;
        *q = qi as u8;
    }
    put_f16(b, 2, sum as f32 * d);
}
