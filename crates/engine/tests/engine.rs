//! The engine's scheduling, stopping, validation and bookkeeping, over a scripted fake model.
//!
//! The fake runner ([`engine::testing::FakeRunner`]) answers every row with logits that are a pure function of the
//! sequence's tokens so far (the script), checks the batch contract (positions, context, vocabulary), records every
//! batch it receives and which sequences it still holds. The tokenizer is real: a tiny byte-level BPE vocabulary
//! written into an in-memory GGUF, so detokenization, end-of-generation tokens and stop strings go through the
//! production code.

use std::collections::BTreeMap;
use std::sync::Arc;

use engine::testing::{self, FakeRunner, RecordedChunk, TokenizerSpec};
use engine::{Engine, EngineConfig, Error, Event, FinishReason, GenerateRequest, RequestId, SamplingParams, Usage};
use models::{LogitsWanted, Runner, SeqId};
use tokenizer::Tokenizer;

// ---------------------------------------------------------------------------------------------------------------
// A tiny real tokenizer.

const IM_START: u32 = 256;
const IM_END: u32 = 257;
/// Multi-character tokens after the specials, as GPT-2 byte characters.
const WORDS: [&str; 8] = ["he", "ll", "hell", "hello", "Ġworld", "ĠEN", "DĠand", "Ġmore"];
const HELLO: u32 = 261;
const SP_WORLD: u32 = 262;
const SP_EN: u32 = 263;
const D_SP_AND: u32 = 264;
const SP_MORE: u32 = 265;
const VOCAB: usize = 266;

fn build_tokenizer() -> Arc<Tokenizer> {
    let mut tokens = testing::byte_tokens();
    tokens.extend([("<|im_start|>".to_owned(), 3), ("<|im_end|>".to_owned(), 3)]);
    tokens.extend(WORDS.iter().map(|w| (w.to_string(), 1)));
    assert_eq!(tokens.len(), VOCAB);
    let merges = ["h e", "l l", "he ll", "hell o"];
    let spec = TokenizerSpec { tokens, merges: &merges, pre: Some("smollm"), bos: Some(IM_START), eos: IM_END };
    let tok = testing::tokenizer(spec);
    assert_eq!(tok.vocab_size(), VOCAB);
    assert!(tok.is_eog(IM_END));
    assert_eq!(tok.decode(&[HELLO, SP_WORLD, SP_EN, D_SP_AND, SP_MORE]), "hello world END and more");
    tok
}

/// The ids of an ASCII string, one byte token per character.
fn bytes(s: &str) -> Vec<u32> {
    s.bytes().map(u32::from).collect()
}

// ---------------------------------------------------------------------------------------------------------------
// The scripted fake runner.

/// The scripted fake runner over this file's vocabulary.
fn fake(max_context: usize, script: impl Fn(&[u32]) -> Vec<f32> + Send + 'static) -> FakeRunner {
    FakeRunner::new(testing::tiny_config(VOCAB, max_context), script)
}

/// Logits that make `token` the clear favourite.
fn one_hot(token: u32) -> Vec<f32> {
    testing::one_hot(VOCAB, token)
}

/// The default script: the next token is a lowercase letter determined by the sequence's first token, the position
/// and the last token, so concurrent sequences with different prompts produce different, predictable streams.
fn letter_after(history: &[u32]) -> u32 {
    let first = history[0];
    let last = *history.last().expect("non-empty");
    b'a' as u32 + (first * 7 + history.len() as u32 * 3 + last) % 26
}

fn letters_script(history: &[u32]) -> Vec<f32> {
    one_hot(letter_after(history))
}

/// What `letters_script` generates greedily after `prompt`, `n` tokens.
fn expected_letters(prompt: &[u32], n: usize) -> Vec<u32> {
    let mut h = prompt.to_vec();
    for _ in 0..n {
        h.push(letter_after(&h));
    }
    h[prompt.len()..].to_vec()
}

/// A script that emits `continuation` after any prompt of `prompt_len` tokens, then `filler` forever.
fn continuation_script(prompt_len: usize, continuation: Vec<u32>, filler: u32) -> impl Fn(&[u32]) -> Vec<f32> + Send {
    move |h: &[u32]| one_hot(continuation.get(h.len() - prompt_len).copied().unwrap_or(filler))
}

/// Spread-out pseudo-random logits over the printable ASCII tokens: a function of the whole history.
fn noisy_script(history: &[u32]) -> Vec<f32> {
    let mut x = history.iter().fold(0x9E37_79B9_7F4A_7C15u64, |a, &t| (a ^ t as u64).wrapping_mul(0x100_0000_01B3));
    let mut l = vec![f32::NEG_INFINITY; VOCAB];
    for v in &mut l[b' ' as usize..=b'~' as usize] {
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        *v = ((z >> 40) as f32 / (1u64 << 24) as f32) * 3.0;
    }
    l
}

fn engine_with(runner: FakeRunner, max_batch_tokens: usize) -> Engine<FakeRunner> {
    Engine::new(
        runner,
        build_tokenizer(),
        EngineConfig { max_batch_tokens, max_prefill_tokens_while_decoding: max_batch_tokens, ..Default::default() },
    )
}

fn greedy(prompt: Vec<u32>, max_tokens: usize) -> GenerateRequest {
    GenerateRequest::new(prompt, SamplingParams::greedy(), max_tokens)
}

/// Everything one request produced.
#[derive(Debug, Default, Clone)]
struct Outcome {
    tokens: Vec<u32>,
    /// Concatenation of every released piece of text, including the `Finished` tail.
    text: String,
    finish: Option<(FinishReason, Usage)>,
    /// Step index (0-based) at which each token event came.
    token_steps: Vec<usize>,
}

/// Adds one step's events to the per-request outcomes; checks that nothing follows a `Finished`.
fn record(out: &mut BTreeMap<RequestId, Outcome>, step: usize, events: Vec<(RequestId, Event)>) {
    for (id, ev) in events {
        let o = out.entry(id).or_default();
        assert!(o.finish.is_none(), "request {id}: event after Finished: {ev:?}");
        match ev {
            Event::Token { id, text, .. } => {
                o.tokens.push(id);
                o.text.push_str(&text);
                o.token_steps.push(step);
            }
            Event::Finished { reason, text, usage, .. } => {
                o.text.push_str(&text);
                o.finish = Some((reason, usage));
            }
        }
    }
}

/// Steps until the engine is idle, routing events per request.
fn run_to_end<R: Runner>(engine: &mut Engine<R>) -> BTreeMap<RequestId, Outcome> {
    let mut out = BTreeMap::new();
    let mut step = 0;
    while engine.has_work() {
        assert!(step < 10_000, "the engine does not finish");
        record(&mut out, step, engine.step().expect("step"));
        step += 1;
    }
    out
}

