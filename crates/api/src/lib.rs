//! Splash's HTTP front end: the routes, the shared state and the request path from a protocol's JSON to the engine
//! and back.
//!
//! A request goes: `guard` (Host/Origin, API key) → route (here) → protocol adapter (`openai/` for Chat Completions,
//! `responses/`, `anthropic/`: wire types, checks, conversion, stream, errors) → the neutral [`generate::ChatTurn`] →
//! chat template + tokenizer → [`engine::service::EngineHandle::submit`] → engine events → one output pipeline (a
//! thinking model's reasoning, then text / tool calls) in [`generate::Reply`] → the adapter's response or event
//! stream. Adapters never import each other (they share only `generate`, `error` and `tools`), and nothing here knows how the
//! engine schedules. `admin` holds the endpoints outside the chat protocols.

pub mod admin;
pub mod anthropic;
pub mod constraint;
pub mod error;
pub mod generate;
mod guard;
pub mod lazy_call;
pub mod openai;
pub mod responses;
pub mod tools;
pub mod webui;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use engine::SamplingParams;
use engine::service::EngineHandle;

use crate::anthropic::AnthropicError;
use crate::error::{ApiError, ErrorKind};
use crate::openai::OpenAiError;

/// Server settings that are not the engine's.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Requests must carry this key (`Authorization: Bearer KEY` or `x-api-key: KEY`); `None` = open.
    pub api_key: Option<String>,
    /// Largest request body; larger ones get 413.
    pub max_body_bytes: usize,
    /// Sampling for the parameters a request leaves out.
    pub default_sampling: SamplingParams,
    /// Output cap when a request gives none (always lowered to what fits the context).
    pub default_max_tokens: usize,
    /// Interval of SSE keep-alive comments (they also reveal a client that went away).
    pub keep_alive: Duration,
    /// Memory for stored Responses (`previous_response_id`, `GET /v1/responses/{id}`).
    pub max_stored_response_bytes: usize,
    /// Host names accepted in the `Host` header besides loopback ones (`*` accepts any).
    pub allowed_hosts: Vec<String>,
    /// Stop a reply whose end repeats itself exactly over this many bytes (reported as the output limit); `None`
    /// = never.
    pub max_repeated_chars: Option<usize>,
    /// Serve the chat page at `/` (else a short text page).
    pub webui: bool,
    /// With tools and `tool_choice: auto`, hold a call the model starts to a well-formed call of a declared tool
    /// (the lazy grammar of `lazy_call`).
    pub tool_grammar: bool,
    /// Whether the reasoning of thinking models (`<think>` … `</think>`) is split from the content.
    pub reasoning_format: ReasoningFormat,
}

/// What happens to a thinking model's reasoning (llama-server's `--reasoning-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReasoningFormat {
    /// Left in the content as the model wrote it.
    None,
    /// When the chat template thinks, the reasoning goes out separately (`reasoning_content`, reasoning items,
    /// thinking blocks); other models are not affected.
    #[default]
    Auto,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            api_key: None,
            max_body_bytes: 64 << 20,
            // Qwen2.5-Coder's recommended sampling (generation_config.json).
            default_sampling: SamplingParams { temperature: 0.7, top_p: 0.8, top_k: 20, ..Default::default() },
            default_max_tokens: 16_384,
            keep_alive: Duration::from_secs(5),
            max_stored_response_bytes: 64 << 20,
            allowed_hosts: Vec::new(),
            max_repeated_chars: Some(2048),
            webui: true,
            tool_grammar: true,
            reasoning_format: ReasoningFormat::Auto,
        }
    }
}

/// What every handler shares.
pub struct AppState {
    pub engine: EngineHandle,
    pub tokenizer: Arc<tokenizer::Tokenizer>,
    pub template: Option<chat::ChatTemplate>,
    /// The id the model is served under (first in `/v1/models`, echoed in responses).
    pub model_id: String,
    /// More ids accepted for the same model.
    pub aliases: Vec<String>,
    pub config: ServerConfig,
    pub created_unix: u64,
    pub responses: responses::store::Store,
    /// The memory plan the server's limits come from (reported under `/status`), if one was made.
    pub memory_plan: Option<serde_json::Value>,
}

impl AppState {
    pub fn new(
        engine: EngineHandle,
        tokenizer: Arc<tokenizer::Tokenizer>,
        template: Option<chat::ChatTemplate>,
        model_id: String,
        config: ServerConfig,
    ) -> Self {
        let responses = responses::store::Store::new(config.max_stored_response_bytes);
        AppState {
            engine,
            tokenizer,
            template,
            model_id,
            aliases: Vec::new(),
            config,
            created_unix: unix_now(),
            responses,
            memory_plan: None,
        }
    }

    /// The served id, then the aliases.
    pub fn model_ids(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.model_id.as_str()).chain(self.aliases.iter().map(String::as_str))
    }
}

pub fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// All routes.
pub fn router(state: Arc<AppState>) -> Router {
    let router = if state.config.webui {
        Router::new()
            .route("/", get(webui::index))
            .route("/ui/app.js", get(webui::app_js))
            .route("/ui/style.css", get(webui::style_css))
    } else {
        Router::new().route("/", get(admin::index))
    };
    router
        .route("/health", get(admin::health))
        .route("/ready", get(admin::ready))
        .route("/status", get(admin::status))
        .route("/metrics", get(admin::metrics))
        .route("/tokenize", post(admin::tokenize))
        .route("/detokenize", post(admin::detokenize))
        .route("/apply-template", post(admin::apply_template))
        .route("/v1/models", get(openai::list_models))
        .route("/v1/models/{*id}", get(openai::get_model))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/responses", post(responses::create))
        .route("/v1/responses/{id}", get(responses::retrieve).delete(responses::delete))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), guard::check))
        .layer(DefaultBodyLimit::max(state.config.max_body_bytes))
        .with_state(state)
}

/// Renders `e` in the shape of the protocol that `path` belongs to.
pub(crate) fn error_response(path: &str, e: ApiError) -> Response {
    if path.starts_with("/v1/messages") { AnthropicError(e).into_response() } else { OpenAiError(e).into_response() }
}

async fn not_found(request: Request) -> Response {
    let path = request.uri().path();
    error_response(path, ApiError::not_found(format!("No route for {} {path}.", request.method())))
}

async fn method_not_allowed(request: Request) -> Response {
    let path = request.uri().path();
    error_response(
        path,
        ApiError::new(ErrorKind::MethodNotAllowed, format!("{} is not allowed on {path}.", request.method())),
    )
}

/// A body that could not be read: too large (413) or broken (400).
pub(crate) fn body_error(e: BytesRejection) -> ApiError {
    if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::new(ErrorKind::PayloadTooLarge, "The request body is too large.")
    } else {
        ApiError::invalid(format!("The request body could not be read: {e}"))
    }
}
