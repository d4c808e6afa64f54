//! `splash synth`: writes a synthetic GGUF with the exact shapes and per-tensor quant types of a real model (Qwen2.5
//! Coder 0.5B / 1.5B / 7B / 32B, Qwen3-30B-A3B, and the hybrids Qwen3.6-35B-A3B and Qwen3.8-27B, Q4_K_M) and random
//! but realistic values, with a working tokenizer: a byte-level BPE one of Qwen2.5's size, or for the hybrids the
//! real Qwen3.6 vocabulary (fixtures/tokenizer/qwen3.6-vocab.gguf.gz) and the Qwen3.5 chat template.
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
    /// Which real model's shapes and tensor types to copy: qwen2.5-coder-0.5b, -1.5b, -7b, -32b (qwen2),
    /// qwen3-30b-a3b (qwen3moe), qwen3.6-35b-a3b (qwen35moe) or qwen3.8-27b (qwen35).
    #[arg(long, default_value = "qwen2.5-coder-1.5b")]
    like: String,
    /// q4_k_m (the real file's per-tensor types), or one type for every matrix: q4_0, q4_1, q5_0, q8_0, q4_k, q6_k,
    /// f16, f32.
    #[arg(long, default_value = "q4_k_m")]
    quant: String,
    /// Keep only the first N layers (0 = all), for quick tests (a hybrid keeps its MTP block after them).
    #[arg(long, default_value_t = 0)]
    layers: usize,
    /// Write the header only, the tensor data left a hole that reads as zeros (no disk used where the file system
    /// makes sparse files): for `splash plan` on a full shape, not for running.
    #[arg(long)]
    header_only: bool,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[arg(long, short)]
    output: PathBuf,
}

/// Shapes of one model family member.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub name: &'static str,
    /// Trunk layers (a hybrid's MTP blocks come after them).
    pub num_layers: usize,
    pub hidden: usize,
    /// The dense FFN's width (`feed_forward_length`); 0 where the file records none (qwen35moe).
    pub ffn: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub vocab: usize,
    /// The layers whose attn_v / ffn_down get the bigger type in Q4_K_M, as in the real file (`None`: llama.cpp's
    /// `use_more_bits` rule).
    pub more_bits: Option<&'static [usize]>,
    /// Rows of `hidden` values are not a multiple of 256, so Q4_K_M falls back to Q5_0 / Q8_0 on them.
    pub small_row_fallback: bool,
    /// `None`: qwen2 (Q/K/V biases, head_dim = hidden / heads) or qwen35. `Some`: expert-routed in every layer
    /// (qwen3moe, or with `hybrid` qwen35moe).
    pub moe: Option<Moe>,
    /// `Some`: a Qwen3.5/3.6 hybrid (qwen35, or with `moe` qwen35moe).
    pub hybrid: Option<Hybrid>,
}

/// An expert-routed model's numbers beyond the dense ones.
#[derive(Debug, Clone, Copy)]
pub struct Moe {
    pub head_dim: usize,
    pub num_experts: usize,
    pub num_used: usize,
    pub expert_ffn: usize,
    /// The shared expert's width (qwen35moe), behind its sigmoid gate.
    pub shared_ffn: Option<usize>,
}

/// A Qwen3.5/3.6 hybrid's numbers: Gated DeltaNet layers, every `interval`-th layer gated attention (query and
/// output gate in `attn_q`, per-head Q/K norms, RoPE over `rope_dim` of `head_dim`), MTP blocks after the trunk.
#[derive(Debug, Clone, Copy)]
pub struct Hybrid {
    pub head_dim: usize,
    pub rope_dim: usize,
    pub num_k_heads: usize,
    pub num_v_heads: usize,
    pub head_k_dim: usize,
    pub head_v_dim: usize,
    pub conv_kernel: usize,
    pub interval: usize,
    /// MTP (`nextn`) blocks: a gated-attention layer with the model's FFN, `eh_proj` and three norms each.
    pub num_mtp: usize,
    pub context: usize,
}

/// The hybrids' Gated DeltaNet and attention numbers other than head counts (Qwen3.5/3.6 configs: head dims 128 and
/// 256, 64 rotated dims, conv kernel 4, attention every 4th layer, one MTP layer, a 262,144-token context).
const QWEN35_HYBRID: Hybrid = Hybrid {
    head_dim: 256,
    rope_dim: 64,
    num_k_heads: 16,
    num_v_heads: 0,
    head_k_dim: 128,
    head_v_dim: 128,
    conv_kernel: 4,
    interval: 4,
    num_mtp: 1,
    context: 262_144,
};

