//! Lazy tool-call grammar for `tool_choice: auto`: decoding is free until the model starts writing a call in one of
//! the forms the output parser reads (`chat::ToolCallParser`); from there on, llguidance holds the rest of the call to
//! a well-formed one: `name` one of the declared tools, `arguments` valid under that tool's schema, then the closing
//! tag or fence. (llama.cpp calls this a lazy grammar with triggers.)
//!
//! In: the declared tools (name → parameter schema), whether the template writes Qwen3-Coder's XML form, whether
//! several calls may follow each other, and the model's tokenizer. Out: an `engine::TokenConstraint` that is dormant
//! (allows every token) until a trigger, then masks the logits until the call is complete, then is dormant again (or
//! ends generation when only one call is wanted).
//!
//! Triggers, on the text generated so far:
//! * `<tool_call>` anywhere: the rest of the tag is a call (JSON, or also the XML form when the template uses it, its
//!   values typed by the tool's schema);
//! * at the start of a line, a fence whose info string is one the parser accepts (```` ```json ````, ```` ``` ````,
//!   ```` ```tool_call ````, ...), then on the next line an object whose first key is `"name"`: the object is a call
//!   and the fence closes after it;
//! * at the start of a line, a bare object whose first key is `"name"`.
//!
//! A fenced block in another language, JSON whose first key is not `"name"`, arrays and braces in the middle of a
//! line never trigger, so ordinary prose and code are left alone (the price: an object that does start with `"name"`,
//! such as a `package.json` in a json fence, is taken for a call). The part of the call written before the trigger
//! fired (`{\n  "name":`) is replayed into the grammar byte by byte, so the model's own layout is kept; if the
//! grammar cannot accept it, the candidate is left alone.
//!
//! For a thinking model ([`LazyToolCalls::wait_for_reasoning`]) nothing triggers inside the reasoning block at the
//! start of the output (`<think>` … `</think>`): the reasoning is not parsed for calls, so it is not held to one.

use std::sync::Arc;

use llguidance::Matcher;
use llguidance::api::TopLevelGrammar;
use serde_json::{Value, json};

use chat::tool_parser::qwen3_xml::{self, ParamKind};
use chat::tool_parser::{FENCE_LANGS, MAX_FENCE_INFO_BYTES};

use crate::constraint::factory;
use crate::error::ApiError;

/// The opening tag of a call, the fences' info strings and how long one is waited for are the parser's own
/// (`chat::tool_parser`), so a trigger fires exactly where the parser would read a call.
const TAG_OPEN: &[u8] = chat::tool_parser::TAG_OPEN.as_bytes();
const THINK_OPEN: &[u8] = b"<think>";
const THINK_CLOSE: &[u8] = b"</think>";
/// The key that makes an object a call.
const NAME_KEY: &[u8] = b"\"name\"";
/// Whitespace allowed between JSON tokens of a call: enough for the models' pretty-printed calls, too little to pad.
const JSON_WHITESPACE: &str = r"[\x20\x0A\x0D\x09]{1,40}";

/// How a call is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    /// `<tool_call>` … `</tool_call>`, starting at the tag.
    Tag,
    /// A call object in a fenced block, starting at its `{`; the fence closes after it.
    Fence,
    /// A bare call object, starting at its `{`.
    Bare,
}

impl Form {
    fn index(self) -> usize {
        self as usize
    }
}

/// Is the text at a candidate position a call (`Yes` at this offset, of this form), not one, or still open?
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Yes(usize, Form),
    No,
    Maybe,
}

/// Where a call the grammar holds starts in the output (byte offset, text as the detokenizer gives it), whether it
/// starts with `<tool_call>` (else at its `{`), and whether the tags may hold Qwen3-Coder's XML form (the template
/// writes it; the JSON form stays allowed there). Such calls are listed only when the grammar types their values
/// (not with the loose fallback), so the reply can stream exactly the arguments the output parser will read. Shared with the reply, which reads the output after the engine
/// committed it, so a start is always listed before the reply sees its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallStart {
    pub offset: usize,
    pub tagged: bool,
    pub xml: bool,
}

/// The starts of the calls of one reply, in order.
pub type CallStarts = Arc<std::sync::Mutex<Vec<CallStart>>>;

/// Where the output stands with respect to a reasoning block at its start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gate {
    /// Blanks or part of `<think>` so far; `opened`: the prompt opened the reasoning already.
    Start { opened: bool },
    /// Inside the reasoning; `</think>` is looked for from this offset.
    Reasoning { from: usize },
}

/// The lazy grammar of one request.
pub struct LazyToolCalls {
    /// Triggers wait for the end of the reasoning.
    gate: Option<Gate>,
    starts: CallStarts,
    xml: bool,
    /// The grammars are the loose fallback (any object as arguments, any text as an XML value).
    loose: bool,
    tokenizer: Arc<tokenizer::Tokenizer>,
    /// The grammar of each form, compiled on first use.
    grammars: [Option<Matcher>; 3],
    lark: [String; 3],
    /// Single-byte token of each byte, to replay text into the grammar.
    byte_tokens: Vec<Option<u32>>,
    parallel: bool,
    /// The output so far (control tokens left out, as the detokenizer does).
    text: Vec<u8>,
    /// Where line candidates are looked for next, and whether that position starts a line.
    line_from: usize,
    line_from_is_start: bool,
    /// Where the next `<tool_call>` is looked for.
    tag_from: usize,
    /// The call being written, under its grammar.
    active: Option<Matcher>,
    num_calls: usize,
    finished: bool,
}

