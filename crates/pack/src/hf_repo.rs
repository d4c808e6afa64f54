//! A GGUF named as `OWNER/REPO:FILE-OR-QUANT` on Hugging Face (`Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF:q4_k_m`):
//! the repository's current commit and file list come from the hub's API (`/api/models/OWNER/REPO` and
//! `/api/models/OWNER/REPO/tree/COMMIT`), which gives each file's size and, for LFS files, its SHA-256; the one file
//! whose path is FILE, or whose name ends in the quantization QUANT (`-q4_k_m.gguf`, `.Q4_K_M.gguf`, any case), is
//! downloaded with [`crate::hf::download`] (resumable, verified against that size and hash) into
//! `<home>/models/hf/OWNER/REPO/`. A file verified once gets a `.sha256` note beside it, so later starts do not hash
//! it again while its size and time stay the same; without the network, such a file is used as it is.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::hf::{self, DownloadProgress};

/// `OWNER/REPO:FILE-OR-QUANT`, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubSpec {
    pub repo: String,
    pub file: String,
}

impl HubSpec {
    /// `Some` when `s` has that shape (one `/` in the repository part, something after the `:`, no path that
    /// exists locally).
    pub fn parse(s: &str) -> Option<HubSpec> {
        if Path::new(s).exists() {
            return None;
        }
        let (repo, file) = s.split_once(':')?;
        let mut parts = repo.split('/');
        let ok = |p: Option<&str>| p.is_some_and(|p| !p.is_empty() && !p.contains(char::is_whitespace) && p != "..");
        if !(ok(parts.next()) && ok(parts.next()) && parts.next().is_none()) || file.is_empty() || file.contains("..") {
            return None;
        }
        Some(HubSpec { repo: repo.to_string(), file: file.to_string() })
    }

    /// Where its files go under `models_dir`.
    pub fn dir(&self, models_dir: &Path) -> PathBuf {
        models_dir.join("hf").join(&self.repo)
    }
}

/// One file of a repository at a commit, as the hub lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubFile {
    pub repo: String,
    pub commit: String,
    pub path: String,
    pub size_bytes: u64,
    pub sha256: String,
}

impl HubFile {
    pub fn url(&self, endpoint: &str) -> String {
        format!("{}/{}/resolve/{}/{}", endpoint.trim_end_matches('/'), self.repo, self.commit, self.path)
    }
}

fn get_json(url: &str) -> Result<serde_json::Value> {
    let http = |m: String| Error::Http { url: url.to_string(), message: m };
    let resp = crate::hf::hub_get(url).call().map_err(|e| http(e.to_string()))?;
    let status = resp.status().as_u16();
    if status != 200 {
        return Err(http(format!("HTTP {status}")));
    }
    let body = resp.into_body().read_to_string().map_err(|e| http(e.to_string()))?;
    serde_json::from_str(&body).map_err(|e| http(format!("not the hub's JSON: {e}")))
}

/// Whether `path` is the file `want` names: the same path, or a `.gguf` whose name ends in that quantization.
fn matches(path: &str, want: &str) -> bool {
    if path == want {
        return true;
    }
    let name = path.rsplit('/').next().unwrap_or(path).to_ascii_lowercase();
    let Some(stem) = name.strip_suffix(".gguf") else { return false };
    let want = want.to_ascii_lowercase();
    let want = want.strip_suffix(".gguf").unwrap_or(&want);
    stem.strip_suffix(want).is_some_and(|head| head.ends_with(['-', '.']))
}

/// The file of `spec` at the repository's current commit on `endpoint`; an error naming the candidates when none or
/// several match.
pub fn resolve(endpoint: &str, spec: &HubSpec) -> Result<HubFile> {
    let base = endpoint.trim_end_matches('/');
    let info = get_json(&format!("{base}/api/models/{}", spec.repo))?;
    let commit = info["sha"].as_str().filter(|c| !c.is_empty()).unwrap_or("main").to_string();
    let tree = get_json(&format!("{base}/api/models/{}/tree/{commit}?recursive=true", spec.repo))?;
    let bad = |message: String| Error::Manifest { name: format!("{}:{}", spec.repo, spec.file), message };
    let files = tree.as_array().ok_or_else(|| bad("the hub's file list is not a list".into()))?;
    let ggufs: Vec<&str> = files.iter().filter_map(|f| f["path"].as_str()).filter(|p| p.ends_with(".gguf")).collect();
    let found: Vec<&serde_json::Value> =
        files.iter().filter(|f| f["path"].as_str().is_some_and(|p| matches(p, &spec.file))).collect();
    let f = match found.as_slice() {
        [f] => *f,
        [] => return Err(bad(format!("no file matches; the repository's GGUF files: {}", ggufs.join(", ")))),
        many => {
            let names: Vec<&str> = many.iter().filter_map(|f| f["path"].as_str()).collect();
            return Err(bad(format!("several files match ({}); name one", names.join(", "))));
        }
    };
    let path = f["path"].as_str().unwrap_or_default().to_string();
    if path.contains("-of-") && path.contains("-0000") {
        return Err(bad(format!("{path} is one part of a split GGUF; splash needs a single file")));
    }
    let size_bytes = f["lfs"]["size"].as_u64().or(f["size"].as_u64()).ok_or_else(|| bad(format!("{path}: no size")))?;
    let sha256 = f["lfs"]["oid"]
        .as_str()
        .or_else(|| f["lfs"]["sha256"].as_str())
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| bad(format!("{path}: the hub lists no SHA-256 for it (not an LFS file)")))?
        .to_ascii_lowercase();
    Ok(HubFile { repo: spec.repo.clone(), commit, path, size_bytes, sha256 })
}