/// After every request has finished: the runner holds nothing and each sequence was released exactly once.
fn assert_all_released(engine: &Engine<FakeRunner>, ids: &[RequestId]) {
    let r = engine.runner().state();
    assert!(r.live.is_empty(), "sequences still held by the runner: {:?}", r.live.keys().collect::<Vec<_>>());
    let mut released = r.released.clone();
    released.sort();
    let mut want: Vec<SeqId> = ids.iter().map(|id| SeqId(id.0)).collect();
    want.sort();
    assert_eq!(released, want, "each finished request is released exactly once");
    assert_eq!(engine.num_requests(), 0);
}

// ---------------------------------------------------------------------------------------------------------------
// Scheduling.

#[test]
fn prefill_is_chunked_under_max_batch_tokens() {
    let prompt = bytes("abcdefghijklmnopqrst"); // 20 tokens
    let mut e = engine_with(fake(1024, letters_script), 8);
    let id = e.add_request(greedy(prompt.clone(), 3)).expect("valid");
    let out = run_to_end(&mut e);
    let o = &out[&id];
    assert_eq!(o.tokens, expected_letters(&prompt, 3));
    // No token before the whole prompt has been seen.
    assert_eq!(o.token_steps, vec![2, 3, 4]);

    let b = &e.runner().state().batches.clone();
    let chunks: Vec<(usize, usize, LogitsWanted)> =
        b.iter().map(|b| (b[0].start_pos, b[0].tokens.len(), b[0].logits)).collect();
    assert_eq!(
        chunks,
        vec![
            (0, 8, LogitsWanted::None),
            (8, 8, LogitsWanted::None),
            (16, 4, LogitsWanted::Last),
            (20, 1, LogitsWanted::Last),
            (21, 1, LogitsWanted::Last),
        ]
    );
    // The chunks are the prompt, then the generated tokens fed back (the last one is never fed).
    let fed: Vec<u32> = b.iter().flat_map(|b| b[0].tokens.clone()).collect();
    let mut want = prompt.clone();
    want.extend_from_slice(&o.tokens[..2]);
    assert_eq!(fed, want);
    assert_all_released(&e, &[id]);
}

#[test]
fn decoding_sequences_go_before_prompt_chunks() {
    let max_batch = 6;
    let prompts = [bytes("xy"), bytes("a long prompt of many tokens"), bytes("zz")];
    let max_tokens = [10, 4, 4];
    let mut e = engine_with(fake(1024, letters_script), max_batch);
    let mut out = BTreeMap::new();
    let a = e.add_request(greedy(prompts[0].clone(), max_tokens[0])).expect("valid");
    // A's prompt fits in one step; A is decoding from then on.
    record(&mut out, 0, e.step().expect("step"));
    let b = e.add_request(greedy(prompts[1].clone(), max_tokens[1])).expect("valid");
    let c = e.add_request(greedy(prompts[2].clone(), max_tokens[2])).expect("valid");
    let mut step = 1;
    while e.has_work() {
        record(&mut out, step, e.step().expect("step"));
        step += 1;
    }
    let ids = [a, b, c];

    let batches = &e.runner().state().batches.clone();
    let prompt_len = |seq: SeqId| prompts[ids.iter().position(|id| id.0 == seq.0).expect("known sequence")].len();
    for (i, batch) in batches.iter().enumerate() {
        let n: usize = batch.iter().map(|c| c.tokens.len()).sum();
        assert!(n <= max_batch, "batch {i} has {n} tokens > {max_batch}");
        // Every decode chunk (one token past the prompt) comes before every prompt chunk.
        let is_decode = |c: &RecordedChunk| c.start_pos >= prompt_len(c.seq);
        let first_prefill = batch.iter().position(|c| !is_decode(c)).unwrap_or(batch.len());
        assert!(
            batch[first_prefill..].iter().all(|c| !is_decode(c)),
            "batch {i}: decode after a prompt chunk: {batch:?}"
        );
    }
    // The step after B and C arrived: A's decode token first, then the shorter prompt (C, whole), then B's with the
    // rest of the budget.
    let second = &batches[1];
    assert_eq!(second.len(), 3, "{second:?}");
    assert_eq!((second[0].seq, second[0].tokens.len()), (SeqId(a.0), 1));
    assert_eq!((second[1].seq, second[1].tokens.len(), second[1].logits), (SeqId(c.0), 2, LogitsWanted::Last));
    assert_eq!(second[2].seq, SeqId(b.0));
    assert_eq!((second[2].start_pos, second[2].tokens.len(), second[2].logits), (0, 3, LogitsWanted::None));
    // A kept producing a token every step while B's long prompt was being read.
    assert_eq!(out[&a].token_steps, (0..10).collect::<Vec<_>>());
    for ((id, p), n) in ids.iter().zip(&prompts).zip(max_tokens) {
        assert_eq!(out[id].tokens, expected_letters(p, n), "request {id}");
    }
    assert_all_released(&e, &ids);
}

#[test]
fn short_request_streams_during_a_long_prefill() {
    // A 400-token prompt read 16 tokens per step; a short request arrives after the first chunk.
    let long: Vec<u32> = (0..400).map(|i| bytes("abcdefghijklmnopqrstuvwxyz")[i % 26]).collect();
    let mut e = Engine::new(
        fake(1024, letters_script),
        build_tokenizer(),
        EngineConfig { max_batch_tokens: 64, max_prefill_tokens_while_decoding: 16, ..Default::default() },
    );
    let mut out = BTreeMap::new();
    let long_id = e.add_request(greedy(long.clone(), 2)).expect("valid");
    record(&mut out, 0, e.step().expect("step"));
    let short_id = e.add_request(greedy(bytes("hi"), 5)).expect("valid");
    let mut step = 1;
    while e.has_work() {
        record(&mut out, step, e.step().expect("step"));
        step += 1;
    }
    // The short prompt goes first in the next step and then streams one token per step, while the long prompt
    // advances by at most 16 tokens per step alongside it.
    assert_eq!(out[&short_id].token_steps, vec![1, 2, 3, 4, 5]);
    for batch in &e.runner().state().batches[2..6] {
        let prefill: usize = batch.iter().filter(|c| c.seq == SeqId(long_id.0)).map(|c| c.tokens.len()).sum();
        assert!(prefill <= 16, "{batch:?}");
    }
    assert_eq!(out[&long_id].tokens, expected_letters(&long, 2));
    assert_eq!(out[&short_id].tokens, expected_letters(&bytes("hi"), 5));
    assert_all_released(&e, &[long_id, short_id]);
}

