//! The kernel library of one model: which kernels exist ([`Kernel`], the one place a kernel's name and its
//! instantiation are spelled), the generated source (the model's constants, `backend::cuda::KERNELS`, then one
//! `extern "C"` wrapper per instantiated template), and the table of loaded functions the runner launches by key
//! ([`KernelTable`]). The list that writes the source is the list that is loaded: a kernel that is launched but was
//! never instantiated is an error at load, not a missing string at run time.

use std::collections::HashMap;
use std::sync::Arc;

use backend::cpu::ops::RopeStyle;
use cudarc::driver::{CudaFunction, CudaModule};
use gguf::GgmlType;

use super::{CudaOptions, PAGE_SIZE};
use crate::{Error, ModelConfig, Result};

/// Activation rows per pass of the matrix-vector kernels that have an instantiation.
pub(super) const MRS: [usize; 4] = [1, 2, 4, 8];

/// The 8-bit-activation kernels a model needs: (type, row length, threads per row) for plain and gate/up products,
/// (q, k, v types, threads per row) for the fused QKV, (type, row length, threads per row, gate/up) for the experts'
/// grouped products; and the switches the source is written with (`opts`, as the loader settled them for the model:
/// `fuse_norm` and `qkv_rope` only where the shapes allow).
#[derive(Debug, Clone, Default)]
pub struct Q8Kernels {
    pub mats: Vec<(GgmlType, usize, usize)>,
    pub gu: Vec<(GgmlType, usize, usize)>,
    pub qkv: Vec<(GgmlType, GgmlType, GgmlType, usize)>,
    pub moe: Vec<(GgmlType, usize, usize, bool)>,
    pub opts: CudaOptions,
}

/// One kernel of the library. The fixed ones are written out in kernels.cu; the others are instantiations of its
/// templates for a (weight type, row length, threads per row, activation rows per pass, output mode), each wrapped
/// in an `extern "C"` function named by [`Kernel::name`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kernel {
    RmsNorm,
    SiluMul,
    QkNorm,
    RopeKv,
    Attention,
    /// The attention as one thread-block cluster per (row, head) (`CudaOptions::att_cl`).
    AttentionCl,
    AttnCombine,
    ActQ8_0,
    ActQ8K,
    ToF16,
    AddBias,
    /// Causal attention of one long chunk over the paged cache (flash_attention.cu), and the merge of its splits.
    FlashAttention,
    FlashCombine,
    ArgmaxRows,
    TopkRows,
    QuantQ8,
    /// The router's softmax and top-k, the assignments sorted by expert, the weighted mix added to the residual
    /// (experts.cu, moe.cu), and the tensor-core path's SwiGLU into f16.
    MoeRoute,
    MoeGroup,
    MoeMixAdd,
    MoeSiluF16,
    /// The experts' grouped products on f32 activations: one block row per used expert (`gu`: gate and up
    /// together, silu(gate) * up).
    MoeMmv {
        ty: GgmlType,
        k: usize,
        mr: usize,
        gu: bool,
    },
    /// ... on 8-bit activations with `p` threads per weight row.
    MoeMmvq {
        ty: GgmlType,
        k: usize,
        p: usize,
        mr: usize,
        gu: bool,
    },
    /// Y (+)= W X on f32 activations (`residual`: added to Y).
    Mmv {
        ty: GgmlType,
        k: usize,
        mr: usize,
        residual: bool,
    },
    /// A matrix dequantized to f16 (the tensor-core path).
    Dequant {
        ty: GgmlType,
        k: usize,
    },
    /// Gate and up together, silu(gate) * up, on f32 activations.
    Gu {
        ty: GgmlType,
        k: usize,
        mr: usize,
    },
    /// Q, K and V in one launch with the attention RMSNorm fused.
    Qkv {
        t: [GgmlType; 3],
        mr: usize,
    },
    Embed {
        ty: GgmlType,
        k: usize,
    },
    /// Y (+)= W X on 8-bit activations with `p` threads per weight row.
    Mmvq {
        ty: GgmlType,
        k: usize,
        p: usize,
        mr: usize,
        residual: bool,
    },
    /// Gate and up on 8-bit activations.
    Guq {
        ty: GgmlType,
        k: usize,
        p: usize,
        mr: usize,
    },
    /// Q, K and V on 8-bit activations.
    Qkvq {
        t: [GgmlType; 3],
        p: usize,
        mr: usize,
    },
}

