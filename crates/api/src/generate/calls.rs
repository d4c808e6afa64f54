//! Tool-call arguments streamed as they are generated: a grammar-forced call ([`ForcedCall`]) and the calls the
//! lazy tool grammar holds under an auto tool choice ([`AutoCalls`]). Both only announce a call's name and pass its
//! argument text on; the output parser still reports each complete call.

use std::collections::VecDeque;

use chat::tool_parser::qwen3_xml::{self, PARAMETER_CLOSE, ParamKind};
use chat::tool_parser::{JsonEnd, JsonScanner};
use serde_json::Value;

use super::Output;
use crate::lazy_call::CallStarts;

/// The arguments of a grammar-forced call as they are generated. The grammar fixes the text around them:
/// `{"name": "NAME", "arguments": ARGS}\n</tool_call>`, so the name is known once its closing quote is written, and
/// everything after it except the possible closing tail is argument text.
#[derive(Debug, Default)]
pub(super) struct ForcedCall {
    text: String,
    /// Byte offset of the arguments in `text`, once the name is known.
    args_start: Option<usize>,
    /// Bytes of `text` sent as arguments so far.
    sent: usize,
    done: bool,
}

impl ForcedCall {
    const HEAD: &'static str = "{\"name\": \"";
    const AFTER_NAME: &'static str = "\", \"arguments\": ";
    const TAIL: &'static str = "}\n</tool_call>";

    pub(super) fn push(&mut self, text: &str, out: &mut VecDeque<Output>) {
        if self.done {
            return;
        }
        self.text.push_str(text);
        if self.args_start.is_none()
            && let Some(rest) = self.text.strip_prefix(Self::HEAD)
            && let Some(end) = rest.find(Self::AFTER_NAME)
        {
            let start = Self::HEAD.len() + end + Self::AFTER_NAME.len();
            out.push_back(Output::ToolCallBegin { name: rest[..end].to_string() });
            self.args_start = Some(start);
            self.sent = start;
        }
        if self.args_start.is_some() {
            // Hold back what could be the start of the closing tail.
            let mut upto = self.text.len().saturating_sub(Self::TAIL.len()).max(self.sent);
            while !self.text.is_char_boundary(upto) {
                upto -= 1;
            }
            if upto > self.sent {
                out.push_back(Output::ToolCallArgs(self.text[self.sent..upto].to_string()));
                self.sent = upto;
            }
        }
    }

    /// The rest of the arguments, before the parser's complete call.
    pub(super) fn finish(&mut self, out: &mut VecDeque<Output>) {
        if self.done {
            return;
        }
        self.done = true;
        if self.args_start.is_some() {
            let end = self.text.rfind(Self::TAIL).unwrap_or(self.text.len()).max(self.sent);
            if end > self.sent {
                out.push_back(Output::ToolCallArgs(self.text[self.sent..end].to_string()));
                self.sent = end;
            }
        }
    }
}

