//! Finding tool calls in a model's output while it streams.
//!
//! In: the generated text, delta by delta, and the names of the tools on offer. Out: [`ParseEvent`]s: text that is
//! safe to show and complete [`ToolCall`]s (arguments as a JSON value, `id` left for the API adapter to assign).
//!
//! Recognised forms, one file each (its doc names the model that writes the form, its tests sit beside it):
//! * `hermes.rs`: Hermes / Qwen2.5 tags, `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`;
//! * `qwen3_xml.rs`: Qwen3-Coder XML inside the same tags, `<function=NAME><parameter=KEY>value</parameter></function>`,
//!   values typed by the tool's schema;
//! * `fenced.rs` and `bare.rs`: what the Qwen2.5-Coder models write instead of tags, a fenced code block or a bare
//!   JSON object (or array of them) starting a line; these count only when every call names a declared tool;
//! * `nameless.rs`: with the tools' parameter schemas ([`ToolCallParser::with_schemas`]), a reply that is nothing but
//!   one tool's arguments object, alone or wrapped in an invented tag or a fence;
//! * `tools_block.rs`: a reply that is a `<tools>` block of XML elements (or echoed tool entries), each a call.
//!
//! `json.rs` reads the call objects the JSON forms carry; `signature.rs` holds what a declared tool's arguments may
//! be. This file is the streaming state machine that decides, line by line, which form (if any) the text is in.
//!
//! Text that may still turn into a call (a partial `<tool_call>` tag, an opening fence, a `{` starting a line) is held
//! back until it is decided, so no partial tag or JSON leaks into the text. Once a call has been found, later text
//! that is not another call is dropped and [`ToolCallParser::is_done`] turns true: the caller can stop generating
//! (the small models tend to invent a tool result after their call).

mod bare;
mod fenced;
mod hermes;
mod json;
mod nameless;
pub mod qwen3_xml;
mod signature;
#[cfg(test)]
mod testing;
mod tools_block;

use serde_json::Value;

use crate::conversation::ToolCall;
use json::call_prefix_verdict;
pub use json::{JsonEnd, JsonScanner};
use signature::Signature;

/// The opening tag of the Hermes form (`hermes.rs`).
pub const TAG_OPEN: &str = "<tool_call>";
const TAG_CLOSE: &str = "</tool_call>";
const TOOLS_OPEN: &str = "<tools>";
const TOOLS_CLOSE: &str = "</tools>";
const FENCE: &str = "```";
/// Info strings of a fenced block that may hold a call.
pub const FENCE_LANGS: [&str; 6] = ["", "json", "json5", "tool_call", "tool_code", "tool"];
/// Longest info string considered while waiting for the end of the fence's first line.
pub const MAX_FENCE_INFO_BYTES: usize = 32;
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

    pub(super) fn emit_text(&mut self, text: String, out: &mut Vec<ParseEvent>) {
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
    pub(super) fn release(&mut self, n: usize, out: &mut Vec<ParseEvent>) {
        if n == 0 {
            return;
        }
        let text: String = self.held.drain(..n).collect();
        self.line_start = text.ends_with('\n');
        self.emit_text(text, out);
    }

    pub(super) fn emit_calls(&mut self, calls: Vec<ToolCall>, out: &mut Vec<ParseEvent>) {
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

    /// The candidate in `held` is not a call: release its first character as text and scan the rest again.
    pub(super) fn give_up(&mut self, out: &mut Vec<ParseEvent>) {
        let indent = self.held.len() - self.held.trim_start_matches([' ', '\t']).len();
        let first = self.held[indent..].chars().next().map_or(0, char::len_utf8);
        self.release(indent + first, out);
        self.mode = Mode::Text;
    }
}

/// The length of the tag name at the start of `s` (letters, digits, `_` and `-`), for the wrapper of a call written
/// without its name.
pub(super) fn tag_word_len(s: &str) -> usize {
    s.bytes().take_while(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-')).count()
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;

    #[test]
    fn replies_built_from_call_fragments_split_anywhere_give_the_same_events_and_lose_no_text() {
        const PIECES: [&str; 24] = [
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
            "<function=wait>",
            "<parameter=session_id>\n",
            "\n</parameter>",
            "</function>",
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
    fn plain_text_passes_through() {
        check(
            "Hello, world!\nNo calls here: a < b and {x} too.\n",
            &[text("Hello, world!\nNo calls here: a < b and {x} too.\n")],
        );
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
