//! Tool-call arguments streamed as they are generated: a grammar-forced call ([`ForcedCall`]) and the calls the
//! lazy tool grammar holds under an auto tool choice ([`AutoCalls`]). Both only announce a call's name and pass its
//! argument text on; the output parser still reports each complete call.

use std::collections::VecDeque;

use chat::tool_parser::{JsonEnd, JsonScanner};

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
#[derive(Debug)]
pub(super) struct AutoCalls {
    starts: CallStarts,
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
    /// A call starts at this offset; its name and arguments key are not complete yet.
    Head { start: usize, tagged: bool },
    /// Streaming arguments: `sent` bytes of `text` are out (and scanned: the scanner holds the bracket depth).
    Args { sent: usize, scanner: JsonScanner },
}

impl AutoCalls {
    pub(super) fn new(starts: CallStarts) -> Self {
        AutoCalls { starts, text: String::new(), num_seen: 0, state: AutoState::Idle }
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
                            self.state = AutoState::Head { start: s.offset, tagged: s.tagged };
                        }
                        _ => return,
                    }
                }
                // (`get`: the offset counts the bytes the grammar saw; text that was not valid UTF-8 may have
                // been replaced here, and then the shape check below fails instead of slicing mid-character.)
                AutoState::Head { start, tagged } => {
                    match self.text.get(start..).map_or(Head::NotStreamable, |s| call_head(s, tagged)) {
                        Head::Incomplete => return,
                        Head::NotStreamable => self.state = AutoState::Idle,
                        Head::Args { name, offset } => {
                            out.push_back(Output::ToolCallBegin { name });
                            let at = start + offset;
                            self.state = AutoState::Args { sent: at, scanner: JsonScanner::default() };
                        }
                    }
                }
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
    use super::*;

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
        let shared = CallStarts::default();
        let mut a = AutoCalls::new(shared.clone());
        let mut out = VecDeque::new();
        let mut seen = 0;
        for p in pieces {
            // The engine lists a start before the reply sees its text.
            seen += p.len();
            let mut list = shared.lock().unwrap();
            for &(offset, tagged) in starts {
                let start = crate::lazy_call::CallStart { offset, tagged };
                if offset < seen && !list.contains(&start) {
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
}
