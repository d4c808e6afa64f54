//! Micro-benchmark of CPU prefill attention: one 512-row prefill chunk of one sequence that already holds
//! `start` positions, on the Qwen2.5-Coder 0.5B shape (14 heads, 2 KV heads, head_dim 64) and the 1.5B shape
//! (12 / 2 / 128), paged in 16-token blocks as the runner stores them. Prints ms per layer and GFLOP/s counted as
//! 4 · heads · head_dim · (keys seen, summed over rows).
//!
//! Each case runs the SIMD kernels this CPU has (bf16 for both products, bf16 for P·V only, f32) alternately, so all
//! see the same machine load, and compares each output with the portable kernel's (computed once, not timed). The
//! flash kernel's predecessor, which this bench used to time beside them, is in git history (commit b5df07d,
//! `examples/attn_bench/old.rs`); its figures are in benchmarks/log/2026-11-30-long-prompts-and-agents.md.
//!
//! `cargo run --release -p splash-backend --example attn_bench [-- START,...]` (default 1536,7680,11776).

use backend::KvType;
use backend::cpu::ThreadPool;
use backend::cpu::attention::{AttnKernel, AttnShape, SeqAttn, attention_with};
use std::time::Instant;

/// Seconds: wall time, or with one thread (`THREADS=1`) the process's CPU time (from /proc, 10 ms ticks), which
/// other processes sharing the cores disturb much less.
fn clock(threads: usize) -> f64 {
    static T0: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    if threads == 1 {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        let fields: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
        let ticks: f64 = fields.get(11).and_then(|x| x.parse().ok()).unwrap_or(0.0);
        return ticks / 100.0;
    }
    T0.get_or_init(Instant::now).elapsed().as_secs_f64()
}

fn main() {
    let starts: Vec<usize> = std::env::args()
        .nth(1)
        .map(|a| a.split(',').filter_map(|x| x.parse().ok()).collect())
        .unwrap_or_else(|| vec![1536, 7680, 11776]);
    let rows = std::env::var("ROWS").ok().and_then(|t| t.parse().ok()).unwrap_or(512);
    let threads = std::env::var("THREADS").ok().and_then(|t| t.parse().ok()).unwrap_or(2);
    let pool = ThreadPool::new(threads);
    for (name, num_heads, num_kv_heads, hd) in [("0.5B", 14, 2, 64), ("1.5B", 12, 2, 128)] {
        let shape = AttnShape { num_heads, num_kv_heads, head_dim: hd, scale: 1.0 / (hd as f32).sqrt() };
        let (kvd, qd) = (num_kv_heads * hd, num_heads * hd);
        for &start in &starts {
            let n = start + rows;
            let f = |i: usize| (i * 2654435761 % 1000) as f32 / 500.0 - 1.0;
            let k: Vec<u16> = (0..n * kvd).map(|i| half::f16::from_f32(f(i)).to_bits()).collect();
            let v: Vec<u16> = (0..n * kvd).map(|i| half::f16::from_f32(f(i + 3)).to_bits()).collect();
            let q: Vec<f32> = (0..rows * qd).map(|i| f(i + 5)).collect();
            let seq = SeqAttn {
                k: k.chunks(16 * kvd).collect(),
                v: v.chunks(16 * kvd).collect(),
                kv_type: KvType::F16,
                block_tokens: 16,
                start_pos: start,
                num_rows: rows,
            };
            let mut reference = vec![0f32; rows * qd];
            attention_with(AttnKernel::Portable, &pool, shape, &q, std::slice::from_ref(&seq), &mut reference);
            // Every available SIMD kernel (or the selected one), alternately.
            let kernels: Vec<AttnKernel> =
                AttnKernel::available().into_iter().filter(|k| !matches!(k, AttnKernel::Portable)).collect();
            let kernels = if kernels.is_empty() { vec![AttnKernel::selected()] } else { kernels };
            let mut outs = vec![vec![0f32; rows * qd]; kernels.len()];
            let mut times = vec![0f64; kernels.len()];
            let reps = if threads == 1 { 6 } else { 3 } * if rows < 64 { 50 } else { 1 };
            for rep in 0..=reps {
                for (i, &kernel) in kernels.iter().enumerate() {
                    let t0 = clock(threads);
                    attention_with(kernel, &pool, shape, &q, std::slice::from_ref(&seq), &mut outs[i]);
                    if rep > 0 {
                        times[i] += (clock(threads) - t0) / reps as f64;
                    }
                }
            }
            let keys: usize = (0..rows).map(|i| start + i + 1).sum();
            let flop = 4.0 * (num_heads * hd) as f64 * keys as f64;
            println!("{name} start {start:>5} + {rows} rows:");
            for ((kernel, t), out) in kernels.iter().zip(&times).zip(&outs) {
                let max_diff = out.iter().zip(&reference).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                println!(
                    "    {:<12} {:7.2} ms/layer {:6.1} GFLOP/s  {:.2}x {:?}, max |diff vs portable| {max_diff:.2e}",
                    format!("{kernel:?}"),
                    t * 1e3,
                    flop / t / 1e9,
                    times[kernels.len() - 1] / t,
                    kernels[kernels.len() - 1],
                );
            }
        }
    }
}
