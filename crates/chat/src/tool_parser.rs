//! Finding tool calls in a model's output while it streams.
//!
//! In: the generated text, delta by delta, and the names of the tools on offer. Out: [`ParseEvent`]s: text that is
//! safe to show and complete [`ToolCall`]s (arguments as a JSON value, `id` left for the API adapter to assign).
//!
//! Recognised forms:
//! * Hermes / Qwen2.5 tags: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (several JSON objects in one
//!   tag, a missing closing tag at the end of the output and the doubled braces of the Qwen2.5-Coder-1.5B template
//!   example are accepted);
//! * Qwen3-Coder XML inside the same tags: `<function=NAME><parameter=KEY>value</parameter></function>`;
//! * what the Qwen2.5-Coder models write instead of tags (see `models.md` §11): a fenced code block
//!   (```` ```json ````, ```` ``` ````, ```` ```tool_call ````) holding one call or an array of calls, or a bare JSON
//!   object `{"name": ..., "arguments": ...}` (or array of them) starting a line. These count only when every call
//!   names a declared tool; otherwise the text is released unchanged;
//! * with the tools' parameter schemas ([`ToolCallParser::with_schemas`]), a call written without its name: a reply
//!   that is nothing but one tool's arguments object, alone or wrapped in an invented tag or a fence
//!   (`<commands>\n{"cmd": "printf 'hi' > hello.txt"}\n</commands>`, as Qwen2.5-Coder-0.5B answers Codex about half
//!   the time). It counts only when the object's keys are all parameters of exactly one declared tool and hold all
//!   of that tool's required ones, and nothing but blanks and the wrapper's closing line comes before the end of the
//!   output; the reply is held until then (a reply that starts otherwise is not held for this);
//! * a reply that is a `<tools>` block of XML elements, each a call: `<function name="NAME" arguments='{...}'/>` or
//!   `<NAME key="value" .../>` for a declared tool (attribute values read as in the Qwen3-Coder form). The
//!   Qwen2.5-Coder 1.5B answers so now and then, copying the `<tools>` wrapper its template puts around the tool list
//!   (`<tools>\n  <function name="write_stdin" arguments='{"chars": "hi", ...}'/>\n</tools>` to Codex,
//!   `<tools>\n  <bash command="touch hello.txt" timeout="120000" .../>\n</tools>` to OpenCode). Such a reply is
//!   held while it still reads as such a block, and is text as soon as it does not. Inside the block, with the
//!   tools' schemas, an echo of one tool's entry of the tool list whose `properties` hold values in place of some
//!   parameters' schemas is that tool's call with those values: the same model answered Codex so twice
//!   (`{"type": "function", "function": {"name": "exec_command", ..., "parameters": {"type": "object",
//!   "properties": {"cmd": "printf 'hi\n' > hello.txt", "justification": "<its description>", "login": {...}`);
//!   a parameter's own description copied as its value is left out.
//!
//! Text that may still turn into a call (a partial `<tool_call>` tag, an opening fence, a `{` starting a line) is held
//! back until it is decided, so no partial tag or JSON leaks into the text. Once a call has been found, later text
//! that is not another call is dropped and [`ToolCallParser::is_done`] turns true: the caller can stop generating
//! (the small models tend to invent a tool result after their call).

use serde_json::{Map, Value};

use crate::conversation::ToolCall;

const TAG_OPEN: &str = "<tool_call>";
const TAG_CLOSE: &str = "</tool_call>";
const TOOLS_OPEN: &str = "<tools>";
const TOOLS_CLOSE: &str = "</tools>";
const FENCE: &str = "```";
/// Info strings of a fenced block that may hold a call.
const FENCE_LANGS: [&str; 6] = ["", "json", "json5", "tool_call", "tool_code", "tool"];
/// Longest info string considered while waiting for the end of the fence's first line.
const MAX_FENCE_INFO_BYTES: usize = 32;
/// Longest word of a tag waited for around a call written without its name (`<commands>`).
const MAX_WRAPPER_TAG_BYTES: usize = 32;
/// First keys of a JSON object that may be a call.
const CALL_KEYS: [&str; 4] = ["\"name\"", "\"function\"", "\"tool_name\"", "\"tool\""];

/// What the parser found.
#[derive(Debug, Clone, PartialEq)]
pub enum ParseEvent {
    Text(String),
    ToolCall(ToolCall),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Plain text, watching for the start of a call.
    Text,
    /// Inside `<tool_call>`; `held` is what follows the opening tag.
    Tag,
    /// A fenced block whose content starts with `{` or `[`; `held` starts at the fence's line.
    Fence,
    /// A bare JSON object or array that starts like a call; `held` starts at its line.
    Bare,
    /// The reply may be a call written without its name ([`Signature`]); `held` is the whole reply so far.
    Nameless,
    /// The reply opens with `<tools>` and may be a block of calls as XML elements; `held` is the whole reply so far.
    Elements,
}

/// What a declared tool's arguments may hold, from its parameter schema.
#[derive(Debug, Clone)]
struct Signature {
    name: String,
    /// Each parameter's own schema, by name.
    properties: Map<String, Value>,
    required: Vec<String>,
}

impl Signature {
    fn from_schema(name: &str, schema: &Value) -> Signature {
        Signature {
            name: name.to_owned(),
            properties: schema.get("properties").and_then(Value::as_object).cloned().unwrap_or_default(),
            required: schema
                .get("required")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(|k| k.as_str().map(str::to_owned)).collect())
                .unwrap_or_default(),
        }
    }

    /// The arguments in an echo of this tool's schema whose `properties` hold values in place of some parameters'
    /// schemas (`"cmd": "printf 'hi' > hello.txt"` where the tool declares `"cmd": {"type": "string", ...}`). An
    /// entry that is a schema (the declared one, or any object with a `type` or `description`) or the parameter's
    /// own description copied is no value.
    fn filled_in(&self, properties: &Map<String, Value>) -> Option<Map<String, Value>> {
        let mut args = Map::new();
        for (key, value) in properties {
            let declared = self.properties.get(key)?;
            let is_schema = value == declared
                || value.as_object().is_some_and(|o| o.contains_key("type") || o.contains_key("description"));
            if is_schema || (value.is_string() && declared.get("description") == Some(value)) {
                continue;
            }
            args.insert(key.clone(), value.clone());
        }
        (!args.is_empty() && self.accepts(&args)).then_some(args)
    }

    /// Whether `args` can be this tool's arguments: every key a parameter, every required parameter there.
    fn accepts(&self, args: &Map<String, Value>) -> bool {
        args.keys().all(|k| self.properties.contains_key(k)) && self.required.iter().all(|k| args.contains_key(k))
    }
}

/// Streaming tool-call extraction for one reply.
#[derive(Debug, Clone)]
pub struct ToolCallParser {
    tools: Vec<String>,
    mode: Mode,
    /// Text received and not yet decided.
    held: String,
    /// Whether `held` begins at the start of a line.
    line_start: bool,
    num_calls: usize,
    /// Non-blank text came after a call.
    done: bool,
    /// The declared tools' parameters, for calls written without a name (empty: such calls are not read).
    signatures: Vec<Signature>,
    /// Nothing has ruled out that the reply is a call written without its name.
    nameless_open: bool,
    /// Nothing has ruled out that the reply is a `<tools>` block of calls as XML elements.
    elements_open: bool,
}

/// What a line starting with `{`, `[` or a backtick turned out to be.
#[derive(Debug, PartialEq, Eq)]
enum Line {
    Call(Mode),
    NotCall,
    Undecided,
}

/// Is `candidate` still possibly a call (`Maybe`), surely one (`Yes`) or surely not (`No`)?
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Yes,
    No,
    Maybe,
}

