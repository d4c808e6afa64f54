//! The correctness report of a backend: mean KL divergence and top-1 agreement of its next-token distributions
//! against the f32 reference ([`models::reference::Reference`]) over real text, as llama.cpp's
//! `llama-perplexity --kl-divergence` reports a quantized model against its base.
//!
//! The text (fixtures/kld: prose, then code of this repository; built into the binary) is tokenized with the model's
//! tokenizer and cut into windows of `ctx` tokens, as llama-perplexity does: the first half of each window is
//! context only, and the positions `ctx/2 .. ctx-1` are scored (each predicting the next token of the window), so
//! every scored position sees at least `ctx/2` tokens. The backends' scored half runs in chunks of `rows` rows
//! (`--kld-rows`): the whole half (a prefill chunk, the default), or 1 (decode steps) or k+1 (speculative
//! verification), so each of a backend's paths — a GPU runs other kernels for a few rows than for many — is measured. Per position: KL(reference ‖ backend) over the whole
//! vocabulary, both distributions' log-probability of the true next token (perplexities), whether the two argmaxes
//! agree, and Δp (the backend's probability of the true token minus the reference's). Each window runs as two
//! chunks (context, then the scored half with every row's logits), on the reference and on each backend in turn,
//! so only one half-window of logits per runner is held at a time.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use models::reference::Reference;
use models::{Batch, LogitsWanted, Runner, SeqChunk, SeqId};

use crate::load::{AnyRunner, Device, build_runner};

/// The text scored: prose written for it, then a frozen copy of one of this repository's source files.
pub const TEXT: &str =
    concat!(include_str!("../../../fixtures/kld/prose.txt"), "\n", include_str!("../../../fixtures/kld/code.txt"));

#[derive(Debug, Clone)]
pub struct Options {
    /// Tokens per window (llama-perplexity's `-c`).
    pub ctx: usize,
    /// Scored positions wanted (at least; whole windows are scored).
    pub positions: usize,
    /// CPU threads of the reference and a CPU backend (0 = all cores).
    pub threads: usize,
    /// Rows per chunk of a backend's scored half, one report per entry (0 = the whole half in one chunk).
    pub rows: Vec<usize>,
}

/// One backend's numbers against the reference.
#[derive(Debug, Clone)]
pub struct Summary {
    pub backend: String,
    pub positions: usize,
    pub ppl_ref: (f64, f64),
    pub ppl: (f64, f64),
    /// Mean ln(PPL / PPL_ref), ± its standard error.
    pub ln_ratio: (f64, f64),
    pub kld_mean: (f64, f64),
    /// (label, value): maximum, 99.9%, 99%, 95%, 90%, median, 10%, 5%, 1%, minimum.
    pub kld_percentiles: Vec<(&'static str, f64)>,
    pub dp_mean: (f64, f64),
    pub dp_rms: f64,
    /// Share of positions whose argmax equals the reference's, ± its standard error.
    pub same_top: (f64, f64),
}

#[derive(Default)]
struct Stats {
    kld: Vec<f64>,
    nll_ref: Vec<f64>,
    nll: Vec<f64>,
    dp: Vec<f64>,
    same_top: usize,
}

/// Log-softmax of a row (f64), its argmax (first of equal maxima) and the row's log-sum-exp.
fn log_softmax(row: &[f32], out: &mut Vec<f64>) -> usize {
    let best = models::argmax(row) as usize;
    let max = row[best] as f64;
    let lse = max + row.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln();
    out.clear();
    out.extend(row.iter().map(|&v| v as f64 - lse));
    best
}

impl Stats {
    /// Adds the positions of one window: `want`/`got` hold `[rows, vocab]` logits, row `i` predicting `next[i]`.
    fn add(&mut self, want: &[f32], got: &[f32], vocab: usize, next: &[u32]) {
        let (mut p, mut q) = (Vec::new(), Vec::new());
        for ((w, g), &tok) in want.chunks_exact(vocab).zip(got.chunks_exact(vocab)).zip(next) {
            let top_w = log_softmax(w, &mut p);
            let top_g = log_softmax(g, &mut q);
            let kld: f64 =
                p.iter().zip(&q).map(|(&lp, &lq)| if lp.is_finite() { lp.exp() * (lp - lq) } else { 0.0 }).sum();
            self.kld.push(kld.max(0.0));
            let t = tok as usize;
            self.nll_ref.push(-p[t]);
            self.nll.push(-q[t]);
            self.dp.push(q[t].exp() - p[t].exp());
            self.same_top += usize::from(top_w == top_g);
        }
    }

