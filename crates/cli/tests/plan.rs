//! `splash plan` end to end: shapes read from the real SmolLM2 file's header, simulated machines, caps, JSON, and the
//! refusal. Expected numbers come from the model card (30 layers, 3 KV heads of 64, 8192-token context), not from
//! the planner. Model availability follows tests/cli.rs (SPLASH_SKIP_MODEL_TESTS=1 skips when missing).

use std::path::PathBuf;
use std::process::{Command, Output};

fn home() -> PathBuf {
    std::env::var_os("SPLASH_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME is set")).join(".cache/splash"))
}

fn have(file: &str) -> bool {
    let p = home().join("models").join(file);
    if p.is_file() {
        return true;
    }
    if std::env::var("SPLASH_SKIP_MODEL_TESTS").is_ok_and(|v| v == "1") {
        eprintln!("skipping: {} is missing and SPLASH_SKIP_MODEL_TESTS=1", p.display());
        return false;
    }
    panic!("{} is missing: run `splash pull` first, or set SPLASH_SKIP_MODEL_TESTS=1", p.display());
}

fn splash(args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_splash"))
        .args(args)
        .env("SPLASH_HOME", home())
        .output()
        .expect("the splash binary runs");
    assert!(!String::from_utf8_lossy(&out.stderr).contains("panicked"), "splash {args:?} panicked");
    out
}