impl std::fmt::Debug for LazyToolCalls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LazyToolCalls")
            .field("active", &self.active.is_some())
            .field("num_calls", &self.num_calls)
            .finish_non_exhaustive()
    }
}

/// The JSON schema of one call object `{"name": NAME, "arguments": ARGS}` of one of `tools`, with the options of a
/// call the model lays out itself (flexible but bounded whitespace; schema features llguidance lacks are ignored).
fn call_schema(tools: &[(String, Value)], loose: bool) -> Value {
    with_call_options(crate::constraint::call_object_schema(tools, loose))
}

/// `schema` with the options of JSON the model lays out itself, as llguidance's `x-guidance`.
fn with_call_options(mut schema: Value) -> Value {
    if let Some(o) = schema.as_object_mut() {
        o.insert(
            "x-guidance".into(),
            json!({"whitespace_flexible": true, "whitespace_pattern": JSON_WHITESPACE, "coerce_one_of": true,
                   "lenient": true}),
        );
    }
    schema
}

/// A Lark string literal.
fn lark_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// Required parameters of one tool up to which they may come in any order (the grammar has a rule per subset of
/// them still to come); a tool with more takes them in the order it declares them.
const MAX_UNORDERED_REQUIRED: usize = 4;

/// The rules of Qwen3-Coder's XML call inside the tags (`xcall`): `<function=NAME>`, then that tool's parameters as `<parameter=KEY>` …
/// `</parameter>`, then `</function>`. Each value is written the way the output parser reads it
/// (`chat::tool_parser::qwen3_xml::ParamKind`): any text up to the closing tag for a parameter that may be a string,
/// JSON under the parameter's own schema (objects closed, as in the JSON form) for one that may not. Every required
/// parameter comes once, in any order (beyond [`MAX_UNORDERED_REQUIRED`], in the declared order), optional ones
/// between them; an undeclared key only for a tool that takes them. (llama.cpp's grammar for the form,
/// `common/parsers/qwen3-coder.cpp`, takes the required ones in any order too, and the optional ones after them.)
/// `loose`: every value is text.
fn xml_call_rules(tools: &[(String, Value)], loose: bool) -> String {
    let mut rules = String::new();
    let mut alternatives = Vec::new();
    for (i, (name, parameters)) in tools.iter().enumerate() {
        let mut closed = parameters.clone();
        crate::constraint::close_objects(&mut closed);
        let properties = closed.get("properties").and_then(Value::as_object).cloned().unwrap_or_default();
        let required: Vec<&str> = parameters
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let (mut req, mut opt) = (Vec::new(), Vec::new());
        for (j, (key, schema)) in properties.iter().enumerate() {
            let open = lark_str(&format!("<parameter={key}>"));
            let value = if loose || qwen3_xml::param_kind(schema) != ParamKind::Json {
                "value".to_string()
            } else {
                rules.push_str(&format!("j{i}_{j}: %json {}\n", with_call_options(schema.clone())));
                format!("WS j{i}_{j} WS \"</parameter>\"")
            };
            rules.push_str(&format!("p{i}_{j}: {open} {value}\n"));
            if required.contains(&key.as_str()) { req.push(format!("p{i}_{j}")) } else { opt.push(format!("p{i}_{j}")) }
        }
        if qwen3_xml::takes_undeclared(parameters) {
            opt.push("\"<parameter=\" KEY \">\" value".into());
        }
        let optional = !opt.is_empty();
        if optional {
            rules.push_str(&format!("o{i}: {}\n", opt.join(" | ")));
        }
        let any_optional = if optional { format!("(o{i} WS)* ") } else { String::new() };
        let args = if req.len() > MAX_UNORDERED_REQUIRED {
            let chain: Vec<String> = req.iter().map(|p| format!("{any_optional}{p} WS")).collect();
            format!("{} {any_optional}", chain.join(" "))
        } else {
            // s{i}_{m}: the arguments from where the required parameters in bit set `m` are still to come.
            let full = (1usize << req.len()) - 1;
            let state = |m: usize| if m == 0 && !optional { String::new() } else { format!("s{i}_{m}") };
            if optional {
                rules.push_str(&format!("s{i}_0: {any_optional}\n"));
            }
            for m in 1..=full {
                let mut alts: Vec<String> = (0..req.len())
                    .filter(|k| m & (1 << k) != 0)
                    .map(|k| format!("{} WS {}", req[k], state(m & !(1 << k))))
                    .collect();
                if optional {
                    alts.push(format!("o{i} WS s{i}_{m}"));
                }
                rules.push_str(&format!("s{i}_{m}: {}\n", alts.join(" | ")));
            }
            state(full)
        };
        rules.push_str(&format!("f{i}: {} WS {args} \"</function>\"\n", lark_str(&format!("<function={name}>"))));
        alternatives.push(format!("f{i}"));
    }
    format!(
        "xcall: {}\n{rules}KEY: /[A-Za-z0-9_.-]+/\nvalue[suffix=\"</parameter>\"]: /(?s:.*)/\n",
        alternatives.join(" | ")
    )
}

/// The Lark grammars of the three forms.
fn grammars(tools: &[(String, Value)], xml: bool, loose: bool) -> [String; 3] {
    let schema = call_schema(tools, loose);
    let call = format!("call: %json {schema}\nWS: /[ \\t\\r\\n]{{0,8}}/\n");
    // Where the template shows the XML form, the JSON one inside the tags is still a call (the output parser reads
    // both there).
    let tag = if xml {
        format!("start: \"<tool_call>\" WS (xcall | call) WS \"</tool_call>\"\n{call}{}", xml_call_rules(tools, loose))
    } else {
        format!("start: \"<tool_call>\" WS call WS \"</tool_call>\"\n{call}")
    };
    // After a fenced call, the closing fence; after a bare one, the end of its line or the end of the reply (the
    // output parser reads a bare call that ends the reply). The blanks before either are bounded: with `[ \t]*` a
    // model that wanted to end its reply right after a bare call's `}` could only write blanks, and did, for
    // thousands of tokens (Codex on the 0.5B, until the loop guard stopped it).
    [
        tag,
        format!("start: call /[ \\t]{{0,8}}\\n```/\n{call}"),
        format!("start: call line_end?\nline_end: /[ \\t]{{0,8}}\\n/\n{call}"),
    ]
}

