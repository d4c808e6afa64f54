//! Test harness for the router: the real tokenizer and chat template of Qwen2.5-Coder-0.5B (from the model cache,
//! `pack::resolve`) over a scripted model that writes a given reply, so every request runs the whole HTTP → template →
//! tokenizer → engine service → output parser → protocol path without a forward pass.

#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use api::{AppState, ServerConfig};
use axum::Router;
use axum::body::Body;
use axum::http::{Request, Response, StatusCode};
use engine::service::{EngineHandle, ServiceConfig};
use engine::{Engine, EngineConfig};
use models::{Batch, LogitsWanted, ModelConfig, Runner, SeqId};
use serde_json::Value;
use tokenizer::Tokenizer;
use tower::ServiceExt;

pub const MODEL_ID: &str = "qwen-test";

pub struct Assets {
    pub tokenizer: Arc<Tokenizer>,
    pub template_source: String,
    pub bos: String,
    pub eos: String,
}

/// Tokenizer and template of the real model, loaded once per test binary.
pub fn assets() -> &'static Assets {
    static ASSETS: OnceLock<Assets> = OnceLock::new();
    ASSETS.get_or_init(|| {
        let path = pack::resolve("qwen2.5-coder-0.5b")
            .expect("the Qwen2.5-Coder-0.5B GGUF is in the model cache (splash pull)");
        let file = gguf::GgufFile::open(&path).expect("GGUF opens");
        let template = chat::ChatTemplate::from_gguf(&file).expect("template");
        Assets {
            tokenizer: Arc::new(Tokenizer::from_gguf(&file).expect("tokenizer")),
            template_source: template.source().to_owned(),
            bos: template.bos_token().to_owned(),
            eos: template.eos_token().to_owned(),
        }
    })
}

/// What the scripted model saw and will write.
#[derive(Default)]
pub struct Script {
    /// Token ids of the reply; EOS follows unless `no_eos`.
    pub reply: Vec<u32>,
    pub no_eos: bool,
    /// Prompts of the sequences seen so far, in order.
    pub prompts: Vec<Vec<u32>>,
    /// Sequences held now (token counts).
    pub live: HashMap<SeqId, (usize, Option<usize>)>,
}

/// A model that writes `script.reply` after any prompt.
pub struct ScriptedRunner {
    cfg: ModelConfig,
    eos: u32,
    delay: Duration,
    script: Arc<Mutex<Script>>,
    logits: Vec<f32>,
    pending_prompts: HashMap<SeqId, Vec<u32>>,
}

impl Runner for ScriptedRunner {
    fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    fn forward(&mut self, batch: &Batch<'_>) -> models::Result<&[f32]> {
        std::thread::sleep(self.delay);
        self.logits.clear();
        let mut script = self.script.lock().unwrap();
        let vocab = self.cfg.vocab_size;
        for chunk in &batch.chunks {
            let entry = script.live.entry(chunk.seq).or_insert((0, None));
            assert_eq!(entry.0, chunk.start_pos);
            entry.0 += chunk.tokens.len();
            let held = entry.0;
            let prompt_known = entry.1.is_some();
            if !prompt_known {
                self.pending_prompts.entry(chunk.seq).or_default().extend_from_slice(chunk.tokens);
            }
            if chunk.logits == LogitsWanted::None {
                continue;
            }
            let prompt_len = *script.live.get_mut(&chunk.seq).unwrap().1.get_or_insert(held);
            if !prompt_known {
                let prompt = self.pending_prompts.remove(&chunk.seq).unwrap_or_default();
                script.prompts.push(prompt);
            }
            // The reply is a function of the position after the prompt; verification chunks want every row.
            let n = chunk.tokens.len();
            let ends: Vec<usize> =
                if chunk.logits == LogitsWanted::All { (held + 1 - n..=held).collect() } else { vec![held] };
            for end in ends {
                let i = end - prompt_len;
                let next = match script.reply.get(i) {
                    Some(&t) => t,
                    None if script.no_eos => script.reply.last().copied().unwrap_or(self.eos),
                    None => self.eos,
                };
                let start = self.logits.len();
                self.logits.resize(start + vocab, 0.0);
                self.logits[start + next as usize] = 10.0;
            }
        }
        Ok(&self.logits)
    }

    fn seq_len(&self, seq: SeqId) -> usize {
        self.script.lock().unwrap().live.get(&seq).map_or(0, |e| e.0)
    }

    fn truncate(&mut self, seq: SeqId, len: usize) {
        if let Some(e) = self.script.lock().unwrap().live.get_mut(&seq) {
            e.0 = e.0.min(len);
        }
    }

    fn release(&mut self, seq: SeqId) {
        self.script.lock().unwrap().live.remove(&seq);
    }
}

pub struct Harness {
    pub router: Router,
    pub state: Arc<AppState>,
    pub script: Arc<Mutex<Script>>,
}

