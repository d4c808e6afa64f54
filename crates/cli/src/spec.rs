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
    /// Start from the pass costs in this file (`target ROWS SECONDS` and `draft SECONDS` lines, as in
    /// $SPLASH_HOME/calibration) instead of measuring or the cache, even when they fail the sanity check: to test how
    /// decoding corrects a bad calibration. Nothing is written back.
    #[arg(long, value_name = "FILE")]
    pub pass_costs: Option<std::path::PathBuf>,
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
    /// `model`, else (a bare file) the draft of the pack whose tokenizer fingerprint the file has ([`paired_draft`]).
    pub fn draft_model(&self, model: &str) -> Option<String> {
        if matches!(self.mode, SpecMode::Off | SpecMode::Ngram) {
            return None;
        }
        self.draft
            .clone()
            .or_else(|| crate::plan::default_draft(model).map(str::to_string))
            .or_else(|| paired_draft(model).ok().flatten().map(|(draft, _)| draft))
    }
}

/// For a target given as a file that is no pack's: the catalog name of the draft of the built-in pack whose tokenizer
/// fingerprint ([`pack::tokenizer_fingerprint`]) the file has, with that pack's name. `Ok(None)` when `model` is a
/// pack or catalog name, or no pack's tokenizer matches.
fn paired_draft(model: &str) -> Result<Option<(String, &'static str)>> {
    let path = std::path::Path::new(model);
    if pack::pack(model).is_some() || pack::catalog().get(model).is_some() || !path.is_file() {
        return Ok(None);
    }
    let fingerprint = pack::tokenizer_fingerprint_of(path)?;
    let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let Some(m) = pack::draft_pack_for(pack::builtin_packs(), &fingerprint, size) else { return Ok(None) };
    let draft = m.draft.as_ref().map(|d| d.file.as_str());
    Ok(pack::catalog()
        .entries
        .iter()
        .find(|e| Some(e.file.as_str()) == draft)
        .map(|e| (e.name.clone(), m.name.as_str())))
}

/// Says at start which draft a bare target file got by its tokenizer, or that none matched.
fn report_pairing(model: &str, args: &SpecArgs) {
    if args.draft.is_some() || matches!(args.mode, SpecMode::Off | SpecMode::Ngram) {
        return;
    }
    let path = std::path::Path::new(model);
    if pack::pack(model).is_some() || pack::catalog().get(model).is_some() || !path.is_file() {
        return;
    }
    match paired_draft(model) {
        Ok(Some((draft, pack))) => {
            eprintln!("draft: {draft} (this file's tokenizer is the {pack} pack's, fingerprint matched)")
        }
        Ok(None) => eprintln!(
            "no draft model: no pack's draft shares this file's tokenizer (ids, merges, specials); speculation uses \
             prompt lookup only (--draft FILE picks one)"
        ),
        Err(e) => eprintln!("no draft model: reading this file's tokenizer for pairing failed ({e})"),
    }
}

/// Loads the draft (if any) on `device`, sets the speculation config and sets the pass costs for the adaptive
/// depth: from the cache in $SPLASH_HOME/calibration when this model pair, device, CPU and engine were measured before
/// (the measurement takes a few seconds of start-up), else measured now and cached. `recalibrate` (or
/// `--recalibrate`) always measures. Returns the draft's name and, when a fresh measurement still fails its sanity
/// check, why (decoding measures the costs anew; the caller says so where its output allows).
pub fn setup(
    engine: &mut Engine<AnyRunner>,
    model: &str,
    args: &SpecArgs,
    threads: usize,
    device: crate::load::Device,
    recalibrate: bool,
) -> Result<(Option<String>, Option<String>)> {
    let recalibrate = recalibrate || args.recalibrate;
    engine.set_spec(args.config(args.mode));
    report_pairing(model, args);
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
        return Ok((draft_name, None));
    }
    if let Some(file) = &args.pass_costs {
        let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        let costs = parse_costs(&text).with_context(|| format!("{}: not a pass-cost file", file.display()))?;
        if let Err(problem) = costs.check() {
            eprintln!("pass costs from {}: {problem} (used as given)", file.display());
        }
        engine.set_pass_costs_measured_at(costs, modified_unix(file));
        return Ok((draft_name, None));
    }
    let cache = calibration_path(engine, &crate::load::model_path(model)?, draft_path.as_deref());
    let cached = if recalibrate { None } else { load_costs(&cache) };
    let mut warning = None;
    match cached {
        Some(costs) => engine.set_pass_costs_measured_at(costs, modified_unix(&cache)),
        None => {
            engine.calibrate().context("measuring pass costs")?;
            if let Err(problem) = engine.pass_costs().check() {
                warning = Some(format!(
                    "pass costs look wrong after measuring again ({problem}); decoding measures them anew"
                ));
            }
            save_costs(&cache, engine.pass_costs());
        }
    }
    // What decoding learns is where the next start begins.
    engine.set_cost_sink(move |costs| save_costs(&cache, costs));
    Ok((draft_name, warning))
}