impl LazyToolCalls {
    /// The lazy grammar of calls to `tools` (name → parameter schema). `xml`: the template shows Qwen3-Coder's XML
    /// form inside the tags. `parallel`: several calls may follow each other (else generation ends after the first).
    /// Tools whose schemas llguidance cannot compile fall back to any JSON object as arguments.
    pub fn new(
        tokenizer: &Arc<tokenizer::Tokenizer>,
        tools: &[(String, Value)],
        xml: bool,
        parallel: bool,
    ) -> Result<LazyToolCalls, ApiError> {
        if tools.is_empty() {
            return Err(ApiError::invalid_param("tools", "A tool-call grammar needs at least one tool."));
        }
        let mut byte_tokens = vec![None; 256];
        for id in 0..tokenizer.vocab_size() as u32 {
            if let [b] = tokenizer.token_bytes(id)
                && !tokenizer.is_control(id)
                && byte_tokens[*b as usize].is_none()
            {
                byte_tokens[*b as usize] = Some(id);
            }
        }
        let mut lazy = LazyToolCalls {
            gate: None,
            starts: CallStarts::default(),
            xml,
            loose: false,
            tokenizer: tokenizer.clone(),
            grammars: [None, None, None],
            lark: grammars(tools, xml, false),
            byte_tokens,
            parallel,
            text: Vec::new(),
            line_from: 0,
            line_from_is_start: true,
            tag_from: 0,
            active: None,
            num_calls: 0,
            finished: false,
        };
        // Compile the JSON form (and the XML one where the template uses it) now: a schema llguidance rejects is
        // known before the request runs.
        if lazy.grammar(Form::Bare).is_err() || (xml && lazy.grammar(Form::Tag).is_err()) {
            lazy.lark = grammars(tools, xml, true);
            lazy.loose = true;
            lazy.grammars = [None, None, None];
            lazy.grammar(Form::Bare)?;
        }
        Ok(lazy)
    }

    /// The model thinks first (its template writes `<think>` … `</think>`): no call is looked for inside a reasoning
    /// block at the start of the output. `prompt_opened`: the prompt ends inside the reasoning.
    pub fn wait_for_reasoning(&mut self, prompt_opened: bool) {
        self.gate = Some(Gate::Start { opened: prompt_opened });
    }

    /// Follows the reasoning block at the start of the output; true while triggers must wait. Once it is over, the
    /// search for calls starts right after it (as the content the output parser reads does).
    fn in_reasoning(&mut self) -> bool {
        loop {
            match self.gate {
                None => return false,
                Some(Gate::Start { opened }) => {
                    let body = self.text.trim_ascii_start();
                    if body.starts_with(THINK_OPEN) {
                        let from = self.text.len() - body.len() + THINK_OPEN.len();
                        self.gate = Some(Gate::Reasoning { from });
                    } else if THINK_OPEN.starts_with(body) {
                        return true;
                    } else if opened {
                        self.gate = Some(Gate::Reasoning { from: 0 });
                    } else {
                        self.gate = None;
                    }
                }
                Some(Gate::Reasoning { from }) => match find(&self.text, THINK_CLOSE, from) {
                    Some(p) => {
                        let end = p + THINK_CLOSE.len();
                        self.gate = None;
                        self.line_from = end;
                        self.line_from_is_start = true;
                        self.tag_from = end;
                    }
                    None => {
                        let from = self.text.len().saturating_sub(THINK_CLOSE.len() - 1).max(from);
                        self.gate = Some(Gate::Reasoning { from });
                        return true;
                    }
                },
            }
        }
    }

    /// Where the calls held by the grammar start, filled in as they start.
    pub fn call_starts(&self) -> CallStarts {
        self.starts.clone()
    }

    /// Calls completed under the grammar so far.
    pub fn num_calls(&self) -> usize {
        self.num_calls
    }

    /// A fresh matcher of `form`'s grammar.
    fn grammar(&mut self, form: Form) -> Result<Matcher, ApiError> {
        let slot = &mut self.grammars[form.index()];
        if let Some(m) = slot {
            return Ok(m.clone());
        }
        let parser = factory(&self.tokenizer)?
            .create_parser(TopLevelGrammar::from_lark(self.lark[form.index()].clone()))
            .map_err(|e| ApiError::invalid_param("tools", format!("The tool schemas cannot be used: {e}")))?;
        let m = Matcher::new(Ok(parser));
        if let Some(e) = m.get_error() {
            return Err(ApiError::invalid_param("tools", format!("The tool schemas cannot be used: {e}")));
        }
        *slot = Some(m.clone());
        Ok(m)
    }

