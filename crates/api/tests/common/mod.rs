//! Test harness for the router: the real tokenizer and chat template of Qwen2.5-Coder-0.5B (from the model cache,
//! `pack::resolve`) over a scripted model that writes a given reply, so every request runs the whole HTTP → template →
//! tokenizer → engine service → output parser → protocol path without a forward pass (the engine's shared fake
//! runner, [`engine::testing::FakeRunner`]).

#![allow(dead_code)]

use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use api::{AppState, ServerConfig};
use axum::Router;
use axum::body::Body;
use axum::http::{Request, Response, StatusCode};
use engine::service::{EngineHandle, ServiceConfig};
use engine::testing::{self, FakeRunner, FakeState};
use engine::{Engine, EngineConfig};
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

/// What the scripted model will write.
#[derive(Default)]
pub struct Script {
    /// Token ids of the reply; EOS follows unless `no_eos`.
    pub reply: Vec<u32>,
    pub no_eos: bool,
}

pub struct Harness {
    pub router: Router,
    pub state: Arc<AppState>,
    pub script: Arc<Mutex<Script>>,
    /// What the model was asked: the prompts it saw, the sequences it holds.
    seen: Arc<Mutex<FakeState>>,
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
    let script = Arc::new(Mutex::new(Script::default()));
    let eos = a.tokenizer.eos().expect("eos");
    let reply = script.clone();
    // The reply is a function of the position after the prompt (verification rows included); rows are zeros but
    // the reply's token, which the log-probability tests' closed form assumes.
    let vocab = a.tokenizer.vocab_size();
    let rows: testing::Script = Box::new(move |h, prompt_len| {
        let s = reply.lock().unwrap();
        let next = match s.reply.get(h.len() - prompt_len) {
            Some(&t) => t,
            None if s.no_eos => s.reply.last().copied().unwrap_or(eos),
            None => eos,
        };
        let mut row = vec![0.0; vocab];
        row[next as usize] = 10.0;
        row
    });
    let mut runner = FakeRunner::with_script(testing::tiny_config(vocab, options.max_context), rows);
    runner.delay = options.delay;
    let seen = runner.shared();
    let engine = Engine::new(runner, a.tokenizer.clone(), EngineConfig::default());
    let handle = EngineHandle::spawn(engine, options.service).expect("engine thread");
    let source = options.template.unwrap_or_else(|| a.template_source.clone());
    let template = chat::ChatTemplate::new(source, a.bos.clone(), a.eos.clone()).expect("template");
    let state = Arc::new(AppState::new(handle, a.tokenizer.clone(), Some(template), MODEL_ID.into(), options.server));
    Harness { router: api::router(state.clone()), state, script, seen }
}

impl Harness {
    /// What the model was asked so far.
    pub fn seen(&self) -> MutexGuard<'_, FakeState> {
        self.seen.lock().unwrap()
    }

    /// Sets the reply the model will write.
    pub fn reply(&self, text: &str) {
        let ids = assets().tokenizer.encode(text, true).unwrap();
        let mut s = self.script.lock().unwrap();
        s.reply = ids;
    }

    pub fn last_prompt_text(&self) -> String {
        assets().tokenizer.decode(self.seen().prompts.last().expect("a prompt was seen"))
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
