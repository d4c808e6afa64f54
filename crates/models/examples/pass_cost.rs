//! Time of one forward pass by row count, the way speculative verification and batched decode use it: a sequence
//! with `--context` tokens already in its KV cache, then passes of `m` new rows (all logits wanted), rolled back
//! after each pass. Prints the fastest of `--reps` passes per `m` and its ratio to `m = 1`.
//! Usage: pass_cost MODEL.gguf [--context N] [--reps N] [--threads N] [--logits N] M...
//! (`--logits N`: logits only for ids below N, as a draft model with a narrowed output head; `--seqs`: the `m` rows
//! come from `m` sequences of one row each, as in batched decode.)
use std::sync::Arc;
use std::time::Instant;

use models::cpu::CpuRunner;
use models::{Batch, LogitsWanted, Runner, SeqChunk, SeqId};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let model = &args[1];
    let (mut context, mut reps, mut threads, mut logits, mut ms) = (256usize, 5usize, 0usize, 0usize, Vec::new());
    let mut seqs = false;
    let mut i = 2;
    while i < args.len() {
        match args[i].as_str() {
            "--context" => (context, i) = (args[i + 1].parse().expect("--context N"), i + 1),
            "--reps" => (reps, i) = (args[i + 1].parse().expect("--reps N"), i + 1),
            "--threads" => (threads, i) = (args[i + 1].parse().expect("--threads N"), i + 1),
            "--logits" => (logits, i) = (args[i + 1].parse().expect("--logits N"), i + 1),
            "--seqs" => seqs = true,
            m => ms.push(m.parse::<usize>().expect("row count")),
        }
        i += 1;
    }
    let file = Arc::new(gguf::GgufFile::open(model).expect("model opens"));
    let mut runner = CpuRunner::new(file, threads).expect("model loads");
    runner.limit_logits(logits);
    let max_m = ms.iter().copied().max().unwrap_or(1);
    let prompt: Vec<u32> = (0..context as u32).map(|t| 100 + t % 5000).collect();
    for s in 0..if seqs { max_m } else { 1 } {
        let chunk = SeqChunk { seq: SeqId(s as u64), tokens: &prompt, start_pos: 0, logits: LogitsWanted::Last };
        runner.forward(&Batch { chunks: vec![chunk] }).expect("prefill");
    }
    let mut base = 0.0;
    for m in ms {
        let tokens: Vec<u32> = (0..m as u32).map(|t| 200 + t).collect();
        let chunks: Vec<SeqChunk> = if seqs {
            (0..m)
                .map(|s| SeqChunk {
                    seq: SeqId(s as u64),
                    tokens: &tokens[s..s + 1],
                    start_pos: context,
                    logits: LogitsWanted::All,
                })
                .collect()
        } else {
            vec![SeqChunk { seq: SeqId(0), tokens: &tokens, start_pos: context, logits: LogitsWanted::All }]
        };
        let mut best = f64::INFINITY;
        for _ in 0..reps {
            let t0 = Instant::now();
            runner.forward(&Batch { chunks: chunks.clone() }).expect("forward");
            best = best.min(t0.elapsed().as_secs_f64());
            for c in &chunks {
                runner.truncate(c.seq, context);
            }
        }
        if m == 1 {
            base = best;
        }
        println!("m={m:3}  {:8.2} ms  {:5.2}x", best * 1e3, if base > 0.0 { best / base } else { f64::NAN });
    }
}
