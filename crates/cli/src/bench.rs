//! `splash bench`: prefill and decode speed of the model runner, measured like llama-bench's pp and tg tests.
//!
//! Prefill: one prompt of `--prompt-tokens` tokens in chunks of at most 512. Decode: `--gen-tokens` single-token
//! steps after that prompt, each picking the argmax (or, with `--candidates N`, the first of the N largest logits).
//! Each repetition starts from an empty cache; the median is reported.

use std::time::Instant;

use anyhow::Result;
use models::{Batch, LogitsWanted, Runner, SeqChunk, SeqId};

use crate::load::load;

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, short, default_value = "qwen2.5-coder-1.5b")]
    model: String,
    #[arg(long, default_value_t = 512)]
    prompt_tokens: usize,
    #[arg(long, default_value_t = 128)]
    gen_tokens: usize,
    /// Threads (0 = all cores).
    #[arg(long, short, default_value_t = 0)]
    threads: usize,
    /// Where the model runs.
    #[arg(long, value_enum, default_value = "auto")]
    device: crate::load::Device,
    #[arg(long, default_value_t = 3)]
    repetitions: usize,
    /// Tokens per prefill batch.
    #[arg(long, default_value_t = 512)]
    batch: usize,
    /// Also measure aggregate decode with this many sequences decoding together (repeatable).
    #[arg(long)]
    concurrent: Vec<usize>,
    /// Decode steps ask for each row's N largest logits (what top-k sampling takes; the first is the next token)
    /// instead of the argmax: the price of selecting them (on a GPU, on the device).
    #[arg(long, default_value_t = 0)]
    candidates: usize,
    /// Print one JSON line instead of a table.
    #[arg(long)]
    json: bool,
    /// Measure speculative decoding instead: greedy chat replies to code-writing and file-editing prompts with
    /// speculation off, n-gram only, draft only and both; decode speed, acceptance and tokens per target pass.
    #[arg(long)]
    spec: bool,
    /// With --spec: the workload (`code`, `edit` or `all`).
    #[arg(long, default_value = "all")]
    workload: String,
    #[command(flatten)]
    spec_args: crate::spec::SpecArgs,
    /// Measure correctness instead: mean KL divergence, top-1 agreement and perplexity of the backend (--device, or
    /// each of --kld-devices) against the f32 reference over real text (code and prose), as llama-perplexity
    /// --kl-divergence reports them.
    #[arg(long)]
    kld: bool,
    /// With --kld: tokens per window; the second half of each window is scored.
    #[arg(long, default_value_t = 512)]
    kld_ctx: usize,
    /// With --kld: positions to score at least (whole windows).
    #[arg(long, default_value_t = 1024)]
    kld_positions: usize,
    /// With --kld: rows per chunk of the backends' scored half, a report for each (0 = the whole half, a prefill
    /// chunk; 1 = decode steps; k+1 = speculative verification rows), e.g. `0,1,5`.
    #[arg(long, value_delimiter = ',', default_value = "0")]
    kld_rows: Vec<usize>,
    /// With --kld: the backends to measure, against one reference pass (e.g. `cpu,cuda`); default: --device.
    #[arg(long, value_enum, value_delimiter = ',')]
    kld_devices: Vec<crate::load::Device>,
}

