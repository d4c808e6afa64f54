//! What the tool-call parser's targets share: the parser's events for a text pushed in pieces, and the two checks
//! every reply must pass — any split gives the same events, and a text without a call comes out unchanged.

use chat::{ParseEvent, ToolCallParser};
use serde_json::Value;

/// The events for `text` pushed in the pieces `cuts` makes, neighbouring text events merged (only their
/// concatenation is meaningful).
fn run(tools: &[(String, Value)], text: &str, cuts: &[usize]) -> Vec<ParseEvent> {
    let mut parser = ToolCallParser::new(tools.iter().map(|t| t.0.clone())).with_schemas(tools);
    let mut events = Vec::new();
    let mut last = 0;
    for &c in cuts.iter().chain(std::iter::once(&text.len())) {
        events.extend(parser.push(&text[last..c]));
        last = c;
    }
    events.extend(parser.finish());
    let mut merged: Vec<ParseEvent> = Vec::new();
    for e in events {
        match (merged.last_mut(), e) {
            (Some(ParseEvent::Text(a)), ParseEvent::Text(b)) => a.push_str(&b),
            (_, e) => merged.push(e),
        }
    }
    merged
}

/// The events of the whole `text`, after checking that splitting it every `seed % 7 + 1` bytes gives the same and
/// that a text in which no call is found passes through unchanged.
pub fn checked_events(tools: &[(String, Value)], seed: u8, text: &str) -> Vec<ParseEvent> {
    let whole = run(tools, text, &[]);
    let step = usize::from(seed % 7) + 1;
    let cuts: Vec<usize> = (1..text.len()).filter(|i| i % step == 0 && text.is_char_boundary(*i)).collect();
    assert_eq!(run(tools, text, &cuts), whole, "split every {step} bytes");
    if !whole.iter().any(|e| matches!(e, ParseEvent::ToolCall(_))) {
        let out: String = whole.iter().map(|e| if let ParseEvent::Text(t) = e { t.as_str() } else { "" }).collect();
        assert_eq!(out, text, "text without calls passes through unchanged");
    }
    whole
}
