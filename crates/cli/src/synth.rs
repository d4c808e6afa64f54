//! `splash synth`: writes a synthetic GGUF with the exact shapes and per-tensor quant types of a real model (Qwen2.5
//! Coder 0.5B / 1.5B / 7B / 32B, Qwen3-30B-A3B Q4_K_M) and random but realistic values, with a working byte-level
//! BPE tokenizer.
//!
//! Real model files are too large to move to a GPU machine; these stand in for them in correctness checks and
//! benchmarks. Weights are normal with standard deviation `1/sqrt(cols)` (about what trained Qwen matrices show), norms
//! near 1, small biases; the output matrix is scaled so logits spread over a few units and the top token is clear.
//!
//! Speed: matrices are filled from pools of blocks quantized once per (type, scale) from normal values, each block
//! picked at random, so even the 32B shape (19 GB) is written in about a minute.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use gguf::{GgmlType, GgufWriter, Value, ValueType};

#[derive(clap::Args)]
pub struct Args {
    /// Which real model's shapes and tensor types to copy: qwen2.5-coder-0.5b, -1.5b, -7b, -32b (qwen2) or
    /// qwen3-30b-a3b (qwen3moe).
    #[arg(long, default_value = "qwen2.5-coder-1.5b")]
    like: String,
    /// q4_k_m (the real file's per-tensor types), or one type for every matrix: q4_0, q4_1, q5_0, q8_0, q4_k, q6_k,
    /// f16, f32.
    #[arg(long, default_value = "q4_k_m")]
    quant: String,
    /// Keep only the first N layers (0 = all), for quick tests.
    #[arg(long, default_value_t = 0)]
    layers: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[arg(long, short)]
    output: PathBuf,
}

/// Shapes of one model family member.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub name: &'static str,
    pub num_layers: usize,
    pub hidden: usize,
    pub ffn: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub vocab: usize,
    /// The layers whose attn_v / ffn_down get the bigger type in Q4_K_M, as in the real file (`None`: llama.cpp's
    /// `use_more_bits` rule).
    pub more_bits: Option<&'static [usize]>,
    /// Rows of `hidden` values are not a multiple of 256, so Q4_K_M falls back to Q5_0 / Q8_0 on them.
    pub small_row_fallback: bool,
    /// `None`: qwen2 (Q/K/V biases, head_dim = hidden / heads). `Some`: qwen3moe, expert-routed in every layer.
    pub moe: Option<Moe>,
}

/// A qwen3moe model's numbers beyond the dense ones.
#[derive(Debug, Clone, Copy)]
pub struct Moe {
    pub head_dim: usize,
    pub num_experts: usize,
    pub num_used: usize,
    pub expert_ffn: usize,
}

pub const SHAPES: [Shape; 5] = [
    Shape {
        name: "qwen2.5-coder-0.5b",
        num_layers: 24,
        hidden: 896,
        ffn: 4864,
        num_heads: 14,
        num_kv_heads: 2,
        vocab: 151936,
        more_bits: Some(&[0, 1, 3, 6, 7, 8, 9, 10, 13, 16, 19, 21]),
        small_row_fallback: true,
        moe: None,
    },
    Shape {
        name: "qwen2.5-coder-1.5b",
        num_layers: 28,
        hidden: 1536,
        ffn: 8960,
        num_heads: 12,
        num_kv_heads: 2,
        vocab: 151936,
        more_bits: Some(&[0, 1, 5, 6, 7, 8, 9, 10, 13, 16, 19, 21, 24, 27]),
        small_row_fallback: false,
        moe: None,
    },
    Shape {
        name: "qwen2.5-coder-7b",
        num_layers: 28,
        hidden: 3584,
        ffn: 18944,
        num_heads: 28,
        num_kv_heads: 4,
        vocab: 152064,
        more_bits: Some(&[0, 1, 5, 6, 7, 8, 9, 10, 13, 16, 19, 21, 24, 27]),
        small_row_fallback: false,
        moe: None,
    },
    Shape {
        name: "qwen2.5-coder-32b",
        num_layers: 64,
        hidden: 5120,
        ffn: 27648,
        num_heads: 40,
        num_kv_heads: 8,
        vocab: 152064,
        more_bits: None,
        small_row_fallback: false,
        moe: None,
    },
    // Qwen3-30B-A3B (and Qwen3-Coder-30B-A3B): `ffn` is the file's feed_forward_length, which no layer uses.
    Shape {
        name: "qwen3-30b-a3b",
        num_layers: 48,
        hidden: 2048,
        ffn: 6144,
        num_heads: 32,
        num_kv_heads: 4,
        vocab: 151936,
        more_bits: None,
        small_row_fallback: false,
        moe: Some(Moe { head_dim: 128, num_experts: 128, num_used: 8, expert_ffn: 768 }),
    },
];

