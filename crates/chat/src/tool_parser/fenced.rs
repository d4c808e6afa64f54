//! A call in a fenced code block (```` ```json ````, ```` ``` ````, ```` ```tool_call ````, ...; see [`FENCE_LANGS`]),
//! one call object or an array of them: what the Qwen2.5-Coder models (0.5B and 1.5B) often write instead of the
//! `<tool_call>` tags their template asks for. It counts only when every call names a declared tool; otherwise the
//! block is released as text, decided at the object's first key.
//!
//! [`FENCE_LANGS`]: super::FENCE_LANGS

use super::json::{json_extent, parse_calls_json};
use super::{FENCE, Mode, ParseEvent, ToolCallParser};

impl ToolCallParser {
    pub(super) fn scan_fence(&mut self, out: &mut Vec<ParseEvent>, at_end: bool) -> bool {
        // held: [blanks] ``` info \n [blanks] JSON [blanks] ```
        let nl = self.held.find('\n').expect("INVARIANT: a fence is classified after its first line");
        let json_start = nl + 1 + (self.held[nl + 1..].len() - self.held[nl + 1..].trim_start().len());
        let Some(json_len) = json_extent(&self.held[json_start..]) else {
            if at_end {
                self.give_up(out);
                return true;
            }
            return false;
        };
        let json_end = json_start + json_len;
        let after = &self.held[json_end..];
        let after_trimmed = after.trim_start();
        let end = if after_trimmed.starts_with(FENCE) {
            json_end + (after.len() - after_trimmed.len()) + FENCE.len()
        } else if at_end && after_trimmed.is_empty() {
            self.held.len()
        } else if !at_end && (after_trimmed.is_empty() || FENCE.starts_with(after_trimmed)) {
            return false;
        } else {
            self.give_up(out);
            return true;
        };
        match parse_calls_json(&self.held[json_start..json_end], &self.tools) {
            Some(calls) => {
                self.held.drain(..end);
                self.emit_calls(calls, out);
                self.line_start = false;
                self.mode = Mode::Text;
            }
            None => self.give_up(out),
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::*;
    use serde_json::json;

    #[test]
    fn fenced_json_call() {
        let input = "```json\n{\n  \"name\": \"get_weather\",\n  \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}\n}\n```";
        check(input, &[call("get_weather", json!({"city": "Paris", "unit": "celsius"}))]);
        let input = "Sure.\n```\n[{\"name\": \"bash\", \"arguments\": {\"command\": \"ls\"}}, {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}]\n```\n";
        check(
            input,
            &[text("Sure.\n"), call("bash", json!({"command": "ls"})), call("get_weather", json!({"city": "Oslo"}))],
        );
    }

    #[test]
    fn code_blocks_that_are_not_calls_pass_through() {
        let input = "Here:\n```python\nprint({'a': 1})\n```\nand\n```json\n{\"name\": \"not_a_tool\", \"arguments\": {}}\n```\nend";
        check(input, &[text(input)]);
        let input = "```json\n{\"a\": [1, 2, {\"b\": \"}\"}]}\n```\n";
        check(input, &[text(input)]);
    }

    #[test]
    fn fenced_json_that_is_not_a_call_is_decided_at_its_first_key() {
        // Released while the block is still open...
        let open = "Result:\n```json\n{\"path\": \"a.txt\", \"content\": \"never closed";
        let mut p = ToolCallParser::new(tools());
        assert_eq!(merge(p.push(open)), vec![text(open)]);
        // ... and after a call it ends the reply at once.
        let mut p = ToolCallParser::new(tools());
        let events = p.push("<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call>\n");
        assert_eq!(events, vec![call("bash", json!({"command": "ls"}))]);
        assert!(p.push("```json\n{\"output\": \"an invented result that goes on").is_empty());
        assert!(p.is_done());
        // A fenced call still waits for its first key.
        let mut p = ToolCallParser::new(tools());
        assert!(p.push("```json\n{\n  \"na").is_empty());
    }
}
