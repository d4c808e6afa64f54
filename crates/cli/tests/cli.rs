//! The `splash` binary end to end on the real SmolLM2-135M-Instruct file: what goes to stdout and stderr, exit
//! codes, `--max-tokens`, `--seed`, `--stats`, `bench --json`, and the errors for bad files and unknown names.
//!
//! The model comes from `splash pull smollm2-135m` (scripts/test runs it) into $SPLASH_HOME (default
//! ~/.cache/splash). Set SPLASH_SKIP_MODEL_TESTS=1 to skip the tests that need it on purpose.

use std::path::PathBuf;
use std::process::{Command, Output};

const MODEL: &str = "smollm2-135m";
const MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// A ChatML prompt for `--raw` (SmolLM2 does not add a BOS token).
const CHAT_PROMPT: &str = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n";
/// Plain prose that the model continues for a long time without an end-of-generation token.
const PROSE_PROMPT: &str = "The history of the printing press begins in the fifteenth century, when";

fn home() -> PathBuf {
    std::env::var_os("SPLASH_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME is set")).join(".cache/splash"))
}

/// Whether the model tests can run: true if the model is in the cache; false (skip) if it is missing and
/// SPLASH_SKIP_MODEL_TESTS=1; a clear failure otherwise.
fn have_model() -> bool {
    let p = home().join("models").join(MODEL_FILE);
    if p.is_file() {
        return true;
    }
    if std::env::var("SPLASH_SKIP_MODEL_TESTS").is_ok_and(|v| v == "1") {
        eprintln!("skipping: {} is missing and SPLASH_SKIP_MODEL_TESTS=1", p.display());
        return false;
    }
    panic!(
        "{} is missing: run `splash pull {MODEL}` first (scripts/test does), or set SPLASH_SKIP_MODEL_TESTS=1",
        p.display()
    );
}

fn splash(args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_splash"))
        .args(args)
        .env("SPLASH_HOME", home())
        .output()
        .expect("the splash binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "splash {args:?} panicked:\n{stderr}");
    out
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).expect("stdout is UTF-8")
}

fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).expect("stderr is UTF-8")
}

fn ok(args: &[&str]) -> Output {
    let o = splash(args);
    assert!(o.status.success(), "splash {args:?} failed ({:?}):\n{}", o.status, stderr(&o));
    o
}

/// `splash run` on the test model with `extra` arguments.
fn run(prompt: &str, extra: &[&str]) -> Output {
    let mut args = vec!["run", "--model", MODEL, "--threads", "2", "--raw", "--prompt", prompt];
    args.extend_from_slice(extra);
    ok(&args)
}

/// The JSON lines of a text.
fn json_lines(text: &str) -> Vec<serde_json::Value> {
    text.lines().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()).filter(|v| v.is_object()).collect()
}

/// The one `--stats` line of a run's stderr.
fn stats(o: &Output) -> serde_json::Value {
    let err = stderr(o);
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "--stats: stderr should be exactly one line, got:\n{err}");
    let v: serde_json::Value =
        serde_json::from_str(lines[0]).unwrap_or_else(|e| panic!("stats line is not JSON ({e}): {}", lines[0]));
    for key in ["prompt_tokens", "generated_tokens"] {
        assert!(v[key].is_u64(), "stats: {key} missing or not an integer in {v}");
    }
    for key in ["prefill_tok_s", "decode_tok_s"] {
        let x = v[key].as_f64().unwrap_or_else(|| panic!("stats: {key} missing or not a number in {v}"));
        assert!(x.is_finite() && x >= 0.0, "stats: {key} = {x}");
    }
    v
}

/// A case of fixtures/parity/smollm2-135m.json (llama.cpp's greedy output for the same file): (prompt, generated
/// text, number of prompt tokens, number of generated tokens including the end-of-generation token).
fn llama_cpp_case(name: &str) -> (String, String, u64, u64) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/parity/smollm2-135m.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let j: serde_json::Value = serde_json::from_str(&text).expect("fixture is JSON");
    let case = j["prompts"].as_array().expect("prompts").iter().find(|p| p["name"] == name).expect("case in fixture");
    (
        case["prompt"].as_str().expect("prompt").to_string(),
        case["generated_text"].as_str().expect("text").to_string(),
        case["num_prompt_tokens"].as_u64().expect("count"),
        case["generated_ids"].as_array().expect("ids").len() as u64,
    )
}

