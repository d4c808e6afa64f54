//! Checks the quantized matrix kernels of `backend::cpu::quant` at every available SIMD level against an f64
//! reference computed from the dequantized blocks (weights and quantized activations), and against the
//! unquantized activations with a bound derived from the activation quantization error.
//!
//! Dequantization and activation quantization references are written here from ggml's block definitions
//! (`ggml-common.h`, `quantize_row_q8_*_ref`), independently of the kernels.

use backend::cpu::quant::{
    ActFormat, KernelLevel, act_format, act_row_bytes, available_levels, matmul_rows_at, quantize_act_row_at,
};
use gguf::GgmlType;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn f16(v: f32) -> [u8; 2] {
    half::f16::from_f32(v).to_bits().to_le_bytes()
}

fn rf16(b: &[u8], o: usize) -> f64 {
    half::f16::from_bits(u16::from_le_bytes([b[o], b[o + 1]])).to_f64()
}

fn block_len(ty: GgmlType) -> usize {
    ty.block_len()
}

/// Random weight row bytes of type `ty` with realistic scales (never all zero).
fn random_row(ty: GgmlType, k: usize, rng: &mut StdRng) -> Vec<u8> {
    use GgmlType::*;
    let nb = k / block_len(ty);
    let mut out = Vec::with_capacity(ty.row_bytes(k).unwrap());
    let small = |rng: &mut StdRng| rng.random_range(0.002f32..0.03);
    for _ in 0..nb {
        match ty {
            F32 => out.extend_from_slice(&rng.random_range(-1.0f32..1.0).to_le_bytes()),
            F16 => out.extend_from_slice(&f16(rng.random_range(-1.0f32..1.0))),
            BF16 => {
                let v: f32 = rng.random_range(-1.0f32..1.0);
                out.extend_from_slice(&((v.to_bits() >> 16) as u16).to_le_bytes())
            }
            Q4_0 | Q5_0 | Q8_0 => {
                let d = small(rng) * if rng.random_bool(0.5) { 1.0 } else { -1.0 };
                out.extend_from_slice(&f16(d));
                let extra = match ty {
                    Q4_0 => 16,
                    Q5_0 => 20,
                    _ => 32,
                };
                out.extend((0..extra).map(|_| rng.random::<u8>()));
            }
            Q4_1 | Q5_1 => {
                out.extend_from_slice(&f16(small(rng)));
                out.extend_from_slice(&f16(-small(rng) * 8.0));
                let extra = if ty == Q4_1 { 16 } else { 20 };
                out.extend((0..extra).map(|_| rng.random::<u8>()));
            }
            Q4_K | Q5_K => {
                out.extend_from_slice(&f16(small(rng) * 0.1));
                out.extend_from_slice(&f16(small(rng) * 0.1));
                let extra = if ty == Q4_K { 12 + 128 } else { 12 + 32 + 128 };
                out.extend((0..extra).map(|_| rng.random::<u8>()));
            }
            Q6_K => {
                out.extend((0..192 + 16).map(|_| rng.random::<u8>()));
                out.extend_from_slice(&f16(small(rng) * 0.05));
            }
            _ => unreachable!(),
        }
    }
    assert_eq!(out.len(), ty.row_bytes(k).unwrap());
    out
}

fn scale_min_k4(j: usize, q: &[u8]) -> (f64, f64) {
    if j < 4 {
        ((q[j] & 63) as f64, (q[j + 4] & 63) as f64)
    } else {
        (((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4)) as f64, ((q[j + 4] >> 4) | ((q[j] >> 6) << 4)) as f64)
    }
}

