//! `splash bench`: prefill and decode speed of the model runner, measured like llama-bench's pp and tg tests.
//!
//! Prefill: one prompt of `--prompt-tokens` tokens in chunks of at most 512. Decode: `--gen-tokens` single-token
//! steps after that prompt, each picking the argmax. Each repetition starts from an empty cache; the median is
//! reported.

use std::time::Instant;

use anyhow::Result;
use models::{Batch, LogitsWanted, Runner, SeqChunk, SeqId};

use crate::load::load;

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, short, default_value = "qwen2.5-coder-1.5b")]
    model: String,
    #[arg(long, default_value_t = 512)]
    prompt_tokens: usize,
    #[arg(long, default_value_t = 128)]
    gen_tokens: usize,
    /// Threads (0 = all cores).
    #[arg(long, short, default_value_t = 0)]
    threads: usize,
    /// Where the model runs.
    #[arg(long, value_enum, default_value = "auto")]
    device: crate::load::Device,
    #[arg(long, default_value_t = 3)]
    repetitions: usize,
    /// Tokens per prefill batch.
    #[arg(long, default_value_t = 512)]
    batch: usize,
    /// Also measure aggregate decode with this many sequences decoding together (repeatable).
    #[arg(long)]
    concurrent: Vec<usize>,
    /// Print one JSON line instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn main(a: Args) -> Result<()> {
    let loaded = load(&a.model, a.threads, a.device)?;
    let mut runner = loaded.runner;
    let vocab = runner.config().vocab_size as u64;
    // Deterministic pseudo-random prompt over the ordinary vocabulary (as llama-bench does).
    let mut x = 0x1234_5678u64;
    let prompt: Vec<u32> = (0..a.prompt_tokens)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((x >> 33) % vocab.min(100_000)) as u32
        })
        .collect();

    // Warm-up: touch every weight once.
    let seq = SeqId(0);
    runner.forward(&Batch {
        chunks: vec![SeqChunk {
            seq,
            tokens: &prompt[..prompt.len().min(8)],
            start_pos: 0,
            logits: LogitsWanted::Last,
        }],
    })?;
    runner.release(seq);

    let mut pp = Vec::new();
    let mut tg = Vec::new();
    for rep in 0..a.repetitions.max(1) {
        let seq = SeqId(rep as u64 + 1);
        let t0 = Instant::now();
        let mut last = 0u32;
        for (i, chunk) in prompt.chunks(a.batch.max(1)).enumerate() {
            let start_pos = i * a.batch.max(1);
            let logits = runner.forward(&Batch {
                chunks: vec![SeqChunk { seq, tokens: chunk, start_pos, logits: LogitsWanted::Last }],
            })?;
            last = engine::sampler::argmax(logits);
        }
        if a.prompt_tokens > 0 {
            pp.push(a.prompt_tokens as f64 / t0.elapsed().as_secs_f64());
        }
        let t1 = Instant::now();
        for i in 0..a.gen_tokens {
            let tokens = [last];
            let logits = runner.forward(&Batch {
                chunks: vec![SeqChunk {
                    seq,
                    tokens: &tokens,
                    start_pos: a.prompt_tokens + i,
                    logits: LogitsWanted::Last,
                }],
            })?;
            last = engine::sampler::argmax(logits);
        }
        if a.gen_tokens > 0 {
            tg.push(a.gen_tokens as f64 / t1.elapsed().as_secs_f64());
        }
        runner.release(seq);
    }
    // Aggregate decode: n sequences with 32-token prompts, then gen_tokens steps of one token each, all together.
    let mut agg = Vec::new();
    for &n in &a.concurrent {
        let ids: Vec<SeqId> = (0..n).map(|s| SeqId(1000 + s as u64)).collect();
        let plen = 32.min(prompt.len().max(1));
        let p: Vec<u32> = (0..plen).map(|i| prompt.get(i).copied().unwrap_or(1)).collect();
        let chunks = ids.iter().map(|&seq| SeqChunk { seq, tokens: &p, start_pos: 0, logits: LogitsWanted::Last });
        let l = runner.forward(&Batch { chunks: chunks.collect() })?;
        let vocab = vocab as usize;
        let mut next: Vec<[u32; 1]> = l.chunks_exact(vocab).map(|r| [engine::sampler::argmax(r)]).collect();
        let t = Instant::now();
        for step in 0..a.gen_tokens {
            let chunks = ids.iter().zip(&next).map(|(&seq, tok)| SeqChunk {
                seq,
                tokens: tok,
                start_pos: plen + step,
                logits: LogitsWanted::Last,
            });
            let l = runner.forward(&Batch { chunks: chunks.collect() })?;
            next = l.chunks_exact(vocab).map(|r| [engine::sampler::argmax(r)]).collect();
        }
        let tok_s = (n * a.gen_tokens) as f64 / t.elapsed().as_secs_f64();
        for &id in &ids {
            runner.release(id);
        }
        agg.push((n, tok_s));
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        if v.is_empty() { 0.0 } else { v[v.len() / 2] }
    };
    let (pp_med, tg_med) = (median(&mut pp), median(&mut tg));
    let model = runner.config().arch.name();
    if a.json {
        let j = serde_json::json!({
            "model": a.model, "arch": model, "threads": runner.num_threads(), "prompt_tokens": a.prompt_tokens,
            "gen_tokens": a.gen_tokens, "prefill_tok_s": pp_med, "decode_tok_s": tg_med, "load_s": loaded.load_s,
            "prefill_runs": pp, "decode_runs": tg, "device": runner.device_name(),
            "concurrent_decode_tok_s": agg.iter().map(|&(n, t)| serde_json::json!({"sequences": n, "tok_s": t})).collect::<Vec<_>>(),
        });
        println!("{j}");
    } else {
        println!("model {} ({model}), {}, load {:.2} s", a.model, runner.device_name(), loaded.load_s);
        println!("prefill {:>5} tokens: {:8.1} tok/s", a.prompt_tokens, pp_med);
        println!("decode  {:>5} tokens: {:8.1} tok/s", a.gen_tokens, tg_med);
        for (n, t) in &agg {
            println!(
                "decode  {n:>3} sequences x {} tokens: {t:8.1} tok/s aggregate ({:.2}x batch 1)",
                a.gen_tokens,
                t / tg_med.max(1e-9)
            );
        }
    }
    Ok(())
}
