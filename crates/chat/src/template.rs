//! [`ChatTemplate`]: renders a model's Jinja chat template exactly as Hugging Face transformers does.
//!
//! In: the template source (usually `tokenizer.chat_template` from a GGUF) and a [`RenderInput`]. Out: the prompt
//! text. The minijinja environment is set up like transformers' `_compile_jinja_template`: `trim_blocks`,
//! `lstrip_blocks`, loop controls, Python string/dict methods (minijinja-contrib's pycompat), transformers' own
//! `tojson`, `raise_exception` and `strftime_now`, and `{{ value }}` printing as Python's `str()`. The context is
//! what `apply_chat_template` passes: `messages`, `tools` (`None` when absent), `documents` (`None`),
//! `add_generation_prompt`, `bos_token`, `eos_token`, plus extra keyword arguments.

use minijinja::value::Value as JinjaValue;
use minijinja::{Environment, ErrorKind};
use serde_json::{Map, Value};

use crate::conversation::Conversation;
use crate::error::{Error, Result};
use crate::python;

const TEMPLATE_NAME: &str = "chat_template";
/// Marks errors raised by the template's own `raise_exception(...)`, to tell them from engine errors.
const RAISED_MARKER: &str = "\u{1}raise_exception\u{1}";
/// Context keys that extra arguments may not replace (transformers would fail with a duplicate keyword).
const RESERVED_KEYS: [&str; 4] = ["messages", "tools", "documents", "add_generation_prompt"];

/// What to render: the conversation as template JSON plus the switches `apply_chat_template` takes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RenderInput {
    /// Messages in OpenAI's shape (`{"role", "content", "tool_calls", ...}`); see
    /// [`Message::to_template_value`](crate::Message::to_template_value).
    pub messages: Vec<Value>,
    /// Tool definitions (`{"type": "function", "function": {...}}`); `None` renders as Python `None`.
    pub tools: Option<Vec<Value>>,
    /// End the prompt with the start of an assistant turn.
    pub add_generation_prompt: bool,
    /// Extra template variables (`enable_thinking`, ...).
    pub extra: Map<String, Value>,
}

impl RenderInput {
    /// The template input of a typed conversation; no tools gives `tools = None`.
    pub fn from_conversation(conversation: &Conversation, add_generation_prompt: bool) -> Self {
        RenderInput {
            messages: conversation.messages.iter().map(|m| m.to_template_value()).collect(),
            tools: (!conversation.tools.is_empty())
                .then(|| conversation.tools.iter().map(|t| t.to_template_value()).collect()),
            add_generation_prompt,
            extra: Map::new(),
        }
    }
}

/// A compiled chat template with the model's BOS/EOS texts. Cheap to share; rendering takes `&self`.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source_chars", &self.source().chars().count())
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish()
    }
}

impl ChatTemplate {
    /// Compiles `source`; syntax errors are reported here.
    pub fn new(source: impl Into<String>, bos_token: impl Into<String>, eos_token: impl Into<String>) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(python::format_value);
        env.add_filter("tojson", python::tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        let source = source.into();
        env.add_template_owned(TEMPLATE_NAME, source.clone()).map_err(|e| Error::Syntax(describe(&e)))?;
        Ok(ChatTemplate { env, source, bos_token: bos_token.into(), eos_token: eos_token.into() })
    }

    /// The template in `tokenizer.chat_template`, with the texts of the BOS and EOS tokens (empty when the file
    /// names none).
    pub fn from_gguf(file: &gguf::GgufFile) -> Result<Self> {
        let source = file.get_str("tokenizer.chat_template")?.ok_or(Error::NoTemplate)?;
        let tokens = file.get_str_array("tokenizer.ggml.tokens")?.unwrap_or_default();
        let token_text = |key: &str| -> Result<String> {
            Ok(file
                .get_u64(key)?
                .and_then(|id| usize::try_from(id).ok())
                .and_then(|id| tokens.get(id))
                .map_or_else(String::new, |t| (*t).to_owned()))
        };
        Self::new(source, token_text("tokenizer.ggml.bos_token_id")?, token_text("tokenizer.ggml.eos_token_id")?)
    }

    /// Another template with this one's BOS and EOS texts: a pack's corrected template replacing the model file's.
    pub fn with_source(&self, source: impl Into<String>) -> Result<Self> {
        Self::new(source, self.bos_token.clone(), self.eos_token.clone())
    }

    /// The template's source text.
    pub fn source(&self) -> &str {
        &self.source
    }

    pub fn bos_token(&self) -> &str {
        &self.bos_token
    }

    pub fn eos_token(&self) -> &str {
        &self.eos_token
    }

    /// Renders the prompt. Tool-call arguments given as JSON strings are parsed first (vLLM's convention; a string
    /// that is not valid JSON stays a string).
    pub fn render(&self, input: &RenderInput) -> Result<String> {
        self.render_with(input, None)
    }