#[test]
fn concurrent_requests_each_get_their_own_stream() {
    let prompts = [bytes("first prompt"), bytes("B"), bytes("a third, longer prompt than the others"), bytes("qq")];
    let max_tokens = [12, 30, 7, 20];
    let mut e = engine_with(fake(1024, letters_script), 16);
    let ids: Vec<RequestId> =
        prompts.iter().zip(max_tokens).map(|(p, n)| e.add_request(greedy(p.clone(), n)).expect("valid")).collect();
    let out = run_to_end(&mut e);
    for ((id, p), n) in ids.iter().zip(&prompts).zip(max_tokens) {
        let o = &out[id];
        let want = expected_letters(p, n);
        assert_eq!(o.tokens, want, "request {id}");
        assert_eq!(o.text, String::from_utf8(want.iter().map(|&t| t as u8).collect()).expect("ascii"));
        let (reason, usage) = o.finish.expect("finished");
        assert_eq!(reason, FinishReason::Length);
        assert_eq!((usage.prompt_tokens, usage.completion_tokens), (p.len(), n));
    }
    // Several sequences really shared batches.
    assert!(e.runner().state().batches.iter().any(|b| b.len() >= 3));

    // Each stream equals the one the request gets when alone.
    for (p, n) in prompts.iter().zip(max_tokens) {
        let mut alone = engine_with(fake(1024, letters_script), 16);
        let (tokens, reason, _) = alone.generate(greedy(p.clone(), n), |_| {}).expect("generate");
        assert_eq!(tokens, expected_letters(p, n));
        assert_eq!(reason, FinishReason::Length);
    }
    assert_all_released(&e, &ids);
}

// ---------------------------------------------------------------------------------------------------------------
// How requests end.

#[test]
fn stop_string_across_token_boundaries() {
    // "hello world END and more": "END" is split over " EN" and "D and".
    let prompt = bytes("say it");
    let cont = vec![HELLO, SP_WORLD, SP_EN, D_SP_AND, SP_MORE, b'!' as u32];
    let mut e = engine_with(fake(1024, continuation_script(prompt.len(), cont, b'.' as u32)), 64);
    let mut req = greedy(prompt, 50);
    req.stop_strings = vec!["END".into()];
    let id = e.add_request(req).expect("valid");
    let out = run_to_end(&mut e);
    let o = &out[&id];
    assert_eq!(o.text, "hello world ");
    assert_eq!(
        o.tokens,
        vec![HELLO, SP_WORLD, SP_EN, D_SP_AND],
        "generation stops at the token completing the stop string"
    );
    assert_eq!(o.finish.expect("finished").0, FinishReason::Stop);
    assert_all_released(&e, &[id]);
}

#[test]
fn stop_string_held_back_then_released_on_false_start() {
    // " EN" might begin "ENOUGH"; when "D and" follows, the held " EN" must come out, in order, with nothing lost.
    let prompt = bytes("p");
    let cont = vec![HELLO, SP_EN, D_SP_AND, SP_MORE];
    let mut e = engine_with(fake(1024, continuation_script(prompt.len(), cont, b'.' as u32)), 64);
    let mut req = greedy(prompt, 4);
    req.stop_strings = vec!["ENOUGH".into(), "zzz".into()];
    let id = e.add_request(req).expect("valid");
    let mut pieces = Vec::new();
    while e.has_work() {
        for (_, ev) in e.step().expect("step") {
            match ev {
                Event::Token { text, .. } => pieces.push(text),
                Event::Finished { reason, text, .. } => {
                    assert_eq!(reason, FinishReason::Length);
                    pieces.push(text);
                }
            }
        }
    }
    assert_eq!(pieces, vec!["hello", " ", "END and", " more", ""]);
    assert_all_released(&e, &[id]);
}

#[test]
fn stop_string_over_a_multibyte_character_split_across_tokens() {
    // "café!" where é = C3 A9 comes as two byte tokens; the stop string is "é!".
    let prompt = bytes("q");
    let cont = vec![b'c' as u32, b'a' as u32, b'f' as u32, 0xC3, 0xA9, b'!' as u32, b'x' as u32];
    let mut e = engine_with(fake(1024, continuation_script(prompt.len(), cont, b'.' as u32)), 64);
    let mut req = greedy(prompt, 50);
    req.stop_strings = vec!["é!".into()];
    let id = e.add_request(req).expect("valid");
    let out = run_to_end(&mut e);
    assert_eq!(out[&id].text, "caf");
    assert_eq!(out[&id].tokens.len(), 6);
    assert_eq!(out[&id].finish.expect("finished").0, FinishReason::Stop);
    assert_all_released(&e, &[id]);
}

#[test]
fn stop_token_ends_with_stop_and_is_not_rendered() {
    let prompt = bytes("go");
    let cont = vec![HELLO, SP_WORLD, SP_MORE, HELLO];
    let mut e = engine_with(fake(1024, continuation_script(prompt.len(), cont, b'.' as u32)), 64);
    let mut req = greedy(prompt, 50);
    req.stop_tokens = vec![SP_MORE];
    let id = e.add_request(req).expect("valid");
    let out = run_to_end(&mut e);
    let o = &out[&id];
    assert_eq!(o.tokens, vec![HELLO, SP_WORLD, SP_MORE]);
    assert_eq!(o.text, "hello world");
    let (reason, usage) = o.finish.expect("finished");
    assert_eq!(reason, FinishReason::Stop);
    assert_eq!(usage.completion_tokens, 3);
    assert_all_released(&e, &[id]);
}

#[test]
fn end_of_generation_ends_with_stop() {
    let prompt = bytes("hi");
    let cont = vec![HELLO, IM_END, SP_WORLD];
    let mut e = engine_with(fake(1024, continuation_script(prompt.len(), cont.clone(), b'.' as u32)), 64);
    let id = e.add_request(greedy(prompt.clone(), 50)).expect("valid");
    let out = run_to_end(&mut e);
    assert_eq!(out[&id].tokens, vec![HELLO, IM_END]);
    assert_eq!(out[&id].text, "hello", "the end-of-generation token is not part of the text");
    assert_eq!(out[&id].finish.expect("finished").0, FinishReason::Stop);
    assert_all_released(&e, &[id]);

    // ignore_eos: generation goes on past it until max_tokens.
    let mut e = engine_with(fake(1024, continuation_script(prompt.len(), cont, b'.' as u32)), 64);
    let mut req = greedy(prompt, 4);
    req.ignore_eos = true;
    let id = e.add_request(req).expect("valid");
    let out = run_to_end(&mut e);
    assert_eq!(out[&id].tokens, vec![HELLO, IM_END, SP_WORLD, b'.' as u32]);
    assert_eq!(out[&id].finish.expect("finished").0, FinishReason::Length);
    assert_all_released(&e, &[id]);
}

#[test]
fn control_tokens_add_no_text() {
    // A sampled `<|im_start|>` (a control token, not end-of-generation) is generated and counted but not shown.
    let prompt = bytes("hi");
    let cont = vec![HELLO, IM_START, SP_WORLD, IM_END];
    let mut e = engine_with(fake(1024, continuation_script(prompt.len(), cont, b'.' as u32)), 64);
    let id = e.add_request(greedy(prompt, 50)).expect("valid");
    let out = run_to_end(&mut e);
    assert_eq!(out[&id].tokens, vec![HELLO, IM_START, SP_WORLD, IM_END]);
    assert_eq!(out[&id].text, "hello world");
    assert_eq!(out[&id].finish.expect("finished").1.completion_tokens, 4);
    assert_all_released(&e, &[id]);
}

