//! The JSON objects that name a call, shared by the tagged, fenced, bare and `<tools>` forms:
//! `{"name", "arguments"}` and its common variants, a prefix test for a streaming line, and a bracket scanner that
//! finds where an object ends.

use serde_json::{Map, Value};

use super::{CALL_KEYS, Verdict};
use crate::conversation::ToolCall;

/// Does `body` (starting with `{` or `[`) begin like a call object or an array of them?
pub(super) fn call_prefix_verdict(body: &str) -> Verdict {
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

/// The byte length of the JSON object or array at the start of `s` (brackets matched outside strings), or `None`
/// if it is not complete yet (or closes a bracket it never opened).
pub(super) fn json_extent(s: &str) -> Option<usize> {
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

/// One or more JSON values, one after another, each a call or an array of calls.
pub(super) fn parse_json_values(text: &str, tools: &[String]) -> Option<Vec<ToolCall>> {
    let mut calls = Vec::new();
    for value in serde_json::Deserializer::from_str(text).into_iter::<Value>() {
        calls.extend(calls_from_value(value.ok()?, tools)?);
    }
    (!calls.is_empty()).then_some(calls)
}

pub(super) fn parse_calls_json(text: &str, tools: &[String]) -> Option<Vec<ToolCall>> {
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
}
