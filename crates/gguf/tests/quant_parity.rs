//! `gguf::quant` against independent references: gguf-py's numpy (de)quantizers and ggml's own
//! `quantize_row_*_ref` / `dequantize_row_*`, as recorded in `fixtures/quant/<TYPE>.gguf` by
//! `scripts/fixtures/gen_quant_fixtures.py`.
//!
//! Every comparison is bitwise: our reference code performs the same `f32` operations in the same order as ggml.
//! Besides the few blocks stored in each fixture, SHA-256 digests cover 65536 values per type, generated here and
//! in the script by the same xorshift generator.

use std::path::PathBuf;

use gguf::{GgmlType, GgufFile, quant};
use sha2::{Digest, Sha256};

const TYPES: [GgmlType; 15] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q8_1,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q8_K,
];

struct Fixture {
    ty: GgmlType,
    file: GgufFile,
}

impl Fixture {
    fn open(ty: GgmlType) -> Fixture {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../../fixtures/quant/{ty}.gguf"));
        let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(file.get_str("fixture.type").unwrap(), Some(ty.name()));
        Fixture { ty, file }
    }

    /// Raw bytes of a tensor, checking that it has the expected element type.
    fn bytes(&self, name: &str, ty: GgmlType) -> Option<&[u8]> {
        let info = self.file.tensor(name)?;
        assert_eq!(info.ty, ty, "{}: tensor {name} has type {}", self.ty, info.ty);
        Some(self.file.tensor_data(info))
    }

    fn floats(&self, name: &str) -> Vec<f32> {
        let bytes = self.bytes(name, GgmlType::F32).unwrap_or_else(|| panic!("{}: no tensor {name}", self.ty));
        bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
    }

    fn sources(&self) -> Vec<&str> {
        self.file.get_str_array("fixture.dequant.sources").unwrap().unwrap_or_default()
    }
}

/// Index of the first element whose bits differ, if any.
fn first_bit_difference(a: &[f32], b: &[f32]) -> Option<usize> {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).position(|(x, y)| x.to_bits() != y.to_bits())
}

#[test]
fn dequantize_matches_reference_bitwise() {
    for ty in TYPES {
        let fx = Fixture::open(ty);
        let blocks = fx.bytes("dequant.blocks", ty).expect("dequant.blocks");
        let expected = fx.floats("dequant.expected");
        let mut out = vec![f32::NAN; expected.len()];
        quant::dequantize(ty, blocks, &mut out).unwrap();
        if let Some(i) = first_bit_difference(&out, &expected) {
            let block = i / ty.block_len();
            let source = fx.sources();
            panic!(
                "{ty}: element {i} (block {block}, from {:?}) is {:e} ({:#010x}), oracle {} says {:e} ({:#010x})",
                source.get(block),
                out[i],
                out[i].to_bits(),
                fx.file.get_str("fixture.dequant.oracle").unwrap().unwrap_or("?"),
                expected[i],
                expected[i].to_bits()
            );
        }
    }
}

#[test]
fn fixtures_cover_real_model_blocks() {
    for ty in [GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K] {
        let fx = Fixture::open(ty);
        assert!(fx.sources().iter().any(|s| s.contains(".gguf:")), "{ty}: no block from a real model");
    }
}

/// Compares our quantization of `quantize.input` with the reference's bytes, block by block.
fn check_quantize(fx: &Fixture, reference: &str) -> bool {
    let ty = fx.ty;
    let Some(expected) = fx.bytes(reference, ty) else { return false };
    let input = fx.floats("quantize.input");
    let ours = quant::quantize(ty, &input).unwrap();
    assert_eq!(ours.len(), expected.len(), "{ty}: {reference} length");
    let block_bytes = ty.block_bytes();
    for (i, (a, b)) in ours.chunks(block_bytes).zip(expected.chunks(block_bytes)).enumerate() {
        assert_eq!(a, b, "{ty}: block {i} differs from {reference}");
    }
    true
}

#[test]
fn quantize_matches_ggml_reference_bitwise() {
    for ty in TYPES {
        let fx = Fixture::open(ty);
        let has_ggml = check_quantize(&fx, "quantize.ggml");
        assert!(has_ggml || matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16), "{ty}: no ggml data");
    }
}

#[test]
fn quantize_matches_gguf_py_bitwise() {
    let mut num_checked = 0;
    for ty in TYPES {
        num_checked += check_quantize(&Fixture::open(ty), "quantize.gguf_py") as usize;
    }
    // gguf-py quantizes F32, F16, BF16 and the five legacy weight formats, not the K formats.
    assert_eq!(num_checked, 8);
}

