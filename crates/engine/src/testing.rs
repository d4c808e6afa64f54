//! Test doubles for the engine and what is built on it (the `testing` feature; the engine's own unit tests have
//! it too): a scripted fake model runner, a tiny model config and tokenizers written into in-memory GGUFs.
//!
//! The fake runner answers every logit row with a pure function of the sequence's tokens so far (the script),
//! checks the batch contract a real runner enforces (positions, context, vocabulary, each sequence once), and
//! records what it was asked: every batch, every release, which forward method ran, which sequences it holds and
//! each sequence's prompt. The record is shared ([`FakeRunner::state`] and [`FakeRunner::shared`]), so a test can
//! still read it once the engine has moved onto its own thread. Optionally each pass sleeps, costs simulated
//! seconds on a clock, fails or panics at a given pass, keeps hidden rows ([`Runner::set_hidden_layers`]), and holds
//! its KV in a pool of blocks ([`FakeRunner::with_pool`]: the real block table, prefix cache included).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use gguf::{GgufFile, GgufWriter, Value, ValueType};
use models::kv_cache::BlockTable;
use models::{Batch, LogitsWanted, ModelConfig, Runner, SeqId};
use tokenizer::Tokenizer;

/// Runs all `prompts` through the engine at once (greedy, `max_tokens` each) until it has no work: each prompt's
/// output tokens and the number of its prompt tokens served from the prefix cache.
pub fn run_greedy<R: Runner>(
    e: &mut crate::Engine<R>,
    prompts: &[Vec<u32>],
    max_tokens: usize,
) -> Vec<(Vec<u32>, usize)> {
    use crate::{Event, GenerateRequest, RequestId, SamplingParams};
    let ids: Vec<RequestId> = prompts
        .iter()
        .map(|p| e.add_request(GenerateRequest::new(p.clone(), SamplingParams::greedy(), max_tokens)).expect("valid"))
        .collect();
    let mut out = vec![(Vec::new(), usize::MAX); prompts.len()];
    while e.has_work() {
        for (id, ev) in e.step().expect("step") {
            let i = ids.iter().position(|&x| x == id).expect("known request");
            match ev {
                Event::Token { id, .. } => out[i].0.push(id),
                Event::Finished { usage, .. } => out[i].1 = usage.cached_tokens,
            }
        }
    }
    out
}

/// [`run_greedy`] one prompt at a time.
pub fn run_greedy_each<R: Runner>(
    e: &mut crate::Engine<R>,
    prompts: &[Vec<u32>],
    max_tokens: usize,
) -> Vec<(Vec<u32>, usize)> {
    prompts.iter().flat_map(|p| run_greedy(e, std::slice::from_ref(p), max_tokens)).collect()
}

/// [`run_greedy`] on all prompts at once when `together`, else [`run_greedy_each`].
pub fn run_greedy_as<R: Runner>(
    e: &mut crate::Engine<R>,
    prompts: &[Vec<u32>],
    max_tokens: usize,
    together: bool,
) -> Vec<(Vec<u32>, usize)> {
    if together { run_greedy(e, prompts, max_tokens) } else { run_greedy_each(e, prompts, max_tokens) }
}

/// A one-layer model config of `vocab_size` ids and `max_context` positions (a fake runner computes nothing; the
/// shapes only have to be consistent).
pub fn tiny_config(vocab_size: usize, max_context: usize) -> ModelConfig {
    ModelConfig {
        arch: models::Arch::Llama,
        shapes: models::ModelShapes {
            num_layers: 2,
            hidden_size: 8,
            ffn_size: 16,
            num_heads: 2,
            num_kv_heads: 1,
            head_dim: 4,
            vocab_size,
            max_context,
        },
        rms_eps: 1e-5,
        rope_theta: 10_000.0,
        rope_dim: 4,
        rope_style: backend::cpu::ops::RopeStyle::Interleaved,
        qkv_bias: false,
        qk_norm: false,
        tied_embeddings: true,
    }
}