fn type_id(ty: GgmlType) -> u32 {
    ty.to_u32()
}

/// Threads of a gate/up kernel that also writes its output as 8-bit activations (blocks of 32 rows, 32 * p
/// threads). Not above 8 threads per row: with 1024-thread blocks (p = 32, the 32B's gate/up) ptxas keeps 32
/// registers per thread and spills the loaded weights (580 bytes of spill stores, `--ptxas-options=-v`).
pub(super) fn guq_fused(p: usize) -> bool {
    p <= 8
}

/// Warps that share one weight row of length `k` in the matrix-vector kernels (long rows: more loads in flight).
pub(super) fn warps_per_row(k: usize) -> usize {
    if k >= 4096 { 4 } else { 1 }
}

impl Kernel {
    /// The kernel's name in the module.
    pub fn name(&self) -> String {
        use Kernel::*;
        let fixed = match self {
            RmsNorm => "rms_norm",
            SiluMul => "silu_mul",
            QkNorm => "qk_norm",
            RopeKv => "rope_kv",
            Attention => "attention",
            AttentionCl => "attention_cl",
            AttnCombine => "attn_combine",
            ActQ8_0 => "act_q8_0",
            ActQ8K => "act_q8_k",
            ToF16 => "to_f16",
            AddBias => "add_bias",
            FlashAttention => "flash_attention",
            FlashCombine => "flash_combine",
            ArgmaxRows => "argmax_rows",
            TopkRows => "topk_rows",
            QuantQ8 => "quant_q8",
            MoeRoute => "moe_route_pdl",
            MoeGroup => "moe_group_pdl",
            MoeMixAdd => "moe_mix_add",
            MoeSiluF16 => "moe_silu_f16",
            _ => "",
        };
        if !fixed.is_empty() {
            return fixed.to_string();
        }
        let t3 = |t: &[GgmlType; 3]| format!("{}_{}_{}", type_id(t[0]), type_id(t[1]), type_id(t[2]));
        match *self {
            Mmv { ty, k, mr, residual } => format!("mmv_{}_{k}_{mr}_{}", type_id(ty), u8::from(residual)),
            Dequant { ty, k } => format!("dequant_{}_{k}", type_id(ty)),
            Gu { ty, k, mr } => format!("mmvgu_{}_{k}_{mr}", type_id(ty)),
            Qkv { t, mr } => format!("qkvn_{}_{mr}", t3(&t)),
            Embed { ty, k } => format!("embed_{}_{k}", type_id(ty)),
            Mmvq { ty, k, p, mr, residual } => format!("mmvq_{}_{k}_{p}_{mr}_{}", type_id(ty), u8::from(residual)),
            Guq { ty, k, p, mr } => format!("guq_{}_{k}_{p}_{mr}", type_id(ty)),
            Qkvq { t, p, mr } => format!("qkvq_{}_{p}_{mr}", t3(&t)),
            MoeMmv { ty, k, mr, gu } => format!("moe_mmv_{}_{k}_{mr}_{}", type_id(ty), u8::from(gu)),
            MoeMmvq { ty, k, p, mr, gu } => format!("moe_mmvq_{}_{k}_{p}_{mr}_{}", type_id(ty), u8::from(gu)),
            _ => unreachable!("fixed kernels are named above"),
        }
    }