/// The arguments of the calls the lazy tool grammar holds (auto tool choice), streamed as they are generated. The
/// grammar (`lazy_call`) lists where each call starts and fixes its shape from there: `[<tool_call>] {"name": NAME,
/// "arguments": ARGS}` with JSON whitespace, so once `"arguments":` is written the name is known, and ARGS is an
/// object whose end is found by counting brackets outside strings. The output parser still reports each complete
/// call (`Output::ToolCall` then closes the streamed call).
///
/// Qwen3-Coder's XML form (`<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n...`) is streamed
/// as the JSON object the output parser reads from it: the name once `<function=NAME>` is written, then each
/// parameter's key as its tag opens; a string value (`ParamKind::Text`) as it is written (held back only by what could
/// still be its closing layout), any other value when its `</parameter>` closes it, typed by the tool's schema as the
/// parser types it.
#[derive(Debug)]
pub(super) struct AutoCalls {
    starts: CallStarts,
    /// The declared tools (name, parameter schema), to read XML values as the parser does.
    tools: Vec<(String, Value)>,
    /// The output so far.
    text: String,
    /// Calls started (streamed or skipped) so far.
    num_seen: usize,
    state: AutoState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AutoState {
    /// Waiting for the next listed start.
    Idle,
    /// A call starts at this offset; its name and arguments key (or its `<function=NAME>`) are not complete yet.
    Head { start: usize, tagged: bool, xml: bool },
    /// Streaming arguments: `sent` bytes of `text` are out (and scanned: the scanner holds the bracket depth).
    Args { sent: usize, scanner: JsonScanner },
    /// Between the parameters of an XML call to `tools[tool]`, read on from `at`; `first`: none written yet.
    XmlParams { tool: usize, at: usize, first: bool },
    /// The value of an XML call's parameter (its key at `key.0..key.1` of `text`) from `start`; `sent`: bytes of a
    /// string value streamed so far (of the value without its layout).
    XmlValue { tool: usize, key: (usize, usize), start: usize, sent: usize },
}

impl AutoCalls {
    pub(super) fn new(starts: CallStarts, tools: &[(String, Value)]) -> Self {
        AutoCalls { starts, tools: tools.to_vec(), text: String::new(), num_seen: 0, state: AutoState::Idle }
    }

    pub(super) fn push(&mut self, text: &str, out: &mut VecDeque<Output>) {
        self.text.push_str(text);
        loop {
            match self.state {
                AutoState::Idle => {
                    let next = self.starts.lock().unwrap_or_else(|e| e.into_inner()).get(self.num_seen).copied();
                    match next {
                        Some(s) if s.offset <= self.text.len() => {
                            self.num_seen += 1;
                            self.state = AutoState::Head { start: s.offset, tagged: s.tagged, xml: s.xml };
                        }
                        _ => return,
                    }
                }
                // (`get`: the offset counts the bytes the grammar saw; text that was not valid UTF-8 may have
                // been replaced here, and then the shape check below fails instead of slicing mid-character.)
                AutoState::Head { start, tagged, xml } => {
                    // Where the template writes XML calls, the JSON form inside the tags is a call too.
                    let head = |s: &str| match xml.then(|| xml_head(s)) {
                        Some(Head::NotStreamable) | None => (call_head(s, tagged), false),
                        Some(head) => (head, true),
                    };
                    let (head, xml) = self.text.get(start..).map_or((Head::NotStreamable, false), head);
                    match head {
                        Head::Incomplete => return,
                        Head::NotStreamable => self.state = AutoState::Idle,
                        Head::Args { name, offset } => {
                            let at = start + offset;
                            self.state = match self.tools.iter().position(|(n, _)| *n == name) {
                                Some(tool) if xml => AutoState::XmlParams { tool, at, first: true },
                                None if xml => AutoState::Idle,
                                _ => AutoState::Args { sent: at, scanner: JsonScanner::default() },
                            };
                            if self.state != AutoState::Idle {
                                out.push_back(Output::ToolCallBegin { name });
                            }
                        }
                    }
                }
                AutoState::XmlParams { tool, at, first } => match self.xml_params(tool, at, first, out) {
                    Some(next) => self.state = next,
                    None => return,
                },
                AutoState::XmlValue { tool, key, start, sent } => match self.xml_value(tool, key, start, sent, out) {
                    Ok(next) => self.state = next,
                    Err(sent) => {
                        self.state = AutoState::XmlValue { tool, key, start, sent };
                        return;
                    }
                },
                AutoState::Args { sent, mut scanner } => {
                    // Everything past `sent` is unscanned: the scanner keeps its state between pieces.
                    let end = match scanner.feed(&self.text.as_bytes()[sent..]) {
                        JsonEnd::Closed(end) => Some(sent + end),
                        // (The grammar never lets this happen; end the arguments there rather than run on.)
                        JsonEnd::Stray(i) => Some(sent + i + 1),
                        JsonEnd::Open => None,
                    };
                    let upto = end.unwrap_or(self.text.len());
                    if upto > sent {
                        out.push_back(Output::ToolCallArgs(self.text[sent..upto].to_string()));
                    }
                    if end.is_some() {
                        self.state = AutoState::Idle;
                    } else {
                        self.state = AutoState::Args { sent: upto, scanner };
                        return;
                    }
                }
            }
        }
    }
}

impl AutoCalls {
    /// Between the parameters of an XML call: opens the next one (its key, and the quote of a string value) or closes
    /// the arguments at `</function>`. The next state, or `None` to wait for more text.
    fn xml_params(&self, tool: usize, at: usize, first: bool, out: &mut VecDeque<Output>) -> Option<AutoState> {
        let rest = self.text.get(at..)?;
        let body = rest.trim_start();
        let at = at + (rest.len() - body.len());
        if body.starts_with("</function>") {
            out.push_back(Output::ToolCallArgs(if first { "{}" } else { "}" }.into()));
            return Some(AutoState::Idle);
        }
        let Some(after) = body.strip_prefix("<parameter=") else {
            // Still a prefix of a tag, or (the grammar does not allow it) something else: wait, or leave the call.
            let waiting = ["</function>", "<parameter="].iter().any(|t| t.starts_with(body));
            return if waiting { None } else { Some(AutoState::Idle) };
        };
        let key_len = after.find('>')?;
        let key_start = at + "<parameter=".len();
        let key = &after[..key_len];
        let mut piece = String::from(if first { "{" } else { ", " });
        piece.push_str(&serde_json::to_string(key).unwrap_or_default());
        piece.push_str(": ");
        if self.kind(tool, key) == ParamKind::Text {
            piece.push('"');
        }
        out.push_back(Output::ToolCallArgs(piece));
        let start = key_start + key_len + 1;
        Some(AutoState::XmlValue { tool, key: (key_start, key_start + key_len), start, sent: 0 })
    }

