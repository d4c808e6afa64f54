//! Qwen3-Coder's XML form inside `<tool_call>` tags: `<function=NAME><parameter=KEY>value</parameter></function>`,
//! as Qwen3-Coder's chat template shows it. Its way of reading a parameter's text is shared with the `<tools>`
//! block's attributes (`tools_block.rs`).

use serde_json::{Map, Value};

use crate::conversation::ToolCall;

/// A parameter written as text: JSON when it parses as a number, boolean, object, ... ; otherwise the string.
pub(super) fn parameter_value(raw: &str) -> Value {
    match serde_json::from_str::<Value>(raw) {
        Ok(v) if !v.is_string() => v,
        _ => Value::String(raw.to_owned()),
    }
}

/// Qwen3-Coder's form: `<function=NAME>` then `<parameter=KEY>value</parameter>` entries, then `</function>`.
/// Values that parse as JSON (numbers, booleans, objects, ...) become JSON; anything else is a string.
pub(super) fn parse_xml_call(text: &str, tools: &[String]) -> Option<ToolCall> {
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
    use super::super::testing::*;
    use serde_json::json;

    #[test]
    fn qwen3_coder_xml_call() {
        let input = "<tool_call>\n<function=bash>\n<parameter=command>\nls -la /tmp\n</parameter>\n<parameter=timeout>\n30\n</parameter>\n</function>\n</tool_call>";
        check(input, &[call("bash", json!({"command": "ls -la /tmp", "timeout": 30}))]);
    }
}
