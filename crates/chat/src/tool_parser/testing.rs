//! Test helpers shared by the forms' tests: feed a reply split anywhere and compare the events.

use serde_json::{Value, json};

use super::{ParseEvent, ToolCallParser};
use crate::conversation::ToolCall;

pub(super) fn tools() -> Vec<String> {
    vec!["get_weather".into(), "bash".into()]
}

/// Feeds `text` in pieces split at `cuts` (byte offsets on char boundaries) and returns the merged events.
pub(super) fn run_split(text: &str, cuts: &[usize]) -> (Vec<ParseEvent>, bool) {
    run_split_with(ToolCallParser::new(tools()), text, cuts)
}

pub(super) fn run_split_with(mut p: ToolCallParser, text: &str, cuts: &[usize]) -> (Vec<ParseEvent>, bool) {
    let mut events = Vec::new();
    let mut last = 0;
    for &c in cuts.iter().chain(std::iter::once(&text.len())) {
        events.extend(p.push(&text[last..c]));
        last = c;
    }
    events.extend(p.finish());
    (merge(events), p.is_done())
}

pub(super) fn merge(events: Vec<ParseEvent>) -> Vec<ParseEvent> {
    let mut out: Vec<ParseEvent> = Vec::new();
    for e in events {
        match (out.last_mut(), e) {
            (Some(ParseEvent::Text(a)), ParseEvent::Text(b)) => a.push_str(&b),
            (_, e) => out.push(e),
        }
    }
    out
}

pub(super) fn call(name: &str, arguments: Value) -> ParseEvent {
    ParseEvent::ToolCall(ToolCall { id: None, name: name.into(), arguments })
}

pub(super) fn text(s: &str) -> ParseEvent {
    ParseEvent::Text(s.into())
}

/// The same result for the whole text at once, for every single split point and byte by byte; partial markup
/// never shows up in a text event before it is decided.
pub(super) fn check(input: &str, expected: &[ParseEvent]) {
    check_with(&|| ToolCallParser::new(tools()), input, expected);
}

pub(super) fn check_with(parser: &dyn Fn() -> ToolCallParser, input: &str, expected: &[ParseEvent]) {
    let boundaries: Vec<usize> = (1..input.len()).filter(|&i| input.is_char_boundary(i)).collect();
    assert_eq!(run_split_with(parser(), input, &[]).0, expected, "whole input {input:?}");
    for &b in &boundaries {
        assert_eq!(run_split_with(parser(), input, &[b]).0, expected, "split at {b} of {input:?}");
    }
    assert_eq!(run_split_with(parser(), input, &boundaries).0, expected, "char by char {input:?}");
}

/// Codex's two shell tools (trimmed schemas of Codex 0.171), and a tool whose parameters overlap them.
pub(super) fn codex_parser() -> ToolCallParser {
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
