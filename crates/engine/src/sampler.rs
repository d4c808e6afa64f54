//! Token selection from logits: penalties, temperature, top-k, top-p, min-p and a seeded random draw.
//!
//! Order (as vLLM applies them): repetition / presence / frequency penalties on the raw logits, then temperature,
//! then top-k, top-p and min-p over the tempered distribution, then one draw. Temperature 0 is greedy (argmax after
//! penalties). The generator is our own SplitMix64, so a seed gives the same tokens on every machine and release.

#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 = greedy.
    pub temperature: f32,
    /// 0 = no limit.
    pub top_k: usize,
    /// 1.0 = no limit.
    pub top_p: f32,
    /// 0.0 = no limit.
    pub min_p: f32,
    /// 1.0 = none. llama.cpp semantics: positive logits divided, negative multiplied.
    pub repetition_penalty: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    /// How many recent tokens (prompt included) the penalties look at; 0 = all.
    pub penalty_last_n: usize,
    pub seed: Option<u64>,
    /// Report log-probabilities with this many top alternatives (at most [`MAX_TOP_LOGPROBS`]).
    pub logprobs: Option<usize>,
}

/// Most alternatives a request may ask log-probabilities for (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_last_n: 64,
            seed: None,
            logprobs: None,
        }
    }
}

impl SamplingParams {
    pub fn greedy() -> Self {
        SamplingParams { temperature: 0.0, ..Default::default() }
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0 || self.top_k == 1
    }

    /// Greedy with nothing that changes the logits first: the pick is the plain argmax, which a runner can make.
    pub fn is_plain_greedy(&self) -> bool {
        self.is_greedy() && !self.has_penalties()
    }

    /// Sampled with a seed: the same tokens on every run are promised.
    pub fn is_seeded_sampling(&self) -> bool {
        self.seed.is_some() && !self.is_greedy()
    }

    pub fn has_penalties(&self) -> bool {
        self.repetition_penalty != 1.0 || self.presence_penalty != 0.0 || self.frequency_penalty != 0.0
    }

    /// Checks ranges; the message names the offending parameter.
    pub fn validate(&self) -> Result<(), String> {
        let finite =
            |v: f32, name: &str| if v.is_finite() { Ok(()) } else { Err(format!("{name} must be a finite number")) };
        finite(self.temperature, "temperature")?;
        finite(self.top_p, "top_p")?;
        finite(self.min_p, "min_p")?;
        finite(self.repetition_penalty, "repetition_penalty")?;
        finite(self.presence_penalty, "presence_penalty")?;
        finite(self.frequency_penalty, "frequency_penalty")?;
        if self.temperature < 0.0 {
            return Err("temperature must be >= 0".into());
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err("top_p must be in (0, 1]".into());
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err("min_p must be in [0, 1]".into());
        }
        if self.repetition_penalty <= 0.0 {
            return Err("repetition_penalty must be > 0".into());
        }
        if self.logprobs.is_some_and(|n| n > MAX_TOP_LOGPROBS) {
            return Err(format!("top_logprobs must be at most {MAX_TOP_LOGPROBS}"));
        }
        Ok(())
    }
}

