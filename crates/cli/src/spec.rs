//! Speculative-decoding options shared by `run`, `bench` and `serve`: which proposers to use, the draft model
//! (by default the pack's own), the most draft tokens per step; and turning them into a ready engine.

use crate::load::AnyRunner;
use anyhow::{Context, Result};
use engine::spec::PassCosts;
use engine::{Engine, SpecConfig};
use models::Runner;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SpecMode {
    /// Prompt lookup and the pack's draft model, whichever is likelier to pay, at an adaptive depth.
    Auto,
    /// Prompt lookup (n-gram) only.
    Ngram,
    /// The draft model only.
    Draft,
    /// Plain decoding.
    Off,
}

#[derive(clap::Args, Debug, Clone)]
pub struct SpecArgs {
    /// Speculative decoding: auto, ngram, draft or off.
    #[arg(long = "spec-mode", value_enum, default_value_t = SpecMode::Auto)]
    pub mode: SpecMode,
    /// Draft model (catalog name or .gguf path); default: the pack's draft.
    #[arg(long)]
    pub draft: Option<String>,
    /// Most draft tokens per verification.
    #[arg(long, default_value_t = 8)]
    pub spec_depth: usize,
    /// Always draft the full depth instead of choosing it from measured acceptance and cost.
    #[arg(long)]
    pub spec_fixed_depth: bool,
    /// Draft the depth chosen before drafting in full, instead of stopping a greedy draft early when the draft model
    /// is unsure of its last token.
    #[arg(long)]
    pub no_draft_confidence: bool,
    /// The draft model's output head covers this many token ids: the most frequent in code and prose when the
    /// tokenizer has a built-in ranking (Qwen2's does), else the lowest ids (0 = all ids).
    #[arg(long, default_value_t = SpecConfig::default().draft_vocab)]
    pub draft_vocab: usize,
    /// Measure the pass costs again instead of using the ones cached in $SPLASH_HOME/calibration (measure on a quiet
    /// machine: the depth choice relies on them).
    #[arg(long)]
    pub recalibrate: bool,
}

impl SpecArgs {
    pub fn config(&self, mode: SpecMode) -> SpecConfig {
        let (ngram, draft_model) = match mode {
            SpecMode::Auto => (true, true),
            SpecMode::Ngram => (true, false),
            SpecMode::Draft => (false, true),
            SpecMode::Off => return SpecConfig::off(),
        };
        SpecConfig {
            max_draft_tokens: self.spec_depth,
            ngram,
            draft_model,
            adaptive: !self.spec_fixed_depth,
            draft_confidence: !self.no_draft_confidence,
            draft_vocab: self.draft_vocab,
            ..SpecConfig::default()
        }
    }

    /// The draft model to load for `model`, if the mode uses one: `--draft`, else the draft of the pack named
    /// `model`.
    pub fn draft_model(&self, model: &str) -> Option<String> {
        if matches!(self.mode, SpecMode::Off | SpecMode::Ngram) {
            return None;
        }
        self.draft.clone().or_else(|| crate::plan::default_draft(model).map(str::to_string))
    }
}

