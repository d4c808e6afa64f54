//! `splash serve`: the HTTP server over one engine thread.
//!
//! Loads the model (fetching a catalog model on first use), starts the engine service, binds the address and prints
//! `Ready` with the URL once it accepts requests. Ctrl-C or SIGTERM stops it after open requests finish.

use std::sync::Arc;

use anyhow::{Context, Result};
use api::{AppState, ServerConfig};
use engine::service::{EngineHandle, ServiceConfig};
use engine::{Engine, EngineConfig};

use crate::load::{Device, Loaded, load};

#[derive(clap::Args)]
pub struct Args {
    /// Model: a catalog name (qwen2.5-coder-1.5b, qwen2.5-coder-0.5b, smollm2-135m) or a .gguf path.
    #[arg(long, short, default_value = "qwen2.5-coder-1.5b")]
    model: String,
    /// Address to bind. Anything but loopback exposes the server to the network.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    #[arg(long, env = "SPLASH_PORT", default_value_t = 8000)]
    port: u16,
    /// Also accept this name in the Host header (repeatable; `*` accepts any). Loopback names and the bound
    /// address are always accepted; others are refused (DNS-rebinding guard).
    #[arg(long)]
    allowed_host: Vec<String>,
    /// Require this key as `Authorization: Bearer KEY` or `x-api-key: KEY` (/health stays open).
    #[arg(long, env = "SPLASH_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Most tokens of prompt and output per request (e.g. 16384 or 16K); default: the model's context, or what the
    /// memory plan allows.
    #[arg(long, value_parser = parse_tokens)]
    max_context: Option<usize>,
    /// The model id clients use (repeatable: the first is reported, the others are aliases). Default: the --model name
    /// or the file's stem.
    #[arg(long)]
    served_model_name: Vec<String>,
    /// Most requests generating at once, instead of the device default (8 on CPU); the memory plan may lower it.
    #[arg(long)]
    max_sequences: Option<usize>,
    /// Use at most this much memory (e.g. 8G); the plan sizes context, sequences and KV cache within it.
    #[arg(long, value_parser = crate::plan::parse_size)]
    max_memory: Option<u64>,
    /// Most requests waiting for a slot; more get 429.
    #[arg(long, default_value_t = 64)]
    max_queue: usize,
    /// Output cap for requests that set none (always lowered to what fits the context).
    #[arg(long, default_value_t = 16384, value_parser = parse_tokens)]
    default_max_tokens: usize,
    /// Stop a reply whose end repeats itself exactly over this many bytes, reported as the output limit (0 = off).
    #[arg(long, default_value_t = 2048)]
    repetition_guard: usize,
    /// Do not serve the web UI (the chat page at `/`).
    #[arg(long)]
    no_webui: bool,
    /// With tools and `tool_choice: auto`, let the model write calls freely (no grammar once a call starts).
    #[arg(long)]
    no_tool_grammar: bool,
    /// A thinking model's reasoning (`<think>` … `</think>`, when its chat template has it): `auto` sends it apart
    /// from the content (`reasoning_content`, reasoning items, thinking blocks); `none` leaves it in the content.
    #[arg(long, value_enum, default_value = "auto")]
    reasoning_format: ReasoningFormatArg,
    /// Threads for the model (0 = all cores).
    #[arg(long, short, default_value_t = 0)]
    threads: usize,
    /// Where the model runs.
    #[arg(long, value_enum, default_value = "auto")]
    device: crate::load::Device,
    #[command(flatten)]
    spec: crate::spec::SpecArgs,
    /// Keep cached prompt prefixes on disk (in $SPLASH_HOME/prefix-cache) up to this size, so they are warm after a
    /// restart (per model: target and draft each); 0 turns it off.
    #[arg(long, default_value = "4G", value_parser = parse_size_or_zero)]
    prefix_cache_disk: u64,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum ReasoningFormatArg {
    None,
    Auto,
}

/// A size (`4G`, `512M`, bytes) or `0`.
fn parse_size_or_zero(s: &str) -> Result<u64, String> {
    if s.trim() == "0" { Ok(0) } else { crate::plan::parse_size(s) }
}

/// `16384`, `16K` or `16k` (×1024).
pub fn parse_tokens(s: &str) -> Result<usize, String> {
    let (digits, scale) = match s.strip_suffix(['K', 'k']) {
        Some(d) => (d, 1024),
        None => (s, 1),
    };
    let n: usize =
        digits.trim().parse().map_err(|_| format!("expected a number of tokens such as 16384 or 16K, got {s:?}"))?;
    if n == 0 {
        return Err("must be at least 1".into());
    }
    Ok(n * scale)
}

/// The default model id: the catalog name as given, or the file name without `.gguf`.
fn default_model_id(model: &str) -> String {
    let path = std::path::Path::new(model);
    if model.ends_with(".gguf") || path.components().count() > 1 {
        path.file_stem().map_or_else(|| model.to_string(), |s| s.to_string_lossy().into_owned())
    } else {
        model.to_string()
    }
}

/// The memory plan for serving `model` (with its draft, when speculation uses one) on this machine; refuses with the
/// breakdown when not even a minimal context fits.
/// The memory plan for the device `serve` will run on: free device memory (cuMemGetInfo) with `--device cuda`, or
/// with `auto` where a GPU is usable; this machine's memory otherwise.
fn memory_plan(a: &Args, device: plan::Device) -> Result<plan::Plan> {
    let path = crate::load::model_path(&a.model)?;
    let memory = match device {
        plan::Device::Cuda => crate::plan::cuda_memory()?,
        plan::Device::Cpu => crate::plan::device_memory(None)?,
    };
    let mut input = plan::PlanInput::new(plan_input(&a.model, &path)?, memory, device);
    if let Some(draft) = a.spec.draft_model(&a.model) {
        input.draft = Some(plan_input(&draft, &crate::load::model_path(&draft)?)?);
    }
    input.max_memory_bytes = a.max_memory;
    input.max_context = a.max_context;
    input.max_sequences = a.max_sequences;
    input.num_threads = crate::plan::num_threads(a.threads);
    Ok(plan::plan(&input)?)
}

/// The plan input of a model: a built-in pack's manifest records its shapes (tested equal to the GGUF header), which
/// saves a header parse (~0.2 s for the 1.5B) before the model itself is loaded; other files are read.
fn plan_input(model: &str, path: &std::path::Path) -> Result<plan::ModelInput> {
    match pack::pack(model).and_then(|m| m.target.shapes) {
        Some(s) => Ok(crate::plan::manifest_input(&s)),
        None => crate::plan::model_input(path),
    }
}

/// The pack `model` names: a built-in pack name, or a path to a file that is some built-in pack's target.
fn pack_of(model: &str) -> Option<&'static pack::Manifest> {
    pack::pack(model).or_else(|| {
        let file = std::path::Path::new(model).file_name()?.to_str()?;
        pack::builtin_packs().iter().find(|m| m.target.file == file)
    })
}