/// The Qwen3.5/3.6 vocabulary: 248,044 ranks and 33 specials padded to the embedding's rows.
const QWEN35_VOCAB: usize = 248_320;

pub const SHAPES: [Shape; 7] = [
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
        hybrid: None,
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
        hybrid: None,
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
        hybrid: None,
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
        hybrid: None,
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
        moe: Some(Moe { head_dim: 128, num_experts: 128, num_used: 8, expert_ffn: 768, shared_ffn: None }),
        hybrid: None,
    },
    // The hybrids (shapes: ../shared/reference/qwen-next.md; the public Qwen3.5-35B-A3B / -27B configs, which
    // Qwen3.6-35B-A3B and Qwen3.8-27B keep).
    Shape {
        name: "qwen3.6-35b-a3b",
        num_layers: 40,
        hidden: 2048,
        ffn: 0,
        num_heads: 16,
        num_kv_heads: 2,
        vocab: QWEN35_VOCAB,
        more_bits: None,
        small_row_fallback: false,
        moe: Some(Moe { head_dim: 256, num_experts: 256, num_used: 8, expert_ffn: 512, shared_ffn: Some(512) }),
        hybrid: Some(Hybrid { num_v_heads: 32, ..QWEN35_HYBRID }),
    },
    Shape {
        name: "qwen3.8-27b",
        num_layers: 64,
        hidden: 5120,
        ffn: 17408,
        num_heads: 24,
        num_kv_heads: 4,
        vocab: QWEN35_VOCAB,
        more_bits: None,
        small_row_fallback: false,
        moe: None,
        hybrid: Some(Hybrid { num_v_heads: 48, ..QWEN35_HYBRID }),
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
    /// Never quantized: the routers (ffn_gate_inp, and ffn_gate_inp_shexp, one row that ggml counts as 1-D) and the
    /// Gated DeltaNet's conv (ssm_conv1d, which the converter writes f32 and llama-quantize skips).
    Float,
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
    // attn_output Q5_K); 128 and 256 experts take the dense rules, the experts' 3-D tensors (and the shared
    // expert's) those of their 2-D kind, the routers and the norms stay f32. In a hybrid, llama.cpp counts the Gated
    // DeltaNet's attn_qkv as attn_v-like (more bits on the same layers); ssm_alpha / ssm_beta / ssm_out / attn_gate
    // and the MTP block's eh_proj take the default type. `num_layers` counts the MTP blocks (the quantizer's
    // `n_layer_all`).
    match kind {
        Kind::Embd => q4,
        Kind::Output => q6,
        Kind::AttnV if more => q6,
        // ffn_down rows are ffn long (a multiple of 256 in every shape), so they keep the K types.
        Kind::FfnDown if more => Q6_K,
        Kind::FfnDown => Q4_K,
        Kind::Float => F32,
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

/// The Qwen3.6 vocabulary as the vendored converter writes it (scripts/fixtures/qwen35_tokenizer.py), gzipped.
const QWEN36_VOCAB_GZ: &[u8] = include_bytes!("../../../fixtures/tokenizer/qwen3.6-vocab.gguf.gz");
/// The Qwen3.5 chat template (thinking on by default, XML tool calls), as the real files carry it.
const QWEN35_CHAT_TEMPLATE: &str = include_str!("../../../fixtures/hf/qwen35.chat_template.jinja");

/// The real Qwen3.5/3.6 tokenizer: every `tokenizer.*` key of the Qwen3.6 vocabulary (248,320 tokens with the
/// padding, merges, the `qwen35` pre-tokenizer, end-of-turn and padding ids), no BOS, and the Qwen3.5 template.
pub fn qwen36_tokenizer_metadata(w: &mut GgufWriter) -> Result<()> {
    use std::io::Read;
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(QWEN36_VOCAB_GZ)
        .read_to_end(&mut bytes)
        .context("unpacking the Qwen3.6 vocabulary")?;
    let vocab = gguf::GgufFile::from_bytes(bytes).context("reading the Qwen3.6 vocabulary")?;
    for (k, v) in vocab.metadata.iter().filter(|(k, _)| k.starts_with("tokenizer.")) {
        w.add(k.clone(), v.clone());
    }
    w.add("tokenizer.ggml.bos_token_id", Value::U32(248_044));
    w.add("tokenizer.ggml.add_bos_token", Value::Bool(false));
    w.add("tokenizer.chat_template", Value::String(QWEN35_CHAT_TEMPLATE.into()));
    Ok(())
}

pub fn main(a: Args) -> Result<()> {
    let s = *SHAPES.iter().find(|s| s.name == a.like).with_context(|| {
        let names: Vec<_> = SHAPES.iter().map(|s| s.name).collect();
        format!("unknown --like {:?}; known: {}", a.like, names.join(", "))
    })?;
    let forced = if a.quant.eq_ignore_ascii_case("q4_k_m") { None } else { Some(parse_type(&a.quant)?) };
    let t0 = Instant::now();
    let w = build(&s, forced, a.layers, a.seed)?;
    let written = if a.header_only { w.write_header_only(&a.output) } else { w.write(&a.output) };
    written.with_context(|| format!("writing {}", a.output.display()))?;
    let size = std::fs::metadata(&a.output).map(|m| m.len()).unwrap_or(0);
    eprintln!(
        "wrote {} ({} shape, {}, {:.2} GB{}) in {:.1} s",
        a.output.display(),
        s.name,
        a.quant,
        size as f64 / 1e9,
        if a.header_only { ", header only" } else { "" },
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Builds the file: its metadata and small vectors in memory, its matrices as writers of their bytes.
pub fn build(s: &Shape, forced: Option<GgmlType>, layers: usize, seed: u64) -> Result<GgufWriter> {
    let num_layers = if layers == 0 { s.num_layers } else { layers.min(s.num_layers) };
    let num_mtp = s.hybrid.map_or(0, |hy| hy.num_mtp);
    // Blocks in the file: the trunk's, then the MTP blocks.
    let num_blocks = num_layers + num_mtp;
    let arch = match (s.hybrid, s.moe) {
        (None, None) => "qwen2",
        (None, Some(_)) => "qwen3moe",
        (Some(_), None) => "qwen35",
        (Some(_), Some(_)) => "qwen35moe",
    };
    let head_dim = match (s.hybrid, s.moe) {
        (Some(hy), _) => hy.head_dim,
        (None, Some(m)) => m.head_dim,
        (None, None) => s.hidden / s.num_heads,
    };
    let (h, ffn, qd, kvd) = (s.hidden, s.ffn, s.num_heads * head_dim, s.num_kv_heads * head_dim);
    // Which blocks are Gated DeltaNet: every `interval`-th trunk layer and the MTP blocks are attention.
    let recurrent: Vec<bool> =
        (0..num_blocks).map(|i| s.hybrid.is_some_and(|hy| i < num_layers && (i + 1) % hy.interval != 0)).collect();
    let mut w = GgufWriter::new();
    let key = |k: &str| format!("{arch}.{k}");
    let context = match (s.hybrid, s.moe) {
        (Some(hy), _) => hy.context,
        (None, Some(_)) => 40960,
        (None, None) => 32768,
    };
    w.add("general.architecture", Value::String(arch.into()));
    w.add("general.type", Value::String("model".into()));
    w.add("general.name", Value::String(format!("synthetic {} ({num_layers} layers)", s.name)));
    w.add(key("block_count"), Value::U32(num_blocks as u32));
    w.add(key("context_length"), Value::U32(context as u32));
    w.add(key("embedding_length"), Value::U32(h as u32));
    if ffn > 0 {
        w.add(key("feed_forward_length"), Value::U32(ffn as u32));
    }
    w.add(key("attention.head_count"), Value::U32(s.num_heads as u32));
    w.add(key("attention.head_count_kv"), Value::U32(s.num_kv_heads as u32));
    w.add(key("rope.freq_base"), Value::F32(if s.hybrid.is_some() { 10_000_000.0 } else { 1_000_000.0 }));
    w.add(key("attention.layer_norm_rms_epsilon"), Value::F32(1e-6));
    if s.moe.is_some() || s.hybrid.is_some() {
        w.add(key("attention.key_length"), Value::U32(head_dim as u32));
        w.add(key("attention.value_length"), Value::U32(head_dim as u32));
    }
    if let Some(m) = s.moe {
        w.add(key("expert_count"), Value::U32(m.num_experts as u32));
        w.add(key("expert_used_count"), Value::U32(m.num_used as u32));
        w.add(key("expert_feed_forward_length"), Value::U32(m.expert_ffn as u32));
        if let Some(f) = m.shared_ffn {
            w.add(key("expert_shared_feed_forward_length"), Value::U32(f as u32));
        }
    }
    if let Some(hy) = s.hybrid {
        // As the converter writes a Qwen3.5 checkpoint (conversion/qwen.py): the MTP blocks counted in
        // block_count, the layer kinds both as an array (from `layer_types`) and as the interval.
        let u32s = |v: &[usize]| Value::Array(ValueType::U32, v.iter().map(|&x| Value::U32(x as u32)).collect());
        w.add(key("nextn_predict_layers"), Value::U32(hy.num_mtp as u32));
        w.add(key("rope.dimension_count"), Value::U32(hy.rope_dim as u32));
        w.add(key("rope.dimension_sections"), u32s(&[11, 11, 10, 0]));
        w.add(key("ssm.conv_kernel"), Value::U32(hy.conv_kernel as u32));
        w.add(key("ssm.state_size"), Value::U32(hy.head_k_dim as u32));
        w.add(key("ssm.group_count"), Value::U32(hy.num_k_heads as u32));
        w.add(key("ssm.time_step_rank"), Value::U32(hy.num_v_heads as u32));
        w.add(key("ssm.inner_size"), Value::U32((hy.num_v_heads * hy.head_v_dim) as u32));
        let flags = recurrent.iter().map(|&r| Value::Bool(r)).collect();
        w.add(key("attention.recurrent_layers"), Value::Array(ValueType::Bool, flags));
        w.add(key("full_attention_interval"), Value::U32(hy.interval as u32));
    }
    w.add("general.file_type", Value::U32(if forced.is_none() { 15 } else { 0 }));
    if s.hybrid.is_some() {
        if s.vocab != QWEN35_VOCAB {
            bail!("{}: the Qwen3.6 tokenizer has {QWEN35_VOCAB} tokens, the shape {}", s.name, s.vocab);
        }
        qwen36_tokenizer_metadata(&mut w)?;
    } else {
        tokenizer_metadata(&mut w, s.vocab);
    }
    w.add("general.quantization_version", Value::U32(2));

    let mut rng = Rng::new(seed);
    // The routers and the conv stay f32 even when one type is forced on every matrix, as llama.cpp's quantizer
    // leaves them.
    let ty = |kind, layer| match (forced, kind) {
        (Some(_), Kind::Float) | (None, _) => q4_k_m_type(s, kind, layer, num_blocks),
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
    // A vector (or, with `dims`, an f32 tensor) of values drawn by `draw`.
    let mut vec_with = |w: &mut GgufWriter, name: String, dims: &[usize], draw: &dyn Fn(&mut Rng) -> f32| {
        let n = dims.iter().product::<usize>();
        let data = f32_bytes((0..n).map(|_| draw(&mut vrng)));
        let dims: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
        w.add_tensor(name, &dims, GgmlType::F32, data)
    };
    let normal = |mean: f32, std: f32| move |r: &mut Rng| mean + std * r.normal();
    for (l, &is_recurrent) in recurrent.iter().enumerate() {
        let n = |s: &str| format!("blk.{l}.{s}");
        vec_with(&mut w, n("attn_norm.weight"), &[h], &normal(1.0, 0.1))?;
        if l >= num_layers {
            // The MTP block: the next token's embedding and the trunk's hidden state, normed, projected from
            // 2·hidden to hidden, then a gated-attention layer and the FFN, and its own head norm.
            mat(&mut w, n("nextn.eh_proj.weight"), ty(Kind::Other, l), &[2 * h, h], inv_sqrt(2 * h))?;
            for t in ["nextn.enorm.weight", "nextn.hnorm.weight", "nextn.shared_head_norm.weight"] {
                vec_with(&mut w, n(t), &[h], &normal(1.0, 0.1))?;
            }
        }
        if let (Some(hy), true) = (s.hybrid, is_recurrent) {
            deltanet_layer(&mut w, &mut mat, &mut vec_with, &n, &ty, l, h, &hy)?;
        } else {
            // A hybrid's gated attention holds each head's query, then its output gate, in attn_q.
            let q_rows = if s.hybrid.is_some() { 2 * qd } else { qd };
            mat(&mut w, n("attn_q.weight"), ty(Kind::Other, l), &[h, q_rows], inv_sqrt(h))?;
            mat(&mut w, n("attn_k.weight"), ty(Kind::Other, l), &[h, kvd], inv_sqrt(h))?;
            mat(&mut w, n("attn_v.weight"), ty(Kind::AttnV, l), &[h, kvd], inv_sqrt(h))?;
            if s.moe.is_none() && s.hybrid.is_none() {
                vec_with(&mut w, n("attn_q.bias"), &[qd], &normal(0.0, 0.3))?;
                vec_with(&mut w, n("attn_k.bias"), &[kvd], &normal(0.0, 0.5))?;
                vec_with(&mut w, n("attn_v.bias"), &[kvd], &normal(0.0, 0.05))?;
            } else {
                vec_with(&mut w, n("attn_q_norm.weight"), &[head_dim], &normal(1.0, 0.1))?;
                vec_with(&mut w, n("attn_k_norm.weight"), &[head_dim], &normal(1.0, 0.1))?;
            }
            mat(&mut w, n("attn_output.weight"), ty(Kind::Other, l), &[qd, h], inv_sqrt(qd))?;
        }
        // The hybrids' converter names the FFN's norm post_attention_norm.
        let ffn_norm = if s.hybrid.is_some() { "post_attention_norm.weight" } else { "ffn_norm.weight" };
        vec_with(&mut w, n(ffn_norm), &[h], &normal(1.0, 0.1))?;
        match s.moe {
            None => {
                mat(&mut w, n("ffn_gate.weight"), ty(Kind::Other, l), &[h, ffn], inv_sqrt(h))?;
                mat(&mut w, n("ffn_up.weight"), ty(Kind::Other, l), &[h, ffn], inv_sqrt(h))?;
                mat(&mut w, n("ffn_down.weight"), ty(Kind::FfnDown, l), &[ffn, h], inv_sqrt(ffn))?;
            }
            Some(m) => {
                let (ne, f) = (m.num_experts, m.expert_ffn);
                // Router logits of a few units, so that routing is decided (no near-uniform softmax).
                mat(&mut w, n("ffn_gate_inp.weight"), ty(Kind::Float, l), &[h, ne], 2.0 * inv_sqrt(h))?;
                mat(&mut w, n("ffn_gate_exps.weight"), ty(Kind::Other, l), &[h, f, ne], inv_sqrt(h))?;
                mat(&mut w, n("ffn_up_exps.weight"), ty(Kind::Other, l), &[h, f, ne], inv_sqrt(h))?;
                mat(&mut w, n("ffn_down_exps.weight"), ty(Kind::FfnDown, l), &[f, h, ne], inv_sqrt(f))?;
                if let Some(fs) = m.shared_ffn {
                    mat(&mut w, n("ffn_gate_inp_shexp.weight"), ty(Kind::Float, l), &[h, 1], inv_sqrt(h))?;
                    mat(&mut w, n("ffn_gate_shexp.weight"), ty(Kind::Other, l), &[h, fs], inv_sqrt(h))?;
                    mat(&mut w, n("ffn_up_shexp.weight"), ty(Kind::Other, l), &[h, fs], inv_sqrt(h))?;
                    mat(&mut w, n("ffn_down_shexp.weight"), ty(Kind::FfnDown, l), &[fs, h], inv_sqrt(fs))?;
                }
            }
        }
    }
    vec_with(&mut w, "output_norm.weight".into(), &[h], &normal(1.0, 0.1))?;
    mat(&mut w, "output.weight".into(), ty(Kind::Output, 0), &[h, s.vocab], 3.0 * inv_sqrt(h))?;
    Ok(w)
}

/// A Gated DeltaNet layer's tensors as the converter names and stores them (the projections [hidden, out]; the
/// conv [kernel, channels] f32; `ssm_a = −exp(A_log)`; `ssm_dt.bias`; the output norm over one value head).
/// Values as transformers initialises the layer: `A` uniform in (1, 16), `dt = softplus(dt_bias)` log-uniform in
/// [1e-3, 0.1], so the per-token decay `exp(ssm_a · softplus(alpha + dt_bias))` spreads over (0.2, 1).
#[allow(clippy::too_many_arguments)]
fn deltanet_layer(
    w: &mut GgufWriter,
    mat: &mut impl FnMut(&mut GgufWriter, String, GgmlType, &[usize], f32) -> Result<()>,
    vec_with: &mut impl FnMut(&mut GgufWriter, String, &[usize], &dyn Fn(&mut Rng) -> f32) -> gguf::Result<()>,
    n: &dyn Fn(&str) -> String,
    ty: &dyn Fn(Kind, usize) -> GgmlType,
    l: usize,
    h: usize,
    hy: &Hybrid,
) -> Result<()> {
    let (k_dim, v_dim, nv) = (hy.num_k_heads * hy.head_k_dim, hy.num_v_heads * hy.head_v_dim, hy.num_v_heads);
    let conv_dim = 2 * k_dim + v_dim;
    let inv_sqrt = |n: usize| 1.0 / (n as f32).sqrt();
    vec_with(w, n("ssm_a"), &[nv], &|r| -(1.0 + 15.0 * r.uniform()))?;
    let conv_std = inv_sqrt(hy.conv_kernel);
    vec_with(w, n("ssm_conv1d.weight"), &[hy.conv_kernel, conv_dim], &|r| conv_std * r.normal())?;
    vec_with(w, n("ssm_dt.bias"), &[nv], &|r| {
        let dt = (1e-3f32.ln() + r.uniform() * (1e-1f32.ln() - 1e-3f32.ln())).exp();
        dt.exp_m1().ln()
    })?;
    mat(w, n("ssm_alpha.weight"), ty(Kind::Other, l), &[h, nv], inv_sqrt(h))?;
    mat(w, n("ssm_beta.weight"), ty(Kind::Other, l), &[h, nv], inv_sqrt(h))?;
    // attn_qkv counts as attn_v in llama.cpp's Q4_K_M rule.
    mat(w, n("attn_qkv.weight"), ty(Kind::AttnV, l), &[h, conv_dim], inv_sqrt(h))?;
    mat(w, n("attn_gate.weight"), ty(Kind::Other, l), &[h, v_dim], inv_sqrt(h))?;
    vec_with(w, n("ssm_norm.weight"), &[hy.head_v_dim], &|r| 1.0 + 0.1 * r.normal())?;
    mat(w, n("ssm_out.weight"), ty(Kind::Other, l), &[v_dim, h], inv_sqrt(v_dim))?;
    Ok(())
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

    /// A full shape's header (the data a hole): its tensors, shapes and types, read back as the engine reads them.
    fn full_header(name: &str, dir: &std::path::Path) -> gguf::GgufFile {
        let s = *SHAPES.iter().find(|s| s.name == name).expect("shape");
        let path = dir.join(format!("{name}.gguf"));
        build(&s, None, 0, 1).expect("build").write_header_only(&path).expect("write");
        gguf::GgufFile::open(&path).expect("parse")
    }

    fn t(file: &gguf::GgufFile, name: &str) -> Option<(GgmlType, Vec<u64>)> {
        file.tensor(name).map(|t| (t.ty, t.dims.clone()))
    }

    /// Qwen3.6-35B-A3B: 40 trunk layers (30 Gated DeltaNet, every 4th gated attention: 16 query heads of 256 with
    /// their gates, 2 KV heads) and one MTP block, 256 experts of 512 plus a shared expert of 512, the 248,320-token
    /// vocabulary. Types by llama.cpp's Q4_K_M rule with 41 blocks (more bits below block 5, from block 35 and on
    /// every third between): attn_qkv and attn_v alike, ffn_down of experts and shared expert alike.
    #[test]
    fn qwen36_35b_a3b_has_the_real_tensors_and_types() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = full_header("qwen3.6-35b-a3b", dir.path());
        let cfg = models::arch::config_from_gguf(&f).expect("config");
        assert_eq!(
            (cfg.arch, cfg.num_layers, cfg.hidden_size, cfg.vocab_size),
            (models::Arch::Qwen35Moe, 40, 2048, 248_320)
        );
        assert_eq!((cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rope_dim), (16, 2, 256, 64));
        let hy = models::arch::qwen35::hybrid_from_gguf(&f, &cfg).expect("layout").expect("a hybrid");
        assert_eq!(hy.recurrent.iter().filter(|&&r| r).count(), 30);
        assert!(!hy.recurrent[3] && hy.recurrent[4] && !hy.recurrent[39]);
        let sp = hy.spec;
        assert_eq!(
            (sp.num_k_heads, sp.num_v_heads, sp.head_k_dim, sp.head_v_dim, sp.conv_kernel),
            (16, 32, 128, 128, 4)
        );
        let e = models::arch::qwen3moe::experts_spec(&f, cfg.arch).expect("experts");
        assert_eq!((e.num_experts, e.num_used, e.expert_ffn), (256, 8, 512));
        assert_eq!(f.get_u64("qwen35moe.feed_forward_length").expect("key"), None);
        assert_eq!(f.get_u64("qwen35moe.nextn_predict_layers").expect("key"), Some(1));

        use GgmlType::*;
        assert_eq!(t(&f, "token_embd.weight"), Some((Q4_K, vec![2048, 248_320])));
        assert_eq!(t(&f, "output.weight"), Some((Q6_K, vec![2048, 248_320])));
        assert_eq!(t(&f, "blk.0.attn_qkv.weight"), Some((Q6_K, vec![2048, 8192])));
        assert_eq!(t(&f, "blk.5.attn_qkv.weight"), Some((Q4_K, vec![2048, 8192])));
        assert_eq!(t(&f, "blk.7.attn_v.weight"), Some((Q6_K, vec![2048, 512])));
        assert_eq!(t(&f, "blk.11.attn_v.weight"), Some((Q4_K, vec![2048, 512])));
        assert_eq!(t(&f, "blk.0.attn_gate.weight"), Some((Q4_K, vec![2048, 4096])));
        assert_eq!(t(&f, "blk.0.ssm_conv1d.weight"), Some((F32, vec![4, 8192])));
        assert_eq!(t(&f, "blk.0.ssm_alpha.weight"), Some((Q4_K, vec![2048, 32])));
        assert_eq!(t(&f, "blk.0.ssm_beta.weight"), Some((Q4_K, vec![2048, 32])));
        assert_eq!(t(&f, "blk.0.ssm_a"), Some((F32, vec![32])));
        assert_eq!(t(&f, "blk.0.ssm_dt.bias"), Some((F32, vec![32])));
        assert_eq!(t(&f, "blk.0.ssm_norm.weight"), Some((F32, vec![128])));
        assert_eq!(t(&f, "blk.0.ssm_out.weight"), Some((Q4_K, vec![4096, 2048])));
        assert_eq!(t(&f, "blk.3.attn_q.weight"), Some((Q4_K, vec![2048, 8192])));
        assert_eq!(t(&f, "blk.3.attn_k.weight"), Some((Q4_K, vec![2048, 512])));
        assert_eq!(t(&f, "blk.3.attn_q_norm.weight"), Some((F32, vec![256])));
        assert_eq!(t(&f, "blk.3.attn_output.weight"), Some((Q4_K, vec![4096, 2048])));
        assert_eq!(t(&f, "blk.3.attn_qkv.weight"), None);
        assert_eq!(t(&f, "blk.0.ffn_gate_inp.weight"), Some((F32, vec![2048, 256])));
        assert_eq!(t(&f, "blk.0.ffn_gate_exps.weight"), Some((Q4_K, vec![2048, 512, 256])));
        assert_eq!(t(&f, "blk.0.ffn_down_exps.weight"), Some((Q6_K, vec![512, 2048, 256])));
        assert_eq!(t(&f, "blk.6.ffn_down_exps.weight"), Some((Q4_K, vec![512, 2048, 256])));
        assert_eq!(t(&f, "blk.7.ffn_down_shexp.weight"), Some((Q6_K, vec![512, 2048])));
        assert_eq!(t(&f, "blk.0.ffn_gate_inp_shexp.weight"), Some((F32, vec![2048, 1])));
        assert_eq!(t(&f, "blk.0.ffn_up_shexp.weight"), Some((Q4_K, vec![2048, 512])));
        assert_eq!(t(&f, "blk.0.post_attention_norm.weight"), Some((F32, vec![2048])));
        // The MTP block after the trunk: gated attention, the experts, its projection and norms.
        assert_eq!(t(&f, "blk.40.nextn.eh_proj.weight"), Some((Q4_K, vec![4096, 2048])));
        assert_eq!(t(&f, "blk.40.nextn.enorm.weight"), Some((F32, vec![2048])));
        assert_eq!(t(&f, "blk.40.attn_q.weight"), Some((Q4_K, vec![2048, 8192])));
        assert_eq!(t(&f, "blk.40.ffn_down_exps.weight"), Some((Q6_K, vec![512, 2048, 256])));
        assert_eq!(t(&f, "blk.41.attn_norm.weight"), None);
        // 11 mixer and norm tensors in each Gated DeltaNet layer, 8 in each attention one (the MTP block's too), 8
        // FFN tensors in every block, 4 more in the MTP block, 3 model-level: the converter's 96 for the fixtures'
        // 3 + 2 blocks (fixtures/hf/qwen35moe).
        assert_eq!(f.tensors.len(), 30 * 11 + 11 * 8 + 41 * 8 + 4 + 3);

        let tok = tokenizer::Tokenizer::from_gguf(&f).expect("tokenizer");
        assert_eq!(tok.vocab_size(), 248_320);
        let ids = tok.encode("<|im_start|>user\nnamaste नमस्ते<|im_end|>", true).expect("encode");
        assert!(ids.contains(&248_045) && ids.contains(&248_046), "{ids:?}");
        assert!(f.get_str("tokenizer.chat_template").expect("key").is_some_and(|t| t.contains("<think>")));
    }

    /// Qwen3.8-27B: 64 trunk layers (48 Gated DeltaNet with 16 key and 48 value heads, 16 gated attention with 24
    /// query heads of 256 and 4 KV heads), a dense FFN of 17,408, one MTP block; Q4_K_M over 65 blocks (more bits
    /// below 8, from 56 and on every third between: 10, 13, ..., 55).
    #[test]
    fn qwen38_27b_has_the_real_tensors_and_types() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = full_header("qwen3.8-27b", dir.path());
        let cfg = models::arch::config_from_gguf(&f).expect("config");
        assert_eq!((cfg.arch, cfg.num_layers, cfg.hidden_size, cfg.ffn_size), (models::Arch::Qwen35, 64, 5120, 17408));
        assert_eq!((cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.max_context), (24, 4, 256, 262_144));
        let hy = models::arch::qwen35::hybrid_from_gguf(&f, &cfg).expect("layout").expect("a hybrid");
        assert_eq!(hy.recurrent.iter().filter(|&&r| r).count(), 48);
        assert_eq!((hy.spec.num_k_heads, hy.spec.num_v_heads), (16, 48));

        use GgmlType::*;
        assert_eq!(t(&f, "blk.0.attn_qkv.weight"), Some((Q6_K, vec![5120, 10240])));
        assert_eq!(t(&f, "blk.0.attn_gate.weight"), Some((Q4_K, vec![5120, 6144])));
        assert_eq!(t(&f, "blk.0.ssm_out.weight"), Some((Q4_K, vec![6144, 5120])));
        assert_eq!(t(&f, "blk.0.ssm_conv1d.weight"), Some((F32, vec![4, 10240])));
        assert_eq!(t(&f, "blk.9.attn_qkv.weight"), Some((Q4_K, vec![5120, 10240])));
        assert_eq!(t(&f, "blk.11.attn_v.weight"), Some((Q4_K, vec![5120, 1024])));
        assert_eq!(t(&f, "blk.59.attn_v.weight"), Some((Q6_K, vec![5120, 1024])));
        assert_eq!(t(&f, "blk.11.attn_q.weight"), Some((Q4_K, vec![5120, 12288])));
        assert_eq!(t(&f, "blk.11.attn_output.weight"), Some((Q4_K, vec![6144, 5120])));
        assert_eq!(t(&f, "blk.10.ffn_down.weight"), Some((Q6_K, vec![17408, 5120])));
        assert_eq!(t(&f, "blk.12.ffn_down.weight"), Some((Q4_K, vec![17408, 5120])));
        assert_eq!(t(&f, "blk.12.ffn_gate.weight"), Some((Q4_K, vec![5120, 17408])));
        assert_eq!(t(&f, "blk.64.nextn.eh_proj.weight"), Some((Q4_K, vec![10240, 5120])));
        assert_eq!(t(&f, "blk.64.ffn_down.weight"), Some((Q6_K, vec![17408, 5120])));
        assert_eq!(t(&f, "output.weight"), Some((Q6_K, vec![5120, 248_320])));
        // Q4_K_M over the 65 blocks: Q6_K on 33 of the attn_v-like tensors and 33 of the ffn_down ones.
        let q6 = |suffix: &str| f.tensors.iter().filter(|t| t.name.ends_with(suffix) && t.ty == Q6_K).count();
        assert_eq!(q6("attn_qkv.weight") + q6("attn_v.weight"), 33);
        assert_eq!(q6("ffn_down.weight"), 33);
    }
}
