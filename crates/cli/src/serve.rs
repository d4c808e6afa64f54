//! `splash serve`: the HTTP server over one engine thread.
//!
//! Loads the model (fetching a catalog model on first use), starts the engine service, binds the address and prints
//! `Ready` with the URL once it accepts requests.
//!
//! Shutdown: the first Ctrl-C or SIGTERM stops accepting connections and lets the open replies finish for up to
//! `--shutdown-timeout`; then the engine cancels what still runs (each stream ends with its protocol's error event)
//! and the connections get a short grace to send it. The prefix cache's owed disk writes are then flushed (at most
//! [`FLUSH_TIMEOUT`]) so that the next start is warm. A second signal at any point exits at once. Connections are
//! HTTP/1.1 with a timeout on reading a request's headers, which also closes a keep-alive connection that stays idle
//! ([`Args::header_timeout`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

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
    /// Most memory the in-memory prefix cache may keep beyond what the planned sequences need (e.g. 8G; `all` =
    /// every page the budget leaves); default: an eighth of memory, at most 4 GiB. The rest stays on disk.
    #[arg(long, value_parser = crate::plan::parse_cache_size)]
    prefix_cache_memory: Option<crate::plan::CacheSize>,
    /// On Ctrl-C or SIGTERM, seconds to let open replies finish before cancelling them (a second signal exits at
    /// once).
    #[arg(long, default_value_t = 10.0, value_parser = parse_seconds)]
    shutdown_timeout: f64,
    /// Seconds a connection may take to send a request's headers, and may stay idle between requests; then it is
    /// closed.
    #[arg(long, default_value_t = 30.0, value_parser = parse_seconds)]
    header_timeout: f64,
}

/// The longest the prefix cache's disk writes may hold up the exit after the drain.
pub const FLUSH_TIMEOUT: Duration = Duration::from_secs(10);
/// After the drain's deadline cancelled the replies, how long their connections get to send the cancellation.
const CANCEL_GRACE: Duration = Duration::from_secs(2);

/// A non-negative number of seconds (`10`, `0.5`).
fn parse_seconds(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if (0.0..=86_400.0).contains(&v) => Ok(v),
        _ => Err(format!("expected a number of seconds from 0 to 86400, got {s:?}")),
    }
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
    let prefix_cache = crate::plan::prefix_cache_bytes(a.prefix_cache_memory, &memory);
    let mut input = plan::PlanInput::new(plan_input(&a.model, &path)?, memory, device);
    input.prefix_cache_bytes = prefix_cache;
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

/// The pack `model` is: a built-in pack's name, or a file (a path or a catalog name in the cache) whose content is
/// a built-in pack's target ([`pack::pack_for_target`]: tokenizer fingerprint, shapes and size), whatever the file is
/// called, so a renamed copy gets the pack's chat template and sampling as its draft. `None` for other files.
pub(crate) fn pack_of(model: &str) -> Result<Option<&'static pack::Manifest>> {
    if let Some(m) = pack::pack(model) {
        return Ok(Some(m));
    }
    let path = match pack::catalog().get(model) {
        Some(_) => match pack::resolve(model) {
            Ok(p) => p,
            Err(_) => return Ok(None),
        },
        None => std::path::PathBuf::from(model),
    };
    if !path.is_file() {
        return Ok(None);
    }
    let file = gguf::GgufFile::open(&path).with_context(|| format!("reading {}", path.display()))?;
    let Ok(fingerprint) = pack::tokenizer_fingerprint(&file) else { return Ok(None) };
    let config =
        models::arch::config_from_gguf(&file).with_context(|| format!("reading the shapes of {}", path.display()))?;
    let shapes = pack::Shapes {
        model: config.shapes,
        weight_bytes: file.tensors.iter().map(|t| t.size_bytes).sum(),
        experts: crate::plan::experts_input(&file, &config)?,
    };
    let size = std::fs::metadata(&path).with_context(|| format!("reading {}", path.display()))?.len();
    Ok(pack::pack_for_target(pack::builtin_packs(), &fingerprint, &shapes, size))
}