    /// The `extern "C"` wrapper that instantiates this kernel's template (None for the fixed kernels); `hidden` is
    /// the model's hidden size (the gate/up kernels on it may normalise their input).
    fn instantiation(&self, hidden: usize, q8: &Q8Kernels) -> Option<String> {
        use Kernel::*;
        let name = self.name();
        let ids = |t: &[GgmlType; 3]| (type_id(t[0]), type_id(t[1]), type_id(t[2]));
        Some(match *self {
            Mmv { ty, k, mr, residual } => format!(
                "extern \"C\" __global__ void __launch_bounds__(128) {name}(const u8* W, const float* X, float* Y, \
                 const float* bias, int m, int N) {{ pdl_trigger(); mmv_body<{}, {k}, {mr}, {}, {}>(W, X, Y, bias, m, N); }}\n",
                type_id(ty),
                u32::from(residual),
                warps_per_row(k)
            ),
            Dequant { ty, k } => format!(
                "extern \"C\" __global__ void __launch_bounds__(256) {name}(const u8* W, u16* out, int N) {{ \
                 PDL_ENTER dequant_body<{}, {k}>(W, out, N); }}\n",
                type_id(ty)
            ),
            Gu { ty, k, mr } => format!(
                "extern \"C\" __global__ void __launch_bounds__(128) {name}(const u8* Wg, const u8* Wu, const float* X, \
                 float* Y, int m, int N) {{ pdl_trigger(); mmv_gu_body<{}, {k}, {mr}>(Wg, Wu, X, Y, m, N); \
                 }}\n",
                type_id(ty)
            ),
            Qkv { t, mr } => {
                let (a, b, c) = ids(&t);
                format!(
                    "extern \"C\" __global__ void __launch_bounds__(128) {name}(const u8* Wq, const u8* Wk, const u8* Wv, \
                     const float* X, const float* g, const float* bq, const float* bk, const float* bv, float* q, float* k, \
                     float* v, int m) {{ PDL_ENTER qkv_body<{a}, {b}, {c}, {mr}>(Wq, Wk, Wv, X, g, bq, bk, bv, q, k, v, m); }}\n"
                )
            }
            Embed { ty, k } => format!(
                "extern \"C\" __global__ void {name}(const u8* W, const u32* tokens, float* out) {{ PDL_ENTER embed_body<{}, {k}>(W, tokens, \
                 out); }}\n",
                type_id(ty)
            ),
            Mmvq { ty, k, p, mr, residual } => {
                let mode = u32::from(residual);
                format!(
                    "extern \"C\" __global__ void __launch_bounds__(128) {name}(const u8* W, const i8* Xq, const float2* Xd, \
                     float* Y, const float* bias, int m, int N) {{ pdl_trigger(); mmvq_body<{}, {k}, {mr}, {mode}, {p}>(W, \
                     Xq, Xd, Y, bias, m, N); }}\n",
                    type_id(ty)
                )
            }
            Guq { ty, k, p, mr } => {
                let (threads, fused) = if guq_fused(p) && q8.opts.gu_fuse { (32 * p, "true") } else { (128, "false") };
                let norm = q8.opts.fuse_norm && k == hidden;
                format!(
                    "extern \"C\" __global__ void __launch_bounds__({threads}) {name}(const u8* Wg, const u8* Wu, const i8* Xq, \
                     const float2* Xd, float* Y, int m, int N, i8* Qo, float2* Do, const float* X, const float* gn) \
                     {{ pdl_trigger(); guq_body<{}, {k}, {mr}, {p}, {fused}, {norm}>(Wg, Wu, Xq, Xd, Y, m, N, Qo, Do, \
                     X, gn); }}\n",
                    type_id(ty)
                )
            }
            Qkvq { t, p, mr } => {
                let (a, b, c) = ids(&t);
                format!(
                    "extern \"C\" __global__ void __launch_bounds__(128) {name}(const u8* Wq, const u8* Wk, const u8* Wv, \
                     const i8* Xq, const float2* Xd, const float* bq, const float* bk, const float* bv, float* q, float* k, \
                     float* v, int m, const float* X, const float* g, const float* inv_freq, const u32* pos, const u32* slot, \
                     const u32* table, u16* kc, u16* vc) {{ pdl_trigger(); qkvq_body<{a}, {b}, {c}, {mr}, {p}>(Wq, Wk, Wv, Xq, \
                     Xd, bq, bk, bv, q, k, v, m, X, g, inv_freq, pos, slot, table, kc, vc); }}\n"
                )
            }
            MoeMmv { ty, k, mr, gu } => format!(
                "extern \"C\" __global__ void __launch_bounds__(128) {name}(const u8* W, const u8* U, int stride, \
                 const float* X, const u32* used, const u32* offsets, float* Y, int N) {{ pdl_trigger(); \
                 moe_mmv_body<{}, {k}, {mr}, {gu}>(W, U, stride, X, used, offsets, Y, N); }}\n",
                type_id(ty)
            ),
            MoeMmvq { ty, k, p, mr, gu } => format!(
                "extern \"C\" __global__ void __launch_bounds__(128) {name}(const u8* W, const u8* U, int stride, \
                 const i8* Xq, const float2* Xd, const u32* used, const u32* offsets, float* Y, int N) {{ \
                 pdl_trigger(); moe_mmvq_body<{}, {k}, {mr}, {p}, {gu}>(W, U, stride, Xq, Xd, used, offsets, Y, N); }}\n",
                type_id(ty)
            ),
            _ => return None,
        })
    }
}

