//! The engine as a service: one thread owns the [`Engine`] and runs its step loop; any number of async callers submit
//! requests through a cloneable [`EngineHandle`] and read each request's events from its own [`RequestStream`].
//!
//! In: [`GenerateRequest`]s from any thread or task. Out: per request, the engine's [`Event`]s in order over a tokio
//! channel, ending with `Event::Finished` (or one `Err` if the request could not run to the end). Every request goes to
//! the engine, whose scheduler admits it when its prompt fits the KV memory (and fewer than
//! [`ServiceConfig::max_running`] run); until then it waits, and past [`ServiceConfig::max_waiting`] waiting a submit fails at once
//! with [`ServiceError::QueueFull`] (an HTTP adapter answers 429 with `Retry-After`). Dropping a stream (the client
//! went away) aborts its request before the next step, freeing its sequence. The thread blocks while there is no work
//! and wakes on the next submit; it exits when every handle is gone.
//!
//! Knows nothing about HTTP or chat protocols: those adapters live in the `api` crate.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::task::{Context, Poll};

use models::Runner;
use tokio::sync::mpsc as tokio_mpsc;

use crate::{Engine, Event, FinishReason, GenerateRequest, RequestId};

/// Limits of the service.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// Most requests running in the engine at once (one sequence each): a ceiling, below which the engine admits
    /// requests as their prompts fit the KV memory.
    pub max_running: usize,
    /// Most requests waiting to run; one more is refused with [`ServiceError::QueueFull`].
    pub max_waiting: usize,
    /// Most tokens of prompt and output together; `None` = the model's context. Never more than the model's.
    pub max_context: Option<usize>,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        ServiceConfig { max_running: 8, max_waiting: 64, max_context: None }
    }
}

/// Why a request was refused or stopped. Request-scoped variants first; `ShutDown` and `Engine` concern the service.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ServiceError {
    /// The request is malformed (empty prompt, token outside the vocabulary, bad sampling parameter).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The prompt leaves no room for output in the context.
    #[error("the prompt has {num_tokens} tokens; the context holds {max_context} tokens of prompt and output")]
    PromptTooLong { num_tokens: usize, max_context: usize },
    /// Too many requests are waiting; try again after `retry_after_s` seconds.
    #[error("the server is busy: {num_waiting} requests are already waiting")]
    QueueFull { num_waiting: usize, retry_after_s: u64 },
    /// The engine thread is gone (it panicked or the service was dropped).
    #[error("the engine is not running")]
    ShutDown,
    /// The server is shutting down: the request was cancelled (or refused) after the drain deadline.
    #[error("the server is shutting down")]
    Cancelled,
    /// A step of the model failed; every request in that step is ended with this.
    #[error("the model failed: {0}")]
    Engine(String),
}

/// One item of a [`RequestStream`].
pub type StreamItem = Result<Event, ServiceError>;

/// Counters shared by the handles and the engine thread (read by `/status` and `/metrics`).
#[derive(Debug, Default)]
struct Shared {
    num_waiting: AtomicUsize,
    num_running: AtomicUsize,
    num_submitted: AtomicU64,
    num_finished: AtomicU64,
    num_aborted: AtomicU64,
    num_failed: AtomicU64,
    num_steps: AtomicU64,
    num_generated_tokens: AtomicU64,
    /// Time spent inside `Engine::step`, and sending its events to the streams, in microseconds.
    busy_us: AtomicU64,
    dispatch_us: AtomicU64,
    alive: AtomicBool,
    /// Set by [`EngineHandle::cancel_all`]: new requests are refused with [`ServiceError::Cancelled`].
    closing: AtomicBool,
    /// Speculation counters, KV-cache occupancy and step times after the last step.
    engine_state: std::sync::Mutex<(crate::SpecStats, models::KvUsage, crate::StepTimes)>,
}

/// A snapshot of the service's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ServiceStats {
    pub num_waiting: usize,
    pub num_running: usize,
    pub num_submitted: u64,
    /// Ended with `Finished` (stop or length).
    pub num_finished: u64,
    /// Ended because the caller dropped the stream.
    pub num_aborted: u64,
    /// Ended with an error.
    pub num_failed: u64,
    pub num_steps: u64,
    pub num_generated_tokens: u64,
    /// Time the engine spent stepping (the rest it was idle, admitting or dispatching events).
    pub busy_s: f64,
    /// Time the engine thread spent sending steps' events to the request streams.
    pub dispatch_s: f64,
    /// Where the steps' time went.
    pub steps: crate::StepTimes,
    pub max_running: usize,
    pub max_waiting: usize,
    pub alive: bool,
    pub spec: crate::SpecStats,
    pub kv: models::KvUsage,
}