/// Loads the draft (if any) on `device`, sets the speculation config and sets the pass costs for the adaptive
/// depth: from the cache in $SPLASH_HOME/calibration when this model pair, device, CPU and engine were measured before
/// (the measurement takes a few seconds of start-up), else measured now and cached. `recalibrate` (or
/// `--recalibrate`) always measures.
pub fn setup(
    engine: &mut Engine<AnyRunner>,
    model: &str,
    args: &SpecArgs,
    threads: usize,
    device: crate::load::Device,
    recalibrate: bool,
) -> Result<Option<String>> {
    let recalibrate = recalibrate || args.recalibrate;
    engine.set_spec(args.config(args.mode));
    let draft_name = args.draft_model(model);
    let mut draft_path = None;
    if let Some(name) = &draft_name {
        let path = crate::load::model_path(name)?;
        let file = std::sync::Arc::new(
            gguf::GgufFile::open(&path).with_context(|| format!("loading the draft model {}", path.display()))?,
        );
        draft_path = Some(path);
        let mut runner = crate::load::build_runner(file, threads, device)
            .with_context(|| format!("loading the draft model {name}"))?;
        runner.limit_context(engine.runner().config().max_context);
        // Draft and target hold the same positions; the plan's pages count both.
        runner.set_kv_blocks(engine.runner().kv_usage().capacity_blocks);
        runner.set_prefix_cache_blocks(engine.runner().kv_usage().max_cached_blocks);
        engine.set_draft(runner).with_context(|| format!("using {name} as draft"))?;
    }
    if args.mode == SpecMode::Off {
        return Ok(draft_name);
    }
    let cache = calibration_path(engine, &crate::load::model_path(model)?, draft_path.as_deref());
    match std::fs::read_to_string(&cache).ok().and_then(|t| parse_costs(&t)) {
        Some(costs) if !recalibrate => engine.set_pass_costs(costs),
        _ => {
            engine.calibrate().context("measuring pass costs")?;
            if let Some(dir) = cache.parent() {
                let _ = std::fs::create_dir_all(dir);
                let _ = std::fs::write(&cache, format_costs(engine.pass_costs()));
            }
        }
    }
    Ok(draft_name)
}

/// Where the pass costs of this target and draft file (path, size, modification time), device, CPU, binary and
/// speculation settings are cached.
fn calibration_path(
    engine: &Engine<AnyRunner>,
    target: &std::path::Path,
    draft: Option<&std::path::Path>,
) -> std::path::PathBuf {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    for p in std::iter::once(target).chain(draft) {
        h.update(p.to_string_lossy().as_bytes());
        if let Ok(m) = std::fs::metadata(p) {
            h.update(m.len().to_le_bytes());
            h.update(format!("{:?}", m.modified().ok()));
        }
    }
    let spec = &engine.config().spec;
    h.update(format!(
        "{} depth={} draft_vocab={}",
        engine.runner().device_name(),
        spec.max_draft_tokens,
        spec.draft_vocab
    ));
    // The kernels' speed changes with the binary, whatever its version says.
    if let Some(m) = std::env::current_exe().ok().and_then(|p| std::fs::metadata(p).ok()) {
        h.update(m.len().to_le_bytes());
        h.update(format!("{:?}", m.modified().ok()));
    }
    let cpu = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    h.update(cpu.lines().find(|l| l.starts_with("model name")).unwrap_or(""));
    h.update(env!("CARGO_PKG_VERSION"));
    let key: String = h.finalize()[..8].iter().map(|b| format!("{b:02x}")).collect();
    pack::home().join("calibration").join(format!("{key}.txt"))
}

/// `target ROWS SECONDS` lines and one `draft SECONDS` line.
fn format_costs(c: &PassCosts) -> String {
    let mut s: String = c.target.iter().map(|(r, t)| format!("target {r} {t:e}\n")).collect();
    s.push_str(&format!("draft {:e}\n", c.draft_s));
    s
}

fn parse_costs(text: &str) -> Option<PassCosts> {
    let mut c = PassCosts::default();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        match f.as_slice() {
            ["target", r, t] => c.target.push((r.parse().ok()?, t.parse().ok()?)),
            ["draft", t] => c.draft_s = t.parse().ok()?,
            _ => return None,
        }
    }
    let valid = !c.target.is_empty() && c.target.iter().all(|&(r, t)| r > 0 && t.is_finite() && t > 0.0);
    valid.then_some(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn costs_round_trip_and_bad_files_are_ignored() {
        let c = PassCosts { target: vec![(1, 0.031), (9, 0.072)], draft_s: 0.014 };
        let back = parse_costs(&format_costs(&c)).expect("parses");
        assert_eq!(back.target, c.target);
        assert_eq!(back.draft_s, c.draft_s);
        assert!(parse_costs("target 1 x\n").is_none());
        assert!(parse_costs("").is_none());
        assert!(parse_costs("target 0 0.1\n").is_none());
    }
}