/// SplitMix64: tiny, fast, and the same everywhere.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// Per-sequence sampling state.
#[derive(Debug, Clone)]
pub struct Sampler {
    pub params: SamplingParams,
    rng: Rng,
    /// Scratch: (token, logit) candidates.
    cand: Vec<(u32, f32)>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        let seed = params.seed.unwrap_or_else(|| {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
            t ^ (std::process::id() as u64) << 32
        });
        Sampler { params, rng: Rng::new(seed), cand: Vec::new() }
    }

    /// Picks the next token. `history` is the sequence so far (prompt and output), for penalties.
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        if self.params.is_greedy() {
            if self.params.has_penalties() {
                apply_penalties(&self.params, logits, history);
            }
            return argmax(logits);
        }
        let weights = self.weights(logits, history);
        self.draw(&weights)
    }

    /// The distribution `sample` draws from: (token, weight) pairs with weights relative to the most likely
    /// candidate (not normalised), after penalties, temperature, top-k, top-p and min-p. Greedy gives the argmax
    /// with weight 1. `logits` is modified (penalties).
    pub fn weights(&mut self, logits: &mut [f32], history: &[u32]) -> Vec<(u32, f64)> {
        if self.params.has_penalties() {
            apply_penalties(&self.params, logits, history);
        }
        if self.params.is_greedy() {
            return vec![(argmax(logits), 1.0)];
        }
        if self.params.top_k > 0 {
            return self.top_k_weights(models::top_candidates(logits, self.params.top_k));
        }
        let p = self.params.clone();
        let inv_t = 1.0 / p.temperature;
        let mut k = logits.len();
        if p.top_p >= 1.0 {
            self.cand.clear();
            self.cand.extend(logits.iter().enumerate().map(|(i, &l)| (i as u32, l)));
        } else {
            // No top-k: top-p over the whole vocabulary. Look at the largest candidates first; widen only if top-p
            // needs more of the distribution.
            let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let z_all: f64 = logits.iter().map(|&l| (((l - max) * inv_t) as f64).exp()).sum();
            let mut window = k.min(256);
            loop {
                self.cand = models::top_candidates(logits, window);
                let mut cum = 0f64;
                let cut = self.cand.iter().position(|&(_, l)| {
                    cum += (((l - max) * inv_t) as f64).exp() / z_all;
                    cum >= p.top_p as f64
                });
                match cut {
                    Some(i) => {
                        k = i + 1;
                        break;
                    }
                    None if window >= k => break,
                    None => window = (window * 16).min(k),
                }
            }
            self.cand.truncate(k);
        }
        let max = self.cand.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
        let mut probs: Vec<(u32, f64)> =
            self.cand.iter().map(|&(t, l)| (t, (((l - max) * inv_t) as f64).exp())).collect();
        if p.min_p > 0.0 {
            // The most likely candidate has weight 1; keep those within a factor min_p of it.
            probs.retain(|&(_, w)| w >= p.min_p as f64);
        }
        probs
    }

    /// Weights over the `top_k` largest (penalised) logits `cand` (largest first): temperature, then top-p over
    /// these candidates renormalised (as vLLM, llama.cpp and transformers apply top-p after top-k), then min-p.
    fn top_k_weights(&self, cand: Vec<(u32, f32)>) -> Vec<(u32, f64)> {
        let p = &self.params;
        let inv_t = 1.0 / p.temperature;
        let max = cand.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
        let mut probs: Vec<(u32, f64)> = cand.iter().map(|&(t, l)| (t, (((l - max) * inv_t) as f64).exp())).collect();
        if p.top_p < 1.0 {
            let z: f64 = probs.iter().map(|c| c.1).sum();
            let mut cum = 0f64;
            if let Some(i) = probs.iter().position(|&(_, w)| {
                cum += w / z;
                cum >= p.top_p as f64
            }) {
                probs.truncate(i + 1);
            }
        }
        if p.min_p > 0.0 {
            probs.retain(|&(_, w)| w >= p.min_p as f64);
        }
        probs
    }

    /// How many of a row's largest raw logits ([`models::top_candidates`]) decide this sampler's pick exactly, or
    /// None when it needs the whole row (no top-k limit, or a penalty that could raise a logit). `history` is what
    /// the penalties look at; `ahead` are tokens that may join it before the row is sampled (speculative drafts).
    ///
    /// Why k plus the penalised tokens is enough: penalties only lower logits here, and at most `w` distinct tokens
    /// are penalised, so among the `k + w` largest raw logits at least `k` are untouched and rank above every logit
    /// outside them; the `k` largest after the penalties are therefore among them.
    pub fn candidates_wanted(&self, history: &[u32], ahead: &[u32]) -> Option<usize> {
        let p = &self.params;
        let k = if p.is_greedy() { 1 } else { p.top_k };
        if k == 0 {
            return None;
        }
        if !p.has_penalties() {
            return Some(k);
        }
        if p.repetition_penalty < 1.0 || p.presence_penalty < 0.0 || p.frequency_penalty < 0.0 {
            return None;
        }
        let n = if p.penalty_last_n == 0 { history.len() } else { p.penalty_last_n + ahead.len() };
        let mut seen: Vec<u32> = history[history.len().saturating_sub(n)..].iter().chain(ahead).copied().collect();
        seen.sort_unstable();
        seen.dedup();
        Some(k + seen.len())
    }

    /// [`Self::weights`] from the row's largest raw logits (as many as [`Self::candidates_wanted`] asked, largest
    /// first, ties in id order): the same pairs, bit for bit, without the rest of the row.
    pub fn weights_from_candidates(&mut self, cand: &[(u32, f32)], history: &[u32]) -> Vec<(u32, f64)> {
        let mut cand = cand.to_vec();
        if self.params.has_penalties() {
            let counts = penalty_counts(&self.params, history);
            for c in &mut cand {
                if let Some(&n) = counts.get(&c.0) {
                    c.1 = penalize(&self.params, c.1, n);
                }
            }
            cand.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        }
        if self.params.is_greedy() {
            // The full row's argmax rule (first of equal maxima, NaN never wins) over the candidates in id order.
            cand.sort_unstable_by_key(|c| c.0);
            let best = cand.iter().fold(None::<(u32, f32)>, |b, &c| match b {
                Some(b) if !(c.1 > b.1) => Some(b),
                _ if c.1.is_nan() => b,
                _ => Some(c),
            });
            return vec![(best.or(cand.first().copied()).map_or(0, |c| c.0), 1.0)];
        }
        cand.truncate(self.params.top_k);
        self.top_k_weights(cand)
    }

    /// [`Self::sample`] from the row's largest raw logits (see [`Self::weights_from_candidates`]).
    pub fn sample_from_candidates(&mut self, cand: &[(u32, f32)], history: &[u32]) -> u32 {
        let weights = self.weights_from_candidates(cand, history);
        if self.params.is_greedy() {
            return weights[0].0;
        }
        self.draw(&weights)
    }

    /// Draws a token with probability proportional to its weight.
    pub fn draw(&mut self, weights: &[(u32, f64)]) -> u32 {
        let z: f64 = weights.iter().map(|p| p.1).sum();
        let mut r = self.rng.next_f64() * z;
        for &(t, w) in weights {
            r -= w;
            if r < 0.0 {
                return t;
            }
        }
        weights.iter().rev().find(|p| p.1 > 0.0).or(weights.last()).map_or(0, |p| p.0)
    }

    /// Uniform in [0, 1), from this request's generator.
    pub fn uniform(&mut self) -> f64 {
        self.rng.next_f64()
    }
}