fn note_path(dest: &Path) -> PathBuf {
    let mut s = dest.as_os_str().to_owned();
    s.push(".sha256");
    PathBuf::from(s)
}

/// `sha256 size mtime-ns` of a verified file.
fn note(dest: &Path, sha256: &str) -> Option<String> {
    let m = std::fs::metadata(dest).ok()?;
    let mtime = m.modified().ok()?.duration_since(std::time::UNIX_EPOCH).ok()?.as_nanos();
    Some(format!("{sha256} {} {mtime}\n", m.len()))
}

/// The verified local file of `spec` from an earlier pull (its note still matches), if any.
fn local(models_dir: &Path, spec: &HubSpec) -> Option<PathBuf> {
    let dir = spec.dir(models_dir);
    let mut found = std::fs::read_dir(&dir).ok()?.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| {
        let rel = p.strip_prefix(&dir).ok().and_then(|r| r.to_str()).unwrap_or("");
        let noted = std::fs::read_to_string(note_path(p)).ok();
        matches(rel, &spec.file)
            && noted
                .as_deref()
                .is_some_and(|n| n.split_whitespace().next().and_then(|h| note(p, h)).as_deref() == Some(n))
    });
    let first = found.next()?;
    found.next().is_none().then_some(first)
}

/// Makes sure the file of `spec` is in `models_dir`, verified: resolved on the hub, downloaded (or resumed) unless
/// the same file was verified before. Without the network, an earlier verified pull is used as it is.
pub fn pull(
    endpoint: &str,
    models_dir: &Path,
    spec: &HubSpec,
    progress: &mut dyn FnMut(&str, DownloadProgress),
) -> Result<PathBuf> {
    let file = match resolve(endpoint, spec) {
        Ok(f) => f,
        Err(e @ Error::Http { .. }) => return local(models_dir, spec).ok_or(e),
        Err(e) => return Err(e),
    };
    let dest = spec.dir(models_dir).join(&file.path);
    let noted = std::fs::read_to_string(note_path(&dest)).ok();
    if noted.is_some() && noted == note(&dest, &file.sha256) {
        return Ok(dest);
    }
    let name = file.path.rsplit('/').next().unwrap_or(&file.path).to_string();
    hf::download(&file.url(endpoint), &dest, file.size_bytes, &file.sha256, &mut |p| progress(&name, p))?;
    if let Some(n) = note(&dest, &file.sha256) {
        let p = note_path(&dest);
        std::fs::write(&p, n).map_err(Error::io("write", &p))?;
    }
    Ok(dest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_and_quantization_names() {
        let s = HubSpec::parse("Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF:q4_k_m").expect("a hub spec");
        assert_eq!((s.repo.as_str(), s.file.as_str()), ("Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF", "q4_k_m"));
        for bad in ["qwen2.5-coder-1.5b", "a/b", "a:b", "a/b/c:x", "/a:x", "a/b:", "a/../b:x", "a/b:../x"] {
            assert_eq!(HubSpec::parse(bad), None, "{bad}");
        }
        assert!(matches("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "Q4_K_M"));
        assert!(matches("SmolLM2-135M-Instruct.Q4_1.gguf", "q4_1"));
        assert!(matches("sub/model-q8_0.gguf", "sub/model-q8_0.gguf"));
        assert!(!matches("model-q4_k_m.gguf", "k_m"));
        assert!(!matches("model-iq4_k_m.gguf", "q4_k_m"));
        assert!(!matches("model-q4_k_m.bin", "q4_k_m"));
    }
}