/// GPT-2's byte-to-character table (how byte-level BPE vocabularies write bytes).
pub fn byte_char(b: u8) -> char {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable(b) {
        return b as char;
    }
    let rank = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + rank).expect("INVARIANT: the GPT-2 byte alphabet is valid chars")
}

/// The 256 byte tokens of a byte-level vocabulary, in id order (all of type normal).
pub fn byte_tokens() -> Vec<(String, i32)> {
    (0..=255u8).map(|b| (byte_char(b).to_string(), 1)).collect()
}

/// What a test tokenizer is made of: its tokens as (text, type: 1 normal, 3 control) in id order, merges, and the
/// pre-tokenizer, BOS and EOS it declares.
pub struct TokenizerSpec<'a> {
    pub tokens: Vec<(String, i32)>,
    pub merges: &'a [&'a str],
    pub pre: Option<&'a str>,
    pub bos: Option<u32>,
    pub eos: u32,
}

/// A GPT-2-style tokenizer from `spec`, through a GGUF written in memory (so it loads as a model's does).
pub fn tokenizer(spec: TokenizerSpec<'_>) -> Arc<Tokenizer> {
    let (tokens, types): (Vec<Value>, Vec<Value>) =
        spec.tokens.into_iter().map(|(t, ty)| (Value::String(t), Value::I32(ty))).unzip();
    let merges = spec.merges.iter().map(|m| Value::String(m.to_string())).collect();
    let mut w = GgufWriter::new();
    w.add("general.architecture", Value::String("llama".into()));
    w.add("tokenizer.ggml.model", Value::String("gpt2".into()));
    if let Some(pre) = spec.pre {
        w.add("tokenizer.ggml.pre", Value::String(pre.into()));
    }
    w.add("tokenizer.ggml.tokens", Value::Array(ValueType::String, tokens));
    w.add("tokenizer.ggml.token_type", Value::Array(ValueType::I32, types));
    w.add("tokenizer.ggml.merges", Value::Array(ValueType::String, merges));
    if let Some(bos) = spec.bos {
        w.add("tokenizer.ggml.bos_token_id", Value::U32(bos));
    }
    w.add("tokenizer.ggml.eos_token_id", Value::U32(spec.eos));
    w.add("tokenizer.ggml.add_bos_token", Value::Bool(false));
    let file = GgufFile::from_bytes(w.to_bytes()).expect("INVARIANT: a written GGUF parses");
    Arc::new(Tokenizer::from_gguf(&file).expect("test tokenizer builds"))
}

/// Logits over `vocab` ids that make `token` the clear favourite.
pub fn one_hot(vocab: usize, token: u32) -> Vec<f32> {
    let mut l = vec![-10.0; vocab];
    l[token as usize] = 10.0;
    l
}

/// The logits of the next token, given every token of the sequence up to and including the current row and the
/// sequence's prompt length (the tokens it held when logits were first asked for).
pub type Script = Box<dyn Fn(&[u32], usize) -> Vec<f32> + Send>;

/// One chunk of a batch, as received.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedChunk {
    pub seq: SeqId,
    pub tokens: Vec<u32>,
    pub start_pos: usize,
    pub logits: LogitsWanted,
}

/// What one held sequence has.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Held {
    pub tokens: Vec<u32>,
    /// Known once logits were first asked for: the tokens held then.
    pub prompt_len: Option<usize>,
}

