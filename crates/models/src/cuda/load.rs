//! Loading a model onto the device: the kernels it needs (compiled with NVRTC for its shapes, cached on disk), its
//! weights in their device layout, the KV pool and the cuBLAS handle.

use std::collections::HashSet;
use std::sync::Arc;

use backend::cpu::QMatrix;
use backend::cuda::{Blas, Gpu};
use backend::{Backend, ExpertGateUp, ExpertsSpec, KvLayout, KvType};
use gguf::{GgmlType, GgufFile};

use super::fused::{FusedBackend, StepTimer, event_err};
use super::kernels::{KernelSet, KernelTable, Q8Kernels};
use super::runner::CudaLoadStats;
use super::tactics::{q8_ok, q8_threads, supported};
use super::{CudaOptions, CudaRunner, FUSE_NORM_MAX_HIDDEN, PAGE_SIZE};
use crate::kv_cache::BlockTable;
use crate::transformer::Transformer;
use crate::weights::Ffn;
use crate::{Error, Result, Weights};

/// The address of a host matrix's bytes: how the backend knows it again when the forward pass loads it.
fn addr(m: &QMatrix) -> usize {
    m.bytes.as_slice().as_ptr() as usize
}

impl CudaRunner {
    pub fn new(file: Arc<GgufFile>, opts: CudaOptions) -> Result<Self> {
        let cfg = crate::arch::config_from_gguf(&file)?;
        if cfg.head_dim % 32 != 0 || cfg.hidden_size % 32 != 0 || cfg.ffn_size % 32 != 0 {
            return Err(Error::Backend(format!(
                "the CUDA backend needs head_dim, hidden and FFN sizes that are multiples of 32 (got {}, {}, {})",
                cfg.head_dim, cfg.hidden_size, cfg.ffn_size
            )));
        }
        let weights = Weights::load(&file, &cfg)?;
        let gpu = Gpu::new(opts.device)?;
        let mut opts = opts;
        opts.pdl &= gpu.cc.0 >= 9;
        let mut stats = CudaLoadStats { gpu: gpu.name.clone(), arch: gpu.arch(), ..Default::default() };

        // Which (type, row length) pairs the kernels must cover.
        let mut mats: Vec<(GgmlType, usize)> = Vec::new();
        let mut gu: Vec<(GgmlType, usize)> = Vec::new();
        let add = |v: &mut Vec<(GgmlType, usize)>, ty: GgmlType, k: usize| {
            if !v.contains(&(ty, k)) {
                v.push((ty, k));
            }
        };
        for m in weights.matrices() {
            if !supported(m.ty) {
                return Err(Error::Backend(format!("the CUDA backend does not support {} matrices yet", m.ty)));
            }
        }
        // Each layer's FFN: dense (gate, up, down) or expert-routed (checked here: shapes, no shared expert).
        let ffns: Vec<LayerFfn> =
            weights.layers.iter().map(|l| layer_ffn(l, cfg.hidden_size)).collect::<Result<_>>()?;
        let moe = moe_spec(&ffns);
        for (l, ffn) in weights.layers.iter().zip(&ffns) {
            for m in [&l.wq, &l.wk, &l.wv, &l.wo] {
                add(&mut mats, m.ty, m.cols);
            }
            match *ffn {
                LayerFfn::Dense([w_gate, w_up, w_down]) => {
                    for m in [w_gate, w_up, w_down] {
                        add(&mut mats, m.ty, m.cols);
                    }
                    if w_gate.ty == w_up.ty {
                        add(&mut gu, w_gate.ty, w_gate.cols);
                    }
                }
                // The router on the f32-activation kernels; the experts' matrices dequantized whole on the
                // tensor-core path (`Dequant` comes with every entry of `mats`).
                LayerFfn::Experts { router, gate, down, .. } => {
                    for m in [router, gate, down] {
                        add(&mut mats, m.ty, m.cols);
                    }
                }
            }
        }
        add(&mut mats, weights.output.ty, weights.output.cols);
        let mut qkv: Vec<(GgmlType, GgmlType, GgmlType)> = Vec::new();
        for l in &weights.layers {
            let t = (l.wq.ty, l.wk.ty, l.wv.ty);
            if !qkv.contains(&t) {
                qkv.push(t);
            }
        }
        // Layers (and the output matrix) on the 8-bit-activation kernels, and the instantiations they need.
        let q8_on = opts.q8 && !opts.exact_activations;
        let it = opts.q8_iters;
        opts.fuse_norm &= q8_on && cfg.hidden_size <= FUSE_NORM_MAX_HIDDEN && cfg.hidden_size.is_multiple_of(64);
        opts.qkv_rope &= q8_on
            && !cfg.qk_norm
            && cfg.q_dim().is_multiple_of(32)
            && cfg.kv_dim().is_multiple_of(32)
            && cfg.head_dim.is_multiple_of(2)
            && cfg.rope_dim <= cfg.head_dim;
        let mut q8k = Q8Kernels { opts: opts.clone(), ..Q8Kernels::default() };
        let mut q8_mats = HashSet::new();
        let add3 = |v: &mut Vec<(GgmlType, usize, usize)>, e: (GgmlType, usize, usize)| {
            if !v.contains(&e) {
                v.push(e);
            }
        };
        let mut moe_f32: Vec<(GgmlType, usize, bool)> = Vec::new();
        for (l, ffn) in weights.layers.iter().zip(&ffns) {
            let [w_gate, w_up, w_down] = match *ffn {
                LayerFfn::Dense(d) => d,
                LayerFfn::Experts { gate, up, down, num_used, .. } => {
                    let attn = [&l.wq, &l.wk, &l.wv, &l.wo];
                    if q8_on
                        && attn.iter().all(|m| q8_ok(m.ty, m.cols))
                        && attn[..3].iter().all(|m| m.cols == cfg.hidden_size)
                    {
                        q8_mats.extend(attn.iter().map(|m| addr(m)));
                        let t = (
                            l.wq.ty,
                            l.wk.ty,
                            l.wv.ty,
                            q8_threads(cfg.hidden_size, cfg.q_dim() + 2 * cfg.kv_dim(), it, 32),
                        );
                        if !q8k.qkv.contains(&t) {
                            q8k.qkv.push(t);
                        }
                        add3(&mut q8k.mats, (l.wo.ty, l.wo.cols, q8_threads(l.wo.cols, l.wo.rows, it, 128)));
                    }
                    // The experts' grouped products: on 8-bit activations where all three types have such kernels.
                    let (f, h) = (down.cols, cfg.hidden_size);
                    let add4 = |v: &mut Vec<(GgmlType, usize, usize, bool)>, e| {
                        if !v.contains(&e) {
                            v.push(e)
                        }
                    };
                    if q8_on && [gate, up].iter().all(|m| q8_ok(m.ty, h)) && q8_ok(down.ty, f) {
                        q8_mats.extend([gate, up, down].map(addr));
                        add4(&mut q8k.moe, (gate.ty, h, super::moe::moe_threads(h, f, num_used, it), true));
                        add4(&mut q8k.moe, (down.ty, f, super::moe::moe_threads(f, h, num_used, it), false));
                    } else {
                        for e in [(gate.ty, h, true), (down.ty, f, false)] {
                            if !moe_f32.contains(&e) {
                                moe_f32.push(e);
                            }
                        }
                    }
                    continue;
                }
            };
            let all = [&l.wq, &l.wk, &l.wv, &l.wo, w_gate, w_up, w_down];
            let on = q8_on
                && all.iter().all(|m| q8_ok(m.ty, m.cols))
                && [&l.wq, &l.wk, &l.wv].iter().all(|m| m.cols == cfg.hidden_size);
            if !on {
                continue;
            }
            q8_mats.extend(all.iter().map(|m| addr(m)));
            let t = (l.wq.ty, l.wk.ty, l.wv.ty, q8_threads(cfg.hidden_size, cfg.q_dim() + 2 * cfg.kv_dim(), it, 32));
            if !q8k.qkv.contains(&t) {
                q8k.qkv.push(t);
            }
            for m in [&l.wo, w_down] {
                add3(&mut q8k.mats, (m.ty, m.cols, q8_threads(m.cols, m.rows, it, 128)));
            }
            if w_gate.ty == w_up.ty {
                add3(&mut q8k.gu, (w_gate.ty, w_gate.cols, q8_threads(w_gate.cols, w_gate.rows, it, 32)));
            } else {
                for m in [w_gate, w_up] {
                    add3(&mut q8k.mats, (m.ty, m.cols, q8_threads(m.cols, m.rows, it, 128)));
                }
            }
        }
        let q8_out = q8_on && q8_ok(weights.output.ty, weights.output.cols);
        if q8_out {
            let m = &weights.output;
            q8_mats.insert(addr(m));
            add3(&mut q8k.mats, (m.ty, m.cols, q8_threads(m.cols, m.rows, it, 128)));
        }
        let set = KernelSet { mats, gu, moe: moe_f32, qkv, embd: (weights.token_embd.ty, cfg.hidden_size), q8: q8k };
        let source = set.source(&cfg);
        let identity = super::kv::identity(file.bytes(), &source, &opts);
        let (module, compile_s, hit) = gpu.compile(&source, opts.cache_dir.clone())?;
        stats.compile_s = compile_s;
        stats.cache_hit = hit;
        let kernels = KernelTable::load(&module, &set)?;

        let blas = if !opts.gemm {
            stats.no_gemm = Some("turned off (SPLASH_CUDA_GEMM=0)".into());
            None
        } else if cfg.num_heads % cfg.num_kv_heads != 0 {
            stats.no_gemm = Some("query heads are not a multiple of the KV heads".into());
            None
        } else {
            match Blas::new(&gpu) {
                Ok(b) => Some(b),
                Err(e) => {
                    stats.no_gemm = Some(e.to_string());
                    None
                }
            }
        };
        let step_timer = if std::env::var("SPLASH_CUDA_TIME_STEPS").is_ok_and(|v| v == "1") {
            let ev =
                || gpu.ctx.new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT)).map_err(event_err);
            Some(StepTimer { start: ev()?, copied: ev()?, end: ev()?, steps: 0, copies_ms: 0.0, pass_ms: 0.0 })
        } else {
            None
        };
        let blocking =
            || gpu.ctx.new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)).map_err(event_err);
        let ahead_done = [blocking()?, blocking()?];

        let t0 = std::time::Instant::now();
        let mut backend =
            FusedBackend::new(cfg.clone(), gpu, module, kernels, opts.clone(), blas, q8_mats, step_timer, moe)?;
        let model = Transformer::new(&mut backend, &cfg, &weights)?;
        backend.gpu.sync()?;
        stats.upload_s = t0.elapsed().as_secs_f64();
        stats.weight_bytes = backend.weight_bytes;

        // KV pool: up to half the memory free after the weights, at most 256k tokens.
        let kv_tokens = if opts.kv_tokens > 0 {
            opts.kv_tokens
        } else {
            let (free, _) = backend.gpu.mem_info()?;
            let per_token = cfg.kv_bytes_per_token().max(1);
            (free / 2 / per_token).min(256 * 1024)
        };
        let num_pages = kv_tokens.div_ceil(PAGE_SIZE).max(1);
        let layout = KvLayout {
            num_layers: cfg.num_layers,
            kv_dim: cfg.kv_dim(),
            block_tokens: PAGE_SIZE,
            kv_type: KvType::F16,
        };
        let mut kv = backend.kv_pages(layout)?;
        backend.kv_grow(&mut kv, num_pages)?;
        stats.kv_tokens = num_pages * PAGE_SIZE;
        Ok(CudaRunner {
            cfg,
            backend,
            model,
            kv,
            table: BlockTable::with_block_tokens(num_pages, PAGE_SIZE),
            store: None,
            stage: None,
            identity,
            logits: None,
            host_selected: 0,
            ahead: None,
            ahead_done,
            stats,
        })
    }
}