#[test]
fn run_raw_greedy_prints_only_the_generated_text_and_repeats() {
    if !have_model() {
        return;
    }
    // chat_math: every top-1/top-2 logit gap of llama.cpp's answer is >= 0.6, so numeric noise cannot change it;
    // it ends with <|im_end|>, which is not printed.
    let (prompt, want, _, _) = llama_cpp_case("chat_math");
    let a = run(&prompt, &["--temperature", "0"]);
    assert_eq!(stdout(&a), format!("{want}\n"), "stdout must be exactly the generated text and a newline");
    assert!(stderr(&a).trim().is_empty(), "nothing on stderr without --stats: {}", stderr(&a));
    let b = run(&prompt, &["--temperature", "0"]);
    assert_eq!(stdout(&a), stdout(&b), "greedy output differs between two runs");

    // A longer free continuation is also the same twice, and never echoes the prompt.
    let c = stdout(&run(CHAT_PROMPT, &["--temperature", "0", "--max-tokens", "24"]));
    assert!(!c.trim().is_empty(), "no text generated");
    assert!(!c.contains("<|im_start|>") && !c.contains("What is the capital"), "{c:?}");
    assert_eq!(c, stdout(&run(CHAT_PROMPT, &["--temperature", "0", "--max-tokens", "24"])));
}

#[test]
fn stats_is_one_json_line_on_stderr() {
    if !have_model() {
        return;
    }
    let o = run(PROSE_PROMPT, &["--temperature", "0", "--max-tokens", "8", "--stats"]);
    let v = stats(&o);
    // llama.cpp tokenizes this prompt into 13 tokens (fixtures/parity/smollm2-135m.json, english_prose).
    assert_eq!(v["prompt_tokens"], llama_cpp_case("english_prose").2, "{v}");
    assert_eq!(v["generated_tokens"], 8, "{v}");
    assert!(v["prefill_tok_s"].as_f64().expect("number") > 0.0);
    assert!(v["decode_tok_s"].as_f64().expect("number") > 0.0);
    // The stats are not mixed into stdout.
    assert!(json_lines(&stdout(&o)).is_empty(), "stdout: {}", stdout(&o));

    // A generation that ends at the end-of-generation token counts it, as llama.cpp's stream has it.
    let (prompt, _, num_prompt, num_generated) = llama_cpp_case("chat_math");
    let v = stats(&run(&prompt, &["--temperature", "0", "--stats"]));
    assert_eq!(
        (v["prompt_tokens"].as_u64(), v["generated_tokens"].as_u64()),
        (Some(num_prompt), Some(num_generated)),
        "{v}"
    );
}

#[test]
fn max_tokens_is_respected() {
    if !have_model() {
        return;
    }
    let mut prev = String::new();
    for n in [1usize, 5] {
        let o = run(PROSE_PROMPT, &["--temperature", "0", "--max-tokens", &n.to_string(), "--stats"]);
        assert_eq!(stats(&o)["generated_tokens"], n as u64);
        let text = stdout(&o);
        // Greedy: the shorter output is a prefix of the longer one.
        assert!(text.trim_end_matches('\n').starts_with(prev.trim_end_matches('\n')), "{prev:?} then {text:?}");
        prev = text;
    }
    // A chat answer may end earlier, never later.
    let o = run(CHAT_PROMPT, &["--temperature", "0", "--max-tokens", "3", "--stats"]);
    assert!(stats(&o)["generated_tokens"].as_u64().expect("count") <= 3);
}

#[test]
fn seed_makes_sampling_reproducible() {
    if !have_model() {
        return;
    }
    let sample = |seed: &str| {
        let o = run(
            PROSE_PROMPT,
            &["--temperature", "1.2", "--top-k", "0", "--top-p", "1", "--seed", seed, "--max-tokens", "24"],
        );
        stdout(&o)
    };
    let a = sample("42");
    assert_eq!(a, sample("42"), "same seed, different text");
    let others: Vec<String> = ["43", "44", "45"].iter().map(|s| sample(s)).collect();
    assert!(others.iter().any(|o| *o != a), "three other seeds all gave the same text as seed 42: {a:?}");
}