/// The model file's chat template, replaced by the pack's corrected one where the model is a pack with one (same
/// BOS/EOS).
pub(crate) fn apply_pack_template(
    pack: Option<&pack::Manifest>,
    template: Option<chat::ChatTemplate>,
) -> Result<Option<chat::ChatTemplate>> {
    let Some(source) = pack.and_then(pack::Manifest::chat_template) else { return Ok(template) };
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
        "plan: context {} tokens x {} sequences, batch {} tokens, KV {} pages of {} tokens ({}; prefix cache in \
         memory at most {}); budget {} of {} available",
        plan.max_context,
        plan.max_sequences,
        plan.max_batch_tokens,
        plan.num_kv_pages,
        plan.page_tokens,
        plan::human_bytes(plan.kv_pool_bytes()),
        plan.prefix_cache_bytes().map_or_else(|| "the whole pool".to_string(), plan::human_bytes),
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
    let model_pack = pack_of(&a.model)?;
    if let Some(m) = model_pack.filter(|m| m.name != a.model) {
        eprintln!("{} is the {} pack's model (same tokenizer, shapes and size)", a.model, m.name);
    }
    let template = apply_pack_template(model_pack, template)?;
    runner.limit_context(plan.max_context);
    runner.set_kv_blocks(plan.num_kv_pages);
    runner.set_prefix_cache_blocks(plan.max_cached_pages);
    runner.set_max_checkpoints(plan.max_state_checkpoints);
    if template.is_none() {
        eprintln!("warning: {} has no chat template; chat requests will be refused", a.model);
    }
    // The step's budget is the device's: a GPU's step costs hardly more at thousands of tokens than at one, so prompts
    // may fill it while streams decode; a CPU's grows with every token, so prompts keep the default share.
    let on_gpu = matches!(runner, crate::load::AnyRunner::Cuda(_));
    let default = EngineConfig::default();
    let prefill_while_decoding = if on_gpu { plan.max_batch_tokens } else { default.max_prefill_tokens_while_decoding };
    let mut engine = Engine::new(
        runner,
        tokenizer.clone(),
        EngineConfig {
            max_batch_tokens: plan.max_batch_tokens,
            max_prefill_tokens_while_decoding: prefill_while_decoding,
            ..default
        },
    );
    let (draft, warning) = crate::spec::setup(&mut engine, &a.model, &a.spec, a.threads, a.device, false)?;
    if let Some(w) = warning {
        eprintln!("{w}");
    }
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
        // A ceiling: the engine admits requests by the KV memory their prompts need, so more than the plan's
        // full-context sequences run when prompts are shorter.
        max_running: a.max_sequences.unwrap_or(plan.device.default_max_sequences()).max(plan.max_sequences),
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
    if let Some(m) = model_pack {
        apply_pack_sampling(&mut config.default_sampling, &m.sampling);
    }
    let max_context = handle.limits().max_context;
    let engine_handle = handle.clone();
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
    let timeouts = Timeouts {
        shutdown: Duration::from_secs_f64(a.shutdown_timeout),
        header: Duration::from_secs_f64(a.header_timeout).max(Duration::from_millis(1)),
    };
    let result = runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind((a.host.as_str(), a.port))
            .await
            .with_context(|| format!("binding {}:{}", a.host, a.port))?;
        let addr = listener.local_addr()?;
        let host = if addr.is_ipv6() { format!("[{}]", addr.ip()) } else { addr.ip().to_string() };
        eprintln!("model {model_id} loaded in {load_s:.1} s; context {max_context} tokens");
        if !a.no_webui {
            eprintln!("web UI: http://{host}:{}/", addr.port());
        }
        let mut signals = Signals::new().context("listening for Ctrl-C and SIGTERM")?;
        println!("Ready: http://{host}:{}/v1", addr.port());
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
        serve(listener, api::router(state), &engine_handle, timeouts, &mut signals).await
    });
    // Connection tasks still open after the drain are dropped here, not waited for.
    runtime.shutdown_timeout(Duration::from_millis(200));
    result
}