/// Reference dequantization (ggml's `dequantize_row_*`), in f64.
fn dequant(ty: GgmlType, b: &[u8], k: usize) -> Vec<f64> {
    use GgmlType::*;
    let mut y = vec![0f64; k];
    let bb = ty.block_bytes();
    for (i, blk) in b.chunks_exact(bb).enumerate().take(k / ty.block_len()) {
        let y = &mut y[i * ty.block_len()..(i + 1) * ty.block_len()];
        match ty {
            F32 => y[0] = f32::from_le_bytes(blk.try_into().unwrap()) as f64,
            F16 => y[0] = rf16(blk, 0),
            BF16 => y[0] = f32::from_bits((u16::from_le_bytes([blk[0], blk[1]]) as u32) << 16) as f64,
            Q4_0 => {
                let d = rf16(blk, 0);
                for j in 0..16 {
                    y[j] = d * ((blk[2 + j] & 15) as f64 - 8.0);
                    y[j + 16] = d * ((blk[2 + j] >> 4) as f64 - 8.0);
                }
            }
            Q4_1 => {
                let (d, m) = (rf16(blk, 0), rf16(blk, 2));
                for j in 0..16 {
                    y[j] = d * (blk[4 + j] & 15) as f64 + m;
                    y[j + 16] = d * (blk[4 + j] >> 4) as f64 + m;
                }
            }
            Q5_0 | Q5_1 => {
                let (d, m, o) = if ty == Q5_0 { (rf16(blk, 0), -16.0, 2) } else { (rf16(blk, 0), rf16(blk, 2), 4) };
                let qh = u32::from_le_bytes(blk[o..o + 4].try_into().unwrap());
                for j in 0..16 {
                    let lo = ((blk[o + 4 + j] & 15) as u32 | ((qh >> j) & 1) << 4) as f64;
                    let hi = ((blk[o + 4 + j] >> 4) as u32 | ((qh >> (j + 16)) & 1) << 4) as f64;
                    if ty == Q5_0 {
                        y[j] = d * (lo + m);
                        y[j + 16] = d * (hi + m);
                    } else {
                        y[j] = d * lo + m;
                        y[j + 16] = d * hi + m;
                    }
                }
            }
            Q8_0 => {
                let d = rf16(blk, 0);
                for j in 0..32 {
                    y[j] = d * (blk[2 + j] as i8) as f64;
                }
            }
            Q4_K | Q5_K => {
                let (d, dmin) = (rf16(blk, 0), rf16(blk, 2));
                let sc = &blk[4..16];
                let (qh, qs) = if ty == Q4_K { (&blk[0..0], &blk[16..144]) } else { (&blk[16..48], &blk[48..176]) };
                for c in 0..4 {
                    let (s1, m1) = scale_min_k4(2 * c, sc);
                    let (s2, m2) = scale_min_k4(2 * c + 1, sc);
                    for l in 0..32 {
                        let mut q1 = (qs[32 * c + l] & 15) as f64;
                        let mut q2 = (qs[32 * c + l] >> 4) as f64;
                        if ty == Q5_K {
                            q1 += 16.0 * ((qh[l] >> (2 * c)) & 1) as f64;
                            q2 += 16.0 * ((qh[l] >> (2 * c + 1)) & 1) as f64;
                        }
                        y[64 * c + l] = d * s1 * q1 - dmin * m1;
                        y[64 * c + 32 + l] = d * s2 * q2 - dmin * m2;
                    }
                }
            }
            Q6_K => {
                let d = rf16(blk, 208);
                for h in 0..2 {
                    let (ql, qh, sc) = (&blk[64 * h..], &blk[128 + 32 * h..], &blk[192 + 8 * h..]);
                    for l in 0..32 {
                        let is = l / 16;
                        let q1 = ((ql[l] & 15) | ((qh[l] & 3) << 4)) as i32 - 32;
                        let q2 = ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                        let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                        let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                        let y = &mut y[128 * h..];
                        y[l] = d * (sc[is] as i8) as f64 * q1 as f64;
                        y[l + 32] = d * (sc[is + 2] as i8) as f64 * q2 as f64;
                        y[l + 64] = d * (sc[is + 4] as i8) as f64 * q3 as f64;
                        y[l + 96] = d * (sc[is + 6] as i8) as f64 * q4 as f64;
                    }
                }
            }
            _ => unreachable!(),
        }
    }
    y
}

// ---- ggml reference activation quantizers (quantize_row_q8_0_ref / q8_1_ref / q8_K_ref), written from the C.

fn ref_q8_0(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for b in x.chunks_exact(32) {
        let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&f16(d));
        out.extend(b.iter().map(|v| (v * id).round() as i8 as u8));
    }
    out
}

fn ref_q8_1(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for b in x.chunks_exact(32) {
        let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let q: Vec<i8> = b.iter().map(|v| (v * id).round() as i8).collect();
        let sum: i32 = q.iter().map(|&v| v as i32).sum();
        out.extend_from_slice(&f16(d));
        out.extend_from_slice(&f16(sum as f32 * d));
        out.extend(q.iter().map(|&v| v as u8));
    }
    out
}