pub fn main(a: Args) -> Result<()> {
    if a.spec {
        return spec_bench(&a);
    }
    if a.kld {
        let devices = if a.kld_devices.is_empty() { vec![a.device] } else { a.kld_devices.clone() };
        let o = crate::kld::Options {
            ctx: a.kld_ctx,
            positions: a.kld_positions,
            threads: a.threads,
            rows: a.kld_rows.clone(),
        };
        for s in crate::kld::report(&a.model, &devices, &o)? {
            if a.json {
                println!("{}", crate::kld::json(&s));
            } else {
                crate::kld::print(&s);
            }
        }
        return Ok(());
    }
    let loaded = load(&a.model, a.threads, a.device)?;
    let mut runner = loaded.runner;
    let vocab = runner.config().vocab_size as u64;
    // Deterministic pseudo-random prompt over the ordinary vocabulary (as llama-bench does).
    let mut x = 0x1234_5678u64;
    let prompt: Vec<u32> = (0..a.prompt_tokens)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((x >> 33) % vocab.min(100_000)) as u32
        })
        .collect();

    // Warm-up: touch every weight once.
    let seq = SeqId(0);
    runner.forward(&Batch {
        chunks: vec![SeqChunk {
            seq,
            tokens: &prompt[..prompt.len().min(8)],
            start_pos: 0,
            logits: LogitsWanted::Last,
        }],
    })?;
    runner.release(seq);

    let mut pp = Vec::new();
    let mut tg = Vec::new();
    for rep in 0..a.repetitions.max(1) {
        let seq = SeqId(rep as u64 + 1);
        let t0 = Instant::now();
        let mut last = 0u32;
        for (i, chunk) in prompt.chunks(a.batch.max(1)).enumerate() {
            let start_pos = i * a.batch.max(1);
            let ids = runner.forward_argmax(&Batch {
                chunks: vec![SeqChunk { seq, tokens: chunk, start_pos, logits: LogitsWanted::Last }],
            })?;
            last = ids.first().copied().unwrap_or(0);
        }
        if a.prompt_tokens > 0 {
            pp.push(a.prompt_tokens as f64 / t0.elapsed().as_secs_f64());
        }
        runner.take_step_times();
        let t1 = Instant::now();
        for i in 0..a.gen_tokens {
            let tokens = [last];
            // Greedy: the argmax is taken where the logits are (on the GPU, one id comes back per step), and the
            // step after it may start before it comes back (decode ahead, as the engine's lone greedy sequences).
            let batch = Batch {
                chunks: vec![SeqChunk {
                    seq,
                    tokens: &tokens,
                    start_pos: a.prompt_tokens + i,
                    logits: LogitsWanted::Last,
                }],
            };
            last = if a.candidates > 0 {
                runner.forward_candidates(&batch, a.candidates)?.first().and_then(|c| c.first()).map_or(0, |c| c.0)
            } else if i + 1 < a.gen_tokens {
                runner.forward_argmax_then(&batch, models::NextStep::FedPicks)?.first().copied().unwrap_or(0)
            } else {
                // The last step: nothing follows it (as the engine, which starts no step past the output limit).
                runner.forward_argmax(&batch)?.first().copied().unwrap_or(0)
            };
        }
        if a.gen_tokens > 0 {
            tg.push(a.gen_tokens as f64 / t1.elapsed().as_secs_f64());
            if let Some((n, copies, pass)) = runner.take_step_times() {
                let wall = t1.elapsed().as_secs_f64() * 1e3 / a.gen_tokens as f64;
                eprintln!(
                    "decode steps {n}: wall {:.1} us per token; device: metadata copies {:.1} us, pass {:.1} us; the rest \
                     (the host's turn) {:.1} us",
                    wall * 1e3,
                    copies * 1e3,
                    pass * 1e3,
                    (wall - copies - pass) * 1e3
                );
            }
        }
        runner.release(seq);
    }
    // Aggregate decode: n sequences with 32-token prompts, then gen_tokens steps of one token each, all together.
    let mut agg = Vec::new();
    for &n in &a.concurrent {
        let ids: Vec<SeqId> = (0..n).map(|s| SeqId(1000 + s as u64)).collect();
        let plen = 32.min(prompt.len().max(1));
        let p: Vec<u32> = (0..plen).map(|i| prompt.get(i).copied().unwrap_or(1)).collect();
        let chunks = ids.iter().map(|&seq| SeqChunk { seq, tokens: &p, start_pos: 0, logits: LogitsWanted::Last });
        let mut next: Vec<[u32; 1]> =
            runner.forward_argmax(&Batch { chunks: chunks.collect() })?.into_iter().map(|t| [t]).collect();
        let t = Instant::now();
        for step in 0..a.gen_tokens {
            let chunks = ids.iter().zip(&next).map(|(&seq, tok)| SeqChunk {
                seq,
                tokens: tok,
                start_pos: plen + step,
                logits: LogitsWanted::Last,
            });
            next = runner.forward_argmax(&Batch { chunks: chunks.collect() })?.into_iter().map(|t| [t]).collect();
        }
        let tok_s = (n * a.gen_tokens) as f64 / t.elapsed().as_secs_f64();
        for &id in &ids {
            runner.release(id);
        }
        agg.push((n, tok_s));
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        if v.is_empty() { 0.0 } else { v[v.len() / 2] }
    };
    let (pp_med, tg_med) = (median(&mut pp), median(&mut tg));
    let model = runner.config().arch.name();
    if a.json {
        let j = serde_json::json!({
            "model": a.model, "arch": model, "threads": runner.num_threads(), "prompt_tokens": a.prompt_tokens,
            "gen_tokens": a.gen_tokens, "prefill_tok_s": pp_med, "decode_tok_s": tg_med, "load_s": loaded.load_s,
            "prefill_runs": pp, "decode_runs": tg, "device": runner.device_name(),
            "concurrent_decode_tok_s": agg.iter().map(|&(n, t)| serde_json::json!({"sequences": n, "tok_s": t})).collect::<Vec<_>>(),
        });
        println!("{j}");
    } else {
        println!("model {} ({model}), {}, load {:.2} s", a.model, runner.device_name(), loaded.load_s);
        println!("prefill {:>5} tokens: {:8.1} tok/s", a.prompt_tokens, pp_med);
        println!("decode  {:>5} tokens: {:8.1} tok/s", a.gen_tokens, tg_med);
        for (n, t) in &agg {
            println!(
                "decode  {n:>3} sequences x {} tokens: {t:8.1} tok/s aggregate ({:.2}x batch 1)",
                a.gen_tokens,
                t / tg_med.max(1e-9)
            );
        }
    }
    Ok(())
}