    /// Looks for the start of a call in the text not yet decided.
    fn find_trigger(&mut self) -> Option<(usize, Form)> {
        let tag = find(&self.text, TAG_OPEN, self.tag_from).map(|p| (p, Form::Tag));
        if tag.is_none() {
            self.tag_from = self.text.len().saturating_sub(TAG_OPEN.len() - 1).max(self.tag_from);
        }
        let mut line = None;
        let mut i = self.line_from;
        let mut is_start = self.line_from_is_start;
        loop {
            if is_start {
                match line_verdict(&self.text[i..]) {
                    Verdict::Yes(offset, form) => {
                        line = Some((i + offset, form));
                        break;
                    }
                    Verdict::Maybe => break,
                    Verdict::No => {}
                }
            }
            match self.text[i..].iter().position(|&b| b == b'\n') {
                Some(n) => {
                    i += n + 1;
                    is_start = true;
                }
                None => {
                    i = self.text.len();
                    is_start = false;
                    break;
                }
            }
        }
        self.line_from = i;
        self.line_from_is_start = is_start;
        match (tag, line) {
            (Some(t), Some(l)) => Some(if l.0 < t.0 { l } else { t }),
            (t, l) => t.or(l),
        }
    }

    /// Starts the grammar of a call at `start`, replaying the text already written; false (and the candidate
    /// skipped) when the grammar does not accept it.
    fn activate(&mut self, start: usize, form: Form) -> bool {
        let skip = |s: &mut Self| match form {
            Form::Tag => s.tag_from = start + 1,
            Form::Fence | Form::Bare => {
                // Go on with the line after the candidate's `{`.
                s.line_from = start;
                s.line_from_is_start = false;
            }
        };
        let Ok(mut m) = self.grammar(form) else {
            skip(self);
            return false;
        };
        let ids: Option<Vec<u32>> = self.text[start..].iter().map(|&b| self.byte_tokens[b as usize]).collect();
        let accepted = ids.is_some_and(|ids| m.consume_tokens(&ids).is_ok() && !m.is_error());
        if !accepted {
            skip(self);
            return false;
        }
        // Another call cannot start inside this one.
        self.tag_from = self.text.len();
        let xml = self.xml && form == Form::Tag;
        if !(xml && self.loose) {
            let start = CallStart { offset: start, tagged: form == Form::Tag, xml };
            self.starts.lock().unwrap_or_else(|e| e.into_inner()).push(start);
        }
        self.active = Some(m);
        self.check_complete();
        true
    }

    /// Ends the active call when its grammar is complete.
    fn check_complete(&mut self) {
        if self.active.as_ref().is_some_and(Matcher::is_stopped) {
            self.active = None;
            self.num_calls += 1;
            self.finished = !self.parallel;
            self.line_from = self.text.len();
            self.line_from_is_start = self.text.last() == Some(&b'\n');
            self.tag_from = self.text.len();
        }
    }
}

/// The first occurrence of `needle` in `hay` at or after `from`.
fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    hay.get(from..)?.windows(needle.len()).position(|w| w == needle).map(|p| p + from)
}

/// What starts at a line start: a fence or bare object that is a call, or not, or not known yet.
fn line_verdict(line: &[u8]) -> Verdict {
    let indent = line.iter().take_while(|&&b| b == b' ' || b == b'\t').count();
    let rest = &line[indent..];
    if rest.is_empty() {
        return Verdict::Maybe;
    }
    if rest[0] == b'`' {
        if rest.len() < 3 {
            return if rest.iter().all(|&b| b == b'`') { Verdict::Maybe } else { Verdict::No };
        }
        let Some(after) = rest.strip_prefix(b"```") else { return Verdict::No };
        let Some(nl) = after.iter().position(|&b| b == b'\n') else {
            return if after.len() > MAX_FENCE_INFO_BYTES { Verdict::No } else { Verdict::Maybe };
        };
        let lang = after[..nl].trim_ascii();
        if !FENCE_LANGS.iter().any(|l| l.as_bytes().eq_ignore_ascii_case(lang)) {
            return Verdict::No;
        }
        let body = &after[nl + 1..];
        let ws = body.iter().take_while(|b| b.is_ascii_whitespace()).count();
        return match object_verdict(&body[ws..]) {
            Verdict::Yes(..) => Verdict::Yes(indent + 3 + nl + 1 + ws, Form::Fence),
            v => v,
        };
    }
    match object_verdict(rest) {
        Verdict::Yes(..) => Verdict::Yes(indent, Form::Bare),
        v => v,
    }
}

/// Does `s` begin an object whose first key is `"name"`?
fn object_verdict(s: &[u8]) -> Verdict {
    if s.is_empty() {
        return Verdict::Maybe;
    }
    let Some(body) = s.strip_prefix(b"{") else { return Verdict::No };
    let body = body.trim_ascii_start();
    if body.starts_with(NAME_KEY) {
        Verdict::Yes(0, Form::Bare)
    } else if NAME_KEY.starts_with(body) {
        Verdict::Maybe
    } else {
        Verdict::No
    }
}

impl engine::TokenConstraint for LazyToolCalls {
    fn allowed_tokens(&mut self, allowed: &mut [u32]) -> Result<(), String> {
        let Some(m) = self.active.as_mut() else { return Ok(()) };
        let mask = m.compute_mask().map_err(|e| e.to_string())?;
        let words = mask.as_slice();
        // Where the grammar may end (a bare call's closing brace), every end-of-generation token may end the reply,
        // not only the one the grammar knows as its end (for Qwen the turn ends with `<|im_end|>`).
        let can_end = self
            .tokenizer
            .eos()
            .or_else(|| self.tokenizer.eog_ids().first().copied())
            .is_some_and(|e| mask.is_allowed(e));
        for (i, w) in allowed.iter_mut().enumerate() {
            *w &= words.get(i).copied().unwrap_or(0);
        }
        if can_end {
            for &e in self.tokenizer.eog_ids() {
                if let Some(w) = allowed.get_mut(e as usize / 32) {
                    *w |= 1 << (e % 32);
                }
            }
        }
        Ok(())
    }