/// What the engine thread receives.
enum Command {
    Submit(Pending),
    /// End every request with [`ServiceError::Cancelled`].
    CancelAll,
    /// Do the runners' background work (the prefix cache's disk writes) until none is left or the deadline passes,
    /// then answer whether all of it was done.
    Flush {
        deadline: std::time::Instant,
        done: mpsc::Sender<bool>,
    },
}

/// A request that has not entered the engine yet.
struct Pending {
    request: GenerateRequest,
    events: tokio_mpsc::UnboundedSender<StreamItem>,
    /// Set at admission: prompt tokens served from the prefix cache.
    cached_tokens: Arc<AtomicUsize>,
}

/// The model limits callers need before submitting (to count, clamp and report).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelLimits {
    /// Most tokens of prompt and output together that this service accepts.
    pub max_context: usize,
    pub vocab_size: usize,
}

/// A cloneable, thread-safe handle on the engine thread.
#[derive(Clone)]
pub struct EngineHandle {
    commands: mpsc::Sender<Command>,
    shared: Arc<Shared>,
    limits: ModelLimits,
    max_running: usize,
    max_waiting: usize,
}

impl std::fmt::Debug for EngineHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineHandle").field("limits", &self.limits).field("stats", &self.stats()).finish()
    }
}

impl EngineHandle {
    /// Moves `engine` onto a new thread that runs its step loop, and returns the first handle.
    pub fn spawn<R: Runner + 'static>(engine: Engine<R>, config: ServiceConfig) -> std::io::Result<EngineHandle> {
        let model_context = engine.runner().config().max_context;
        let limits = ModelLimits {
            max_context: config.max_context.map_or(model_context, |n| n.min(model_context)),
            vocab_size: engine.runner().config().vocab_size,
        };
        let shared = Arc::new(Shared { alive: AtomicBool::new(true), ..Default::default() });
        let (commands, receiver) = mpsc::channel();
        let max_running = config.max_running.max(1);
        let mut engine = engine;
        engine.set_max_running(max_running);
        let worker = Worker { engine, commands: receiver, shared: shared.clone(), requests: HashMap::new() };
        std::thread::Builder::new().name("splash-engine".into()).spawn(move || worker.run())?;
        Ok(EngineHandle { commands, shared, limits, max_running, max_waiting: config.max_waiting })
    }

    pub fn limits(&self) -> ModelLimits {
        self.limits
    }

    /// Queues `request` and returns the stream of its events. Fails at once if the request is invalid, its prompt
    /// does not fit, the queue is full or the engine is gone. `max_tokens` is lowered to what fits the context.
    pub fn submit(&self, mut request: GenerateRequest) -> Result<RequestStream, ServiceError> {
        self.check(&request)?;
        request.max_tokens = request.max_tokens.min(self.limits.max_context - request.prompt.len());
        if !self.shared.alive.load(Ordering::Acquire) {
            return Err(ServiceError::ShutDown);
        }
        if self.shared.closing.load(Ordering::Acquire) {
            return Err(ServiceError::Cancelled);
        }
        let max_waiting = self.max_waiting;
        self.shared
            .num_waiting
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max_waiting).then_some(n + 1))
            .map_err(|n| ServiceError::QueueFull { num_waiting: n, retry_after_s: 1 })?;
        let num_prompt_tokens = request.prompt.len();
        let max_tokens = request.max_tokens;
        let (events, receiver) = tokio_mpsc::unbounded_channel();
        let cached_tokens = Arc::new(AtomicUsize::new(0));
        let pending = Pending { request, events, cached_tokens: cached_tokens.clone() };
        if self.commands.send(Command::Submit(pending)).is_err() {
            self.shared.num_waiting.fetch_sub(1, Ordering::AcqRel);
            return Err(ServiceError::ShutDown);
        }
        self.shared.num_submitted.fetch_add(1, Ordering::Relaxed);
        Ok(RequestStream { events: receiver, num_prompt_tokens, max_tokens, cached_tokens })
    }

    /// The checks the engine would make on admission, made here so that a bad request fails before it queues.
    fn check(&self, request: &GenerateRequest) -> Result<(), ServiceError> {
        if request.prompt.is_empty() {
            return Err(ServiceError::InvalidRequest("the prompt is empty".into()));
        }
        if let Some(t) = request.prompt.iter().find(|&&t| t as usize >= self.limits.vocab_size) {
            return Err(ServiceError::InvalidRequest(format!(
                "token id {t} is outside the vocabulary of {}",
                self.limits.vocab_size
            )));
        }
        if request.prompt.len() >= self.limits.max_context {
            return Err(ServiceError::PromptTooLong {
                num_tokens: request.prompt.len(),
                max_context: self.limits.max_context,
            });
        }
        if request.max_tokens == 0 {
            return Err(ServiceError::InvalidRequest("max_tokens must be at least 1".into()));
        }
        request.sampling.validate().map_err(ServiceError::InvalidRequest)
    }

    /// Ends every running and waiting request with [`ServiceError::Cancelled`] (their streams get it as their last
    /// item) and refuses new ones the same way: the end of a graceful shutdown's drain.
    pub fn cancel_all(&self) {
        self.shared.closing.store(true, Ordering::Release);
        let _ = self.commands.send(Command::CancelAll);
    }

    /// Waits (blocking, at most until `timeout`) for the engine thread to finish the runners' background work, the
    /// prefix cache's disk writes: true when all of it is done. Requests still running delay it.
    pub fn flush(&self, timeout: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        let (done, answer) = mpsc::channel();
        if self.commands.send(Command::Flush { deadline, done }).is_err() {
            return false;
        }
        answer.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now())).unwrap_or(false)
    }

    pub fn stats(&self) -> ServiceStats {
        let s = &self.shared;
        ServiceStats {
            num_waiting: s.num_waiting.load(Ordering::Relaxed),
            num_running: s.num_running.load(Ordering::Relaxed),
            num_submitted: s.num_submitted.load(Ordering::Relaxed),
            num_finished: s.num_finished.load(Ordering::Relaxed),
            num_aborted: s.num_aborted.load(Ordering::Relaxed),
            num_failed: s.num_failed.load(Ordering::Relaxed),
            num_steps: s.num_steps.load(Ordering::Relaxed),
            num_generated_tokens: s.num_generated_tokens.load(Ordering::Relaxed),
            busy_s: s.busy_us.load(Ordering::Relaxed) as f64 / 1e6,
            dispatch_s: s.dispatch_us.load(Ordering::Relaxed) as f64 / 1e6,
            max_running: self.max_running,
            max_waiting: self.max_waiting,
            alive: s.alive.load(Ordering::Relaxed),
            spec: s.engine_state.lock().map(|g| g.0).unwrap_or_default(),
            kv: s.engine_state.lock().map(|g| g.1).unwrap_or_default(),
            steps: s.engine_state.lock().map(|g| g.2).unwrap_or_default(),
        }
    }
}

