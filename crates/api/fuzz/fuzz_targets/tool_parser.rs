//! The streaming tool-call parser never panics, gives the same events however the text is split, and loses no text
//! when it finds no call. Input: the first byte picks split points (as a seed), the rest is the model's output.
#![no_main]

use chat::{ParseEvent, ToolCallParser};
use libfuzzer_sys::fuzz_target;

fn run(text: &str, cuts: &[usize]) -> Vec<ParseEvent> {
    let tools = [
        ("get_weather".to_owned(), serde_json::json!({"properties": {"city": {}}, "required": ["city"]})),
        ("bash".to_owned(), serde_json::json!({"properties": {"command": {}, "timeout": {}}, "required": ["command"]})),
    ];
    let mut parser = ToolCallParser::new(["get_weather", "bash"]).with_schemas(&tools);
    let mut events = Vec::new();
    let mut last = 0;
    for &c in cuts.iter().chain(std::iter::once(&text.len())) {
        events.extend(parser.push(&text[last..c]));
        last = c;
    }
    events.extend(parser.finish());
    // Merge neighbouring text events: only their concatenation is meaningful.
    let mut merged: Vec<ParseEvent> = Vec::new();
    for e in events {
        match (merged.last_mut(), e) {
            (Some(ParseEvent::Text(a)), ParseEvent::Text(b)) => a.push_str(&b),
            (_, e) => merged.push(e),
        }
    }
    merged
}

fuzz_target!(|data: &[u8]| {
    let Some((&seed, rest)) = data.split_first() else { return };
    let Ok(text) = std::str::from_utf8(rest) else { return };
    let whole = run(text, &[]);
    let step = usize::from(seed % 7) + 1;
    let cuts: Vec<usize> = (1..text.len()).filter(|i| i % step == 0 && text.is_char_boundary(*i)).collect();
    assert_eq!(run(text, &cuts), whole, "split every {step} bytes");
    if !whole.iter().any(|e| matches!(e, ParseEvent::ToolCall(_))) {
        let out: String = whole.iter().map(|e| if let ParseEvent::Text(t) = e { t.as_str() } else { "" }).collect();
        assert_eq!(out, text, "text without calls passes through unchanged");
    }
});
