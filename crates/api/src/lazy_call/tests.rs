use std::sync::OnceLock;

use engine::TokenConstraint;

use super::*;

/// The real tokenizer of Qwen2.5-Coder-0.5B (the model cache has it).
fn tokenizer() -> Arc<tokenizer::Tokenizer> {
    static TOKENIZER: OnceLock<Arc<tokenizer::Tokenizer>> = OnceLock::new();
    TOKENIZER
        .get_or_init(|| {
            let path = pack::resolve("qwen2.5-coder-0.5b").expect("the Qwen2.5-Coder-0.5B GGUF is in the cache");
            let file = gguf::GgufFile::open(&path).expect("GGUF opens");
            Arc::new(tokenizer::Tokenizer::from_gguf(&file).expect("tokenizer"))
        })
        .clone()
}

/// Claude Code's file tools, as it declares them.
fn tools() -> Vec<(String, Value)> {
    vec![
        (
            "Write".into(),
            json!({"type": "object", "properties": {"file_path": {"type": "string"}, "content": {"type": "string"}},
                   "required": ["file_path", "content"], "additionalProperties": false,
                   "$schema": "http://json-schema.org/draft-07/schema#"}),
        ),
        (
            "Bash".into(),
            json!({"type": "object", "properties": {"command": {"type": "string"},
                   "timeout": {"type": "number", "exclusiveMinimum": 0}},
                   "required": ["command"], "additionalProperties": false}),
        ),
    ]
}

fn lazy(parallel: bool) -> LazyToolCalls {
    LazyToolCalls::new(&tokenizer(), &tools(), false, parallel).expect("grammar compiles")
}

fn is_allowed(c: &mut LazyToolCalls, token: u32) -> bool {
    let mut allowed = vec![u32::MAX; tokenizer().vocab_size().div_ceil(32)];
    c.allowed_tokens(&mut allowed).expect("mask");
    allowed[token as usize / 32] >> (token % 32) & 1 == 1
}

fn encode(text: &str) -> Vec<u32> {
    tokenizer().encode(text, true).expect("encode")
}

fn token(text: &str) -> u32 {
    let ids = encode(text);
    assert_eq!(ids.len(), 1, "{text:?} is one token");
    ids[0]
}

/// Every token id by its bytes (normal tokens only).
fn by_bytes() -> &'static std::collections::HashMap<Vec<u8>, u32> {
    static MAP: OnceLock<std::collections::HashMap<Vec<u8>, u32>> = OnceLock::new();
    MAP.get_or_init(|| {
        let t = tokenizer();
        (0..t.vocab_size() as u32)
            .filter(|&id| !t.is_control(id) && !t.token_bytes(id).is_empty())
            .map(|id| (t.token_bytes(id).to_vec(), id))
            .collect()
    })
}

/// The model writes `text`, cut into pieces at `cuts` (byte offsets) and tokenized piece by piece, the way a
/// model may split text anywhere. Where the constraint refuses the next token, the model writes the same text
/// with the longest token it allows instead (as a model under a grammar does); `Err(offset)`: no allowed token
/// continues the text there.
fn write_text(c: &mut LazyToolCalls, text: &str, cuts: &[usize]) -> Result<(), usize> {
    let mut preferred = Vec::new();
    let mut last = 0;
    for &cut in cuts.iter().chain(std::iter::once(&text.len())) {
        preferred.extend(encode(&text[last..cut]));
        last = cut;
    }
    let bytes = text.as_bytes();
    let mut pos = 0;
    let mut next = 0;
    // Offsets where the preferred tokens end.
    let mut ends = Vec::new();
    let mut off = 0;
    for &t in &preferred {
        off += tokenizer().token_bytes(t).len();
        ends.push(off);
    }
    while pos < bytes.len() {
        while next < preferred.len() && ends[next] <= pos {
            next += 1;
        }
        let starts_here = next == 0 || ends[next - 1] == pos;
        let token = if starts_here && next < preferred.len() && is_allowed(c, preferred[next]) {
            preferred[next]
        } else {
            let mut alt = None;
            for len in (1..=(bytes.len() - pos).min(24)).rev() {
                if let Some(&id) = by_bytes().get(&bytes[pos..pos + len])
                    && is_allowed(c, id)
                {
                    alt = Some(id);
                    break;
                }
            }
            alt.ok_or(pos)?
        };
        if c.is_dormant() {
            let mut allowed = vec![u32::MAX; tokenizer().vocab_size().div_ceil(32)];
            c.allowed_tokens(&mut allowed).expect("mask");
            assert!(allowed.iter().all(|&w| w == u32::MAX), "a dormant constraint masks nothing");
        }
        c.commit(token).expect("commit");
        pos += tokenizer().token_bytes(token).len();
    }
    Ok(())
}