/// Root-mean-square error of quantize → dequantize relative to the input's RMS, on weight-like data.
fn relative_rmse(ty: GgmlType, x: &[f32]) -> f32 {
    let q = quant::quantize(ty, x).unwrap();
    let mut y = vec![0f32; x.len()];
    quant::dequantize(ty, &q, &mut y).unwrap();
    let err: f32 = x.iter().zip(&y).map(|(a, b)| (a - b) * (a - b)).sum();
    let norm: f32 = x.iter().map(|a| a * a).sum();
    (err / norm).sqrt()
}

#[test]
fn round_trip_error_is_small() {
    // A deterministic pseudo-normal sequence (sum of uniforms), like weights with a few larger values.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut uniform = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    };
    let x: Vec<f32> = (0..256 * 64).map(|_| (0..4).map(|_| uniform()).sum::<f32>() * 0.02).collect();
    let limits = [
        (GgmlType::F32, 0.0),
        (GgmlType::F16, 5e-4),
        (GgmlType::BF16, 3e-3),
        (GgmlType::Q8_0, 0.008),
        (GgmlType::Q8_1, 0.008),
        (GgmlType::Q8_K, 0.008),
        (GgmlType::Q6_K, 0.025),
        (GgmlType::Q5_0, 0.05),
        (GgmlType::Q5_1, 0.05),
        (GgmlType::Q5_K, 0.05),
        (GgmlType::Q4_0, 0.1),
        (GgmlType::Q4_1, 0.1),
        (GgmlType::Q4_K, 0.1),
        (GgmlType::Q3_K, 0.2),
        (GgmlType::Q2_K, 0.35),
    ];
    for (ty, limit) in limits {
        let e = relative_rmse(ty, &x);
        assert!(e <= limit, "{ty}: relative RMS error {e} exceeds {limit}");
    }
}

/// xorshift64 with shifts (13, 7, 17), as `xorshift` in the fixture script.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// The script's `digest_floats`: weight-like values with outliers, zero and one-sided blocks.
fn digest_floats(ty: GgmlType, seed: u64, num_values: usize) -> Vec<f32> {
    let mut rng = XorShift(seed);
    let block_len = ty.block_len();
    (0..num_values)
        .map(|i| {
            let u: [f32; 4] = std::array::from_fn(|_| (rng.next() >> 40) as f32 / (1 << 24) as f32 - 0.5);
            let (b, r) = (i / block_len, i % block_len);
            let mut v = ((u[0] + u[1]) + u[2]) + u[3];
            v *= 2f32.powi(-((b % 8 + 2) as i32));
            if i % 97 == 0 {
                v *= 16.0;
            }
            if b % 16 == 5 || (b % 16 == 9 && r < block_len / 2) {
                v = 0.0;
            }
            if b % 16 == 13 { v.abs() } else { v }
        })
        .collect()
}

/// The script's `digest_bytes`: random blocks for `num_values` elements.
fn digest_bytes(ty: GgmlType, seed: u64, num_values: usize) -> Vec<u8> {
    let mut rng = XorShift(seed);
    (0..num_values / ty.block_len() * ty.block_bytes()).map(|_| (rng.next() >> 56) as u8).collect()
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn large_inputs_match_reference_digests() {
    for ty in TYPES {
        let fx = Fixture::open(ty);
        let num_values = fx.file.get_u64("fixture.digest.num_values").unwrap().unwrap() as usize;
        let seed = fx.file.get_u64("fixture.digest.seed").unwrap().unwrap();
        let q = quant::quantize(ty, &digest_floats(ty, seed, num_values)).unwrap();
        for key in ["fixture.digest.quantize.ggml", "fixture.digest.quantize.gguf_py"] {
            if let Some(expected) = fx.file.get_str(key).unwrap() {
                assert_eq!(sha256_hex(&q), expected, "{ty}: quantized digest input differs from {key}");
            }
        }
        let mut y = vec![0f32; num_values];
        quant::dequantize(ty, &digest_bytes(ty, seed + 1000, num_values), &mut y).unwrap();
        let bits: Vec<u8> =
            y.iter().flat_map(|v| if v.is_nan() { 0x7fc0_0000 } else { v.to_bits() }.to_le_bytes()).collect();
        let expected = fx.file.get_str("fixture.digest.dequant").unwrap().unwrap();
        assert_eq!(sha256_hex(&bits), expected, "{ty}: dequantized random blocks differ from the oracle");
    }
}