/// Code-writing requests: output the model writes from scratch.
const CODE_PROMPTS: &[&str] = &[
    "Write a Python function that parses an ISO 8601 date string and returns a datetime, with error handling and a docstring.",
    "Write a Rust function that merges two sorted vectors into one sorted vector, with unit tests.",
    "Write a JavaScript class for an LRU cache with get and put methods.",
    "Write a C function that reverses a singly linked list in place, and a main that tests it.",
];

/// A file the edit workload shows the model, asking for it back with one small change.
const EDIT_FILE: &str = r#"import json
import os
from dataclasses import dataclass, field


@dataclass
class Task:
    id: int
    title: str
    done: bool = False
    tags: list = field(default_factory=list)


class TaskStore:
    def __init__(self, path):
        self.path = path
        self.tasks = {}
        self.next_id = 1
        if os.path.exists(path):
            self.load()

    def load(self):
        with open(self.path) as f:
            data = json.load(f)
        for item in data["tasks"]:
            task = Task(**item)
            self.tasks[task.id] = task
        self.next_id = data.get("next_id", len(self.tasks) + 1)

    def save(self):
        data = {"next_id": self.next_id, "tasks": [t.__dict__ for t in self.tasks.values()]}
        with open(self.path, "w") as f:
            json.dump(data, f, indent=2)

    def add(self, title, tags=None):
        task = Task(self.next_id, title, tags=tags or [])
        self.tasks[task.id] = task
        self.next_id += 1
        self.save()
        return task

    def complete(self, task_id):
        self.tasks[task_id].done = True
        self.save()

    def pending(self):
        return [t for t in self.tasks.values() if not t.done]
"#;

fn edit_prompt() -> String {
    format!(
        "Here is tasks.py:\n\n```python\n{EDIT_FILE}```\n\nRename the method `pending` to `open_tasks` and make it \
         sort the tasks by id. Reply with the complete updated file in one code block and nothing else."
    )
}