/// The model file's chat template, replaced by the pack's corrected one where the pack has one (same BOS/EOS).
pub(crate) fn apply_pack_template(
    model: &str,
    template: Option<chat::ChatTemplate>,
) -> Result<Option<chat::ChatTemplate>> {
    let Some(source) = pack_of(model).and_then(pack::Manifest::chat_template) else { return Ok(template) };
    match template {
        Some(t) => {
            eprintln!("chat template: the pack's corrected template replaces the file's");
            Ok(Some(t.with_source(source).context("compiling the pack's chat template")?))
        }
        None => Ok(None),
    }
}

/// A pack's sampling defaults over the server's, field by field (what the manifest leaves out stays).
fn apply_pack_sampling(dst: &mut engine::SamplingParams, src: &pack::Sampling) {
    if let Some(t) = src.temperature {
        dst.temperature = t;
    }
    if let Some(p) = src.top_p {
        dst.top_p = p;
    }
    if let Some(k) = src.top_k {
        dst.top_k = k as usize;
    }
    if let Some(r) = src.repetition_penalty {
        dst.repetition_penalty = r;
    }
}

pub fn main(a: Args) -> Result<()> {
    let gpu = match a.device {
        Device::Cuda => true,
        Device::Auto => backend::cuda::available().is_ok(),
        Device::Cpu => false,
    };
    let mut plan = memory_plan(&a, if gpu { plan::Device::Cuda } else { plan::Device::Cpu })?;
    if gpu {
        crate::load::set_planned_kv_tokens(plan.num_kv_pages * plan.page_tokens);
    }
    eprintln!(
        "plan: context {} tokens x {} sequences, batch {} tokens, KV {} pages of {} tokens ({}); budget {} of {} available",
        plan.max_context,
        plan.max_sequences,
        plan.max_batch_tokens,
        plan.num_kv_pages,
        plan.page_tokens,
        plan::human_bytes(plan.kv_pool_bytes()),
        plan::human_bytes(plan.breakdown.budget_bytes),
        plan::human_bytes(plan.breakdown.available_bytes),
    );
    let t0 = std::time::Instant::now();
    let Loaded { mut runner, tokenizer, template, .. } = load(&a.model, a.threads, a.device)?;
    if gpu && !matches!(runner, crate::load::AnyRunner::Cuda(_)) {
        // `auto` fell back to the CPU after all: plan for this machine's memory instead.
        crate::load::set_planned_kv_tokens(0);
        plan = memory_plan(&a, plan::Device::Cpu)?;
        eprintln!(
            "plan (CPU): context {} tokens x {} sequences, KV {} pages",
            plan.max_context, plan.max_sequences, plan.num_kv_pages
        );
    }
    let template = apply_pack_template(&a.model, template)?;
    runner.limit_context(plan.max_context);
    runner.set_kv_blocks(plan.num_kv_pages);
    if template.is_none() {
        eprintln!("warning: {} has no chat template; chat requests will be refused", a.model);
    }
    let mut engine = Engine::new(
        runner,
        tokenizer.clone(),
        EngineConfig { max_batch_tokens: plan.max_batch_tokens, ..EngineConfig::default() },
    );
    let draft = crate::spec::setup(&mut engine, &a.model, &a.spec, a.threads, a.device, false)?;
    // Constrained decoding's token trie (~0.2 s for Qwen's vocabulary), built in the background once the engine is set
    // up (not during speculation's cost calibration, which it would skew).
    let warm_tokenizer = tokenizer.clone();
    std::thread::spawn(move || {
        let t0 = std::time::Instant::now();
        match api::constraint::warm_up(&warm_tokenizer) {
            Ok(()) => eprintln!("constrained decoding ready in {:.0} ms", t0.elapsed().as_secs_f64() * 1000.0),
            Err(e) => eprintln!("warning: constrained decoding is unavailable: {}", e.message),
        }
    });
    if a.prefix_cache_disk > 0 {
        let root = pack::home().join("prefix-cache");
        let store = engine.runner_mut().enable_prefix_store(&root, a.prefix_cache_disk);
        match store {
            Ok(s) => eprintln!("prefix cache on disk: {} ({} blocks)", s.dir().display(), s.num_blocks()),
            Err(e) => eprintln!("warning: no prefix cache on disk ({}): {e}", root.display()),
        }
        if let Some(d) = engine.draft_mut()
            && let Err(e) = d.enable_prefix_store(&root, a.prefix_cache_disk)
        {
            eprintln!("warning: no draft prefix cache on disk: {e}");
        }
    }
    if let Some(name) = &draft {
        eprintln!("speculation: {:?}, draft {name}", a.spec.mode);
    }
    let load_s = t0.elapsed().as_secs_f64();
    let service = ServiceConfig {
        max_running: plan.max_sequences,
        max_waiting: a.max_queue,
        max_context: Some(plan.max_context),
    };
    let handle = EngineHandle::spawn(engine, service).context("starting the engine thread")?;
    let mut names = a.served_model_name.into_iter();
    let model_id = names.next().unwrap_or_else(|| default_model_id(&a.model));
    let mut allowed_hosts = a.allowed_host;
    if !matches!(a.host.as_str(), "0.0.0.0" | "::" | "[::]") {
        allowed_hosts.push(a.host.clone());
    }
    let mut config = ServerConfig {
        api_key: a.api_key.filter(|k| !k.is_empty()),
        allowed_hosts,
        default_max_tokens: a.default_max_tokens,
        max_repeated_chars: (a.repetition_guard > 0).then_some(a.repetition_guard),
        webui: !a.no_webui,
        tool_grammar: !a.no_tool_grammar,
        reasoning_format: match a.reasoning_format {
            ReasoningFormatArg::None => api::ReasoningFormat::None,
            ReasoningFormatArg::Auto => api::ReasoningFormat::Auto,
        },
        ..Default::default()
    };
    if let Some(m) = pack_of(&a.model) {
        apply_pack_sampling(&mut config.default_sampling, &m.sampling);
    }
    let max_context = handle.limits().max_context;
    let mut state = AppState::new(handle, tokenizer, template, model_id.clone(), config);
    state.aliases = names.collect();
    state.memory_plan = Some(serde_json::to_value(&plan).context("serializing the plan")?);
    let state = Arc::new(state);

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("splash-http")
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind((a.host.as_str(), a.port))
            .await
            .with_context(|| format!("binding {}:{}", a.host, a.port))?;
        let addr = listener.local_addr()?;
        let host = if addr.is_ipv6() { format!("[{}]", addr.ip()) } else { addr.ip().to_string() };
        eprintln!("model {model_id} loaded in {load_s:.1} s; context {max_context} tokens");
        if !a.no_webui {
            eprintln!("web UI: http://{host}:{}/", addr.port());
        }
        println!("Ready: http://{host}:{}/v1", addr.port());
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
        axum::serve(listener, api::router(state)).with_graceful_shutdown(shutdown_signal()).await.context("serving")
    })
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
    eprintln!("shutting down");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_counts_and_model_ids() {
        assert_eq!(parse_tokens("16384"), Ok(16384));
        assert_eq!(parse_tokens("16K"), Ok(16384));
        assert_eq!(parse_tokens("2k"), Ok(2048));
        assert!(parse_tokens("0").is_err() && parse_tokens("lots").is_err());
        assert_eq!(default_model_id("qwen2.5-coder-0.5b"), "qwen2.5-coder-0.5b");
        assert_eq!(default_model_id("/m/SmolLM2-135M-Instruct.Q4_1.gguf"), "SmolLM2-135M-Instruct.Q4_1");
    }

    #[test]
    fn pack_templates_replace_the_files_for_names_and_paths() {
        let file_template = || Some(chat::ChatTemplate::new("{{ messages }}", "<s>", "<|im_end|>").expect("compiles"));
        let corrected = pack::builtin_template("qwen2.5-coder.jinja").expect("built in");
        for model in ["qwen2.5-coder-1.5b", "/x/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "qwen2.5-coder-0.5b"] {
            let t = apply_pack_template(model, file_template()).expect("applies").expect("a template");
            assert_eq!((t.source(), t.eos_token()), (corrected, "<|im_end|>"), "{model}");
        }
        for model in ["smollm2-135m", "/x/other.gguf"] {
            let t = apply_pack_template(model, file_template()).expect("applies").expect("a template");
            assert_eq!(t.source(), "{{ messages }}", "{model}");
        }
        assert!(apply_pack_template("qwen2.5-coder-1.5b", None).expect("no template stays none").is_none());
    }

    #[test]
    fn pack_sampling_overrides_only_what_it_sets() {
        let mut s = engine::SamplingParams { temperature: 0.7, top_p: 0.8, top_k: 20, ..Default::default() };
        apply_pack_sampling(&mut s, &pack::pack("smollm2-135m").expect("built in").sampling);
        assert_eq!((s.temperature, s.top_p, s.top_k, s.repetition_penalty), (0.2, 0.9, 20, 1.0));
        apply_pack_sampling(&mut s, &pack::pack("qwen2.5-coder-1.5b").expect("built in").sampling);
        assert_eq!((s.temperature, s.top_p, s.top_k, s.repetition_penalty), (0.7, 0.8, 20, 1.05));
    }
}
