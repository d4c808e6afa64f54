//! `splash plan`: the memory plan for a model on this machine (or a simulated one), printed without serving; and the
//! shared step that turns a GGUF header, device memory and user caps into a [`plan::PlanInput`] (also used by
//! `splash serve`).
//!
//! Shapes come from the GGUF header only: the file is mapped, never read through, and no weights are prepared.

use std::path::Path;

use anyhow::{Context, Result};
use plan::{Device, DeviceMemory, ModelInput, Plan, PlanInput};

#[derive(clap::Args)]
pub struct Args {
    /// Model: a pack or catalog name (qwen2.5-coder-1.5b, qwen2.5-coder-0.5b, smollm2-135m, qwen3-coder-30b-a3b) or
    /// a .gguf path.
    #[arg(long, short, default_value = "qwen2.5-coder-1.5b")]
    model: String,
    /// Draft model to plan for alongside (default: the pack's draft, if it has one).
    #[arg(long, conflicts_with = "no_draft")]
    draft: Option<String>,
    /// Plan without the pack's draft model.
    #[arg(long)]
    no_draft: bool,
    /// Simulate a machine with this much available memory (e.g. 8G, 80GiB) instead of reading this one's.
    #[arg(long, value_parser = parse_size)]
    memory: Option<u64>,
    /// Use at most this much memory (only lowers the budget).
    #[arg(long, value_parser = parse_size)]
    max_memory: Option<u64>,
    /// Most tokens per sequence (only lowers the model's; e.g. 16384 or 16K).
    #[arg(long, value_parser = crate::serve::parse_tokens)]
    max_context: Option<usize>,
    /// Sequence ceiling instead of the device default (8 on CPU, 64 on CUDA); memory may lower it.
    #[arg(long)]
    max_sequences: Option<usize>,
    #[arg(long, value_enum, default_value = "cpu")]
    device: DeviceArg,
    /// Threads for the model (0 = all cores).
    #[arg(long, short, default_value_t = 0)]
    threads: usize,
    /// Most memory the in-memory prefix cache may keep (e.g. 8G; `all` = every page the budget leaves); default:
    /// an eighth of memory, at most 4 GiB.
    #[arg(long, value_parser = parse_cache_size)]
    prefix_cache_memory: Option<CacheSize>,
    /// Print the plan as JSON.
    #[arg(long)]
    json: bool,
}

/// `--prefix-cache-memory`: a size, or `all`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheSize {
    Bytes(u64),
    All,
}

pub fn parse_cache_size(s: &str) -> Result<CacheSize, String> {
    match s.trim() {
        "all" => Ok(CacheSize::All),
        "0" => Ok(CacheSize::Bytes(0)),
        other => parse_size(other).map(CacheSize::Bytes),
    }
}

/// The plan's prefix-cache cap for `--prefix-cache-memory` (`None` given: the default for `memory`).
pub fn prefix_cache_bytes(flag: Option<CacheSize>, memory: &DeviceMemory) -> Option<u64> {
    match flag {
        None => Some(plan::default_prefix_cache_bytes(memory)),
        Some(CacheSize::Bytes(b)) => Some(b),
        Some(CacheSize::All) => None,
    }
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum DeviceArg {
    Cpu,
    Cuda,
}

pub fn parse_size(s: &str) -> Result<u64, String> {
    plan::parse_bytes(s).map_err(|e| e.to_string())
}

/// The catalog name of a pack's draft file (from its manifest), if the pack has one.
pub fn default_draft(model: &str) -> Option<&'static str> {
    let file = &pack::pack(model)?.draft.as_ref()?.file;
    pack::catalog().entries.iter().find(|e| &e.file == file).map(|e| e.name.as_str())
}

/// A catalog name or path, resolved without fetching: planning must not download gigabytes.
fn resolve(model: &str) -> Result<std::path::PathBuf> {
    pack::resolve(model).with_context(|| format!("planning needs the GGUF header of {model}"))
}

/// The plan input of a model: from its GGUF header when the file is in the cache; for a pack file not pulled yet,
/// from the shapes its manifest records (`spec`). The flag says the manifest was used.
fn input_for(name: &str, spec: Option<&pack::FileSpec>) -> Result<(ModelInput, bool)> {
    match resolve(name) {
        Ok(path) => Ok((model_input(&path)?, false)),
        Err(e) => match spec.and_then(|f| f.shapes) {
            Some(s) => Ok((manifest_input(&s), true)),
            None => Err(e),
        },
    }
}

/// The plan input a pack manifest records for one of its files (tested equal to the file's GGUF header).
pub fn manifest_input(s: &pack::Shapes) -> ModelInput {
    // A manifest records no weight types: an f16 cache, as every quantized file's.
    ModelInput { shapes: s.model, weight_bytes: s.weight_bytes, kv_value_bytes: 2, experts: s.experts, recurrent: None }
}

