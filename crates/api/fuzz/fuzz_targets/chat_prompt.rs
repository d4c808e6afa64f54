//! A hostile conversation through the chat template and the prompt tokenizer, as `api::generate::render` and
//! `encode_prompt` do it: content (system prompt, user text, assistant text and reasoning, a tool call's argument,
//! a tool result, a tool's description) can never write a control token, the template's own markers still are
//! control tokens, and the prompt's text is exactly the unprotected rendering's. Oracle (as `tests/roles.rs`'s): the
//! same conversation with `|` written `!` (same length, same template branches; every control token of the model
//! has a `|`) marks where the template's control tokens are; the expected ids are those tokens there and the text
//! between them tokenized plain.
//!
//! Input: the first byte picks the template (the model's, or Qwen3's thinking template, which strips, splits on
//! `</think>` and tests `startswith`), the rest is split at NUL bytes into the content strings. The model (its
//! tokenizer and template) is `$SPLASH_FUZZ_MODEL`, by default the cached Qwen2.5-Coder-0.5B.
#![no_main]

use std::sync::{Arc, OnceLock};

use chat::{ChatTemplate, RenderInput};
use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};
use tokenizer::Tokenizer;

struct Model {
    tokenizer: Arc<Tokenizer>,
    templates: [ChatTemplate; 2],
    /// Control-token texts without a `|` (Qwen2.5's `</s>`), which the oracle cannot tell from content: inputs that
    /// hold one are skipped here (tests/roles.rs and the tokenizer's prompt tests cover every control-token text).
    unpiped: Vec<String>,
}

fn model() -> &'static Model {
    static MODEL: OnceLock<Model> = OnceLock::new();
    MODEL.get_or_init(|| {
        let path = std::env::var("SPLASH_FUZZ_MODEL").unwrap_or_else(|_| {
            let home = std::env::var("HOME").expect("HOME is set");
            format!("{home}/.cache/splash/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
        });
        let file = gguf::GgufFile::open(std::path::Path::new(&path)).expect("the model file (SPLASH_FUZZ_MODEL)");
        let tokenizer = Tokenizer::from_gguf(&file).expect("tokenizer");
        let unpiped = (0..tokenizer.vocab_size() as u32)
            .filter(|&id| tokenizer.is_control(id))
            .filter_map(|id| tokenizer.token_str(id))
            .filter(|text| !text.contains('|'))
            .map(str::to_owned)
            .collect();
        let own = ChatTemplate::from_gguf(&file).expect("template");
        let qwen3 = own.with_source(include_str!("../../tests/fixtures/qwen3_chat_template.jinja")).expect("qwen3");
        Model { tokenizer: Arc::new(tokenizer), templates: [own, qwen3], unpiped }
    })
}

/// The conversation as a Chat Completions request, each content string through `forge`. It ends with the tool's
/// result, so Qwen3's template renders the reasoning of the turn since the last user message.
fn request(parts: &[String], forge: &dyn Fn(&str) -> String) -> Value {
    let part = |i: usize| forge(parts.get(i).map_or("", String::as_str));
    let args = json!({"city": part(4)}).to_string();
    json!({"model": "m", "messages": [
        {"role": "system", "content": part(0)},
        {"role": "user", "content": part(1)},
        {"role": "assistant", "content": part(2), "reasoning_content": part(3), "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": args}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": part(5)}],
        "tools": [{"type": "function", "function": {"name": "get_weather", "description": part(6),
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]})
}

fn input(request: Value) -> Option<RenderInput> {
    let request: api::openai::wire::ChatRequest = serde_json::from_value(request).ok()?;
    let turn = api::openai::convert::to_turn(request, &engine::SamplingParams::default()).ok()?;
    Some(RenderInput::from_conversation(&turn.conversation, true))
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else { return };
    let m = model();
    let (tok, template) = (&m.tokenizer, &m.templates[usize::from(pick & 1)]);
    let parts: Vec<String> = rest.split(|&b| b == 0).map(|p| String::from_utf8_lossy(p).into_owned()).collect();
    if parts.iter().any(|p| m.unpiped.iter().any(|t| p.contains(t.as_str()))) {
        return;
    }
    let (Some(real), Some(defanged)) =
        (input(request(&parts, &|s| s.to_owned())), input(request(&parts, &|s| s.replace('|', "!"))))
    else {
        return;
    };
    let protect = |s: &str| match tok.protect(s) {
        std::borrow::Cow::Owned(p) => Some(p),
        std::borrow::Cow::Borrowed(_) => None,
    };
    let (Ok(prompt), Ok(plain), Ok(oracle)) =
        (template.render_protected(&real, &protect), template.render(&real), template.render(&defanged))
    else {
        return;
    };
    let ids = tok.encode_prompt(&prompt).expect("a rendered prompt tokenizes");
    assert_eq!(tok.decode(&ids), plain, "protection changes no byte of the prompt");
    assert_eq!(oracle.len(), plain.len(), "defanging keeps the prompt's length");
    let mut expected = Vec::new();
    let (mut pos, mut start) = (0, 0);
    for id in tok.encode(&oracle, true).expect("oracle tokenizes") {
        let n = tok.token_bytes(id).len();
        if tok.is_control(id) {
            expected.extend(tok.encode(&plain[start..pos], false).expect("plain text tokenizes"));
            expected.push(id);
            start = pos + n;
        }
        pos += n;
    }
    expected.extend(tok.encode(&plain[start..], false).expect("plain text tokenizes"));
    assert!(expected.iter().filter(|&&id| tok.is_control(id)).count() >= 8, "the template's markers: {oracle}");
    assert_eq!(ids, expected, "control tokens only where the template wrote them: {plain:?}");
});
