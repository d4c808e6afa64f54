//! The golden fixtures of scripts/fixtures/tiny_hf.py (fixtures/hf/<arch>/<config>/) and the runs the tests against
//! them share: every position's logits in one chunk, greedy decoding, the row error of two sets of logits.

// Each test file uses a part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use models::{Batch, LogitsWanted, Runner, SeqChunk, SeqId, argmax};
use serde_json::Value;

pub struct Prompt {
    pub text: String,
    pub chat: bool,
    pub ids: Vec<u32>,
    pub greedy: Vec<u32>,
    /// `[ids.len(), vocab]`
    pub logits: Vec<f32>,
}

pub struct Golden {
    pub dir: PathBuf,
    pub vocab: usize,
    pub prompts: Vec<Prompt>,
}

pub fn configs(arch: &str) -> Vec<Golden> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/hf").join(arch);
    let mut dirs: Vec<PathBuf> =
        std::fs::read_dir(&root).expect("fixtures/hf/<arch>").map(|e| e.expect("entry").path()).collect();
    dirs.sort();
    dirs.into_iter().map(|d| golden(&d)).collect()
}

pub fn golden(dir: &Path) -> Golden {
    let j: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("golden.json")).expect("golden.json"))
        .expect("golden.json parses");
    let vocab = j["vocab_size"].as_u64().expect("vocab_size") as usize;
    let bytes = std::fs::read(dir.join("logits.f32")).expect("logits.f32");
    let all: Vec<f32> = bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    let ids =
        |v: &Value| -> Vec<u32> { v.as_array().expect("ids").iter().map(|x| x.as_u64().expect("id") as u32).collect() };
    let mut at = 0;
    let prompts: Vec<Prompt> = j["prompts"]
        .as_array()
        .expect("prompts")
        .iter()
        .map(|p| {
            let ids_ = ids(&p["ids"]);
            let n = ids_.len() * vocab;
            let logits = all[at..at + n].to_vec();
            at += n;
            Prompt {
                text: p["text"].as_str().expect("text").into(),
                chat: p["chat"].as_bool().expect("chat"),
                ids: ids_,
                greedy: ids(&p["greedy"]),
                logits,
            }
        })
        .collect();
    assert_eq!(at, all.len(), "{}: logits.f32 holds more rows than the prompts", dir.display());
    Golden { dir: dir.to_path_buf(), vocab, prompts }
}

pub fn open(dir: &Path, file: &str) -> Arc<gguf::GgufFile> {
    Arc::new(gguf::GgufFile::open(dir.join(file)).expect("the converter's GGUF parses"))
}

pub fn one(seq: SeqId, tokens: &[u32], start_pos: usize, logits: LogitsWanted) -> Batch<'_> {
    Batch { chunks: vec![SeqChunk { seq, tokens, start_pos, logits }] }
}

/// Every position's logits of `ids` in one chunk.
pub fn prefill(r: &mut dyn Runner, ids: &[u32]) -> Vec<f32> {
    let seq = SeqId(1);
    let out = r.forward(&one(seq, ids, 0, LogitsWanted::All)).expect("forward").to_vec();
    r.release(seq);
    out
}

/// The greedy continuation of `ids`, `n` tokens, one decode step each.
pub fn greedy(r: &mut dyn Runner, ids: &[u32], n: usize) -> Vec<u32> {
    let seq = SeqId(2);
    let mut next = r.forward_argmax(&one(seq, ids, 0, LogitsWanted::Last)).expect("prefill")[0];
    let mut out = vec![next];
    for i in 1..n {
        next = r.forward_argmax(&one(seq, &[next], ids.len() + i - 1, LogitsWanted::Last)).expect("decode")[0];
        out.push(next);
    }
    r.release(seq);
    out
}

/// The largest row error (max |Δ| / max |want| per row) and the positions whose argmax agrees.
pub fn compare(got: &[f32], want: &[f32], vocab: usize) -> (f64, usize) {
    assert_eq!(got.len(), want.len());
    let mut worst = 0f64;
    let mut top1 = 0;
    for (g, w) in got.chunks_exact(vocab).zip(want.chunks_exact(vocab)) {
        let scale = w.iter().fold(0f64, |a, &b| a.max((b as f64).abs()));
        let diff = g.iter().zip(w).fold(0f64, |a, (&x, &y)| {
            let d = (x as f64 - y as f64).abs();
            if d.is_nan() { f64::INFINITY } else { a.max(d) }
        });
        worst = worst.max(diff / scale);
        top1 += usize::from(argmax(g) == argmax(w));
    }
    (worst, top1)
}

/// Two sequences (the first two prompts) in one batch give each the logits it gets alone, bit for bit; the first
/// prompt in a chunk of a third then one token at a time gives the logits of one chunk within `chunked_tol` (relative,
/// [`compare`]; 0: bit for bit). `what` names the runner and file in messages.
pub fn batched_equals_unbatched(r: &mut dyn Runner, g: &Golden, what: &str, chunked_tol: f64) {
    let (a, b) = (&g.prompts[0].ids, &g.prompts[1].ids);
    let alone = [prefill(r, a), prefill(r, b)].concat();
    let both = Batch {
        chunks: vec![
            SeqChunk { seq: SeqId(5), tokens: a, start_pos: 0, logits: LogitsWanted::All },
            SeqChunk { seq: SeqId(6), tokens: b, start_pos: 0, logits: LogitsWanted::All },
        ],
    };
    let together = r.forward(&both).expect("two sequences").to_vec();
    assert!(together == alone, "{} {what}: two sequences in one batch differ from each alone", g.dir.display());
    r.release(SeqId(5));
    r.release(SeqId(6));

    let seq = SeqId(3);
    let split = a.len() / 3;
    let mut parts = r.forward(&one(seq, &a[..split], 0, LogitsWanted::All)).expect("chunk").to_vec();
    for (i, &t) in a[split..].iter().enumerate() {
        parts.extend_from_slice(r.forward(&one(seq, &[t], split + i, LogitsWanted::Last)).expect("step"));
    }
    r.release(seq);
    let whole = &alone[..a.len() * g.vocab];
    let (err, _) = compare(&parts, whole, g.vocab);
    assert!(
        err <= chunked_tol && (chunked_tol > 0.0 || parts == whole),
        "{} {what}: chunked vs whole {err:.3e}",
        g.dir.display()
    );
}