#[test]
fn max_tokens_ends_with_length() {
    for max_tokens in [1, 2, 17] {
        let prompt = bytes("count");
        let mut e = engine_with(fake(1024, letters_script), 64);
        let id = e.add_request(greedy(prompt.clone(), max_tokens)).expect("valid");
        let out = run_to_end(&mut e);
        assert_eq!(out[&id].tokens, expected_letters(&prompt, max_tokens));
        let (reason, usage) = out[&id].finish.expect("finished");
        assert_eq!(reason, FinishReason::Length);
        assert_eq!(usage.completion_tokens, max_tokens);
        // The last token is never fed back: prompt + max_tokens - 1 positions were computed.
        let fed: usize = e.runner().state().batches.iter().flatten().map(|c| c.tokens.len()).sum();
        assert_eq!(fed, prompt.len() + max_tokens - 1);
        assert_all_released(&e, &[id]);
    }
}

#[test]
fn full_context_ends_with_length() {
    let max_context = 16;
    let prompt = bytes("ten tokens"); // 10
    let mut e = engine_with(fake(max_context, letters_script), 4);
    let id = e.add_request(greedy(prompt.clone(), 1000)).expect("valid");
    let out = run_to_end(&mut e);
    let (reason, usage) = out[&id].finish.expect("finished");
    assert_eq!(reason, FinishReason::Length);
    // Prompt and output fill the context exactly; the runner never saw a position past it.
    assert_eq!(prompt.len() + out[&id].tokens.len(), max_context);
    assert_eq!(usage.completion_tokens, max_context - prompt.len());
    let max_pos =
        e.runner().state().batches.iter().flatten().map(|c| c.start_pos + c.tokens.len()).max().expect("batches");
    assert!(max_pos < max_context);
    assert_all_released(&e, &[id]);

    // A prompt one short of the context still gets exactly one token.
    let mut e = engine_with(fake(max_context, letters_script), 64);
    let id = e.add_request(greedy(bytes("fifteen tokens!"), 1000)).expect("valid");
    let out = run_to_end(&mut e);
    assert_eq!(out[&id].tokens.len(), 1);
    assert_eq!(out[&id].finish.expect("finished").0, FinishReason::Length);
    assert_all_released(&e, &[id]);
}

#[test]
fn abort_frees_the_sequence() {
    let mut e = engine_with(fake(1024, letters_script), 64);
    let a = e.add_request(greedy(bytes("keep going"), 1000)).expect("valid");
    let b = e.add_request(greedy(bytes("other"), 6)).expect("valid");
    for _ in 0..3 {
        e.step().expect("step");
    }
    assert!(e.runner().state().live.contains_key(&SeqId(a.0)));
    let ev = e.abort(a).expect("a is running");
    match ev {
        Event::Finished { reason, usage, .. } => {
            assert_eq!(reason, FinishReason::Aborted);
            assert_eq!(usage.prompt_tokens, 10);
            assert_eq!(usage.completion_tokens, 3);
        }
        other => panic!("abort gave {other:?}"),
    }
    assert_eq!(e.runner().state().released, vec![SeqId(a.0)], "abort releases the sequence at once");
    assert!(!e.runner().state().live.contains_key(&SeqId(a.0)));
    assert!(e.abort(a).is_none(), "a second abort finds nothing");
    assert!(e.abort(RequestId(999)).is_none());
    let n_batches = e.runner().state().batches.len();
    let out = run_to_end(&mut e);
    assert!(!out.contains_key(&a), "no events for an aborted request");
    assert!(e.runner().state().batches[n_batches..].iter().flatten().all(|c| c.seq != SeqId(a.0)));
    assert_eq!(out[&b].tokens.len(), 3);
    assert_all_released(&e, &[a, b]);

    // Aborting a request that is still reading its prompt.
    let mut e = engine_with(fake(1024, letters_script), 4);
    let c = e.add_request(greedy(bytes("a prompt longer than one chunk"), 5)).expect("valid");
    e.step().expect("step");
    assert_eq!(e.runner().seq_len(SeqId(c.0)), 4);
    assert!(matches!(e.abort(c), Some(Event::Finished { reason: FinishReason::Aborted, .. })));
    assert!(!e.has_work());
    assert!(e.step().expect("idle step").is_empty());
    assert_all_released(&e, &[c]);
}

// ---------------------------------------------------------------------------------------------------------------
// Validation.

#[test]
fn invalid_requests_are_rejected_with_clear_errors() {
    let mut e = engine_with(fake(32, letters_script), 64);
    let bad = |e: &mut Engine<FakeRunner>, req: GenerateRequest, needle: &str| match e.add_request(req) {
        Err(Error::InvalidRequest(msg)) => assert!(msg.contains(needle), "message {msg:?} does not mention {needle:?}"),
        other => panic!("expected an invalid-request error mentioning {needle:?}, got {other:?}"),
    };
    bad(&mut e, greedy(vec![], 5), "empty");
    bad(&mut e, greedy(vec![1, 2, VOCAB as u32], 5), &format!("{VOCAB}"));
    bad(&mut e, greedy(vec![1, u32::MAX], 5), "vocabulary");
    bad(&mut e, greedy(vec![b'a' as u32; 32], 5), "context");
    bad(&mut e, greedy(vec![b'a' as u32; 40], 5), "context");
    bad(&mut e, greedy(bytes("ok"), 0), "max_tokens");
    let sampling = |f: fn(&mut SamplingParams)| {
        let mut p = SamplingParams::default();
        f(&mut p);
        GenerateRequest::new(bytes("ok"), p, 5)
    };
    bad(&mut e, sampling(|p| p.temperature = -0.5), "temperature");
    bad(&mut e, sampling(|p| p.temperature = f32::NAN), "temperature");
    bad(&mut e, sampling(|p| p.top_p = 0.0), "top_p");
    bad(&mut e, sampling(|p| p.top_p = 1.5), "top_p");
    bad(&mut e, sampling(|p| p.min_p = -0.1), "min_p");
    bad(&mut e, sampling(|p| p.min_p = 2.0), "min_p");
    bad(&mut e, sampling(|p| p.repetition_penalty = 0.0), "repetition_penalty");
    bad(&mut e, sampling(|p| p.frequency_penalty = f32::INFINITY), "frequency_penalty");
    bad(&mut e, sampling(|p| p.presence_penalty = f32::NAN), "presence_penalty");
    // Nothing was admitted and the runner never ran.
    assert_eq!(e.num_requests(), 0);
    assert!(!e.has_work());
    assert!(e.runner().state().batches.is_empty());

    // The largest valid prompt is admitted; requests keep getting fresh ids after rejections.
    let id = e.add_request(greedy(vec![b'a' as u32; 31], 5)).expect("31 < 32 tokens");
    let id2 = e.add_request(greedy(bytes("x"), 5)).expect("valid");
    assert_ne!(id, id2);
    let out = run_to_end(&mut e);
    assert_eq!(out[&id].tokens.len(), 1);
    assert_all_released(&e, &[id, id2]);
}

