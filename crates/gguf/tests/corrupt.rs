//! The GGUF reader on broken and hostile files: every one must give an `Err` whose message names the problem, and
//! none may panic, read out of bounds or allocate without limit.

use gguf::{GgmlType, GgufFile, GgufWriter, Value, ValueType};

/// A small valid file: a few metadata values (strings, arrays, a nested array) and three tensors.
fn valid_file() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.add("general.architecture", Value::String("llama".into()));
    w.add("llama.block_count", Value::U32(2));
    w.add(
        "tokenizer.ggml.tokens",
        Value::Array(ValueType::String, ["a", "bc", "<s>"].map(|s| Value::String(s.into())).to_vec()),
    );
    w.add("t.nested", Value::Array(ValueType::Array, vec![Value::Array(ValueType::I32, vec![Value::I32(-1)])]));
    w.add("t.f64", Value::F64(0.25));
    let x: Vec<f32> = (0..64).map(|i| (i as f32 - 30.0) / 9.0).collect();
    w.add_tensor("a.f32", &[4, 2], GgmlType::F32, x[..8].iter().flat_map(|v| v.to_le_bytes()).collect()).unwrap();
    w.add_tensor("b.q8_0", &[32, 2], GgmlType::Q8_0, gguf::quant::quantize(GgmlType::Q8_0, &x).unwrap()).unwrap();
    w.add_tensor("c.q4_0", &[64], GgmlType::Q4_0, gguf::quant::quantize(GgmlType::Q4_0, &x).unwrap()).unwrap();
    w.to_bytes()
}

/// The error message of parsing `bytes`, which must fail.
fn error_of(bytes: Vec<u8>) -> String {
    match GgufFile::from_bytes(bytes) {
        Ok(f) => panic!("parsed a broken file: {f:?}"),
        Err(e) => e.to_string(),
    }
}

fn assert_error(bytes: Vec<u8>, expected: &[&str]) {
    let msg = error_of(bytes);
    for part in expected {
        assert!(msg.contains(part), "error {msg:?} does not mention {part:?}");
    }
}

/// A hand-built file, for headers the writer refuses to produce.
#[derive(Default)]
struct Raw(Vec<u8>);

