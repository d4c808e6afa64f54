//! The GGUF reader on well-formed files: writer → reader round trips (every metadata value type, nested and empty
//! arrays, v2 and v3 headers, non-default alignment) and the headers of the real model files.
//!
//! The model tests need the files in `$SPLASH_HOME/models/` (default `~/.cache/splash`); they fail with a message saying so unless
//! `SPLASH_SKIP_MODEL_TESTS=1`.

use std::path::PathBuf;

use gguf::{GgmlType, GgufFile, GgufWriter, Value, ValueType};

/// One value of every metadata type, including nested and empty arrays.
fn every_value() -> Vec<(&'static str, Value)> {
    use Value::*;
    vec![
        ("t.u8", U8(0xAB)),
        ("t.i8", I8(-7)),
        ("t.u16", U16(0xBEEF)),
        ("t.i16", I16(-12345)),
        ("t.u32", U32(0xDEAD_BEEF)),
        ("t.i32", I32(i32::MIN)),
        ("t.f32", F32(-1.5e-7)),
        ("t.bool.true", Bool(true)),
        ("t.bool.false", Bool(false)),
        ("t.string", String("héllo, 世界 \0 with a NUL".into())),
        ("t.string.empty", String(std::string::String::new())),
        ("t.u64", U64(u64::MAX)),
        ("t.i64", I64(i64::MIN)),
        ("t.f64", F64(std::f64::consts::PI)),
        ("t.array.u8", Array(ValueType::U8, vec![U8(1), U8(2), U8(255)])),
        ("t.array.i32", Array(ValueType::I32, vec![I32(-1), I32(0), I32(i32::MAX)])),
        ("t.array.f32", Array(ValueType::F32, vec![F32(0.5), F32(-0.0), F32(f32::INFINITY)])),
        ("t.array.bool", Array(ValueType::Bool, vec![Bool(true), Bool(false)])),
        ("t.array.string", Array(ValueType::String, vec![String("a".into()), String(std::string::String::new())])),
        ("t.array.u64", Array(ValueType::U64, vec![U64(1 << 40)])),
        ("t.array.f64", Array(ValueType::F64, vec![F64(-2.25)])),
        ("t.array.empty.u32", Array(ValueType::U32, vec![])),
        ("t.array.empty.string", Array(ValueType::String, vec![])),
        ("t.array.empty.array", Array(ValueType::Array, vec![])),
        (
            "t.array.nested",
            Array(
                ValueType::Array,
                vec![
                    Array(ValueType::U32, vec![U32(1), U32(2)]),
                    Array(ValueType::U32, vec![]),
                    Array(ValueType::String, vec![String("deep".into())]),
                    Array(ValueType::Array, vec![Array(ValueType::I16, vec![I16(-3)])]),
                ],
            ),
        ),
    ]
}

/// What [`sample_writer`] put in: name, dims, type, data.
type Tensors = Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>;

fn f32_bytes(values: impl IntoIterator<Item = f32>) -> Vec<u8> {
    values.into_iter().flat_map(f32::to_le_bytes).collect()
}

/// A writer holding every value type and three tensors of different types and sizes.
fn sample_writer(alignment: Option<Value>) -> (GgufWriter, Tensors) {
    let mut w = GgufWriter::new();
    w.add("general.architecture", Value::String("test".into()));
    if let Some(a) = alignment {
        w.add("general.alignment", a);
    }
    for (k, v) in every_value() {
        w.add(k, v);
    }
    let q4_0 = gguf::quant::quantize(GgmlType::Q4_0, &(0..64).map(|i| i as f32 / 7.0).collect::<Vec<_>>()).unwrap();
    let tensors = vec![
        ("norm.weight".to_string(), vec![5], GgmlType::F32, f32_bytes((0..5).map(|i| i as f32))),
        ("w.q4_0".to_string(), vec![32, 2], GgmlType::Q4_0, q4_0),
        ("w.f16".to_string(), vec![3, 1, 2], GgmlType::F16, vec![0x3c; 12]),
    ];
    for (name, dims, ty, data) in &tensors {
        w.add_tensor(name.clone(), dims, *ty, data.clone()).unwrap();
    }
    (w, tensors)
}

/// Checks that `file` holds exactly what [`sample_writer`] wrote, laid out with `alignment`.
fn check_sample(file: &GgufFile, tensors: &Tensors, alignment: u64) {
    for (k, v) in every_value() {
        assert_eq!(file.get(k), Some(&v), "metadata {k}");
    }
    let keys: Vec<&str> = file.metadata.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys[0], "general.architecture", "metadata keeps file order");
    assert_eq!(file.alignment, alignment);
    assert_eq!(file.data_offset % alignment, 0);
    assert_eq!(file.tensors.len(), tensors.len());
    for (info, (name, dims, ty, data)) in file.tensors.iter().zip(tensors) {
        assert_eq!((&info.name, &info.dims, info.ty), (name, dims, *ty));
        assert_eq!(info.offset % alignment, 0, "{name} offset");
        assert_eq!(info.size_bytes, data.len() as u64);
        assert_eq!(file.tensor_data(info), &data[..], "{name} data");
        assert_eq!(file.tensor(name), Some(info));
    }
}

