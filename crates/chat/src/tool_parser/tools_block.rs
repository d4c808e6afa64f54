//! A reply that is a `<tools>` block of XML elements, each a call: `<function name="NAME" arguments='{...}'/>` or
//! `<NAME key="value" .../>` for a declared tool (attribute values read as in the Qwen3-Coder form). The
//! Qwen2.5-Coder-1.5B answers so now and then, copying the `<tools>` wrapper its template puts around the tool list
//! (`<tools>\n  <function name="write_stdin" arguments='{"chars": "hi", ...}'/>\n</tools>` to Codex,
//! `<tools>\n  <bash command="touch hello.txt" timeout="120000" .../>\n</tools>` to OpenCode). Such a reply is held
//! while it still reads as such a block, and is text as soon as it does not. Inside the block, with the tools'
//! schemas, an echo of one tool's entry of the tool list whose `properties` hold values in place of some parameters'
//! schemas is that tool's call with those values: the same model answered Codex so twice (`{"type": "function",
//! "function": {"name": "exec_command", ..., "parameters": {"type": "object", "properties": {"cmd": "printf 'hi\n' >
//! hello.txt", "justification": "<its description>", "login": {...}`); a parameter's own description copied as its
//! value is left out.

use serde_json::{Map, Value};

use super::json::json_extent;
use super::qwen3_xml::parameter_value;
use super::signature::Signature;
use super::{Mode, ParseEvent, TOOLS_CLOSE, TOOLS_OPEN, ToolCallParser, Verdict, tag_word_len};
use crate::conversation::ToolCall;

impl ToolCallParser {
    /// The reply so far opens with `<tools>`: holds it while it reads as a block of calls as XML elements, reads the
    /// calls at the end of the output, and otherwise scans it again as ordinary text.
    pub(super) fn scan_elements(&mut self, out: &mut Vec<ParseEvent>, at_end: bool) -> bool {
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

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::*;
    use serde_json::json;

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
}