/// What one model instantiates: the (type, row length) of every matrix on f32 activations, the gate/up pairs of
/// one type, the (q, k, v) type triples, the token embedding, the experts' grouped products on f32 activations
/// (type, row length, gate/up), and the 8-bit-activation kernels.
#[derive(Debug, Clone)]
pub struct KernelSet {
    pub mats: Vec<(GgmlType, usize)>,
    pub gu: Vec<(GgmlType, usize)>,
    pub moe: Vec<(GgmlType, usize, bool)>,
    pub qkv: Vec<(GgmlType, GgmlType, GgmlType)>,
    pub embd: (GgmlType, usize),
    pub q8: Q8Kernels,
}

impl KernelSet {
    /// Every kernel of the library, in the order their wrappers are written: the fixed ones, then the template
    /// instantiations.
    pub fn kernels(&self) -> Vec<Kernel> {
        use Kernel::*;
        let mut v = vec![RmsNorm, SiluMul, QkNorm, RopeKv, Attention, AttnCombine, ActQ8_0, ActQ8K];
        v.extend([ToF16, AddBias, FlashAttention, FlashCombine, ArgmaxRows, TopkRows, QuantQ8]);
        v.extend([MoeRoute, MoeGroup, MoeMixAdd, MoeSiluF16]);
        if self.q8.opts.att_cl > 1 {
            v.push(AttentionCl);
        }
        v.extend(self.instances());
        v
    }

    /// The template instantiations, in source order.
    fn instances(&self) -> Vec<Kernel> {
        use Kernel::*;
        let mut v = Vec::new();
        for &(ty, k) in &self.mats {
            for mr in MRS {
                v.extend([false, true].map(|residual| Mmv { ty, k, mr, residual }));
            }
        }
        v.extend(self.mats.iter().map(|&(ty, k)| Dequant { ty, k }));
        for &(ty, k) in &self.gu {
            for mr in MRS {
                v.push(Gu { ty, k, mr });
            }
        }
        for &(tq, tk, tv) in &self.qkv {
            for mr in MRS {
                v.push(Qkv { t: [tq, tk, tv], mr });
            }
        }
        v.push(Embed { ty: self.embd.0, k: self.embd.1 });
        let q8 = &self.q8;
        for &(ty, k, p) in &q8.mats {
            for mr in MRS {
                v.extend([false, true].map(|residual| Mmvq { ty, k, p, mr, residual }));
            }
        }
        for &(ty, k, p) in &q8.gu {
            v.extend(MRS.map(|mr| Guq { ty, k, p, mr }));
        }
        for &(tq, tk, tv, p) in &q8.qkv {
            v.extend(MRS.map(|mr| Qkvq { t: [tq, tk, tv], p, mr }));
        }
        for &(ty, k, gu) in &self.moe {
            v.extend(MRS.map(|mr| MoeMmv { ty, k, mr, gu }));
        }
        for &(ty, k, p, gu) in &q8.moe {
            v.extend(MRS.map(|mr| MoeMmvq { ty, k, p, mr, gu }));
        }
        v
    }