/// Everything a fake runner was asked, and what it holds.
#[derive(Debug, Default)]
pub struct FakeState {
    /// Tokens held per live sequence (its "KV cache").
    pub live: BTreeMap<SeqId, Held>,
    /// Each sequence's prompt, in the order they were first asked for logits.
    pub prompts: Vec<Vec<u32>>,
    /// Every batch received, in order.
    pub batches: Vec<Vec<RecordedChunk>>,
    /// Every `release` call, in order.
    pub released: Vec<SeqId>,
    /// Batches run through `forward_argmax` (the others through `forward`), and of those the ones whose picks the
    /// engine said it feeds back (`NextStep::FedPicks`).
    pub argmax_batches: usize,
    pub ahead_batches: usize,
    /// Batches run through `forward_candidates`, and the largest count asked for.
    pub candidate_batches: usize,
    pub max_candidates: usize,
    /// Forward passes run, of any kind.
    pub num_forwards: u64,
}

/// Simulated seconds, in nanoseconds, that fake runners advance by the cost of each pass.
pub type SimClock = Arc<AtomicU64>;

/// The seconds on a simulated clock.
pub fn seconds(clock: &SimClock) -> f64 {
    clock.load(Ordering::Relaxed) as f64 * 1e-9
}

/// Seconds a pass of that many rows costs.
type CostFn = Box<dyn Fn(usize) -> f64 + Send>;

/// The scripted fake model; see the module docs.
pub struct FakeRunner {
    cfg: ModelConfig,
    script: Script,
    state: Arc<Mutex<FakeState>>,
    /// Each pass sleeps this long (a slow model for the service's tests).
    pub delay: Duration,
    /// Each pass of `rows` tokens costs `cost(rows)` seconds on the clock.
    cost: Option<(CostFn, SimClock)>,
    /// The pass with this number (1-based) fails, or panics.
    pub fail_at_pass: Option<u64>,
    pub panic_at_pass: Option<u64>,
    /// Prompt tokens `attach_prefix` claims to hold already (a prefix cache hit).
    pub cached_prefix: usize,
    /// Units of background work left (`idle_work` does one per call).
    pub idle_left: Arc<AtomicUsize>,
    hidden_layers: Vec<usize>,
    hidden: Vec<f32>,
    /// A KV pool of so many blocks (the real block table, prefix cache included); None: no limit.
    pool: Option<BlockTable>,
    out: Vec<f32>,
}

impl FakeRunner {
    /// A runner of `cfg` whose logits are `script(history)`.
    pub fn new(cfg: ModelConfig, script: impl Fn(&[u32]) -> Vec<f32> + Send + 'static) -> Self {
        Self::with_script(cfg, Box::new(move |h, _| script(h)))
    }

    /// A runner of `cfg` that writes `reply(i)` as the `i`-th token after any prompt.
    pub fn replying(cfg: ModelConfig, reply: impl Fn(usize) -> u32 + Send + 'static) -> Self {
        let vocab = cfg.vocab_size;
        Self::with_script(cfg, Box::new(move |h, prompt_len| one_hot(vocab, reply(h.len() - prompt_len))))
    }

    pub fn with_script(cfg: ModelConfig, script: Script) -> Self {
        FakeRunner {
            cfg,
            script,
            state: Arc::default(),
            delay: Duration::ZERO,
            cost: None,
            fail_at_pass: None,
            panic_at_pass: None,
            cached_prefix: 0,
            idle_left: Arc::default(),
            hidden_layers: Vec::new(),
            hidden: Vec::new(),
            pool: None,
            out: Vec::new(),
        }
    }

    /// A runner whose KV holds `num_blocks` blocks of `block_tokens` positions (its prefix cache reuses full blocks
    /// of released sequences), and fails a batch they cannot hold.
    pub fn with_pool(mut self, num_blocks: usize, block_tokens: usize) -> Self {
        self.pool = Some(BlockTable::with_block_tokens(num_blocks, block_tokens));
        self
    }

    /// Each pass of `rows` tokens advances `clock` by `cost(rows)` seconds.
    pub fn costing(mut self, cost: impl Fn(usize) -> f64 + Send + 'static, clock: &SimClock) -> Self {
        self.cost = Some((Box::new(cost), clock.clone()));
        self
    }

