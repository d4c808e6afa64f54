//! `OWNER/REPO:FILE-OR-QUANT` against a local imitation of the Hugging Face API: the commit and file list (sizes
//! and LFS hashes) come from `/api/models/...`, the quantization picks the file, an interrupted download resumes, a
//! verified file is not fetched again, a file whose listed hash is wrong is refused, and without the hub an earlier
//! verified pull is used.

use std::io::Write;
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use pack::hf_repo::{self, HubSpec};
use sha2::{Digest, Sha256};

mod common;

use common::RequestLog;

const SIZE: usize = 200_000;

fn content() -> Vec<u8> {
    common::content(SIZE)
}

/// Serves the API and the files; returns the endpoint and the request log.
fn hub() -> (String, RequestLog) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let endpoint = format!("http://{}", listener.local_addr().expect("addr"));
    let log = Arc::new(Mutex::new(Vec::new()));
    let log2 = log.clone();
    std::thread::spawn(move || {
        let body = content();
        let sha = hex::encode(Sha256::digest(&body));
        let tree = format!(
            r#"[{{"type":"file","path":"README.md","size":12}},
               {{"type":"file","path":"model-Q4_K_M.gguf","size":{SIZE},"lfs":{{"oid":"{sha}","size":{SIZE}}}}},
               {{"type":"file","path":"model-Q8_0.gguf","size":{SIZE},"lfs":{{"oid":"{}","size":{SIZE}}}}}]"#,
            "0".repeat(64)
        );
        let mut q4_calls = 0;
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let Some((path, range)) = common::read_request(&stream) else { continue };
            log2.lock().expect("log").push((path.clone(), range.clone()));
            let json = |stream: &mut std::net::TcpStream, j: &str| {
                let _ =
                    write!(stream, "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{j}", j.len());
            };
            match path.as_str() {
                "/api/models/org/repo-GGUF" => json(&mut stream, r#"{"id":"org/repo-GGUF","sha":"c0ffee"}"#),
                "/api/models/org/repo-GGUF/tree/c0ffee?recursive=true" => json(&mut stream, &tree),
                "/org/repo-GGUF/resolve/c0ffee/model-Q4_K_M.gguf" | "/org/repo-GGUF/resolve/c0ffee/model-Q8_0.gguf" => {
                    q4_calls += usize::from(path.contains("Q4"));
                    let start: usize = range
                        .as_deref()
                        .and_then(|r| r.strip_prefix("bytes="))
                        .and_then(|r| r.trim_end_matches('-').parse().ok())
                        .unwrap_or(0);
                    let status = if start > 0 { "206 Partial Content" } else { "200 OK" };
                    let rest = &body[start..];
                    let _ = write!(
                        stream,
                        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        rest.len()
                    );
                    // The first download of the Q4 file breaks off a third of the way.
                    let cut = if q4_calls == 1 && path.contains("Q4") { SIZE / 3 } else { rest.len() };
                    let _ = stream.write_all(&rest[..cut]);
                }
                _ => {
                    let _ = write!(stream, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
                }
            }
        }
    });
    (endpoint, log)
}

#[test]
fn pulls_a_quantization_from_a_repository_resumably_and_verified() {
    let (endpoint, log) = hub();
    let home = tempfile::tempdir().expect("temp dir");
    let models = home.path().join("models");
    let spec = HubSpec::parse("org/repo-GGUF:q4_k_m").expect("a hub spec");
    // The file list names size and hash.
    let f = hf_repo::resolve(&endpoint, &spec).expect("resolves");
    assert_eq!((f.path.as_str(), f.commit.as_str(), f.size_bytes), ("model-Q4_K_M.gguf", "c0ffee", SIZE as u64));
    assert_eq!(f.sha256, hex::encode(Sha256::digest(content())));
    // Interrupted, then resumed with a Range request.
    let err = hf_repo::pull(&endpoint, &models, &spec, &mut |_, _| {}).unwrap_err().to_string();
    assert!(err.contains("model-Q4_K_M.gguf"), "{err}");
    let mut last = None;
    let path =
        hf_repo::pull(&endpoint, &models, &spec, &mut |name, p| last = Some((name.to_string(), p))).expect("resumes");
    assert_eq!(path, models.join("hf/org/repo-GGUF/model-Q4_K_M.gguf"));
    assert_eq!(std::fs::read(&path).expect("read"), content());
    let (name, p) = last.expect("progress");
    assert_eq!(
        (name.as_str(), p.done_bytes, p.resumed_from_bytes),
        ("model-Q4_K_M.gguf", SIZE as u64, SIZE as u64 / 3)
    );
    let ranges: Vec<Option<String>> =
        log.lock().expect("log").iter().filter(|(p, _)| p.ends_with("Q4_K_M.gguf")).map(|(_, r)| r.clone()).collect();
    assert_eq!(ranges, [None, Some(format!("bytes={}-", SIZE / 3))]);
    // Pulled again: the hub is asked what is current, the file is not fetched again.
    let n = log.lock().expect("log").len();
    assert_eq!(hf_repo::pull(&endpoint, &models, &spec, &mut |_, _| panic!("no download")).expect("cached"), path);
    assert!(log.lock().expect("log")[n..].iter().all(|(p, _)| p.starts_with("/api/")));
    // The file name works as well as the quantization.
    let by_name = HubSpec::parse("org/repo-GGUF:model-Q4_K_M.gguf").expect("spec");
    assert_eq!(hf_repo::pull(&endpoint, &models, &by_name, &mut |_, _| {}).expect("same file"), path);
    // Without the hub, the verified pull is used.
    let offline = "http://127.0.0.1:9";
    assert_eq!(hf_repo::pull(offline, &models, &spec, &mut |_, _| {}).expect("offline"), path);
    // A file whose content is not the listed hash is refused and nothing stays.
    let q8 = HubSpec::parse("org/repo-GGUF:Q8_0").expect("spec");
    let err = hf_repo::pull(&endpoint, &models, &q8, &mut |_, _| {}).unwrap_err();
    assert!(matches!(err, pack::Error::HashMismatch { .. }), "{err}");
    assert!(!models.join("hf/org/repo-GGUF/model-Q8_0.gguf").exists());
    // No match: the error lists the repository's GGUF files; offline there is nothing to fall back on.
    let err = hf_repo::pull(&endpoint, &models, &HubSpec::parse("org/repo-GGUF:q2_k").expect("spec"), &mut |_, _| {})
        .unwrap_err()
        .to_string();
    assert!(err.contains("model-Q4_K_M.gguf, model-Q8_0.gguf"), "{err}");
    assert!(hf_repo::pull(offline, &models, &q8, &mut |_, _| {}).is_err());
}
