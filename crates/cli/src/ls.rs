//! `splash ls` and `splash rm`: the built-in packs and the state of their files in the cache, and removing a pack's
//! model file.
//!
//! A file is `ready` when its size matches and a verification stamp exists, `unverified` when only the size matches
//! (the next use hashes it), `incomplete` when the size is wrong, and `not pulled` when absent. Wheels in `wheels/`
//! are kept by `rm` so that `splash pull` can reassemble offline.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use pack::{FileSpec, Manifest};

#[derive(clap::Args)]
pub struct LsArgs {}

#[derive(clap::Args)]
pub struct RmArgs {
    /// Packs whose model file to delete (a draft shared with another pack is that pack's file: remove it by its name).
    #[arg(required = true)]
    names: Vec<String>,
}

fn models_dir() -> PathBuf {
    pack::Store::new(pack::home()).models_dir()
}

fn with_ext(path: &std::path::Path, ext: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".");
    s.push(ext);
    PathBuf::from(s)
}

/// The state of one file in the cache, in words.
fn file_state(f: &FileSpec) -> &'static str {
    let path = models_dir().join(&f.file);
    match std::fs::metadata(&path) {
        Err(_) => "not pulled",
        Ok(m) if m.len() != f.size_bytes => "incomplete",
        Ok(_) if with_ext(&path, "verified").is_file() => "ready",
        Ok(_) => "unverified",
    }
}

fn line(m: &Manifest) -> String {
    let mut files = format!("{} ({})", file_state(&m.target), plan::human_bytes(m.target.size_bytes));
    if let Some(d) = &m.draft {
        files.push_str(&format!("; draft {} ({})", file_state(d), plan::human_bytes(d.size_bytes)));
    }
    format!("{:<20} {:<3} {:<44} {}", m.name, if m.default { "*" } else { "" }, files, m.description)
}

pub fn ls(_: LsArgs) -> Result<()> {
    println!("{:<20} {:<3} {:<44} DESCRIPTION", "NAME", "DEF", "FILES");
    for m in pack::builtin_packs() {
        println!("{}", line(m));
    }
    println!("cache: {}", models_dir().display());
    Ok(())
}

pub fn rm(a: RmArgs) -> Result<()> {
    for name in &a.names {
        let Some(m) = pack::pack(name) else {
            let known: Vec<&str> = pack::builtin_packs().iter().map(|m| m.name.as_str()).collect();
            bail!("unknown pack `{name}` (known: {})", known.join(", "));
        };
        let path = models_dir().join(&m.target.file);
        let mut removed = false;
        for p in [with_ext(&path, "verified"), with_ext(&path, "partial"), path.clone()] {
            match std::fs::remove_file(&p) {
                Ok(()) => removed = true,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e).with_context(|| format!("removing {}", p.display())),
            }
        }
        if removed {
            println!("removed {} ({})", path.display(), m.name);
        } else {
            println!("{} is not pulled", m.name);
        }
    }
    Ok(())
}
