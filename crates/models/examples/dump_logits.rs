//! Writes the logits of every position of a token sequence as raw f32 (for comparing against llama.cpp).
//! Usage: dump_logits MODEL.gguf OUT.f32 [--chunk N] ID...
use std::sync::Arc;

use models::cpu::CpuRunner;
use models::{Batch, LogitsWanted, Runner, SeqChunk, SeqId};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (model, out) = (&args[1], &args[2]);
    let mut rest = &args[3..];
    let mut chunk = usize::MAX;
    if rest.first().is_some_and(|a| a == "--chunk") {
        chunk = rest[1].parse().expect("chunk size");
        rest = &rest[2..];
    }
    let ids: Vec<u32> = rest.iter().map(|s| s.parse().expect("token id")).collect();
    let file = Arc::new(gguf::GgufFile::open(model).expect("model opens"));
    let mut runner = CpuRunner::new(file, 0).expect("model loads");
    let mut logits = Vec::new();
    for (i, c) in ids.chunks(chunk.min(ids.len())).enumerate() {
        let start_pos = i * chunk.min(ids.len());
        let l = runner
            .forward(&Batch {
                chunks: vec![SeqChunk { seq: SeqId(0), tokens: c, start_pos, logits: LogitsWanted::All }],
            })
            .expect("forward");
        logits.extend_from_slice(l);
    }
    let bytes: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(out, bytes).expect("write");
}
