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
pub(crate) fn xml_call_rules(tools: &[(String, Value)], loose: bool) -> String {
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
mod tests;
