//! Helpers shared by the tests that run the real model files.

use std::path::PathBuf;

/// The cached model file, or `None` (with a message) when it is missing and SPLASH_SKIP_MODEL_TESTS=1; a missing
/// file otherwise fails the test with the command that fetches it.
pub fn model_path(file: &str) -> Option<PathBuf> {
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

pub use models::argmax;
