//! Qwen3-Coder's XML form inside `<tool_call>` tags, as its chat template shows it (and the Qwen3.5 line writes):
//! `<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n</function>`. A value is text; the tool's schema says what
//! it is ([`ParamKind`]): a string parameter stays the text even when it looks like a number, a number, boolean,
//! object or array parameter is the JSON the text holds, and a parameter that may be either (or has no schema) is
//! JSON where the text parses as one of its non-string types, else the string (llama.cpp's Qwen3-Coder parser reads
//! values the same way, `common/parsers/qwen3-coder.cpp`). The lazy grammar (`api::lazy_call`) writes values the same
//! way and the API streams them by the same rules, so all three agree on a call's arguments.
//!
//! A call that breaks its tool's schema (an undeclared tool or parameter, a required parameter missing, a value that
//! is not of its parameter's type, text between the parameters) is not a call: the tag stays text.

use serde_json::{Map, Value};

use super::signature::Signature;
use crate::conversation::ToolCall;

/// The closing tag of a parameter's value.
pub const PARAMETER_CLOSE: &str = "</parameter>";
const PARAMETER_OPEN: &str = "<parameter=";
const FUNCTION_OPEN: &str = "<function=";
const FUNCTION_CLOSE: &str = "</function>";

/// How a parameter's text is read, from its schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamKind {
    /// Only a string is allowed: the text is the value (one newline after the opening tag and one before the
    /// closing tag are layout, not value).
    Text,
    /// No string is allowed: the text is JSON of the schema's types.
    Json,
    /// A string or other types (or no schema): JSON where the text parses as one of the other types, else the string.
    Mixed,
}

/// The JSON types a schema allows (`None`: any), from `type`, `enum`, `const` and the members of `anyOf` / `oneOf`.
fn schema_types(schema: &Value) -> Option<Vec<&'static str>> {
    const TYPES: [&str; 7] = ["string", "number", "integer", "boolean", "object", "array", "null"];
    let of_value = |v: &Value| match v {
        Value::String(_) => "string",
        Value::Number(_) => "number",
        Value::Bool(_) => "boolean",
        Value::Object(_) => "object",
        Value::Array(_) => "array",
        Value::Null => "null",
    };
    if let Some(t) = schema.get("type") {
        let names: Vec<&str> = match t {
            Value::String(s) => vec![s.as_str()],
            Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
            _ => return None,
        };
        return Some(TYPES.into_iter().filter(|t| names.contains(t)).collect());
    }
    if let Some(Value::Array(values)) = schema.get("enum") {
        return Some(values.iter().map(of_value).collect());
    }
    if let Some(v) = schema.get("const") {
        return Some(vec![of_value(v)]);
    }
    let members = schema.get("anyOf").or_else(|| schema.get("oneOf"))?.as_array()?;
    let mut all = Vec::new();
    for m in members {
        all.extend(schema_types(m)?);
    }
    Some(all)
}

/// How the value of a parameter with schema `schema` is written (see [`ParamKind`]).
pub fn param_kind(schema: &Value) -> ParamKind {
    match schema_types(schema) {
        Some(types) if !types.is_empty() && types.iter().all(|t| *t == "string") => ParamKind::Text,
        Some(types) if !types.is_empty() && !types.contains(&"string") => ParamKind::Json,
        _ => ParamKind::Mixed,
    }
}

/// Whether `value` is of one of `types` (`None`: any).
fn has_type(value: &Value, types: Option<&[&str]>) -> bool {
    let Some(types) = types else { return true };
    let is = |t: &str| types.contains(&t);
    match value {
        Value::Number(n) => is("number") || (is("integer") && (n.is_i64() || n.is_u64())),
        Value::String(_) => is("string"),
        Value::Bool(_) => is("boolean"),
        Value::Object(_) => is("object"),
        Value::Array(_) => is("array"),
        Value::Null => is("null"),
    }
}

/// The text of a value without its layout: one newline after the opening tag and one before the closing tag.
pub fn strip_layout(raw: &str) -> &str {
    let raw = raw.strip_prefix('\n').unwrap_or(raw);
    raw.strip_suffix('\n').unwrap_or(raw)
}

/// The value of a parameter written as `raw` (the text between `<parameter=KEY>` and `</parameter>`), read as its
/// schema says (`None`: no schema, as [`ParamKind::Mixed`]); `None` when it is not of the schema's types.
pub fn parameter_value_for(raw: &str, schema: Option<&Value>) -> Option<Value> {
    let types = schema.and_then(schema_types);
    let kind = schema.map_or(ParamKind::Mixed, param_kind);
    if kind == ParamKind::Text {
        return Some(Value::String(strip_layout(raw).to_owned()));
    }
    let parsed = serde_json::from_str::<Value>(raw.trim()).ok().filter(|v| !v.is_string());
    match (kind, parsed) {
        (_, Some(v)) if has_type(&v, types.as_deref()) => Some(v),
        (ParamKind::Json, _) => None,
        _ => Some(Value::String(strip_layout(raw).to_owned())),
    }
}

