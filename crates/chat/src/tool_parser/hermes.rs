//! The Hermes form: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, the tags the Qwen2.5 and
//! Qwen2.5-Coder chat templates ask for (after NousResearch's Hermes 2 Pro). Several JSON objects in one tag, a
//! missing closing tag at the end of the output and the doubled braces of the Qwen2.5-Coder-1.5B template example
//! are accepted; Qwen3-Coder's XML inside the same tags is read by `qwen3_xml.rs`.

use super::json::parse_json_values;
use super::qwen3_xml::parse_xml_call;
use super::signature::Signature;
use super::{Mode, ParseEvent, TAG_CLOSE, TAG_OPEN, ToolCallParser};
use crate::conversation::ToolCall;

impl ToolCallParser {
    pub(super) fn scan_tag(&mut self, out: &mut Vec<ParseEvent>, at_end: bool) -> bool {
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
        match parse_tag_content(&content, &self.tools, &self.signatures) {
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
}

/// The calls inside one `<tool_call>` tag: JSON objects (one or several, or an array), or the XML form.
fn parse_tag_content(content: &str, tools: &[String], signatures: &[Signature]) -> Option<Vec<ToolCall>> {
    let text = content.trim();
    if text.starts_with("<function=") {
        return parse_xml_call(text, tools, signatures).map(|c| vec![c]);
    }
    if let Some(calls) = parse_json_values(text, tools) {
        return Some(calls);
    }
    // The Qwen2.5-Coder-1.5B template shows the call with doubled braces; the model may copy them.
    let inner = text.strip_prefix('{')?.strip_suffix('}')?;
    parse_json_values(inner.trim(), tools)
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::*;
    use serde_json::json;

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
}