    /// What the runner was asked and holds.
    pub fn state(&self) -> MutexGuard<'_, FakeState> {
        self.state.lock().expect("INVARIANT: no test panics while holding the fake's state")
    }

    /// The same record, to read after the runner has moved (onto the engine's thread).
    pub fn shared(&self) -> Arc<Mutex<FakeState>> {
        self.state.clone()
    }

    /// The hidden row the fake "computes" after layer `layer` for the token at `pos` of a sequence whose tokens up
    /// to it are `history`: its entries are the layer, the position, the token and the script's pick after it, then
    /// zeros, so a proposer reading hidden rows can check it got the right ones and knows the target's next pick.
    pub fn hidden_row(&self, layer: usize, history: &[u32], prompt_len: usize) -> Vec<f32> {
        let mut row = vec![0.0; self.cfg.hidden_size];
        let pick = models::argmax(&(self.script)(history, prompt_len));
        let entries = [layer as f32, (history.len() - 1) as f32, history[history.len() - 1] as f32, pick as f32];
        for (r, e) in row.iter_mut().zip(entries) {
            *r = e;
        }
        row
    }

    fn pass(&mut self, batch: &Batch<'_>) -> models::Result<()> {
        let mut state = self.state.lock().expect("INVARIANT: no test panics while holding the fake's state");
        state.num_forwards += 1;
        state.batches.push(
            batch
                .chunks
                .iter()
                .map(|c| RecordedChunk {
                    seq: c.seq,
                    tokens: c.tokens.to_vec(),
                    start_pos: c.start_pos,
                    logits: c.logits,
                })
                .collect(),
        );
        std::thread::sleep(self.delay);
        if self.fail_at_pass == Some(state.num_forwards) {
            return Err(models::Error::ContextOverflow(0, 0));
        }
        if self.panic_at_pass == Some(state.num_forwards) {
            drop(state);
            panic!("fake runner panics");
        }
        if let Some(c) = batch.chunks.iter().find(|c| c.tokens.is_empty()) {
            panic!("empty chunk for sequence {}", c.seq);
        }
        batch.validate(&self.cfg, |s| state.live.get(&s).map_or(0, |h| h.tokens.len()))?;
        if let Some(pool) = self.pool.as_mut() {
            let needed: usize =
                batch.chunks.iter().map(|c| pool.blocks_needed(c.seq, c.start_pos + c.tokens.len())).sum();
            if needed > pool.num_available() {
                return Err(models::Error::KvCacheFull { needed, available: pool.num_available() });
            }
            for c in &batch.chunks {
                pool.reserve(c.seq, c.start_pos + c.tokens.len()).expect("INVARIANT: checked above");
                pool.commit(c.seq, c.tokens);
            }
        }
        if let Some((cost, clock)) = &self.cost {
            clock.fetch_add((cost(batch.num_tokens()) * 1e9).round() as u64, Ordering::Relaxed);
        }
        self.out.clear();
        self.hidden.clear();
        let mut hidden: Vec<Vec<f32>> = vec![Vec::new(); self.hidden_layers.len()];
        for c in &batch.chunks {
            let held = state.live.entry(c.seq).or_default();
            let base = held.tokens.len();
            held.tokens.extend_from_slice(c.tokens);
            let n = c.tokens.len();
            let rows = match c.logits {
                LogitsWanted::None => 0..0,
                LogitsWanted::Last => n - 1..n,
                LogitsWanted::All => 0..n,
            };
            // The prompt ends with the first chunk that wants logits (a long prompt comes in several chunks).
            let first_logits = held.prompt_len.is_none() && !rows.is_empty();
            if first_logits {
                held.prompt_len = Some(base + n);
            }
            let prompt_len = held.prompt_len.unwrap_or(base + n);
            let tokens = held.tokens.clone();
            if first_logits {
                state.prompts.push(tokens.clone());
            }
            for (l, &layer) in self.hidden_layers.iter().enumerate() {
                for r in 0..n {
                    hidden[l].extend(self.hidden_row(layer, &tokens[..base + r + 1], prompt_len));
                }
            }
            for r in rows {
                let logits = (self.script)(&tokens[..base + r + 1], prompt_len);
                assert_eq!(logits.len(), self.cfg.vocab_size, "the script's row has the vocabulary's width");
                self.out.extend_from_slice(&logits);
            }
        }
        self.hidden = hidden.concat();
        Ok(())
    }
}