/// ggml's `nearest_int`: the float magic-number trick (round half to even).
fn nearest_int(f: f32) -> i32 {
    let v = f + 12582912.0;
    (v.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

fn ref_q8_k(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for b in x.chunks_exact(256) {
        let (mut max, mut amax) = (0f32, 0f32);
        for &v in b {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            out.extend(std::iter::repeat_n(0u8, 292));
            continue;
        }
        let iscale = -127.0 / max;
        let q: Vec<i8> = b.iter().map(|&v| nearest_int(iscale * v).min(127) as i8).collect();
        out.extend_from_slice(&(1.0 / iscale).to_le_bytes());
        out.extend(q.iter().map(|&v| v as u8));
        for j in 0..16 {
            let s: i32 = q[16 * j..16 * j + 16].iter().map(|&v| v as i32).sum();
            out.extend_from_slice(&(s as i16).to_le_bytes());
        }
    }
    out
}

fn ref_act(fmt: ActFormat, x: &[f32]) -> Vec<u8> {
    match fmt {
        ActFormat::F32 => x.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ActFormat::Q8_0 => ref_q8_0(x),
        ActFormat::Q8_1 => ref_q8_1(x),
        ActFormat::Q8_K => ref_q8_k(x),
    }
}

/// Dequantized activation row, and per element the bound on |x - dequantized|.
fn dequant_act(fmt: ActFormat, b: &[u8], k: usize) -> (Vec<f64>, Vec<f64>) {
    let mut y = vec![0f64; k];
    let mut e = vec![0f64; k];
    match fmt {
        ActFormat::F32 => {
            for i in 0..k {
                y[i] = f32::from_le_bytes(b[4 * i..4 * i + 4].try_into().unwrap()) as f64;
            }
        }
        ActFormat::Q8_0 | ActFormat::Q8_1 => {
            let (bb, o) = if fmt == ActFormat::Q8_0 { (34, 2) } else { (36, 4) };
            for i in 0..k / 32 {
                let d = rf16(b, i * bb);
                for j in 0..32 {
                    y[32 * i + j] = d * (b[i * bb + o + j] as i8) as f64;
                    // |x - d16·q| <= d/2 + 127·|d16 - d| <= d·(0.5 + 127·2^-11)
                    e[32 * i + j] = d.abs() * 0.57 + 1e-30;
                }
            }
        }
        ActFormat::Q8_K => {
            for i in 0..k / 256 {
                let d = f32::from_le_bytes(b[i * 292..i * 292 + 4].try_into().unwrap()) as f64;
                for j in 0..256 {
                    y[256 * i + j] = d * (b[i * 292 + 4 + j] as i8) as f64;
                    e[256 * i + j] = d.abs() * 0.5001 + 1e-30;
                }
            }
        }
    }
    (y, e)
}

fn random_acts(k: usize, m: usize, rng: &mut StdRng) -> Vec<f32> {
    (0..k * m)
        .map(|_| {
            let v: f32 = rng.random_range(-1.0f32..1.0) + if rng.random_bool(0.5) { 0.05 } else { -0.05 };
            if rng.random_bool(0.01) { v * 20.0 } else { v }
        })
        .collect()
}

fn ks_for(ty: GgmlType) -> Vec<usize> {
    match ty.block_len() {
        256 => vec![256, 768, 2560],
        32 => vec![32, 352, 1056],
        _ => vec![1, 17, 100, 1029],
    }
}

/// Checks every level, m and row range for one weight type and row length.
fn check_type(ty: GgmlType, k: usize, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let n = 37;
    let fmt = act_format(ty).unwrap();
    let rb = ty.row_bytes(k).unwrap();
    let mut w = Vec::with_capacity(n * rb);
    let mut wd = Vec::new();
    for _ in 0..n {
        let row = random_row(ty, k, &mut rng);
        wd.push(dequant(ty, &row, k));
        w.extend_from_slice(&row);
    }
    let m_max = 17;
    let x = random_acts(k, m_max, &mut rng);
    let arb = act_row_bytes(fmt, k);
    let mut acts = vec![0u8; arb * m_max];
    for t in 0..m_max {
        quantize_act_row_at(KernelLevel::Scalar, fmt, &x[t * k..(t + 1) * k], &mut acts[t * arb..(t + 1) * arb]);
    }
    // Reference results [t][r]: tight (quantized activations), loose (f32 activations), and the bounds.
    let mut tight = vec![vec![0f64; n]; m_max];
    let mut scale = vec![vec![0f64; n]; m_max];
    let mut loose = vec![vec![0f64; n]; m_max];
    let mut loose_tol = vec![vec![0f64; n]; m_max];
    for t in 0..m_max {
        let ab = &acts[t * arb..(t + 1) * arb];
        let (ad, ae) = dequant_act(fmt, ab, k);
        for r in 0..n {
            let wr = &wd[r];
            let (mut s, mut sa, mut l, mut lt) = (0f64, 0f64, 0f64, 0f64);
            for i in 0..k {
                s += wr[i] * ad[i];
                sa += (wr[i] * ad[i]).abs();
                l += wr[i] * x[t * k + i] as f64;
                lt += wr[i].abs() * ae[i];
            }
            if fmt == ActFormat::Q8_1 {
                // ggml's Q4_1 / Q5_1 dots use the activation block's f16 `s` (= d·Σq, rounded) for the min term.
                let wrow = &w[r * rb..(r + 1) * rb];
                s = 0.0;
                sa = 0.0;
                for b in 0..k / 32 {
                    let (dw, mw) = (rf16(wrow, b * ty.block_bytes()), rf16(wrow, b * ty.block_bytes() + 2));
                    let sb = rf16(ab, b * 36 + 2);
                    let mut dotq = 0f64;
                    for j in 0..32 {
                        let qw = (wr[32 * b + j] - mw) / dw;
                        dotq += qw.round() * ad[32 * b + j];
                        sa += (wr[32 * b + j] * ad[32 * b + j]).abs();
                    }
                    s += dw * dotq + mw * sb;
                    sa += (mw * sb).abs();
                }
                lt += 1e-3 * sa; // the f16 rounding of s
            }
            tight[t][r] = s;
            scale[t][r] = sa;
            loose[t][r] = l;
            loose_tol[t][r] = lt * 1.001 + 1e-6 * sa;
        }
    }
    let ranges = [0..n, 1..n - 2, 5..6, 16..33, 0..16];
    for &level in &available_levels() {
        for m in [1usize, 2, 3, 4, 5, 8, 17] {
            for rows in ranges.clone() {
                let ldo = n + 3;
                let mut out = vec![f32::NAN; m * ldo];
                // SAFETY: out has m * ldo elements; single-threaded.
                unsafe { matmul_rows_at(level, ty, &w, k, rows.clone(), &acts, m, out.as_mut_ptr(), ldo) };
                for t in 0..m {
                    for r in 0..ldo {
                        let v = out[t * ldo + r];
                        if !rows.contains(&r) {
                            assert!(
                                v.is_nan(),
                                "{ty} {level:?} k={k} m={m} rows={rows:?}: wrote outside at t={t} r={r}"
                            );
                            continue;
                        }
                        let (s, sa) = (tight[t][r], scale[t][r]);
                        let err = (v as f64 - s).abs();
                        assert!(
                            err <= 1e-5 * sa + 1e-30,
                            "{ty} {level:?} k={k} m={m} rows={rows:?} t={t} r={r}: got {v}, want {s} (err {err:e}, scale {sa:e})"
                        );
                        let lerr = (v as f64 - loose[t][r]).abs();
                        assert!(
                            lerr <= loose_tol[t][r] + 1e-5 * sa,
                            "{ty} {level:?} k={k} m={m} t={t} r={r}: got {v}, unquantized {} (err {lerr:e}, bound {:e})",
                            loose[t][r],
                            loose_tol[t][r]
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn levels_include_this_machine() {
    let levels = available_levels();
    eprintln!("available kernel levels: {levels:?}");
    assert!(levels.contains(&KernelLevel::Scalar));
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx512vnni") && std::is_x86_feature_detected!("avx512bw") {
        assert!(levels.contains(&KernelLevel::Avx512));
    }
}

#[test]
fn matmul_q4_k() {
    for (i, k) in ks_for(GgmlType::Q4_K).into_iter().enumerate() {
        check_type(GgmlType::Q4_K, k, 100 + i as u64);
    }
}

#[test]
fn matmul_q6_k() {
    for (i, k) in ks_for(GgmlType::Q6_K).into_iter().enumerate() {
        check_type(GgmlType::Q6_K, k, 200 + i as u64);
    }
}

#[test]
fn matmul_q5_k() {
    for (i, k) in ks_for(GgmlType::Q5_K).into_iter().enumerate() {
        check_type(GgmlType::Q5_K, k, 300 + i as u64);
    }
}

#[test]
fn matmul_legacy() {
    for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0] {
        for (i, k) in ks_for(ty).into_iter().enumerate() {
            check_type(ty, k, 400 + 10 * ty.to_u32() as u64 + i as u64);
        }
    }
}

#[test]
fn matmul_float() {
    for ty in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
        for (i, k) in ks_for(ty).into_iter().enumerate() {
            check_type(ty, k, 500 + 10 * ty.to_u32() as u64 + i as u64);
        }
    }
}

#[test]
fn matmul_many_activation_rows() {
    // More rows than one internal activation block (64), and a ragged tail.
    let mut rng = StdRng::seed_from_u64(7);
    for ty in [GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0] {
        let (n, k, m) = (21, 512, 70);
        let fmt = act_format(ty).unwrap();
        let rb = ty.row_bytes(k).unwrap();
        let w: Vec<u8> = (0..n).flat_map(|_| random_row(ty, k, &mut rng)).collect();
        let x = random_acts(k, m, &mut rng);
        let arb = act_row_bytes(fmt, k);
        let mut acts = vec![0u8; arb * m];
        for t in 0..m {
            quantize_act_row_at(KernelLevel::Scalar, fmt, &x[t * k..(t + 1) * k], &mut acts[t * arb..(t + 1) * arb]);
        }
        let mut want = vec![0f32; m * n];
        // SAFETY: buffers sized m * n.
        unsafe { matmul_rows_at(KernelLevel::Scalar, ty, &w, k, 0..n, &acts, m, want.as_mut_ptr(), n) };
        for &level in &available_levels() {
            let mut got = vec![f32::NAN; m * n];
            unsafe { matmul_rows_at(level, ty, &w, k, 0..n, &acts, m, got.as_mut_ptr(), n) };
            for t in 0..m {
                for r in 0..n {
                    let wd = dequant(ty, &w[r * rb..(r + 1) * rb], k);
                    let (ad, _) = dequant_act(fmt, &acts[t * arb..(t + 1) * arb], k);
                    let sa: f64 = (0..k).map(|i| (wd[i] * ad[i]).abs()).sum();
                    let (g, e) = (got[t * n + r], want[t * n + r]);
                    assert!(((g - e) as f64).abs() <= 2e-5 * sa, "{ty} {level:?} t={t} r={r}: {g} vs {e}");
                }
            }
        }
    }
}

/// Activation rows with exact halves (ggml's roundf vs round-half-even differ there), a zero block, outliers.
fn tricky_acts(k: usize, rng: &mut StdRng) -> Vec<f32> {
    let mut x = random_acts(k, 1, rng);
    // Block 0: amax exactly 127 so d = 1 and id = 1: x.5 values hit the rounding rule.
    if k >= 32 {
        for (j, v) in x[..32].iter_mut().enumerate() {
            *v = j as f32 - 15.5;
        }
        x[31] = 127.0;
    }
    // A zero block (Q8_0 size) in the middle.
    if k >= 96 {
        x[64..96].fill(0.0);
    }
    // Q8_K: max of -127 in superblock 1 gives iscale = 1, halves exercise round-half-even; ties in |x| (+/-).
    if k >= 512 {
        for (j, v) in x[256..512].iter_mut().enumerate() {
            *v = (j % 200) as f32 * 0.5 - 50.25;
        }
        x[300] = 127.0;
        x[260] = -127.0;
    }
    x
}

#[test]
fn act_quantization_matches_ggml_reference() {
    let mut rng = StdRng::seed_from_u64(11);
    for fmt in [ActFormat::Q8_0, ActFormat::Q8_1, ActFormat::Q8_K, ActFormat::F32] {
        for k in [256usize, 512, 1536, 2816] {
            for trial in 0..4 {
                let x = if trial == 0 { tricky_acts(k, &mut rng) } else { random_acts(k, 1, &mut rng) };
                let want = ref_act(fmt, &x);
                assert_eq!(want.len(), fmt.ggml_row_bytes(k));
                for &level in &available_levels() {
                    let mut got = vec![0xAAu8; act_row_bytes(fmt, k)];
                    quantize_act_row_at(level, fmt, &x, &mut got);
                    let g = &got[..want.len()];
                    if g != want.as_slice() {
                        let i = g.iter().zip(&want).position(|(a, b)| a != b).unwrap();
                        panic!("{fmt:?} {level:?} k={k} trial={trial}: first difference at byte {i}");
                    }
                    // Trailer: recomputed from the blocks.
                    check_trailer(fmt, &got, k);
                }
            }
        }
    }
}

fn check_trailer(fmt: ActFormat, row: &[u8], k: usize) {
    let base = fmt.ggml_row_bytes(k);
    let rd_i32 = |o: usize| i32::from_le_bytes(row[o..o + 4].try_into().unwrap());
    let rd_f32 = |o: usize| f32::from_le_bytes(row[o..o + 4].try_into().unwrap());
    match fmt {
        ActFormat::Q8_0 => {
            for b in 0..k / 32 {
                let s: i32 = (0..32).map(|j| row[b * 34 + 2 + j] as i8 as i32).sum();
                assert_eq!(rd_i32(base + 8 * b), -s);
                assert_eq!(rd_f32(base + 8 * b + 4), rf16(row, b * 34) as f32);
            }
        }
        ActFormat::Q8_1 => {
            for b in 0..k / 32 {
                assert_eq!(rd_f32(base + 8 * b), rf16(row, b * 36) as f32);
                assert_eq!(rd_f32(base + 8 * b + 4), rf16(row, b * 36 + 2) as f32);
            }
        }
        ActFormat::Q8_K => {
            for b in 0..k / 256 {
                let e = base + 80 * b;
                for j in 0..8 {
                    let s: i32 = (0..32).map(|l| row[b * 292 + 4 + 32 * j + l] as i8 as i32).sum();
                    assert_eq!(i16::from_le_bytes([row[e + 2 * j], row[e + 2 * j + 1]]) as i32, s);
                }
                for j in 0..16 {
                    let s: i32 = (0..16).map(|l| row[b * 292 + 4 + 16 * j + l] as i8 as i32).sum();
                    assert_eq!(rd_i32(e + 16 + 4 * j), -32 * s);
                }
            }
        }
        ActFormat::F32 => assert_eq!(row.len(), 4 * k),
    }
}

#[test]
fn act_row_bytes_layout() {
    assert_eq!(act_row_bytes(ActFormat::F32, 10), 40);
    assert_eq!(act_row_bytes(ActFormat::Q8_0, 64), 2 * 34 + 2 * 8);
    assert_eq!(act_row_bytes(ActFormat::Q8_1, 64), 2 * 36 + 2 * 8);
    assert_eq!(act_row_bytes(ActFormat::Q8_K, 512), 2 * 292 + 2 * 80);
    assert_eq!(act_format(GgmlType::Q4_K), Some(ActFormat::Q8_K));
    assert_eq!(act_format(GgmlType::Q5_0), Some(ActFormat::Q8_0));
    assert_eq!(act_format(GgmlType::Q4_1), Some(ActFormat::Q8_1));
    assert_eq!(act_format(GgmlType::BF16), Some(ActFormat::F32));
    assert_eq!(act_format(GgmlType::Q2_K), None);
}

#[test]
fn act_quantization_matches_gguf_quantize() {
    // The independent reference quantizers of the gguf crate (ggml's quantize_row_q8_*_ref).
    let mut rng = StdRng::seed_from_u64(12);
    for fmt in [ActFormat::Q8_K, ActFormat::Q8_0, ActFormat::Q8_1] {
        for k in [256usize, 1536, 2816] {
            for trial in 0..4 {
                let mut x = if trial == 0 { tricky_acts(k, &mut rng) } else { random_acts(k, 1, &mut rng) };
                if trial == 1 {
                    x[..256].fill(0.0); // an all-zero super-block
                }
                let want = gguf::quant::quantize(fmt.ggml_type(), &x).unwrap();
                for &level in &available_levels() {
                    let mut got = vec![0u8; act_row_bytes(fmt, k)];
                    quantize_act_row_at(level, fmt, &x, &mut got);
                    assert!(got[..want.len()] == want[..], "{fmt:?} {level:?} k={k} trial={trial}");
                }
            }
        }
    }
}

#[test]
fn test_dequantizer_matches_gguf() {
    // The f64 dequantizer used as this file's reference agrees with the gguf crate's.
    let mut rng = StdRng::seed_from_u64(13);
    for ty in [
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::F32,
    ] {
        let k = 512;
        let row = random_row(ty, k, &mut rng);
        let mine = dequant(ty, &row, k);
        let mut theirs = vec![0f32; k];
        gguf::quant::dequantize(ty, &row, &mut theirs).unwrap();
        for i in 0..k {
            let (a, b) = (mine[i], theirs[i] as f64);
            assert!((a - b).abs() <= 1e-6 * a.abs().max(1e-3), "{ty} element {i}: {a} vs {b}");
        }
    }
}

#[test]
fn matmul_sees_activations_rewritten_in_place() {
    // Kernels may cache work derived from the activation bytes between calls; rewriting the same buffer with new
    // activations (same address, same length) must give the new results.
    let mut rng = StdRng::seed_from_u64(14);
    for ty in [GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q5_0, GgmlType::Q4_1, GgmlType::Q8_0] {
        let (n, k) = (24, 1536);
        let fmt = act_format(ty).unwrap();
        let w: Vec<u8> = (0..n).flat_map(|_| random_row(ty, k, &mut rng)).collect();
        let arb = act_row_bytes(fmt, k);
        for m in [1usize, 3, 8] {
            let mut acts = vec![0u8; arb * m];
            for round in 0..3 {
                let x = random_acts(k, m, &mut rng);
                for t in 0..m {
                    quantize_act_row_at(
                        KernelLevel::Scalar,
                        fmt,
                        &x[t * k..(t + 1) * k],
                        &mut acts[t * arb..(t + 1) * arb],
                    );
                }
                let mut want = vec![0f32; m * n];
                // SAFETY: buffers sized m * n.
                unsafe { matmul_rows_at(KernelLevel::Scalar, ty, &w, k, 0..n, &acts, m, want.as_mut_ptr(), n) };
                for &level in &available_levels() {
                    for rows in [0..n, 3..n, 7..8] {
                        let mut got = vec![0f32; m * n];
                        unsafe { matmul_rows_at(level, ty, &w, k, rows.clone(), &acts, m, got.as_mut_ptr(), n) };
                        for t in 0..m {
                            for r in rows.clone() {
                                let (g, e) = (got[t * n + r], want[t * n + r]);
                                assert!(
                                    (g - e).abs() <= 1e-4 * e.abs().max(1.0),
                                    "{ty} {level:?} m={m} round={round} r={r}: {g} vs {e}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Batch invariance: one activation row's results are bitwise the same whether it is multiplied alone or inside a
/// batch of m rows (any position), and whatever row range the weight rows are split into.
fn check_batch_invariance(ty: GgmlType, k: usize, seed: u64, failures: &mut Vec<String>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let n = 37;
    let fmt = act_format(ty).unwrap();
    let w: Vec<u8> = (0..n).flat_map(|_| random_row(ty, k, &mut rng)).collect();
    let max_m = 64;
    let x = random_acts(k, max_m, &mut rng);
    let arb = act_row_bytes(fmt, k);
    for &level in &available_levels() {
        let mut acts = vec![0u8; arb * max_m];
        for t in 0..max_m {
            quantize_act_row_at(level, fmt, &x[t * k..(t + 1) * k], &mut acts[t * arb..(t + 1) * arb]);
        }
        // Each row alone, all weight rows in one call.
        let mut alone = vec![0f32; max_m * n];
        for t in 0..max_m {
            // SAFETY: writes n elements of row t.
            unsafe {
                matmul_rows_at(level, ty, &w, k, 0..n, &acts[t * arb..(t + 1) * arb], 1, alone[t * n..].as_mut_ptr(), n)
            };
        }
        for m in [2usize, 3, 4, 5, 7, 8, 9, 10, 11, 12, 13, 16, 17, 33, 64] {
            for split in [n, 16, 5, 1] {
                // Rows 1..=m of the batch start at offset `off` so the probe row sits at varied positions.
                let off = (m * 7) % (max_m - m + 1);
                let mut got = vec![f32::NAN; m * n];
                let mut r0 = 0;
                while r0 < n {
                    let r1 = (r0 + split).min(n);
                    // SAFETY: writes rows r0..r1 of m output rows of length n.
                    unsafe {
                        matmul_rows_at(
                            level,
                            ty,
                            &w,
                            k,
                            r0..r1,
                            &acts[off * arb..(off + m) * arb],
                            m,
                            got.as_mut_ptr(),
                            n,
                        )
                    };
                    r0 = r1;
                }
                let bad = (0..m * n).filter(|&i| got[i].to_bits() != alone[off * n + i].to_bits()).count();
                if bad > 0 {
                    let i = (0..m * n).find(|&i| got[i].to_bits() != alone[off * n + i].to_bits()).unwrap();
                    failures.push(format!(
                        "{ty} {level:?} k={k} m={m} split={split}: {bad}/{} differ, e.g. t={} r={}: batched {} vs alone {}",
                        m * n,
                        i / n,
                        i % n,
                        got[i],
                        alone[off * n + i]
                    ));
                }
            }
        }
    }
}

#[test]
fn batch_invariance_all_types() {
    use GgmlType::*;
    let mut failures = Vec::new();
    for (i, ty) in [Q4_K, Q6_K, Q5_K, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, F32, F16, BF16].into_iter().enumerate() {
        for k in ks_for(ty) {
            check_batch_invariance(ty, k, 1000 + i as u64, &mut failures);
        }
    }
    assert!(failures.is_empty(), "{} batch-invariance failures:\n{}", failures.len(), failures.join("\n"));
}

/// Q4_K and Q6_K weights repacked into their pairs layouts give bitwise the results of the GGUF layout at the same
/// level, for every tail shape (`nsb % 4`), row count (odd too), row split (odd starts too) and `m` (row kernels and
/// panels).
#[test]
fn pairs_layouts_match_gguf_bitwise() {
    use backend::cpu::quant::{Layout, kernel_level, matmul_rows_in, pack, preferred_layout};
    let mut failures = Vec::new();
    let k_quant_lengths: Vec<usize> = [1usize, 2, 3, 4, 5, 6, 7, 8, 11, 35].iter().map(|n| n * 256).collect();
    // Q5_0 quads: whole groups of 128; 896 and 4864 are the 0.5B's rows.
    let quads_lengths = vec![128, 256, 384, 896, 1536, 4864];
    for (ty, layout, lengths) in [
        (GgmlType::Q4_K, Layout::Q4KPairs, &k_quant_lengths),
        (GgmlType::Q6_K, Layout::Q6KPairs, &k_quant_lengths),
        (GgmlType::Q5_0, Layout::Q50Quads, &quads_lengths),
    ] {
        if preferred_layout(ty) != layout {
            eprintln!("skipped: the repacked layouts need the AVX-512 kernels (level {:?})", kernel_level());
            return;
        }
        let mut rng = StdRng::seed_from_u64(77);
        for &k in lengths {
            let n = 37;
            let w: Vec<u8> = (0..n).flat_map(|_| random_row(ty, k, &mut rng)).collect();
            let mut packed = vec![0u8; layout.matrix_bytes(ty, n, k).unwrap()];
            pack(layout, ty, &w, n, k, 0..n.div_ceil(layout.unit_rows()), &mut packed);
            let act_format = backend::cpu::quant::act_format(ty).unwrap();
            let max_m = 17;
            let x = random_acts(k, max_m, &mut rng);
            let arb = act_row_bytes(act_format, k);
            let mut acts = vec![0u8; arb * max_m];
            for t in 0..max_m {
                quantize_act_row_at(kernel_level(), act_format, &x[t * k..(t + 1) * k], &mut acts[t * arb..]);
            }
            for m in [1usize, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 17] {
                let mut want = vec![0f32; m * n];
                // SAFETY: buffers sized m * n.
                unsafe { matmul_rows_at(kernel_level(), ty, &w, k, 0..n, &acts, m, want.as_mut_ptr(), n) };
                for split in [n, 16, 5, 1] {
                    let mut got = vec![f32::NAN; m * n];
                    let mut r0 = 0;
                    while r0 < n {
                        let r1 = (r0 + split).min(n);
                        // SAFETY: writes rows r0..r1 of m output rows of length n.
                        unsafe { matmul_rows_in(layout, ty, &packed, k, r0..r1, &acts, m, got.as_mut_ptr(), n) };
                        r0 = r1;
                    }
                    let bad = (0..m * n).filter(|&i| got[i].to_bits() != want[i].to_bits()).count();
                    if bad > 0 {
                        let i = (0..m * n).find(|&i| got[i].to_bits() != want[i].to_bits()).unwrap();
                        failures.push(format!(
                            "{ty} k={k} m={m} split={split}: {bad}/{} differ, e.g. t={} r={}: pairs {} vs gguf {}",
                            m * n,
                            i / n,
                            i % n,
                            got[i],
                            want[i]
                        ));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}