#[test]
fn corrupt_or_truncated_gguf_is_a_clear_error() {
    let dir = std::env::temp_dir().join(format!("splash-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut cases: Vec<(PathBuf, Vec<u8>)> = vec![
        (dir.join("empty.gguf"), Vec::new()),
        (dir.join("garbage.gguf"), b"this is not a GGUF file at all, just some text".repeat(20)),
        (dir.join("bad-version.gguf"), [b"GGUF".as_slice(), &[99, 0, 0, 0], &[0u8; 64]].concat()),
    ];
    let real = home().join("models").join(MODEL_FILE);
    if real.is_file() {
        // The real header and metadata, cut in the middle of the tensor data; and cut inside the metadata.
        let bytes = std::fs::read(&real).expect("read model");
        cases.push((dir.join("truncated-data.gguf"), bytes[..bytes.len() / 2].to_vec()));
        cases.push((dir.join("truncated-header.gguf"), bytes[..4096].to_vec()));
    }
    for (path, bytes) in &cases {
        std::fs::write(path, bytes).expect("write test file");
        for cmd in ["run", "bench"] {
            let p = path.to_str().expect("utf-8 path");
            let args: Vec<&str> = if cmd == "run" {
                vec!["run", "--model", p, "--raw", "--prompt", "hi", "--max-tokens", "2"]
            } else {
                vec!["bench", "--model", p, "--prompt-tokens", "4", "--gen-tokens", "1", "--repetitions", "1"]
            };
            let o = splash(&args);
            let err = stderr(&o);
            assert_eq!(o.status.code(), Some(1), "splash {args:?} should fail with exit code 1; stderr:\n{err}");
            assert!(err.starts_with("error: "), "splash {args:?}: {err}");
            assert!(err.contains(p), "the error names the file: {err}");
            assert!(err.lines().count() <= 3, "a short message, not a dump: {err}");
            assert!(stdout(&o).is_empty(), "nothing on stdout: {}", stdout(&o));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn unknown_model_lists_the_known_names() {
    for cmd in [
        &["run", "--model", "no-such-model", "--raw", "--prompt", "hi"][..],
        &["bench", "--model", "no-such-model"][..],
    ] {
        let o = splash(cmd);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{cmd:?}: {err}");
        assert!(err.contains("no-such-model"), "{err}");
        for known in ["qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "smollm2-135m"] {
            assert!(err.contains(known), "the error should list {known}: {err}");
        }
    }
    // A path that does not exist is not mistaken for a name silently either.
    let o = splash(&["run", "--model", "/nonexistent/dir/model.gguf", "--raw", "--prompt", "hi"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("/nonexistent/dir/model.gguf"), "{}", stderr(&o));
}

#[test]
fn bench_json_is_one_line_with_the_documented_keys() {
    if !have_model() {
        return;
    }
    let o = ok(&[
        "bench",
        "--model",
        MODEL,
        "--threads",
        "2",
        "--prompt-tokens",
        "16",
        "--gen-tokens",
        "4",
        "--repetitions",
        "1",
        "--json",
    ]);
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "bench --json: stdout should be one line:\n{out}");
    let v: serde_json::Value =
        serde_json::from_str(lines[0]).unwrap_or_else(|e| panic!("not JSON ({e}): {}", lines[0]));
    // The keys scripts/bench_vs_llamacpp.py documents and reads.
    for key in ["prefill_tok_s", "decode_tok_s", "load_s"] {
        let x = v[key].as_f64().unwrap_or_else(|| panic!("{key} missing or not a number in {v}"));
        assert!(x.is_finite() && x > 0.0, "{key} = {x}");
    }
    assert_eq!(v["prompt_tokens"], 16, "{v}");
    assert_eq!(v["gen_tokens"], 4, "{v}");
    assert_eq!(v["threads"], 2, "{v}");
    assert_eq!(v["model"], MODEL, "{v}");
    assert_eq!(v["arch"], "llama", "{v}");
    assert_eq!(v["prefill_runs"].as_array().map(Vec::len), Some(1), "{v}");
    assert_eq!(v["decode_runs"].as_array().map(Vec::len), Some(1), "{v}");
}

#[test]
fn bad_arguments_fail_cleanly() {
    // Values out of range: a message naming the parameter and exit code 1.
    if !have_model() {
        return;
    }
    for (arg, name) in [("--temperature=-1", "temperature"), ("--top-p=0", "top_p"), ("--min-p=3", "min_p")] {
        let o = splash(&["run", "--model", MODEL, "--raw", "--prompt", "hi", arg]);
        assert_eq!(o.status.code(), Some(1), "{arg}: {}", stderr(&o));
        assert!(stderr(&o).contains(name), "{arg}: {}", stderr(&o));
    }
    let o = splash(&["run", "--model", MODEL, "--raw", "--prompt", "hi", "--max-tokens", "0"]);
    assert_eq!(o.status.code(), Some(1), "--max-tokens 0: {}", stderr(&o));
    assert!(stderr(&o).contains("max_tokens"), "{}", stderr(&o));
}