impl Runner for FakeRunner {
    fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    fn forward(&mut self, batch: &Batch<'_>) -> models::Result<&[f32]> {
        self.pass(batch)?;
        Ok(&self.out)
    }

    fn forward_argmax(&mut self, batch: &Batch<'_>) -> models::Result<Vec<u32>> {
        self.pass(batch)?;
        self.state().argmax_batches += 1;
        Ok(self.out.chunks_exact(self.cfg.vocab_size).map(models::argmax).collect())
    }

    fn forward_argmax_then(&mut self, batch: &Batch<'_>, next: models::NextStep) -> models::Result<Vec<u32>> {
        self.state().ahead_batches += usize::from(next == models::NextStep::FedPicks);
        self.forward_argmax(batch)
    }

    fn forward_candidates(&mut self, batch: &Batch<'_>, n: usize) -> models::Result<Vec<Vec<(u32, f32)>>> {
        self.pass(batch)?;
        {
            let mut s = self.state();
            s.candidate_batches += 1;
            s.max_candidates = s.max_candidates.max(n);
        }
        Ok(self.out.chunks_exact(self.cfg.vocab_size).map(|row| models::top_candidates(row, n)).collect())
    }

    fn set_hidden_layers(&mut self, layers: &[usize]) -> models::Result<()> {
        if let Some(&l) = layers.iter().find(|&&l| l >= self.cfg.num_layers) {
            return Err(models::Error::Unsupported(format!("layer {l} of {}", self.cfg.num_layers)));
        }
        self.hidden_layers = layers.to_vec();
        Ok(())
    }

    fn hidden_rows(&self) -> &[f32] {
        &self.hidden
    }

    fn seq_len(&self, seq: SeqId) -> usize {
        self.state().live.get(&seq).map_or(0, |h| h.tokens.len())
    }

    fn truncate(&mut self, seq: SeqId, len: usize) {
        if let Some(h) = self.state().live.get_mut(&seq) {
            h.tokens.truncate(len);
        }
        if let Some(pool) = self.pool.as_mut() {
            pool.truncate(seq, len);
        }
    }

    fn release(&mut self, seq: SeqId) {
        let mut s = self.state.lock().expect("INVARIANT: no test panics while holding the fake's state");
        s.live.remove(&seq);
        s.released.push(seq);
        if let Some(pool) = self.pool.as_mut() {
            pool.release(seq);
        }
    }

    fn attach_prefix(&mut self, seq: SeqId, tokens: &[u32]) -> usize {
        let n = match self.pool.as_mut() {
            Some(pool) => pool.attach_prefix(seq, tokens),
            None => self.cached_prefix.min(tokens.len()),
        };
        if n > 0 {
            self.state().live.insert(seq, Held { tokens: tokens[..n].to_vec(), prompt_len: None });
        }
        n
    }

    fn idle_work(&mut self) -> bool {
        // Background work takes a little time.
        std::thread::sleep(Duration::from_millis(1));
        let left = self.idle_left.load(Ordering::Acquire);
        if left > 0 {
            self.idle_left.store(left - 1, Ordering::Release);
        }
        left > 1
    }

    fn kv_usage(&self) -> models::KvUsage {
        if let Some(pool) = self.pool.as_ref() {
            return pool.usage();
        }
        models::KvUsage { used_blocks: self.state().live.len(), ..Default::default() }
    }
}