    fn commit(&mut self, token: u32) -> Result<(), String> {
        if self.tokenizer.is_eog(token)
            && let Some(mut m) = self.active.take()
        {
            // The reply ends inside a call: it is complete if its grammar may end here (the mask allowed an end only
            // there).
            if m.is_accepting().unwrap_or(false) {
                self.num_calls += 1;
                self.finished = !self.parallel;
            }
            return Ok(());
        }
        let piece = self.tokenizer.piece(token, false);
        self.text.extend_from_slice(piece);
        if let Some(m) = self.active.as_mut() {
            m.consume_token(token).map_err(|e| e.to_string())?;
            self.check_complete();
            return Ok(());
        }
        if self.finished || self.in_reasoning() {
            return Ok(());
        }
        while let Some((start, form)) = self.find_trigger() {
            if self.activate(start, form) {
                break;
            }
        }
        Ok(())
    }

    fn is_finished(&self) -> bool {
        self.finished
    }

    fn is_dormant(&self) -> bool {
        self.active.is_none()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::OnceLock;

    use engine::TokenConstraint;

    use super::*;

    /// The real tokenizer of Qwen2.5-Coder-0.5B (the model cache has it).
    fn tokenizer() -> Arc<tokenizer::Tokenizer> {
        static TOKENIZER: OnceLock<Arc<tokenizer::Tokenizer>> = OnceLock::new();
        TOKENIZER
            .get_or_init(|| {
                let path = pack::resolve("qwen2.5-coder-0.5b").expect("the Qwen2.5-Coder-0.5B GGUF is in the cache");
                let file = gguf::GgufFile::open(&path).expect("GGUF opens");
                Arc::new(tokenizer::Tokenizer::from_gguf(&file).expect("tokenizer"))
            })
            .clone()
    }

    /// Claude Code's file tools, as it declares them.
    fn tools() -> Vec<(String, Value)> {
        vec![
            (
                "Write".into(),
                json!({"type": "object", "properties": {"file_path": {"type": "string"}, "content": {"type": "string"}},
                       "required": ["file_path", "content"], "additionalProperties": false,
                       "$schema": "http://json-schema.org/draft-07/schema#"}),
            ),
            (
                "Bash".into(),
                json!({"type": "object", "properties": {"command": {"type": "string"},
                       "timeout": {"type": "number", "exclusiveMinimum": 0}},
                       "required": ["command"], "additionalProperties": false}),
            ),
        ]
    }

    fn lazy(parallel: bool) -> LazyToolCalls {
        LazyToolCalls::new(&tokenizer(), &tools(), false, parallel).expect("grammar compiles")
    }

    fn is_allowed(c: &mut LazyToolCalls, token: u32) -> bool {
        let mut allowed = vec![u32::MAX; tokenizer().vocab_size().div_ceil(32)];
        c.allowed_tokens(&mut allowed).expect("mask");
        allowed[token as usize / 32] >> (token % 32) & 1 == 1
    }

    fn encode(text: &str) -> Vec<u32> {
        tokenizer().encode(text, true).expect("encode")
    }

    fn token(text: &str) -> u32 {
        let ids = encode(text);
        assert_eq!(ids.len(), 1, "{text:?} is one token");
        ids[0]
    }

    /// Every token id by its bytes (normal tokens only).
    fn by_bytes() -> &'static std::collections::HashMap<Vec<u8>, u32> {
        static MAP: OnceLock<std::collections::HashMap<Vec<u8>, u32>> = OnceLock::new();
        MAP.get_or_init(|| {
            let t = tokenizer();
            (0..t.vocab_size() as u32)
                .filter(|&id| !t.is_control(id) && !t.token_bytes(id).is_empty())
                .map(|id| (t.token_bytes(id).to_vec(), id))
                .collect()
        })
    }

    /// The model writes `text`, cut into pieces at `cuts` (byte offsets) and tokenized piece by piece, the way a
    /// model may split text anywhere. Where the constraint refuses the next token, the model writes the same text
    /// with the longest token it allows instead (as a model under a grammar does); `Err(offset)`: no allowed token
    /// continues the text there.
    fn write_text(c: &mut LazyToolCalls, text: &str, cuts: &[usize]) -> Result<(), usize> {
        let mut preferred = Vec::new();
        let mut last = 0;
        for &cut in cuts.iter().chain(std::iter::once(&text.len())) {
            preferred.extend(encode(&text[last..cut]));
            last = cut;
        }
        let bytes = text.as_bytes();
        let mut pos = 0;
        let mut next = 0;
        // Offsets where the preferred tokens end.
        let mut ends = Vec::new();
        let mut off = 0;
        for &t in &preferred {
            off += tokenizer().token_bytes(t).len();
            ends.push(off);
        }
        while pos < bytes.len() {
            while next < preferred.len() && ends[next] <= pos {
                next += 1;
            }
            let starts_here = next == 0 || ends[next - 1] == pos;
            let token = if starts_here && next < preferred.len() && is_allowed(c, preferred[next]) {
                preferred[next]
            } else {
                let mut alt = None;
                for len in (1..=(bytes.len() - pos).min(24)).rev() {
                    if let Some(&id) = by_bytes().get(&bytes[pos..pos + len])
                        && is_allowed(c, id)
                    {
                        alt = Some(id);
                        break;
                    }
                }
                alt.ok_or(pos)?
            };
            if c.is_dormant() {
                let mut allowed = vec![u32::MAX; tokenizer().vocab_size().div_ceil(32)];
                c.allowed_tokens(&mut allowed).expect("mask");
                assert!(allowed.iter().all(|&w| w == u32::MAX), "a dormant constraint masks nothing");
            }
            c.commit(token).expect("commit");
            pos += tokenizer().token_bytes(token).len();
        }
        Ok(())
    }