pub struct Options {
    pub service: ServiceConfig,
    pub server: ServerConfig,
    pub delay: Duration,
    pub max_context: usize,
    /// A chat template instead of the model's.
    pub template: Option<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            service: ServiceConfig::default(),
            server: ServerConfig::default(),
            delay: Duration::ZERO,
            max_context: 4096,
            template: None,
        }
    }
}

pub fn harness(options: Options) -> Harness {
    let a = assets();
    let cfg = ModelConfig {
        arch: models::Arch::Qwen2,
        shapes: models::ModelShapes {
            num_layers: 1,
            hidden_size: 8,
            ffn_size: 8,
            num_heads: 1,
            num_kv_heads: 1,
            head_dim: 8,
            vocab_size: a.tokenizer.vocab_size(),
            max_context: options.max_context,
        },
        rms_eps: 1e-6,
        rope_theta: 1e6,
        rope_dim: 8,
        rope_style: backend::cpu::ops::RopeStyle::Neox,
        qkv_bias: true,
        qk_norm: false,
        tied_embeddings: false,
    };
    let script = Arc::new(Mutex::new(Script::default()));
    let runner = ScriptedRunner {
        cfg,
        eos: a.tokenizer.eos().expect("eos"),
        delay: options.delay,
        script: script.clone(),
        logits: Vec::new(),
        pending_prompts: HashMap::new(),
    };
    let engine = Engine::new(runner, a.tokenizer.clone(), EngineConfig::default());
    let handle = EngineHandle::spawn(engine, options.service).expect("engine thread");
    let source = options.template.unwrap_or_else(|| a.template_source.clone());
    let template = chat::ChatTemplate::new(source, a.bos.clone(), a.eos.clone()).expect("template");
    let state = Arc::new(AppState::new(handle, a.tokenizer.clone(), Some(template), MODEL_ID.into(), options.server));
    Harness { router: api::router(state.clone()), state, script }
}

impl Harness {
    /// Sets the reply the model will write.
    pub fn reply(&self, text: &str) {
        let ids = assets().tokenizer.encode(text, true).unwrap();
        let mut s = self.script.lock().unwrap();
        s.reply = ids;
    }

    pub fn last_prompt_text(&self) -> String {
        let s = self.script.lock().unwrap();
        assets().tokenizer.decode(s.prompts.last().expect("a prompt was seen"))
    }

    pub async fn send(&self, request: Request<Body>) -> Response<Body> {
        self.router.clone().oneshot(request).await.expect("the router never fails")
    }

    pub async fn post_json(&self, path: &str, body: &Value) -> (StatusCode, Value) {
        let request =
            Request::post(path).header("content-type", "application/json").body(Body::from(body.to_string())).unwrap();
        let response = self.send(request).await;
        json_of(response).await
    }

    pub async fn post_raw(&self, path: &str, body: &str) -> (StatusCode, Value) {
        let request =
            Request::post(path).header("content-type", "application/json").body(Body::from(body.to_owned())).unwrap();
        json_of(self.send(request).await).await
    }

    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        json_of(self.send(Request::get(path).body(Body::empty()).unwrap()).await).await
    }
}

pub async fn body_text(response: Response<Body>) -> String {
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
    String::from_utf8(bytes.to_vec()).unwrap()
}

pub async fn json_of(response: Response<Body>) -> (StatusCode, Value) {
    let status = response.status();
    let text = body_text(response).await;
    let value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}"));
    (status, value)
}

/// The `data:` payloads of an SSE body, in order.
pub fn sse_data(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|event| {
            let lines: Vec<&str> = event
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|l| l.strip_prefix(' ').unwrap_or(l))
                .collect();
            (!lines.is_empty()).then(|| lines.join("\n"))
        })
        .collect()
}

/// (event name, data) pairs of a named-event SSE body (Anthropic Messages, OpenAI Responses); comment lines skipped.
pub fn named_events(body: &str) -> Vec<(String, serde_json::Value)> {
    body.split("\n\n")
        .filter(|e| !e.trim().is_empty() && !e.starts_with(':'))
        .map(|e| {
            let name = e.lines().find_map(|l| l.strip_prefix("event: ")).expect("named event").to_owned();
            (name, serde_json::from_str(&sse_data(e).join("\n")).expect("JSON data"))
        })
        .collect()
}

/// Posts `body` as JSON and returns the status and the body, for streamed requests too: a refusal is a JSON body;
/// an accepted stream's body is not JSON and comes back as `Value::Null`.
pub async fn post_json_status(h: &Harness, path: &str, body: &Value) -> (StatusCode, Value) {
    let request =
        Request::post(path).header("content-type", "application/json").body(Body::from(body.to_string())).unwrap();
    let response = h.send(request).await;
    let status = response.status();
    let text = body_text(response).await;
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}