#[derive(Debug, Clone, Copy)]
struct Timeouts {
    /// How long open replies may run after the first signal.
    shutdown: Duration,
    /// Header read and keep-alive idle timeout of a connection.
    header: Duration,
}

/// Accepts HTTP/1.1 connections until the first signal, then shuts down in the order the module doc gives.
async fn serve(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    engine: &EngineHandle,
    timeouts: Timeouts,
    signals: &mut Signals,
) -> Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};

    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(timeouts.header);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let signal = loop {
        tokio::select! {
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        // Out of file descriptors and the like: wait instead of spinning.
                        eprintln!("warning: accepting a connection failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let service = hyper_util::service::TowerToHyperService::new(app.clone());
                let conn = builder.serve_connection(TokioIo::new(stream), service);
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    let _ = conn.await;
                });
            }
            name = signals.next() => break name,
        }
    };
    drop(listener);
    let t0 = Instant::now();
    eprintln!(
        "{signal}: shutting down; {} open connections get {:.1} s to finish (a second signal exits at once)",
        graceful.count(),
        timeouts.shutdown.as_secs_f64()
    );
    let drained = graceful.shutdown();
    tokio::pin!(drained);
    let all_closed = tokio::select! {
        () = &mut drained => true,
        () = tokio::time::sleep(timeouts.shutdown) => false,
        name = signals.next() => exit_now(name),
    };
    if !all_closed {
        let stats = engine.stats();
        eprintln!(
            "shutdown: cancelling {} running and {} waiting requests after {:.1} s",
            stats.num_running,
            stats.num_waiting,
            t0.elapsed().as_secs_f64()
        );
        engine.cancel_all();
        tokio::select! {
            () = &mut drained => {}
            () = tokio::time::sleep(CANCEL_GRACE) => eprintln!("shutdown: closing the connections that are still open"),
            name = signals.next() => exit_now(name),
        }
    }
    let flush_engine = engine.clone();
    let flush = tokio::task::spawn_blocking(move || flush_engine.flush(FLUSH_TIMEOUT));
    let flushed = tokio::select! {
        r = flush => r.unwrap_or(false),
        name = signals.next() => exit_now(name),
    };
    if !flushed {
        eprintln!("warning: the prefix cache's disk writes did not finish in {} s", FLUSH_TIMEOUT.as_secs());
    }
    eprintln!("stopped after {:.1} s", t0.elapsed().as_secs_f64());
    Ok(())
}

/// The second signal: leave now, whatever is still open (exit status 128 + the signal's number, as a shell reports
/// a killed process).
fn exit_now(signal: &str) -> ! {
    eprintln!("{signal} again: exiting at once");
    std::process::exit(if signal == "SIGTERM" { 143 } else { 130 })
}

