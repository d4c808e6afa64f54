//! A bare call object `{"name": ..., "arguments": ...}` (or an array of them) starting a line, with no tag or fence:
//! the other form the Qwen2.5-Coder models (0.5B and 1.5B) write instead of `<tool_call>` tags. It counts only when
//! every call names a declared tool; braces in the middle of a line never start one.

use super::json::{json_extent, parse_calls_json};
use super::{Mode, ParseEvent, ToolCallParser};

impl ToolCallParser {
    pub(super) fn scan_bare(&mut self, out: &mut Vec<ParseEvent>, at_end: bool) -> bool {
        let start = self.held.len() - self.held.trim_start_matches([' ', '\t']).len();
        let Some(len) = json_extent(&self.held[start..]) else {
            if at_end {
                self.give_up(out);
                return true;
            }
            return false;
        };
        match parse_calls_json(&self.held[start..start + len], &self.tools) {
            Some(calls) => {
                self.held.drain(..start + len);
                self.emit_calls(calls, out);
                self.line_start = false;
            }
            None => {
                // Not a call after all: release it as text.
                self.release(start + len, out);
            }
        }
        self.mode = Mode::Text;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use serde_json::json;

    #[test]
    fn bare_json_call() {
        let input = "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"note\": \"a } in a string\"}}";
        check(input, &[call("get_weather", json!({"city": "Paris", "note": "a } in a string"}))]);
        let input = "I will call it.\n  {\"function\": {\"name\": \"bash\", \"parameters\": {\"command\": \"ls\"}}}\n{\"name\": \"bash\", \"result\": \"invented\"}";
        check(input, &[text("I will call it.\n"), call("bash", json!({"command": "ls"}))]);
    }

    #[test]
    fn json_that_is_not_a_call_passes_through() {
        let input = "{\"city\": \"Paris\"}\n[1, 2, 3]\n{\"name\": \"someone\", \"age\": 3}\n{\"na";
        check(input, &[text(input)]);
        // Braces mid-line are never candidates.
        check("x = {\"name\": \"bash\"}", &[text("x = {\"name\": \"bash\"}")]);
    }
}
