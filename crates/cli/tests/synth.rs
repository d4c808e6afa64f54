//! `splash synth` for the hybrids, end to end: a layer-cut Qwen3.6-35B-A3B and Qwen3.8-27B (four layers: three
//! Gated DeltaNet and one gated attention, then the MTP block) written by the binary, loaded by `splash run` on the
//! CPU through the real Qwen3.6 tokenizer and the Qwen3.5 chat template, and run for a few greedy tokens. The full
//! shapes' tensors and types are checked in src/synth.rs, their memory plans in tests/plan.rs.

use std::path::Path;
use std::process::{Command, Output};

fn splash(args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_splash")).args(args).output().expect("the splash binary runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "splash {args:?} panicked:\n{err}");
    assert!(out.status.success(), "splash {args:?} failed:\n{err}");
    out
}

/// Writes the four-layer cut of `like` and runs a chat prompt through it: the prompt is the template's rendering
/// (more ids than the text's words), tokens come out, and the statistics line says so.
fn cut_runs(like: &str, dir: &Path) {
    let path = dir.join(format!("{like}-4.gguf"));
    let path = path.to_str().expect("a UTF-8 path");
    splash(&["synth", "--like", like, "--layers", "4", "-o", path]);
    let file = gguf::GgufFile::open(path).expect("the written file parses");
    let cfg = models::arch::config_from_gguf(&file).expect("config");
    assert_eq!(cfg.num_layers, 4, "{like}: four trunk layers");
    assert!(file.tensor("blk.4.nextn.eh_proj.weight").is_some(), "{like}: the MTP block follows them");

    let out = splash(&[
        "run",
        "--model",
        path,
        "--device",
        "cpu",
        "--prompt",
        "Write a function that adds two numbers.",
        "--max-tokens",
        "6",
        "--temperature",
        "0",
        "--stats",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err.lines().rev().find(|l| l.starts_with('{')).unwrap_or_else(|| panic!("{like}: no stats:\n{err}"));
    let stats: serde_json::Value = serde_json::from_str(line).expect("stats JSON");
    let (prompt, generated) = (stats["prompt_tokens"].as_u64(), stats["generated_tokens"].as_u64());
    assert!(prompt.is_some_and(|n| n > 12), "{like}: {stats}");
    assert!(generated.is_some_and(|n| (1..=6).contains(&n)), "{like}: {stats}");
    eprintln!("{like} (4 layers + MTP): {stats}");
}

/// One after the other: each cut is 2-3 GB on disk and mapped while it runs.
#[test]
fn layer_cut_hybrids_run_on_the_cpu() {
    let dir = tempfile::tempdir().expect("tempdir");
    for like in ["qwen3.6-35b-a3b", "qwen3.8-27b"] {
        cut_runs(like, dir.path());
    }
}
