//! A call written without its name: a reply that is nothing but one tool's arguments object, alone or wrapped in an
//! invented tag or a fence (`<commands>\n{"cmd": "printf 'hi' > hello.txt"}\n</commands>`), as Qwen2.5-Coder-0.5B
//! answers Codex about half the time. Read only with the tools' parameter schemas
//! ([`ToolCallParser::with_schemas`]). It counts only when the object's keys are all parameters of exactly one
//! declared tool and hold all of that tool's required ones, and nothing but blanks and the wrapper's closing line
//! comes before the end of the output; the reply is held until then (a reply that starts otherwise is not held for
//! this).

use serde_json::Value;

use super::json::json_extent;
use super::{
    CALL_KEYS, FENCE, FENCE_LANGS, MAX_FENCE_INFO_BYTES, MAX_WRAPPER_TAG_BYTES, Mode, ParseEvent, TAG_OPEN,
    ToolCallParser, Verdict, tag_word_len,
};
use crate::conversation::ToolCall;

impl ToolCallParser {
    /// At the start of the reply: may it be a call written without its name? `Yes` once the arguments object's first
    /// key is a parameter of a declared tool (and not a key that makes an object a named call).
    pub(super) fn classify_nameless(&self, at_end: bool) -> Verdict {
        let s = self.held.trim_start();
        let verdict = match nameless_object_start(s) {
            Err(v) => v,
            Ok(at) => match first_key(s[at + 1..].trim_start()) {
                None => Verdict::No,
                Some((key, _)) if CALL_KEYS.iter().any(|k| k.trim_matches('"') == key) => Verdict::No,
                Some((key, true)) if self.signatures.iter().any(|t| t.properties.contains_key(key)) => Verdict::Yes,
                Some((key, false))
                    if self.signatures.iter().any(|t| t.properties.keys().any(|p| p.starts_with(key))) =>
                {
                    Verdict::Maybe
                }
                Some(_) => Verdict::No,
            },
        };
        if at_end && verdict == Verdict::Maybe { Verdict::No } else { verdict }
    }

    /// The reply so far is an opening line, an arguments object and perhaps a closing line: waits for the end of
    /// the output, then reads the object as the call of the one tool that accepts it. Anything else after the
    /// object, or no such tool, and the reply is scanned again as ordinary text.
    pub(super) fn scan_nameless(&mut self, out: &mut Vec<ParseEvent>, at_end: bool) -> bool {
        let lead = self.held.len() - self.held.trim_start().len();
        let start = nameless_object_start(&self.held[lead..]);
        let Ok(at) = start.map(|at| lead + at) else {
            // Not reached: what was classified stays so as the reply grows. Read as ordinary text.
            self.nameless_open = false;
            self.mode = Mode::Text;
            return true;
        };
        let trailer = json_extent(&self.held[at..]).map(|len| (len, closing_line(self.held[at + len..].trim_start())));
        let call = match trailer {
            Some((len, Verdict::Yes)) if at_end => self.nameless_call(&self.held[at..at + len]),
            Some((_, Verdict::Yes | Verdict::Maybe)) | None if !at_end => return false,
            _ => None,
        };
        match call {
            Some(call) => {
                self.held.clear();
                self.emit_calls(vec![call], out);
                self.line_start = false;
            }
            None => self.nameless_open = false,
        }
        self.mode = Mode::Text;
        true
    }

    /// `object` as the arguments of the one declared tool that accepts them.
    fn nameless_call(&self, object: &str) -> Option<ToolCall> {
        let Ok(Value::Object(args)) = serde_json::from_str::<Value>(object) else { return None };
        if args.is_empty() {
            return None;
        }
        let mut fits = self.signatures.iter().filter(|t| t.accepts(&args));
        let tool = fits.next()?;
        if fits.next().is_some() {
            return None;
        }
        Some(ToolCall { id: None, name: tool.name.clone(), arguments: Value::Object(args) })
    }
}

/// Where the arguments object of a call written without its name starts in `s` (the reply from its first non-blank
/// byte): after an optional opening line, either a tag of one word (`<commands>`, not `<tool_call>`) or a fence of
/// a JSON-ish language. `Err` while that is unknown (`Maybe`) or when it is not so (`No`).
fn nameless_object_start(s: &str) -> Result<usize, Verdict> {
    let object_line = if let Some(r) = s.strip_prefix('<') {
        let word = tag_word_len(r);
        let Some(line) = r[word..].strip_prefix('>') else {
            return Err(if r.len() == word && word <= MAX_WRAPPER_TAG_BYTES { Verdict::Maybe } else { Verdict::No });
        };
        if word == 0 || TAG_OPEN == &s[..word + 2] {
            return Err(Verdict::No);
        }
        let blanks = line.len() - line.trim_start_matches([' ', '\t', '\r']).len();
        match line[blanks..].chars().next() {
            None => return Err(Verdict::Maybe),
            Some('\n') => 1 + word + 1 + blanks + 1,
            Some(_) => return Err(Verdict::No),
        }
    } else if let Some(r) = s.strip_prefix(FENCE) {
        let Some(nl) = r.find('\n') else {
            return Err(if r.len() > MAX_FENCE_INFO_BYTES { Verdict::No } else { Verdict::Maybe });
        };
        if !FENCE_LANGS.contains(&r[..nl].trim().to_ascii_lowercase().as_str()) {
            return Err(Verdict::No);
        }
        FENCE.len() + nl + 1
    } else if s.starts_with('`') && FENCE.starts_with(s) {
        return Err(Verdict::Maybe);
    } else {
        0
    };
    let rest = &s[object_line..];
    match rest.trim_start().as_bytes().first() {
        None => Err(Verdict::Maybe),
        Some(b'{') => Ok(object_line + rest.len() - rest.trim_start().len()),
        Some(_) => Err(Verdict::No),
    }
}

