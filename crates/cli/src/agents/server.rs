//! Finding the Splash server an agent will talk to, and starting one in the background when none answers.
//!
//! Owns the loopback HTTP probe (a plain HTTP/1.1 GET over `std::net`, enough for `/v1/models` on our own server), the
//! reading of the served model ids and context limit from `/v1/models`, and the background `splash serve` with its
//! log file and start-up progress. Never prints the API key.

use std::io::{IsTerminal, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// What the launchers need to know about the server.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    /// `http://127.0.0.1:PORT` (no trailing slash, no `/v1`).
    pub base_url: String,
    pub port: u16,
    /// The model id the agent will ask for.
    pub model: String,
    /// The server's real limit on prompt + output tokens per request (`context_length` in `/v1/models`).
    pub context_tokens: usize,
    /// The key the server requires, if any (from `--api-key` / `SPLASH_API_KEY`).
    pub api_key: Option<String>,
}

/// One answer from the server.
#[derive(Debug)]
pub struct HttpReply {
    pub status: u16,
    pub body: Vec<u8>,
}

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("nothing answers on {0}")]
    NotRunning(SocketAddr),
    #[error("{0}")]
    Other(String),
}

/// `GET path` on `127.0.0.1:port`, with the key as a bearer token when given.
pub fn http_get(port: u16, path: &str, api_key: Option<&str>, timeout: Duration) -> Result<HttpReply, ProbeError> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = match TcpStream::connect_timeout(&addr, timeout) {
        Ok(s) => s,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::ConnectionRefused
                    | std::io::ErrorKind::TimedOut
                    | std::io::ErrorKind::AddrNotAvailable
            ) =>
        {
            return Err(ProbeError::NotRunning(addr));
        }
        Err(e) => return Err(ProbeError::Other(format!("connecting to {addr}: {e}"))),
    };
    let io = |e: std::io::Error| ProbeError::Other(format!("talking to {addr}: {e}"));
    stream.set_read_timeout(Some(timeout)).map_err(io)?;
    stream.set_write_timeout(Some(timeout)).map_err(io)?;
    let auth = api_key.map(|k| format!("Authorization: Bearer {k}\r\n")).unwrap_or_default();
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{auth}Accept: application/json\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).map_err(io)?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).map_err(io)?;
    parse_http_reply(&raw).ok_or_else(|| ProbeError::Other(format!("{addr} did not answer in HTTP")))
}

/// Splits a raw HTTP/1.1 response into status and body (de-chunking a chunked body).
fn parse_http_reply(raw: &[u8]) -> Option<HttpReply> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..end]).ok()?;
    let status: u16 = head.lines().next()?.split_whitespace().nth(1)?.parse().ok()?;
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let mut body = raw[end + 4..].to_vec();
    if chunked {
        let mut out = Vec::new();
        let mut rest = &body[..];
        loop {
            let line_end = rest.windows(2).position(|w| w == b"\r\n")?;
            let size_text = std::str::from_utf8(&rest[..line_end]).ok()?;
            let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
            rest = &rest[line_end + 2..];
            if size == 0 {
                break;
            }
            out.extend_from_slice(rest.get(..size)?);
            rest = rest.get(size + 2..)?;
        }
        body = out;
    }
    Some(HttpReply { status, body })
}

/// The served ids (first = the main one) and the context limit, from a `/v1/models` body.
pub fn parse_models(body: &[u8]) -> Result<(Vec<String>, usize)> {
    let v: Value = serde_json::from_slice(body).context("/v1/models did not return JSON")?;
    let data = v.get("data").and_then(Value::as_array).context("/v1/models has no \"data\" list")?;
    let ids: Vec<String> = data.iter().filter_map(|m| m.get("id")?.as_str().map(str::to_owned)).collect();
    if ids.is_empty() {
        bail!("the server lists no models");
    }
    let context = data
        .iter()
        .find_map(|m| m.get("context_length").or_else(|| m.get("max_model_len"))?.as_u64())
        .context("/v1/models reports no context_length: is this a Splash server?")?;
    Ok((ids, context as usize))
}

