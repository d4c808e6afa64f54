//! `splash run`: one generation to stdout, or an interactive chat.
//!
//! The prompt and system text go through the chat template as content: control-token texts in them are plain text
//! (`Tokenizer::protect` / `encode_prompt`, as on the server). `--raw` tokenizes the prompt as is, specials parsed.

use std::io::{BufRead, Write};

use anyhow::{Context, Result, bail};
use engine::{Engine, EngineConfig, GenerateRequest, SamplingParams};

use crate::load::{Loaded, load};

#[derive(clap::Args)]
pub struct Args {
    /// Model: a catalog name (qwen2.5-coder-1.5b, qwen2.5-coder-0.5b, smollm2-135m) or a .gguf path.
    #[arg(long, short, default_value = "qwen2.5-coder-1.5b")]
    model: String,
    /// The prompt. Without it, chat interactively.
    #[arg(long, short)]
    prompt: Option<String>,
    /// A system message (chat mode only).
    #[arg(long)]
    system: Option<String>,
    #[arg(long, default_value_t = 512)]
    max_tokens: usize,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.7)]
    temperature: f32,
    #[arg(long, default_value_t = 0.8)]
    top_p: f32,
    #[arg(long, default_value_t = 20)]
    top_k: usize,
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    repeat_penalty: f32,
    #[arg(long)]
    seed: Option<u64>,
    /// Tokenize the prompt as is (special tokens like <|im_start|> parsed) instead of wrapping it in the chat template.
    #[arg(long)]
    raw: bool,
    /// Stop before this string (repeatable).
    #[arg(long)]
    stop: Vec<String>,
    /// Threads (0 = all cores).
    #[arg(long, short, default_value_t = 0)]
    threads: usize,
    /// Where the model runs.
    #[arg(long, value_enum, default_value = "auto")]
    device: crate::load::Device,
    /// Print one JSON line of statistics to stderr.
    #[arg(long)]
    stats: bool,
    #[command(flatten)]
    spec: crate::spec::SpecArgs,
}

pub fn main(a: Args) -> Result<()> {
    let Loaded { runner, tokenizer, template, load_s } = load(&a.model, a.threads, a.device)?;
    let sampling = SamplingParams {
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        min_p: a.min_p,
        repetition_penalty: a.repeat_penalty,
        seed: a.seed,
        ..Default::default()
    };
    sampling.validate().map_err(anyhow::Error::msg)?;
    let mut engine = Engine::new(runner, tokenizer.clone(), EngineConfig::default());
    // With --stats, stderr is one JSON line: the warning goes into it.
    let (_, costs_warning) = crate::spec::setup(&mut engine, &a.model, &a.spec, a.threads, a.device, false)?;
    if let (Some(w), false) = (&costs_warning, a.stats) {
        eprintln!("{w}");
    }
    // A chat prompt (rendered with protected content), or with --raw the prompt as is.
    let encode = |conversation: &chat::Conversation| -> Result<Vec<u32>> {
        let template = template.as_ref().context("this model has no chat template; use --raw")?;
        let protect = |s: &str| match tokenizer.protect(s) {
            std::borrow::Cow::Owned(p) => Some(p),
            std::borrow::Cow::Borrowed(_) => None,
        };
        let input = chat::RenderInput::from_conversation(conversation, true);
        let mut ids = tokenizer.encode_prompt(&template.render_protected(&input, &protect)?)?;
        tokenizer.prepend_bos(&mut ids);
        Ok(ids)
    };
    let request = |prompt: Vec<u32>| {
        let mut r = GenerateRequest::new(prompt, sampling.clone(), a.max_tokens);
        r.stop_strings = a.stop.clone();
        r
    };
    let mut stdout = std::io::stdout().lock();

    let Some(prompt) = a.prompt.as_deref() else {
        return chat_loop(&mut engine, template.as_ref(), a.system.as_deref(), &encode, &request);
    };
    let ids = if a.raw {
        let mut ids = tokenizer.encode(prompt, true)?;
        tokenizer.prepend_bos(&mut ids);
        ids
    } else {
        let mut conversation = chat::Conversation::default();
        if let Some(s) = &a.system {
            conversation.messages.push(chat::Message::system(s.as_str()));
        }
        conversation.messages.push(chat::Message::user(prompt));
        encode(&conversation)?
    };
    let (_, _, usage) = engine.generate(request(ids), |t| {
        let _ = stdout.write_all(t.as_bytes());
        let _ = stdout.flush();
    })?;
    writeln!(stdout)?;
    if a.stats {
        let spec = engine.spec_stats();
        let stats = serde_json::json!({
            "load_s": load_s,
            "prompt_tokens": usage.prompt_tokens,
            "generated_tokens": usage.completion_tokens,
            "prefill_tok_s": usage.prefill_tok_s(),
            "decode_tok_s": usage.decode_tok_s(),
            "spec_mode": format!("{:?}", a.spec.mode).to_lowercase(),
            "acceptance": spec.acceptance_rate(),
            "tokens_per_pass": spec.tokens_per_pass(),
            "draft_depth": spec.last_depth,
            "proposers": api::admin::proposers_json(&spec),
            "pass_costs": api::admin::pass_costs_json(&spec.costs),
            "pass_costs_warning": costs_warning,
        });
        eprintln!("{stats}");
    }
    Ok(())
}

fn chat_loop<R: models::Runner>(
    engine: &mut Engine<R>,
    template: Option<&chat::ChatTemplate>,
    system: Option<&str>,
    encode: &dyn Fn(&chat::Conversation) -> Result<Vec<u32>>,
    request: &dyn Fn(Vec<u32>) -> GenerateRequest,
) -> Result<()> {
    if template.is_none() {
        bail!("this model has no chat template; give --prompt with --raw");
    }
    let mut conversation = chat::Conversation::default();
    if let Some(s) = system {
        conversation.messages.push(chat::Message::system(s));
    }
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout();
    eprintln!("Chat with the model. An empty line or Ctrl-D ends.");
    loop {
        eprint!("> ");
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 || line.trim().is_empty() {
            return Ok(());
        }
        conversation.messages.push(chat::Message::user(line.trim_end()));
        let ids = encode(&conversation)?;
        let mut reply = String::new();
        engine.generate(request(ids), |t| {
            reply.push_str(t);
            let _ = stdout.write_all(t.as_bytes());
            let _ = stdout.flush();
        })?;
        println!();
        conversation.messages.push(chat::Message::assistant(reply));
    }
}