#[test]
fn round_trip_every_value_type_v3() {
    let (w, tensors) = sample_writer(None);
    let file = GgufFile::from_bytes(w.to_bytes()).unwrap();
    assert_eq!(file.version, 3);
    check_sample(&file, &tensors, gguf::DEFAULT_ALIGNMENT);
}

#[test]
fn round_trip_through_a_file_on_disk() {
    let (w, tensors) = sample_writer(None);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sample.gguf");
    w.write(&path).unwrap();
    let file = GgufFile::open(&path).unwrap();
    check_sample(&file, &tensors, gguf::DEFAULT_ALIGNMENT);
    assert_eq!(file.len(), std::fs::metadata(&path).unwrap().len());
}

/// A header-only file has the whole file's header and length, its tensor data reading as zeros.
#[test]
fn header_only_file_has_the_full_header_and_length() {
    let (w, tensors) = sample_writer(None);
    let dir = tempfile::tempdir().unwrap();
    let (full, header_only) = (dir.path().join("full.gguf"), dir.path().join("header.gguf"));
    w.write(&full).unwrap();
    w.write_header_only(&header_only).unwrap();
    let (a, b) = (std::fs::read(&full).unwrap(), std::fs::read(&header_only).unwrap());
    assert_eq!(a.len(), b.len());
    let file = GgufFile::open(&header_only).unwrap();
    assert_eq!(b[..file.data_offset as usize], a[..file.data_offset as usize]);
    assert!(b[file.data_offset as usize..].iter().all(|&x| x == 0));
    let reference = GgufFile::open(&full).unwrap();
    assert_eq!(file.tensors.len(), tensors.len());
    for (t, r) in file.tensors.iter().zip(&reference.tensors) {
        assert_eq!((&t.name, &t.dims, t.ty, t.offset), (&r.name, &r.dims, r.ty, r.offset));
    }
}

#[test]
fn version_2_header_reads_the_same() {
    let (w, tensors) = sample_writer(None);
    let mut bytes = w.to_bytes();
    bytes[4..8].copy_from_slice(&2u32.to_le_bytes());
    let file = GgufFile::from_bytes(bytes).unwrap();
    assert_eq!(file.version, 2);
    check_sample(&file, &tensors, gguf::DEFAULT_ALIGNMENT);
}

#[test]
fn non_default_alignment() {
    for (value, alignment) in
        [(Value::U32(64), 64), (Value::U32(1), 1), (Value::U64(4096), 4096), (Value::U8(8), 8), (Value::I32(128), 128)]
    {
        let (w, tensors) = sample_writer(Some(value));
        let bytes = w.to_bytes();
        let file = GgufFile::from_bytes(bytes).unwrap();
        check_sample(&file, &tensors, alignment);
    }
}

#[test]
fn typed_getters() {
    let (w, _) = sample_writer(None);
    let file = GgufFile::from_bytes(w.to_bytes()).unwrap();
    assert_eq!(file.get_str("general.architecture").unwrap(), Some("test"));
    assert_eq!(file.get_u64("t.u32").unwrap(), Some(0xDEAD_BEEF));
    assert_eq!(file.get_u64("t.u8").unwrap(), Some(0xAB));
    assert_eq!(file.get_f64("t.f64").unwrap(), Some(std::f64::consts::PI));
    assert_eq!(file.get_f64("t.i8").unwrap(), Some(-7.0));
    assert_eq!(file.get_bool("t.bool.true").unwrap(), Some(true));
    assert_eq!(file.get_str_array("t.array.string").unwrap(), Some(vec!["a", ""]));
    assert_eq!(file.get_str_array("t.array.empty.string").unwrap(), Some(vec![]));
    assert_eq!(file.get_i64_array("t.array.i32").unwrap(), Some(vec![-1, 0, i32::MAX as i64]));
    assert_eq!(file.get_str("missing.key").unwrap(), None);
    for (key, err) in [
        ("t.u32", file.get_str("t.u32").unwrap_err()),
        ("t.i8", file.get_u64("t.i8").unwrap_err()),
        ("t.string", file.get_bool("t.string").unwrap_err()),
        ("t.array.u8", file.get_str_array("t.array.u8").unwrap_err()),
        ("t.array.string", file.get_i64_array("t.array.string").unwrap_err()),
    ] {
        let msg = err.to_string();
        assert!(msg.contains(key) && msg.contains("expected"), "{msg}");
    }
}

#[test]
fn file_without_tensors_or_metadata() {
    let file = GgufFile::from_bytes(GgufWriter::new().to_bytes()).unwrap();
    assert!(file.metadata.is_empty() && file.tensors.is_empty());
}

// ---- real model files ------------------------------------------------------------------------------------------