impl ToolCallParser {
    /// A parser accepting calls to `tool_names` only.
    pub fn new<S: Into<String>>(tool_names: impl IntoIterator<Item = S>) -> Self {
        let tools: Vec<String> = tool_names.into_iter().map(Into::into).collect();
        ToolCallParser {
            elements_open: !tools.is_empty(),
            tools,
            mode: Mode::Text,
            held: String::new(),
            line_start: true,
            num_calls: 0,
            done: false,
            signatures: Vec::new(),
            nameless_open: false,
        }
    }

    /// Also reads a reply that is one tool's arguments written without the tool's name (see the module docs), given
    /// each declared tool's name and parameter schema.
    pub fn with_schemas(mut self, tools: &[(String, Value)]) -> Self {
        self.signatures = tools.iter().map(|(name, schema)| Signature::from_schema(name, schema)).collect();
        self.nameless_open = self.signatures.iter().any(|s| !s.properties.is_empty());
        self
    }

    /// Adds generated text; returns what is decided now.
    pub fn push(&mut self, delta: &str) -> Vec<ParseEvent> {
        self.held.push_str(delta);
        let mut out = Vec::new();
        self.drain(&mut out, false);
        out
    }

    /// The output has ended: decides everything still held.
    pub fn finish(&mut self) -> Vec<ParseEvent> {
        let mut out = Vec::new();
        self.drain(&mut out, true);
        if !self.held.is_empty() {
            let rest = std::mem::take(&mut self.held);
            self.emit_text(rest, &mut out);
        }
        self.mode = Mode::Text;
        out
    }

    pub fn num_calls(&self) -> usize {
        self.num_calls
    }

    /// A call was found and the model has gone on to write something else: nothing more will be reported.
    pub fn is_done(&self) -> bool {
        self.done
    }

    fn emit_text(&mut self, text: String, out: &mut Vec<ParseEvent>) {
        if text.is_empty() {
            return;
        }
        if self.num_calls > 0 {
            if !text.trim().is_empty() {
                self.done = true;
            }
            return;
        }
        match out.last_mut() {
            Some(ParseEvent::Text(t)) => t.push_str(&text),
            _ => out.push(ParseEvent::Text(text)),
        }
    }

    /// Emits `self.held[..n]` as text and keeps the rest.
    fn release(&mut self, n: usize, out: &mut Vec<ParseEvent>) {
        if n == 0 {
            return;
        }
        let text: String = self.held.drain(..n).collect();
        self.line_start = text.ends_with('\n');
        self.emit_text(text, out);
    }

    fn emit_calls(&mut self, calls: Vec<ToolCall>, out: &mut Vec<ParseEvent>) {
        if self.done {
            return;
        }
        self.num_calls += calls.len();
        out.extend(calls.into_iter().map(ParseEvent::ToolCall));
    }

    fn drain(&mut self, out: &mut Vec<ParseEvent>, at_end: bool) {
        loop {
            let progressed = match self.mode {
                Mode::Text => self.scan_text(out, at_end),
                Mode::Tag => self.scan_tag(out, at_end),
                Mode::Fence => self.scan_fence(out, at_end),
                Mode::Bare => self.scan_bare(out, at_end),
                Mode::Nameless => self.scan_nameless(out, at_end),
                Mode::Elements => self.scan_elements(out, at_end),
            };
            if !progressed {
                return;
            }
        }
    }

    /// Text mode: releases what cannot start a call and switches mode at the first candidate. Returns whether it
    /// changed mode (so scanning should go on).
    fn scan_text(&mut self, out: &mut Vec<ParseEvent>, at_end: bool) -> bool {
        if self.elements_open {
            let s = self.held.trim_start();
            if s.starts_with(TOOLS_OPEN) {
                self.mode = Mode::Elements;
                return true;
            }
            if !at_end && TOOLS_OPEN.starts_with(s) {
                return false;
            }
            self.elements_open = false;
        }
        if self.nameless_open {
            match self.classify_nameless(at_end) {
                Verdict::Yes => {
                    self.mode = Mode::Nameless;
                    return true;
                }
                Verdict::Maybe => return false,
                Verdict::No => self.nameless_open = false,
            }
        }
        let tag = self.held.find(TAG_OPEN);
        let line = self.first_line_candidate(tag.unwrap_or(self.held.len()));
        match (tag, line) {
            (_, Some(p)) => {
                self.release(p, out);
                self.line_start = true;
                let indent = self.held.len() - self.held.trim_start_matches([' ', '\t']).len();
                match self.classify_line(indent, at_end) {
                    Line::Call(mode) => {
                        self.mode = mode;
                        true
                    }
                    Line::NotCall => {
                        // Release through the candidate's first character and go on scanning.
                        let first = self.held[indent..].chars().next().map_or(0, char::len_utf8);
                        self.release(indent + first, out);
                        true
                    }
                    Line::Undecided => false,
                }
            }
            (Some(t), None) => {
                self.release(t, out);
                self.held.drain(..TAG_OPEN.len());
                self.mode = Mode::Tag;
                true
            }
            (None, None) => {
                let keep = if at_end { 0 } else { self.undecided_tail() };
                self.release(self.held.len() - keep, out);
                false
            }
        }
    }

    /// The first position before `limit` where a line starts (after optional blanks) with `{`, `[` or a backtick.
    fn first_line_candidate(&self, limit: usize) -> Option<usize> {
        let bytes = self.held.as_bytes();
        let mut starts: Vec<usize> = Vec::new();
        if self.line_start {
            starts.push(0);
        }
        starts.extend(self.held.match_indices('\n').map(|(i, _)| i + 1));
        starts.into_iter().filter(|&s| s < limit).find(|&s| {
            let mut i = s;
            while i < bytes.len() && (bytes[i] == b' ' || bytes[i] == b'\t') {
                i += 1;
            }
            i < bytes.len() && matches!(bytes[i], b'{' | b'[' | b'`')
        })
    }

    /// How many bytes at the end of `held` must wait: a proper prefix of `<tool_call>`, or blanks after a newline
    /// (a call may start the line).
    fn undecided_tail(&self) -> usize {
        let tag_prefix = (1..TAG_OPEN.len()).rev().find(|&n| self.held.ends_with(&TAG_OPEN[..n])).unwrap_or(0);
        let last_line = self.held.rfind('\n').map(|i| i + 1).or(self.line_start.then_some(0));
        let blank_line_tail = match last_line {
            Some(l) if self.held[l..].bytes().all(|b| b == b' ' || b == b'\t') => self.held.len() - l,
            _ => 0,
        };
        tag_prefix.max(blank_line_tail)
    }

    /// `held` starts a line whose first non-blank byte (at `indent`) is `{`, `[` or a backtick: does a call start
    /// here? `at_end`: nothing more will come, so what is undecided is not a call.
    fn classify_line(&self, indent: usize, at_end: bool) -> Line {
        let undecided = if at_end { Line::NotCall } else { Line::Undecided };
        let body = &self.held[indent..];
        if body.starts_with('`') {
            if !body.starts_with(FENCE) {
                return if FENCE.starts_with(body) { undecided } else { Line::NotCall };
            }
            let after_fence = &body[FENCE.len()..];
            let Some(nl) = after_fence.find('\n') else {
                return if after_fence.len() > MAX_FENCE_INFO_BYTES { Line::NotCall } else { undecided };
            };
            let lang = after_fence[..nl].trim().to_ascii_lowercase();
            if !FENCE_LANGS.contains(&lang.as_str()) {
                return Line::NotCall;
            }
            // Decided at the first key, as a bare object is: a fenced object that is not a call is text at once,
            // not held until its block closes (after a call, text ends the reply; a block that never closes would
            // otherwise run to the output limit unseen).
            let json = after_fence[nl + 1..].trim_start();
            return match json.as_bytes().first() {
                Some(b'{' | b'[') => match call_prefix_verdict(json) {
                    Verdict::Yes => Line::Call(Mode::Fence),
                    Verdict::Maybe => undecided,
                    Verdict::No => Line::NotCall,
                },
                Some(_) => Line::NotCall,
                None => undecided,
            };
        }
        match call_prefix_verdict(body) {
            Verdict::Yes => Line::Call(Mode::Bare),
            Verdict::Maybe => undecided,
            Verdict::No => Line::NotCall,
        }
    }

