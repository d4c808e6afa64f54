//! The engine over transformers' tiny models converted by llama.cpp's converter (fixtures/hf/), on the CPU runner:
//! the qwen35 hybrid (Gated DeltaNet + gated attention), the qwen3moe mixture of experts (top-k renormalised or not)
//! and the MoE hybrid qwen35moe. Greedy output is token for token the same with n-gram speculation on and off
//! (verification rows kept and rolled back: through the recurrent state's snapshots on the hybrids, across the
//! expert-grouped rows on the MoE models), and the same one request at a time or all at once (batched), with or
//! without speculation; and a hybrid conversation's next turn resumes from a state checkpoint, recomputing only its
//! new tokens, with the output a cold run gives.
//!
//! `cargo test --release -p splash-engine --test hf_fixtures`

use std::path::{Path, PathBuf};
use std::sync::Arc;

use engine::testing;
use engine::{Engine, EngineConfig, SpecConfig};
use models::Runner;
use models::cpu::CpuRunner;
use tokenizer::Tokenizer;

/// `config` is `ARCH/NAME` under fixtures/hf/.
fn fixture(config: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/hf").join(config)
}

fn engine(config: &str, file: &str, spec: SpecConfig) -> Engine<CpuRunner> {
    let gguf = Arc::new(gguf::GgufFile::open(fixture(config).join(file)).expect("fixture opens"));
    let tokenizer = Arc::new(Tokenizer::from_gguf(&gguf).expect("tokenizer"));
    let runner = CpuRunner::new(gguf, 2).unwrap_or_else(|e| panic!("the CPU runner loads {config}: {e}"));
    Engine::new(runner, tokenizer, EngineConfig { spec, ..Default::default() })
}

/// The golden prompts' token ids.
fn prompts(config: &str) -> Vec<Vec<u32>> {
    let j: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture(config).join("golden.json")).expect("golden.json"))
            .expect("json");
    let ids = |p: &serde_json::Value| -> Vec<u32> {
        p["ids"].as_array().expect("ids").iter().map(|t| t.as_u64().expect("id") as u32).collect()
    };
    j["prompts"].as_array().expect("prompts").iter().map(ids).collect()
}

/// Greedy output of `config`'s `file` with n-gram speculation equals plain decoding, one prompt at a time and all at
/// once, and plain decoding all at once equals one at a time; proposals are made, and some are rejected.
fn check_speculation_and_batching(config: &str, file: &str) {
    let max_tokens = 40;
    let mut e = engine(config, file, SpecConfig::off());
    // Each prompt, its own greedy continuation, and the prompt again: the n-gram proposer then drafts that
    // continuation, which the model follows only in part (its context differs now), so verification rows are both
    // kept and rolled back, over and over.
    let golden = prompts(config);
    let first = testing::run_greedy_each(&mut e, &golden, max_tokens);
    let prompts: Vec<Vec<u32>> =
        golden.iter().zip(&first).map(|(p, o)| [p.as_slice(), &o.0, p.as_slice()].concat()).collect();
    let plain = testing::run_greedy_each(&mut e, &prompts, max_tokens);
    let ngram =
        SpecConfig { max_draft_tokens: 4, ngram: true, draft_model: false, adaptive: false, ..SpecConfig::default() };
    let cases = [
        ("all prompts at once, no speculation", SpecConfig::off(), true),
        ("n-gram", ngram.clone(), false),
        ("n-gram, all prompts at once", ngram, true),
    ];
    for (label, spec, together) in cases {
        e.runner_mut().evict_prefix_cache();
        let speculates = spec.ngram;
        e.set_spec(spec);
        let before = e.spec_stats();
        let got = testing::run_greedy_as(&mut e, &prompts, max_tokens, together);
        let after = e.spec_stats();
        for (i, (want, got)) in plain.iter().zip(&got).enumerate() {
            assert_eq!(want.0, got.0, "{config} {file} {label}: prompt {i} differs");
        }
        let proposed = after.proposed() - before.proposed();
        let accepted = after.accepted() - before.accepted();
        eprintln!("{config} {file} {label}: {accepted}/{proposed} drafts accepted");
        if speculates {
            assert!(proposed >= 20 && proposed > accepted, "{config} {label}: {accepted}/{proposed}: no rollbacks");
            assert!(accepted > 0, "{config} {label}: no draft was ever kept");
        }
    }
    e.set_spec(SpecConfig::off());
}

#[test]
fn hybrid_greedy_output_is_identical_with_speculation_and_batching() {
    for (config, file) in [("qwen35/tiny-a", "model-f32.gguf"), ("qwen35/tiny-b", "model-q8_0.gguf")] {
        check_speculation_and_batching(config, file);
    }
}

/// The mixture-of-experts fixtures: 8 experts top-2 renormalised (moe-a), 6 top-3 not (moe-b), moe-c, and the MoE
/// hybrid with its shared expert (qwen35moe/moe-a); f32 and q8_0 files.
#[test]
fn moe_greedy_output_is_identical_with_speculation_and_batching() {
    let cases = [
        ("qwen3moe/moe-a", "model-f32.gguf"),
        ("qwen3moe/moe-a", "model-q8_0.gguf"),
        ("qwen3moe/moe-b", "model-q8_0.gguf"),
        ("qwen3moe/moe-c", "model-f32.gguf"),
        ("qwen35moe/moe-a", "model-q8_0.gguf"),
    ];
    for (config, file) in cases {
        check_speculation_and_batching(config, file);
    }
}

#[test]
fn the_next_turn_resumes_from_a_checkpoint() {
    let prompts = prompts("qwen35/tiny-a");
    let long = prompts.iter().max_by_key(|p| p.len()).expect("prompts").clone();
    let mut e = engine("qwen35/tiny-a", "model-f32.gguf", SpecConfig::off());
    // (output, cached prompt tokens) of one request.
    let one = |e: &mut Engine<CpuRunner>, p: &[u32]| testing::run_greedy(e, &[p.to_vec()], 24).remove(0);
    // The same prompt twice: the second resumes at the checkpoint of its prompt's end (its last full block).
    let (cold, warm) = (one(&mut e, &long), one(&mut e, &long));
    assert_eq!((cold.1, warm.1), (0, (long.len() - 1) / 16 * 16));
    assert_eq!(warm.0, cold.0);
    // The next turn: the conversation so far and a new message.
    let new = &prompts[0];
    let next = [long.as_slice(), &cold.0, new].concat();
    let before = e.runner().kv_usage();
    let turn = one(&mut e, &next);
    let after = e.runner().kv_usage();
    let recomputed = next.len() - turn.1;
    eprintln!("next turn of {} tokens: {} reused, {recomputed} recomputed ({} new)", next.len(), turn.1, new.len());
    assert!(recomputed <= new.len() + 16, "{recomputed} recomputed for {} new tokens", new.len());
    assert_eq!(after.hit_tokens - before.hit_tokens, turn.1 as u64);
    let state = after.state.expect("a hybrid reports its state");
    assert!(state.checkpoint_hits >= 2 && state.checkpoints > 0, "{state:?}");
    e.runner_mut().evict_prefix_cache();
    let fresh = one(&mut e, &next);
    assert_eq!(fresh.1, 0);
    assert_eq!(turn.0, fresh.0, "the resumed turn's output is a cold run's");
}