// ---------------------------------------------------------------------------------------------------------------
// Bookkeeping and determinism.

#[test]
fn usage_counts_tokens() {
    let prompt = bytes("usage please");
    let mut e = engine_with(fake(1024, letters_script), 5);
    let id = e.add_request(greedy(prompt.clone(), 9)).expect("valid");
    let out = run_to_end(&mut e);
    let (_, usage) = out[&id].finish.expect("finished");
    assert_eq!(usage.prompt_tokens, prompt.len());
    assert_eq!(usage.completion_tokens, out[&id].tokens.len());
    assert_eq!(usage.completion_tokens, 9);
    assert!(usage.prefill_ms >= 0.0 && usage.decode_ms >= 0.0);
    assert!(usage.prefill_tok_s().is_finite() && usage.decode_tok_s().is_finite());

    // generate() returns the same counts and streams the same text.
    let mut e = engine_with(fake(1024, letters_script), 5);
    let mut text = String::new();
    let (tokens, reason, usage2) = e.generate(greedy(prompt.clone(), 9), |t| text.push_str(t)).expect("generate");
    assert_eq!(tokens, out[&id].tokens);
    assert_eq!(text, out[&id].text);
    assert_eq!(reason, FinishReason::Length);
    assert_eq!((usage2.prompt_tokens, usage2.completion_tokens), (prompt.len(), 9));
    assert_all_released(&e, &[RequestId(0)]);
}

#[test]
fn same_seed_same_output_under_sampling() {
    let prompt = bytes("sample");
    let params = |seed| SamplingParams {
        temperature: 1.0,
        top_k: 40,
        top_p: 0.95,
        min_p: 0.01,
        seed: Some(seed),
        ..Default::default()
    };
    let run = |seed: u64, with_neighbours: bool| -> Vec<u32> {
        let mut e = engine_with(fake(1024, noisy_script), 8);
        if with_neighbours {
            e.add_request(GenerateRequest::new(bytes("neighbour one"), params(seed), 25)).expect("valid");
        }
        let id = e.add_request(GenerateRequest::new(prompt.clone(), params(seed), 40)).expect("valid");
        if with_neighbours {
            e.add_request(GenerateRequest::new(bytes("x"), params(seed + 1), 33)).expect("valid");
        }
        let out = run_to_end(&mut e);
        assert!(e.runner().state().live.is_empty());
        out[&id].tokens.clone()
    };
    let a = run(7, false);
    assert_eq!(a.len(), 40);
    assert_eq!(a, run(7, false), "same seed, same tokens");
    assert_eq!(a, run(7, true), "other requests in the batch do not change a seeded stream");
    assert_ne!(a, run(8, false), "another seed gives another stream");
    // The noisy script really has a spread distribution: sampling does not just repeat the argmax.
    let mut e = engine_with(fake(1024, noisy_script), 8);
    let (g, _, _) = e.generate(greedy(prompt.clone(), 40), |_| {}).expect("generate");
    assert_ne!(a, g);
}

#[test]
fn runner_errors_leave_requests_intact() {
    // Drop a sequence's cache behind the engine's back: the next batch has a bad position and forward fails.
    let mut e = engine_with(fake(1024, letters_script), 64);
    let id = e.add_request(greedy(bytes("abc"), 5)).expect("valid");
    e.step().expect("step");
    e.runner().state().live.remove(&SeqId(id.0));
    match e.step() {
        Err(Error::Model(models::Error::BadPosition { .. })) => {}
        other => panic!("expected the runner's error, got {other:?}"),
    }
    assert_eq!(e.num_requests(), 1, "the request is still there after a failed step");
    assert!(e.abort(id).is_some());
}

#[test]
fn a_zero_token_budget_still_makes_progress() {
    // max_batch_tokens 0 would schedule nothing, and generate() would spin forever.
    let mut e = engine_with(fake(1024, letters_script), 0);
    let prompt = bytes("abc");
    let (tokens, reason, _) = e.generate(greedy(prompt.clone(), 3), |_| {}).expect("generate");
    assert_eq!(tokens, expected_letters(&prompt, 3));
    assert_eq!(reason, FinishReason::Length);
    assert!(e.runner().state().batches.iter().all(|b| b.iter().map(|c| c.tokens.len()).sum::<usize>() == 1));
    assert_all_released(&e, &[RequestId(0)]);
}

// ---------------------------------------------------------------------------------------------------------------
// Scheduling by KV memory (a pool of blocks in the fake runner).

/// Runs `requests` together on `engine` and each alone on a fresh engine from `fresh`: the outcomes, in order.
fn together_and_alone(
    mut engine: Engine<FakeRunner>,
    fresh: impl Fn() -> Engine<FakeRunner>,
    requests: impl Fn() -> Vec<GenerateRequest>,
) -> (Engine<FakeRunner>, Vec<Outcome>, Vec<Outcome>) {
    let ids: Vec<RequestId> = requests().into_iter().map(|r| engine.add_request(r).expect("valid")).collect();
    let mut together = run_to_end(&mut engine);
    let together: Vec<Outcome> = ids.iter().map(|id| together.remove(id).expect("every request ends")).collect();
    let alone = requests()
        .into_iter()
        .map(|r| {
            let mut e = fresh();
            let id = e.add_request(r).expect("valid");
            run_to_end(&mut e).remove(&id).expect("the request ends")
        })
        .collect();
    (engine, together, alone)
}

#[test]
fn admission_stops_at_memory_not_at_a_count() {
    // 10 blocks of 16 positions. A 40-token prompt needs 3 blocks (with its first output token): three fit beside one
    // another (9 blocks), the fourth waits. 10-token prompts need 1 each: ten are admitted at once.
    let mut e = engine_with(fake(1024, letters_script).with_pool(10, 16), 512);
    let long: Vec<RequestId> =
        (0..5).map(|i| e.add_request(greedy(vec![b'a' as u32 + i; 40], 4)).expect("valid")).collect();
    let mut out = BTreeMap::new();
    record(&mut out, 0, e.step().expect("step"));
    assert_eq!(e.runner().state().batches[0].len(), 3, "three prompts of three blocks fit in ten");
    assert_eq!(e.num_waiting(), 2);
    let mut step = 1;
    while e.has_work() {
        record(&mut out, step, e.step().expect("step"));
        step += 1;
    }
    for (i, id) in long.iter().enumerate() {
        assert_eq!(out[id].tokens, expected_letters(&vec![b'a' as u32 + i as u32; 40], 4));
        assert_eq!(out[id].finish.map(|f| f.0), Some(FinishReason::Length));
    }
    assert!(e.runner().state().live.is_empty());

    let mut e = engine_with(fake(1024, letters_script).with_pool(10, 16), 512);
    for i in 0..12 {
        e.add_request(greedy(vec![b'a' as u32 + i; 10], 2)).expect("valid");
    }
    e.step().expect("step");
    assert_eq!(e.runner().state().batches[0].len(), 10, "one block each: ten fit in ten");
    assert_eq!(e.num_waiting(), 2);
    run_to_end(&mut e);
    assert!(e.runner().state().live.is_empty());
}