    fn scan_tag(&mut self, out: &mut Vec<ParseEvent>, at_end: bool) -> bool {
        let close = self.held.find(TAG_CLOSE);
        let reopen = self.held.find(TAG_OPEN);
        let (end, skip) = match (close, reopen) {
            (Some(c), Some(r)) if r < c => (r, 0),
            (Some(c), _) => (c, TAG_CLOSE.len()),
            (None, Some(r)) => (r, 0),
            (None, None) if at_end => (self.held.len(), 0),
            (None, None) => return false,
        };
        let content: String = self.held.drain(..end).collect();
        self.held.drain(..skip);
        match parse_tag_content(&content, &self.tools) {
            Some(calls) => self.emit_calls(calls, out),
            None => {
                let closing = if skip > 0 { TAG_CLOSE } else { "" };
                self.emit_text(format!("{TAG_OPEN}{content}{closing}"), out);
            }
        }
        self.line_start = false;
        self.mode = Mode::Text;
        true
    }

    fn scan_fence(&mut self, out: &mut Vec<ParseEvent>, at_end: bool) -> bool {
        // held: [blanks] ``` info \n [blanks] JSON [blanks] ```
        let nl = self.held.find('\n').expect("INVARIANT: a fence is classified after its first line");
        let json_start = nl + 1 + (self.held[nl + 1..].len() - self.held[nl + 1..].trim_start().len());
        let Some(json_len) = json_extent(&self.held[json_start..]) else {
            if at_end {
                self.give_up(out);
                return true;
            }
            return false;
        };
        let json_end = json_start + json_len;
        let after = &self.held[json_end..];
        let after_trimmed = after.trim_start();
        let end = if after_trimmed.starts_with(FENCE) {
            json_end + (after.len() - after_trimmed.len()) + FENCE.len()
        } else if at_end && after_trimmed.is_empty() {
            self.held.len()
        } else if !at_end && (after_trimmed.is_empty() || FENCE.starts_with(after_trimmed)) {
            return false;
        } else {
            self.give_up(out);
            return true;
        };
        match parse_calls_json(&self.held[json_start..json_end], &self.tools) {
            Some(calls) => {
                self.held.drain(..end);
                self.emit_calls(calls, out);
                self.line_start = false;
                self.mode = Mode::Text;
            }
            None => self.give_up(out),
        }
        true
    }

    fn scan_bare(&mut self, out: &mut Vec<ParseEvent>, at_end: bool) -> bool {
        let start = self.held.len() - self.held.trim_start_matches([' ', '\t']).len();
        let Some(len) = json_extent(&self.held[start..]) else {
            if at_end {
                self.give_up(out);
                return true;
            }
            return false;
        };
        match parse_calls_json(&self.held[start..start + len], &self.tools) {
            Some(calls) => {
                self.held.drain(..start + len);
                self.emit_calls(calls, out);
                self.line_start = false;
            }
            None => {
                // Not a call after all: release it as text.
                self.release(start + len, out);
            }
        }
        self.mode = Mode::Text;
        true
    }

    /// At the start of the reply: may it be a call written without its name? `Yes` once the arguments object's first
    /// key is a parameter of a declared tool (and not a key that makes an object a named call).
    fn classify_nameless(&self, at_end: bool) -> Verdict {
        let s = self.held.trim_start();
        let verdict = match nameless_object_start(s) {
            Err(v) => v,
            Ok(at) => match first_key(s[at + 1..].trim_start()) {
                None => Verdict::No,
                Some((key, _)) if CALL_KEYS.iter().any(|k| k.trim_matches('"') == key) => Verdict::No,
                Some((key, true)) if self.signatures.iter().any(|t| t.properties.contains_key(key)) => Verdict::Yes,
                Some((key, false))
                    if self.signatures.iter().any(|t| t.properties.keys().any(|p| p.starts_with(key))) =>
                {
                    Verdict::Maybe
                }
                Some(_) => Verdict::No,
            },
        };
        if at_end && verdict == Verdict::Maybe { Verdict::No } else { verdict }
    }

    /// The reply so far is an opening line, an arguments object and perhaps a closing line: waits for the end of
    /// the output, then reads the object as the call of the one tool that accepts it. Anything else after the
    /// object, or no such tool, and the reply is scanned again as ordinary text.
    fn scan_nameless(&mut self, out: &mut Vec<ParseEvent>, at_end: bool) -> bool {
        let lead = self.held.len() - self.held.trim_start().len();
        let start = nameless_object_start(&self.held[lead..]);
        let Ok(at) = start.map(|at| lead + at) else {
            // Not reached: what was classified stays so as the reply grows. Read as ordinary text.
            self.nameless_open = false;
            self.mode = Mode::Text;
            return true;
        };
        let trailer = json_extent(&self.held[at..]).map(|len| (len, closing_line(self.held[at + len..].trim_start())));
        let call = match trailer {
            Some((len, Verdict::Yes)) if at_end => self.nameless_call(&self.held[at..at + len]),
            Some((_, Verdict::Yes | Verdict::Maybe)) | None if !at_end => return false,
            _ => None,
        };
        match call {
            Some(call) => {
                self.held.clear();
                self.emit_calls(vec![call], out);
                self.line_start = false;
            }
            None => self.nameless_open = false,
        }
        self.mode = Mode::Text;
        true
    }

    /// The reply so far opens with `<tools>`: holds it while it reads as a block of calls as XML elements, reads the
    /// calls at the end of the output, and otherwise scans it again as ordinary text.
    fn scan_elements(&mut self, out: &mut Vec<ParseEvent>, at_end: bool) -> bool {
        match elements_block(self.held.trim_start(), &self.tools, &self.signatures, at_end) {
            Err(Verdict::Maybe) if !at_end => return false,
            Ok(calls) => {
                self.held.clear();
                self.emit_calls(calls, out);
                self.line_start = false;
            }
            Err(_) => {}
        }
        self.elements_open = false;
        self.mode = Mode::Text;
        true
    }

    /// `object` as the arguments of the one declared tool that accepts them.
    fn nameless_call(&self, object: &str) -> Option<ToolCall> {
        let Ok(Value::Object(args)) = serde_json::from_str::<Value>(object) else { return None };
        if args.is_empty() {
            return None;
        }
        let mut fits = self.signatures.iter().filter(|t| t.accepts(&args));
        let tool = fits.next()?;
        if fits.next().is_some() {
            return None;
        }
        Some(ToolCall { id: None, name: tool.name.clone(), arguments: Value::Object(args) })
    }

    /// The candidate in `held` is not a call: release its first character as text and scan the rest again.
    fn give_up(&mut self, out: &mut Vec<ParseEvent>) {
        let indent = self.held.len() - self.held.trim_start_matches([' ', '\t']).len();
        let first = self.held[indent..].chars().next().map_or(0, char::len_utf8);
        self.release(indent + first, out);
        self.mode = Mode::Text;
    }
}

