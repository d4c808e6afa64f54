//! `splash ls` and `splash rm` in a throwaway cache: file states (not pulled, incomplete, unverified, ready) and
//! removal of a pack's file with its stamp, leaving other packs' files alone.

use std::path::Path;
use std::process::{Command, Output};

fn splash(home: &Path, args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_splash"))
        .args(args)
        .env("SPLASH_HOME", home)
        .output()
        .expect("the splash binary runs");
    assert!(!String::from_utf8_lossy(&out.stderr).contains("panicked"), "splash {args:?} panicked");
    out
}

/// The `ls` line of a pack.
fn ls_line(home: &Path, name: &str) -> String {
    let o = splash(home, &["ls"]);
    assert!(o.status.success());
    let text = String::from_utf8(o.stdout).expect("UTF-8");
    text.lines()
        .find(|l| l.starts_with(&format!("{name} ")))
        .unwrap_or_else(|| panic!("{name} in:\n{text}"))
        .to_string()
}

#[test]
fn ls_states_and_rm() {
    let home = tempfile::tempdir().expect("temp dir");
    let models = home.path().join("models");
    std::fs::create_dir_all(&models).expect("mkdir");
    assert!(ls_line(home.path(), "smollm2-135m").contains("not pulled"));
    assert!(ls_line(home.path(), "qwen2.5-coder-1.5b").contains(" *  "), "default marked");

    // A partial file (wrong size) is incomplete; the exact size without a stamp is unverified; with one, ready.
    let smol = models.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    std::fs::write(&smol, b"not a model").expect("write");
    assert!(ls_line(home.path(), "smollm2-135m").contains("incomplete"));
    std::fs::File::create(&smol).and_then(|f| f.set_len(98_362_432)).expect("sparse file");
    assert!(ls_line(home.path(), "smollm2-135m").contains("unverified"));
    std::fs::write(models.join("SmolLM2-135M-Instruct.Q4_1.gguf.verified"), "stamp").expect("write");
    assert!(ls_line(home.path(), "smollm2-135m").contains("ready (93.8 MiB)"));

    // The 0.5B file is the 1.5B pack's draft and the 0.5B pack's target.
    let small = models.join("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
    std::fs::write(&small, b"x").expect("write");
    assert!(ls_line(home.path(), "qwen2.5-coder-1.5b").contains("not pulled (1.0 GiB); draft incomplete"));

    let o = splash(home.path(), &["rm", "smollm2-135m", "qwen2.5-coder-1.5b"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.contains("removed") && out.contains("qwen2.5-coder-1.5b is not pulled"), "{out}");
    assert!(!smol.exists() && !models.join("SmolLM2-135M-Instruct.Q4_1.gguf.verified").exists());
    assert!(small.exists(), "rm of the 1.5B pack leaves the 0.5B pack's file");
    assert!(ls_line(home.path(), "smollm2-135m").contains("not pulled"));

    let o = splash(home.path(), &["rm", "no-such-pack"]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("unknown pack `no-such-pack`"));
}