/// The events of one request. Dropping it aborts the request.
#[derive(Debug)]
pub struct RequestStream {
    events: tokio_mpsc::UnboundedReceiver<StreamItem>,
    num_prompt_tokens: usize,
    max_tokens: usize,
    cached_tokens: Arc<AtomicUsize>,
}

impl RequestStream {
    /// The next event; `None` after `Finished` or an error.
    pub async fn next(&mut self) -> Option<StreamItem> {
        self.events.recv().await
    }

    /// The next event if one is ready (for synchronous callers and tests).
    pub fn try_next(&mut self) -> Option<StreamItem> {
        self.events.try_recv().ok()
    }

    /// The next event, blocking the thread (never call this inside an async runtime).
    pub fn blocking_next(&mut self) -> Option<StreamItem> {
        self.events.blocking_recv()
    }

    pub fn num_prompt_tokens(&self) -> usize {
        self.num_prompt_tokens
    }

    /// Prompt tokens served from the prefix cache: known once the request is admitted (0 before), so a caller
    /// that ends the reply itself, before `Finished`, can still report them.
    pub fn num_cached_tokens(&self) -> usize {
        self.cached_tokens.load(Ordering::Acquire)
    }

    /// `max_tokens` after clamping to the context.
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }
}

impl futures_core::Stream for RequestStream {
    type Item = StreamItem;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<StreamItem>> {
        self.events.poll_recv(cx)
    }
}

/// A request the engine holds, as the service tracks it.
struct Live {
    events: tokio_mpsc::UnboundedSender<StreamItem>,
    /// Until the engine admits the request (it waits for KV memory until then): where its cached prompt tokens go.
    unadmitted: Option<Arc<AtomicUsize>>,
}

/// The engine thread's state.
struct Worker<R: Runner> {
    engine: Engine<R>,
    commands: mpsc::Receiver<Command>,
    shared: Arc<Shared>,
    /// Every request handed to the engine, admitted or waiting there.
    requests: HashMap<RequestId, Live>,
}

