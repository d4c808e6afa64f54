//! Quantized matrix kernels for the CPU: activation quantization and weight x activation dot products over GGUF's
//! native block layouts, with runtime SIMD dispatch (AVX-512 VNNI, AVX2/FMA, scalar; NEON on aarch64).
//!
//! In: weight rows as raw GGUF blocks (or, on AVX-512, repacked at load: Q4_K and Q6_K into the pairs layouts of
//! [`q4k_pairs`] and [`q6k_pairs`], Q5_0 into the quads of [`q50_quads`]; [`matmul_rows_in`]), activations as f32 rows. Out: f32 dot products. Threading is the caller's job:
//! every function here works on the row range it is given.
//!
//! The integer math is ggml's `vec_dot_*` (the same per-block integer sums and scale products), so results agree
//! with llama.cpp up to f32 rounding order. Two regimes (details and measured speeds in `NOTES.md` next to this
//! file): for few activation rows (decode, speculative verification, `m <= 4`) each weight row is streamed front to
//! back and its unpacked blocks meet all activation rows in registers; for many rows (prefill) AVX-512 regroups 16
//! weight rows into a panel so that `vpdpbusd` works on 16 rows per instruction.
//!
//! Results are batch-invariant: at a given level every output element is computed with one canonical f32 operation
//! sequence whatever `m`, the row range or the caller's thread split (`NOTES.md`, "Batch invariance"), so a
//! sequence's logits do not depend on the other rows that share a call.
//!
//! Callers should hand each call a long run of rows when `m` is small (a few hundred rows, or one contiguous share
//! per thread): the activations are rearranged once per call, and DRAM streams best from one contiguous run.
//!
//! The level is chosen once per process (best available; `SPLASH_CPU_KERNELS=scalar|avx2|avx512` caps it). Tests
//! and benchmarks can call any available level through [`quantize_act_row_at`] and [`matmul_rows_at`].

mod blocks;
pub mod q4k_pairs;
pub mod q50_quads;
pub mod q6k_pairs;
mod scalar;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod avx512_rows;
#[cfg(target_arch = "aarch64")]
mod neon;

use gguf::GgmlType;
use std::ops::Range;
use std::sync::OnceLock;

/// How activations are encoded before they meet a weight type.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActFormat {
    /// Plain f32 (float weight types).
    F32,
    /// ggml `block_q8_0`: f16 scale + 32 x i8.
    Q8_0,
    /// ggml `block_q8_1`: f16 scale, f16 scale*sum + 32 x i8.
    Q8_1,
    /// ggml `block_q8_K`: f32 scale, 256 x i8, 16 x i16 sums of 16.
    Q8_K,
}

impl ActFormat {
    /// Elements per block.
    pub fn block_len(self) -> usize {
        match self {
            ActFormat::F32 => 1,
            ActFormat::Q8_0 | ActFormat::Q8_1 => blocks::QK,
            ActFormat::Q8_K => blocks::QK_K,
        }
    }

    /// Bytes of the ggml blocks of a row of `k` elements (the part that is bit-identical to ggml's
    /// `quantize_row_q8_*_ref`; [`act_row_bytes`] adds the kernels' trailer).
    pub fn ggml_row_bytes(self, k: usize) -> usize {
        match self {
            ActFormat::F32 => 4 * k,
            ActFormat::Q8_0 => k / blocks::QK * blocks::Q8_0_BYTES,
            ActFormat::Q8_1 => k / blocks::QK * blocks::Q8_1_BYTES,
            ActFormat::Q8_K => k / blocks::QK_K * blocks::Q8_K_BYTES,
        }
    }

    /// The ggml type of the blocks (`F32`, `Q8_0`, `Q8_1`, `Q8_K`).
    pub fn ggml_type(self) -> GgmlType {
        match self {
            ActFormat::F32 => GgmlType::F32,
            ActFormat::Q8_0 => GgmlType::Q8_0,
            ActFormat::Q8_1 => GgmlType::Q8_1,
            ActFormat::Q8_K => GgmlType::Q8_K,
        }
    }
}

/// The activation format that weights of type `wty` are multiplied with, or `None` if unsupported.
pub fn act_format(wty: GgmlType) -> Option<ActFormat> {
    use GgmlType::*;
    match wty {
        F32 | F16 | BF16 => Some(ActFormat::F32),
        Q4_0 | Q5_0 | Q8_0 => Some(ActFormat::Q8_0),
        Q4_1 | Q5_1 => Some(ActFormat::Q8_1),
        Q4_K | Q5_K | Q6_K => Some(ActFormat::Q8_K),
        _ => None,
    }
}

