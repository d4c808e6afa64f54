//! `splash serve` on the real SmolLM2-135M-Instruct: a graceful stop (issue 22). With a stream in flight and a client
//! that sent half a request header, SIGTERM stops the server within `--shutdown-timeout` (plus the cancellation's
//! grace and the disk flush), the stream ends with a protocol error event rather than a cut socket, and the prefix
//! cache on disk holds every block of the last finished request: after a restart that prompt is served from it. A
//! second signal exits at once.
//!
//! Needs the model in $SPLASH_HOME (or ~/.cache/splash); SPLASH_SKIP_MODEL_TESTS=1 skips.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

fn models_dir() -> PathBuf {
    std::env::var_os("SPLASH_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME is set")).join(".cache/splash"))
        .join("models")
}

fn have_model() -> bool {
    if models_dir().join(MODEL_FILE).is_file() {
        return true;
    }
    if std::env::var("SPLASH_SKIP_MODEL_TESTS").is_ok_and(|v| v == "1") {
        return false;
    }
    panic!("{MODEL_FILE} is missing: run `splash pull smollm2-135m`, or set SPLASH_SKIP_MODEL_TESTS=1");
}

struct Server {
    child: Child,
    port: u16,
    log: std::sync::mpsc::Receiver<String>,
}

/// Starts `splash serve` with its own SPLASH_HOME (the models linked in) and waits for `Ready`.
fn start(home: &Path, extra: &[&str]) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_splash"))
        .args(["serve", "-m", "smollm2-135m", "--port", "0", "--device", "cpu", "--threads", "2", "--spec-mode", "off"])
        .args(["--repetition-guard", "0", "--no-webui"])
        .args(extra)
        .env("SPLASH_HOME", home)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("splash serve starts");
    let stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, log) = std::sync::mpsc::channel();
    let err_tx = tx.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("serve: {line}");
            let _ = err_tx.send(line);
        }
    });
    let mut lines = BufReader::new(stdout).lines();
    let ready = lines.next().expect("a Ready line").expect("stdout");
    let port = ready.rsplit(':').next().unwrap().trim_end_matches("/v1").parse().expect("a port");
    std::thread::spawn(move || lines.for_each(drop));
    Server { child, port, log }
}

fn signal(child: &Child, name: &str) {
    let ok = Command::new("kill").args(["-s", name, &child.id().to_string()]).status().expect("kill runs");
    assert!(ok.success());
}