impl<R: Runner> Worker<R> {
    fn run(mut self) {
        loop {
            if !self.receive() {
                return;
            }
            self.drop_cancelled();
            if !self.engine.has_work() {
                // Aborts free blocks outside a step: the gauges show it before the thread goes idle.
                self.publish_state();
                continue;
            }
            self.shared.num_steps.fetch_add(1, Ordering::Relaxed);
            let t0 = std::time::Instant::now();
            let result = std::panic::catch_unwind(AssertUnwindSafe(|| self.engine.step()));
            let busy_us = u64::try_from(t0.elapsed().as_micros()).unwrap_or(u64::MAX);
            self.shared.busy_us.fetch_add(busy_us, Ordering::Relaxed);
            if result.is_ok() {
                self.note_admitted();
            }
            self.publish_state();
            match result {
                Ok(Ok(events)) => {
                    let num_requests = self.requests.len();
                    let t1 = std::time::Instant::now();
                    self.dispatch(events);
                    let dispatch_us = u64::try_from(t1.elapsed().as_micros()).unwrap_or(u64::MAX);
                    self.shared.dispatch_us.fetch_add(dispatch_us, Ordering::Relaxed);
                    if self.requests.len() < num_requests {
                        self.publish_state();
                    }
                }
                Ok(Err(e)) => {
                    self.fail_all(ServiceError::Engine(e.to_string()), true);
                    self.publish_state();
                }
                Err(panic) => {
                    let message = panic
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "panic".into());
                    self.shared.alive.store(false, Ordering::Release);
                    // The engine may be in any state now: do not touch it, only tell everyone.
                    self.fail_all(ServiceError::Engine(format!("the engine stopped: {message}")), false);
                    return;
                }
            }
        }
    }

    /// Speculation counters, KV-cache occupancy and step times, for `/status` and `/metrics`.
    fn publish_state(&self) {
        if let Ok(mut g) = self.shared.engine_state.lock() {
            *g = (self.engine.spec_stats(), self.engine.runner().kv_usage(), self.engine.step_times());
        }
    }

    /// Takes new commands: blocks while there is nothing else to do. Returns false when the service is over.
    fn receive(&mut self) -> bool {
        if self.requests.is_empty() {
            // Idle: do the runners' background work in small steps, looking for requests in between.
            loop {
                match self.commands.try_recv() {
                    Ok(command) => {
                        self.handle(command);
                        break;
                    }
                    Err(mpsc::TryRecvError::Disconnected) => {
                        while self.engine.idle_work() {}
                        return false;
                    }
                    Err(mpsc::TryRecvError::Empty) if self.engine.idle_work() => continue,
                    Err(mpsc::TryRecvError::Empty) => match self.commands.recv() {
                        Ok(command) => {
                            self.handle(command);
                            break;
                        }
                        Err(_) => return false,
                    },
                }
            }
        }
        loop {
            match self.commands.try_recv() {
                Ok(command) => self.handle(command),
                Err(mpsc::TryRecvError::Empty) => return true,
                // Every handle is gone; finish what is queued (its streams may still be read).
                Err(mpsc::TryRecvError::Disconnected) => return !self.requests.is_empty(),
            }
        }
    }

    fn handle(&mut self, command: Command) {
        match command {
            Command::Submit(pending) if self.shared.closing.load(Ordering::Acquire) => {
                let _ = pending.events.send(Err(ServiceError::Cancelled));
                self.shared.num_waiting.fetch_sub(1, Ordering::AcqRel);
                self.shared.num_aborted.fetch_add(1, Ordering::Relaxed);
            }
            Command::Submit(pending) => self.submit(pending),
            Command::CancelAll => self.cancel_all(),
            Command::Flush { deadline, done } => {
                let mut complete = false;
                while std::time::Instant::now() < deadline {
                    if !self.engine.idle_work() {
                        complete = true;
                        break;
                    }
                }
                let _ = done.send(complete);
            }
        }
    }

    /// Hands a request to the engine, which queues it until its prompt fits the KV memory.
    fn submit(&mut self, Pending { request, events, cached_tokens }: Pending) {
        match self.engine.add_request(request) {
            Ok(id) => {
                self.requests.insert(id, Live { events, unadmitted: Some(cached_tokens) });
            }
            Err(e) => {
                let error = match e {
                    crate::Error::InvalidRequest(m) => ServiceError::InvalidRequest(m),
                    crate::Error::Model(m) => ServiceError::Engine(m.to_string()),
                };
                let _ = events.send(Err(error));
                self.shared.num_waiting.fetch_sub(1, Ordering::AcqRel);
                self.shared.num_failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Moves the requests the engine admitted in the last step from the waiting to the running count, and makes
    /// their cached prompt tokens known.
    fn note_admitted(&mut self) {
        for (id, cached) in self.engine.take_admitted() {
            if let Some(c) = self.requests.get_mut(&id).and_then(|r| r.unadmitted.take()) {
                c.store(cached, Ordering::Release);
                self.shared.num_waiting.fetch_sub(1, Ordering::AcqRel);
                self.shared.num_running.fetch_add(1, Ordering::AcqRel);
            }
        }
    }

    /// Stops tracking a request (ended or aborted): the waiting or running count drops by one.
    fn forget(&mut self, id: RequestId) -> Option<tokio_mpsc::UnboundedSender<StreamItem>> {
        let live = self.requests.remove(&id)?;
        let count = if live.unadmitted.is_some() { &self.shared.num_waiting } else { &self.shared.num_running };
        count.fetch_sub(1, Ordering::AcqRel);
        Some(live.events)
    }

    /// Ends every request with [`ServiceError::Cancelled`], freeing its sequence.
    fn cancel_all(&mut self) {
        let ids: Vec<RequestId> = self.requests.keys().copied().collect();
        for id in ids {
            self.engine.abort(id);
            if let Some(tx) = self.forget(id) {
                let _ = tx.send(Err(ServiceError::Cancelled));
                self.shared.num_aborted.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.publish_state();
    }

    /// Aborts the requests whose stream was dropped.
    fn drop_cancelled(&mut self) {
        let closed: Vec<RequestId> =
            self.requests.iter().filter(|(_, r)| r.events.is_closed()).map(|(id, _)| *id).collect();
        for id in closed {
            self.engine.abort(id);
            self.forget(id);
            self.shared.num_aborted.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Sends a step's events to their streams; a stream found closed is aborted.
    fn dispatch(&mut self, events: Vec<(RequestId, Event)>) {
        for (id, event) in events {
            let finished = matches!(event, Event::Finished { .. });
            if let Event::Finished { reason, .. } = &event {
                let counter =
                    if *reason == FinishReason::Aborted { &self.shared.num_aborted } else { &self.shared.num_finished };
                counter.fetch_add(1, Ordering::Relaxed);
            } else {
                self.shared.num_generated_tokens.fetch_add(1, Ordering::Relaxed);
            }
            if finished {
                // Counters first, so a caller that saw `Finished` sees the sequence gone.
                let Some(tx) = self.forget(id) else { continue };
                let _ = tx.send(Ok(event));
                continue;
            }
            let Some(r) = self.requests.get(&id) else { continue };
            if r.events.send(Ok(event)).is_err() {
                self.engine.abort(id);
                self.forget(id);
                self.shared.num_aborted.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Ends every request with `error`: a step failed (`abort`: free them in the engine, whose state for them is
    /// unchanged) or the engine panicked (it may be in any state: not touched).
    fn fail_all(&mut self, error: ServiceError, abort: bool) {
        let ids: Vec<RequestId> = self.requests.keys().copied().collect();
        for id in ids {
            if abort {
                self.engine.abort(id);
            }
            if let Some(tx) = self.forget(id) {
                let _ = tx.send(Err(error.clone()));
                self.shared.num_failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{self, FakeRunner, TokenizerSpec};
    use crate::{EngineConfig, SamplingParams};
    use std::time::{Duration, Instant};

    const EOS: u32 = 256;
    const VOCAB: usize = 257;

    /// A byte-level tokenizer: ids 0..=255 are bytes (GPT-2 alphabet), 256 is `<|im_end|>` (EOS).
    fn byte_tokenizer() -> Arc<tokenizer::Tokenizer> {
        let mut tokens = testing::byte_tokens();
        tokens.push(("<|im_end|>".into(), 3));
        testing::tokenizer(TokenizerSpec { tokens, merges: &[], pre: Some("qwen2"), bos: None, eos: EOS })
    }

    /// A model that writes the bytes of "abcdefghij" cyclically after any prompt, then EOS after `reply_len`
    /// tokens; each pass sleeps `delay`.
    fn fake(reply_len: usize, delay: Duration) -> FakeRunner {
        let mut r = FakeRunner::replying(testing::tiny_config(VOCAB, 64), move |i| {
            if i >= reply_len { EOS } else { u32::from(b'a') + (i % 10) as u32 }
        });
        r.delay = delay;
        r
    }

    fn spawn(runner: FakeRunner, config: ServiceConfig) -> EngineHandle {
        let engine = Engine::new(runner, byte_tokenizer(), EngineConfig { max_batch_tokens: 16, ..Default::default() });
        EngineHandle::spawn(engine, config).unwrap()
    }

    fn request(prompt: &str, max_tokens: usize) -> GenerateRequest {
        GenerateRequest::new(prompt.bytes().map(u32::from).collect(), SamplingParams::greedy(), max_tokens)
    }

    /// Reads a stream to its end: (text, finish reason or error).
    fn collect(stream: &mut RequestStream) -> (String, Result<FinishReason, ServiceError>) {
        let mut text = String::new();
        while let Some(item) = stream.blocking_next() {
            match item {
                Ok(Event::Token { text: t, .. }) => text.push_str(&t),
                Ok(Event::Finished { reason, text: t, .. }) => {
                    text.push_str(&t);
                    return (text, Ok(reason));
                }
                Err(e) => return (text, Err(e)),
            }
        }
        panic!("the stream ended without Finished or an error");
    }

    fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
        let t0 = Instant::now();
        while !cond() {
            assert!(t0.elapsed() < Duration::from_secs(10), "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    #[test]
    fn streams_tokens_then_finished() {
        let handle = spawn(fake(5, Duration::ZERO), ServiceConfig::default());
        let mut stream = handle.submit(request("hello", 100)).unwrap();
        assert_eq!(stream.num_prompt_tokens(), 5);
        assert_eq!(collect(&mut stream), ("abcde".to_string(), Ok(FinishReason::Stop)));
        assert!(stream.blocking_next().is_none());
        let mut stream = handle.submit(request("hi", 3)).unwrap();
        assert_eq!(collect(&mut stream), ("abc".to_string(), Ok(FinishReason::Length)));
        wait_until("counters", || handle.stats().num_running == 0);
        let stats = handle.stats();
        assert_eq!((stats.num_submitted, stats.num_finished, stats.num_waiting), (2, 2, 0));
        assert_eq!((stats.max_running, stats.max_waiting, stats.num_generated_tokens), (8, 64, 9));
        assert!(stats.busy_s > 0.0);
    }

    #[test]
    fn cached_prompt_tokens_are_known_from_admission() {
        let mut runner = fake(4, Duration::from_millis(5));
        runner.cached_prefix = 3;
        let handle = spawn(runner, ServiceConfig::default());
        let mut stream = handle.submit(request("hello", 100)).unwrap();
        // Before the end: what an API reads when it cuts a reply short (a complete tool call, a loop).
        assert!(matches!(stream.blocking_next(), Some(Ok(Event::Token { .. }))));
        assert_eq!(stream.num_cached_tokens(), 3);
        let usage = loop {
            match stream.blocking_next() {
                Some(Ok(Event::Finished { usage, .. })) => break usage,
                Some(Ok(_)) => {}
                other => panic!("unexpected {other:?}"),
            }
        };
        assert_eq!((usage.prompt_tokens, usage.cached_tokens), (5, 3));
    }

    #[test]
    fn concurrent_requests_each_get_their_own_events() {
        let config = ServiceConfig { max_running: 3, ..Default::default() };
        let handle = spawn(fake(12, Duration::from_millis(1)), config);
        let threads: Vec<_> = (0..6)
            .map(|i| {
                let handle = handle.clone();
                std::thread::spawn(move || {
                    let mut stream = handle.submit(request(&"x".repeat(i + 1), 7 + 2 * i)).unwrap();
                    collect(&mut stream)
                })
            })
            .collect();
        for (i, t) in threads.into_iter().enumerate() {
            let expected: String = "abcdefghijab".chars().take(7 + 2 * i).collect();
            let reason = if 7 + 2 * i > 12 { FinishReason::Stop } else { FinishReason::Length };
            assert_eq!(t.join().unwrap(), (expected, Ok(reason)));
        }
    }

    #[test]
    fn max_tokens_is_clamped_to_the_context() {
        let config = ServiceConfig { max_context: Some(20), ..Default::default() };
        let handle = spawn(fake(1000, Duration::ZERO), config);
        assert_eq!(handle.limits().max_context, 20);
        let mut stream = handle.submit(request("0123456789", 1000)).unwrap();
        assert_eq!(stream.max_tokens(), 10);
        let (text, reason) = collect(&mut stream);
        assert_eq!((text.len(), reason), (10, Ok(FinishReason::Length)));
    }

    #[test]
    fn bad_requests_fail_at_submit() {
        let handle = spawn(fake(5, Duration::ZERO), ServiceConfig::default());
        assert!(matches!(handle.submit(request("", 5)), Err(ServiceError::InvalidRequest(_))));
        assert_eq!(
            handle.submit(request(&"x".repeat(64), 5)).unwrap_err(),
            ServiceError::PromptTooLong { num_tokens: 64, max_context: 64 }
        );
        let mut r = request("hi", 5);
        r.prompt.push(VOCAB as u32);
        assert!(matches!(handle.submit(r), Err(ServiceError::InvalidRequest(m)) if m.contains("vocabulary")));
        let mut r = request("hi", 5);
        r.sampling.top_p = 0.0;
        assert!(matches!(handle.submit(r), Err(ServiceError::InvalidRequest(m)) if m.contains("top_p")));
        assert!(matches!(handle.submit(request("hi", 0)), Err(ServiceError::InvalidRequest(_))));
        // The service still works.
        assert_eq!(collect(&mut handle.submit(request("ok", 2)).unwrap()).0, "ab");
    }

    #[test]
    fn dropping_the_stream_aborts_and_frees_the_sequence() {
        let runner = fake(10_000, Duration::from_millis(2));
        let live = runner.shared();
        let handle = spawn(runner, ServiceConfig { max_context: None, ..Default::default() });
        let mut stream = handle.submit(request("long", 50)).unwrap();
        // Wait for the first tokens, then hang up.
        assert!(matches!(stream.blocking_next(), Some(Ok(Event::Token { .. }))));
        drop(stream);
        wait_until("the abort", || handle.stats().num_aborted == 1 && live.lock().unwrap().live.is_empty());
        assert_eq!(handle.stats().num_running, 0);
        // The loop goes on serving.
        assert_eq!(collect(&mut handle.submit(request("next", 3)).unwrap()).0, "abc");
    }

    #[test]
    fn the_gauges_show_an_aborted_requests_blocks_freed_while_idle() {
        let handle = spawn(fake(10_000, Duration::from_millis(2)), ServiceConfig::default());
        let mut stream = handle.submit(request("long", 500)).unwrap();
        assert!(matches!(stream.blocking_next(), Some(Ok(Event::Token { .. }))));
        wait_until("a used block", || handle.stats().kv.used_blocks == 1);
        drop(stream);
        let t0 = Instant::now();
        wait_until("the abort", || handle.stats().num_aborted == 1);
        wait_until("no used blocks", || handle.stats().kv.used_blocks == 0);
        assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
        // And it stays so while the thread sleeps.
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(handle.stats().kv.used_blocks, 0);
    }

    #[test]
    fn cancel_all_ends_running_and_waiting_requests_and_refuses_new_ones() {
        let config = ServiceConfig { max_running: 1, ..Default::default() };
        let runner = fake(10_000, Duration::from_millis(2));
        let live = runner.shared();
        let handle = spawn(runner, config);
        let mut running = handle.submit(request("a", 5000)).unwrap();
        assert!(matches!(running.blocking_next(), Some(Ok(Event::Token { .. }))));
        let mut waiting = handle.submit(request("b", 5)).unwrap();
        handle.cancel_all();
        assert_eq!(collect(&mut running).1, Err(ServiceError::Cancelled));
        assert_eq!(collect(&mut waiting), (String::new(), Err(ServiceError::Cancelled)));
        assert!(running.blocking_next().is_none());
        assert_eq!(handle.submit(request("c", 5)).unwrap_err(), ServiceError::Cancelled);
        // The gauges are published after the sequences are freed: wait for both.
        wait_until("the sequences freed", || {
            live.lock().unwrap().live.is_empty()
                && handle.stats().num_running == 0
                && handle.stats().kv.used_blocks == 0
        });
        let stats = handle.stats();
        assert_eq!((stats.num_aborted, stats.num_waiting, stats.kv.used_blocks), (2, 0, 0));
    }

    #[test]
    fn flush_finishes_the_background_work_within_its_deadline() {
        let runner = fake(3, Duration::ZERO);
        let idle_left = runner.idle_left.clone();
        let handle = spawn(runner, ServiceConfig::default());
        // Busy first, so the idle loop has not done the work yet when the flush is asked for.
        let mut stream = handle.submit(request("a", 3)).unwrap();
        idle_left.store(20, Ordering::Release);
        assert!(handle.flush(Duration::from_secs(5)));
        assert_eq!(idle_left.load(Ordering::Acquire), 0);
        assert_eq!(collect(&mut stream).0, "abc");
        // More work than the deadline allows (1 ms a unit): false, on time.
        idle_left.store(100_000, Ordering::Release);
        let t0 = Instant::now();
        assert!(!handle.flush(Duration::from_millis(50)));
        assert!(t0.elapsed() < Duration::from_millis(500), "{:?}", t0.elapsed());
    }

    /// A service running one request at a time, its first request (`max_tokens` long) already streaming.
    fn one_running(max_waiting: usize, max_tokens: usize) -> (EngineHandle, RequestStream) {
        let config = ServiceConfig { max_running: 1, max_waiting, max_context: None };
        let handle = spawn(fake(1000, Duration::from_millis(5)), config);
        let mut first = handle.submit(request("a", max_tokens)).unwrap();
        assert!(matches!(first.blocking_next(), Some(Ok(_))));
        (handle, first)
    }

    #[test]
    fn full_queue_is_refused_and_drains() {
        // Once the first runs, two can wait and a third is refused.
        let (handle, mut first) = one_running(2, 40);
        let mut second = handle.submit(request("b", 2)).unwrap();
        let mut third = handle.submit(request("c", 2)).unwrap();
        assert_eq!(handle.stats().num_waiting, 2);
        match handle.submit(request("d", 2)) {
            Err(ServiceError::QueueFull { num_waiting: 2, retry_after_s }) => assert!(retry_after_s >= 1),
            other => panic!("expected QueueFull, got {other:?}"),
        }
        assert_eq!(collect(&mut first).1, Ok(FinishReason::Length));
        assert_eq!(collect(&mut second).0, "ab");
        assert_eq!(collect(&mut third).0, "ab");
        wait_until("an empty queue", || handle.stats().num_waiting == 0);
        assert!(handle.submit(request("e", 1)).is_ok());
    }

    #[test]
    fn a_dropped_waiting_request_never_runs() {
        let (handle, mut first) = one_running(4, 20);
        drop(handle.submit(request("b", 20)).unwrap());
        assert_eq!(collect(&mut first).1, Ok(FinishReason::Length));
        wait_until("the waiting request to be forgotten", || handle.stats().num_waiting == 0);
        let stats = handle.stats();
        assert_eq!((stats.num_aborted, stats.num_finished), (1, 1));
    }

    #[test]
    fn idle_loop_sleeps_and_wakes_on_submit() {
        let handle = spawn(fake(3, Duration::ZERO), ServiceConfig::default());
        assert_eq!(collect(&mut handle.submit(request("a", 5)).unwrap()).0, "abc");
        let steps = handle.stats().num_steps;
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(handle.stats().num_steps, steps, "the loop stepped while idle");
        assert_eq!(collect(&mut handle.submit(request("b", 5)).unwrap()).0, "abc");
    }

    #[test]
    fn a_failed_step_ends_its_requests_with_an_error_and_the_service_goes_on() {
        let mut runner = fake(100, Duration::ZERO);
        runner.fail_at_pass = Some(3);
        let live = runner.shared();
        let handle = spawn(runner, ServiceConfig::default());
        let (_, end) = collect(&mut handle.submit(request("a", 50)).unwrap());
        assert!(matches!(end, Err(ServiceError::Engine(_))), "{end:?}");
        assert!(live.lock().unwrap().live.is_empty());
        assert_eq!(collect(&mut handle.submit(request("b", 2)).unwrap()).0, "ab");
    }

    #[test]
    fn a_panicking_model_stops_the_service_cleanly() {
        let mut runner = fake(100, Duration::ZERO);
        runner.panic_at_pass = Some(2);
        let handle = spawn(runner, ServiceConfig::default());
        let (_, end) = collect(&mut handle.submit(request("a", 50)).unwrap());
        assert!(matches!(end, Err(ServiceError::Engine(m)) if m.contains("fake runner panics")));
        wait_until("the thread to exit", || !handle.stats().alive);
        assert_eq!(handle.submit(request("b", 2)).unwrap_err(), ServiceError::ShutDown);
    }

    #[test]
    fn stream_works_from_async_code() {
        let handle = spawn(fake(4, Duration::ZERO), ServiceConfig::default());
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let text = runtime.block_on(async {
            let mut stream = handle.submit(request("q", 10)).unwrap();
            let mut text = String::new();
            while let Some(item) = stream.next().await {
                match item.unwrap() {
                    Event::Token { text: t, .. } | Event::Finished { text: t, .. } => text.push_str(&t),
                }
            }
            text
        });
        assert_eq!(text, "abcd");
    }
}
