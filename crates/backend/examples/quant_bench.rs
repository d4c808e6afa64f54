//! Micro-benchmark of the quantized CPU kernels.
//!
//! GEMV (m = 1): weight bandwidth in GB/s, rotating over enough matrices (> 4 × a 32 MiB L3) that the weights
//! come from DRAM, with 1 and 2 threads splitting the rows. GEMM (m = 4, 16, 64, 512): GOP/s-equivalent
//! (2·m·n·k / time) on the same rotating matrices.
//!
//! `cargo run --release -p splash-backend --example quant_bench [-- TYPE,... [LEVEL,...] [k n]]`
//! e.g. `-- Q4_K,Q6_K avx512 1536 8960`. `SPLASH_BENCH_HOT=1` reuses one matrix (cache-resident compute speed).

use backend::cpu::quant::{
    KernelLevel, Layout, act_format, act_row_bytes, available_levels, matmul_rows_at, matmul_rows_in, pack,
    quantize_act_row,
};
use gguf::GgmlType;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Barrier;
use std::time::{Duration, Instant};

/// Random blocks with valid f16 scales (no NaN/Inf/denormal surprises).
fn random_matrix(ty: GgmlType, n: usize, k: usize, rng: &mut StdRng) -> Vec<u8> {
    use GgmlType::*;
    let rb = ty.row_bytes(k).unwrap();
    let mut w: Vec<u8> = (0..n * rb).map(|_| rng.random::<u8>()).collect();
    let h = |v: f32| half::f16::from_f32(v).to_bits().to_le_bytes();
    let bb = ty.block_bytes();
    let scale_offsets: &[usize] = match ty {
        Q4_0 | Q5_0 | Q8_0 => &[0],
        Q4_1 | Q5_1 | Q4_K | Q5_K => &[0, 2],
        Q6_K => &[208],
        F16 => &[0],
        _ => &[],
    };
    for b in w.chunks_exact_mut(bb) {
        for &o in scale_offsets {
            b[o..o + 2].copy_from_slice(&h(rng.random_range(0.001f32..0.01)));
        }
        if ty == F32 {
            b.copy_from_slice(&rng.random_range(-1.0f32..1.0).to_le_bytes());
        }
        if ty == BF16 {
            b.copy_from_slice(&((rng.random_range(-1.0f32..1.0).to_bits() >> 16) as u16).to_le_bytes());
        }
    }
    w
}

struct SendPtr(*mut f32);
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