/// `$SPLASH_HOME/models/<name>` (default `~/.cache/splash`), where `splash pull` puts the verified models.
fn model_path(name: &str) -> Option<PathBuf> {
    let splash_home = match std::env::var_os("SPLASH_HOME").filter(|d| !d.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/splash"),
    };
    let path = splash_home.join("models").join(name);
    if path.exists() {
        return Some(path);
    }
    if std::env::var("SPLASH_SKIP_MODEL_TESTS").as_deref() == Ok("1") {
        eprintln!("skipping: {} is missing and SPLASH_SKIP_MODEL_TESTS=1", path.display());
        return None;
    }
    panic!(
        "{} is missing: fetch the models (`scripts/test` does, or `splash pull qwen2.5-coder-0.5b \
         qwen2.5-coder-1.5b smollm2-135m`) or set SPLASH_SKIP_MODEL_TESTS=1",
        path.display()
    );
}

/// Number of tensors of each type, in the order given.
fn count_types(file: &GgufFile, types: &[GgmlType]) -> Vec<usize> {
    types.iter().map(|&ty| file.tensors.iter().filter(|t| t.ty == ty).count()).collect()
}

/// Where the last tensor ends, which for these files is exactly the file size.
fn data_end(file: &GgufFile) -> u64 {
    file.tensors.iter().map(|t| file.data_offset + t.offset + t.size_bytes).max().unwrap_or(0)
}

#[test]
fn qwen_1_5b_header() {
    let Some(path) = model_path("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf") else { return };
    let file = GgufFile::open(path).unwrap();
    assert_eq!((file.version, file.tensors.len(), file.metadata.len()), (3, 339, 26));
    assert_eq!(file.get_str("general.architecture").unwrap(), Some("qwen2"));
    assert_eq!(file.get_str("general.name").unwrap(), Some("Qwen2.5 Coder 1.5B Instruct GGUF"));
    assert_eq!(file.get_u64("general.file_type").unwrap(), Some(15));
    assert_eq!(file.get_u64("general.quantization_version").unwrap(), Some(2));
    assert_eq!(file.get_u64("qwen2.block_count").unwrap(), Some(28));
    assert_eq!(file.get_u64("qwen2.embedding_length").unwrap(), Some(1536));
    assert_eq!(file.get_u64("qwen2.attention.head_count_kv").unwrap(), Some(2));
    assert_eq!(file.get_f64("qwen2.rope.freq_base").unwrap(), Some(1e6));
    assert_eq!(file.get_bool("tokenizer.ggml.add_bos_token").unwrap(), Some(false));
    assert_eq!(file.get_u64("tokenizer.ggml.eos_token_id").unwrap(), Some(151645));
    let tokens = file.get_str_array("tokenizer.ggml.tokens").unwrap().unwrap();
    assert_eq!((tokens.len(), tokens[151645]), (151936, "<|im_end|>"));
    assert_eq!(file.get_i64_array("tokenizer.ggml.token_type").unwrap().unwrap().len(), 151936);
    assert_eq!(file.get_str_array("tokenizer.ggml.merges").unwrap().unwrap().len(), 151387);
    assert_eq!(file.get_str("tokenizer.chat_template").unwrap().map(|t| t.chars().count()), Some(2509));

    assert_eq!(count_types(&file, &[GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::F32]), [169, 29, 141]);
    assert_eq!(file.tensor("token_embd.weight").unwrap().ty, GgmlType::Q4_K);
    let output = file.tensor("output.weight").unwrap();
    assert_eq!((output.ty, &output.dims[..]), (GgmlType::Q6_K, &[1536, 151936][..]));
    assert_eq!(file.tensors.iter().map(|t| t.num_elements()).sum::<u64>(), 1_777_088_000);
    assert_eq!(data_end(&file), file.len());
    assert_eq!(file.len(), 1_117_320_768);
}

#[test]
fn qwen_0_5b_header() {
    let Some(path) = model_path("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf") else { return };
    let file = GgufFile::open(path).unwrap();
    assert_eq!((file.version, file.tensors.len(), file.metadata.len()), (3, 291, 26));
    assert_eq!(file.get_str("general.architecture").unwrap(), Some("qwen2"));
    let types = [GgmlType::Q5_0, GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::F32];
    assert_eq!(count_types(&file, &types), [133, 12, 12, 13, 121]);
    assert_eq!(file.tensors.iter().map(|t| t.num_elements()).sum::<u64>(), 630_167_424);
    assert_eq!(data_end(&file), file.len());
}

#[test]
fn smollm2_header() {
    let Some(path) = model_path("SmolLM2-135M-Instruct.Q4_1.gguf") else { return };
    let file = GgufFile::open(path).unwrap();
    assert_eq!((file.version, file.tensors.len(), file.metadata.len()), (3, 272, 33));
    assert_eq!(file.get_str("general.architecture").unwrap(), Some("llama"));
    assert_eq!(count_types(&file, &[GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::F32]), [210, 1, 61]);
    assert!(file.tensor("output.weight").is_none(), "SmolLM2 ties its embeddings");
    assert_eq!(file.tensors.iter().map(|t| t.num_elements()).sum::<u64>(), 134_515_008);
    assert_eq!(data_end(&file), file.len());
}