    /// Renders the prompt with every string of the input (messages, tools, extra variables: keys and values at any
    /// depth, tool-call arguments after parsing) replaced by `protect(string)` where it gives one; the template's
    /// own text, `bos_token` and `eos_token` are left alone. With the tokenizer's `protect`, the prompt's control
    /// tokens can then come only from the template (see `tokenizer::Tokenizer::encode_prompt`).
    pub fn render_protected(&self, input: &RenderInput, protect: &dyn Fn(&str) -> Option<String>) -> Result<String> {
        self.render_with(input, Some(protect))
    }

    fn render_with(&self, input: &RenderInput, protect: Option<&dyn Fn(&str) -> Option<String>>) -> Result<String> {
        if let Some(key) = RESERVED_KEYS.iter().find(|k| input.extra.contains_key(**k)) {
            return Err(Error::BadInput(format!("extra template variable {key:?} would replace a fixed one")));
        }
        let mut context = Map::new();
        context.insert("bos_token".into(), Value::from(self.bos_token.as_str()));
        context.insert("eos_token".into(), Value::from(self.eos_token.as_str()));
        for (k, v) in &input.extra {
            let mut v = v.clone();
            if let Some(protect) = protect {
                protect_strings(&mut v, protect);
            }
            context.insert(k.clone(), v);
        }
        let mut messages = Value::Array(input.messages.clone());
        parse_tool_call_arguments(messages.as_array_mut().map_or(&mut [][..], Vec::as_mut_slice));
        let mut tools = input.tools.clone().map_or(Value::Null, Value::Array);
        if let Some(protect) = protect {
            protect_strings(&mut messages, protect);
            protect_strings(&mut tools, protect);
        }
        context.insert("messages".into(), messages);
        context.insert("tools".into(), tools);
        context.insert("documents".into(), Value::Null);
        context.insert("add_generation_prompt".into(), Value::Bool(input.add_generation_prompt));

        let template = self.env.get_template(TEMPLATE_NAME).map_err(|e| Error::Render(describe(&e)))?;
        template.render(JinjaValue::from_serialize(&context)).map_err(|e| match raised_message(&e) {
            Some(message) => Error::Raised(message),
            None => Error::Render(describe(&e)),
        })
    }
}

/// Replaces `tool_calls[].function.arguments` strings that hold valid JSON by the parsed value, in assistant
/// messages (vLLM's `_postprocess_messages`).
fn parse_tool_call_arguments(messages: &mut [Value]) {
    for message in messages {
        if message.get("role").and_then(Value::as_str) != Some("assistant") {
            continue;
        }
        let Some(calls) = message.get_mut("tool_calls").and_then(Value::as_array_mut) else { continue };
        for call in calls {
            let Some(arguments) = call.get_mut("function").and_then(|f| f.get_mut("arguments")) else { continue };
            if let Some(text) = arguments.as_str()
                && let Ok(parsed) = serde_json::from_str::<Value>(text)
            {
                *arguments = parsed;
            }
        }
    }
}

/// Replaces every string in `value` (object keys included) by `protect(string)` where it gives one.
fn protect_strings(value: &mut Value, protect: &dyn Fn(&str) -> Option<String>) {
    match value {
        Value::String(s) => {
            if let Some(p) = protect(s) {
                *s = p;
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| protect_strings(v, protect)),
        Value::Object(map) => {
            let entries = std::mem::take(map);
            for (key, mut v) in entries {
                protect_strings(&mut v, protect);
                map.insert(protect(&key).unwrap_or(key), v);
            }
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

/// `raise_exception(message)`: the template refuses the input (e.g. roles that do not alternate).
fn raise_exception(message: String) -> std::result::Result<JinjaValue, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, format!("{RAISED_MARKER}{message}")))
}

/// `strftime_now(format)`: the local time formatted by a C `strftime` format.
fn strftime_now(format: String) -> std::result::Result<String, minijinja::Error> {
    use std::fmt::Write as _;
    let mut out = String::new();
    write!(out, "{}", chrono::Local::now().format(&format))
        .map_err(|_| minijinja::Error::new(ErrorKind::InvalidOperation, format!("bad strftime format {format:?}")))?;
    Ok(out)
}

fn raised_message(e: &minijinja::Error) -> Option<String> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if let Some(jinja) = err.downcast_ref::<minijinja::Error>()
            && let Some(message) = jinja.detail().and_then(|d| d.strip_prefix(RAISED_MARKER))
        {
            return Some(message.to_owned());
        }
        source = err.source();
    }
    None
}

/// A minijinja error with its location and causes on one line.
fn describe(e: &minijinja::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(err) = source {
        text.push_str(": ");
        text.push_str(&err.to_string());
        source = err.source();
    }
    text
}