#[test]
fn prose_code_and_json_that_is_not_a_call_stay_free() {
    let text = "Sure! Here is the code:\n```python\nprint({\"name\": \"x\"})\n```\nAnd some JSON:\n```json\n{\"path\": \"a\", \"name\": \"Write\"}\n```\n[{\"name\": \"Write\"}]\nx = {\"name\": \"Bash\"}\n  {\"file_path\": \"p\"}\nDone.";
    for cuts in [vec![], (1..text.len()).collect::<Vec<_>>()] {
        let mut c = lazy(true);
        assert_eq!(write_text(&mut c, text, &cuts), Ok(()));
        assert!(c.is_dormant() && !c.is_finished() && c.num_calls() == 0);
    }
}

#[test]
fn fenced_call_with_a_file_name_as_tool_name_is_held_to_a_declared_tool() {
    // What Qwen2.5-Coder-0.5B wrote with Claude Code's tools (see the closing note of issue 7).
    let mut c = lazy(true);
    let prefix = "I'll create the file.\n```json\n{\n  \"name\": \"";
    assert_eq!(write_text(&mut c, prefix, &[]), Ok(()));
    assert!(!c.is_dormant(), "the call has started");
    let hello = encode("hello.txt");
    assert!(!is_allowed(&mut c, hello[0]), "an undeclared name is refused");
    assert!(is_allowed(&mut c, token("Write")) && is_allowed(&mut c, token("B")));
    let rest = "Write\",\n  \"arguments\": {\"file_path\": \"hello.txt\", \"content\": \"hi\"}\n}\n```";
    assert_eq!(write_text(&mut c, rest, &[]), Ok(()));
    assert!(c.is_dormant() && c.num_calls() == 1 && !c.is_finished());
    // The output parser reads it as a call.
    let mut parser = chat::ToolCallParser::new(["Write", "Bash"]);
    let mut events = parser.push(&format!("{prefix}{rest}"));
    events.extend(parser.finish());
    assert_eq!(events.len(), 2, "{events:?}");
    let chat::ParseEvent::ToolCall(call) = &events[1] else { panic!("{events:?}") };
    assert_eq!(call.arguments, json!({"file_path": "hello.txt", "content": "hi"}));
}

#[test]
fn arguments_follow_the_tool_schema() {
    let mut c = lazy(true);
    assert_eq!(write_text(&mut c, "{\"name\": \"Write\", \"arguments\": {\"", &[]), Ok(()));
    assert!(!is_allowed(&mut c, token("path")), "no property 'path'");
    assert!(is_allowed(&mut c, token("file")));
    // `content` is required: the object cannot close after `file_path` alone.
    assert_eq!(write_text(&mut c, "file_path\": \"a.txt\"", &[]), Ok(()));
    assert!(!is_allowed(&mut c, token("}")));
    assert_eq!(write_text(&mut c, ", \"content\": \"x\"}}\n", &[]), Ok(()));
    assert_eq!(c.num_calls(), 1);
    // A wrong key for the arguments is refused too.
    let mut c = lazy(true);
    assert_eq!(write_text(&mut c, "{\"name\": \"Bash\", \"", &[]), Ok(()));
    assert!(!is_allowed(&mut c, token("parameters")));
    assert!(is_allowed(&mut c, token("arguments")));
}

#[test]
fn tagged_calls_one_after_another_and_parallel_off() {
    let text = "<tool_call>\n{\"name\": \"Bash\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"Write\", \"arguments\": {\"file_path\": \"a\", \"content\": \"b\"}}\n</tool_call>";
    let mut c = lazy(true);
    assert_eq!(write_text(&mut c, text, &[]), Ok(()));
    assert_eq!(c.num_calls(), 2);
    assert!(c.is_dormant() && !c.is_finished());
    let mut c = lazy(false);
    let first = text.find("</tool_call>").unwrap() + "</tool_call>".len();
    assert_eq!(write_text(&mut c, &text[..first], &[]), Ok(()));
    assert!(c.is_finished(), "one call is all that is wanted");
    // An undeclared name inside the tag is refused.
    let mut c = lazy(true);
    let text = "<tool_call>\n{\"name\": \"hello";
    assert_eq!(write_text(&mut c, text, &[]), Err(text.len() - "hello".len()));
}