    fn summary(&self, backend: String) -> Summary {
        let n = self.kld.len().max(1) as f64;
        let mean_se = |v: &[f64]| {
            let m = v.iter().sum::<f64>() / n;
            let var = v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (n - 1.0).max(1.0);
            (m, (var / n).sqrt())
        };
        let ppl = |nll: &[f64]| {
            let (m, se) = mean_se(nll);
            (m.exp(), m.exp() * se)
        };
        let ratio: Vec<f64> = self.nll.iter().zip(&self.nll_ref).map(|(a, b)| a - b).collect();
        let mut sorted = self.kld.clone();
        sorted.sort_by(|a, b| a.total_cmp(b));
        let pct = |q: f64| sorted.get(((sorted.len().max(1) - 1) as f64 * q).round() as usize).copied().unwrap_or(0.0);
        let kld_percentiles = [
            ("Maximum", 1.0),
            ("99.9%", 0.999),
            ("99.0%", 0.99),
            ("95.0%", 0.95),
            ("90.0%", 0.90),
            ("Median", 0.5),
            ("10.0%", 0.10),
            ("5.0%", 0.05),
            ("1.0%", 0.01),
            ("Minimum", 0.0),
        ]
        .into_iter()
        .map(|(l, q)| (l, pct(q)))
        .collect();
        let same = self.same_top as f64 / n;
        Summary {
            backend,
            positions: self.kld.len(),
            ppl_ref: ppl(&self.nll_ref),
            ppl: ppl(&self.nll),
            ln_ratio: mean_se(&ratio),
            kld_mean: mean_se(&self.kld),
            kld_percentiles,
            dp_mean: mean_se(&self.dp),
            dp_rms: (self.dp.iter().map(|d| d * d).sum::<f64>() / n).sqrt(),
            same_top: (same, (same * (1.0 - same) / n).sqrt()),
        }
    }
}

/// One window's scored logits: the context half without logits, then the scored half with every row's, in chunks
/// of `rows` rows (0: one chunk).
fn window_logits(r: &mut dyn Runner, window: &[u32], first: usize, rows: usize) -> Result<Vec<f32>> {
    let seq = SeqId(1);
    let batch = |tokens, start_pos, logits| Batch { chunks: vec![SeqChunk { seq, tokens, start_pos, logits }] };
    r.forward(&batch(&window[..first], 0, LogitsWanted::None))?;
    let scored = &window[first..];
    let mut out = Vec::new();
    for (i, chunk) in scored.chunks(if rows == 0 { scored.len() } else { rows }).enumerate() {
        let start = first + i * rows;
        out.extend_from_slice(r.forward(&batch(chunk, start, LogitsWanted::All))?);
    }
    r.release(seq);
    Ok(out)
}

/// The report of each of `devices` against the f32 reference on the model at `model` (a name or a path).
pub fn report(model: &str, devices: &[Device], o: &Options) -> Result<Vec<Summary>> {
    let path = crate::load::model_path(model)?;
    let file = Arc::new(gguf::GgufFile::open(&path).with_context(|| format!("loading {}", path.display()))?);
    let tok = tokenizer::Tokenizer::from_gguf(&file).context("the model's tokenizer")?;
    let mut ids = tok.encode(TEXT, false)?;
    if o.ctx < 4 {
        bail!("--kld-ctx {} is too short (at least 4 tokens)", o.ctx);
    }
    let first = o.ctx / 2;
    let per_window = o.ctx - 1 - first;
    let windows = o.positions.max(1).div_ceil(per_window);
    if windows * o.ctx > ids.len() {
        bail!(
            "the text has {} tokens with this tokenizer: {windows} windows of {} need {} (lower --kld-positions or --kld-ctx)",
            ids.len(),
            o.ctx,
            windows * o.ctx
        );
    }
    ids.truncate(windows * o.ctx);
    let mut reference = Reference::new(file.clone(), o.threads).context("loading the f32 reference")?;
    let vocab = reference.config().vocab_size;
    let rows = if o.rows.is_empty() { vec![0] } else { o.rows.clone() };
    // Per backend: its runner and, per entry of `rows`, its name and statistics.
    let mut backends: Vec<(AnyRunner, Vec<(String, Stats)>)> = Vec::new();
    for &d in devices {
        let r = build_runner(file.clone(), o.threads, d)?;
        if r.config().max_context < o.ctx {
            bail!("--kld-ctx {} exceeds the model's context of {}", o.ctx, r.config().max_context);
        }
        let name = |&n: &usize| match (n, rows.len()) {
            (_, 1) if n == 0 => r.device_name(),
            (0, _) => format!("{}, scored rows in one chunk", r.device_name()),
            _ => format!("{}, scored rows in chunks of {n}", r.device_name()),
        };
        let stats = rows.iter().map(|n| (name(n), Stats::default())).collect();
        backends.push((r, stats));
    }
    eprintln!(
        "kld: {} ({}), {} windows of {} tokens, {} scored positions, vocabulary {vocab}, backends' scored rows {}",
        path.display(),
        reference.config().arch.name(),
        windows,
        o.ctx,
        windows * per_window,
        rows.iter()
            .map(|&n| if n == 0 { "in one chunk".to_string() } else { format!("in chunks of {n}") })
            .collect::<Vec<_>>()
            .join(", ")
    );
    for (w, window) in ids.chunks_exact(o.ctx).enumerate() {
        let mut window = window.to_vec();
        // As llama-perplexity: a model that wants a BOS gets it in place of each window's first token.
        if let (true, Some(bos)) = (tok.add_bos(), tok.bos()) {
            window[0] = bos;
        }
        let t = Instant::now();
        let want = window_logits(&mut reference, &window, first, 0)?;
        let t_ref = t.elapsed().as_secs_f64();
        let next = &window[first + 1..];
        let mut times = Vec::new();
        for (r, stats) in &mut backends {
            for (&n, (_, stats)) in rows.iter().zip(stats) {
                let t = Instant::now();
                let got = window_logits(r, &window, first, n)?;
                times.push(t.elapsed().as_secs_f64());
                if got.len() != want.len() {
                    bail!("the backend returned {} logits for {} (a narrowed output head?)", got.len(), want.len());
                }
                let values = per_window * vocab;
                stats.add(&want[..values], &got[..values], vocab, next);
            }
        }
        eprintln!(
            "kld: window {}/{windows}: reference {t_ref:.1} s, backends {}",
            w + 1,
            times.iter().map(|t| format!("{t:.1} s")).collect::<Vec<_>>().join(", ")
        );
    }
    Ok(backends.into_iter().flat_map(|(_, stats)| stats).map(|(name, s)| s.summary(name)).collect())
}

/// Prints a summary in llama-perplexity's layout.
pub fn print(s: &Summary) {
    println!("====== {} against the f32 reference: {} positions ======", s.backend, s.positions);
    println!("Mean PPL(Q)                   : {:10.6} ± {:10.6}", s.ppl.0, s.ppl.1);
    println!("Mean PPL(base)                : {:10.6} ± {:10.6}", s.ppl_ref.0, s.ppl_ref.1);
    println!("Mean ln(PPL(Q)/PPL(base))     : {:10.6} ± {:10.6}", s.ln_ratio.0, s.ln_ratio.1);
    println!("Mean    KLD: {:10.6} ± {:10.6}", s.kld_mean.0, s.kld_mean.1);
    for (label, v) in &s.kld_percentiles {
        println!("{:<8}KLD: {v:10.6}", label);
    }
    println!("Mean    Δp: {:8.3} ± {:6.3} %", 100.0 * s.dp_mean.0, 100.0 * s.dp_mean.1);
    println!("RMS Δp    : {:8.3} %", 100.0 * s.dp_rms);
    println!("Same top p: {:8.3} ± {:6.3} %", 100.0 * s.same_top.0, 100.0 * s.same_top.1);
}

pub fn json(s: &Summary) -> serde_json::Value {
    serde_json::json!({
        "backend": s.backend, "positions": s.positions,
        "ppl": s.ppl.0, "ppl_se": s.ppl.1, "ppl_reference": s.ppl_ref.0, "ppl_reference_se": s.ppl_ref.1,
        "ln_ppl_ratio": s.ln_ratio.0, "ln_ppl_ratio_se": s.ln_ratio.1,
        "kld_mean": s.kld_mean.0, "kld_mean_se": s.kld_mean.1,
        "kld_percentiles": s.kld_percentiles.iter().map(|(l, v)| (l.to_string(), serde_json::json!(v))).collect::<serde_json::Map<_, _>>(),
        "dp_mean": s.dp_mean.0, "dp_rms": s.dp_rms, "same_top": s.same_top.0, "same_top_se": s.same_top.1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// KL divergence, perplexities and top-1 of hand-made rows against values computed here in another way.
    #[test]
    fn stats_of_known_rows() {
        let want = [0.0f32, 1.0, 2.0, 0.0, 0.0, 3.0];
        let got = [0.0f32, 1.0, 2.0, 0.0, 1.0, 0.0];
        let mut s = Stats::default();
        s.add(&want, &got, 3, &[2, 1]);
        assert_eq!(s.kld[0], 0.0);
        // Row 2: p = softmax(0, 0, 3), q = softmax(0, 1, 0).
        let sm = |v: [f64; 3]| {
            let z: f64 = v.iter().map(|x| x.exp()).sum();
            v.map(|x| x.exp() / z)
        };
        let (p, q) = (sm([0.0, 0.0, 3.0]), sm([0.0, 1.0, 0.0]));
        let kl: f64 = (0..3).map(|i| p[i] * (p[i] / q[i]).ln()).sum();
        assert!((s.kld[1] - kl).abs() < 1e-12);
        assert!((s.nll[1] + q[1].ln()).abs() < 1e-12 && (s.nll_ref[1] + p[1].ln()).abs() < 1e-12);
        assert_eq!(s.same_top, 1);
        let sum = s.summary("x".into());
        assert_eq!(sum.positions, 2);
        assert!((sum.same_top.0 - 0.5).abs() < 1e-12);
        assert!((sum.kld_mean.0 - kl / 2.0).abs() < 1e-12);
        assert_eq!(sum.kld_percentiles[0], ("Maximum", s.kld[1]));
        assert_eq!(sum.kld_percentiles[9], ("Minimum", 0.0));
    }

    /// The corpus is long enough for the default report (5 windows of 512) with a byte-level tokenizer's rate.
    #[test]
    fn text_is_code_and_prose() {
        assert!(TEXT.len() > 12_000, "{} bytes", TEXT.len());
        assert!(TEXT.contains("The Lighthouse Keeper") && TEXT.contains("pub fn"));
    }
}