/// Index of the largest logit (lowest index among ties, as llama.cpp's greedy sampler): the runners' own rule, so
/// a greedy pick is the same whether the runner or the sampler makes it.
pub use models::argmax;

fn apply_penalties(p: &SamplingParams, logits: &mut [f32], history: &[u32]) {
    for (&t, &c) in &penalty_counts(p, history) {
        if let Some(l) = logits.get_mut(t as usize) {
            *l = penalize(p, *l, c);
        }
    }
}

/// How often each token occurs in the window the penalties look at.
fn penalty_counts(p: &SamplingParams, history: &[u32]) -> std::collections::HashMap<u32, u32> {
    let window =
        if p.penalty_last_n == 0 { history } else { &history[history.len().saturating_sub(p.penalty_last_n)..] };
    let mut counts = std::collections::HashMap::new();
    for &t in window {
        *counts.entry(t).or_default() += 1;
    }
    counts
}

/// A logit after the penalties for a token seen `c` times.
fn penalize(p: &SamplingParams, mut l: f32, c: u32) -> f32 {
    if p.repetition_penalty != 1.0 {
        l = if l > 0.0 { l / p.repetition_penalty } else { l * p.repetition_penalty };
    }
    l - (c as f32 * p.frequency_penalty + p.presence_penalty)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits() -> Vec<f32> {
        vec![1.0, 3.0, 2.0, 0.5, 3.0, -1.0]
    }

    #[test]
    fn greedy_takes_first_max() {
        let mut s = Sampler::new(SamplingParams::greedy());
        assert_eq!(s.sample(&mut logits(), &[]), 1);
    }

    #[test]
    fn same_seed_same_tokens() {
        let params = SamplingParams { temperature: 1.0, seed: Some(42), ..Default::default() };
        let run = || {
            let mut s = Sampler::new(params.clone());
            (0..50).map(|_| s.sample(&mut logits(), &[])).collect::<Vec<_>>()
        };
        assert_eq!(run(), run());
    }

    #[test]
    fn top_k_and_top_p_restrict_support() {
        let mut s = Sampler::new(SamplingParams { top_k: 2, seed: Some(1), ..Default::default() });
        for _ in 0..200 {
            assert!([1, 4].contains(&s.sample(&mut logits(), &[])));
        }
        // top_p small: only the first of the two tied maxima (id order) survives.
        let mut s = Sampler::new(SamplingParams { top_p: 0.1, seed: Some(2), ..Default::default() });
        for _ in 0..200 {
            assert_eq!(s.sample(&mut logits(), &[]), 1);
        }
    }

    /// Top-p after top-k is over the k candidates renormalised: token 0 holds e^2 / (e^2 + e) = 73% of the top
    /// two, so top-p 0.7 keeps it alone, though it holds less than 70% of the whole vocabulary's mass.
    #[test]
    fn top_p_applies_over_the_top_k_candidates() {
        let mut l = vec![0.0f32; 100];
        (l[0], l[1]) = (2.0, 1.0);
        let mut s = Sampler::new(SamplingParams { top_k: 2, top_p: 0.7, seed: Some(4), ..Default::default() });
        for _ in 0..200 {
            assert_eq!(s.sample(&mut l.clone(), &[]), 0);
        }
        let mut s = Sampler::new(SamplingParams { top_k: 2, top_p: 0.75, seed: Some(4), ..Default::default() });
        let picks: Vec<u32> = (0..200).map(|_| s.sample(&mut l.clone(), &[])).collect();
        assert!(picks.contains(&0) && picks.contains(&1) && picks.iter().all(|&t| t < 2));
    }

    /// From the candidates it asks for, the sampler gives the weights of the whole row bit for bit, and with the same
    /// seed the same tokens: over top-k, top-p, min-p, temperature, greedy, penalties (windows of 8, 64 and all
    /// tokens, drafts ahead), on rows with many ties.
    #[test]
    fn candidates_give_the_whole_rows_weights() {
        let mut rng = Rng::new(11);
        let mut checked = 0;
        for case in 0..400 {
            let vocab = 2000;
            let ties = case % 3 == 0;
            let row: Vec<f32> = (0..vocab)
                .map(|_| if ties { (rng.next_u64() % 12) as f32 } else { (rng.next_f64() * 16.0 - 8.0) as f32 })
                .collect();
            let history: Vec<u32> = (0..rng.next_u64() % 300).map(|_| (rng.next_u64() % 60) as u32 * 7).collect();
            let ahead: Vec<u32> = (0..case % 4).map(|_| (rng.next_u64() % vocab as u64) as u32).collect();
            let params = SamplingParams {
                temperature: [0.0, 0.3, 0.7, 1.0, 1.5][case % 5],
                top_k: [1, 5, 20, 40, 0][(case / 5) % 5],
                top_p: [1.0, 0.8, 0.95, 0.3][(case / 25) % 4],
                min_p: [0.0, 0.05][(case / 100) % 2],
                repetition_penalty: [1.0, 1.05, 1.3][case % 3],
                presence_penalty: [0.0, 0.5][(case / 3) % 2],
                frequency_penalty: [0.0, 0.25][(case / 7) % 2],
                penalty_last_n: [64, 8, 0][(case / 11) % 3],
                seed: Some(case as u64),
                ..Default::default()
            };
            let probe = Sampler::new(params.clone());
            let Some(n) = probe.candidates_wanted(&history, &ahead) else {
                assert!(params.top_k == 0 && !params.is_greedy(), "case {case}");
                continue;
            };
            // Drafts ahead join the history the row is sampled with.
            let mut hist = history.clone();
            hist.extend(&ahead[..case % (ahead.len() + 1)]);
            let cand = models::top_candidates(&row, n);
            let mut a = Sampler::new(params.clone());
            let mut b = Sampler::new(params.clone());
            let wa = a.weights(&mut row.clone(), &hist);
            let wb = b.weights_from_candidates(&cand, &hist);
            assert_eq!(wa.len(), wb.len(), "case {case}");
            for (x, y) in wa.iter().zip(&wb) {
                assert_eq!((x.0, x.1.to_bits()), (y.0, y.1.to_bits()), "case {case}");
            }
            for _ in 0..5 {
                assert_eq!(a.sample(&mut row.clone(), &hist), b.sample_from_candidates(&cand, &hist), "case {case}");
            }
            checked += 1;
        }
        assert!(checked > 300, "{checked}");
    }

    /// Without a top-k limit, or with a penalty that raises logits, the sampler needs the whole row.
    #[test]
    fn some_samplers_need_the_whole_row() {
        let want = |p: SamplingParams| Sampler::new(p).candidates_wanted(&[1, 2, 2, 3], &[4]);
        assert_eq!(want(SamplingParams { top_k: 0, ..Default::default() }), None);
        assert_eq!(want(SamplingParams { top_k: 20, ..Default::default() }), Some(20));
        assert_eq!(want(SamplingParams::greedy()), Some(1));
        assert_eq!(want(SamplingParams { top_k: 20, repetition_penalty: 1.1, ..Default::default() }), Some(24));
        assert_eq!(want(SamplingParams { top_k: 20, repetition_penalty: 0.9, ..Default::default() }), None);
        assert_eq!(want(SamplingParams { top_k: 20, presence_penalty: -0.5, ..Default::default() }), None);
        let window = SamplingParams { top_k: 20, frequency_penalty: 0.1, penalty_last_n: 2, ..Default::default() };
        assert_eq!(want(window), Some(23));
    }

    #[test]
    fn min_p_drops_unlikely_tokens() {
        // exp(2-3) = 0.37 >= 0.3 kept; exp(1-3) = 0.14 dropped.
        let mut s = Sampler::new(SamplingParams { min_p: 0.3, seed: Some(3), ..Default::default() });
        for _ in 0..300 {
            assert!([1, 2, 4].contains(&s.sample(&mut logits(), &[])));
        }
    }

    #[test]
    fn sampling_follows_the_distribution() {
        let mut s = Sampler::new(SamplingParams { seed: Some(7), ..Default::default() });
        let l = [0.0f32, (2.0f32).ln(), (7.0f32).ln()];
        let mut counts = [0u32; 3];
        let n = 100_000;
        for _ in 0..n {
            counts[s.sample(&mut l.clone(), &[]) as usize] += 1;
        }
        for (c, want) in counts.iter().zip([0.1, 0.2, 0.7]) {
            assert!((*c as f64 / n as f64 - want).abs() < 0.01, "{counts:?}");
        }
    }

    #[test]
    fn penalties_follow_llama_cpp() {
        let p = SamplingParams {
            repetition_penalty: 2.0,
            frequency_penalty: 0.5,
            presence_penalty: 0.25,
            ..Default::default()
        };
        let mut l = vec![4.0, -4.0, 1.0];
        apply_penalties(&p, &mut l, &[0, 0, 1]);
        assert_eq!(l, vec![4.0 / 2.0 - 1.0 - 0.25, -8.0 - 0.5 - 0.25, 1.0]);
    }
}