/// Bytes of one quantized activation row of length `k` (`k` a multiple of `fmt.block_len()`): the ggml blocks
/// followed by the kernels' trailer of block sums (layout in `blocks.rs`).
pub fn act_row_bytes(fmt: ActFormat, k: usize) -> usize {
    let nb = k / fmt.block_len();
    fmt.ggml_row_bytes(k)
        + match fmt {
            ActFormat::Q8_0 => nb * blocks::Q8_0_EXTRA,
            ActFormat::Q8_1 => nb * blocks::Q8_1_EXTRA,
            ActFormat::Q8_K => nb * blocks::Q8_K_EXTRA,
            ActFormat::F32 => 0,
        }
}

/// Quantizes one activation row `x` into `out` (`act_row_bytes(fmt, x.len())` bytes).
///
/// The first `fmt.ggml_row_bytes(k)` bytes are bit-identical to ggml's `quantize_row_q8_*_ref`. (llama.cpp's x86
/// runtime quantizers for Q8_0/Q8_1 scale by `127/amax` and round half to even instead; on random data that changes
/// about 1 quant in 600 000. Q8_K is the reference on x86 too.)
///
/// # Panics
/// If `x.len()` is not a multiple of the block length or `out` is shorter than `act_row_bytes`.
pub fn quantize_act_row(fmt: ActFormat, x: &[f32], out: &mut [u8]) {
    quantize_act_row_at(kernel_level(), fmt, x, out)
}

/// `out[t * ldo + r] = dot(weight row r, activation row t)` for `r` in `rows`, `t` in `0..m`.
///
/// `w` holds all weight rows of type `wty`, each `k` elements; `acts` holds `m` rows quantized with
/// `act_format(wty)`, each `act_row_bytes` long.
///
/// # Panics
/// If `wty` has no activation format, `k` is not a whole number of blocks, or `w` / `acts` are too short.
///
/// # Safety
/// `out` must be valid for writes at every index above, and no other thread may write those indices.
#[allow(clippy::too_many_arguments)]
pub unsafe fn matmul_rows(
    wty: GgmlType,
    w: &[u8],
    k: usize,
    rows: Range<usize>,
    acts: &[u8],
    m: usize,
    out: *mut f32,
    ldo: usize,
) {
    // SAFETY: forwarded contract.
    unsafe { matmul_rows_at(kernel_level(), wty, w, k, rows, acts, m, out, ldo) }
}

/// How a weight matrix's bytes are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// GGUF blocks, row after row.
    Gguf,
    /// Q4_K regrouped at load for the AVX-512 kernels, rows in pairs ([`q4k_pairs`]).
    Q4KPairs,
    /// Q6_K blocks of two rows interleaved at load for the AVX-512 kernels ([`q6k_pairs`]).
    Q6KPairs,
    /// Q5_0 blocks regrouped four at a time within each row, at load for the AVX-512 kernels ([`q50_quads`]).
    Q50Quads,
}

impl Layout {
    /// Bytes of `rows` rows of `k` elements of type `wty` in this layout.
    pub fn matrix_bytes(self, wty: GgmlType, rows: usize, k: usize) -> Option<usize> {
        match self {
            Layout::Gguf => wty.row_bytes(k).map(|rb| rb * rows),
            Layout::Q50Quads => q50_quads::fits(k).then(|| wty.row_bytes(k).map(|rb| rb * rows)).flatten(),
            Layout::Q4KPairs | Layout::Q6KPairs => self.pair_bytes(k).map(|pb| rows.div_ceil(2) * pb),
        }
    }

    /// Rows per unit that [`pack`] writes on its own: a pair for the pairs layouts, one row otherwise.
    pub fn unit_rows(self) -> usize {
        match self {
            Layout::Q4KPairs | Layout::Q6KPairs => 2,
            Layout::Gguf | Layout::Q50Quads => 1,
        }
    }

    /// The weight type a repacked layout holds (`None` for `Gguf`, which holds any).
    pub fn holds(self) -> Option<GgmlType> {
        match self {
            Layout::Gguf => None,
            Layout::Q4KPairs => Some(GgmlType::Q4_K),
            Layout::Q6KPairs => Some(GgmlType::Q6_K),
            Layout::Q50Quads => Some(GgmlType::Q5_0),
        }
    }

    /// Bytes of one pair of rows of `k` elements in a pairs layout (`None` for the layouts of single rows).
    pub fn pair_bytes(self, k: usize) -> Option<usize> {
        match self {
            Layout::Gguf | Layout::Q50Quads => None,
            Layout::Q4KPairs => Some(q4k_pairs::pair_bytes(k)),
            Layout::Q6KPairs => Some(q6k_pairs::pair_bytes(k)),
        }
    }
}