/// The experts of a mixture-of-experts file, `None` for a dense one.
pub fn experts_input(file: &gguf::GgufFile, c: &models::ModelConfig) -> Result<Option<plan::ExpertShapes>> {
    Ok(match c.arch.recipe().ffn {
        models::arch::FfnKind::SwiGlu => None,
        models::arch::FfnKind::Experts { .. } => {
            let e = models::arch::qwen3moe::experts_spec(file, c.arch)?;
            // The experts' 3-D tensors (`ffn_{gate,up,down,gate_up}_exps`); the shared expert counts as dense.
            let bytes = file.tensors.iter().filter(|t| t.dims.len() == 3).map(|t| t.size_bytes).sum();
            Some(plan::ExpertShapes {
                num_experts: e.num_experts,
                num_used: e.num_used,
                expert_ffn: e.expert_ffn,
                bytes,
            })
        }
    })
}

/// Shapes and weight bytes from a GGUF header.
pub fn model_input(path: &Path) -> Result<ModelInput> {
    let file = gguf::GgufFile::open(path).with_context(|| format!("reading {}", path.display()))?;
    let c =
        models::arch::config_from_gguf(&file).with_context(|| format!("reading the shapes of {}", path.display()))?;
    let weight_bytes = file.tensors.iter().map(|t| t.size_bytes).sum();
    let kv_value_bytes = models::cpu::kv_type(&file, &c).bytes() as u64;
    let experts = experts_input(&file, &c)?;
    // A hybrid's Gated DeltaNet layers: no KV, a state per sequence (and its checkpoints).
    let recurrent = models::arch::qwen35::hybrid_from_gguf(&file, &c)?.map(|h| {
        let num_recurrent = h.recurrent.iter().filter(|&&r| r).count();
        plan::RecurrentShapes {
            num_kv_layers: h.recurrent.len() - num_recurrent,
            state_bytes: (num_recurrent * 4 * h.spec.state_len()) as u64,
        }
    });
    Ok(ModelInput { shapes: c.shapes, weight_bytes, kv_value_bytes, experts, recurrent })
}

/// Threads the model will use: `0` means all cores.
pub fn num_threads(threads: usize) -> usize {
    if threads > 0 { threads } else { std::thread::available_parallelism().map_or(1, |n| n.get()) }
}

/// This machine's CPU memory, or a simulated size.
pub fn device_memory(simulated: Option<u64>) -> Result<DeviceMemory> {
    match simulated {
        Some(b) => Ok(DeviceMemory::simulated(b)),
        None => plan::cpu_memory().context("reading /proc/meminfo"),
    }
}

/// Free and total memory of CUDA device 0 (cuMemGetInfo), as the CUDA runner would find it before loading.
pub fn cuda_memory() -> Result<DeviceMemory> {
    let gpu =
        backend::cuda::Gpu::new(0).map_err(|e| anyhow::anyhow!("--device cuda: {e} (plan for a GPU with --memory)"))?;
    let (free, total) = gpu.mem_info().map_err(|e| anyhow::anyhow!("reading free CUDA memory: {e}"))?;
    Ok(DeviceMemory {
        total_bytes: total as u64,
        available_bytes: free as u64,
        cgroup_limit_bytes: None,
        source: format!("cuMemGetInfo on {} (free device memory)", gpu.name),
    })
}

pub fn main(a: Args) -> Result<()> {
    let device = match a.device {
        DeviceArg::Cpu => Device::Cpu,
        DeviceArg::Cuda => Device::Cuda,
    };
    let manifest = pack::pack(&a.model);
    let (target, mut from_manifest) = input_for(&a.model, manifest.map(|m| &m.target))?;
    let draft_name = if a.no_draft { None } else { a.draft.as_deref().or(default_draft(&a.model)) };
    let draft = match draft_name {
        None => None,
        Some(d) => {
            // The pack's own draft spec, or the named pack's target.
            let spec = match a.draft.as_deref() {
                Some(name) => pack::pack(name).map(|m| &m.target),
                None => manifest.and_then(|m| m.draft.as_ref()),
            };
            let (input, m) = input_for(d, spec)?;
            from_manifest |= m;
            Some(input)
        }
    };
    let memory = match (device, a.memory) {
        (Device::Cuda, None) => cuda_memory()?,
        (_, m) => device_memory(m)?,
    };
    let prefix_cache = prefix_cache_bytes(a.prefix_cache_memory, &memory);
    let mut input = PlanInput::new(target, memory, device);
    input.prefix_cache_bytes = prefix_cache;
    input.draft = draft;
    input.max_memory_bytes = a.max_memory;
    input.max_context = a.max_context;
    input.max_sequences = a.max_sequences;
    input.num_threads = num_threads(a.threads);
    let p: Plan = plan::plan(&input)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&p)?);
    } else {
        println!("model            {}{}", a.model, draft_name.map_or(String::new(), |d| format!(" (draft {d})")));
        if from_manifest {
            println!("shapes           from the pack manifest (not pulled yet)");
        }
        println!("{p}");
    }
    Ok(())
}
