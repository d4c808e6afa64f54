//! Qwen3-Coder's XML calls read by the streaming parser with the tools' schemas: no panic, the same events however
//! the text is split, text without a call unchanged, and every call it reports keeps its tool's schema (a declared
//! tool, declared parameters only, the required ones there, each value of its parameter's type): a call that breaks
//! the schema is text, never a malformed call. Input: the first byte picks split points, the rest is the output.
#![no_main]

mod split;

use chat::ParseEvent;
use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};

fn tools() -> Vec<(String, Value)> {
    vec![
        (
            "Bash".to_owned(),
            json!({"type": "object", "properties": {"command": {"type": "string"}, "timeout": {"type": "number"},
                   "background": {"type": "boolean"}}, "required": ["command"]}),
        ),
        (
            "edit".to_owned(),
            json!({"type": "object", "properties": {"edits": {"type": "array"}, "meta": {"type": "object"},
                   "limit": {"type": ["integer", "string"]}}, "additionalProperties": false}),
        ),
    ]
}

/// Whether `value` is of the type `schema` names (only the types used above).
fn of_type(value: &Value, schema: &Value) -> bool {
    let types: Vec<&str> = match &schema["type"] {
        Value::String(t) => vec![t.as_str()],
        Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
        _ => return true,
    };
    types.iter().any(|t| match *t {
        "string" => value.is_string(),
        "number" => value.is_number(),
        "integer" => value.is_i64() || value.is_u64(),
        "boolean" => value.is_boolean(),
        "array" => value.is_array(),
        "object" => value.is_object(),
        _ => false,
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&seed, rest)) = data.split_first() else { return };
    let Ok(text) = std::str::from_utf8(rest) else { return };
    let tools = tools();
    let whole = split::checked_events(&tools, seed, text);
    // The JSON forms (named calls, a `<tools>` block, a reply that is one tool's arguments) are held to the schema by
    // the grammar, not the parser: only replies that can hold no such call are checked here.
    let body = text.trim_start();
    let body = body.strip_prefix('<').map_or(body, |r| r.split_once('>').map_or(body, |(_, rest)| rest)).trim_start();
    let json_forms = ["\"name\"", "\"function\"", "\"tool", "<tools>"].iter().any(|k| text.contains(k))
        || body.starts_with(['{', '[', '`']);
    for e in whole.iter().filter(|_| !json_forms) {
        let ParseEvent::ToolCall(call) = e else { continue };
        let (_, schema) = tools.iter().find(|t| t.0 == call.name).expect("a declared tool");
        let args = call.arguments.as_object().expect("arguments are an object");
        let properties = schema["properties"].as_object().expect("properties");
        // Neither tool takes undeclared parameters (a missing `additionalProperties` closes Bash's).
        for (key, value) in args {
            let s = properties.get(key).unwrap_or_else(|| panic!("undeclared parameter {key}"));
            assert!(of_type(value, s), "{key}: {value} is not {s}");
        }
        for key in schema["required"].as_array().into_iter().flatten() {
            assert!(args.contains_key(key.as_str().unwrap()), "required {key} missing");
        }
    }
});