#[test]
fn preemption_recomputes_and_the_output_is_unchanged() {
    // Three requests that each grow to 4 blocks of 8 positions, in a pool of 7: they cannot all hold their KV to the
    // end, so some are preempted and recomputed. Every token is what each gives alone, and nothing fails.
    let pool = || engine_with(fake(1024, letters_script).with_pool(7, 8), 64);
    let requests = || (0..3).map(|i| greedy(bytes(&format!("prompt {i}")), 24)).collect::<Vec<_>>();
    let (e, together, alone) = together_and_alone(pool(), || engine_with(fake(1024, letters_script), 64), requests);
    assert!(e.step_times().preemptions > 0, "the pool was meant to run out");
    for (t, a) in together.iter().zip(&alone) {
        assert_eq!(t.tokens, a.tokens);
        assert_eq!(t.text, a.text);
        assert_eq!(t.finish.map(|f| f.0), Some(FinishReason::Length));
    }
    assert!(e.runner().state().live.is_empty());
    assert_eq!(e.runner().kv_usage().used_blocks, 0);
}

#[test]
fn no_request_fails_when_pages_run_out_and_batched_equals_unbatched() {
    // Twelve requests of mixed prompt and output lengths, greedy and seeded sampling, with speculation on, in a pool
    // far smaller than they need together: each one's output is what it gives alone.
    let sampled = |seed| SamplingParams { temperature: 0.8, top_k: 20, seed: Some(seed), ..Default::default() };
    let requests = || {
        (0..12u64)
            .map(|i| {
                let prompt = bytes(&"the quick brown fox jumps over the lazy dog "[..5 + (i as usize * 7) % 38]);
                let params = if i % 3 == 0 { sampled(i) } else { SamplingParams::greedy() };
                GenerateRequest::new(prompt, params, 10 + (i as usize * 13) % 40)
            })
            .collect::<Vec<_>>()
    };
    let pooled = || engine_with(fake(1024, noisy_script).with_pool(12, 8), 32);
    let plain = || engine_with(fake(1024, noisy_script), 32);
    let (e, together, alone) = together_and_alone(pooled(), plain, requests);
    assert!(e.step_times().preemptions > 0, "the pool was meant to run out");
    for (i, (t, a)) in together.iter().zip(&alone).enumerate() {
        assert_eq!(t.tokens, a.tokens, "request {i}");
        assert_eq!(t.finish.map(|f| f.0), a.finish.map(|f| f.0), "request {i}");
    }
    assert!(e.runner().state().live.is_empty());
}

#[test]
fn a_request_that_cannot_fit_the_pool_alone_ends_with_length() {
    // Four blocks of 8 positions hold 32 tokens: a 20-token prompt asking for 40 more ends when the pool is full,
    // as at the end of the context; the request after it runs normally.
    let mut e = engine_with(fake(1024, letters_script).with_pool(4, 8), 64);
    let big = e.add_request(greedy(vec![b'q' as u32; 20], 40)).expect("valid");
    let small = e.add_request(greedy(bytes("hi"), 3)).expect("valid");
    let out = run_to_end(&mut e);
    let o = &out[&big];
    assert_eq!(o.finish.map(|f| f.0), Some(FinishReason::Length));
    assert!(!o.tokens.is_empty() && o.tokens.len() < 40, "{} tokens", o.tokens.len());
    assert_eq!(o.tokens, expected_letters(&vec![b'q' as u32; 20], o.tokens.len()));
    assert_eq!(out[&small].tokens, expected_letters(&bytes("hi"), 3));
    assert!(e.runner().state().live.is_empty());
}

#[test]
fn first_tokens_come_within_bounded_steps_and_long_prompts_are_not_starved() {
    // A stream decodes; a 300-token prompt arrives; then, every step, four short requests that would take all of the
    // 16 prompt tokens a step gets while anything decodes. The running stream gets a token every step, the long
    // prompt its first token within a bound (its aging overtakes the newcomers) rather than after the shorts stop,
    // and each short request its first token within a bound too (at worst it waits for the long prompt's turn).
    let mut e = Engine::new(
        fake(1024, letters_script),
        build_tokenizer(),
        EngineConfig { max_batch_tokens: 32, max_prefill_tokens_while_decoding: 16, ..Default::default() },
    );
    let mut out = BTreeMap::new();
    let stream = e.add_request(greedy(bytes("s"), 200)).expect("valid");
    record(&mut out, 0, e.step().expect("step"));
    let long_prompt: Vec<u32> = (0..300).map(|i| b'a' as u32 + (i % 26) as u32).collect();
    let long = e.add_request(greedy(long_prompt, 2)).expect("valid");
    let mut shorts = Vec::new();
    for step in 1..120 {
        // Four 4-token prompts a step: all the prompt budget, were the long prompt not aging.
        for j in 0..4 {
            shorts.push((step, e.add_request(greedy(bytes(&format!("{j}{step:03}")), 2)).expect("valid")));
        }
        record(&mut out, step, e.step().expect("step"));
    }
    let mut step = 120;
    while e.has_work() {
        record(&mut out, step, e.step().expect("step"));
        step += 1;
    }
    let worst = shorts.iter().map(|(at, id)| out[id].token_steps[0] - at).max().expect("shorts ran");
    assert!(worst <= 300_usize.div_ceil(16) + 2, "a short request waited {worst} steps for its first token");
    let steps = &out[&stream].token_steps;
    assert!(steps[0] == 0 && steps.windows(2).all(|w| w[1] - w[0] <= 1), "the running stream got a token every step");
    // 300 tokens at 16 a step take 19 steps; aging brings the long prompt ahead of the newcomers within as many
    // again.
    let long_first = out[&long].token_steps[0];
    assert!(
        long_first <= 1 + 2 * 300_usize.div_ceil(16) + 2,
        "the long prompt's first token came at step {long_first}"
    );
}

/// A constraint that only watches until it has seen `wake_after` tokens, then allows only `forced` for `num_forced`
/// tokens and ends the output: the shape of a lazy tool-call grammar. Records every committed token.
struct WakingConstraint {
    wake_after: usize,
    forced: u32,
    num_forced: usize,
    committed: Arc<std::sync::Mutex<Vec<u32>>>,
}