impl Raw {
    fn header(version: u32, num_tensors: u64, num_kv: u64) -> Raw {
        Raw::default().u32(gguf::MAGIC).u32(version).u64(num_tensors).u64(num_kv)
    }
    fn u32(mut self, v: u32) -> Raw {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(mut self, v: u64) -> Raw {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn bytes(mut self, b: &[u8]) -> Raw {
        self.0.extend_from_slice(b);
        self
    }
    fn str(self, s: &str) -> Raw {
        self.u64(s.len() as u64).bytes(s.as_bytes())
    }
    /// A metadata pair whose value is a u32.
    fn kv_u32(self, key: &str, v: u32) -> Raw {
        self.str(key).u32(ValueType::U32 as u32).u32(v)
    }
    fn tensor(self, name: &str, dims: &[u64], ty: u32, offset: u64) -> Raw {
        let mut r = self.str(name).u32(dims.len() as u32);
        for &d in dims {
            r = r.u64(d);
        }
        r.u32(ty).u64(offset)
    }
    /// Pads to 32 bytes and appends `n` bytes of tensor data.
    fn data(mut self, n: usize) -> Raw {
        self.0.resize(self.0.len().next_multiple_of(32) + n, 0);
        self
    }
}

#[test]
fn the_valid_file_parses() {
    let file = GgufFile::from_bytes(valid_file()).unwrap();
    assert_eq!(file.tensors.len(), 3);
    let raw = Raw::header(3, 1, 0).tensor("t", &[32], GgmlType::Q8_0.to_u32(), 0).data(34);
    GgufFile::from_bytes(raw.0).unwrap();
}

#[test]
fn truncated_anywhere_is_an_error() {
    let bytes = valid_file();
    for len in 0..bytes.len() {
        let msg = error_of(bytes[..len].to_vec());
        assert!(msg.contains("truncated") || msg.contains("exceeds the limit"), "length {len}: {msg}");
    }
}

#[test]
fn wrong_magic() {
    let mut bytes = valid_file();
    bytes[0..4].copy_from_slice(b"GGML");
    assert_error(bytes, &["not a GGUF file", "magic"]);
    assert_error(b"GGU".to_vec(), &["truncated", "magic"]);
    assert_error(Vec::new(), &["truncated", "magic"]);
}

#[test]
fn unsupported_version() {
    for version in [0, 1, 4, u32::MAX] {
        let mut bytes = valid_file();
        bytes[4..8].copy_from_slice(&version.to_le_bytes());
        assert_error(bytes, &["unsupported GGUF version", &version.to_string()]);
    }
}

#[test]
fn tensor_data_out_of_bounds() {
    let raw = Raw::header(3, 1, 0).tensor("w", &[32], GgmlType::Q8_0.to_u32(), 0).data(33);
    assert_error(raw.0, &["truncated", "data of tensor \"w\""]);
    let raw = Raw::header(3, 1, 0).tensor("w", &[32], GgmlType::Q8_0.to_u32(), 1 << 40).data(34);
    assert_error(raw.0, &["truncated", "data of tensor \"w\""]);
    let raw = Raw::header(3, 1, 0).tensor("w", &[32], GgmlType::Q8_0.to_u32(), u64::MAX - 31).data(34);
    assert_error(raw.0, &["truncated", "data of tensor \"w\""]);
}

#[test]
fn absurd_dimensions() {
    let f32_ty = GgmlType::F32.to_u32();
    let cases: [(&[u64], &[&str]); 6] = [
        (&[1 << 32, 1 << 32, 1 << 32], &["absurd size"]),
        (&[u64::MAX, 2], &["absurd size"]),
        (&[4, 0], &["zero dimension"]),
        (&[1, 1, 1, 1, 1], &["5 dimensions"]),
        (&[], &["0 dimensions"]),
        (&[1 << 47, 4], &["absurd size"]),
    ];
    for (dims, expected) in cases {
        let raw = Raw::header(3, 1, 0).tensor("w", dims, f32_ty, 0).data(64);
        assert_error(raw.0, &[&["tensor \"w\""], expected].concat());
    }
    let raw = Raw::header(3, 1, 0).tensor("q", &[33], GgmlType::Q4_0.to_u32(), 0).data(64);
    assert_error(raw.0, &["tensor \"q\"", "not a multiple of the Q4_0 block size 32"]);
    let raw = Raw::header(3, 1, 0).str("w").u32(u32::MAX).data(64);
    assert_error(raw.0, &["tensor \"w\"", "4294967295 dimensions"]);
}

#[test]
fn absurd_counts() {
    assert_error(Raw::header(3, 1 << 60, 0).data(64).0, &["tensor count", "1152921504606846976", "exceeds"]);
    assert_error(Raw::header(3, 0, 1 << 60).data(64).0, &["metadata count", "1152921504606846976", "exceeds"]);
    assert_error(Raw::header(3, u64::MAX, u64::MAX).0, &["exceeds"]);
    let array = Raw::header(3, 0, 1).str("k").u32(ValueType::Array as u32).u32(ValueType::U64 as u32).u64(1 << 61);
    assert_error(array.data(64).0, &["length of metadata \"k\"", "exceeds"]);
}

#[test]
fn huge_string_length() {
    assert_error(Raw::header(3, 0, 1).u64(u64::MAX).data(64).0, &["truncated", "metadata key #0"]);
    assert_error(Raw::header(3, 0, 1).u64(1 << 62).bytes(b"key").data(64).0, &["truncated", "metadata key #0"]);
    let value = Raw::header(3, 0, 1).str("k").u32(ValueType::String as u32).u64(u64::MAX - 3);
    assert_error(value.data(64).0, &["truncated", "metadata \"k\""]);
    let name = Raw::header(3, 1, 0).u64(u64::MAX / 2).data(64);
    assert_error(name.0, &["truncated", "tensor #0 name"]);
}

#[test]
fn bad_value_types() {
    for ty in [13, 99, u32::MAX] {
        let raw = Raw::header(3, 0, 1).str("k").u32(ty).data(64);
        assert_error(raw.0, &["unknown metadata value type", &ty.to_string(), "\"k\""]);
        let raw = Raw::header(3, 0, 1).str("k").u32(ValueType::Array as u32).u32(ty).u64(1).data(64);
        assert_error(raw.0, &["unknown metadata value type", &ty.to_string(), "\"k\""]);
    }
    let raw = Raw::header(3, 0, 1).str("k").u32(ValueType::Bool as u32).bytes(&[2]).data(64);
    assert_error(raw.0, &["\"k\"", "bool byte is 2"]);
    let raw = Raw::header(3, 1, 0).tensor("w", &[32], 4, 0).data(64);
    assert_error(raw.0, &["tensor \"w\"", "unknown ggml type 4"]);
    let raw = Raw::header(3, 0, 1).str("k\u{0}").bytes(&[0xff]).u32(ValueType::U8 as u32).bytes(&[1]).data(64);
    let mut bytes = raw.0;
    bytes[24 + 8..24 + 10].copy_from_slice(&[0xc3, 0x28]); // invalid UTF-8 in the key
    assert_error(bytes, &["invalid UTF-8", "metadata key #0"]);
}

#[test]
fn deep_nesting() {
    for depth in [9, 100, 100_000] {
        let mut raw = Raw::header(3, 0, 1).str("deep").u32(ValueType::Array as u32);
        for _ in 0..depth {
            raw = raw.u32(ValueType::Array as u32).u64(1);
        }
        let raw = raw.u32(ValueType::U8 as u32).u64(1).bytes(&[7]).data(64);
        assert_error(raw.0, &["\"deep\"", "nested deeper than 8"]);
    }
    let mut raw = Raw::header(3, 0, 1).str("ok").u32(ValueType::Array as u32);
    for _ in 0..7 {
        raw = raw.u32(ValueType::Array as u32).u64(1);
    }
    GgufFile::from_bytes(raw.u32(ValueType::U8 as u32).u64(1).bytes(&[7]).0).unwrap();
}

#[test]
fn misaligned_offset() {
    let raw = Raw::header(3, 1, 0).tensor("w", &[8], GgmlType::F32.to_u32(), 4).data(64);
    assert_error(raw.0, &["tensor \"w\"", "offset 4 is not a multiple of the alignment 32"]);
    let raw = Raw::header(3, 1, 1).kv_u32("general.alignment", 64).tensor("w", &[8], GgmlType::F32.to_u32(), 32);
    assert_error(raw.data(128).0, &["tensor \"w\"", "offset 32 is not a multiple of the alignment 64"]);
}

#[test]
fn bad_alignment() {
    for a in [0, 3, 48] {
        let raw = Raw::header(3, 0, 1).kv_u32("general.alignment", a).data(64);
        assert_error(raw.0, &["general.alignment", "power of two", &a.to_string()]);
    }
    let raw = Raw::header(3, 0, 1).str("general.alignment").u32(ValueType::String as u32).str("32").data(64);
    assert_error(raw.0, &["general.alignment", "expected an unsigned integer"]);
}

#[test]
fn duplicate_names() {
    let raw =
        Raw::header(3, 2, 0).tensor("w", &[8], GgmlType::F32.to_u32(), 0).tensor("w", &[8], GgmlType::F32.to_u32(), 32);
    assert_error(raw.data(64).0, &["duplicate tensor name", "\"w\""]);
    let raw = Raw::header(3, 0, 2).kv_u32("k", 1).kv_u32("k", 2).data(64);
    assert_error(raw.0, &["duplicate metadata key", "\"k\""]);
}

/// xorshift64*: a small deterministic generator, enough to pick bytes to damage.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Uses everything a parsed file offers, so that a bad table that slipped through would show up here.
fn use_everything(file: &GgufFile) {
    for (key, _) in &file.metadata {
        let _ = (file.get_str(key), file.get_u64(key), file.get_f64(key), file.get_bool(key));
        let _ = (file.get_str_array(key), file.get_i64_array(key));
    }
    for t in &file.tensors {
        let data = file.tensor_data(t);
        assert_eq!(data.len() as u64, t.size_bytes);
        let _ = (t.num_elements(), t.row_len(), t.num_rows());
        let mut out = vec![0f32; t.num_elements() as usize];
        let _ = gguf::quant::dequantize(t.ty, data, &mut out);
    }
}

#[test]
fn random_damage_never_panics() {
    const ITERATIONS: usize = 10_000;
    let valid = valid_file();
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let mut num_parsed = 0;
    for _ in 0..ITERATIONS {
        let mut bytes = valid.clone();
        for _ in 0..1 + rng.below(4) {
            let i = rng.below(bytes.len());
            bytes[i] = match rng.below(4) {
                0 => 0,
                1 => 0xff,
                2 => bytes[i] ^ (1 << rng.below(8)),
                _ => rng.next() as u8,
            };
        }
        if rng.below(8) == 0 {
            bytes.truncate(rng.below(bytes.len()));
        }
        if let Ok(file) = GgufFile::from_bytes(bytes) {
            use_everything(&file);
            num_parsed += 1;
        }
    }
    // Damage to tensor data or to metadata values still parses; the loop must have reached past the header.
    assert!(num_parsed > 1000, "only {num_parsed} of 10000 damaged files parsed");
}