fn spec_bench(a: &Args) -> Result<()> {
    use crate::spec::SpecMode;
    use engine::{Engine, EngineConfig, GenerateRequest, SamplingParams};

    let loaded = load(&a.model, a.threads, a.device)?;
    let template = loaded.template.ok_or_else(|| anyhow::anyhow!("{} has no chat template", a.model))?;
    let tokenizer = loaded.tokenizer.clone();
    let mut engine = Engine::new(loaded.runner, tokenizer.clone(), EngineConfig::default());
    let (draft, warning) = crate::spec::setup(&mut engine, &a.model, &a.spec_args, a.threads, a.device, true)?;
    if let Some(w) = warning {
        eprintln!("{w}");
    }
    let costs = engine.pass_costs().clone();
    let mut prompts: Vec<(&str, String)> = Vec::new();
    if a.workload == "code" || a.workload == "all" {
        prompts.extend(CODE_PROMPTS.iter().map(|p| ("code", p.to_string())));
    }
    if a.workload == "edit" || a.workload == "all" {
        prompts.push(("edit", edit_prompt()));
    }
    anyhow::ensure!(!prompts.is_empty(), "unknown workload {:?} (code, edit or all)", a.workload);
    let mut modes = vec![SpecMode::Off, SpecMode::Ngram];
    if draft.is_some() {
        modes.extend([SpecMode::Draft, SpecMode::Auto]);
    }
    let mut results = Vec::new();
    let mut reference: Vec<Vec<u32>> = Vec::new();
    for mode in modes {
        engine.set_spec(a.spec_args.config(mode));
        // Every mode starts from the same pass costs (what it learns while decoding is its own).
        engine.set_pass_costs(costs.clone());
        for (pi, (kind, prompt)) in prompts.iter().enumerate() {
            let mut conversation = chat::Conversation::default();
            conversation.messages.push(chat::Message::user(prompt.as_str()));
            let text = template.render(&chat::RenderInput::from_conversation(&conversation, true))?;
            let ids = tokenizer.encode(&text, true)?;
            let ids_for_json = if a.json { ids.clone() } else { Vec::new() };
            let before = engine.spec_stats();
            let req = GenerateRequest::new(ids, SamplingParams::greedy(), a.gen_tokens);
            let (out, _, usage) = engine.generate(req, |_| {})?;
            let after = engine.spec_stats();
            let passes = after.decode_passes - before.decode_passes;
            let proposed = after.proposed() - before.proposed();
            let accepted = after.accepted() - before.accepted();
            if mode == SpecMode::Off {
                reference.push(out.clone());
            }
            let identical = reference.get(pi).is_some_and(|r| *r == out);
            let row = serde_json::json!({
                "mode": format!("{mode:?}").to_lowercase(), "workload": kind, "prompt": pi,
                "prompt_tokens": usage.prompt_tokens, "tokens": usage.completion_tokens,
                "decode_tok_s": usage.decode_tok_s(), "decode_ms": usage.decode_ms,
                "tokens_per_pass": (after.decode_tokens - before.decode_tokens) as f64 / passes.max(1) as f64,
                "proposed": proposed, "accepted": accepted,
                "acceptance": accepted as f64 / proposed.max(1) as f64,
                "identical_to_off": identical,
                "draft_ms": 1e3 * (after.draft_s - before.draft_s),
                "target_ms": 1e3 * (after.target_s - before.target_s),
                "other_ms": 1e3 * (after.other_s - before.other_s),
                "prompt_ids": ids_for_json,
            });
            if a.json {
                println!("{row}");
            } else {
                println!(
                    "{:<6} {:<5} #{pi}: {:>4} tokens {:7.1} tok/s  {:4.2} tokens/pass  acceptance {:5.1}% ({accepted}/{proposed})  identical {}  time: draft {:.0} ms, target {:.0} ms, other {:.0} ms",
                    row["mode"].as_str().unwrap_or(""),
                    kind,
                    usage.completion_tokens,
                    usage.decode_tok_s(),
                    row["tokens_per_pass"].as_f64().unwrap_or(0.0),
                    100.0 * row["acceptance"].as_f64().unwrap_or(0.0),
                    identical,
                    row["draft_ms"].as_f64().unwrap_or(0.0),
                    row["target_ms"].as_f64().unwrap_or(0.0),
                    row["other_ms"].as_f64().unwrap_or(0.0),
                );
            }
            results.push(row);
        }
    }
    if !a.json {
        let t1 = costs.target(1);
        let curve: Vec<String> = costs.target.iter().map(|&(r, t)| format!("{r}:{:.2}", t / t1)).collect();
        println!("pass cost (rows: × one row): {}; draft pass {:.2} ×", curve.join(" "), costs.draft_s / t1);
        let buckets: Vec<String> = engine
            .confidence()
            .into_iter()
            .flat_map(|c| c.buckets())
            .filter(|b| b.2 > 0.0)
            .map(|(lo, hi, n, a)| format!("[{lo}, {hi}): {n:.0} at {:.1}%", 100.0 * a / n))
            .collect();
        if !buckets.is_empty() {
            println!("greedy draft tokens verified, by the draft's probability: {}", buckets.join(", "));
        }
    }
    Ok(())
}
