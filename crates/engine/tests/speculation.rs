//! Speculative decoding and prefix reuse on the real models: greedy output must be token for token what plain
//! decoding gives — with n-gram drafts, with the 0.5B draft model (at a fixed depth, so drafts are really verified),
//! with both, alone and with all prompts in flight at once — and reusing cached prefix blocks must not change a single
//! token, also after eviction.

use std::path::PathBuf;
use std::sync::Arc;

use engine::{Engine, EngineConfig, Event, GenerateRequest, RequestId, SamplingParams, SpecConfig};
use models::cpu::CpuRunner;
use tokenizer::Tokenizer;

fn model_path(file: &str) -> Option<PathBuf> {
    let home = std::env::var_os("SPLASH_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME is set")).join(".cache/splash"));
    let p = home.join("models").join(file);
    if p.exists() {
        return Some(p);
    }
    if std::env::var("SPLASH_SKIP_MODEL_TESTS").is_ok_and(|v| v == "1") {
        eprintln!("skipping: {} is missing and SPLASH_SKIP_MODEL_TESTS=1", p.display());
        return None;
    }
    panic!("{} is missing: run `splash pull` first (scripts/test does), or set SPLASH_SKIP_MODEL_TESTS=1", p.display());
}

fn load(file: &str) -> Option<(CpuRunner, Arc<Tokenizer>)> {
    let gguf = Arc::new(gguf::GgufFile::open(model_path(file)?).expect("model opens"));
    let tokenizer = Arc::new(Tokenizer::from_gguf(&gguf).expect("tokenizer"));
    Some((CpuRunner::new(gguf, 2).expect("model loads"), tokenizer))
}

/// The parity prompts (token ids) committed with the llama.cpp fixtures.
fn parity_prompts(model: &str) -> Vec<(String, Vec<u32>)> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../../fixtures/parity/{model}.json"));
    let j: serde_json::Value = serde_json::from_slice(&std::fs::read(path).expect("fixture")).expect("json");
    j["prompts"]
        .as_array()
        .expect("prompts")
        .iter()
        .map(|p| {
            let ids = p["prompt_ids"].as_array().expect("ids").iter().map(|t| t.as_u64().expect("id") as u32);
            (p["name"].as_str().expect("name").to_string(), ids.collect())
        })
        .collect()
}

/// Runs all `prompts` through the engine at once (greedy, `max_tokens` each); outputs in prompt order, with the
/// number of cached prompt tokens each reported.
fn run_all(e: &mut Engine<CpuRunner>, prompts: &[Vec<u32>], max_tokens: usize) -> Vec<(Vec<u32>, usize)> {
    let ids: Vec<RequestId> = prompts
        .iter()
        .map(|p| e.add_request(GenerateRequest::new(p.clone(), SamplingParams::greedy(), max_tokens)).expect("valid"))
        .collect();
    let mut out = vec![(Vec::new(), usize::MAX); prompts.len()];
    while e.has_work() {
        for (id, ev) in e.step().expect("step") {
            let i = ids.iter().position(|&x| x == id).expect("known request");
            match ev {
                Event::Token { id, .. } => out[i].0.push(id),
                Event::Finished { usage, .. } => out[i].1 = usage.cached_tokens,
            }
        }
    }
    out
}

fn run_each(e: &mut Engine<CpuRunner>, prompts: &[Vec<u32>], max_tokens: usize) -> Vec<(Vec<u32>, usize)> {
    prompts.iter().flat_map(|p| run_all(e, std::slice::from_ref(p), max_tokens)).collect()
}

#[test]
fn greedy_output_is_identical_with_speculation_on_and_off() {
    let Some((target, tokenizer)) = load("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf") else { return };
    let Some((draft, _)) = load("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf") else { return };
    let named = parity_prompts("qwen2.5-coder-1.5b");
    let prompts: Vec<Vec<u32>> = named.iter().map(|p| p.1.clone()).collect();
    let max_tokens = 48;
    let mut e = Engine::new(target, tokenizer, EngineConfig { spec: SpecConfig::off(), ..Default::default() });
    e.set_draft(draft).expect("same vocabulary");
    let plain = run_each(&mut e, &prompts, max_tokens);
    let fixed = |ngram, draft_model| SpecConfig {
        max_draft_tokens: 4,
        ngram,
        draft_model,
        adaptive: false,
        // The draft sees only the prompt's last 32 tokens (its positions start there).
        draft_window: 32,
        ..SpecConfig::default()
    };
    for (label, spec, together) in [
        ("n-gram", fixed(true, false), false),
        ("draft model", fixed(false, true), false),
        ("draft model, output head over all ids", SpecConfig { draft_vocab: 0, ..fixed(false, true) }, false),
        ("both, all prompts at once", fixed(true, true), true),
        ("adaptive", SpecConfig::default(), true),
    ] {
        e.runner_mut().evict_prefix_cache();
        e.set_spec(spec);
        let before = e.spec_stats();
        let got = if together { run_all(&mut e, &prompts, max_tokens) } else { run_each(&mut e, &prompts, max_tokens) };
        let after = e.spec_stats();
        for ((name, _), (want, got)) in named.iter().zip(plain.iter().zip(&got)) {
            assert_eq!(want.0, got.0, "{label}: prompt {name} differs with speculation");
        }
        let proposed = after.ngram_proposed + after.draft_proposed - before.ngram_proposed - before.draft_proposed;
        let accepted = after.ngram_accepted + after.draft_accepted - before.ngram_accepted - before.draft_accepted;
        eprintln!("{label}: {accepted}/{proposed} drafts accepted");
        if label != "adaptive" {
            assert!(proposed > 100 && accepted > 20, "{label}: speculation barely ran ({accepted}/{proposed})");
        }
    }
}

