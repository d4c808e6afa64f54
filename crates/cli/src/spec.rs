//! Speculative-decoding options shared by `run`, `bench` and `serve`: which proposers to use, the draft model
//! (by default the pack's own), the most draft tokens per step; and turning them into a ready engine.

use crate::load::AnyRunner;
use anyhow::{Context, Result};
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

/// Loads the draft (if any), sets the speculation config and measures pass costs for the adaptive depth.
pub fn setup(
    engine: &mut Engine<AnyRunner>,
    model: &str,
    args: &SpecArgs,
    threads: usize,
    device: crate::load::Device,
) -> Result<Option<String>> {
    engine.set_spec(args.config(args.mode));
    let draft_name = args.draft_model(model);
    if let Some(name) = &draft_name {
        let loaded =
            crate::load::load(name, threads, device).with_context(|| format!("loading the draft model {name}"))?;
        let mut runner = loaded.runner;
        runner.limit_context(engine.runner().config().max_context);
        // Draft and target hold the same positions; the plan's pages count both.
        runner.set_kv_blocks(engine.runner().kv_usage().capacity_blocks);
        engine.set_draft(runner).with_context(|| format!("using {name} as draft"))?;
    }
    if args.mode != SpecMode::Off {
        engine.calibrate().context("measuring pass costs")?;
    }
    Ok(draft_name)
}