    #[test]
    fn prose_code_and_json_that_is_not_a_call_stay_free() {
        let text = "Sure! Here is the code:\n```python\nprint({\"name\": \"x\"})\n```\nAnd some JSON:\n```json\n{\"path\": \"a\", \"name\": \"Write\"}\n```\n[{\"name\": \"Write\"}]\nx = {\"name\": \"Bash\"}\n  {\"file_path\": \"p\"}\nDone.";
        for cuts in [vec![], (1..text.len()).collect::<Vec<_>>()] {
            let mut c = lazy(true);
            assert_eq!(write_text(&mut c, text, &cuts), Ok(()));
            assert!(c.is_dormant() && !c.is_finished() && c.num_calls() == 0);
        }
    }

    #[test]
    fn fenced_call_with_a_file_name_as_tool_name_is_held_to_a_declared_tool() {
        // What Qwen2.5-Coder-0.5B wrote with Claude Code's tools (see the closing note of issue 7).
        let mut c = lazy(true);
        let prefix = "I'll create the file.\n```json\n{\n  \"name\": \"";
        assert_eq!(write_text(&mut c, prefix, &[]), Ok(()));
        assert!(!c.is_dormant(), "the call has started");
        let hello = encode("hello.txt");
        assert!(!is_allowed(&mut c, hello[0]), "an undeclared name is refused");
        assert!(is_allowed(&mut c, token("Write")) && is_allowed(&mut c, token("B")));
        let rest = "Write\",\n  \"arguments\": {\"file_path\": \"hello.txt\", \"content\": \"hi\"}\n}\n```";
        assert_eq!(write_text(&mut c, rest, &[]), Ok(()));
        assert!(c.is_dormant() && c.num_calls() == 1 && !c.is_finished());
        // The output parser reads it as a call.
        let mut parser = chat::ToolCallParser::new(["Write", "Bash"]);
        let mut events = parser.push(&format!("{prefix}{rest}"));
        events.extend(parser.finish());
        assert_eq!(events.len(), 2, "{events:?}");
        let chat::ParseEvent::ToolCall(call) = &events[1] else { panic!("{events:?}") };
        assert_eq!(call.arguments, json!({"file_path": "hello.txt", "content": "hi"}));
    }

    #[test]
    fn arguments_follow_the_tool_schema() {
        let mut c = lazy(true);
        assert_eq!(write_text(&mut c, "{\"name\": \"Write\", \"arguments\": {\"", &[]), Ok(()));
        assert!(!is_allowed(&mut c, token("path")), "no property 'path'");
        assert!(is_allowed(&mut c, token("file")));
        // `content` is required: the object cannot close after `file_path` alone.
        assert_eq!(write_text(&mut c, "file_path\": \"a.txt\"", &[]), Ok(()));
        assert!(!is_allowed(&mut c, token("}")));
        assert_eq!(write_text(&mut c, ", \"content\": \"x\"}}\n", &[]), Ok(()));
        assert_eq!(c.num_calls(), 1);
        // A wrong key for the arguments is refused too.
        let mut c = lazy(true);
        assert_eq!(write_text(&mut c, "{\"name\": \"Bash\", \"", &[]), Ok(()));
        assert!(!is_allowed(&mut c, token("parameters")));
        assert!(is_allowed(&mut c, token("arguments")));
    }

    #[test]
    fn tagged_calls_one_after_another_and_parallel_off() {
        let text = "<tool_call>\n{\"name\": \"Bash\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"Write\", \"arguments\": {\"file_path\": \"a\", \"content\": \"b\"}}\n</tool_call>";
        let mut c = lazy(true);
        assert_eq!(write_text(&mut c, text, &[]), Ok(()));
        assert_eq!(c.num_calls(), 2);
        assert!(c.is_dormant() && !c.is_finished());
        let mut c = lazy(false);
        let first = text.find("</tool_call>").unwrap() + "</tool_call>".len();
        assert_eq!(write_text(&mut c, &text[..first], &[]), Ok(()));
        assert!(c.is_finished(), "one call is all that is wanted");
        // An undeclared name inside the tag is refused.
        let mut c = lazy(true);
        let text = "<tool_call>\n{\"name\": \"hello";
        assert_eq!(write_text(&mut c, text, &[]), Err(text.len() - "hello".len()));
    }

    #[test]
    fn pretty_bare_call_at_every_token_split() {
        let text = "{\n  \"name\": \"Bash\",\n  \"arguments\": {\n    \"command\": \"echo hi > hello.txt\"\n  }\n}\n";
        for cut in 1..text.len() {
            let mut c = lazy(true);
            assert_eq!(write_text(&mut c, text, &[cut]), Ok(()), "split at {cut}");
            assert_eq!(c.num_calls(), 1, "split at {cut}");
            assert!(c.is_dormant(), "split at {cut}");
        }
        // Byte by byte.
        let mut c = lazy(true);
        let cuts: Vec<usize> = (1..text.len()).collect();
        assert_eq!(write_text(&mut c, text, &cuts), Ok(()));
        assert_eq!(c.num_calls(), 1);
    }

    #[test]
    fn fenced_call_at_every_token_split() {
        let text = "Okay.\n```json\n{\"name\": \"Write\", \"arguments\": {\"file_path\": \"hello.txt\", \"content\": \"hi\"}}\n```";
        for cut in 1..text.len() {
            let mut c = lazy(true);
            assert_eq!(write_text(&mut c, text, &[cut]), Ok(()), "split at {cut}");
            assert_eq!(c.num_calls(), 1, "split at {cut}");
        }
    }