/// Packs units `units` (of [`Layout::unit_rows`] rows each) of the GGUF matrix `w` (`rows` rows of `k` elements of
/// `wty`) into `dst`, which holds exactly those units in `layout` (`Gguf`: a copy).
///
/// # Panics
/// If the lengths do not match, or `layout` cannot hold `wty` rows of `k`.
pub fn pack(layout: Layout, wty: GgmlType, w: &[u8], rows: usize, k: usize, units: Range<usize>, dst: &mut [u8]) {
    match layout {
        Layout::Q4KPairs => q4k_pairs::pack_pairs(w, rows, k, units, dst),
        Layout::Q6KPairs => q6k_pairs::pack_pairs(w, rows, k, units, dst),
        Layout::Gguf | Layout::Q50Quads => {
            let rb = wty.row_bytes(k).expect("pack: rows of whole blocks");
            let from = &w[units.start * rb..units.end * rb];
            assert_eq!(dst.len(), from.len(), "pack: destination size");
            if layout == Layout::Gguf {
                dst.copy_from_slice(from);
                return;
            }
            for (s, d) in from.chunks_exact(rb).zip(dst.chunks_exact_mut(rb)) {
                q50_quads::pack_row(s, d);
            }
        }
    }
}

/// The layout that `wty` weights are best repacked into at load for this process's kernel level (`Gguf`: keep
/// them as they are). `SPLASH_REPACK=0` keeps every matrix as it is (to compare).
pub fn preferred_layout(wty: GgmlType) -> Layout {
    static REPACK: OnceLock<bool> = OnceLock::new();
    let repack = *REPACK.get_or_init(|| std::env::var("SPLASH_REPACK").map_or(true, |v| v != "0"));
    match wty {
        GgmlType::Q4_K if repack && kernel_level() == KernelLevel::Avx512 => Layout::Q4KPairs,
        GgmlType::Q6_K if repack && kernel_level() == KernelLevel::Avx512 => Layout::Q6KPairs,
        GgmlType::Q5_0 if repack && kernel_level() == KernelLevel::Avx512 => Layout::Q50Quads,
        _ => Layout::Gguf,
    }
}

/// [`matmul_rows`] for weights in `layout` (the repacked layouts, packed by [`q4k_pairs::pack_pairs`],
/// [`q6k_pairs::pack_pairs`] or [`q50_quads::pack_row`], need the AVX-512 level).
///
/// # Safety
/// As [`matmul_rows`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn matmul_rows_in(
    layout: Layout,
    wty: GgmlType,
    w: &[u8],
    k: usize,
    rows: Range<usize>,
    acts: &[u8],
    m: usize,
    out: *mut f32,
    ldo: usize,
) {
    match layout {
        // SAFETY: forwarded contract.
        Layout::Gguf => unsafe { matmul_rows(wty, w, k, rows, acts, m, out, ldo) },
        _ => {
            let want = layout.holds().expect("INVARIANT: every layout but Gguf holds one type");
            assert_eq!(wty, want, "matmul_rows: the {layout:?} layout holds {want} weights");
            assert!(k.is_multiple_of(wty.block_len()), "matmul_rows: {k} is not a whole number of {wty} blocks");
            let len = layout.matrix_bytes(wty, rows.end, k);
            assert!(len.is_some(), "matmul_rows: rows of {k} do not fit the {layout:?} layout");
            assert!(len.is_some_and(|len| w.len() >= len), "matmul_rows: weights too short");
            let fmt = act_format(wty).expect("INVARIANT: repacked types are quantized");
            let act_rb = act_row_bytes(fmt, k);
            assert!(acts.len() >= m * act_rb, "matmul_rows: activations too short for {m} rows");
            if rows.is_empty() || m == 0 {
                return;
            }
            #[cfg(target_arch = "x86_64")]
            if kernel_level() == KernelLevel::Avx512 {
                // SAFETY: lengths checked above; `out` per the caller's contract; AVX-512 was detected.
                unsafe { avx512::matmul_rows_repacked(layout, wty, w, k, rows, acts, act_rb, m, out, ldo) };
                return;
            }
            panic!("matmul_rows: the {layout:?} layout needs the AVX-512 kernels");
        }
    }
}

/// An instruction-set level of the kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum KernelLevel {
    Scalar,
    /// aarch64 Advanced SIMD.
    Neon,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// AVX-512 F/BW/VL/DQ + VNNI.
    Avx512,
}

impl KernelLevel {
    pub fn name(self) -> &'static str {
        match self {
            KernelLevel::Scalar => "scalar",
            KernelLevel::Neon => "neon",
            KernelLevel::Avx2 => "avx2",
            KernelLevel::Avx512 => "avx512",
        }
    }
}

