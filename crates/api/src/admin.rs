//! Server endpoints outside the three chat protocols: `/` (text page when the web UI is off), `/health`, `/ready`, `/status` (JSON:
//! model, limits, queue, sequences, speeds), `/metrics` (Prometheus text), `/tokenize`, `/detokenize` and
//! `/apply-template` (the prompt a Chat Completions body renders to, without running the model). Errors use OpenAI's
//! shape.
//!
//! Special tokens: `/tokenize` tokenizes its text as is, special-token texts (`<|im_start|>`) parsed unless
//! `"parse_special": false`, and says which in its answer; `/apply-template` answers the prompt text and the ids the
//! engine would get for it, with `"special_tokens": "template"`: control tokens only where the chat template's own
//! text writes them, every piece of content (messages, tools, system prompts) plain text. Its `prompt` given back to
//! `/tokenize` with specials parsed can differ from `tokens` exactly where content spells a control token.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::error::{ApiError, parse_json};
use crate::openai::{OpenAiError, convert, wire};
use crate::{AppState, body_error, generate};

pub async fn index(State(state): State<Arc<AppState>>) -> Html<String> {
    Html(format!(
        "<!doctype html><meta charset=utf-8><title>Splash</title><h1>Splash</h1>\
         <p>Serving <code>{}</code>. APIs: <code>/v1/chat/completions</code>, <code>/v1/responses</code>, \
         <code>/v1/messages</code>. The web UI is off (<code>--no-webui</code>).</p>",
        html_escape(&state.model_id)
    ))
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

pub async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

pub async fn ready(State(state): State<Arc<AppState>>) -> Response {
    if state.engine.stats().alive {
        Json(json!({"status": "ready"})).into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"status": "unavailable"}))).into_response()
    }
}

pub async fn status(State(state): State<Arc<AppState>>) -> Json<Value> {
    let s = state.engine.stats();
    let uptime_s = crate::unix_now().saturating_sub(state.created_unix);
    Json(json!({
        "model": state.model_id,
        "aliases": state.aliases,
        "alive": s.alive,
        "uptime_s": uptime_s,
        "limits": {
            "max_context_tokens": state.engine.limits().max_context,
            "max_running_requests": s.max_running,
            "max_waiting_requests": s.max_waiting,
            "max_body_bytes": state.config.max_body_bytes,
        },
        "memory_plan": state.memory_plan,
        "queue": {"num_waiting": s.num_waiting, "num_running": s.num_running},
        "requests": {
            "num_submitted": s.num_submitted,
            "num_finished": s.num_finished,
            "num_aborted": s.num_aborted,
            "num_failed": s.num_failed,
        },
        "engine": {
            "num_steps": s.num_steps,
            "num_generated_tokens": s.num_generated_tokens,
            "busy_s": s.busy_s,
            // Aggregate over all sequences while the engine was stepping (prefill time included).
            "generated_tokens_per_busy_second": if s.busy_s > 0.0 { s.num_generated_tokens as f64 / s.busy_s } else { 0.0 },
            // Where the engine thread's time went: the step's phases, then sending events to the streams.
            "step_seconds": {
                "schedule": s.steps.schedule_s, "draft": s.steps.draft_s, "runner": s.steps.runner_s,
                "update": s.steps.update_s, "dispatch": s.dispatch_s,
            },
            "preemptions": s.steps.preemptions,
        },
        "speculation": {
            "acceptance_rate": s.spec.acceptance_rate(),
            "tokens_per_target_pass": s.spec.tokens_per_pass(),
            "depth": s.spec.last_depth,
            "proposers": proposers_json(&s.spec),
            "pass_costs": pass_costs_json(&s.spec.costs),
        },
        "kv_cache": {
            // The runner's page size (the GPU's pages are larger than the CPU's); the CPU's for a runner without one.
            "block_tokens": if s.kv.block_tokens > 0 { s.kv.block_tokens } else { engine::KV_BLOCK_TOKENS },
            "capacity_blocks": s.kv.capacity_blocks,
            "used_blocks": s.kv.used_blocks,
            "cached_blocks": s.kv.cached_blocks,
            "max_cached_blocks": s.kv.max_cached_blocks,
            "stored_blocks": s.kv.stored_blocks,
            "prefix_hit_tokens": s.kv.hit_tokens,
            "prefix_lookup_tokens": s.kv.lookup_tokens,
            "evicted_blocks": s.kv.evicted_blocks,
            // Hybrid models (Gated DeltaNet layers): the state checkpoints prefix reuse resumes from.
            "recurrent_state": s.kv.state.map(|u| json!({
                "state_bytes": u.state_bytes,
                "checkpoints": u.checkpoints,
                "max_checkpoints": u.max_checkpoints,
                "checkpoint_hits": u.checkpoint_hits,
                "checkpoint_hit_tokens": u.checkpoint_hit_tokens,
                "replayed_tokens": u.replayed_tokens,
            })),
        },
    }))
}