impl engine::TokenConstraint for WakingConstraint {
    fn allowed_tokens(&mut self, allowed: &mut [u32]) -> Result<(), String> {
        assert!(!self.is_dormant(), "the engine asks a dormant constraint for no mask");
        for (i, w) in allowed.iter_mut().enumerate() {
            *w &= if i == self.forced as usize / 32 { 1 << (self.forced % 32) } else { 0 };
        }
        Ok(())
    }

    fn commit(&mut self, token: u32) -> Result<(), String> {
        let mut c = self.committed.lock().expect("lock");
        if c.len() >= self.wake_after && token != self.forced {
            return Err(format!("token {token} after waking up"));
        }
        c.push(token);
        Ok(())
    }

    fn is_finished(&self) -> bool {
        self.committed.lock().expect("lock").len() >= self.wake_after + self.num_forced
    }

    fn is_dormant(&self) -> bool {
        self.committed.lock().expect("lock").len() < self.wake_after
    }
}

#[test]
fn dormant_constraint_allows_speculation_and_sees_every_token() {
    let prompt = bytes("abcabcabcabcabc");
    let continuation = bytes(&"abc".repeat(10));
    let script = continuation_script(prompt.len(), continuation.clone(), b'z' as u32);
    let spec = engine::SpecConfig {
        max_draft_tokens: 4,
        ngram: true,
        draft_model: false,
        adaptive: false,
        ..engine::SpecConfig::default()
    };
    let mut e = Engine::new(
        fake(1024, script),
        build_tokenizer(),
        EngineConfig { spec, max_batch_tokens: 64, max_prefill_tokens_while_decoding: 64, ..Default::default() },
    );
    let committed = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut req = greedy(prompt, 100);
    let forced = b'q' as u32;
    req.constraint =
        Some(Box::new(WakingConstraint { wake_after: 14, forced, num_forced: 3, committed: committed.clone() }));
    let id = e.add_request(req).expect("valid");
    let out = run_to_end(&mut e);
    let mut want = continuation[..14].to_vec();
    want.extend([forced; 3]);
    assert_eq!(out[&id].tokens, want, "drafts past the wake-up are dropped, then the mask rules");
    assert_eq!(*committed.lock().expect("lock"), want, "the constraint saw every token, in order");
    assert_eq!(out[&id].finish.expect("finished").0, FinishReason::Stop);
    let stats = e.spec_stats();
    assert!(stats.of("ngram").accepted > 0, "speculation ran while the constraint was dormant: {stats:?}");
}

/// Runs `prompt` greedily with a fake draft model whose script is `draft`, under fixed pass costs (a draft pass
/// 0.3 of a target pass, k + 1 rows 1 + 0.1 k) that make drafting pay above ~40% acceptance.
fn run_with_draft(
    prompt: &[u32],
    max_tokens: usize,
    draft: impl Fn(&[u32]) -> Vec<f32> + Send + 'static,
) -> (Vec<u32>, engine::SpecStats) {
    run_with_draft_spec(prompt, max_tokens, draft, engine::SpecConfig::default())
}

/// [`run_with_draft`] with other speculation settings (n-gram drafts and cost measurement still off).
fn run_with_draft_spec(
    prompt: &[u32],
    max_tokens: usize,
    draft: impl Fn(&[u32]) -> Vec<f32> + Send + 'static,
    spec: engine::SpecConfig,
) -> (Vec<u32>, engine::SpecStats) {
    let spec = engine::SpecConfig { ngram: false, measure_costs: false, ..spec };
    let mut e = Engine::new(
        fake(1024, letters_script),
        build_tokenizer(),
        EngineConfig { spec, max_batch_tokens: 64, max_prefill_tokens_while_decoding: 64, ..Default::default() },
    );
    e.set_draft(fake(1024, draft)).expect("same vocabulary");
    e.set_pass_costs(engine::spec::PassCosts { target: vec![(1, 1.0), (17, 2.6)], draft_s: 0.3 });
    let id = e.add_request(greedy(prompt.to_vec(), max_tokens)).expect("valid");
    let out = run_to_end(&mut e);
    (out[&id].tokens.clone(), e.spec_stats())
}

#[test]
fn the_draft_model_comes_back_after_early_rejections() {
    let prompt = bytes("probe");
    // The draft is wrong for the first 12 positions of the reply, then always right.
    let n = prompt.len();
    let (tokens, stats) =
        run_with_draft(
            &prompt,
            120,
            move |h: &[u32]| {
                if h.len() < n + 12 { one_hot(b'!' as u32) } else { letters_script(h) }
            },
        );
    assert_eq!(tokens, expected_letters(&prompt, 120), "greedy output is the target's");
    // Without probes the estimate falls below the break-even point within a few rejections and stays there: the
    // draft then proposes nothing more (without probes: 4 proposed, 0 accepted).
    assert!(stats.of("draft").accepted >= 60, "the draft is back once it fits: {stats:?}");
}

#[test]
fn guided_drafts_run_through_sure_tokens_and_stop_after_an_unsure_one() {
    let prompt = bytes("guide");
    // The draft is the target, and sure of it (probability ~1), except at every 6th position, where it is unsure
    // (probability ~0.006) and wrong.
    let draft = |h: &[u32]| {
        if h.len().is_multiple_of(6) {
            let mut l = vec![0.0; VOCAB];
            l[b'!' as usize] = 0.5;
            l
        } else {
            letters_script(h)
        }
    };
    let (guided_tokens, guided) = run_with_draft_spec(&prompt, 240, draft, engine::SpecConfig::default());
    let unguided_spec = engine::SpecConfig { draft_confidence: false, ..engine::SpecConfig::default() };
    let (plain_tokens, unguided) = run_with_draft_spec(&prompt, 240, draft, unguided_spec);
    let want = expected_letters(&prompt, 240);
    assert_eq!(guided_tokens, want, "greedy output is the target's");
    assert_eq!(plain_tokens, want, "greedy output is the target's");
    // Guided, a draft ends at its unsure token (if it reaches one): at most one rejected token per verification,
    // and the runs of five sure tokens are drafted whole.
    let wasted = guided.of("draft").proposed - guided.of("draft").accepted;
    assert!(wasted <= guided.decode_passes, "drafting went on past an unsure token: {guided:?}");
    assert!(guided.of("draft").accepted as f64 >= 4.0 * guided.decode_passes as f64, "{guided:?}");
    // Unguided, the depth follows the average acceptance (5 in 6), which pays only for short drafts: many more
    // verifications for the same tokens (85 against 41 when this was written).
    assert!(3 * guided.decode_passes < 2 * unguided.decode_passes, "guided {guided:?}, unguided {unguided:?}");
}