/// Every level this machine can run, lowest first.
pub fn available_levels() -> Vec<KernelLevel> {
    levels().to_vec()
}

fn levels() -> &'static [KernelLevel] {
    static LEVELS: OnceLock<Vec<KernelLevel>> = OnceLock::new();
    LEVELS.get_or_init(detect_levels)
}

fn detect_levels() -> Vec<KernelLevel> {
    let mut v = vec![KernelLevel::Scalar];
    #[cfg(target_arch = "x86_64")]
    {
        if avx2::supported() {
            v.push(KernelLevel::Avx2);
        }
        if avx512::supported() {
            v.push(KernelLevel::Avx512);
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        if neon::supported() {
            v.push(KernelLevel::Neon);
        }
    }
    v
}

/// The level used by [`quantize_act_row`] and [`matmul_rows`]: the best available, capped by
/// `SPLASH_CPU_KERNELS` (`scalar`, `avx2`, `avx512`; `neon` on aarch64). Chosen once per process.
pub fn kernel_level() -> KernelLevel {
    static LEVEL: OnceLock<KernelLevel> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        let levels = available_levels();
        let best = *levels.last().expect("INVARIANT: scalar is always available");
        let cap = match std::env::var("SPLASH_CPU_KERNELS").as_deref() {
            Ok("scalar") => KernelLevel::Scalar,
            Ok("neon") => KernelLevel::Neon,
            Ok("avx2") => KernelLevel::Avx2,
            _ => best,
        };
        levels.into_iter().filter(|&l| l <= cap).max().unwrap_or(KernelLevel::Scalar)
    })
}

/// [`quantize_act_row`] at a given level (which must be in [`available_levels`]).
pub fn quantize_act_row_at(level: KernelLevel, fmt: ActFormat, x: &[f32], out: &mut [u8]) {
    let k = x.len();
    assert!(k.is_multiple_of(fmt.block_len()), "quantize_act_row: {k} is not a multiple of the {fmt:?} block");
    let out = &mut out[..act_row_bytes(fmt, k)];
    assert!(levels().contains(&level), "kernel level {level:?} not available");
    match level {
        #[cfg(target_arch = "x86_64")]
        KernelLevel::Avx512 => {
            // SAFETY: the level is available (checked above).
            unsafe { avx512::quantize_act_row(fmt, x, out) }
        }
        #[cfg(target_arch = "x86_64")]
        KernelLevel::Avx2 => {
            // SAFETY: the level is available (checked above).
            unsafe { avx2::quantize_act_row(fmt, x, out) }
        }
        _ => scalar::quantize_act_row(fmt, x, out),
    }
}

/// [`matmul_rows`] at a given level (which must be in [`available_levels`]).
///
/// # Safety
/// As [`matmul_rows`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn matmul_rows_at(
    level: KernelLevel,
    wty: GgmlType,
    w: &[u8],
    k: usize,
    rows: Range<usize>,
    acts: &[u8],
    m: usize,
    out: *mut f32,
    ldo: usize,
) {
    let fmt = act_format(wty).unwrap_or_else(|| panic!("matmul_rows: unsupported weight type {wty}"));
    let rb = wty.row_bytes(k).unwrap_or_else(|| panic!("matmul_rows: {k} is not a whole number of {wty} blocks"));
    assert!(k.is_multiple_of(fmt.block_len()), "matmul_rows: {k} is not a whole number of {fmt:?} blocks");
    assert!(w.len() >= rows.end * rb, "matmul_rows: weights too short for rows {rows:?}");
    let act_rb = act_row_bytes(fmt, k);
    assert!(acts.len() >= m * act_rb, "matmul_rows: activations too short for {m} rows");
    if rows.is_empty() || m == 0 {
        return;
    }
    assert!(levels().contains(&level), "kernel level {level:?} not available");
    // SAFETY (all arms): slice lengths checked above; `out` per the caller's contract; the level's CPU
    // features were detected (checked above).
    unsafe {
        match level {
            #[cfg(target_arch = "x86_64")]
            KernelLevel::Avx512 => avx512::matmul_rows(wty, w, k, rows, acts, act_rb, m, out, ldo),
            #[cfg(target_arch = "x86_64")]
            KernelLevel::Avx2 => avx2::matmul_rows(wty, w, k, rows, acts, act_rb, m, out, ldo),
            #[cfg(target_arch = "aarch64")]
            KernelLevel::Neon => neon::matmul_rows(wty, w, k, rows, acts, act_rb, m, out, ldo),
            _ => scalar::matmul_rows(wty, w, k, rows, acts, act_rb, m, out, ldo),
        }
    }
}