/// Does `body` (starting with `{` or `[`) begin like a call object or an array of them?
fn call_prefix_verdict(body: &str) -> Verdict {
    let mut rest = body;
    if let Some(r) = rest.strip_prefix('[') {
        rest = r.trim_start();
        if rest.is_empty() {
            return Verdict::Maybe;
        }
    }
    let Some(r) = rest.strip_prefix('{') else { return Verdict::No };
    let rest = r.trim_start();
    if rest.is_empty() {
        return Verdict::Maybe;
    }
    if CALL_KEYS.iter().any(|k| rest.starts_with(k)) {
        Verdict::Yes
    } else if CALL_KEYS.iter().any(|k| k.starts_with(rest)) {
        Verdict::Maybe
    } else {
        Verdict::No
    }
}

/// The length of the tag name at the start of `s` (letters, digits, `_` and `-`), for the wrapper of a call written
/// without its name.
fn tag_word_len(s: &str) -> usize {
    s.bytes().take_while(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-')).count()
}

/// Where the arguments object of a call written without its name starts in `s` (the reply from its first non-blank
/// byte): after an optional opening line, either a tag of one word (`<commands>`, not `<tool_call>`) or a fence of
/// a JSON-ish language. `Err` while that is unknown (`Maybe`) or when it is not so (`No`).
fn nameless_object_start(s: &str) -> Result<usize, Verdict> {
    let object_line = if let Some(r) = s.strip_prefix('<') {
        let word = tag_word_len(r);
        let Some(line) = r[word..].strip_prefix('>') else {
            return Err(if r.len() == word && word <= MAX_WRAPPER_TAG_BYTES { Verdict::Maybe } else { Verdict::No });
        };
        if word == 0 || TAG_OPEN == &s[..word + 2] {
            return Err(Verdict::No);
        }
        let blanks = line.len() - line.trim_start_matches([' ', '\t', '\r']).len();
        match line[blanks..].chars().next() {
            None => return Err(Verdict::Maybe),
            Some('\n') => 1 + word + 1 + blanks + 1,
            Some(_) => return Err(Verdict::No),
        }
    } else if let Some(r) = s.strip_prefix(FENCE) {
        let Some(nl) = r.find('\n') else {
            return Err(if r.len() > MAX_FENCE_INFO_BYTES { Verdict::No } else { Verdict::Maybe });
        };
        if !FENCE_LANGS.contains(&r[..nl].trim().to_ascii_lowercase().as_str()) {
            return Err(Verdict::No);
        }
        FENCE.len() + nl + 1
    } else if s.starts_with('`') && FENCE.starts_with(s) {
        return Err(Verdict::Maybe);
    } else {
        0
    };
    let rest = &s[object_line..];
    match rest.trim_start().as_bytes().first() {
        None => Err(Verdict::Maybe),
        Some(b'{') => Ok(object_line + rest.len() - rest.trim_start().len()),
        Some(_) => Err(Verdict::No),
    }
}

/// The first key of an object whose `{` came just before `s` (blanks skipped), and whether it is complete (else the
/// part written so far); `None` when the object does not start with a plain key (no escapes).
fn first_key(s: &str) -> Option<(&str, bool)> {
    let Some(r) = s.strip_prefix('"') else {
        return s.is_empty().then_some(("", false));
    };
    match r.find(['"', '\\']) {
        Some(end) if r.as_bytes()[end] == b'"' => Some((&r[..end], true)),
        Some(_) => None,
        None => Some((r, false)),
    }
}

/// What may follow the arguments object of a call written without its name (blanks skipped): nothing, or a line
/// closing its wrapper (`</word>` or a fence), then blanks only. `Yes`: complete; `Maybe`: could still become so.
fn closing_line(s: &str) -> Verdict {
    if s.is_empty() {
        return Verdict::Yes;
    }
    let rest = if let Some(r) = s.strip_prefix(FENCE) {
        r
    } else if let Some(r) = s.strip_prefix("</") {
        let word = tag_word_len(r);
        match r[word..].strip_prefix('>') {
            Some(rest) if word > 0 => rest,
            None if r.len() == word && word <= MAX_WRAPPER_TAG_BYTES => return Verdict::Maybe,
            _ => return Verdict::No,
        }
    } else if FENCE.starts_with(s) || "</".starts_with(s) {
        return Verdict::Maybe;
    } else {
        return Verdict::No;
    };
    if rest.trim().is_empty() { Verdict::Yes } else { Verdict::No }
}

/// The byte length of the JSON object or array at the start of `s` (brackets matched outside strings), or `None`
/// if it is not complete yet (or closes a bracket it never opened).
fn json_extent(s: &str) -> Option<usize> {
    match JsonScanner::default().feed(s.as_bytes()) {
        JsonEnd::Closed(end) => Some(end),
        JsonEnd::Stray(_) | JsonEnd::Open => None,
    }
}

/// Finds the end of a JSON object or array fed a piece at a time: brackets matched outside strings (escapes
/// understood), nothing else checked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JsonScanner {
    depth: usize,
    in_string: bool,
    escaped: bool,
}

/// Where a [`JsonScanner::feed`] stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JsonEnd {
    /// Still inside: feed more.
    Open,
    /// The outermost bracket closes; the value ends before this index of the piece.
    Closed(usize),
    /// A closing bracket with none open, at this index of the piece.
    Stray(usize),
}

impl JsonScanner {
    pub fn feed(&mut self, piece: &[u8]) -> JsonEnd {
        for (i, &b) in piece.iter().enumerate() {
            if self.in_string {
                match b {
                    _ if self.escaped => self.escaped = false,
                    b'\\' => self.escaped = true,
                    b'"' => self.in_string = false,
                    _ => {}
                }
                continue;
            }
            match b {
                b'"' => self.in_string = true,
                b'{' | b'[' => self.depth += 1,
                b'}' | b']' if self.depth == 0 => return JsonEnd::Stray(i),
                b'}' | b']' => {
                    self.depth -= 1;
                    if self.depth == 0 {
                        return JsonEnd::Closed(i + 1);
                    }
                }
                _ => {}
            }
        }
        JsonEnd::Open
    }
}

/// `s`, starting with `<tools>`, as a block of calls written as XML elements: the calls once the block is complete
/// and the output has ended, `Err(Maybe)` while it may still become one, `Err(No)` once it cannot.
fn elements_block(s: &str, tools: &[String], signatures: &[Signature], at_end: bool) -> Result<Vec<ToolCall>, Verdict> {
    let undecided = if at_end { Verdict::No } else { Verdict::Maybe };
    let mut rest = s.strip_prefix(TOOLS_OPEN).ok_or(Verdict::No)?;
    let mut calls = Vec::new();
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            return if at_end && !calls.is_empty() { Ok(calls) } else { Err(undecided) };
        }
        if let Some(after) = rest.strip_prefix(TOOLS_CLOSE) {
            return match (after.trim().is_empty(), calls.is_empty()) {
                (true, false) if at_end => Ok(calls),
                (true, false) => Err(Verdict::Maybe),
                _ => Err(Verdict::No),
            };
        }
        if rest.starts_with("</") {
            return if TOOLS_CLOSE.starts_with(rest) { Err(undecided) } else { Err(Verdict::No) };
        }
        if rest.starts_with('{') && !signatures.is_empty() {
            let len = json_extent(rest).ok_or(undecided)?;
            calls.push(filled_in_schema_call(&rest[..len], signatures).ok_or(Verdict::No)?);
            rest = &rest[len..];
            continue;
        }
        let (element, len) = xml_element(rest).map_err(|v| if v == Verdict::Maybe { undecided } else { v })?;
        calls.push(element_call(element, tools).ok_or(Verdict::No)?);
        rest = &rest[len..];
    }
}