fn wait_exit(child: &mut Child, limit: Duration) -> (std::process::ExitStatus, Duration) {
    let t0 = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return (status, t0.elapsed());
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            panic!("the server did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A raw HTTP/1.1 POST of `body`; returns the open connection (the caller reads the reply).
fn post(port: u16, path: &str, body: &serde_json::Value) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let body = body.to_string();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    s
}

fn reply_json(port: u16, body: &serde_json::Value) -> (serde_json::Value, Duration) {
    let t0 = Instant::now();
    let mut s = post(port, "/v1/chat/completions", body);
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let elapsed = t0.elapsed();
    let json = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    // Chunked or not: the JSON object is between the first '{' and the last '}'.
    let json = &json[json.find('{').expect("a JSON body")..=json.rfind('}').unwrap()];
    (serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {text}")), elapsed)
}

fn long_prompt() -> String {
    (0..60).map(|i| format!("Line {i}: the quick brown fox {i} jumps over the lazy dog number {}.", i * 7)).collect()
}

fn temp_home(name: &str) -> PathBuf {
    let home = std::env::temp_dir().join(format!("splash-shutdown-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&home);
    std::fs::create_dir_all(&home).unwrap();
    std::os::unix::fs::symlink(models_dir(), home.join("models")).unwrap();
    home
}

#[test]
fn sigterm_drains_then_cancels_and_the_disk_tier_is_warm_after_the_restart() {
    if !have_model() {
        return;
    }
    let home = temp_home("drain");
    let timeout_s = 2.0;
    let timeout = timeout_s.to_string();
    let mut server = start(&home, &["--shutdown-timeout", &timeout, "--prefix-cache-disk", "256M"]);
    let port = server.port;
    let question = serde_json::json!({
        "messages": [{"role": "user", "content": long_prompt()}], "max_tokens": 4, "temperature": 0
    });
    let (cold, cold_time) = reply_json(port, &question);
    let num_prompt = cold["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(num_prompt > 600, "{cold}");
    // A stream that runs past the deadline, and a client that sends half a header and waits.
    // A schema that asks for 100,000 numbers keeps the reply going whatever the machine's speed (without it the
    // small model ends its count after ~120 tokens, in under 2 s on a quiet machine).
    let stream_body = serde_json::json!({
        "messages": [{"role": "user", "content": "Count from 1 to 100000, one number per line."}],
        "max_tokens": 100000, "stream": true, "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "count", "schema": {
            "type": "object", "required": ["numbers"],
            "properties": {"numbers": {"type": "array", "items": {"type": "integer"}, "minItems": 100000}}
        }}}
    });
    let mut stream = post(port, "/v1/chat/completions", &stream_body);
    let mut first = [0u8; 256];
    let n = stream.read(&mut first).unwrap();
    assert!(String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"), "{}", String::from_utf8_lossy(&first));
    let mut half = TcpStream::connect(("127.0.0.1", port)).unwrap();
    half.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le").unwrap();
    std::thread::sleep(Duration::from_millis(300));

    signal(&server.child, "TERM");
    let reader = std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = stream.read_to_string(&mut rest);
        rest
    });
    let (status, took) = wait_exit(&mut server.child, Duration::from_secs(30));
    assert!(status.success(), "{status:?}");
    // The deadline, the cancellation's 2 s grace at most, and the flush (a few hundred ms here).
    assert!(took < Duration::from_secs_f64(timeout_s + 2.0 + 3.0), "took {took:?}");
    assert!(took >= Duration::from_secs_f64(timeout_s * 0.9), "the stream was not given its time: {took:?}");
    let rest = reader.join().unwrap();
    let tail: String = rest.chars().rev().take(600).collect::<String>().chars().rev().collect();
    assert!(
        rest.contains("server_shutting_down") && rest.contains("data: [DONE]") || rest.contains("\"finish_reason\""),
        "the stream did not end with a protocol event:\n{tail}"
    );
    let log: Vec<String> = server.log.try_iter().collect();
    assert!(log.iter().any(|l| l.contains("cancelling 1 running")), "{log:?}");

    // Every full block of the finished request is on disk: after a restart, the same prompt is served from it.
    let mut again = start(&home, &["--prefix-cache-disk", "256M"]);
    let (warm, warm_time) = reply_json(again.port, &question);
    let cached = warm["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    assert_eq!(cached, (num_prompt - 1) / 16 * 16, "{warm}");
    assert_eq!(warm["choices"][0]["message"]["content"], cold["choices"][0]["message"]["content"]);
    eprintln!(
        "prompt {num_prompt} tokens: cold reply {:.0} ms, warm after restart {:.0} ms ({cached} tokens from disk)",
        cold_time.as_secs_f64() * 1000.0,
        warm_time.as_secs_f64() * 1000.0
    );
    signal(&again.child, "INT");
    let (status, took) = wait_exit(&mut again.child, Duration::from_secs(15));
    assert!(status.success() && took < Duration::from_secs(5), "{status:?} {took:?}");
    let _ = std::fs::remove_dir_all(&home);
}

#[test]
fn a_second_signal_exits_at_once() {
    if !have_model() {
        return;
    }
    let home = temp_home("second");
    let mut server = start(&home, &["--shutdown-timeout", "60", "--prefix-cache-disk", "0"]);
    let body = serde_json::json!({
        "messages": [{"role": "user", "content": "Count from 1 to 100000, one number per line."}],
        "max_tokens": 100000, "stream": true
    });
    let mut stream = post(server.port, "/v1/chat/completions", &body);
    let mut first = [0u8; 64];
    let _ = stream.read(&mut first).unwrap();
    signal(&server.child, "TERM");
    std::thread::sleep(Duration::from_millis(300));
    assert!(server.child.try_wait().unwrap().is_none(), "the first signal drains (60 s)");
    signal(&server.child, "TERM");
    let (status, took) = wait_exit(&mut server.child, Duration::from_secs(10));
    assert_eq!(status.code(), Some(143));
    assert!(took < Duration::from_secs(2), "{took:?}");
    let _ = std::fs::remove_dir_all(&home);
}