    /// The kernel source for `cfg`: constants, the library, and one wrapper per instantiation.
    pub fn source(&self, cfg: &ModelConfig) -> String {
        let q8 = &self.q8;
        let max_pages = cfg.max_context.div_ceil(PAGE_SIZE);
        let o = &q8.opts;
        let mut s = String::new();
        let defs = [
            ("HIDDEN", cfg.hidden_size),
            ("Q_DIM", cfg.q_dim()),
            ("KV_DIM", cfg.kv_dim()),
            ("HEAD_DIM", cfg.head_dim),
            ("NUM_HEADS", cfg.num_heads),
            ("NUM_KV_HEADS", cfg.num_kv_heads),
            ("FFN", cfg.ffn_size),
            ("ROPE_DIM", cfg.rope_dim),
            ("ROPE_NEOX", usize::from(cfg.rope_style == RopeStyle::Neox)),
            ("PAGE_SIZE", PAGE_SIZE),
            ("MAX_PAGES", max_pages),
            ("ATT_WARPS", o.att_warps),
        ];
        for (k, v) in defs {
            s.push_str(&format!("#define {k} {v}\n"));
        }
        s.push_str(&format!("#define RMS_EPS {:e}f\n", cfg.rms_eps));
        s.push_str(&format!("#define REPACK {}\n#define ATT_DYN {}\n", u8::from(o.repack), u8::from(o.att_dyn)));
        s.push_str(&format!("#define XPERM {}\n", u8::from(o.xperm)));
        s.push_str(&format!(
            "#define FUSE_NORM {}\n#define QKV_ROPE {}\n",
            u8::from(o.fuse_norm),
            u8::from(o.qkv_rope)
        ));
        s.push_str(&format!("#define ATT_MIN_SPLIT {}\n#define ATT_CL {}\n", 32 * o.att_warps, o.att_cl));
        s.push_str(&format!("#define ATT_SPLITS {}\n#define ATT_LONG {}\n", o.att_splits.max(1), o.att_long));
        s.push_str(&format!("#define GU_DOT2 {}\n#define FA_WARPS {}\n", u8::from(o.gu_dot2), o.flash_warps));
        s.push_str(backend::cuda::KERNELS);
        s.push('\n');
        for k in self.instances() {
            s.push_str(&k.instantiation(cfg.hidden_size, q8).expect("INVARIANT: instances are templates"));
        }
        s
    }
}

/// The kernel source for `cfg`: constants, the library, and one instantiation per (type, row length) in use.
pub fn kernel_source(
    cfg: &ModelConfig,
    mats: &[(GgmlType, usize)],
    gu: &[(GgmlType, usize)],
    qkv: &[(GgmlType, GgmlType, GgmlType)],
    embd: (GgmlType, usize),
    q8: &Q8Kernels,
) -> String {
    let set =
        KernelSet { mats: mats.to_vec(), gu: gu.to_vec(), moe: Vec::new(), qkv: qkv.to_vec(), embd, q8: q8.clone() };
    set.source(cfg)
}