#[test]
fn pretty_bare_call_at_every_token_split() {
    let text = "{\n  \"name\": \"Bash\",\n  \"arguments\": {\n    \"command\": \"echo hi > hello.txt\"\n  }\n}\n";
    for cut in 1..text.len() {
        let mut c = lazy(true);
        assert_eq!(write_text(&mut c, text, &[cut]), Ok(()), "split at {cut}");
        assert_eq!(c.num_calls(), 1, "split at {cut}");
        assert!(c.is_dormant(), "split at {cut}");
    }
    // Byte by byte.
    let mut c = lazy(true);
    let cuts: Vec<usize> = (1..text.len()).collect();
    assert_eq!(write_text(&mut c, text, &cuts), Ok(()));
    assert_eq!(c.num_calls(), 1);
}

#[test]
fn fenced_call_at_every_token_split() {
    let text = "Okay.\n```json\n{\"name\": \"Write\", \"arguments\": {\"file_path\": \"hello.txt\", \"content\": \"hi\"}}\n```";
    for cut in 1..text.len() {
        let mut c = lazy(true);
        assert_eq!(write_text(&mut c, text, &[cut]), Ok(()), "split at {cut}");
        assert_eq!(c.num_calls(), 1, "split at {cut}");
    }
}

#[test]
fn a_call_cannot_run_on_past_its_end() {
    let mut c = lazy(true);
    assert_eq!(write_text(&mut c, "```json\n{\"name\": \"Bash\", \"arguments\": {\"command\": \"ls\"}}", &[]), Ok(()));
    // Inside the fence, after the object: only the closing fence (with optional blanks) may follow.
    assert!(!is_allowed(&mut c, token(",")));
    assert!(!is_allowed(&mut c, tokenizer().eos().expect("eos")));
    assert_eq!(write_text(&mut c, "\n```", &[]), Ok(()));
    assert!(c.is_dormant());
}

/// The id of the token whose text is exactly `text` (control tokens included).
fn token_of(text: &str) -> u32 {
    let t = tokenizer();
    (0..t.vocab_size() as u32).find(|&id| t.token_bytes(id) == text.as_bytes()).expect("token exists")
}