fn use_more_bits(i: usize, n: usize) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// The tensor types of one matrix kind in the real Q4_K_M file.
#[derive(Clone, Copy)]
enum Kind {
    Embd,
    Output,
    AttnV,
    FfnDown,
    /// ffn_gate_inp, never quantized.
    Router,
    Other,
}

fn q4_k_m_type(s: &Shape, kind: Kind, layer: usize, num_layers: usize) -> GgmlType {
    let more = match s.more_bits {
        Some(list) if num_layers == s.num_layers => list.contains(&layer),
        _ => use_more_bits(layer, num_layers),
    };
    use GgmlType::*;
    // 896 is not a multiple of 256: llama.cpp falls back from Q4_K to Q5_0 and from Q6_K to Q8_0 on such rows.
    let (q4, q6) = if s.small_row_fallback { (Q5_0, Q8_0) } else { (Q4_K, Q6_K) };
    // llama.cpp's rules for MoE files (src/llama-quant.cpp) single out 8-expert models only (attn_k / attn_v Q8_0,
    // attn_output Q5_K); 128 experts take the dense rules, the experts' 3-D tensors those of their 2-D kind, the
    // router (ffn_gate_inp) and the norms stay f32.
    match kind {
        Kind::Embd => q4,
        Kind::Output => q6,
        Kind::AttnV if more => q6,
        // ffn_down rows are ffn long (a multiple of 256 in every shape), so they keep the K types.
        Kind::FfnDown if more => Q6_K,
        Kind::FfnDown => Q4_K,
        Kind::Router => F32,
        _ => q4,
    }
}

fn parse_type(s: &str) -> Result<GgmlType> {
    use GgmlType::*;
    Ok(match s.to_ascii_lowercase().as_str() {
        "q4_0" => Q4_0,
        "q4_1" => Q4_1,
        "q5_0" => Q5_0,
        "q5_1" => Q5_1,
        "q8_0" => Q8_0,
        "q4_k" => Q4_K,
        "q5_k" => Q5_K,
        "q6_k" => Q6_K,
        "f16" => F16,
        "f32" => F32,
        other => {
            bail!("unknown quant type {other:?} (q4_k_m, q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k, f16, f32)")
        }
    })
}

/// The engine's SplitMix64 generator, with uniform and normal draws for weights.
pub struct Rng(engine::sampler::Rng);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(engine::sampler::Rng::new(seed ^ 0x9E37_79B9_7F4A_7C15))
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }
    /// Uniform in (0, 1).
    pub fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 + 0.5) / (1u64 << 24) as f32
    }
    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f32 {
        let (u, v) = (self.uniform(), self.uniform());
        (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
    }
}

/// Blocks per pool: a matrix row picks each of its blocks at random from these.
const POOL_BLOCKS: usize = 4096;

/// Pools of quantized blocks, one per (type, standard deviation), shared by every matrix that needs one.
type Pools = std::collections::HashMap<(GgmlType, u32), Arc<Vec<u8>>>;

/// Bytes a matrix's writer buffers before each write.
const WRITE_CHUNK: usize = 1 << 20;