/// The loaded functions of a module, by kernel.
pub(super) struct KernelTable {
    funcs: HashMap<Kernel, CudaFunction>,
}

impl KernelTable {
    /// Loads every kernel of `set` from `module`.
    pub fn load(module: &Arc<CudaModule>, set: &KernelSet) -> Result<Self> {
        let mut funcs = HashMap::new();
        for k in set.kernels() {
            let n = k.name();
            let f = module.load_function(&n).map_err(|e| Error::Backend(format!("kernel {n}: {e:?}")))?;
            if k == Kernel::AttentionCl && set.q8.opts.att_cl > 8 {
                use cudarc::driver::sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED;
                f.set_attribute(CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
                    .map_err(|e| Error::Backend(format!("kernel {n}: cluster size {}: {e:?}", set.q8.opts.att_cl)))?;
            }
            funcs.insert(k, f);
        }
        Ok(KernelTable { funcs })
    }

    pub fn get(&self, k: Kernel) -> Result<&CudaFunction> {
        self.funcs.get(&k).ok_or_else(|| Error::Backend(format!("kernel {} was not compiled", k.name())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Arch;

    /// The generated source compiles for Hopper with every supported type (runs where NVRTC can be loaded).
    #[test]
    fn kernels_compile_with_nvrtc() {
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            eprintln!("skipped: libnvrtc not found");
            return;
        }
        let cfg = ModelConfig {
            arch: Arch::Qwen2,
            shapes: crate::ModelShapes {
                num_layers: 2,
                hidden_size: 1536,
                ffn_size: 8960,
                num_heads: 12,
                num_kv_heads: 2,
                head_dim: 128,
                vocab_size: 1000,
                max_context: 4096,
            },
            rms_eps: 1e-6,
            rope_theta: 1e6,
            rope_dim: 128,
            rope_style: RopeStyle::Neox,
            qkv_bias: true,
            qk_norm: false,
            tied_embeddings: false,
        };
        use GgmlType::*;
        let mats: Vec<(GgmlType, usize)> =
            [F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K].iter().map(|&t| (t, 1536)).collect();
        let q8 = Q8Kernels {
            mats: vec![
                (Q4_K, 1536, 16),
                (Q6_K, 1536, 8),
                (Q4_K, 8960, 32),
                (Q6_K, 8960, 64),
                (Q6_K, 8960, 128),
                (Q8_0, 1536, 8),
                (Q5_0, 1536, 32),
            ],
            gu: vec![(Q4_K, 1536, 8), (Q6_K, 5120, 32), (Q5_0, 1536, 8)],
            qkv: vec![(Q4_K, Q4_K, Q6_K, 16), (Q5_0, Q5_0, Q8_0, 32)],
            moe: vec![(Q4_K, 1536, 8, true), (Q6_K, 768, 4, false), (Q8_0, 768, 4, false)],
            opts: CudaOptions { att_warps: 16, att_cl: 16, ..CudaOptions::default() },
        };
        let set = KernelSet {
            mats,
            gu: vec![(Q4_K, 1536), (Q5_0, 1536)],
            moe: vec![(F32, 1536, true), (Q8_0, 32, false), (F16, 768, false)],
            qkv: vec![(Q4_K, Q4_K, Q6_K)],
            embd: (Q6_K, 1536),
            q8,
        };
        let src = set.source(&cfg);
        if let Ok(p) = std::env::var("SPLASH_DUMP_KERNEL_SOURCE") {
            std::fs::write(p, &src).expect("writing the kernel source");
        }
        let t0 = std::time::Instant::now();
        let bin = backend::cuda::nvrtc_cubin(&src, "sm_90a").unwrap_or_else(|e| panic!("{e}"));
        eprintln!(
            "compiled {} bytes of source to {} bytes in {:.1} s",
            src.len(),
            bin.len(),
            t0.elapsed().as_secs_f64()
        );
        assert!(bin.len() > 1000);
    }
}
