//! Batch invariance on the real Qwen2.5-Coder GGUFs: a sequence's logits are bitwise the same whether it runs alone
//! or in one batch with other sequences (prefill chunks together, then every decode step batched), and whatever
//! the thread count. This is what makes greedy output of `splash serve` independent of concurrent requests.
//!
//! The quantized matrix kernels follow one canonical f32 order per output element (see
//! `crates/backend/src/cpu/quant/NOTES.md`, "Batch invariance"); attention is per sequence.
//!
//! `cargo test -p splash-models --release --test batch_invariance`

use std::sync::Arc;

mod common;

use common::{argmax, model_path};
use models::cpu::CpuRunner;
use models::{Batch, LogitsWanted, Runner, SeqChunk, SeqId};

/// Prompts of 5, 17, 3 and 40 tokens (arbitrary ids from the ordinary vocabulary): short ones take the
/// row-streaming kernels when alone, and every batch here is large enough for the 16-row panels.
fn prompts() -> Vec<Vec<u32>> {
    [5usize, 17, 3, 40]
        .iter()
        .enumerate()
        .map(|(s, &n)| (0..n).map(|j| ((s * 7919 + j * 104_729 + 13) % 30_000 + 200) as u32).collect())
        .collect()
}

const STEPS: usize = 6;

/// One sequence alone: prefill, then `STEPS` greedy decode steps. Returns the logits after the prefill and after
/// each step, and the tokens fed.
fn run_alone(runner: &mut CpuRunner, seq: SeqId, prompt: &[u32]) -> (Vec<Vec<f32>>, Vec<u32>) {
    let mut logits = Vec::new();
    let mut fed = Vec::new();
    let chunk = SeqChunk { seq, tokens: prompt, start_pos: 0, logits: LogitsWanted::Last };
    logits.push(runner.forward(&Batch { chunks: vec![chunk] }).expect("prefill").to_vec());
    for step in 0..STEPS {
        let tok = [argmax(logits.last().expect("one row"))];
        fed.push(tok[0]);
        let chunk = SeqChunk { seq, tokens: &tok, start_pos: prompt.len() + step, logits: LogitsWanted::Last };
        logits.push(runner.forward(&Batch { chunks: vec![chunk] }).expect("decode").to_vec());
    }
    runner.release(seq);
    (logits, fed)
}

/// The first differing element of two logit rows, if any.
fn first_difference(a: &[f32], b: &[f32]) -> Option<(usize, f32, f32)> {
    assert_eq!(a.len(), b.len());
    (0..a.len()).find(|&i| a[i].to_bits() != b[i].to_bits()).map(|i| (i, a[i], b[i]))
}

fn check_model(file: &str) {
    let Some(path) = model_path(file) else { return };
    let gguf = Arc::new(gguf::GgufFile::open(&path).expect("model opens"));
    let prompts = prompts();

    // Alone, 2 threads.
    let mut runner = CpuRunner::new(gguf.clone(), 2).expect("model loads");
    let vocab = runner.config().vocab_size;
    let alone: Vec<(Vec<Vec<f32>>, Vec<u32>)> =
        prompts.iter().enumerate().map(|(s, p)| run_alone(&mut runner, SeqId(100 + s as u64), p)).collect();

    let mut failures = Vec::new();
    // Batched: all prefills in one batch, then every decode step of all sequences in one batch (same tokens fed as
    // alone). Once with 2 threads and once with 1 (a different split of every matrix over the threads).
    for threads in [2usize, 1] {
        let mut runner = CpuRunner::new(gguf.clone(), threads).expect("model loads");
        let ids: Vec<SeqId> = (0..prompts.len()).map(|s| SeqId(200 + s as u64)).collect();
        let chunks = prompts
            .iter()
            .zip(&ids)
            .map(|(p, &seq)| SeqChunk { seq, tokens: p, start_pos: 0, logits: LogitsWanted::Last })
            .collect();
        let mut rows = runner.forward(&Batch { chunks }).expect("batched prefill").to_vec();
        for step in 0..=STEPS {
            for s in 0..prompts.len() {
                let got = &rows[s * vocab..(s + 1) * vocab];
                if let Some((i, g, a)) = first_difference(got, &alone[s].0[step]) {
                    failures.push(format!(
                        "{file} threads={threads} seq {s} step {step}: logit {i} batched {g} vs alone {a}"
                    ));
                }
            }
            if step == STEPS {
                break;
            }
            let toks: Vec<[u32; 1]> = alone.iter().map(|(_, fed)| [fed[step]]).collect();
            let chunks = (0..prompts.len())
                .map(|s| SeqChunk {
                    seq: ids[s],
                    tokens: &toks[s],
                    start_pos: prompts[s].len() + step,
                    logits: LogitsWanted::Last,
                })
                .collect();
            rows = runner.forward(&Batch { chunks }).expect("batched decode").to_vec();
        }
    }
    assert!(failures.is_empty(), "{} rows differ:\n{}", failures.len(), failures.join("\n"));
}

/// Speculative verification: k+1 rows of one sequence in one chunk must score exactly like k+1 single-row decode
/// steps (otherwise greedy output with speculation differs from without). The matrix kernels are invariant; this
/// also needs attention's multi-row path to match its one-row path.
fn check_verification(file: &str) {
    let Some(path) = model_path(file) else { return };
    let gguf = Arc::new(gguf::GgufFile::open(&path).expect("model opens"));
    let prompt = &prompts()[1];
    let mut runner = CpuRunner::new(gguf, 2).expect("model loads");
    let vocab = runner.config().vocab_size;
    let (alone, fed) = run_alone(&mut runner, SeqId(1), prompt);
    let seq = SeqId(2);
    let chunk = SeqChunk { seq, tokens: prompt, start_pos: 0, logits: LogitsWanted::Last };
    runner.forward(&Batch { chunks: vec![chunk] }).expect("prefill");
    let k1 = 5;
    let chunk = SeqChunk { seq, tokens: &fed[..k1], start_pos: prompt.len(), logits: LogitsWanted::All };
    let rows = runner.forward(&Batch { chunks: vec![chunk] }).expect("verify").to_vec();
    let mut failures = Vec::new();
    for i in 0..k1 {
        if let Some((j, g, a)) = first_difference(&rows[i * vocab..(i + 1) * vocab], &alone[i + 1]) {
            failures.push(format!("{file} verification row {i}: logit {j} verified {g} vs decoded {a}"));
        }
    }
    assert!(failures.is_empty(), "{} rows differ:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn qwen_0_5b_batched_decode_matches_alone() {
    check_model("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
}

#[test]
fn qwen_1_5b_batched_decode_matches_alone() {
    check_model("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf");
}

#[test]
fn qwen_0_5b_verification_rows_match_decode() {
    check_verification("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
}

#[test]
fn qwen_1_5b_verification_rows_match_decode() {
    check_verification("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf");
}