/// The pass costs cached at `path`, if there are any that pass their sanity check ([`PassCosts::check`]); says why
/// a cache is not used.
fn load_costs(path: &std::path::Path) -> Option<PassCosts> {
    let text = std::fs::read_to_string(path).ok()?;
    let problem = match parse_costs(&text) {
        Some(costs) => match costs.check() {
            Ok(()) => return Some(costs),
            Err(problem) => problem,
        },
        None => "unreadable".to_string(),
    };
    eprintln!("pass-cost cache {}: {problem}; measuring again", path.display());
    None
}

/// Writes `costs` to `path` whole (a temporary file renamed into place), when they pass their sanity check; a
/// failure to write only costs the next start a calibration.
fn save_costs(path: &std::path::Path, costs: &PassCosts) {
    if costs.check().is_err() {
        return;
    }
    let Some(dir) = path.parent() else { return };
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let written = std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&tmp, format_costs(costs)))
        .and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// A file's modification time in Unix seconds (0 when unknown).
fn modified_unix(path: &std::path::Path) -> f64 {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0.0, |d| d.as_secs_f64())
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

    /// A calibration of the 1.5B on two cores (30 ms a row, 3 ms per further row, a 5 ms draft pass), with the
    /// multi-row counts and the draft scaled by `inflate`.
    fn calibration_file(inflate: f64) -> String {
        let target: Vec<(usize, f64)> = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 17, 33]
            .iter()
            .map(|&r| (r, if r == 1 { 0.030 } else { inflate * (0.030 + 0.003 * (r - 1) as f64) }))
            .collect();
        format_costs(&PassCosts { target, draft_s: inflate * 0.005 })
    }

    #[test]
    fn a_cache_that_fails_its_check_is_measured_again_and_live_costs_are_saved_whole() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let path = dir.path().join("calibration").join("key.txt");
        // Nothing there yet: measure.
        assert!(load_costs(&path).is_none());
        // A good calibration is saved and used.
        let good = parse_costs(&calibration_file(1.0)).expect("parses");
        save_costs(&path, &good);
        assert_eq!(load_costs(&path).expect("used").target, good.target);
        // Multi-row passes and the draft four times dearer (a busy minute at the first start): two rows would cost
        // more than two single-row passes; measured again.
        std::fs::write(&path, calibration_file(4.0)).expect("write");
        assert!(parse_costs(&calibration_file(4.0)).expect("parses").check().is_err());
        assert!(load_costs(&path).is_none());
        // So would 1.6-fold (an outlier step from one row to two). Inflated 1.2-fold it passes: it is the prior, and
        // decoding corrects it (the engine's speculation tests).
        assert!(parse_costs(&calibration_file(1.6)).expect("parses").check().is_err());
        let mild = parse_costs(&calibration_file(1.2)).expect("parses");
        std::fs::write(&path, calibration_file(1.2)).expect("write");
        assert_eq!(load_costs(&path).expect("used").target, mild.target);
        // Costs that fail the check are never saved (the next start would not use them).
        let falling = PassCosts { target: vec![(1, 0.03), (4, 0.01)], draft_s: 0.005 };
        save_costs(&path, &falling);
        assert_eq!(load_costs(&path).expect("still the last good costs").target, mild.target);
        assert_eq!(std::fs::read_dir(path.parent().expect("dir")).expect("dir").count(), 1, "no temporary left");
    }
}