    #[test]
    fn a_call_cannot_run_on_past_its_end() {
        let mut c = lazy(true);
        assert_eq!(
            write_text(&mut c, "```json\n{\"name\": \"Bash\", \"arguments\": {\"command\": \"ls\"}}", &[]),
            Ok(())
        );
        // Inside the fence, after the object: only the closing fence (with optional blanks) may follow.
        assert!(!is_allowed(&mut c, token(",")));
        assert!(!is_allowed(&mut c, tokenizer().eos().expect("eos")));
        assert_eq!(write_text(&mut c, "\n```", &[]), Ok(()));
        assert!(c.is_dormant());
    }

    /// The id of the token whose text is exactly `text` (control tokens included).
    fn token_of(text: &str) -> u32 {
        let t = tokenizer();
        (0..t.vocab_size() as u32).find(|&id| t.token_bytes(id) == text.as_bytes()).expect("token exists")
    }

    #[test]
    fn arguments_hold_only_the_declared_keys_unless_the_schema_opens_them() {
        // Hermes declares `write_file` without `additionalProperties`; its 0.5B calls carried keys copied from the
        // prompt (`resolved_path`, ...). Those are refused now; a free-form object and an explicit `true` stay open.
        let tools = vec![
            (
                "write_file".to_string(),
                json!({"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                       "required": ["path", "content"]}),
            ),
            ("set_env".to_string(), json!({"type": "object", "properties": {"vars": {"type": "object"}}})),
            (
                "open_tool".to_string(),
                json!({"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": true}),
            ),
        ];
        let written = |text: &str| {
            let mut c = LazyToolCalls::new(&tokenizer(), &tools, false, true).expect("grammar compiles");
            write_text(&mut c, text, &[]).map(|()| c.num_calls())
        };
        let call = r#"{"name": "write_file", "arguments": {"path": "a.txt", "content": "hi"}}"#;
        assert_eq!(written(&format!("{call}\n")), Ok(1));
        let extra =
            r#"{"name": "write_file", "arguments": {"path": "a.txt", "content": "hi", "resolved_path": "/a.txt"}}"#;
        let refused_at = written(&format!("{extra}\n")).expect_err("an undeclared key is refused");
        let after_hi = extra.find(r#""hi""#).expect("hi") + 4;
        assert!((after_hi..=extra.find("resolved_path").expect("key")).contains(&refused_at), "{refused_at}");
        assert_eq!(written("{\"name\": \"set_env\", \"arguments\": {\"vars\": {\"ANY\": \"1\"}}}\n"), Ok(1));
        assert_eq!(written("{\"name\": \"open_tool\", \"arguments\": {\"a\": \"x\", \"b\": 2}}\n"), Ok(1));
    }

    #[test]
    fn a_bare_call_may_end_the_reply_and_its_blanks_are_bounded() {
        // Codex on the 0.5B wrote a bare call and then wanted to end its turn; the grammar allowed only blanks or a
        // newline after the `}`, and the model wrote 2,000 tokens of spaces. The chat template ends a turn with
        // `<|im_end|>`, and the output parser reads a bare call that ends the output.
        let im_end = token_of("<|im_end|>");
        let call = "{\"name\": \"Bash\", \"arguments\": {\"command\": \"ls\"}}";
        let mut c = lazy(true);
        assert_eq!(write_text(&mut c, call, &[]), Ok(()));
        assert!(!c.is_dormant(), "the line may still end with blanks and a newline");
        assert!(is_allowed(&mut c, im_end), "the reply may end after the call");
        assert!(is_allowed(&mut c, tokenizer().eos().expect("eos")));
        assert!(!is_allowed(&mut c, token(",")));
        c.commit(im_end).expect("commit");
        assert_eq!(c.num_calls(), 1);
        assert!(c.is_dormant() && !c.is_finished());
        // One call wanted: the end completes it and finishes the grammar.
        let mut c = lazy(false);
        assert_eq!(write_text(&mut c, call, &[]), Ok(()));
        c.commit(im_end).expect("commit");
        assert!(c.num_calls() == 1 && c.is_finished());
        // Blanks: at most 8, then the newline.
        let space = token(" ");
        let mut c = lazy(true);
        assert_eq!(write_text(&mut c, call, &[]), Ok(()));
        for i in 0..8 {
            assert!(is_allowed(&mut c, space), "blank {i}");
            c.commit(space).expect("commit");
        }
        assert!(!is_allowed(&mut c, space), "a 9th blank");
        assert!(is_allowed(&mut c, token("\n")), "then the newline");
        c.commit(token("\n")).expect("commit");
        assert!(c.is_dormant() && c.num_calls() == 1);
        // An unfinished call cannot end the reply.
        let mut c = lazy(true);
        assert_eq!(write_text(&mut c, "{\"name\": \"Bash\", \"arguments\": {", &[]), Ok(()));
        assert!(!is_allowed(&mut c, im_end));
        // Inside a fence, blanks before the closing fence are bounded the same way.
        let mut c = lazy(true);
        assert_eq!(write_text(&mut c, &format!("```json\n{call}"), &[]), Ok(()));
        for _ in 0..8 {
            c.commit(space).expect("commit");
        }
        assert!(!is_allowed(&mut c, space) && !is_allowed(&mut c, im_end));
        assert_eq!(write_text(&mut c, "\n```", &[]), Ok(()));
        assert!(c.is_dormant() && c.num_calls() == 1);
    }

    #[test]
    fn xml_form_holds_names_keys_required_parameters_and_value_types() {
        let xml = || LazyToolCalls::new(&tokenizer(), &tools(), true, true).expect("grammar compiles");
        // Required parameters in either order, a string that looks like a number, a number; at every split and with
        // the model's own tokens.
        let text = "Let me write it.\n<tool_call>\n<function=Write>\n<parameter=content>\n42\n</parameter>\n<parameter=file_path>\nn.txt\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=Bash>\n<parameter=timeout>\n30\n</parameter>\n<parameter=command>\nls -la </tmp>\n</parameter>\n</function>\n</tool_call>";
        for cut in (1..text.len()).step_by(7) {
            let mut c = xml();
            assert_eq!(write_text(&mut c, text, &[cut]), Ok(()), "split at {cut}");
            assert_eq!(c.num_calls(), 2, "split at {cut}");
            assert!(c.is_dormant());
        }
        let mut c = xml();
        for t in encode(text) {
            assert!(is_allowed(&mut c, t), "{:?}", String::from_utf8_lossy(tokenizer().token_bytes(t)));
            c.commit(t).expect("commit");
        }
        assert_eq!(c.num_calls(), 2);
        // Both calls are listed for streaming, as XML.
        let starts = c.call_starts();
        let starts = starts.lock().unwrap().clone();
        let first = text.find("<tool_call>").unwrap();
        assert_eq!(starts[0], CallStart { offset: first, tagged: true, xml: true });
        assert_eq!(starts.len(), 2);
        let refused = |prefix: &str, next: &str| {
            let mut c = xml();
            assert_eq!(write_text(&mut c, prefix, &[]), Ok(()), "{prefix:?}");
            !is_allowed(&mut c, token(next))
        };
        // An undeclared tool or key, a number that is no number, a call without its required parameters.
        let mut c = xml();
        let text = "<tool_call>\n<function=hello";
        assert_eq!(write_text(&mut c, text, &[]), Err(text.len() - "hello".len()));
        assert!(refused("<tool_call>\n<function=Bash>\n<parameter=", "cwd"));
        assert!(!refused("<tool_call>\n<function=Bash>\n<parameter=", "command"));
        assert!(refused("<tool_call>\n<function=Bash>\n<parameter=timeout>\n", "soon"));
        assert!(!refused("<tool_call>\n<function=Bash>\n<parameter=timeout>\n", "3"));
        assert!(refused("<tool_call>\n<function=Write>\n<parameter=file_path>\na\n</parameter>\n", "</"));
        assert!(refused("<tool_call>\n<function=Write>\n<parameter=file_path>\na\n</parameter>\n<parameter=", "file"));
        // A required parameter comes once.
        let mut c = xml();
        let text = "<tool_call>\n<function=Bash>\n<parameter=command>\nls\n</parameter>\n<parameter=command>";
        assert!(write_text(&mut c, text, &[]).is_err());
    }

    #[test]
    fn well_formed_calls_keep_the_models_own_tokens() {
        // Each token of the usual tokenization is allowed as it comes (the grammar does not force odd splits at
        // the end of a call, such as `"}}\n` cut in two), and the call completes.
        let texts = [
            "<tool_call>\n{\"name\": \"Bash\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call>",
            "```json\n{\"name\": \"Bash\", \"arguments\": {\"command\": \"ls\"}}\n```",
            "{\"name\": \"Bash\", \"arguments\": {\"command\": \"ls\"}}\n{\"tool_response\": \"invented\"}",
        ];
        for text in texts {
            let mut c = lazy(true);
            for t in encode(text) {
                assert!(is_allowed(&mut c, t), "{:?} in {text:?}", String::from_utf8_lossy(tokenizer().token_bytes(t)));
                c.commit(t).expect("commit");
            }
            assert_eq!(c.num_calls(), 1, "{text:?}");
            assert!(c.is_dormant());
        }
    }

    #[test]
    fn no_trigger_inside_the_reasoning_at_any_split() {
        // Inside the reasoning the model may sketch a call (or an undeclared one); only the call after `</think>`
        // is held to the grammar.
        let think = "<think>\nMaybe <tool_call>\n{\"name\": \"hello\"}\n```json\n{\"name\": \"nope\"}\n</think>\n\n";
        let call = "<tool_call>\n{\"name\": \"Bash\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call>";
        let text = format!("{think}{call}");
        for cut in (1..text.len()).step_by(3) {
            let mut c = lazy(true);
            c.wait_for_reasoning(false);
            assert_eq!(write_text(&mut c, &text, &[cut]), Ok(()), "split at {cut}");
            assert_eq!(c.num_calls(), 1, "split at {cut}");
            let starts = c.call_starts();
            let starts = starts.lock().unwrap();
            assert_eq!(starts.len(), 1);
            assert_eq!((starts[0].offset, starts[0].tagged), (think.len(), true), "split at {cut}");
        }
        // The prompt opened the reasoning: only `</think>` appears.
        let text = format!("{}{call}", &think["<think>\n".len()..]);
        let mut c = lazy(true);
        c.wait_for_reasoning(true);
        assert_eq!(write_text(&mut c, &text, &[]), Ok(()));
        assert_eq!(c.num_calls(), 1);
        // Without the gate, the sketch inside the reasoning would be held (and refused: "hello" is not a tool).
        let mut c = lazy(true);
        assert!(write_text(&mut c, &format!("{think}{call}"), &[]).is_err());
        // A model that does not think: calls trigger from the start.
        let mut c = lazy(true);
        c.wait_for_reasoning(false);
        assert_eq!(write_text(&mut c, call, &[]), Ok(()));
        assert_eq!(c.num_calls(), 1);
    }
}