fn json(args: &[&str]) -> serde_json::Value {
    let o = splash(args);
    assert!(o.status.success(), "splash {args:?} failed:\n{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).expect("plan --json prints JSON")
}

const GIB: u64 = 1 << 30;

#[test]
fn smollm2_on_simulated_machines() {
    if !have("SmolLM2-135M-Instruct.Q4_1.gguf") {
        return;
    }
    let p = json(&["plan", "--model", "smollm2-135m", "--memory", "1G", "--threads", "2", "--json"]);
    // 2 (K, V) x 30 layers x 3 kv heads x 64 x 2 bytes.
    assert_eq!(p["kv_bytes_per_token"], 23_040);
    assert_eq!(p["max_context"], 8192);
    assert_eq!(p["context_limit"], "model");
    // 1 GiB - 307 MiB margin (256 MiB + 5%) - 92 MiB weights - ~15 MiB workspaces leaves ~609 MiB; a full 8192-token
    // sequence takes 180 MiB, so 3 sequences.
    assert_eq!(p["max_sequences"], 3);
    assert_eq!(p["max_batch_tokens"], 512);
    assert_eq!(p["page_tokens"], 16);
    assert_eq!(p["breakdown"]["budget_bytes"], GIB);
    let weights = p["breakdown"]["items"].as_array().unwrap().iter().find(|i| i["label"] == "target weights").unwrap()
        ["bytes"]
        .as_u64()
        .unwrap();
    // The tensors are most of the 98,362,432-byte file (the rest is the vocabulary and metadata).
    assert!((90_000_000..98_362_432).contains(&weights), "{weights}");
    // Every promised sequence at full context fits the pool.
    assert!(p["num_kv_pages"].as_u64().unwrap() >= 3 * 8192 / 16);
    // 2 GiB: the CPU ceiling of 8.
    assert_eq!(json(&["plan", "-m", "smollm2-135m", "--memory", "2G", "--json"])["max_sequences"], 8);

    // Caps only lower.
    let p = json(&[
        "plan",
        "-m",
        "smollm2-135m",
        "--memory",
        "1G",
        "--max-context",
        "4K",
        "--max-sequences",
        "3",
        "--json",
    ]);
    assert_eq!((p["max_context"].as_u64(), p["max_sequences"].as_u64()), (Some(4096), Some(3)));
    assert_eq!(p["context_limit"], "user");
    let p = json(&["plan", "-m", "smollm2-135m", "--memory", "1G", "--max-context", "100K", "--json"]);
    assert_eq!(p["max_context"], 8192);
    let p = json(&["plan", "-m", "smollm2-135m", "--memory", "8G", "--max-memory", "1G", "--json"]);
    assert_eq!(p["breakdown"]["budget_bytes"], GIB);

    // Human-readable output names the numbers.
    let o = splash(&["plan", "-m", "smollm2-135m", "--memory", "2G"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success());
    for needle in
        ["max context      8192 tokens", "max sequences    8", "target weights", "KV cache", "simulated 2.0 GiB"]
    {
        assert!(text.contains(needle), "missing {needle:?}:\n{text}");
    }
}

#[test]
fn too_little_memory_is_refused_with_a_breakdown() {
    if !have("SmolLM2-135M-Instruct.Q4_1.gguf") {
        return;
    }
    let o = splash(&["plan", "-m", "smollm2-135m", "--memory", "300M"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    for needle in ["not enough memory", "2048 tokens", "target weights", "over budget by", "suggestion:"] {
        assert!(err.contains(needle), "missing {needle:?}:\n{err}");
    }
    let o = splash(&["plan", "-m", "smollm2-135m", "--memory", "lots"]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("expected a size"));
    // Without --memory a CUDA plan reads the GPU's free memory; without a GPU it says to pass --memory.
    let o = splash(&["plan", "-m", "smollm2-135m", "--device", "cuda"]);
    if o.status.success() {
        assert!(String::from_utf8_lossy(&o.stdout).contains("cuMemGetInfo"));
    } else {
        assert!(String::from_utf8_lossy(&o.stderr).contains("--memory"));
    }
}

#[test]
fn default_pack_plans_with_its_draft() {
    if !have("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf") || !have("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf") {
        return;
    }
    let p = json(&["plan", "--memory", "8G", "--json"]);
    // 1.5B: 28 layers x 2 kv heads x 128; 0.5B draft: 24 layers x 2 x 64; K and V at f16.
    assert_eq!(p["kv_bytes_per_token"], 28 * 2 * 128 * 4 + 24 * 2 * 64 * 4);
    assert_eq!(p["max_context"], 32_768);
    let p = json(&["plan", "--memory", "8G", "--no-draft", "--json"]);
    assert_eq!(p["kv_bytes_per_token"], 28 * 2 * 128 * 4);
    let o = splash(&["plan", "--memory", "1G"]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("draft weights"));
}

/// GET `path` from `port` over a raw HTTP/1.1 connection; the body as JSON.
fn get_json(port: u16, path: &str) -> serde_json::Value {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").expect("send");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read");
    let body = text.split_once("\r\n\r\n").map(|x| x.1).unwrap_or_default();
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{path}: {e}: {text}"))
}

/// `splash serve` takes its limits from the plan: with 1 GiB it prints the plan, serves 6 sequences of 4096 tokens
/// (--max-context) and reports the plan in /status and the context in /v1/models.
#[test]
fn serve_uses_the_plan() {
    use std::io::{BufRead, BufReader};
    if !have("SmolLM2-135M-Instruct.Q4_1.gguf") {
        return;
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_splash"))
        .args(["serve", "-m", "smollm2-135m", "--port", "0", "--threads", "1", "--max-memory", "1G"])
        .args(["--max-context", "4K"])
        .env("SPLASH_HOME", home())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("serve starts");
    let stderr = child.stderr.take().expect("piped");
    let err_lines =
        std::thread::spawn(move || BufReader::new(stderr).lines().map_while(Result::ok).collect::<Vec<_>>());
    let mut ready = String::new();
    BufReader::new(child.stdout.take().expect("piped")).read_line(&mut ready).expect("Ready line");
    let port: u16 = ready.trim().trim_end_matches("/v1").rsplit(':').next().and_then(|p| p.parse().ok()).expect(&ready);
    let status = get_json(port, "/status");
    let models = get_json(port, "/v1/models");
    child.kill().expect("kill");
    let _ = child.wait();
    let err = err_lines.join().expect("stderr").join("\n");
    // ~608 MiB of KV left in 1 GiB (see smollm2_on_simulated_machines); 4096 tokens x 22.5 KiB = 90 MiB each.
    assert!(err.contains("plan: context 4096 tokens x 6 sequences") && err.contains("budget 1.0 GiB"), "{err}");
    let plan = &status["memory_plan"];
    assert_eq!(plan["max_context"], 4096, "{status}");
    assert_eq!(plan["breakdown"]["budget_bytes"], GIB);
    assert_eq!(status["limits"]["max_context_tokens"], 4096);
    // The CPU's default ceiling, above the plan's 6 full-context sequences: the engine admits by the KV memory prompts
    // need, so shorter ones run more at once.
    assert_eq!(status["limits"]["max_running_requests"], 8);
    assert_eq!(models["data"][0]["context_length"], 4096, "{models}");
}

/// Before a pack is pulled, `splash plan` uses the shapes its manifest records; they must be the GGUF header's, so
/// the plan is the same as from the real files.
#[test]
fn manifest_shapes_match_the_files() {
    let files = [
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
    ];
    if !files.iter().all(|f| have(f)) {
        return;
    }
    let empty = tempfile::tempdir().expect("temp dir");
    for model in ["qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "smollm2-135m"] {
        let args = ["plan", "-m", model, "--memory", "8G", "--threads", "2", "--json"];
        let from_files = json(&args);
        let o = Command::new(env!("CARGO_BIN_EXE_splash"))
            .args(args)
            .env("SPLASH_HOME", empty.path())
            .output()
            .expect("runs");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let from_manifest: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
        assert_eq!(from_manifest, from_files, "{model}");
    }
    let o = Command::new(env!("CARGO_BIN_EXE_splash"))
        .args(["plan", "--memory", "8G"])
        .env("SPLASH_HOME", empty.path())
        .output()
        .expect("runs");
    assert!(String::from_utf8_lossy(&o.stdout).contains("from the pack manifest"));
}

/// A hybrid (a converter-written fixture, `fixture` under fixtures/hf/): its KV cache counts the attention layers
/// only, and the breakdown holds every sequence's recurrent states and the checkpoints, sized from the transformers
/// config the fixture was made from (its golden.json), not from the planner. Returns the plan and that config.
fn check_hybrid_plan(fixture: &str) -> (serde_json::Value, serde_json::Value) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/hf").join(fixture);
    let golden: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("golden.json")).expect("golden.json")).expect("json");
    let c = &golden["hf_config"];
    let n = |k: &str| c[k].as_u64().expect(k);
    let types: Vec<&str> =
        c["layer_types"].as_array().expect("layer types").iter().map(|t| t.as_str().unwrap()).collect();
    let (full, linear) = (types.iter().filter(|&&t| t == "full_attention").count() as u64, types.len() as u64);
    let linear = linear - full;
    let key_dim = n("linear_num_key_heads") * n("linear_key_head_dim");
    let value_dim = n("linear_num_value_heads") * n("linear_value_head_dim");
    // Per recurrent layer: the conv's last kernel - 1 inputs of q, k, v, and every value head's d_k x d_v matrix.
    let state_len = (n("linear_conv_kernel_dim") - 1) * (2 * key_dim + value_dim)
        + n("linear_num_value_heads") * n("linear_key_head_dim") * n("linear_value_head_dim");
    let state_bytes = linear * 4 * state_len;
    let file = dir.join("model-f32.gguf");
    let p = json(&["plan", "--model", file.to_str().expect("utf-8"), "--memory", "2G", "--threads", "2", "--json"]);
    // f32 keys and values (an unquantized file) of the attention layers alone.
    assert_eq!(p["kv_bytes_per_token"], 2 * full * n("num_key_value_heads") * n("head_dim") * 4);
    let items = p["breakdown"]["items"].as_array().expect("items");
    let item = |prefix: &str| {
        items.iter().find(|i| i["label"].as_str().unwrap().starts_with(prefix)).map(|i| i["bytes"].as_u64().unwrap())
    };
    let seqs = p["max_sequences"].as_u64().expect("sequences");
    assert_eq!(item("recurrent state"), Some(seqs * 11 * state_bytes), "{p}");
    assert_eq!(item("state checkpoints"), Some(seqs * 4 * state_bytes), "{p}");
    assert_eq!(p["max_state_checkpoints"], seqs * 4);
    let text = String::from_utf8_lossy(&splash(&["plan", "--model", file.to_str().unwrap(), "--memory", "2G"]).stdout)
        .into_owned();
    assert!(text.contains("recurrent state checkpoints in memory"), "{text}");
    (p, c.clone())
}

#[test]
fn a_hybrid_plans_its_recurrent_state() {
    check_hybrid_plan("qwen35/tiny-a");
}

/// The MoE hybrid (fixtures/hf/qwen35moe/moe-a) plans its recurrent state as the dense one and counts its experts:
/// the routed experts' f32 tensors of every layer, the MTP block's too (the shared expert is dense weight).
#[test]
fn a_moe_hybrid_plans_its_state_and_experts() {
    let (p, c) = check_hybrid_plan("qwen35moe/moe-a");
    let n = |k: &str| c[k].as_u64().expect(k);
    let layers = n("num_hidden_layers") + n("mtp_num_hidden_layers");
    let expert_bytes = layers * 3 * n("num_experts") * n("hidden_size") * n("moe_intermediate_size") * 4;
    let label = format!("target experts ({} of {} per token)", n("num_experts_per_tok"), n("num_experts"));
    let items = p["breakdown"]["items"].as_array().expect("items");
    let item = items.iter().find(|i| i["label"] == label.as_str()).unwrap_or_else(|| panic!("{label}: {p}"));
    assert_eq!(item["bytes"], expert_bytes, "{p}");
}

/// The qwen3-coder-30b-a3b pack before it is pulled (an empty cache: the manifest's shapes), sized from
/// Qwen3-Coder-30B-A3B's config.json (48 layers, 4 KV heads of 128; 128 experts, 8 used) and the 0.5B's: on 24 GiB it
/// fits memory-mapped with its draft, one sequence at the draft-capped 32K context, its experts a line of their own;
/// on 16 GiB it is refused, saying what is short; without the draft its context is the target's own.
#[test]
fn the_moe_pack_plans_its_experts_and_refuses_a_small_machine() {
    let empty = tempfile::tempdir().expect("temp dir");
    let plan = |args: &[&str]| {
        let mut all = vec!["plan", "-m", "qwen3-coder-30b-a3b", "--threads", "2"];
        all.extend_from_slice(args);
        Command::new(env!("CARGO_BIN_EXE_splash")).args(&all).env("SPLASH_HOME", empty.path()).output().expect("runs")
    };
    let o = plan(&["--memory", "24G", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let p: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    // K and V of every layer at f16: 48 x 4 x 128 (target) + 24 x 2 x 64 (draft).
    assert_eq!(p["kv_bytes_per_token"], 2 * 2 * (48 * 4 * 128 + 24 * 2 * 64));
    assert_eq!((p["max_context"].as_u64(), p["max_sequences"].as_u64()), (Some(32768), Some(1)), "{p}");
    let items = p["breakdown"]["items"].as_array().expect("items");
    let bytes = |label: &str| items.iter().find(|i| i["label"] == label).and_then(|i| i["bytes"].as_u64());
    // 48 layers of 128 experts' gate, up and down (2048 x 768 each): Q4_K (4.5 bits a value), down Q6_K (6.5625)
    // in half the layers.
    let values = 48 * 128 * 2048 * 768u64;
    let experts = bytes("target experts (8 of 128 per token)").expect("an experts line");
    assert_eq!(experts, values * 3 * 144 / 256 + values / 2 * (210 - 144) / 256);
    let rest = bytes("target weights (all but the experts)").expect("the dense weights");
    assert!(rest > 500 << 20 && rest < 2 << 30, "embeddings, attention and output: {rest}");
    assert_eq!(bytes("draft weights"), Some(485_452_288));

    let o = plan(&["--memory", "16G"]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "16 GiB cannot hold 17.3 GiB of weights");
    assert!(stderr.contains("not enough memory") && stderr.contains("target experts (8 of 128 per token)"), "{stderr}");

    let o = plan(&["--memory", "24G", "--no-draft", "--json"]);
    let p: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert_eq!(p["model_max_context"], 262_144, "{p}");
    assert_eq!(p["context_limit"], "memory");
}

/// With the real Qwen3-Coder file in the cache, the manifest's shapes (experts included) are its header's.
#[test]
fn the_moe_pack_manifest_matches_its_file() {
    let file = pack::pack("qwen3-coder-30b-a3b").expect("built in").target.file.clone();
    if !home().join("models").join(&file).is_file() {
        eprintln!("skipped: {file} is not cached (splash pull qwen3-coder-30b-a3b)");
        return;
    }
    let args = ["plan", "-m", "qwen3-coder-30b-a3b", "--memory", "24G", "--threads", "2", "--json"];
    let empty = tempfile::tempdir().expect("temp dir");
    let o = Command::new(env!("CARGO_BIN_EXE_splash")).args(args).env("SPLASH_HOME", empty.path()).output();
    let from_manifest: serde_json::Value = serde_json::from_slice(&o.expect("runs").stdout).expect("JSON");
    assert_eq!(from_manifest, json(&args));
}

/// The full Qwen3.6-35B-A3B and Qwen3.8-27B shapes (`splash synth --header-only`: the real files' headers, the data a
/// hole) plan from their headers: on a 24 GiB machine (this build machine's size) each runs one sequence with a
/// context that memory, not the model, limits; on an H200's 141 GiB the model's whole 262,144 tokens; below what
/// their weights need the plan refuses with the breakdown (experts apart for the MoE one) and a suggestion.
#[test]
fn full_hybrid_shapes_plan_and_refuse() {
    let dir = tempfile::tempdir().expect("tempdir");
    // (shape, memory it cannot run in, weight items of the breakdown)
    let cases = [
        (
            "qwen3.6-35b-a3b",
            "20G",
            &["target weights (all but the experts)", "target experts (8 of 256 per token)"][..],
        ),
        ("qwen3.8-27b", "16G", &["target weights"][..]),
    ];
    for (like, too_small, weights) in cases {
        let path = dir.path().join(format!("{like}.gguf"));
        let path = path.to_str().expect("utf-8");
        let o = splash(&["synth", "--like", like, "--header-only", "-o", path]);
        assert!(o.status.success(), "synth {like}: {}", String::from_utf8_lossy(&o.stderr));
        let p = json(&["plan", "--model", path, "--memory", "24G", "--threads", "2", "--json"]);
        let context = p["max_context"].as_u64().expect("max_context");
        assert!(context > 2048 && context < 262_144, "{like} at 24 GiB: {p}");
        assert_eq!(p["max_sequences"], 1, "{like} at 24 GiB: {p}");
        let p = json(&["plan", "--model", path, "--memory", "141G", "--threads", "2", "--json"]);
        assert_eq!(p["max_context"], 262_144, "{like} on an H200: {p}");
        let o = splash(&["plan", "--model", path, "--memory", too_small, "--threads", "2"]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{like} planned in {too_small}");
        for needle in ["not enough memory", "recurrent state", "over budget by", "suggestion:"].iter().chain(weights) {
            assert!(err.contains(needle), "{like} in {too_small}: missing {needle:?}:\n{err}");
        }
    }
}