    /// An XML parameter's value: a string streamed as it is written, any other value once closed. The next state, or
    /// `Err(sent)` (what has been streamed now) to wait for more text.
    fn xml_value(
        &self,
        tool: usize,
        key: (usize, usize),
        start: usize,
        sent: usize,
        out: &mut VecDeque<Output>,
    ) -> Result<AutoState, usize> {
        let raw = self.text.get(start..).ok_or(sent)?;
        let name = &self.text[key.0..key.1];
        let close = raw.find(PARAMETER_CLOSE);
        let at = start + close.map_or(0, |c| c + PARAMETER_CLOSE.len());
        let next = AutoState::XmlParams { tool, at, first: false };
        if self.kind(tool, name) != ParamKind::Text {
            let Some(c) = close else { return Err(sent) };
            let schema = self.schema(tool, name);
            // (The grammar writes only values of the schema's types; were one not, the text stands as a string.)
            let value = qwen3_xml::parameter_value_for(&raw[..c], schema)
                .unwrap_or_else(|| Value::String(qwen3_xml::strip_layout(&raw[..c]).to_owned()));
            out.push_back(Output::ToolCallArgs(value.to_string()));
            return Ok(next);
        }
        let (value, done) = match close {
            Some(c) => (qwen3_xml::strip_layout(&raw[..c]), true),
            // Not closed: at most 11 bytes of the closing tag are here, and the value ends at most one newline before
            // it, so all but the last `PARAMETER_CLOSE.len()` bytes are the value's.
            None if raw.is_empty() => return Err(sent),
            None => {
                let value = raw.strip_prefix('\n').unwrap_or(raw);
                let mut end = value.len().saturating_sub(PARAMETER_CLOSE.len()).max(sent);
                while !value.is_char_boundary(end) {
                    end -= 1;
                }
                (&value[..end], false)
            }
        };
        let mut piece = json_string_body(&value[sent..]);
        if done {
            piece.push('"');
        }
        if !piece.is_empty() {
            out.push_back(Output::ToolCallArgs(piece));
        }
        if done { Ok(next) } else { Err(value.len()) }
    }