/// One layer's FFN as the loader sees it.
enum LayerFfn<'a> {
    Dense([&'a QMatrix; 3]),
    /// The router, the experts' gate and up (the same matrix when fused), their down, and the router's numbers.
    Experts {
        router: &'a QMatrix,
        gate: &'a QMatrix,
        up: &'a QMatrix,
        down: &'a QMatrix,
        num_used: usize,
        spec: ExpertsSpec,
    },
}

/// Layer `l`'s FFN, with an expert-routed one checked against what the kernels take: its shapes, at most
/// `MOE_MAX_EXPERTS` experts (experts.cu), gate and up of one type, expert rows a multiple of 32 values, no
/// shared expert.
fn layer_ffn(l: &crate::LayerWeights, hidden: usize) -> Result<LayerFfn<'_>> {
    let e = match &l.ffn {
        Ffn::SwiGlu { gate, up, down } => return Ok(LayerFfn::Dense([gate, up, down])),
        Ffn::Experts(e) => e,
    };
    let refuse = |why: String| Err(Error::Backend(format!("the CUDA backend does not run this MoE layer: {why}")));
    if let Err(why) = e.check_shapes(hidden, |m| (m.rows, m.cols)) {
        return refuse(why);
    }
    let s = e.spec;
    if s.num_experts > super::moe::MAX_EXPERTS {
        return refuse(format!("{} experts (at most {})", s.num_experts, super::moe::MAX_EXPERTS));
    }
    if e.shared.is_some() {
        return refuse("a shared expert".into());
    }
    if !s.expert_ffn.is_multiple_of(32) {
        return refuse(format!("expert FFN width {} (a multiple of 32)", s.expert_ffn));
    }
    let (gate, up) = match &e.gate_up {
        ExpertGateUp::Separate { gate, up } => (gate, up),
        ExpertGateUp::Fused(m) => (m, m),
    };
    if gate.ty != up.ty {
        return refuse(format!("gate {} and up {} of different types", gate.ty, up.ty));
    }
    Ok(LayerFfn::Experts { router: &e.router, gate, up, down: &e.down, num_used: s.num_used, spec: s })
}

/// The largest numbers of the model's expert-routed layers (the scratch's), if it has any.
fn moe_spec(ffns: &[LayerFfn]) -> Option<ExpertsSpec> {
    ffns.iter().fold(None, |acc, f| match (acc, f) {
        (None, LayerFfn::Experts { spec, .. }) => Some(*spec),
        (Some(a), LayerFfn::Experts { spec, .. }) => Some(ExpertsSpec {
            num_experts: a.num_experts.max(spec.num_experts),
            num_used: a.num_used.max(spec.num_used),
            expert_ffn: a.expert_ffn.max(spec.expert_ffn),
            normalise_weights: a.normalise_weights,
        }),
        (acc, _) => acc,
    })
}