#[test]
fn prefix_reuse_changes_no_token_and_survives_eviction() {
    let Some((runner, tokenizer)) = load("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf") else { return };
    let prompts = parity_prompts("qwen2.5-coder-0.5b");
    let long = prompts.iter().map(|p| p.1.clone()).max_by_key(Vec::len).expect("prompts");
    assert!(long.len() > 300);
    let mut e = Engine::new(runner, tokenizer, EngineConfig { spec: SpecConfig::off(), ..Default::default() });
    let max_tokens = 24;
    // Cold, then the same prompt warm: all full blocks but the one holding the last token are reused.
    let cold = run_each(&mut e, std::slice::from_ref(&long), max_tokens);
    assert_eq!(cold[0].1, 0);
    let warm = run_each(&mut e, std::slice::from_ref(&long), max_tokens);
    assert_eq!(warm[0].1, (long.len() - 1) / 16 * 16);
    assert_eq!(warm[0].0, cold[0].0);
    // A longer prompt sharing the prefix (an agent's next turn): reuses it and matches a cold run.
    let mut next = long.clone();
    next.extend_from_slice(&prompts[0].1);
    let reused = run_each(&mut e, std::slice::from_ref(&next), max_tokens);
    assert!(reused[0].1 >= long.len() - 16);
    e.runner_mut().evict_prefix_cache();
    let fresh = run_each(&mut e, std::slice::from_ref(&next), max_tokens);
    assert_eq!(fresh[0].1, 0);
    assert_eq!(reused[0].0, fresh[0].0);
    // A cache too small for everything: blocks are evicted as requests come and go, and outputs stay the same.
    let all: Vec<Vec<u32>> = prompts.iter().map(|p| p.1.clone()).collect();
    let base = run_each(&mut e, &all, max_tokens);
    let Some((mut small, tokenizer)) = load("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf") else { return };
    small.set_kv_blocks(40);
    let mut e = Engine::new(small, tokenizer, EngineConfig { spec: SpecConfig::off(), ..Default::default() });
    for round in 0..2 {
        let got = run_each(&mut e, &all, max_tokens);
        for (i, (g, b)) in got.iter().zip(&base).enumerate() {
            assert_eq!(g.0, b.0, "round {round}, prompt {i}");
        }
        // Short prompts run together within the capacity.
        let together = run_all(&mut e, &all[..4], max_tokens);
        for i in 0..4 {
            assert_eq!(together[i].0, base[i].0, "round {round}, prompt {i} batched");
        }
    }
    let usage = models::Runner::kv_usage(e.runner());
    assert!(usage.evicted_blocks > 0 && usage.hit_tokens > 0, "{usage:?}");
    assert!(usage.capacity_blocks == 40);
}

#[test]
fn prefix_blocks_on_disk_are_warm_after_a_restart() {
    let root = std::env::temp_dir().join(format!("splash-prefix-disk-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let prompts = parity_prompts("qwen2.5-coder-0.5b");
    let long = prompts.iter().map(|p| p.1.clone()).max_by_key(Vec::len).expect("prompts");
    let start = |root: &std::path::Path| {
        let (mut runner, tokenizer) = load("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")?;
        runner.enable_prefix_store(root, 1 << 30).expect("store");
        Some(Engine::new(runner, tokenizer, EngineConfig { spec: SpecConfig::off(), ..Default::default() }))
    };
    let Some(mut e) = start(&root) else { return };
    let cold = run_each(&mut e, std::slice::from_ref(&long), 16);
    while e.idle_work() {}
    drop(e);
    let Some(mut e) = start(&root) else { return };
    let warm = run_each(&mut e, std::slice::from_ref(&long), 16);
    assert_eq!(warm[0].1, (long.len() - 1) / 16 * 16, "all full blocks come back from disk");
    assert_eq!(warm[0].0, cold[0].0);
    // Corrupt every block file: nothing is reused, and the output is still right.
    drop(e);
    for f in
        std::fs::read_dir(&root).expect("root").flat_map(|d| std::fs::read_dir(d.expect("dir").path()).expect("dir"))
    {
        let p = f.expect("file").path();
        let mut b = std::fs::read(&p).expect("read");
        let n = b.len();
        b[n - 1] ^= 0x55;
        std::fs::write(&p, b).expect("write");
    }
    let Some(mut e) = start(&root) else { return };
    let again = run_each(&mut e, std::slice::from_ref(&long), 16);
    assert_eq!(again[0].1, 0);
    assert_eq!(again[0].0, cold[0].0);
    let _ = std::fs::remove_dir_all(&root);
}