    /// The schema of parameter `key` of `tools[tool]` (`None`: undeclared).
    fn schema(&self, tool: usize, key: &str) -> Option<&Value> {
        self.tools[tool].1.get("properties")?.get(key)
    }

    fn kind(&self, tool: usize, key: &str) -> ParamKind {
        self.schema(tool, key).map_or(ParamKind::Mixed, qwen3_xml::param_kind)
    }
}

/// `s` escaped as the inside of a JSON string (escaping is per character, so pieces escape to the whole's pieces).
fn json_string_body(s: &str) -> String {
    let quoted = serde_json::to_string(s).unwrap_or_default();
    quoted[1..quoted.len() - 1].to_owned()
}

/// Reads `<tool_call>` (blanks) `<function=NAME>` at the start of `s`: the name and where the parameters start.
fn xml_head(s: &str) -> Head {
    let prefix = |s: &str, lit: &str| if s.len() < lit.len() { lit.starts_with(s) } else { s.starts_with(lit) };
    let tag = "<tool_call>";
    if !prefix(s, tag) {
        return Head::NotStreamable;
    }
    let Some(rest) = s.strip_prefix(tag) else { return Head::Incomplete };
    let body = rest.trim_start();
    if body.is_empty() {
        return Head::Incomplete;
    }
    if !prefix(body, "<function=") {
        return Head::NotStreamable;
    }
    let Some(after) = body.strip_prefix("<function=") else { return Head::Incomplete };
    let Some(end) = after.find('>') else { return Head::Incomplete };
    let offset = s.len() - after.len() + end + 1;
    Head::Args { name: after[..end].to_owned(), offset }
}

/// What the start of a held call shows so far.
#[derive(Debug, PartialEq)]
enum Head {
    Incomplete,
    /// Not the `{"name": ..., "arguments": {` shape this streams (left to the output parser).
    NotStreamable,
    /// The name, and where the arguments object starts (offset of its `{`).
    Args {
        name: String,
        offset: usize,
    },
}

/// Reads `[<tool_call>] { "name" : "NAME" , "arguments" : {` (JSON whitespace anywhere) at the start of `s`.
fn call_head(s: &str, tagged: bool) -> Head {
    let b = s.as_bytes();
    let mut i = 0;
    let ws = |i: &mut usize| {
        while *i < b.len() && b[*i].is_ascii_whitespace() {
            *i += 1;
        }
    };
    // Expects `lit` at `i`: Some(true) matched, Some(false) mismatch, None too short.
    let lit = |i: &mut usize, lit: &[u8]| -> Option<bool> {
        let n = lit.len().min(b.len() - *i);
        if b[*i..*i + n] != lit[..n] {
            return Some(false);
        }
        if n < lit.len() {
            return None;
        }
        *i += n;
        Some(true)
    };
    macro_rules! expect {
        ($lit:expr) => {
            ws(&mut i);
            match lit(&mut i, $lit) {
                Some(true) => {}
                Some(false) => return Head::NotStreamable,
                None => return Head::Incomplete,
            }
        };
    }
    if tagged {
        expect!(b"<tool_call>");
    }
    expect!(b"{");
    expect!(b"\"name\"");
    expect!(b":");
    ws(&mut i);
    // The name: a JSON string.
    let Some(rest) = s.get(i..) else { return Head::Incomplete };
    let mut values = serde_json::Deserializer::from_str(rest).into_iter::<String>();
    let name = match values.next() {
        Some(Ok(name)) => name,
        Some(Err(e)) if e.is_eof() => return Head::Incomplete,
        None => return Head::Incomplete,
        Some(Err(_)) => return Head::NotStreamable,
    };
    i += values.byte_offset();
    expect!(b",");
    expect!(b"\"arguments\"");
    expect!(b":");
    ws(&mut i);
    match b.get(i) {
        None => Head::Incomplete,
        Some(b'{') => Head::Args { name, offset: i },
        Some(_) => Head::NotStreamable,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::lazy_call::CallStart;

    #[test]
    fn forced_call_streams_exactly_the_arguments_at_any_split() {
        let args = r#"{"path": "src/ü.rs", "content": "fn main() {}\n}"}"#;
        let text = format!("{{\"name\": \"write_file\", \"arguments\": {args}}}\n</tool_call>");
        let run = |pieces: &[&str]| {
            let mut f = ForcedCall::default();
            let mut out = VecDeque::new();
            for p in pieces {
                f.push(p, &mut out);
            }
            f.finish(&mut out);
            let mut name = None;
            let mut joined = String::new();
            for o in out {
                match o {
                    Output::ToolCallBegin { name: n } => {
                        assert!(name.is_none() && joined.is_empty(), "begin comes first, once");
                        name = Some(n);
                    }
                    Output::ToolCallArgs(a) => joined.push_str(&a),
                    other => panic!("unexpected {other:?}"),
                }
            }
            (name, joined)
        };
        let want = (Some("write_file".to_string()), args.to_string());
        assert_eq!(run(&[&text]), want);
        for i in (1..text.len()).filter(|&i| text.is_char_boundary(i)) {
            assert_eq!(run(&[&text[..i], &text[i..]]), want, "split at {i}");
        }
        let chars: Vec<String> = text.chars().map(String::from).collect();
        assert_eq!(run(&chars.iter().map(String::as_str).collect::<Vec<_>>()), want, "one char at a time");
    }

    /// Runs `AutoCalls` over `pieces` with the call starts the grammar would list; returns (name, joined arguments)
    /// per streamed call, checking that each call's name comes before its arguments.
    fn auto_calls(starts: &[(usize, bool)], pieces: &[&str]) -> Vec<(String, String)> {
        let starts: Vec<CallStart> =
            starts.iter().map(|&(offset, tagged)| CallStart { offset, tagged, xml: false }).collect();
        auto_calls_with(&starts, &[], pieces)
    }

    fn auto_calls_with(starts: &[CallStart], tools: &[(String, Value)], pieces: &[&str]) -> Vec<(String, String)> {
        let shared = CallStarts::default();
        let mut a = AutoCalls::new(shared.clone(), tools);
        let mut out = VecDeque::new();
        let mut seen = 0;
        for p in pieces {
            // The engine lists a start before the reply sees its text.
            seen += p.len();
            let mut list = shared.lock().unwrap();
            for &start in starts {
                if start.offset < seen && !list.contains(&start) {
                    list.push(start);
                }
            }
            drop(list);
            a.push(p, &mut out);
        }
        let mut calls: Vec<(String, String)> = Vec::new();
        for o in out {
            match o {
                Output::ToolCallBegin { name } => calls.push((name, String::new())),
                Output::ToolCallArgs(x) => calls.last_mut().expect("begin comes first").1.push_str(&x),
                other => panic!("unexpected {other:?}"),
            }
        }
        calls
    }

    #[test]
    fn auto_calls_stream_exactly_the_arguments_at_any_split() {
        let args1 = "{\n    \"file_path\": \"a/ü.txt\",\n    \"content\": \"}{ \\\" ]\"\n  }";
        let args2 = r#"{"command": "ls", "env": {"A": [1, {"b": 2}]}}"#;
        let text = format!(
            "Sure.\n```json\n{{\n  \"name\": \"Write\",\n  \"arguments\": {args1}\n}}\n```\n<tool_call>\n{{\"name\": \"Bash\", \"arguments\": {args2}}}\n</tool_call>"
        );
        let first = text.find('{').unwrap();
        let second = text.find("<tool_call>").unwrap();
        let starts = [(first, false), (second, true)];
        let want = vec![("Write".to_string(), args1.to_string()), ("Bash".to_string(), args2.to_string())];
        assert_eq!(auto_calls(&starts, &[&text]), want);
        for i in (1..text.len()).filter(|&i| text.is_char_boundary(i)) {
            assert_eq!(auto_calls(&starts, &[&text[..i], &text[i..]]), want, "split at {i}");
        }
        let chars: Vec<String> = text.chars().map(String::from).collect();
        assert_eq!(auto_calls(&starts, &chars.iter().map(String::as_str).collect::<Vec<_>>()), want);
        // A held call in another shape (arguments first) is left to the output parser.
        let odd = "{\"arguments\": {}, \"name\": \"Bash\"}";
        assert!(auto_calls(&[(0, false)], &[odd]).is_empty());
    }

    #[test]
    fn xml_calls_stream_the_arguments_the_parser_reads_at_any_split() {
        let tools = vec![
            (
                "Bash".to_string(),
                json!({"type": "object", "properties": {"command": {"type": "string"}, "timeout": {"type": "number"},
                       "env": {"type": "object"}, "tag": {"type": ["integer", "string"]}}, "required": ["command"]}),
            ),
            ("noop".to_string(), json!({"type": "object"})),
        ];
        // A string that looks like a number, one ending in a newline and holding `</param`, a number, an object,
        // a value that may be an integer or a string; then a call with no parameters.
        let first = "<tool_call>\n<function=Bash>\n<parameter=command>\n42\n</parameter>\n<parameter=timeout>\n30\n</parameter>\n<parameter=env>\n{\"A\": [1, \"\\\"\"]}\n</parameter>\n<parameter=tag>\nv2\n</parameter>\n</function>\n</tool_call>";
        let second = "<tool_call>\n<function=Bash>\n<parameter=command>\necho 'é </param' >> ü.txt\n\n</parameter>\n<parameter=tag>\n7\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=noop>\n</function>\n</tool_call>";
        let text = format!("Running it.\n{first}\n{second}");
        let at = |needle: &str, from: usize| from + text[from..].find(needle).unwrap();
        let a = at("<tool_call>", 0);
        let b = at("<tool_call>", a + 1);
        let c = at("<tool_call>", b + 1);
        let starts: Vec<CallStart> =
            [a, b, c].iter().map(|&offset| CallStart { offset, tagged: true, xml: true }).collect();
        // What the output parser reads.
        let mut parser = chat::ToolCallParser::new(tools.iter().map(|t| t.0.clone())).with_schemas(&tools);
        let mut events = parser.push(&text);
        events.extend(parser.finish());
        let want: Vec<(String, Value)> = events
            .into_iter()
            .filter_map(|e| if let chat::ParseEvent::ToolCall(c) = e { Some((c.name, c.arguments)) } else { None })
            .collect();
        assert_eq!(want[0].1, json!({"command": "42", "timeout": 30, "env": {"A": [1, "\""]}, "tag": "v2"}));
        assert_eq!(want[1].1, json!({"command": "echo 'é </param' >> ü.txt\n", "tag": 7}));
        assert_eq!(want[2].1, json!({}));
        let parsed = |calls: Vec<(String, String)>| -> Vec<(String, Value)> {
            calls
                .into_iter()
                .map(|(n, a)| (n, serde_json::from_str(&a).expect("streamed arguments are JSON")))
                .collect()
        };
        assert_eq!(parsed(auto_calls_with(&starts, &tools, &[&text])), want);
        for i in (1..text.len()).filter(|&i| text.is_char_boundary(i)) {
            assert_eq!(parsed(auto_calls_with(&starts, &tools, &[&text[..i], &text[i..]])), want, "split at {i}");
        }
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let calls = auto_calls_with(&starts, &tools, &chars.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(parsed(calls), want);
        // A string value streams as it is written, before its closing tag: all but its last 12 bytes, which could
        // still be its closing newline and tag.
        let cut = at("' >> ü.txt", b) + "' >> ü.txt".len();
        let calls = auto_calls_with(&starts, &tools, &[&text[..cut]]);
        assert_eq!(calls[1].1, "{\"command\": \"echo 'é </para");
    }
}