#[allow(clippy::too_many_arguments)]
/// Seconds for the fastest matrix product seen, rows split evenly over `threads` (the split rounded to 16 rows).
fn time_product(
    level: KernelLevel,
    ty: GgmlType,
    mats: &[Vec<u8>],
    n: usize,
    k: usize,
    acts: &[u8],
    m: usize,
    threads: usize,
    budget: Duration,
) -> f64 {
    let mut out = vec![0f32; m * n];
    let optr = SendPtr(out.as_mut_ptr());
    let per = n.div_ceil(threads).div_ceil(16) * 16;
    let barrier = Barrier::new(threads);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let iters = std::sync::atomic::AtomicUsize::new(0);
    // Fastest single product (in ns), measured by thread 0 between the barriers: the machine is shared, and an
    // iteration where a thread was preempted only shows up as a slower sample.
    let best_ns = std::sync::atomic::AtomicU64::new(u64::MAX);
    let next = std::sync::atomic::AtomicUsize::new(0);
    // SPLASH_BENCH_CHUNK=N: rows handed out N at a time from a shared counter instead of one contiguous share.
    let chunk: usize = std::env::var("SPLASH_BENCH_CHUNK").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    let start = Instant::now();
    std::thread::scope(|s| {
        for th in 0..threads {
            let (barrier, stop, iters, optr, next, best_ns) = (&barrier, &stop, &iters, &optr, &next, &best_ns);
            s.spawn(move || {
                let rows = (th * per).min(n)..((th + 1) * per).min(n);
                let mut it = 0usize;
                loop {
                    // Timed from before the start barrier: a thread that is late to start (preempted) must not
                    // make the iteration look short.
                    let t_it = Instant::now();
                    barrier.wait();
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        break;
                    }
                    let w = &mats[it % mats.len()];
                    if chunk == 0 {
                        // SAFETY: each thread writes its own rows of `out` (m x n).
                        unsafe { matmul_rows_at(level, ty, w, k, rows.clone(), acts, m, optr.0, n) };
                    } else {
                        // Chunks of `chunk` rows handed out dynamically, like a work-stealing pool.
                        loop {
                            let c = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            let r0 = c * chunk;
                            if r0 >= n {
                                break;
                            }
                            // SAFETY: each chunk of rows is written by exactly one thread.
                            unsafe { matmul_rows_at(level, ty, w, k, r0..(r0 + chunk).min(n), acts, m, optr.0, n) };
                        }
                    }
                    it += 1;
                    barrier.wait();
                    if th == 0 {
                        next.store(0, std::sync::atomic::Ordering::Relaxed);
                        best_ns.fetch_min(t_it.elapsed().as_nanos() as u64, std::sync::atomic::Ordering::Relaxed);
                    }
                    barrier.wait();
                    if th == 0 {
                        iters.store(it, std::sync::atomic::Ordering::Relaxed);
                        if (it >= 3 && start.elapsed() > budget) || it >= 1000 {
                            stop.store(true, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                }
            });
        }
    });
    std::hint::black_box(&out);
    let _ = iters.load(std::sync::atomic::Ordering::Relaxed);
    best_ns.load(std::sync::atomic::Ordering::Relaxed) as f64 * 1e-9
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let all_types = [
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::Q5_0,
        GgmlType::Q8_0,
        GgmlType::Q4_1,
        GgmlType::Q4_0,
        GgmlType::Q5_1,
        GgmlType::Q5_K,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::F32,
    ];
    let types: Vec<GgmlType> = match args.first() {
        Some(a) if a != "all" => all_types.iter().copied().filter(|t| a.split(',').any(|s| s == t.name())).collect(),
        _ => all_types.to_vec(),
    };
    let levels: Vec<KernelLevel> = match args.get(1) {
        Some(a) if a != "all" => {
            available_levels().into_iter().filter(|l| a.split(',').any(|s| s == l.name())).collect()
        }
        _ => available_levels(),
    };
    let k: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1536);
    let n: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(8960);
    let mut rng = StdRng::seed_from_u64(1);
    println!("shape: n = {n} rows x k = {k}; levels {levels:?}");
    for &ty in &types {
        let kk = k.div_ceil(ty.block_len()) * ty.block_len();
        let mat_bytes = ty.row_bytes(kk).unwrap() * n;
        // > 4 x 32 MiB of L3, so every product streams its weights from DRAM.
        // SPLASH_BENCH_HOT=1: one matrix, reused (cache-resident compute speed).
        let hot = std::env::var("SPLASH_BENCH_HOT").is_ok_and(|v| v == "1");
        let nmat = if hot { 1 } else { (160usize << 20).div_ceil(mat_bytes).max(2) };
        let mats: Vec<Vec<u8>> = (0..nmat).map(|_| random_matrix(ty, n, kk, &mut rng)).collect();
        let fmt = act_format(ty).unwrap();
        let arb = act_row_bytes(fmt, kk);
        let mmax = 512;
        let x: Vec<f32> = (0..mmax * kk).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        let mut acts = vec![0u8; mmax * arb];
        let mut tq = f64::INFINITY;
        for _ in 0..3 {
            // (The first pass also pays for the page faults of the fresh buffer.)
            let t = Instant::now();
            for t in 0..mmax {
                quantize_act_row(fmt, &x[t * kk..(t + 1) * kk], &mut acts[t * arb..(t + 1) * arb]);
            }
            tq = tq.min(t.elapsed().as_secs_f64());
        }
        println!(
            "\n{ty}: {nmat} matrices of {:.1} MB; activation quantization {:.2} µs/row",
            mat_bytes as f64 / 1e6,
            tq / mmax as f64 * 1e6
        );
        if std::env::var("SPLASH_BENCH_MICRO").is_ok_and(|v| v == "1") {
            // One thread, one cache-resident matrix (with SPLASH_BENCH_HOT=1): ns per block-row of the kernel
            // itself.
            for &level in &levels {
                let ms: Vec<usize> = std::env::var("SPLASH_BENCH_MS")
                    .map(|v| v.split(',').filter_map(|x| x.parse().ok()).collect())
                    .unwrap_or_else(|_| vec![1, 2, 4, 8, 16, 64]);
                for m in ms {
                    let mut out = vec![0f32; m * n];
                    // SPLASH_BENCH_PAIRS=1: Q4_K / Q6_K / Q5_0 repacked into their load-time layouts (AVX-512 only). Without
                    // SPLASH_BENCH_HOT=1 the calls rotate over the matrices (weights from DRAM).
                    let layout = backend::cpu::quant::preferred_layout(ty);
                    let pairs = layout != Layout::Gguf
                        && level == KernelLevel::Avx512
                        && std::env::var("SPLASH_BENCH_PAIRS").is_ok_and(|v| v == "1");
                    let packed: Vec<(Vec<u8>, std::ops::Range<usize>)> = if pairs {
                        mats.iter()
                            .map(|w| {
                                let len = layout.matrix_bytes(ty, n, kk).unwrap();
                                let mut p = vec![0u8; len + 64];
                                let o = p.as_ptr().align_offset(64);
                                let units = 0..n.div_ceil(layout.unit_rows());
                                pack(layout, ty, w, n, kk, units, &mut p[o..o + len]);
                                (p, o..o + len)
                            })
                            .collect()
                    } else {
                        Vec::new()
                    };
                    // The fastest of many timed calls: the machine is shared, and a preempted call only
                    // makes that sample slower.
                    let mut s = f64::INFINITY;
                    let t = Instant::now();
                    let mut it = 0;
                    while t.elapsed() < Duration::from_millis(300) {
                        let i = it % mats.len();
                        it += 1;
                        let t1 = Instant::now();
                        if pairs {
                            unsafe {
                                matmul_rows_in(
                                    layout,
                                    ty,
                                    &packed[i].0[packed[i].1.clone()],
                                    kk,
                                    0..n,
                                    &acts,
                                    m,
                                    out.as_mut_ptr(),
                                    n,
                                )
                            };
                        } else {
                            unsafe { matmul_rows_at(level, ty, &mats[i], kk, 0..n, &acts, m, out.as_mut_ptr(), n) };
                        }
                        s = s.min(t1.elapsed().as_secs_f64());
                    }
                    let blocks = (n * kk / ty.block_len()) as f64;
                    println!(
                        "  {:<7} m={m:<3} {:7.2} ns/block-row  {:6.1} GB/s  {:6.1} GOP/s",
                        level.name(),
                        s / blocks * 1e9,
                        mat_bytes as f64 / s / 1e9,
                        2.0 * (m * n * kk) as f64 / s / 1e9
                    );
                }
            }
            continue;
        }
        for &level in &levels {
            let budget = Duration::from_millis(if level == KernelLevel::Scalar { 300 } else { 600 });
            let mut line = format!("  {:<7}", level.name());
            let gemv_only = std::env::var("SPLASH_BENCH_GEMV_ONLY").is_ok_and(|v| v == "1");
            for threads in if gemv_only { vec![1] } else { vec![1, 2] } {
                let s = time_product(level, ty, &mats, n, kk, &acts, 1, threads, budget);
                line += &format!("  gemv {threads}T {:6.1} GB/s", mat_bytes as f64 / s / 1e9);
            }
            let ms: Vec<usize> = std::env::var("SPLASH_BENCH_MS")
                .map(|v| v.split(',').filter_map(|x| x.parse().ok()).collect())
                .unwrap_or_else(|_| vec![4, 16, 64, 512]);
            for m in ms {
                if gemv_only || (level == KernelLevel::Scalar && m > 16) {
                    continue;
                }
                let s = time_product(level, ty, &mats, n, kk, &acts, m, 2, budget);
                line += &format!("  m={m} {:6.1}", 2.0 * (m * n * kk) as f64 / s / 1e9);
            }
            println!("{line}  (GOP/s, 2T)");
        }
    }
}