pub async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let s = state.engine.stats();
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, samples: &[(&str, String)]| {
        out.push_str(&format!("# HELP splash_{name} {help}\n# TYPE splash_{name} {kind}\n"));
        for (labels, value) in samples {
            out.push_str(&format!("splash_{name}{labels} {value}\n"));
        }
    };
    metric(
        "requests_waiting",
        "gauge",
        "Requests waiting to be admitted (for KV memory or a free sequence slot).",
        &[("", s.num_waiting.to_string())],
    );
    metric("requests_running", "gauge", "Requests generating.", &[("", s.num_running.to_string())]);
    metric(
        "requests_total",
        "counter",
        "Requests that ended, by outcome.",
        &[
            ("{outcome=\"finished\"}", s.num_finished.to_string()),
            ("{outcome=\"aborted\"}", s.num_aborted.to_string()),
            ("{outcome=\"failed\"}", s.num_failed.to_string()),
        ],
    );
    metric("generated_tokens_total", "counter", "Tokens sampled.", &[("", s.num_generated_tokens.to_string())]);
    metric("engine_steps_total", "counter", "Engine steps (batches run).", &[("", s.num_steps.to_string())]);
    metric("engine_busy_seconds_total", "counter", "Time spent stepping.", &[("", format!("{:.6}", s.busy_s))]);
    let by_proposer: Vec<(String, String)> = s
        .spec
        .proposers()
        .iter()
        .flat_map(|p| {
            [("proposed", p.proposed), ("accepted", p.accepted)]
                .map(|(outcome, n)| (format!("{{proposer=\"{}\",outcome=\"{outcome}\"}}", p.name), n.to_string()))
        })
        .collect();
    metric(
        "engine_step_seconds_total",
        "counter",
        "The engine thread's time by phase: scheduling, draft passes, the target runner, sampling and \
         detokenising (update), sending events to the streams (dispatch).",
        &[
            ("{phase=\"schedule\"}", format!("{:.6}", s.steps.schedule_s)),
            ("{phase=\"draft\"}", format!("{:.6}", s.steps.draft_s)),
            ("{phase=\"runner\"}", format!("{:.6}", s.steps.runner_s)),
            ("{phase=\"update\"}", format!("{:.6}", s.steps.update_s)),
            ("{phase=\"dispatch\"}", format!("{:.6}", s.dispatch_s)),
        ],
    );
    metric(
        "engine_preemptions_total",
        "counter",
        "Sequences preempted for lack of KV memory (released, to be recomputed).",
        &[("", s.steps.preemptions.to_string())],
    );
    metric(
        "spec_draft_tokens_total",
        "counter",
        "Draft tokens proposed and accepted, by proposer.",
        &by_proposer.iter().map(|(l, v)| (l.as_str(), v.clone())).collect::<Vec<_>>(),
    );
    metric(
        "spec_tokens_per_target_pass",
        "gauge",
        "Tokens produced per target pass of a decoding sequence.",
        &[("", format!("{:.4}", s.spec.tokens_per_pass()))],
    );
    metric("spec_depth", "gauge", "Mean draft depth in the last step.", &[("", format!("{:.3}", s.spec.last_depth))]);
    let costs = &s.spec.costs;
    let points: Vec<(String, &engine::spec::CostPoint)> = costs
        .target_points()
        .iter()
        .map(|p| (format!("{{pass=\"target\",rows=\"{}\"}}", p.rows), p))
        .chain(costs.pass_points().iter().map(|(name, p)| (format!("{{pass=\"{name}\",rows=\"1\"}}"), p)))
        .collect();
    let samples = |f: &dyn Fn(&engine::spec::CostPoint) -> String| -> Vec<(&str, String)> {
        points.iter().map(|(l, p)| (l.as_str(), f(p))).collect()
    };
    metric(
        "spec_pass_cost_seconds",
        "gauge",
        "Pass costs the draft depth chooser is using, by pass and rows.",
        &samples(&|p| format!("{:.6e}", p.secs)),
    );
    metric(
        "spec_pass_cost_samples_total",
        "counter",
        "Passes timed for each cost since the start.",
        &samples(&|p| p.samples.to_string()),
    );
    metric(
        "spec_pass_cost_measured_timestamp_seconds",
        "gauge",
        "When each cost was last measured (Unix time; the calibration's time until a pass is timed, 0 if unknown).",
        &samples(&|p| format!("{:.3}", p.measured_unix)),
    );
    metric(
        "spec_explored_passes_total",
        "counter",
        "Passes padded to time a row count the chooser would not have run.",
        &[("", costs.explored_passes.to_string())],
    );
    metric(
        "kv_blocks",
        "gauge",
        "KV cache blocks by state.",
        &[
            ("{state=\"used\"}", s.kv.used_blocks.to_string()),
            ("{state=\"cached\"}", s.kv.cached_blocks.to_string()),
            ("{state=\"capacity\"}", s.kv.capacity_blocks.to_string()),
        ],
    );
    metric(
        "prefix_cache_tokens_total",
        "counter",
        "Prompt tokens looked up in, and served from, the prefix cache.",
        &[("{outcome=\"lookup\"}", s.kv.lookup_tokens.to_string()), ("{outcome=\"hit\"}", s.kv.hit_tokens.to_string())],
    );
    metric(
        "context_tokens_max",
        "gauge",
        "Most tokens of prompt and output per request.",
        &[("", state.engine.limits().max_context.to_string())],
    );
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response()
}