/// `object`, an entry of the tool list (`{"type": "function", "function": {"name", "parameters"}}` or the inner
/// object alone) echoed with values in some of its `properties`: the call with those values ([`Signature::filled_in`]).
fn filled_in_schema_call(object: &str, signatures: &[Signature]) -> Option<ToolCall> {
    let Ok(Value::Object(entry)) = serde_json::from_str::<Value>(object) else { return None };
    let function = match entry.get("function") {
        Some(Value::Object(f)) => f,
        _ => &entry,
    };
    let name = function.get("name")?.as_str()?;
    let properties = function.get("parameters")?.get("properties")?.as_object()?;
    let tool = signatures.iter().find(|t| t.name == name)?;
    let arguments = tool.filled_in(properties)?;
    Some(ToolCall { id: None, name: name.to_owned(), arguments: Value::Object(arguments) })
}

/// An XML element's name and attributes.
type Element<'a> = (&'a str, Vec<(&'a str, String)>);

/// One element at the start of `s`: `<NAME key="value" .../>` or `<NAME ...></NAME>` (no content). Returns its
/// name, its attributes (values with XML's five entities decoded) and its length; `Err(Maybe)` while incomplete.
fn xml_element(s: &str) -> Result<(Element<'_>, usize), Verdict> {
    let r = s.strip_prefix('<').ok_or(Verdict::No)?;
    let word = tag_word_len(r);
    if word == 0 {
        return Err(if r.is_empty() { Verdict::Maybe } else { Verdict::No });
    }
    let name = &r[..word];
    let mut pos = 1 + word;
    let mut attrs = Vec::new();
    loop {
        let rest = &s[pos..];
        let blanks = rest.len() - rest.trim_start().len();
        let rest = &rest[blanks..];
        if rest.is_empty() {
            return Err(Verdict::Maybe);
        }
        if rest.starts_with("/>") {
            return Ok(((name, attrs), pos + blanks + 2));
        }
        if rest == "/" {
            return Err(Verdict::Maybe);
        }
        if let Some(after) = rest.strip_prefix('>') {
            // Only an empty element: its closing tag follows, blanks aside.
            let inner = after.trim_start();
            let close = format!("</{name}>");
            if !inner.is_empty() && !inner.starts_with(&close) && !close.starts_with(inner) {
                return Err(Verdict::No);
            }
            if !inner.starts_with(&close) {
                return Err(Verdict::Maybe);
            }
            let end = pos + blanks + 1 + (after.len() - inner.len()) + close.len();
            return Ok(((name, attrs), end));
        }
        if blanks == 0 {
            return Err(Verdict::No);
        }
        let key_len = tag_word_len(rest);
        let after_key = &rest[key_len..];
        if after_key.is_empty() {
            return Err(Verdict::Maybe);
        }
        let value = after_key.strip_prefix('=').ok_or(Verdict::No)?;
        let quote = match value.chars().next() {
            None => return Err(Verdict::Maybe),
            Some(q @ ('"' | '\'')) => q,
            Some(_) => return Err(Verdict::No),
        };
        if key_len == 0 {
            return Err(Verdict::No);
        }
        let body = &value[1..];
        let end = body.find(quote).ok_or(Verdict::Maybe)?;
        attrs.push((&rest[..key_len], xml_unescape(&body[..end])));
        pos += blanks + key_len + 1 + 1 + end + 1;
    }
}

/// XML's five predefined entities.
fn xml_unescape(s: &str) -> String {
    s.replace("&quot;", "\"").replace("&apos;", "'").replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
}

/// An element of a `<tools>` block as a call: `<function name="NAME" arguments='{...}'/>` (or with the arguments
/// as the other attributes), or `<NAME key="value" .../>`, for a declared tool.
fn element_call((tag, mut attrs): Element<'_>, tools: &[String]) -> Option<ToolCall> {
    let name = if tag == "function" {
        let i = attrs.iter().position(|(k, _)| *k == "name")?;
        attrs.remove(i).1
    } else {
        tag.to_owned()
    };
    if !tools.contains(&name) {
        return None;
    }
    let mut arguments = Map::new();
    if let Some(i) = attrs.iter().position(|(k, _)| *k == "arguments") {
        if attrs.len() > 1 {
            return None;
        }
        let Ok(Value::Object(o)) = serde_json::from_str::<Value>(&attrs[i].1) else { return None };
        arguments = o;
    } else {
        for (k, v) in attrs {
            arguments.insert(k.to_owned(), parameter_value(&v));
        }
    }
    Some(ToolCall { id: None, name, arguments: Value::Object(arguments) })
}

/// A parameter written as text: JSON when it parses as a number, boolean, object, ... ; otherwise the string.
fn parameter_value(raw: &str) -> Value {
    match serde_json::from_str::<Value>(raw) {
        Ok(v) if !v.is_string() => v,
        _ => Value::String(raw.to_owned()),
    }
}

/// The calls inside one `<tool_call>` tag: JSON objects (one or several, or an array), or the XML form.
fn parse_tag_content(content: &str, tools: &[String]) -> Option<Vec<ToolCall>> {
    let text = content.trim();
    if text.starts_with("<function=") {
        return parse_xml_call(text, tools).map(|c| vec![c]);
    }
    if let Some(calls) = parse_json_values(text, tools) {
        return Some(calls);
    }
    // The Qwen2.5-Coder-1.5B template shows the call with doubled braces; the model may copy them.
    let inner = text.strip_prefix('{')?.strip_suffix('}')?;
    parse_json_values(inner.trim(), tools)
}

/// One or more JSON values, one after another, each a call or an array of calls.
fn parse_json_values(text: &str, tools: &[String]) -> Option<Vec<ToolCall>> {
    let mut calls = Vec::new();
    for value in serde_json::Deserializer::from_str(text).into_iter::<Value>() {
        calls.extend(calls_from_value(value.ok()?, tools)?);
    }
    (!calls.is_empty()).then_some(calls)
}

fn parse_calls_json(text: &str, tools: &[String]) -> Option<Vec<ToolCall>> {
    calls_from_value(serde_json::from_str(text).ok()?, tools)
}

fn calls_from_value(value: Value, tools: &[String]) -> Option<Vec<ToolCall>> {
    match value {
        Value::Array(items) if !items.is_empty() => {
            items.into_iter().map(|v| call_from_object(v, tools)).collect::<Option<Vec<_>>>()
        }
        Value::Object(_) => call_from_object(value, tools).map(|c| vec![c]),
        _ => None,
    }
}

/// `{"name", "arguments"}` and its common variants (`parameters`, a nested `function` object, arguments as a JSON
/// string), for a declared tool only and with no other keys than `type` and `id`.
fn call_from_object(value: Value, tools: &[String]) -> Option<ToolCall> {
    let Value::Object(mut obj) = value else { return None };
    let mut function = match obj.remove("function") {
        Some(Value::Object(f)) => f,
        Some(Value::String(name)) => Map::from_iter([("name".to_owned(), Value::String(name))]),
        Some(_) => return None,
        None => Map::new(),
    };
    let name = ["name", "tool_name", "tool"]
        .iter()
        .find_map(|k| function.remove(*k).or_else(|| obj.remove(*k)).and_then(|v| v.as_str().map(str::to_owned)))?;
    if !tools.contains(&name) {
        return None;
    }
    let arguments = ["arguments", "parameters", "args", "input"]
        .iter()
        .find_map(|k| function.remove(*k).or_else(|| obj.remove(*k)))
        .unwrap_or_else(|| Value::Object(Map::new()));
    // Other keys (an invented `"result"`, ...) mean this is not a call.
    if obj.keys().chain(function.keys()).any(|k| k != "type" && k != "id") {
        return None;
    }
    let arguments = match arguments {
        Value::String(s) => match serde_json::from_str::<Value>(&s) {
            Ok(v @ Value::Object(_)) => v,
            _ => return None,
        },
        Value::Object(o) => Value::Object(o),
        Value::Null => Value::Object(Map::new()),
        _ => return None,
    };
    Some(ToolCall { id: None, name, arguments })
}

/// Qwen3-Coder's form: `<function=NAME>` then `<parameter=KEY>value</parameter>` entries, then `</function>`.
/// Values that parse as JSON (numbers, booleans, objects, ...) become JSON; anything else is a string.
fn parse_xml_call(text: &str, tools: &[String]) -> Option<ToolCall> {
    let rest = text.strip_prefix("<function=")?;
    let close = rest.find('>')?;
    let name = rest[..close].trim().to_owned();
    if !tools.contains(&name) {
        return None;
    }
    let mut body = &rest[close + 1..];
    if let Some(end) = body.find("</function>") {
        body = &body[..end];
    }
    let mut arguments = Map::new();
    while let Some(start) = body.find("<parameter=") {
        let after = &body[start + "<parameter=".len()..];
        let key_end = after.find('>')?;
        let key = after[..key_end].trim().to_owned();
        let value_text = &after[key_end + 1..];
        let value_end = ["</parameter>", "<parameter="].iter().filter_map(|m| value_text.find(m)).min();
        let value_end = value_end.unwrap_or(value_text.len());
        let raw = value_text[..value_end].strip_prefix('\n').unwrap_or(&value_text[..value_end]);
        let raw = raw.strip_suffix('\n').unwrap_or(raw);
        arguments.insert(key, parameter_value(raw));
        body = &value_text[value_end..];
        body = body.strip_prefix("</parameter>").unwrap_or(body);
    }
    Some(ToolCall { id: None, name, arguments: Value::Object(arguments) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_scanner_finds_the_end_across_pieces() {
        let text = r#"{"a": "x}\"]", "b": [1, {"c": 2}]} tail"#;
        let end = text.find(" tail").unwrap();
        // Every split into two pieces gives the same end.
        for cut in 0..=text.len() {
            let mut s = JsonScanner::default();
            let got = match s.feed(&text.as_bytes()[..cut]) {
                JsonEnd::Closed(e) => e,
                JsonEnd::Open => match s.feed(&text.as_bytes()[cut..]) {
                    JsonEnd::Closed(e) => cut + e,
                    other => panic!("cut {cut}: {other:?}"),
                },
                JsonEnd::Stray(i) => panic!("cut {cut}: stray at {i}"),
            };
            assert_eq!(got, end, "cut {cut}");
        }
        assert_eq!(JsonScanner::default().feed(b"} {"), JsonEnd::Stray(0));
        assert_eq!(json_extent("[1, 2"), None);
        assert_eq!(json_extent("]"), None);
    }
    use serde_json::json;

    fn tools() -> Vec<String> {
        vec!["get_weather".into(), "bash".into()]
    }

    /// Feeds `text` in pieces split at `cuts` (byte offsets on char boundaries) and returns the merged events.
    fn run_split(text: &str, cuts: &[usize]) -> (Vec<ParseEvent>, bool) {
        run_split_with(ToolCallParser::new(tools()), text, cuts)
    }

    fn run_split_with(mut p: ToolCallParser, text: &str, cuts: &[usize]) -> (Vec<ParseEvent>, bool) {
        let mut events = Vec::new();
        let mut last = 0;
        for &c in cuts.iter().chain(std::iter::once(&text.len())) {
            events.extend(p.push(&text[last..c]));
            last = c;
        }
        events.extend(p.finish());
        (merge(events), p.is_done())
    }

    fn merge(events: Vec<ParseEvent>) -> Vec<ParseEvent> {
        let mut out: Vec<ParseEvent> = Vec::new();
        for e in events {
            match (out.last_mut(), e) {
                (Some(ParseEvent::Text(a)), ParseEvent::Text(b)) => a.push_str(&b),
                (_, e) => out.push(e),
            }
        }
        out
    }

    fn call(name: &str, arguments: Value) -> ParseEvent {
        ParseEvent::ToolCall(ToolCall { id: None, name: name.into(), arguments })
    }

    fn text(s: &str) -> ParseEvent {
        ParseEvent::Text(s.into())
    }

    /// The same result for the whole text at once, for every single split point and byte by byte; partial markup
    /// never shows up in a text event before it is decided.
    fn check(input: &str, expected: &[ParseEvent]) {
        check_with(&|| ToolCallParser::new(tools()), input, expected);
    }

    fn check_with(parser: &dyn Fn() -> ToolCallParser, input: &str, expected: &[ParseEvent]) {
        let boundaries: Vec<usize> = (1..input.len()).filter(|&i| input.is_char_boundary(i)).collect();
        assert_eq!(run_split_with(parser(), input, &[]).0, expected, "whole input {input:?}");
        for &b in &boundaries {
            assert_eq!(run_split_with(parser(), input, &[b]).0, expected, "split at {b} of {input:?}");
        }
        assert_eq!(run_split_with(parser(), input, &boundaries).0, expected, "char by char {input:?}");
    }

    /// Codex's two shell tools (trimmed schemas of Codex 0.171), and a tool whose parameters overlap them.
    fn codex_parser() -> ToolCallParser {
        let tools = [
            (
                "exec_command",
                json!({"type": "object", "properties": {"cmd": {}, "workdir": {}, "yield_time_ms": {}}, "required": ["cmd"]}),
            ),
            (
                "write_stdin",
                json!({"type": "object", "properties": {"session_id": {}, "chars": {}, "yield_time_ms": {}}, "required": ["session_id"]}),
            ),
            ("wait", json!({"type": "object", "properties": {"session_id": {}, "yield_time_ms": {}}})),
        ];
        let tools: Vec<(String, Value)> = tools.into_iter().map(|(n, s)| (n.to_owned(), s)).collect();
        ToolCallParser::new(tools.iter().map(|t| t.0.clone())).with_schemas(&tools)
    }

    #[test]
    fn a_reply_that_is_one_tools_arguments_is_its_call() {
        let exec = call("exec_command", json!({"cmd": "printf 'hi' > hello.txt"}));
        // The forms Qwen2.5-Coder-0.5B wrote for Codex: an invented tag, closed by a fence or by the tag.
        for input in [
            "<commands>\n{\"cmd\": \"printf 'hi' > hello.txt\"}\n```",
            "<commands>\n{\"cmd\": \"printf 'hi' > hello.txt\"}\n</commands>\n",
            "{\"cmd\": \"printf 'hi' > hello.txt\"}",
            "\n```json\n{\"cmd\": \"printf 'hi' > hello.txt\"}\n```\n",
        ] {
            check_with(&codex_parser, input, std::slice::from_ref(&exec));
        }
        check_with(
            &codex_parser,
            "{\"session_id\": 3, \"chars\": \"y\\n\"}",
            &[call("write_stdin", json!({"session_id": 3, "chars": "y\n"}))],
        );
        // A long parameter name is waited for to its end.
        let long = || {
            let tools = [("list".to_owned(), json!({"properties": {"directory_to_list_with_every_hidden_file": {}}}))];
            ToolCallParser::new(["list"]).with_schemas(&tools)
        };
        let input = "{\"directory_to_list_with_every_hidden_file\": \"src\"}";
        check_with(&long, input, &[call("list", json!({"directory_to_list_with_every_hidden_file": "src"}))]);
        // Held to the end of the output: what follows could still make it text.
        let mut p = codex_parser();
        assert!(p.push("<commands>\n{\"cmd\": \"ls\"}\n</commands>\n").is_empty());
        assert_eq!(p.finish(), vec![call("exec_command", json!({"cmd": "ls"}))]);
        // Named calls are read as before.
        check_with(
            &codex_parser,
            "<tool_call>\n{\"name\": \"exec_command\", \"arguments\": {\"cmd\": \"ls\"}}\n</tool_call>",
            &[call("exec_command", json!({"cmd": "ls"}))],
        );
    }

    #[test]
    fn a_tools_block_of_xml_elements_is_its_calls() {
        // Qwen2.5-Coder-1.5B's answers to Codex and OpenCode (e2e rounds T7bqhB and ZXZybX, 2026-12-01).
        let input = "<tools>\n  <function name=\"write_stdin\" arguments='{\"chars\": \"hi\", \"session_id\": null, \"yield_time_ms\": 250}'/>\n</tools>";
        let want = call("write_stdin", json!({"chars": "hi", "session_id": null, "yield_time_ms": 250}));
        check_with(&codex_parser, input, &[want]);
        let input = "<tools>\n  <bash command=\"touch hello.txt\" timeout=\"120000\" description=\"Creates &quot;hello.txt&quot;\"/>\n</tools>\n";
        let want = call(
            "bash",
            json!({"command": "touch hello.txt", "timeout": 120000, "description": "Creates \"hello.txt\""}),
        );
        check(input, &[want]);
        // Several elements; an empty element closed by its tag; arguments as attributes; no `</tools>` at the end.
        let input = "<tools>\n<get_weather city='Paris'></get_weather>\n<function name=\"bash\" command=\"ls -a\"/>";
        check(input, &[call("get_weather", json!({"city": "Paris"})), call("bash", json!({"command": "ls -a"}))]);
        // Held to the end of the output: what follows could still make it text.
        let mut p = ToolCallParser::new(tools());
        assert!(p.push("<tools>\n  <bash command=\"ls\"/>\n</tools>\n").is_empty());
        assert_eq!(p.finish(), vec![call("bash", json!({"command": "ls"}))]);
    }

    #[test]
    fn an_echoed_tool_entry_with_values_in_its_properties_is_the_call() {
        let exec = json!({"type": "object", "properties": {
            "cmd": {"type": "string", "description": "Shell command to execute."},
            "justification": {"type": "string", "description": "User-facing approval question; omit otherwise."},
            "login": {"type": "boolean", "description": "Request login-shell startup."}},
            "required": ["cmd"], "additionalProperties": false});
        let parser = || {
            let tools = [("exec_command".to_owned(), exec.clone()), ("bash".to_owned(), json!({"properties": {}}))];
            ToolCallParser::new(["exec_command", "bash"]).with_schemas(&tools)
        };
        // Qwen2.5-Coder-1.5B's answer to Codex in e2e rounds mjag96 and zGItad (trimmed): the tool list's entry for
        // exec_command with the command in place of `cmd`'s schema and `justification`'s description as its value.
        let echo = |properties: &str| {
            format!(
                "<tools>\n{{\"type\": \"function\", \"function\": {{\"name\": \"exec_command\", \"description\": \"Runs a command.\", \"parameters\": {{\"type\": \"object\", \"properties\": {{{properties}}}, \"required\": [\"cmd\"], \"additionalProperties\": false}}}}}}\n</tools>"
            )
        };
        let input = echo(
            "\"cmd\": \"printf 'hi\\\\n' > hello.txt\", \"justification\": \"User-facing approval question; omit otherwise.\", \"login\": {\"type\": \"boolean\", \"description\": \"Request login-shell startup.\"}",
        );
        check_with(&parser, &input, &[call("exec_command", json!({"cmd": "printf 'hi\\n' > hello.txt"}))]);
        // Without the wrapper's entry type, and a value for a boolean.
        let input = "<tools>\n{\"name\": \"exec_command\", \"parameters\": {\"properties\": {\"cmd\": \"ls\", \"login\": true}}}";
        check_with(&parser, input, &[call("exec_command", json!({"cmd": "ls", "login": true}))]);
        // A plain echo (no value), a value for a parameter the tool does not have, a required parameter missing, an
        // undeclared tool: text.
        for input in [
            echo("\"cmd\": {\"type\": \"string\", \"description\": \"Shell command to execute.\"}"),
            echo("\"cmd\": \"ls\", \"color\": \"red\""),
            echo("\"login\": true"),
            echo("\"cmd\": \"ls\"").replace("exec_command", "python"),
        ] {
            check_with(&parser, &input, &[text(&input)]);
        }
    }

    #[test]
    fn a_tools_block_that_is_not_only_calls_is_text() {
        for input in [
            // The tool list echoed back; an undeclared tool; prose inside the block or after it; an element with
            // content; `arguments` that is not an object; an unquoted value; no element; no block.
            "<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"bash\"}}\n</tools>",
            "<tools>\n  <python code=\"print(1)\"/>\n</tools>",
            "<tools>\n  <bash command=\"ls\"/>\n  That lists the files.\n</tools>",
            "<tools>\n  <bash command=\"ls\"/>\n</tools>\nDone.",
            "<tools><bash>ls</bash></tools>",
            "<tools><function name=\"bash\" arguments='[1]'/></tools>",
            "<tools><bash command=ls/></tools>",
            "<tools>\n</tools>",
            "<tools>",
            "<toolsets>a</toolsets>",
        ] {
            check(input, &[text(input)]);
        }
        // An echo of the tool list is released at its first `{`, not held to the end.
        let mut p = ToolCallParser::new(tools());
        assert_eq!(merge(p.push("<tools>\n{\"type\"")), vec![text("<tools>\n{\"type\"")]);
        // A tagged call inside the block is read as such.
        let input =
            "<tools>\n<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call>\n</tools>";
        check(input, &[text("<tools>\n"), call("bash", json!({"command": "ls"}))]);
    }

    #[test]
    fn replies_built_from_call_fragments_split_anywhere_give_the_same_events_and_lose_no_text() {
        const PIECES: [&str; 20] = [
            "<commands>",
            "</commands>",
            "\n",
            " ",
            "```",
            "```json\n",
            "{\"cmd\": \"ls\"}",
            "{\"session_id\": 1}",
            "{\"name\": \"bash\", \"arguments\": {}}",
            "<tool_call>",
            "</tool_call>",
            "{",
            "}",
            "\"",
            "Done é",
            "{\"cmd\"",
            "<tools>",
            "</tools>",
            "<exec_command cmd=\"ls\"/>",
            "<function name=\"wait\" arguments='{}'/>",
        ];
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..3000 {
            let mut input = String::new();
            for _ in 0..1 + state % 6 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                input.push_str(PIECES[(state >> 32) as usize % PIECES.len()]);
            }
            let (whole, _) = run_split_with(codex_parser(), &input, &[]);
            let boundaries: Vec<usize> = (1..input.len()).filter(|&i| input.is_char_boundary(i)).collect();
            assert_eq!(run_split_with(codex_parser(), &input, &boundaries).0, whole, "char by char {input:?}");
            for &b in &boundaries {
                assert_eq!(run_split_with(codex_parser(), &input, &[b]).0, whole, "split at {b} of {input:?}");
            }
            if !whole.iter().any(|e| matches!(e, ParseEvent::ToolCall(_))) {
                let out: String =
                    whole.iter().map(|e| if let ParseEvent::Text(t) = e { t.as_str() } else { "" }).collect();
                assert_eq!(out, input);
            }
        }
    }

    #[test]
    fn arguments_that_are_not_the_whole_reply_or_fit_no_single_tool_are_text() {
        for input in [
            // Prose after the object, or before it.
            "{\"cmd\": \"ls\"}\nThat lists the files.",
            "Run this:\n{\"cmd\": \"ls\"}",
            "<commands>\n{\"cmd\": \"ls\"}\n</commands>\nDone.",
            // A key no tool has, a required parameter missing, parameters two tools share, no keys at all.
            "{\"cmd\": \"ls\", \"color\": true}",
            "{\"chars\": \"y\"}",
            "{\"session_id\": 3, \"yield_time_ms\": 5}",
            "{}",
            // The first key is no parameter, or the wrapper is not one tag or a JSON fence.
            "{\"city\": \"Paris\"}",
            "<b>bold</b>\n{\"cmd\": \"ls\"}",
            "```python\n{\"cmd\": \"ls\"}\n```",
            "<tool_call>\n{\"cmd\": \"ls\"}\n</tool_call>",
        ] {
            check_with(&codex_parser, input, &[text(input)]);
        }
        // Text that cannot start such a call is not held for it.
        let mut p = codex_parser();
        assert_eq!(p.push("Sure"), vec![text("Sure")]);
        let mut p = codex_parser();
        assert_eq!(p.push("{\"city\": 1"), vec![text("{\"city\": 1")]);
        let mut p = codex_parser();
        assert_eq!(merge(p.push("<div>\n<p>")), vec![text("<div>\n<p>")]);
    }

    #[test]
    fn plain_text_passes_through() {
        check(
            "Hello, world!\nNo calls here: a < b and {x} too.\n",
            &[text("Hello, world!\nNo calls here: a < b and {x} too.\n")],
        );
    }

    #[test]
    fn tagged_call() {
        let input = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        check(input, &[call("get_weather", json!({"city": "Paris"}))]);
    }

    #[test]
    fn text_then_tagged_calls_then_junk() {
        let input = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call>\n{\"result\": 42}";
        check(
            input,
            &[
                text("Let me check.\n"),
                call("get_weather", json!({"city": "Paris"})),
                call("bash", json!({"command": "ls"})),
            ],
        );
        assert!(run_split(input, &[]).1, "text after the calls marks the parser done");
    }

    #[test]
    fn tag_without_closing_at_the_end() {
        check(
            "<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"ls -la\"}}\n",
            &[call("bash", json!({"command": "ls -la"}))],
        );
    }

    #[test]
    fn doubled_braces_and_string_arguments() {
        check(
            "<tool_call>\n{{\"name\": \"bash\", \"arguments\": {\"command\": \"pwd\"}}}\n</tool_call>",
            &[call("bash", json!({"command": "pwd"}))],
        );
        check(
            "<tool_call>{\"name\": \"bash\", \"arguments\": \"{\\\"command\\\": \\\"pwd\\\"}\"}</tool_call>",
            &[call("bash", json!({"command": "pwd"}))],
        );
    }

    #[test]
    fn unknown_tool_in_tags_stays_text() {
        let input = "<tool_call>{\"name\": \"nope\", \"arguments\": {}}</tool_call> ok";
        check(input, &[text(input)]);
    }

    #[test]
    fn fenced_json_call() {
        let input = "```json\n{\n  \"name\": \"get_weather\",\n  \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}\n}\n```";
        check(input, &[call("get_weather", json!({"city": "Paris", "unit": "celsius"}))]);
        let input = "Sure.\n```\n[{\"name\": \"bash\", \"arguments\": {\"command\": \"ls\"}}, {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}]\n```\n";
        check(
            input,
            &[text("Sure.\n"), call("bash", json!({"command": "ls"})), call("get_weather", json!({"city": "Oslo"}))],
        );
    }

    #[test]
    fn code_blocks_that_are_not_calls_pass_through() {
        let input = "Here:\n```python\nprint({'a': 1})\n```\nand\n```json\n{\"name\": \"not_a_tool\", \"arguments\": {}}\n```\nend";
        check(input, &[text(input)]);
        let input = "```json\n{\"a\": [1, 2, {\"b\": \"}\"}]}\n```\n";
        check(input, &[text(input)]);
    }

    #[test]
    fn fenced_json_that_is_not_a_call_is_decided_at_its_first_key() {
        // Released while the block is still open...
        let open = "Result:\n```json\n{\"path\": \"a.txt\", \"content\": \"never closed";
        let mut p = ToolCallParser::new(tools());
        assert_eq!(merge(p.push(open)), vec![text(open)]);
        // ... and after a call it ends the reply at once.
        let mut p = ToolCallParser::new(tools());
        let events = p.push("<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call>\n");
        assert_eq!(events, vec![call("bash", json!({"command": "ls"}))]);
        assert!(p.push("```json\n{\"output\": \"an invented result that goes on").is_empty());
        assert!(p.is_done());
        // A fenced call still waits for its first key.
        let mut p = ToolCallParser::new(tools());
        assert!(p.push("```json\n{\n  \"na").is_empty());
    }

    #[test]
    fn bare_json_call() {
        let input = "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"note\": \"a } in a string\"}}";
        check(input, &[call("get_weather", json!({"city": "Paris", "note": "a } in a string"}))]);
        let input = "I will call it.\n  {\"function\": {\"name\": \"bash\", \"parameters\": {\"command\": \"ls\"}}}\n{\"name\": \"bash\", \"result\": \"invented\"}";
        check(input, &[text("I will call it.\n"), call("bash", json!({"command": "ls"}))]);
    }

    #[test]
    fn json_that_is_not_a_call_passes_through() {
        let input = "{\"city\": \"Paris\"}\n[1, 2, 3]\n{\"name\": \"someone\", \"age\": 3}\n{\"na";
        check(input, &[text(input)]);
        // Braces mid-line are never candidates.
        check("x = {\"name\": \"bash\"}", &[text("x = {\"name\": \"bash\"}")]);
    }

    #[test]
    fn qwen3_coder_xml_call() {
        let input = "<tool_call>\n<function=bash>\n<parameter=command>\nls -la /tmp\n</parameter>\n<parameter=timeout>\n30\n</parameter>\n</function>\n</tool_call>";
        check(input, &[call("bash", json!({"command": "ls -la /tmp", "timeout": 30}))]);
    }

    #[test]
    fn partial_tag_at_the_end_is_released() {
        check("a <tool_ca", &[text("a <tool_ca")]);
        check("a <tool_call", &[text("a <tool_call")]);
    }

    #[test]
    fn prefilled_tag_continues() {
        // The API prefills `<tool_call>\n{"name": "` when a call is required; the model writes the rest.
        let mut p = ToolCallParser::new(tools());
        assert!(p.push("<tool_call>\n{\"name\": \"").is_empty());
        let mut events = p.push("bash\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call>");
        events.extend(p.finish());
        assert_eq!(events, vec![call("bash", json!({"command": "ls"}))]);
    }

    #[test]
    fn text_is_not_held_longer_than_needed() {
        let mut p = ToolCallParser::new(tools());
        assert_eq!(p.push("Hello there"), vec![text("Hello there")]);
        assert_eq!(p.push(" <tool"), vec![text(" ")]);
        assert_eq!(p.push("box> x\n  "), vec![text("<toolbox> x\n")]);
        assert_eq!(p.push("y"), vec![text("  y")]);
    }

    #[test]
    fn multibyte_text_survives_every_split() {
        check("héllo → 世界 🎉\n{\"名\": 1}\n", &[text("héllo → 世界 🎉\n{\"名\": 1}\n")]);
    }
}