/// Asks the server on `port` what it serves. `Ok(None)` when nothing listens there.
pub fn probe(port: u16, api_key: Option<&str>) -> Result<Option<(Vec<String>, usize)>> {
    let reply = match http_get(port, "/v1/models", api_key, Duration::from_secs(5)) {
        Ok(r) => r,
        Err(ProbeError::NotRunning(_)) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    match reply.status {
        200 => parse_models(&reply.body).map(Some),
        401 if api_key.is_some() => {
            bail!("the server on port {port} refused the API key in SPLASH_API_KEY / --api-key (HTTP 401)")
        }
        401 => bail!(
            "the server on port {port} requires an API key: set SPLASH_API_KEY (or pass --api-key) to the key it was \
             started with"
        ),
        s => bail!("GET http://127.0.0.1:{port}/v1/models answered HTTP {s}: is another program using port {port}?"),
    }
}

/// Picks `wanted` among the served ids (the first when none is asked for).
pub fn choose_model(ids: &[String], wanted: Option<&str>) -> Result<String> {
    match wanted {
        None => Ok(ids[0].clone()),
        Some(w) if ids.iter().any(|i| i == w) => Ok(w.to_owned()),
        Some(w) => bail!("the server does not serve model '{w}'; it serves: {}", ids.join(", ")),
    }
}

/// Where a background server started for `port` writes its log.
pub fn log_path(port: u16) -> PathBuf {
    pack::home().join("logs").join(format!("serve-{port}.log"))
}

/// How a background server is started.
#[derive(Debug, Clone)]
pub struct StartOptions {
    pub port: u16,
    /// Pack name or .gguf path for `splash serve --model`; `None` = serve's default pack.
    pub pack: Option<String>,
    /// Given to the server through `SPLASH_API_KEY` (never on its command line).
    pub api_key: Option<String>,
    /// Longest wait for the server to answer (model downloads included).
    pub max_wait: Duration,
}

/// The `splash serve` command for a background server (program = this executable).
pub fn serve_command(program: &Path, o: &StartOptions) -> Command {
    let mut cmd = Command::new(program);
    cmd.arg("serve").arg("--port").arg(o.port.to_string());
    if let Some(p) = &o.pack {
        cmd.arg("--model").arg(p);
    }
    match &o.api_key {
        Some(k) => cmd.env("SPLASH_API_KEY", k),
        None => cmd.env_remove("SPLASH_API_KEY"),
    };
    cmd.env("SPLASH_PORT", o.port.to_string());
    cmd
}

/// Starts `splash serve` detached from this terminal, waits until `/v1/models` answers (showing progress from its
/// log on stderr), and returns what it serves. The server keeps running after the agent exits.
pub fn start_background(o: &StartOptions) -> Result<(Vec<String>, usize)> {
    let log = log_path(o.port);
    if let Some(dir) = log.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let file = std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    let program = std::env::current_exe().context("finding the splash executable")?;
    let mut cmd = serve_command(&program, o);
    cmd.stdin(Stdio::null()).stdout(file.try_clone()?).stderr(file);
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        // Its own process group: Ctrl-C in the agent does not stop the server.
        cmd.process_group(0);
    }
    let mut child = cmd.spawn().context("starting splash serve")?;
    eprintln!(
        "splash: no server on port {}; starting `splash serve{}` in the background (pid {}, log {})",
        o.port,
        o.pack.as_deref().map(|p| format!(" --model {p}")).unwrap_or_default(),
        child.id(),
        log.display()
    );
    let served = wait_ready(&mut child, o, &log);
    if std::io::stderr().is_terminal() {
        eprintln!();
    }
    let served = served?;
    eprintln!("splash: server ready (pid {}); stop it with `kill {}`", child.id(), child.id());
    Ok(served)
}