#[derive(Deserialize)]
struct TokenizeRequest {
    content: String,
    /// Add BOS where the model wants it.
    #[serde(default)]
    add_special: bool,
    /// Also return each token's text.
    #[serde(default)]
    with_pieces: bool,
    /// Special-token texts become their ids (default); `false`: control tokens' texts are plain text.
    #[serde(default = "yes")]
    parse_special: bool,
}

fn yes() -> bool {
    true
}

pub async fn tokenize(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, OpenAiError> {
    let request: TokenizeRequest = parse_json(&body.map_err(body_error)?)?;
    let tokenizer = &state.tokenizer;
    let mut ids = tokenizer.encode(&request.content, request.parse_special).map_err(ApiError::from)?;
    if request.add_special {
        tokenizer.prepend_bos(&mut ids);
    }
    let parse_special = request.parse_special;
    if request.with_pieces {
        let tokens: Vec<Value> = ids
            .iter()
            .map(|&id| json!({"id": id, "piece": String::from_utf8_lossy(tokenizer.token_bytes(id))}))
            .collect();
        return Ok(Json(json!({"tokens": tokens, "parse_special": parse_special})));
    }
    Ok(Json(json!({"tokens": ids, "parse_special": parse_special})))
}

#[derive(Deserialize)]
struct DetokenizeRequest {
    tokens: Vec<u32>,
}

pub async fn detokenize(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, OpenAiError> {
    let request: DetokenizeRequest = parse_json(&body.map_err(body_error)?)?;
    let vocab = state.tokenizer.vocab_size();
    if let Some(t) = request.tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(
            ApiError::invalid_param("tokens", format!("Token id {t} is outside the vocabulary of {vocab}.")).into()
        );
    }
    Ok(Json(json!({"content": state.tokenizer.decode(&request.tokens)})))
}

/// The prompt a Chat Completions request renders to: `{"prompt": text, "tokens": ids, "special_tokens": "template"}`
/// (the ids the engine gets: control tokens only from the template's text).
pub async fn apply_template(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, OpenAiError> {
    let request: wire::ChatRequest = parse_json(&body.map_err(body_error)?)?;
    let turn = convert::to_turn(request, &state.config.default_sampling)?;
    let s = state.clone();
    let (text, ids) = tokio::task::spawn_blocking(move || {
        let rendered = generate::render(&s, &turn)?;
        let ids = generate::encode_prompt(&s.tokenizer, &rendered.prompt)?;
        Ok::<_, ApiError>((rendered.text(), ids))
    })
    .await
    .map_err(|e| ApiError::internal(format!("rendering failed: {e}")))??;
    Ok(Json(json!({"prompt": text, "tokens": ids, "special_tokens": "template"})))
}

/// The pass costs the depth chooser is using (`/status`, `splash run --stats`): per target row count and for the
/// draft pass, the estimate and the calibration's value in milliseconds, how many passes were timed since the start
/// and when the estimate was last measured (Unix seconds, and seconds ago; the calibration's time until a pass is
/// timed).
/// Per proposer (prompt lookup "ngram", the draft model "draft", any added): its draft tokens proposed and
/// accepted, for /status and `run --stats`.
pub fn proposers_json(spec: &engine::SpecStats) -> serde_json::Value {
    let entry = |p: &engine::ProposerStats| {
        let rate = p.accepted as f64 / p.proposed.max(1) as f64;
        (
            p.name.to_string(),
            serde_json::json!({"proposed": p.proposed, "accepted": p.accepted, "acceptance_rate": rate}),
        )
    };
    serde_json::Value::Object(spec.proposers().iter().map(entry).collect())
}

pub fn pass_costs_json(costs: &engine::spec::CostsView) -> serde_json::Value {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
    let point = |p: &engine::spec::CostPoint| {
        serde_json::json!({
            "rows": p.rows.max(1),
            "ms": p.secs * 1e3,
            "calibrated_ms": p.prior_secs * 1e3,
            "samples": p.samples,
            "measured_unix": (p.measured_unix > 0.0).then_some(p.measured_unix),
            "measured_s_ago": (p.measured_unix > 0.0).then(|| (now - p.measured_unix).max(0.0)),
        })
    };
    serde_json::json!({
        "target": costs.target_points().iter().map(point).collect::<Vec<_>>(),
        // Each proposer's draft pass (the draft model's is "draft").
        "proposers": costs.pass_points().iter().map(|(name, p)| (name.to_string(), point(p))).collect::<serde_json::Map<_, _>>(),
        "explored_passes": costs.explored_passes,
    })
}