#[test]
fn arguments_hold_only_the_declared_keys_unless_the_schema_opens_them() {
    // Hermes declares `write_file` without `additionalProperties`; its 0.5B calls carried keys copied from the
    // prompt (`resolved_path`, ...). Those are refused now; a free-form object and an explicit `true` stay open.
    let tools = vec![
        (
            "write_file".to_string(),
            json!({"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                   "required": ["path", "content"]}),
        ),
        ("set_env".to_string(), json!({"type": "object", "properties": {"vars": {"type": "object"}}})),
        (
            "open_tool".to_string(),
            json!({"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": true}),
        ),
    ];
    let written = |text: &str| {
        let mut c = LazyToolCalls::new(&tokenizer(), &tools, false, true).expect("grammar compiles");
        write_text(&mut c, text, &[]).map(|()| c.num_calls())
    };
    let call = r#"{"name": "write_file", "arguments": {"path": "a.txt", "content": "hi"}}"#;
    assert_eq!(written(&format!("{call}\n")), Ok(1));
    let extra = r#"{"name": "write_file", "arguments": {"path": "a.txt", "content": "hi", "resolved_path": "/a.txt"}}"#;
    let refused_at = written(&format!("{extra}\n")).expect_err("an undeclared key is refused");
    let after_hi = extra.find(r#""hi""#).expect("hi") + 4;
    assert!((after_hi..=extra.find("resolved_path").expect("key")).contains(&refused_at), "{refused_at}");
    assert_eq!(written("{\"name\": \"set_env\", \"arguments\": {\"vars\": {\"ANY\": \"1\"}}}\n"), Ok(1));
    assert_eq!(written("{\"name\": \"open_tool\", \"arguments\": {\"a\": \"x\", \"b\": 2}}\n"), Ok(1));
}

#[test]
fn a_bare_call_may_end_the_reply_and_its_blanks_are_bounded() {
    // Codex on the 0.5B wrote a bare call and then wanted to end its turn; the grammar allowed only blanks or a
    // newline after the `}`, and the model wrote 2,000 tokens of spaces. The chat template ends a turn with
    // `<|im_end|>`, and the output parser reads a bare call that ends the output.
    let im_end = token_of("<|im_end|>");
    let call = "{\"name\": \"Bash\", \"arguments\": {\"command\": \"ls\"}}";
    let mut c = lazy(true);
    assert_eq!(write_text(&mut c, call, &[]), Ok(()));
    assert!(!c.is_dormant(), "the line may still end with blanks and a newline");
    assert!(is_allowed(&mut c, im_end), "the reply may end after the call");
    assert!(is_allowed(&mut c, tokenizer().eos().expect("eos")));
    assert!(!is_allowed(&mut c, token(",")));
    c.commit(im_end).expect("commit");
    assert_eq!(c.num_calls(), 1);
    assert!(c.is_dormant() && !c.is_finished());
    // One call wanted: the end completes it and finishes the grammar.
    let mut c = lazy(false);
    assert_eq!(write_text(&mut c, call, &[]), Ok(()));
    c.commit(im_end).expect("commit");
    assert!(c.num_calls() == 1 && c.is_finished());
    // Blanks: at most 8, then the newline.
    let space = token(" ");
    let mut c = lazy(true);
    assert_eq!(write_text(&mut c, call, &[]), Ok(()));
    for i in 0..8 {
        assert!(is_allowed(&mut c, space), "blank {i}");
        c.commit(space).expect("commit");
    }
    assert!(!is_allowed(&mut c, space), "a 9th blank");
    assert!(is_allowed(&mut c, token("\n")), "then the newline");
    c.commit(token("\n")).expect("commit");
    assert!(c.is_dormant() && c.num_calls() == 1);
    // An unfinished call cannot end the reply.
    let mut c = lazy(true);
    assert_eq!(write_text(&mut c, "{\"name\": \"Bash\", \"arguments\": {", &[]), Ok(()));
    assert!(!is_allowed(&mut c, im_end));
    // Inside a fence, blanks before the closing fence are bounded the same way.
    let mut c = lazy(true);
    assert_eq!(write_text(&mut c, &format!("```json\n{call}"), &[]), Ok(()));
    for _ in 0..8 {
        c.commit(space).expect("commit");
    }
    assert!(!is_allowed(&mut c, space) && !is_allowed(&mut c, im_end));
    assert_eq!(write_text(&mut c, "\n```", &[]), Ok(()));
    assert!(c.is_dormant() && c.num_calls() == 1);
}

#[test]
fn xml_form_holds_names_keys_required_parameters_and_value_types() {
    let xml = || LazyToolCalls::new(&tokenizer(), &tools(), true, true).expect("grammar compiles");
    // Required parameters in either order, a string that looks like a number, a number; at every split and with
    // the model's own tokens.
    let text = "Let me write it.\n<tool_call>\n<function=Write>\n<parameter=content>\n42\n</parameter>\n<parameter=file_path>\nn.txt\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=Bash>\n<parameter=timeout>\n30\n</parameter>\n<parameter=command>\nls -la </tmp>\n</parameter>\n</function>\n</tool_call>";
    for cut in (1..text.len()).step_by(7) {
        let mut c = xml();
        assert_eq!(write_text(&mut c, text, &[cut]), Ok(()), "split at {cut}");
        assert_eq!(c.num_calls(), 2, "split at {cut}");
        assert!(c.is_dormant());
    }
    let mut c = xml();
    for t in encode(text) {
        assert!(is_allowed(&mut c, t), "{:?}", String::from_utf8_lossy(tokenizer().token_bytes(t)));
        c.commit(t).expect("commit");
    }
    assert_eq!(c.num_calls(), 2);
    // Both calls are listed for streaming, as XML.
    let starts = c.call_starts();
    let starts = starts.lock().unwrap().clone();
    let first = text.find("<tool_call>").unwrap();
    assert_eq!(starts[0], CallStart { offset: first, tagged: true, xml: true });
    assert_eq!(starts.len(), 2);
    let refused = |prefix: &str, next: &str| {
        let mut c = xml();
        assert_eq!(write_text(&mut c, prefix, &[]), Ok(()), "{prefix:?}");
        !is_allowed(&mut c, token(next))
    };
    // An undeclared tool or key, a number that is no number, a call without its required parameters.
    let mut c = xml();
    let text = "<tool_call>\n<function=hello";
    assert_eq!(write_text(&mut c, text, &[]), Err(text.len() - "hello".len()));
    assert!(refused("<tool_call>\n<function=Bash>\n<parameter=", "cwd"));
    assert!(!refused("<tool_call>\n<function=Bash>\n<parameter=", "command"));
    assert!(refused("<tool_call>\n<function=Bash>\n<parameter=timeout>\n", "soon"));
    assert!(!refused("<tool_call>\n<function=Bash>\n<parameter=timeout>\n", "3"));
    assert!(refused("<tool_call>\n<function=Write>\n<parameter=file_path>\na\n</parameter>\n", "</"));
    assert!(refused("<tool_call>\n<function=Write>\n<parameter=file_path>\na\n</parameter>\n<parameter=", "file"));
    // A required parameter comes once.
    let mut c = xml();
    let text = "<tool_call>\n<function=Bash>\n<parameter=command>\nls\n</parameter>\n<parameter=command>";
    assert!(write_text(&mut c, text, &[]).is_err());
}

#[test]
fn well_formed_calls_keep_the_models_own_tokens() {
    // Each token of the usual tokenization is allowed as it comes (the grammar does not force odd splits at
    // the end of a call, such as `"}}\n` cut in two), and the call completes.
    let texts = [
        "<tool_call>\n{\"name\": \"Bash\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call>",
        "```json\n{\"name\": \"Bash\", \"arguments\": {\"command\": \"ls\"}}\n```",
        "{\"name\": \"Bash\", \"arguments\": {\"command\": \"ls\"}}\n{\"tool_response\": \"invented\"}",
    ];
    for text in texts {
        let mut c = lazy(true);
        for t in encode(text) {
            assert!(is_allowed(&mut c, t), "{:?} in {text:?}", String::from_utf8_lossy(tokenizer().token_bytes(t)));
            c.commit(t).expect("commit");
        }
        assert_eq!(c.num_calls(), 1, "{text:?}");
        assert!(c.is_dormant());
    }
}

#[test]
fn no_trigger_inside_the_reasoning_at_any_split() {
    // Inside the reasoning the model may sketch a call (or an undeclared one); only the call after `</think>`
    // is held to the grammar.
    let think = "<think>\nMaybe <tool_call>\n{\"name\": \"hello\"}\n```json\n{\"name\": \"nope\"}\n</think>\n\n";
    let call = "<tool_call>\n{\"name\": \"Bash\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call>";
    let text = format!("{think}{call}");
    for cut in (1..text.len()).step_by(3) {
        let mut c = lazy(true);
        c.wait_for_reasoning(false);
        assert_eq!(write_text(&mut c, &text, &[cut]), Ok(()), "split at {cut}");
        assert_eq!(c.num_calls(), 1, "split at {cut}");
        let starts = c.call_starts();
        let starts = starts.lock().unwrap();
        assert_eq!(starts.len(), 1);
        assert_eq!((starts[0].offset, starts[0].tagged), (think.len(), true), "split at {cut}");
    }
    // The prompt opened the reasoning: only `</think>` appears.
    let text = format!("{}{call}", &think["<think>\n".len()..]);
    let mut c = lazy(true);
    c.wait_for_reasoning(true);
    assert_eq!(write_text(&mut c, &text, &[]), Ok(()));
    assert_eq!(c.num_calls(), 1);
    // Without the gate, the sketch inside the reasoning would be held (and refused: "hello" is not a tool).
    let mut c = lazy(true);
    assert!(write_text(&mut c, &format!("{think}{call}"), &[]).is_err());
    // A model that does not think: calls trigger from the start.
    let mut c = lazy(true);
    c.wait_for_reasoning(false);
    assert_eq!(write_text(&mut c, call, &[]), Ok(()));
    assert_eq!(c.num_calls(), 1);
}
