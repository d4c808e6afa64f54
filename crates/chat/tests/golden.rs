//! Byte-for-byte parity with Python Jinja2 set up as transformers does, on the chat templates embedded in the real
//! GGUF files (read from `$SPLASH_MODELS`, default `~/.cache/splash/models`) and on small extra templates. Expected
//! outputs were recorded by `scripts/fixtures/gen_template_fixtures.py`. A missing model file fails the test unless
//! `SPLASH_SKIP_MODEL_TESTS=1`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use chat::{ChatTemplate, Conversation, Message, RenderInput, Tool};
use serde::Deserialize;
use serde_json::{Map, Value};

#[derive(Deserialize)]
struct Fixture {
    conversations: Vec<ConversationCase>,
    expected: std::collections::BTreeMap<String, ModelExpectation>,
    extra_templates: ExtraTemplates,
}

#[derive(Deserialize, Clone)]
struct ConversationCase {
    name: String,
    messages: Vec<Value>,
    #[serde(default)]
    tools: Option<Vec<Value>>,
    add_generation_prompt: bool,
    #[serde(default)]
    extra: Map<String, Value>,
}

#[derive(Deserialize)]
struct ModelExpectation {
    model_file: String,
    template_chars: usize,
    bos_token: String,
    eos_token: String,
    outputs: std::collections::BTreeMap<String, Outcome>,
}

#[derive(Deserialize)]
struct Outcome {
    text: Option<String>,
    error: Option<String>,
}

#[derive(Deserialize)]
struct ExtraTemplates {
    bos_token: String,
    eos_token: String,
    extra: Map<String, Value>,
    cases: std::collections::BTreeMap<String, ExtraCase>,
}

#[derive(Deserialize)]
struct ExtraCase {
    source: String,
    messages: Vec<Value>,
    #[serde(flatten)]
    outcome: Outcome,
}

fn fixture() -> Result<Fixture> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/chat/templates.json");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok(serde_json::from_str(&text)?)
}

fn models_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("SPLASH_MODELS") {
        return dir.into();
    }
    Path::new(&std::env::var_os("HOME").unwrap_or_default()).join(".cache/splash/models")
}

fn check(name: &str, got: chat::Result<String>, want: &Outcome, failures: &mut Vec<String>) {
    match (got, &want.text, &want.error) {
        (Ok(text), Some(expected), _) if &text == expected => {}
        (Ok(text), Some(expected), _) => {
            failures.push(format!("{name}: output differs\n--- got\n{text}\n--- want\n{expected}\n---"))
        }
        (Ok(text), None, Some(error)) => {
            failures.push(format!("{name}: rendered {text:?}, Python failed with {error}"))
        }
        (Err(e), Some(_), _) => failures.push(format!("{name}: {e}")),
        (Err(_), None, Some(_)) => {}
        (_, None, None) => failures.push(format!("{name}: fixture has neither text nor error")),
    }
}

fn input(case: &ConversationCase) -> RenderInput {
    RenderInput {
        messages: case.messages.clone(),
        tools: case.tools.clone(),
        add_generation_prompt: case.add_generation_prompt,
        extra: case.extra.clone(),
    }
}

/// The same case through the typed conversation types: deserialize, convert back to template values, render.
fn typed_input(case: &ConversationCase) -> Result<RenderInput> {
    let messages: Vec<Message> = serde_json::from_value(Value::Array(case.messages.clone()))?;
    let tools: Vec<Tool> = serde_json::from_value(Value::Array(case.tools.clone().unwrap_or_default()))?;
    let conversation = Conversation { messages, tools };
    let mut input = RenderInput::from_conversation(&conversation, case.add_generation_prompt);
    input.extra = case.extra.clone();
    // An explicit empty tool list renders like no tools, but keep the fixture's exact value.
    if case.tools.as_ref().is_some_and(|t| t.is_empty()) {
        input.tools = Some(Vec::new());
    }
    Ok(input)
}

#[test]
fn real_templates_render_like_transformers() -> Result<()> {
    let fx = fixture()?;
    assert!(fx.conversations.len() >= 8);
    let mut failures = Vec::new();
    let mut num_checked = 0;
    for (label, model) in &fx.expected {
        let path = models_dir().join(&model.model_file);
        if !path.exists() {
            if std::env::var("SPLASH_SKIP_MODEL_TESTS").is_ok_and(|v| v == "1") {
                eprintln!("skipping {label}: {} not found", path.display());
                continue;
            }
            bail!("model file {} not found; fetch the models or set SPLASH_SKIP_MODEL_TESTS=1", path.display());
        }
        let file = gguf::GgufFile::open(&path)?;
        let template = ChatTemplate::from_gguf(&file)?;
        assert_eq!(template.source().chars().count(), model.template_chars, "{label}: template length");
        assert_eq!((template.bos_token(), template.eos_token()), (model.bos_token.as_str(), model.eos_token.as_str()));
        for case in &fx.conversations {
            let want =
                model.outputs.get(&case.name).with_context(|| format!("{label}/{}: no expectation", case.name))?;
            check(&format!("{label}/{}", case.name), template.render(&input(case)), want, &mut failures);
            check(&format!("{label}/{} (typed)", case.name), template.render(&typed_input(case)?), want, &mut failures);
            num_checked += 1;
        }
    }
    if !failures.is_empty() {
        bail!("{} of {} renders differ from Python:\n{}", failures.len(), num_checked * 2, failures.join("\n"));
    }
    Ok(())
}

#[test]
fn qwen_15b_keeps_its_doubled_brace_quirk() -> Result<()> {
    let fx = fixture()?;
    let q15 = &fx.expected["qwen2.5-coder-1.5b"].outputs["tools_list"];
    let q05 = &fx.expected["qwen2.5-coder-0.5b"].outputs["tools_list"];
    let (Some(q15), Some(q05)) = (&q15.text, &q05.text) else { bail!("missing outputs") };
    assert!(q15.contains("\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n"));
    assert!(q05.contains("\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"));
    Ok(())
}

#[test]
fn extra_templates_render_like_transformers() -> Result<()> {
    let fx = fixture()?;
    let extra = &fx.extra_templates;
    let mut failures = Vec::new();
    for (name, case) in &extra.cases {
        let template = ChatTemplate::new(case.source.clone(), extra.bos_token.clone(), extra.eos_token.clone())?;
        let input = RenderInput {
            messages: case.messages.clone(),
            tools: None,
            add_generation_prompt: false,
            extra: extra.extra.clone(),
        };
        check(name, template.render(&input), &case.outcome, &mut failures);
    }
    if !failures.is_empty() {
        bail!("{} extra templates differ from Python:\n{}", failures.len(), failures.join("\n"));
    }
    Ok(())
}