/// The first key of an object whose `{` came just before `s` (blanks skipped), and whether it is complete (else the
/// part written so far); `None` when the object does not start with a plain key (no escapes).
fn first_key(s: &str) -> Option<(&str, bool)> {
    let Some(r) = s.strip_prefix('"') else {
        return s.is_empty().then_some(("", false));
    };
    match r.find(['"', '\\']) {
        Some(end) if r.as_bytes()[end] == b'"' => Some((&r[..end], true)),
        Some(_) => None,
        None => Some((r, false)),
    }
}

/// What may follow the arguments object of a call written without its name (blanks skipped): nothing, or a line
/// closing its wrapper (`</word>` or a fence), then blanks only. `Yes`: complete; `Maybe`: could still become so.
fn closing_line(s: &str) -> Verdict {
    if s.is_empty() {
        return Verdict::Yes;
    }
    let rest = if let Some(r) = s.strip_prefix(FENCE) {
        r
    } else if let Some(r) = s.strip_prefix("</") {
        let word = tag_word_len(r);
        match r[word..].strip_prefix('>') {
            Some(rest) if word > 0 => rest,
            None if r.len() == word && word <= MAX_WRAPPER_TAG_BYTES => return Verdict::Maybe,
            _ => return Verdict::No,
        }
    } else if FENCE.starts_with(s) || "</".starts_with(s) {
        return Verdict::Maybe;
    } else {
        return Verdict::No;
    };
    if rest.trim().is_empty() { Verdict::Yes } else { Verdict::No }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::*;
    use serde_json::json;

    #[test]
    fn a_reply_that_is_one_tools_arguments_is_its_call() {
        let exec = call("exec_command", json!({"cmd": "printf 'hi' > hello.txt"}));
        // The forms Qwen2.5-Coder-0.5B wrote for Codex: an invented tag, closed by a fence or by the tag.
        for input in [
            "<commands>\n{\"cmd\": \"printf 'hi' > hello.txt\"}\n```",
            "<commands>\n{\"cmd\": \"printf 'hi' > hello.txt\"}\n</commands>\n",
            "{\"cmd\": \"printf 'hi' > hello.txt\"}",
            "\n```json\n{\"cmd\": \"printf 'hi' > hello.txt\"}\n```\n",
        ] {
            check_with(&codex_parser, input, std::slice::from_ref(&exec));
        }
        check_with(
            &codex_parser,
            "{\"session_id\": 3, \"chars\": \"y\\n\"}",
            &[call("write_stdin", json!({"session_id": 3, "chars": "y\n"}))],
        );
        // A long parameter name is waited for to its end.
        let long = || {
            let tools = [("list".to_owned(), json!({"properties": {"directory_to_list_with_every_hidden_file": {}}}))];
            ToolCallParser::new(["list"]).with_schemas(&tools)
        };
        let input = "{\"directory_to_list_with_every_hidden_file\": \"src\"}";
        check_with(&long, input, &[call("list", json!({"directory_to_list_with_every_hidden_file": "src"}))]);
        // Held to the end of the output: what follows could still make it text.
        let mut p = codex_parser();
        assert!(p.push("<commands>\n{\"cmd\": \"ls\"}\n</commands>\n").is_empty());
        assert_eq!(p.finish(), vec![call("exec_command", json!({"cmd": "ls"}))]);
        // Named calls are read as before.
        check_with(
            &codex_parser,
            "<tool_call>\n{\"name\": \"exec_command\", \"arguments\": {\"cmd\": \"ls\"}}\n</tool_call>",
            &[call("exec_command", json!({"cmd": "ls"}))],
        );
    }

    #[test]
    fn arguments_that_are_not_the_whole_reply_or_fit_no_single_tool_are_text() {
        for input in [
            // Prose after the object, or before it.
            "{\"cmd\": \"ls\"}\nThat lists the files.",
            "Run this:\n{\"cmd\": \"ls\"}",
            "<commands>\n{\"cmd\": \"ls\"}\n</commands>\nDone.",
            // A key no tool has, a required parameter missing, parameters two tools share, no keys at all.
            "{\"cmd\": \"ls\", \"color\": true}",
            "{\"chars\": \"y\"}",
            "{\"session_id\": 3, \"yield_time_ms\": 5}",
            "{}",
            // The first key is no parameter, or the wrapper is not one tag or a JSON fence.
            "{\"city\": \"Paris\"}",
            "<b>bold</b>\n{\"cmd\": \"ls\"}",
            "```python\n{\"cmd\": \"ls\"}\n```",
            "<tool_call>\n{\"cmd\": \"ls\"}\n</tool_call>",
        ] {
            check_with(&codex_parser, input, &[text(input)]);
        }
        // Text that cannot start such a call is not held for it.
        let mut p = codex_parser();
        assert_eq!(p.push("Sure"), vec![text("Sure")]);
        let mut p = codex_parser();
        assert_eq!(p.push("{\"city\": 1"), vec![text("{\"city\": 1")]);
        let mut p = codex_parser();
        assert_eq!(merge(p.push("<div>\n<p>")), vec![text("<div>\n<p>")]);
    }
}