/// A matrix of `blocks` blocks of normal values with standard deviation `std`, encoded as `ty`: a function that
/// writes its bytes when the file is written (a 30B-A3B file is larger than the memory of the machines that make
/// it), each block picked at random from the (type, std) pool by a generator of its own seed.
fn random_blocks(
    ty: GgmlType,
    blocks: usize,
    std: f32,
    rng: &mut Rng,
    pools: &mut Pools,
) -> Result<impl Fn(&mut dyn Write) -> std::io::Result<()> + 'static> {
    let block_len = ty.block_len();
    let pool = match pools.entry((ty, std.to_bits())) {
        std::collections::hash_map::Entry::Occupied(e) => e.get().clone(),
        std::collections::hash_map::Entry::Vacant(e) => {
            let pool_vals: Vec<f32> = (0..POOL_BLOCKS * block_len).map(|_| rng.normal() * std).collect();
            let q = gguf::quant::quantize(ty, &pool_vals).with_context(|| format!("quantizing to {ty}"))?;
            e.insert(Arc::new(q)).clone()
        }
    };
    let (seed, block_bytes) = (rng.next_u64(), ty.block_bytes());
    Ok(move |w: &mut dyn Write| {
        let mut r = Rng::new(seed);
        let mut buf = Vec::with_capacity(WRITE_CHUNK + block_bytes);
        for _ in 0..blocks {
            let b = (r.next_u64() % POOL_BLOCKS as u64) as usize;
            buf.extend_from_slice(&pool[b * block_bytes..(b + 1) * block_bytes]);
            if buf.len() >= WRITE_CHUNK {
                w.write_all(&buf)?;
                buf.clear();
            }
        }
        w.write_all(&buf)
    })
}

fn f32_bytes(v: impl Iterator<Item = f32>) -> Vec<u8> {
    v.flat_map(|x| x.to_le_bytes()).collect()
}

/// GPT-2's byte-to-character map: printable bytes map to themselves, the rest to U+0100 upward.
fn byte_chars() -> [char; 256] {
    let mut out = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..256u32 {
        let printable = (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
        out[b as usize] = if printable {
            char::from_u32(b).expect("INVARIANT: below 256")
        } else {
            n += 1;
            char::from_u32(255 + n).expect("INVARIANT: below 512")
        };
    }
    out
}

const SPECIAL: [(&str, i32); 22] = [
    ("<|endoftext|>", 3),
    ("<|im_start|>", 3),
    ("<|im_end|>", 3),
    ("<|object_ref_start|>", 3),
    ("<|object_ref_end|>", 3),
    ("<|box_start|>", 3),
    ("<|box_end|>", 3),
    ("<|quad_start|>", 3),
    ("<|quad_end|>", 3),
    ("<|vision_start|>", 3),
    ("<|vision_end|>", 3),
    ("<|vision_pad|>", 3),
    ("<|image_pad|>", 3),
    ("<|video_pad|>", 3),
    ("<tool_call>", 4),
    ("</tool_call>", 4),
    ("<|fim_prefix|>", 3),
    ("<|fim_middle|>", 3),
    ("<|fim_suffix|>", 3),
    ("<|fim_pad|>", 3),
    ("<|repo_name|>", 3),
    ("<|file_sep|>", 3),
];

/// Ordinary (non-special) tokens in Qwen2.5's vocabulary; specials follow, then padding up to the embedding's rows.
const NUM_NORMAL: usize = 151_643;

const CHAT_TEMPLATE: &str = "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + \
message.content + '<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' \
}}{%- endif %}";

/// A byte-level BPE vocabulary of Qwen2.5's size: the 256 byte tokens, then merges building words from a space
/// marker and lowercase letters (2-, 3-, then 4-character tokens), then Qwen's special tokens and padding.
pub fn tokenizer_metadata(w: &mut GgufWriter, vocab: usize) {
    let bc = byte_chars();
    let mut tokens: Vec<String> = bc.iter().map(|c| c.to_string()).collect();
    let mut merges: Vec<String> = Vec::new();
    let letters: Vec<String> = (b'a'..=b'z').map(|b| (b as char).to_string()).collect();
    let mut level: Vec<String> =
        std::iter::once(bc[b' ' as usize].to_string()).chain(letters.iter().cloned()).collect();
    'outer: while tokens.len() < NUM_NORMAL {
        let mut next = Vec::new();
        for a in &level {
            for b in &letters {
                if tokens.len() >= NUM_NORMAL {
                    break 'outer;
                }
                merges.push(format!("{a} {b}"));
                let t = format!("{a}{b}");
                tokens.push(t.clone());
                next.push(t);
            }
        }
        level = next;
    }
    let mut types = vec![1i32; tokens.len()];
    for (s, ty) in SPECIAL {
        tokens.push(s.to_string());
        types.push(ty);
    }
    while tokens.len() < vocab {
        tokens.push(format!("[PAD{}]", tokens.len()));
        types.push(5);
    }
    let strs = |v: Vec<String>| Value::Array(ValueType::String, v.into_iter().map(Value::String).collect());
    w.add("tokenizer.ggml.model", Value::String("gpt2".into()));
    w.add("tokenizer.ggml.pre", Value::String("qwen2".into()));
    w.add("tokenizer.ggml.tokens", strs(tokens));
    w.add("tokenizer.ggml.token_type", Value::Array(ValueType::I32, types.into_iter().map(Value::I32).collect()));
    w.add("tokenizer.ggml.merges", strs(merges));
    w.add("tokenizer.ggml.eos_token_id", Value::U32(151645));
    w.add("tokenizer.ggml.padding_token_id", Value::U32(151643));
    w.add("tokenizer.ggml.bos_token_id", Value::U32(151643));
    w.add("tokenizer.ggml.add_bos_token", Value::Bool(false));
    w.add("tokenizer.chat_template", Value::String(CHAT_TEMPLATE.into()));
}