/// A parameter written as text with no schema to go by (the `<tools>` block's attributes): JSON when it parses as a
/// number, boolean, object, ...; otherwise the string.
pub(super) fn parameter_value(raw: &str) -> Value {
    match serde_json::from_str::<Value>(raw) {
        Ok(v) if !v.is_string() => v,
        _ => Value::String(raw.to_owned()),
    }
}

/// Whether a tool with parameter schema `schema` takes parameters it does not declare: when it declares none, or
/// says `additionalProperties` is not `false` (a missing one closes it, as the lazy grammar reads schemas).
pub fn takes_undeclared(schema: &Value) -> bool {
    let declares = schema.get("properties").and_then(Value::as_object).is_some_and(|p| !p.is_empty());
    !declares || schema.get("additionalProperties").is_some_and(|a| *a != Value::Bool(false))
}

/// Qwen3-Coder's form (`text` starts with `<function=`), for a declared tool whose schema it keeps (`signatures`:
/// the declared tools' parameters; a tool without one takes any parameter, read as [`ParamKind::Mixed`]). A missing
/// `</function>` at the end of the tag is forgiven, a missing `</parameter>` is not (the value may be cut short).
pub(super) fn parse_xml_call(text: &str, tools: &[String], signatures: &[Signature]) -> Option<ToolCall> {
    let rest = text.strip_prefix(FUNCTION_OPEN)?;
    let close = rest.find('>')?;
    let name = rest[..close].trim().to_owned();
    if !tools.contains(&name) {
        return None;
    }
    let signature = signatures.iter().find(|s| s.name == name);
    let mut body = &rest[close + 1..];
    let mut arguments = Map::new();
    loop {
        body = body.trim_start();
        if body.is_empty() {
            break;
        }
        if let Some(after) = body.strip_prefix(FUNCTION_CLOSE) {
            if !after.trim().is_empty() {
                return None;
            }
            break;
        }
        let after = body.strip_prefix(PARAMETER_OPEN)?;
        let key_end = after.find('>')?;
        let key = after[..key_end].trim();
        let value_text = &after[key_end + 1..];
        // A value without its closing tag may have been cut short (by the output limit): not a call.
        let end = value_text.find(PARAMETER_CLOSE)?;
        let (raw, rest) = (&value_text[..end], &value_text[end + PARAMETER_CLOSE.len()..]);
        let schema = signature.and_then(|s| s.properties.get(key));
        if signature.is_some_and(|s| schema.is_none() && !s.open) {
            return None;
        }
        arguments.insert(key.to_owned(), parameter_value_for(raw, schema)?);
        body = rest;
    }
    if signature.is_some_and(|s| s.required.iter().any(|k| !arguments.contains_key(k))) {
        return None;
    }
    Some(ToolCall { id: None, name, arguments: Value::Object(arguments) })
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::*;
    use super::*;
    use serde_json::json;

    /// Claude Code's Bash and Write tools, and a tool whose parameters take several types.
    fn xml_parser() -> ToolCallParser {
        let tools = [
            (
                "Bash",
                json!({"type": "object", "properties": {"command": {"type": "string"}, "timeout": {"type": "number"},
                       "run_in_background": {"type": "boolean"}}, "required": ["command"]}),
            ),
            (
                "Write",
                json!({"type": "object", "properties": {"file_path": {"type": "string"}, "content": {"type": "string"}},
                       "required": ["file_path", "content"], "additionalProperties": false}),
            ),
            (
                "edit",
                json!({"type": "object", "properties": {"edits": {"type": "array"}, "meta": {"type": "object"},
                       "limit": {"type": ["integer", "string"]}, "any": {}}}),
            ),
        ];
        let tools: Vec<(String, Value)> = tools.into_iter().map(|(n, s)| (n.to_owned(), s)).collect();
        ToolCallParser::new(tools.iter().map(|t| t.0.clone())).with_schemas(&tools)
    }

    #[test]
    fn qwen3_coder_xml_call() {
        let input = "<tool_call>\n<function=bash>\n<parameter=command>\nls -la /tmp\n</parameter>\n<parameter=timeout>\n30\n</parameter>\n</function>\n</tool_call>";
        check(input, &[call("bash", json!({"command": "ls -la /tmp", "timeout": 30}))]);
    }

    #[test]
    fn values_are_typed_by_the_schema_at_every_split() {
        // A string that looks like a number stays a string; a number, a boolean, an array and an object are JSON;
        // a multi-line value keeps its inner newlines, and `<parameter=` inside a value is part of it.
        let input = "I'll run it.\n<tool_call>\n<function=Bash>\n<parameter=command>\n30\n</parameter>\n<parameter=timeout>\n1.5e3\n</parameter>\n<parameter=run_in_background>\ntrue\n</parameter>\n</function>\n</tool_call>";
        let want = call("Bash", json!({"command": "30", "timeout": 1500.0, "run_in_background": true}));
        check_with(&xml_parser, input, &[text("I'll run it.\n"), want]);
        let input = "<tool_call>\n<function=Write>\n<parameter=content>\nfn main() {\n    // <parameter=x>\n}\n\n</parameter>\n<parameter=file_path>\nsrc/é.rs\n</parameter>\n</function>\n</tool_call>";
        let want = call("Write", json!({"file_path": "src/é.rs", "content": "fn main() {\n    // <parameter=x>\n}\n"}));
        check_with(&xml_parser, input, &[want]);
        let input = "<tool_call>\n<function=edit>\n<parameter=edits>\n[{\"old\": \"a\", \"new\": \"b\"}]\n</parameter>\n<parameter=meta>\n{\"k\": 1}\n</parameter>\n<parameter=limit>\n7\n</parameter>\n<parameter=any>\nnull\n</parameter>\n</function>\n</tool_call>";
        let want =
            call("edit", json!({"edits": [{"old": "a", "new": "b"}], "meta": {"k": 1}, "limit": 7, "any": null}));
        check_with(&xml_parser, input, &[want]);
        // A value that may be a string or an integer is the string when it is no integer.
        let input = "<tool_call>\n<function=edit>\n<parameter=limit>\n7.5\n</parameter>\n</function>\n</tool_call>";
        check_with(&xml_parser, input, &[call("edit", json!({"limit": "7.5"}))]);
    }

    #[test]
    fn calls_that_break_the_schema_are_text() {
        for input in [
            // An undeclared tool; an undeclared parameter of a closed tool; a required parameter missing; a number
            // parameter that is no number; an array that does not parse; text between parameters; text after.
            "<tool_call>\n<function=python>\n<parameter=code>\nprint(1)\n</parameter>\n</function>\n</tool_call>",
            "<tool_call>\n<function=Write>\n<parameter=file_path>\na\n</parameter>\n<parameter=content>\nb\n</parameter>\n<parameter=mode>\nx\n</parameter>\n</function>\n</tool_call>",
            "<tool_call>\n<function=Write>\n<parameter=file_path>\na.txt\n</parameter>\n</function>\n</tool_call>",
            "<tool_call>\n<function=Bash>\n<parameter=command>\nls\n</parameter>\n<parameter=timeout>\nsoon\n</parameter>\n</function>\n</tool_call>",
            "<tool_call>\n<function=edit>\n<parameter=edits>\n[1, \n</parameter>\n</function>\n</tool_call>",
            "<tool_call>\n<function=Bash>\nI think\n<parameter=command>\nls\n</parameter>\n</function>\n</tool_call>",
            "<tool_call>\n<function=Bash>\n<parameter=command>\nls\n</parameter>\n</function>\nDone.\n</tool_call>",
        ] {
            check_with(&xml_parser, input, &[text(input)]);
        }
        // Bash's schema does not say `additionalProperties: false`; the lazy grammar reads a missing one as closed,
        // and so does the parser: an undeclared parameter is text there too.
        let input = "<tool_call>\n<function=Bash>\n<parameter=command>\nls\n</parameter>\n<parameter=cwd>\n/\n</parameter>\n</function>\n</tool_call>";
        check_with(&xml_parser, input, &[text(input)]);
    }

    #[test]
    fn a_missing_close_at_the_end_and_the_json_form_in_the_same_tags() {
        let input = "<tool_call>\n<function=Bash>\n<parameter=command>\nls\n</parameter>\n";
        check_with(&xml_parser, input, &[call("Bash", json!({"command": "ls"}))]);
        // A value cut short (`rm -rf /tmp/build` at the output limit) is no call.
        let input = "<tool_call>\n<function=Bash>\n<parameter=command>\nrm -rf /";
        check_with(&xml_parser, input, &[text(input)]);
        let input = "<tool_call>\n{\"name\": \"Bash\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call>";
        check_with(&xml_parser, input, &[call("Bash", json!({"command": "ls"}))]);
    }

    #[test]
    fn param_kinds() {
        for (schema, kind) in [
            (json!({"type": "string"}), ParamKind::Text),
            (json!({"enum": ["a", "b"]}), ParamKind::Text),
            (json!({"type": "integer"}), ParamKind::Json),
            (json!({"anyOf": [{"type": "object"}, {"type": "null"}]}), ParamKind::Json),
            (json!({"type": ["string", "null"]}), ParamKind::Mixed),
            (json!({"$ref": "#/$defs/x"}), ParamKind::Mixed),
            (json!({}), ParamKind::Mixed),
        ] {
            assert_eq!(param_kind(&schema), kind, "{schema}");
        }
        assert!(takes_undeclared(&json!({"type": "object"})));
        assert!(takes_undeclared(&json!({"properties": {"a": {}}, "additionalProperties": true})));
        assert!(!takes_undeclared(&json!({"properties": {"a": {}}})));
    }
}
