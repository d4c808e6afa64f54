//! The crate's error type: every variant names the model, wheel, file or command that failed.

use std::path::PathBuf;

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while looking up, fetching, assembling or verifying a model file.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A catalog TSV is malformed.
    #[error("catalog {table}, line {line}: {message}")]
    Catalog { table: &'static str, line: usize, message: String },

    /// Neither an existing file nor a catalog name.
    #[error("unknown model `{name}`: not an existing file and not in the catalog (known: {known})")]
    UnknownModel { name: String, known: String },

    /// A catalog model whose assembled file is not in the cache yet.
    #[error("model `{name}` is not downloaded yet ({path} does not exist); run `splash pull {name}`")]
    NotPulled { name: String, path: PathBuf },

    /// A file has the wrong size.
    #[error("{path}: size is {actual_bytes} bytes, expected {expected_bytes}{hint}")]
    SizeMismatch { path: PathBuf, expected_bytes: u64, actual_bytes: u64, hint: &'static str },

    /// An assembled or cached model file has the wrong SHA-256.
    #[error("{path}: SHA-256 is {actual}, expected {expected}{hint}")]
    HashMismatch { path: PathBuf, expected: String, actual: String, hint: &'static str },

    /// A downloaded (or cached) wheel has the wrong SHA-256.
    #[error("wheel {package}=={version} ({path}): SHA-256 is {actual}, expected {expected}")]
    WheelHashMismatch { package: String, version: String, path: PathBuf, expected: String, actual: String },

    /// `pip` could not be started.
    #[error("could not run `{python} -m pip` to download {package}=={version}: {source}")]
    PipSpawn {
        python: String,
        package: String,
        version: String,
        #[source]
        source: std::io::Error,
    },

    /// `pip download` exited with an error.
    #[error("`pip download {package}=={version}` failed ({status}):\n{output}")]
    PipFailed { package: String, version: String, status: String, output: String },

    /// `pip download` succeeded but left no single wheel behind.
    #[error("`pip download {package}=={version}` did not produce exactly one wheel in {dir} (found {found})")]
    NoWheel { package: String, version: String, dir: PathBuf, found: usize },

    /// A wheel is not a readable zip archive.
    #[error("wheel {path} is not a readable zip archive: {source}")]
    Zip {
        path: PathBuf,
        #[source]
        source: zip::result::ZipError,
    },

    /// A wheel lacks the member the catalog names.
    #[error("wheel {wheel} has no member `{member}`")]
    MissingMember { wheel: PathBuf, member: String },

    /// An HTTP download failed (status, connection, or a body of the wrong length).
    #[error("downloading {url}: {message}")]
    Http { url: String, message: String },

    /// No source of a pack's file produced a verified file.
    #[error("could not fetch {file} from any source:\n  {failures}")]
    AllSourcesFailed { file: String, failures: String },

    /// A pack manifest is malformed.
    #[error("pack manifest {name}: {message}")]
    Manifest { name: String, message: String },

    /// A filesystem operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.into();
        move |source| Error::Io { op, path, source }
    }
}