/// Ctrl-C (SIGINT) and SIGTERM, each time they arrive.
struct Signals {
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> std::io::Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(Signals { interrupt: signal(SignalKind::interrupt())?, terminate: signal(SignalKind::terminate())? })
        }
        #[cfg(not(unix))]
        Ok(Signals {})
    }

    /// The next signal's name.
    async fn next(&mut self) -> &'static str {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = self.interrupt.recv() => "SIGINT",
                _ = self.terminate.recv() => "SIGTERM",
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            "Ctrl-C"
        }
    }
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
    fn pack_templates_replace_the_files_for_packs() {
        let file_template = || Some(chat::ChatTemplate::new("{{ messages }}", "<s>", "<|im_end|>").expect("compiles"));
        let corrected = pack::builtin_template("qwen2.5-coder.jinja").expect("built in");
        for model in ["qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"] {
            let t = apply_pack_template(pack::pack(model), file_template()).expect("applies").expect("a template");
            assert_eq!((t.source(), t.eos_token()), (corrected, "<|im_end|>"), "{model}");
        }
        // Qwen3-Coder's vendored template (compiled by our engine), so calls are read and written in its XML form.
        let t = apply_pack_template(pack::pack("qwen3-coder-30b-a3b"), file_template()).expect("compiles");
        let t = t.expect("a template");
        assert_eq!(t.source(), pack::builtin_template("qwen3-coder.jinja").expect("built in"));
        assert!(t.source().contains("<function=") && t.eos_token() == "<|im_end|>");
        for pack in [pack::pack("smollm2-135m"), None] {
            let t = apply_pack_template(pack, file_template()).expect("applies").expect("a template");
            assert_eq!(t.source(), "{{ messages }}", "{pack:?}");
        }
        assert!(apply_pack_template(pack::pack("qwen2.5-coder-1.5b"), None).expect("none stays none").is_none());
    }

    /// A copy of a pack's file under another name is that pack (its template, sampling and draft); another file is
    /// none, and a path that is no file is none. Uses the real files when they are in the cache.
    #[test]
    fn a_renamed_copy_of_a_packs_file_is_the_pack() {
        assert_eq!(pack_of("qwen2.5-coder-1.5b").expect("a name").map(|m| m.name.as_str()), Some("qwen2.5-coder-1.5b"));
        assert!(pack_of("/nonexistent/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf").expect("no file").is_none());
        let dir = tempfile::tempdir().expect("temp dir");
        let models = pack::home().join("models");
        let file_template = || Some(chat::ChatTemplate::new("{{ messages }}", "<s>", "<|im_end|>").expect("compiles"));
        let spec = crate::spec::SpecArgs {
            mode: crate::spec::SpecMode::Auto,
            draft: None,
            spec_depth: 8,
            spec_fixed_depth: false,
            no_draft_confidence: false,
            draft_vocab: engine::SpecConfig::default().draft_vocab,
            recalibrate: false,
            pass_costs: None,
        };
        for (i, (file, want)) in [
            ("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", Some("qwen2.5-coder-1.5b")),
            ("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", Some("qwen2.5-coder-0.5b")),
            ("SmolLM2-135M-Instruct.Q4_1.gguf", Some("smollm2-135m")),
        ]
        .into_iter()
        .enumerate()
        {
            let original = models.join(file);
            if !original.is_file() {
                eprintln!("{file} is not in the cache; its renamed copy is not checked");
                continue;
            }
            let copy = dir.path().join(format!("renamed-{i}.gguf"));
            std::fs::hard_link(&original, &copy)
                .or_else(|_| std::fs::copy(&original, &copy).map(|_| ()))
                .expect("copy");
            let model = copy.to_str().expect("utf-8 path");
            let found = pack_of(model).expect("reads the copy").expect("a pack's file");
            assert_eq!(Some(found.name.as_str()), want, "{file}");
            let t = apply_pack_template(Some(found), file_template()).expect("applies").expect("a template");
            assert_eq!(t.source(), found.chat_template().unwrap_or("{{ messages }}"), "{file}");
            // And the pack's draft, by catalog name.
            let draft = found.draft.as_ref().and_then(|d| pack::catalog().entries.iter().find(|e| e.file == d.file));
            assert_eq!(spec.draft_model(model), draft.map(|e| e.name.clone()), "{file}");
        }
        // A file that is a GGUF but no pack's target: none.
        let other = dir.path().join("other.gguf");
        let mut w = gguf::GgufWriter::new();
        w.add("general.architecture", gguf::Value::String("llama".into()));
        std::fs::write(&other, w.to_bytes()).expect("write");
        assert!(pack_of(other.to_str().expect("utf-8 path")).expect("reads it").is_none());
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