#[test]
fn probes_of_a_useless_draft_back_off() {
    let prompt = bytes("useless");
    let (tokens, stats) = run_with_draft(&prompt, 300, |_: &[u32]| one_hot(b'!' as u32));
    assert_eq!(tokens, expected_letters(&prompt, 300));
    assert_eq!(stats.of("draft").accepted, 0);
    // The first proposals at the prior, then probes of 2 after gaps of 8, 16, 32, 64, 128 passes: far fewer than
    // one per pass.
    assert!(stats.of("draft").proposed <= 40, "{stats:?}");
    assert!(stats.of("draft").proposed >= 10, "probes keep running: {stats:?}");
}

#[test]
fn greedy_steps_let_the_runner_pick_the_argmax() {
    let prompt = bytes("pick");
    let mut e = engine_with(fake(1024, letters_script), 64);
    let (tokens, _, _) = e.generate(greedy(prompt.clone(), 20), |_| {}).expect("generate");
    assert_eq!(tokens, expected_letters(&prompt, 20));
    let r = e.runner().state();
    assert_eq!(r.argmax_batches, r.batches.len(), "every greedy step (prefill included) picks on the runner");
    // Log-probabilities need the logits: the same request with them runs through `forward` and gives the same tokens.
    let mut e = engine_with(fake(1024, letters_script), 64);
    let mut req = greedy(prompt.clone(), 20);
    req.sampling.logprobs = Some(2);
    let (with_logprobs, _, _) = e.generate(req, |_| {}).expect("generate");
    assert_eq!(with_logprobs, tokens);
    assert_eq!(e.runner().state().argmax_batches, 0);
}

/// Decode ahead: a lone greedy sequence whose next steps speculation cannot reshape lets the runner start each step
/// before the last pick comes back (`NextStep::FedPicks`), from its first decode step to its last; with n-gram
/// speculation on, or while another sequence shares the steps, it does not.
#[test]
fn a_lone_greedy_sequence_without_speculation_decodes_ahead() {
    let prompt = bytes("ahead");
    let no_spec = || EngineConfig {
        max_batch_tokens: 64,
        max_prefill_tokens_while_decoding: 64,
        spec: engine::SpecConfig { max_draft_tokens: 0, ..Default::default() },
        ..Default::default()
    };
    let mut e = Engine::new(fake(1024, letters_script), build_tokenizer(), no_spec());
    let (tokens, _, _) = e.generate(greedy(prompt.clone(), 20), |_| {}).expect("generate");
    assert_eq!(tokens, expected_letters(&prompt, 20));
    let r = e.runner().state();
    // The prompt's step picks the first token; the 19 steps that follow feed one token each, all but the last (which
    // picks the 20th and final token, so nothing follows it) with the next step started ahead.
    assert_eq!(r.batches.len(), 20);
    assert_eq!(r.ahead_batches, 18);
    assert_eq!(r.argmax_batches, 20);

    // With n-gram speculation (the default) any step may carry drafts: none ahead.
    let mut e = engine_with(fake(1024, letters_script), 64);
    assert_eq!(e.generate(greedy(prompt.clone(), 20), |_| {}).expect("generate").0, tokens);
    assert_eq!(e.runner().state().ahead_batches, 0);

    // Two sequences: ahead only once the shorter one has finished.
    let mut e = Engine::new(fake(1024, letters_script), build_tokenizer(), no_spec());
    let a = e.add_request(greedy(prompt.clone(), 20)).expect("valid");
    let b = e.add_request(greedy(bytes("other"), 5)).expect("valid");
    let out = run_to_end(&mut e);
    assert_eq!(out[&a].tokens, tokens);
    assert_eq!(out[&b].tokens, expected_letters(&bytes("other"), 5));
    let r = e.runner().state();
    let lone_steps = r.batches.iter().filter(|b| b.len() == 1 && b[0].tokens.len() == 1).count();
    assert_eq!(lone_steps, 15, "{:?}", r.batches);
    assert_eq!(r.ahead_batches, lone_steps - 1);
    drop(r);
    assert_all_released(&e, &[a, b]);
}

/// Top-k sampling with penalties (the packs' defaults) picks from each row's largest logits: the runner returns only
/// those, and the tokens are the ones the whole rows give, with n-gram and draft-model speculation verifying sampled
/// drafts. Log-probabilities need the whole rows.
#[test]
fn sampled_steps_use_the_rows_largest_logits_and_give_the_same_tokens() {
    let params = |seed| SamplingParams {
        temperature: 0.7,
        top_k: 20,
        top_p: 0.8,
        repetition_penalty: 1.05,
        presence_penalty: 0.2,
        seed: Some(seed),
        ..Default::default()
    };
    let run = |candidates: bool, logprobs: bool| {
        let mut e = Engine::new(
            fake(1024, noisy_script),
            build_tokenizer(),
            EngineConfig {
                max_batch_tokens: 64,
                max_prefill_tokens_while_decoding: 64,
                sample_on_candidates: candidates,
                ..Default::default()
            },
        );
        // A draft close to the target: the target's logits with two tokens favoured.
        let draft = |h: &[u32]| {
            let mut l = noisy_script(h);
            l[b'e' as usize] += 1.5;
            l[b'q' as usize] += 1.0;
            l
        };
        e.set_draft(fake(1024, draft)).expect("same vocabulary");
        e.set_pass_costs(engine::spec::PassCosts { target: vec![(1, 1.0), (17, 1.2)], draft_s: 0.05 });
        let ids: Vec<RequestId> = [("sample one", 3), ("and another", 4), ("abababababababab", 5)]
            .into_iter()
            .map(|(p, seed)| {
                let mut req = GenerateRequest::new(bytes(p), params(seed), 60);
                req.sampling.logprobs = logprobs.then_some(1);
                e.add_request(req).expect("valid")
            })
            .collect();
        let out = run_to_end(&mut e);
        let tokens: Vec<Vec<u32>> = ids.iter().map(|id| out[id].tokens.clone()).collect();
        let r = e.runner().state();
        (
            tokens,
            r.candidate_batches,
            r.max_candidates,
            e.draft().map_or(0, |d| d.state().candidate_batches),
            e.spec_stats(),
        )
    };
    let (whole, none, _, none_draft, _) = run(false, false);
    assert_eq!((none, none_draft), (0, 0));
    let (cands, n, max_n, draft_n, stats) = run(true, false);
    assert_eq!(cands, whole, "the same tokens from the largest logits");
    assert!(n > 0 && draft_n > 0, "target {n} and draft {draft_n} passes took candidates");
    assert!((20..=20 + 64 + 8).contains(&max_n), "k plus the penalised tokens: {max_n}");
    assert!(stats.of("draft").accepted > 0 && stats.of("draft").proposed > stats.of("draft").accepted, "{stats:?}");
    assert!(cands.iter().all(|t| t.len() == 60));
    let (with_logprobs, n, _, _, _) = run(true, true);
    assert_eq!(n, 0, "log-probabilities need the whole rows");
    assert_eq!(with_logprobs, whole);
}