fn wait_ready(child: &mut Child, o: &StartOptions, log: &Path) -> Result<(Vec<String>, usize)> {
    let start = Instant::now();
    let tty = std::io::stderr().is_terminal();
    let mut last_shown = String::new();
    loop {
        if let Some(status) = child.try_wait()? {
            bail!("splash serve exited ({status}) before it was ready; its log:\n{}", tail(log, 20));
        }
        if let Some(served) = probe(o.port, o.api_key.as_deref())? {
            return Ok(served);
        }
        if start.elapsed() > o.max_wait {
            bail!(
                "splash serve did not answer within {} s (still running as pid {}; log {})",
                o.max_wait.as_secs(),
                child.id(),
                log.display()
            );
        }
        let line = tail(log, 1);
        let line = line.trim();
        let elapsed = start.elapsed().as_secs();
        if tty {
            let shown: String = line.chars().take(90).collect();
            eprint!("\r\x1b[2K  {elapsed:>4} s  {shown}");
        } else if line != last_shown {
            eprintln!("  {elapsed:>4} s  {line}");
            last_shown = line.to_owned();
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// The last `n` lines of a text file (empty when unreadable).
fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_replies_plain_and_chunked() {
        let r = parse_http_reply(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}").expect("parses");
        assert_eq!((r.status, r.body.as_slice()), (200, b"{}".as_slice()));
        let r = parse_http_reply(
            b"HTTP/1.1 401 Unauthorized\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
        )
        .expect("parses");
        assert_eq!((r.status, r.body.as_slice()), (401, b"abcde".as_slice()));
        assert!(parse_http_reply(b"garbage").is_none());
    }

    #[test]
    fn models_list() {
        let body = br#"{"object":"list","data":[{"id":"a","context_length":32768},{"id":"b","context_length":32768}]}"#;
        let (ids, ctx) = parse_models(body).expect("valid");
        assert_eq!((ids.as_slice(), ctx), (["a".to_string(), "b".to_string()].as_slice(), 32768));
        assert!(parse_models(br#"{"data":[{"id":"x"}]}"#).is_err(), "no context length: not Splash");
        assert!(parse_models(br#"{"data":[]}"#).is_err());
        assert_eq!(choose_model(&ids, None).expect("first"), "a");
        assert_eq!(choose_model(&ids, Some("b")).expect("listed"), "b");
        let e = choose_model(&ids, Some("c")).expect_err("not served").to_string();
        assert!(e.contains("'c'") && e.contains("a, b"), "{e}");
    }

    #[test]
    fn background_command_keeps_the_key_off_the_command_line() {
        let o = StartOptions {
            port: 8123,
            pack: Some("qwen2.5-coder-0.5b".into()),
            api_key: Some("sekret".into()),
            max_wait: Duration::from_secs(1),
        };
        let cmd = serve_command(Path::new("/bin/splash"), &o);
        let args: Vec<_> = cmd.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(args, ["serve", "--port", "8123", "--model", "qwen2.5-coder-0.5b"]);
        let envs: Vec<_> =
            cmd.get_envs().map(|(k, v)| (k.to_string_lossy().into_owned(), v.map(|v| v.to_owned()))).collect();
        assert!(envs.contains(&("SPLASH_API_KEY".into(), Some("sekret".into()))));
        assert!(!args.iter().any(|a| a.contains("sekret")));
    }

    #[test]
    fn probe_finds_nothing_on_a_closed_port() {
        // Bind then drop to get a port that nobody listens on.
        let port = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
        assert!(probe(port, None).expect("refused is not an error").is_none());
    }

    #[test]
    fn probe_reads_a_live_server_and_reports_401_plainly() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let server = std::thread::spawn(move || {
            let mut seen = Vec::new();
            for reply in [
                "HTTP/1.1 200 OK\r\ncontent-length: 46\r\n\r\n{\"data\":[{\"id\":\"m\",\"context_length\":4096}]}",
                "HTTP/1.1 401 Unauthorized\r\ncontent-length: 2\r\n\r\n{}",
            ] {
                let (mut s, _) = listener.accept().expect("accept");
                let mut buf = [0u8; 2048];
                let n = s.read(&mut buf).expect("read");
                seen.push(String::from_utf8_lossy(&buf[..n]).into_owned());
                s.write_all(reply.as_bytes()).expect("write");
            }
            seen
        });
        let (ids, ctx) = probe(port, Some("k1")).expect("ok").expect("running");
        assert_eq!((ids, ctx), (vec!["m".to_string()], 4096));
        let e = probe(port, None).expect_err("401").to_string();
        assert!(e.contains("requires an API key") && e.contains("SPLASH_API_KEY"), "{e}");
        let seen = server.join().expect("server thread");
        assert!(seen[0].starts_with("GET /v1/models HTTP/1.1") && seen[0].contains("Authorization: Bearer k1"));
        assert!(!seen[1].contains("Authorization"));
    }
}