pub fn main(a: Args) -> Result<()> {
    let s = *SHAPES.iter().find(|s| s.name == a.like).with_context(|| {
        let names: Vec<_> = SHAPES.iter().map(|s| s.name).collect();
        format!("unknown --like {:?}; known: {}", a.like, names.join(", "))
    })?;
    let forced = if a.quant.eq_ignore_ascii_case("q4_k_m") { None } else { Some(parse_type(&a.quant)?) };
    let t0 = Instant::now();
    let w = build(&s, forced, a.layers, a.seed)?;
    w.write(&a.output).with_context(|| format!("writing {}", a.output.display()))?;
    let size = std::fs::metadata(&a.output).map(|m| m.len()).unwrap_or(0);
    eprintln!(
        "wrote {} ({} shape, {}, {:.2} GB) in {:.1} s",
        a.output.display(),
        s.name,
        a.quant,
        size as f64 / 1e9,
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Builds the file: its metadata and small vectors in memory, its matrices as writers of their bytes.
pub fn build(s: &Shape, forced: Option<GgmlType>, layers: usize, seed: u64) -> Result<GgufWriter> {
    let num_layers = if layers == 0 { s.num_layers } else { layers.min(s.num_layers) };
    let arch = if s.moe.is_some() { "qwen3moe" } else { "qwen2" };
    let head_dim = s.moe.map_or(s.hidden / s.num_heads, |m| m.head_dim);
    let (h, ffn, qd, kvd) = (s.hidden, s.ffn, s.num_heads * head_dim, s.num_kv_heads * head_dim);
    let mut w = GgufWriter::new();
    let key = |k: &str| format!("{arch}.{k}");
    w.add("general.architecture", Value::String(arch.into()));
    w.add("general.type", Value::String("model".into()));
    w.add("general.name", Value::String(format!("synthetic {} ({num_layers} layers)", s.name)));
    w.add(key("block_count"), Value::U32(num_layers as u32));
    w.add(key("context_length"), Value::U32(if s.moe.is_some() { 40960 } else { 32768 }));
    w.add(key("embedding_length"), Value::U32(h as u32));
    w.add(key("feed_forward_length"), Value::U32(ffn as u32));
    w.add(key("attention.head_count"), Value::U32(s.num_heads as u32));
    w.add(key("attention.head_count_kv"), Value::U32(s.num_kv_heads as u32));
    w.add(key("rope.freq_base"), Value::F32(1_000_000.0));
    w.add(key("attention.layer_norm_rms_epsilon"), Value::F32(1e-6));
    if let Some(m) = s.moe {
        w.add(key("attention.key_length"), Value::U32(head_dim as u32));
        w.add(key("attention.value_length"), Value::U32(head_dim as u32));
        w.add(key("expert_count"), Value::U32(m.num_experts as u32));
        w.add(key("expert_used_count"), Value::U32(m.num_used as u32));
        w.add(key("expert_feed_forward_length"), Value::U32(m.expert_ffn as u32));
    }
    w.add("general.file_type", Value::U32(if forced.is_none() { 15 } else { 0 }));
    tokenizer_metadata(&mut w, s.vocab);
    w.add("general.quantization_version", Value::U32(2));

    let mut rng = Rng::new(seed);
    // The router stays f32 even when one type is forced on every matrix, as llama.cpp's quantizer leaves it.
    let ty = |kind, layer| match (forced, kind) {
        (Some(_), Kind::Router) | (None, _) => q4_k_m_type(s, kind, layer, num_layers),
        (Some(t), _) => t,
    };
    let inv_sqrt = |n: usize| 1.0 / (n as f32).sqrt();
    let mut pools = Pools::new();
    // A tensor of ggml dims `dims` (`dims[0]` the row length) of normal values.
    let mut mat = |w: &mut GgufWriter, name: String, ty: GgmlType, dims: &[usize], std: f32| -> Result<()> {
        let block_len = ty.block_len();
        if !dims[0].is_multiple_of(block_len) {
            bail!("{name}: {ty} needs rows that are a multiple of {block_len} values; this shape has {}", dims[0]);
        }
        let blocks = dims.iter().product::<usize>() / block_len;
        let fill = random_blocks(ty, blocks, std, &mut rng, &mut pools).with_context(|| format!("tensor {name}"))?;
        let dims: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
        w.add_tensor_with(name, &dims, ty, fill)?;
        Ok(())
    };
    // Embedding rows of about unit norm; the output matrix makes logits of standard deviation about 3.
    mat(&mut w, "token_embd.weight".into(), ty(Kind::Embd, 0), &[h, s.vocab], inv_sqrt(h))?;
    let mut vrng = Rng::new(seed ^ 0x5EED);
    let mut vec_ = |w: &mut GgufWriter, name: String, n: usize, mean: f32, std: f32| -> Result<()> {
        let data = f32_bytes((0..n).map(|_| mean + std * vrng.normal()));
        w.add_tensor(name, &[n as u64], GgmlType::F32, data)?;
        Ok(())
    };
    for l in 0..num_layers {
        let n = |s: &str| format!("blk.{l}.{s}");
        vec_(&mut w, n("attn_norm.weight"), h, 1.0, 0.1)?;
        mat(&mut w, n("attn_q.weight"), ty(Kind::Other, l), &[h, qd], inv_sqrt(h))?;
        mat(&mut w, n("attn_k.weight"), ty(Kind::Other, l), &[h, kvd], inv_sqrt(h))?;
        mat(&mut w, n("attn_v.weight"), ty(Kind::AttnV, l), &[h, kvd], inv_sqrt(h))?;
        if s.moe.is_none() {
            vec_(&mut w, n("attn_q.bias"), qd, 0.0, 0.3)?;
            vec_(&mut w, n("attn_k.bias"), kvd, 0.0, 0.5)?;
            vec_(&mut w, n("attn_v.bias"), kvd, 0.0, 0.05)?;
        } else {
            vec_(&mut w, n("attn_q_norm.weight"), head_dim, 1.0, 0.1)?;
            vec_(&mut w, n("attn_k_norm.weight"), head_dim, 1.0, 0.1)?;
        }
        mat(&mut w, n("attn_output.weight"), ty(Kind::Other, l), &[qd, h], inv_sqrt(qd))?;
        vec_(&mut w, n("ffn_norm.weight"), h, 1.0, 0.1)?;
        match s.moe {
            None => {
                mat(&mut w, n("ffn_gate.weight"), ty(Kind::Other, l), &[h, ffn], inv_sqrt(h))?;
                mat(&mut w, n("ffn_up.weight"), ty(Kind::Other, l), &[h, ffn], inv_sqrt(h))?;
                mat(&mut w, n("ffn_down.weight"), ty(Kind::FfnDown, l), &[ffn, h], inv_sqrt(ffn))?;
            }
            Some(m) => {
                let (ne, f) = (m.num_experts, m.expert_ffn);
                // Router logits of a few units, so that routing is decided (no near-uniform softmax).
                mat(&mut w, n("ffn_gate_inp.weight"), ty(Kind::Router, l), &[h, ne], 2.0 * inv_sqrt(h))?;
                mat(&mut w, n("ffn_gate_exps.weight"), ty(Kind::Other, l), &[h, f, ne], inv_sqrt(h))?;
                mat(&mut w, n("ffn_up_exps.weight"), ty(Kind::Other, l), &[h, f, ne], inv_sqrt(h))?;
                mat(&mut w, n("ffn_down_exps.weight"), ty(Kind::FfnDown, l), &[f, h, ne], inv_sqrt(f))?;
            }
        }
    }
    vec_(&mut w, "output_norm.weight".into(), h, 1.0, 0.1)?;
    mat(&mut w, "output.weight".into(), ty(Kind::Output, 0), &[h, s.vocab], 3.0 * inv_sqrt(h))?;
    Ok(w)
}

#[cfg(test)]
mod tests {
    use super::*;
    use models::{Batch, LogitsWanted, Runner, SeqChunk, SeqId};

    /// A one-layer 0.5B-shape file: the Q4_K_M per-tensor types of the real file's first layer, a tokenizer that
    /// round-trips text, and a CPU forward pass whose logits are finite and spread out (not degenerate).
    #[test]
    fn synthetic_file_loads_tokenizes_and_runs() {
        let s = SHAPES[0];
        let bytes = build(&s, None, 1, 3).expect("build").to_bytes();
        let file = std::sync::Arc::new(gguf::GgufFile::from_bytes(bytes).expect("parse"));
        let ty = |n: &str| file.tensor(n).map(|t| t.ty);
        // Layer 0 of the real 0.5B file: attn_v Q8_0, ffn_down Q6_K, the rest Q5_0; output Q8_0, embedding Q5_0.
        assert_eq!(ty("blk.0.attn_q.weight"), Some(GgmlType::Q5_0));
        assert_eq!(ty("blk.0.attn_v.weight"), Some(GgmlType::Q8_0));
        assert_eq!(ty("blk.0.ffn_down.weight"), Some(GgmlType::Q6_K));
        assert_eq!(ty("output.weight"), Some(GgmlType::Q8_0));
        assert_eq!(ty("token_embd.weight"), Some(GgmlType::Q5_0));

        let tok = tokenizer::Tokenizer::from_gguf(&file).expect("tokenizer");
        let text = "def hello world():\n    return 42 <|im_end|>";
        let ids = tok.encode(text, true).expect("encode");
        assert_eq!(tok.decode(&ids), text);
        assert!(ids.contains(&151645), "<|im_end|> is a special token");

        let mut cpu = models::cpu::CpuRunner::new(file, 1).expect("runner");
        let b =
            Batch { chunks: vec![SeqChunk { seq: SeqId(1), tokens: &ids, start_pos: 0, logits: LogitsWanted::Last }] };
        let logits = cpu.forward(&b).expect("forward").to_vec();
        assert_eq!(logits.len(), s.vocab);
        assert!(logits.iter().all(|v| v.is_finite()));
        let mean = logits.iter().sum::<f32>() / logits.len() as f32;
        let std = (logits.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / logits.len() as f32).sqrt();
        assert!(std > 0.5 && std < 20.0, "logit spread {std}");
    }

    /// The qwen3-coder-30b-a3b pack records the tensor bytes of llama.cpp's Q4_K_M rule for the Qwen3-30B-A3B
    /// shapes (its file could not be read here): the full 48-layer layout this synthesiser lays out has those bytes,
    /// the experts' 3-D tensors included, and the same numbers of experts.
    #[test]
    fn the_moe_pack_records_the_q4_k_m_layout() {
        let s = *SHAPES.iter().find(|s| s.name == "qwen3-30b-a3b").expect("shape");
        let w = build(&s, None, 0, 1).expect("builds");
        let m = pack::pack("qwen3-coder-30b-a3b").expect("built in").target.shapes.expect("shapes");
        let e = m.experts.expect("experts");
        assert_eq!(w.tensors().map(|(_, _, b)| b).sum::<u64>(), m.weight_bytes);
        assert_eq!(w.tensors().filter(|(_, d, _)| d.len() == 3).map(|(_, _, b)| b).sum::<u64>(), e.bytes);
        let moe = s.moe.expect("a MoE shape");
        assert_eq!((moe.num_experts, moe.num_used, moe.expert_ffn), (e.num_experts, e.num_used, e.expert_ffn));
        assert_eq!((s.num_layers, s.hidden, s.num_heads, s.num_kv_heads), (48, 2048, 32, 4));
        assert_eq!(
            (m.model.num_layers, m.model.hidden_size, m.model.num_heads, m.model.num_kv_heads),
            (48, 2048, 32, 4)
        );
        assert_eq!((moe.head_dim, s.vocab), (m.model.head_dim, m.model.vocab_size));
        assert_eq!(w.tensors().count(), 3 + 48 * 12, "579 tensors");
    }

    /// A one-layer Qwen3-30B-A3B file: qwen3moe with the real file's tensor names, 3-D expert shapes and Q4_K_M
    /// types (layer 0 of 1 takes llama.cpp's "more bits": attn_v and ffn_down_exps Q6_K; the router f32), which the
    /// CPU runner loads (experts left in the file) and runs to finite, spread logits.
    #[test]
    fn synthetic_moe_file_has_the_real_shapes_and_runs() {
        let s = *SHAPES.iter().find(|s| s.name == "qwen3-30b-a3b").expect("shape");
        let bytes = build(&s, None, 1, 3).expect("build").to_bytes();
        let file = std::sync::Arc::new(gguf::GgufFile::from_bytes(bytes).expect("parse"));
        let t = |n: &str| file.tensor(n).map(|t| (t.ty, t.dims.clone()));
        assert_eq!(t("blk.0.ffn_gate_exps.weight"), Some((GgmlType::Q4_K, vec![2048, 768, 128])));
        assert_eq!(t("blk.0.ffn_up_exps.weight"), Some((GgmlType::Q4_K, vec![2048, 768, 128])));
        assert_eq!(t("blk.0.ffn_down_exps.weight"), Some((GgmlType::Q6_K, vec![768, 2048, 128])));
        assert_eq!(t("blk.0.ffn_gate_inp.weight"), Some((GgmlType::F32, vec![2048, 128])));
        assert_eq!(t("blk.0.attn_q.weight"), Some((GgmlType::Q4_K, vec![2048, 4096])));
        assert_eq!(t("blk.0.attn_v.weight"), Some((GgmlType::Q6_K, vec![2048, 512])));
        assert_eq!(t("output.weight"), Some((GgmlType::Q6_K, vec![2048, 151936])));

        let mut cpu = models::cpu::CpuRunner::new(file, 2).expect("runner");
        let ids = [1u32, 2, 3, 4, 5];
        let b =
            Batch { chunks: vec![SeqChunk { seq: SeqId(1), tokens: &ids, start_pos: 0, logits: LogitsWanted::Last }] };
        let logits = cpu.forward(&b).expect("forward").to_vec();
        assert!(logits.len() == s.vocab && logits.iter().all(|v| v.is_finite()));
        let mean = logits.iter().sum::<f32>() / logits.len() as f32;
        let std = (logits.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / logits.len() as f32).sqrt();
        assert!(std > 0.5 && std < 20.0, "logit spread {std}");
    }
}
