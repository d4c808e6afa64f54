//! Downloads over HTTP(S) from Hugging Face resolve URLs (or anything that serves a file the same way): resumable,
//! verified, atomic.
//!
//! In: a URL, the destination path, the expected size and SHA-256. Out: the file at the destination, or an error and
//! no file there. Bytes go to `<dest>.download`; an interrupted download leaves that file, and the next call asks
//! for the rest with `Range: bytes=N-` (a server that answers 200 instead of 206 restarts it). A complete download
//! is hashed; a mismatch deletes it and is refused; a match is renamed onto the destination (atomic on one file
//! system). Hugging Face redirects resolve URLs to its CDN; redirects are followed.

use std::fs::{self, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// The hub `splash pull` uses: `$SPLASH_HF_ENDPOINT` (tests, mirrors), else `https://huggingface.co`.
pub fn endpoint() -> String {
    std::env::var("SPLASH_HF_ENDPOINT")
        .ok()
        .filter(|e| !e.is_empty())
        .unwrap_or_else(|| "https://huggingface.co".into())
}

/// Progress of one download: bytes on disk so far (resumed bytes included) of the total.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DownloadProgress {
    pub done_bytes: u64,
    pub total_bytes: u64,
    /// Bytes already on disk when this attempt started.
    pub resumed_from_bytes: u64,
}

fn download_path(dest: &Path) -> PathBuf {
    let mut s = dest.as_os_str().to_owned();
    s.push(".download");
    PathBuf::from(s)
}

fn http_err(url: &str, message: impl Into<String>) -> Error {
    Error::Http { url: url.to_string(), message: message.into() }
}

/// Downloads `url` to `dest`, resuming a previous partial download; see the module docs.
pub fn download(
    url: &str,
    dest: &Path,
    size_bytes: u64,
    sha256: &str,
    progress: &mut dyn FnMut(DownloadProgress),
) -> Result<()> {
    let part = download_path(dest);
    if let Some(dir) = dest.parent() {
        fs::create_dir_all(dir).map_err(Error::io("create directory", dir))?;
    }
    let mut have = fs::metadata(&part).map(|m| m.len()).unwrap_or(0);
    if have > size_bytes {
        fs::remove_file(&part).map_err(Error::io("remove", &part))?;
        have = 0;
    }
    if have < size_bytes {
        let mut req = hub_get(url);
        if have > 0 {
            req = req.header("Range", &format!("bytes={have}-"));
        }
        let resp = req.call().map_err(|e| http_err(url, e.to_string()))?;
        let status = resp.status().as_u16();
        let append = match status {
            206 => true,
            200 => false,
            416 if have > 0 => true, // nothing left to send: verify what we have
            _ => return Err(http_err(url, format!("HTTP {status}"))),
        };
        if !append {
            have = 0;
        }
        let mut file = OpenOptions::new()
            .create(true)
            .write(true)
            .append(append)
            .truncate(!append)
            .open(&part)
            .map_err(Error::io("open", &part))?;
        let resumed_from_bytes = have;
        if status != 416 {
            let mut body = resp.into_body().into_reader();
            let mut buf = vec![0u8; 1 << 16];
            loop {
                let n = match body.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        let _ = file.flush();
                        return Err(http_err(url, format!("interrupted after {have} of {size_bytes} bytes: {e}")));
                    }
                };
                if have + n as u64 > size_bytes {
                    drop(file);
                    let _ = fs::remove_file(&part);
                    return Err(http_err(url, format!("server sent more than the expected {size_bytes} bytes")));
                }
                file.write_all(&buf[..n]).map_err(Error::io("write", &part))?;
                have += n as u64;
                progress(DownloadProgress { done_bytes: have, total_bytes: size_bytes, resumed_from_bytes });
            }
        }
        file.sync_all().map_err(Error::io("sync", &part))?;
        if have < size_bytes {
            return Err(http_err(
                url,
                format!("connection ended after {have} of {size_bytes} bytes; run again to resume"),
            ));
        }
    }
    let actual = sha256_file(&part)?;
    if actual != sha256 {
        let _ = fs::remove_file(&part);
        return Err(Error::HashMismatch {
            path: part,
            expected: sha256.to_string(),
            actual,
            hint: " (the download was deleted)",
        });
    }
    fs::rename(&part, dest).map_err(Error::io("rename into place", dest))
}

pub(crate) fn sha256_file(path: &Path) -> Result<String> {
    let mut f = fs::File::open(path).map_err(Error::io("open", path))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(Error::io("read", path))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex::encode(h.finalize()))
}

/// A GET of `url` on the hub: statuses returned rather than raised, bounded connect and response times, and
/// `$HF_TOKEN` as the bearer token when set.
pub(crate) fn hub_get(url: &str) -> ureq::RequestBuilder<ureq::typestate::WithoutBody> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_connect(Some(Duration::from_secs(30)))
        .timeout_recv_response(Some(Duration::from_secs(60)))
        .build()
        .into();
    let req = agent.get(url).header("User-Agent", "splash");
    match std::env::var("HF_TOKEN") {
        Ok(token) => req.header("Authorization", &format!("Bearer {token}")),
        Err(_) => req,
    }
}
