//! Splitting a thinking model's output into reasoning and content while it streams.
//!
//! In: the generated text, delta by delta, and whether the prompt already opened the reasoning (templates such as
//! DeepSeek-R1's or QwQ's end the generation prompt with `<think>\n`, so the output starts inside it and only
//! `</think>` appears). Out: [`ReasoningEvent`]s: reasoning text (what lies between `<think>` and `</think>`) and
//! content (the rest, which goes on to the tool-call parser). The rules are llama-server's `--reasoning-format
//! deepseek` ones:
//! * reasoning is only recognised at the start of the output (after blanks): a `<think>` later on is content;
//! * the first `</think>` ends it; a second one is content;
//! * blanks around the reasoning and between `</think>` and the content are dropped;
//! * output that never closes its reasoning is all reasoning (the limit was hit while thinking).
//!
//! Text that may still turn into a tag (`<thi`, `</th`) or blanks that may precede `</think>` are held back until
//! decided, so no part of a tag leaks into either stream whatever the split of the deltas.
//!
//! Whether a model thinks at all is a property of its chat template ([`template_thinks`]); for other models no
//! splitter is used and the output is unchanged.

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// What the splitter released.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReasoningEvent {
    Reasoning(String),
    Content(String),
}

/// Does a chat template make the model think (`<think>` … `</think>` in its turns)?
pub fn template_thinks(template_source: &str) -> bool {
    template_source.contains(OPEN) && template_source.contains(CLOSE)
}

/// Does a thinking template have a switch for it (Qwen3's `enable_thinking` keyword argument)?
pub fn template_has_thinking_switch(template_source: &str) -> bool {
    template_source.contains("enable_thinking")
}

/// Does a rendered prompt end inside an open reasoning block (its generation prompt ends with `<think>`)?
pub fn prompt_opens_reasoning(prompt: &str) -> bool {
    prompt.trim_end().ends_with(OPEN)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// The start of the output: blanks, then `<think>` (reasoning) or anything else (content). `in_reasoning`: the
    /// prompt opened the reasoning already (a repeated `<think>` is dropped, anything else is reasoning).
    Start { in_reasoning: bool },
    /// Inside the reasoning; `started`: reasoning text has been released (else leading blanks are dropped).
    Reasoning { started: bool },
    /// After `</think>`: blanks before the content are dropped.
    AfterReasoning,
    /// Content, passed through.
    Content,
}

/// Streaming reasoning / content split of one reply.
#[derive(Debug, Clone)]
pub struct ReasoningParser {
    state: State,
    /// Text received and not yet decided.
    held: String,
}

impl ReasoningParser {
    /// `prompt_opened`: the prompt ends inside the reasoning (see [`prompt_opens_reasoning`]).
    pub fn new(prompt_opened: bool) -> Self {
        ReasoningParser { state: State::Start { in_reasoning: prompt_opened }, held: String::new() }
    }

    /// Adds generated text; returns what is decided now.
    pub fn push(&mut self, delta: &str) -> Vec<ReasoningEvent> {
        self.held.push_str(delta);
        let mut out = Vec::new();
        self.drain(&mut out, false);
        out
    }

    /// The output has ended: releases everything still held.
    pub fn finish(&mut self) -> Vec<ReasoningEvent> {
        let mut out = Vec::new();
        self.drain(&mut out, true);
        out
    }

    /// Whether the output is (so far) inside the reasoning: tokens written now are reasoning tokens.
    pub fn in_reasoning(&self) -> bool {
        matches!(self.state, State::Reasoning { .. } | State::Start { in_reasoning: true })
    }

    /// Whether the start of the output is still undecided (blanks or a partial `<think>` so far).
    pub fn is_undecided(&self) -> bool {
        matches!(self.state, State::Start { in_reasoning: false })
    }

    /// Whether reasoning is over (or never began): everything from now on is content.
    pub fn in_content(&self) -> bool {
        matches!(self.state, State::Content | State::AfterReasoning)
    }

    fn emit(out: &mut Vec<ReasoningEvent>, event: ReasoningEvent) {
        match (out.last_mut(), event) {
            (_, ReasoningEvent::Reasoning(t) | ReasoningEvent::Content(t)) if t.is_empty() => {}
            (Some(ReasoningEvent::Reasoning(a)), ReasoningEvent::Reasoning(b)) => a.push_str(&b),
            (Some(ReasoningEvent::Content(a)), ReasoningEvent::Content(b)) => a.push_str(&b),
            (_, e) => out.push(e),
        }
    }

    fn drain(&mut self, out: &mut Vec<ReasoningEvent>, at_end: bool) {
        loop {
            match self.state {
                State::Start { in_reasoning } => {
                    let body = self.held.trim_start();
                    if let Some(rest) = body.strip_prefix(OPEN) {
                        self.held = rest.to_string();
                        self.state = State::Reasoning { started: false };
                    } else if !at_end && OPEN.starts_with(body) {
                        // Blanks only, or a prefix of `<think>`: wait.
                        return;
                    } else if in_reasoning {
                        self.state = State::Reasoning { started: false };
                    } else {
                        self.state = State::Content;
                    }
                }
                State::Reasoning { started } => {
                    if !started {
                        let n = self.held.len() - self.held.trim_start().len();
                        self.held.drain(..n);
                    }
                    if let Some(end) = self.held.find(CLOSE) {
                        let text = self.held[..end].trim_end().to_string();
                        self.held.drain(..end + CLOSE.len());
                        Self::emit(out, ReasoningEvent::Reasoning(text));
                        self.state = State::AfterReasoning;
                        continue;
                    }
                    let keep = if at_end {
                        self.held.len() - self.held.trim_end().len()
                    } else {
                        // A possible start of `</think>`, and the blanks before it.
                        let partial = (1..CLOSE.len()).rev().find(|&n| self.held.ends_with(&CLOSE[..n])).unwrap_or(0);
                        let before = &self.held[..self.held.len() - partial];
                        self.held.len() - before.trim_end().len()
                    };
                    let upto = self.held.len() - keep;
                    if upto > 0 {
                        let text: String = self.held.drain(..upto).collect();
                        Self::emit(out, ReasoningEvent::Reasoning(text));
                        self.state = State::Reasoning { started: true };
                    }
                    if at_end {
                        self.held.clear();
                    }
                    return;
                }
                State::AfterReasoning => {
                    let n = self.held.len() - self.held.trim_start().len();
                    self.held.drain(..n);
                    if self.held.is_empty() {
                        return;
                    }
                    self.state = State::Content;
                }
                State::Content => {
                    let text = std::mem::take(&mut self.held);
                    Self::emit(out, ReasoningEvent::Content(text));
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (reasoning, content) of `pieces` pushed in order, checking that every reasoning event comes before every
    /// content event.
    fn split(prompt_opened: bool, pieces: &[&str]) -> (String, String) {
        let mut p = ReasoningParser::new(prompt_opened);
        let mut events = Vec::new();
        for piece in pieces {
            events.extend(p.push(piece));
        }
        events.extend(p.finish());
        let (mut reasoning, mut content) = (String::new(), String::new());
        for e in events {
            match e {
                ReasoningEvent::Reasoning(t) => {
                    assert!(content.is_empty(), "reasoning after content");
                    assert!(!t.is_empty(), "no empty events");
                    reasoning.push_str(&t);
                }
                ReasoningEvent::Content(t) => {
                    assert!(!t.is_empty(), "no empty events");
                    content.push_str(&t)
                }
            }
        }
        (reasoning, content)
    }

    /// Checks `text` split at every char boundary (two pieces), every pair of boundaries (three pieces) when short,
    /// and char by char.
    fn check(prompt_opened: bool, text: &str, reasoning: &str, content: &str) {
        let want = (reasoning.to_string(), content.to_string());
        assert_eq!(split(prompt_opened, &[text]), want, "whole {text:?}");
        let bounds: Vec<usize> = (1..text.len()).filter(|&i| text.is_char_boundary(i)).collect();
        for &i in &bounds {
            assert_eq!(split(prompt_opened, &[&text[..i], &text[i..]]), want, "{text:?} split at {i}");
        }
        if text.len() <= 80 {
            for &i in &bounds {
                for &j in bounds.iter().filter(|&&j| j > i) {
                    let pieces = [&text[..i], &text[i..j], &text[j..]];
                    assert_eq!(split(prompt_opened, &pieces), want, "{text:?} split at {i}, {j}");
                }
            }
        }
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(split(prompt_opened, &pieces), want, "{text:?} char by char");
    }

    #[test]
    fn think_block_at_the_start_is_reasoning_at_any_split() {
        check(
            false,
            "<think>\nThe user greets me. </ok> <thin\n</think>\n\nHello ü!",
            "The user greets me. </ok> <thin",
            "Hello ü!",
        );
        check(false, "  <think>a</think>b", "a", "b");
        // Blanks inside the reasoning are kept; around it they are dropped.
        check(
            false,
            "<think>\n\n  line 1\n\n  line 2  \n\n</think>\n\n  content  \n",
            "line 1\n\n  line 2",
            "content  \n",
        );
        // An empty think block (Qwen3 with thinking off writes one).
        check(false, "<think>\n\n</think>\n\nJust the answer.", "", "Just the answer.");
    }

    #[test]
    fn output_without_reasoning_is_unchanged() {
        check(false, "Hello, <think> is a tag.", "", "Hello, <think> is a tag.");
        check(false, "\n  x = 1 < 2\n", "", "\n  x = 1 < 2\n");
        check(false, "<thinking>no</thinking>", "", "<thinking>no</thinking>");
        check(false, "<thi", "", "<thi");
        check(false, "   ", "", "   ");
        // A `</think>` in content is content.
        check(false, "a</think>b", "", "a</think>b");
    }

    #[test]
    fn prompt_opened_reasoning_ends_at_the_first_close_tag() {
        check(true, "Let me think.\n</think>\n\nThe answer </think> 4.", "Let me think.", "The answer </think> 4.");
        // A repeated opening tag is dropped.
        check(true, "<think>\nhmm\n</think>ok", "hmm", "ok");
        // A later `<think>` is reasoning text.
        check(true, "a <think> b</think>c", "a <think> b", "c");
        // Never closed: all reasoning (the limit was hit).
        check(true, "still thinking </thi", "still thinking </thi", "");
        check(true, "", "", "");
    }

    #[test]
    fn tool_calls_after_reasoning_reach_the_content() {
        let call = "<tool_call>\n{\"name\": \"Bash\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call>";
        check(false, &format!("<think>\nI should list files.\n</think>\n\n{call}"), "I should list files.", call);
    }

    #[test]
    fn reasoning_then_tool_parser_at_any_split() {
        // The output pipeline: the splitter's content goes through the tool-call parser.
        let text = "<think>\nCall <tool_call> maybe?\n{\"name\": \"Bash\"}\n</think>\n\n<tool_call>\n{\"name\": \"Bash\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call>";
        let run = |pieces: &[&str]| {
            let mut r = ReasoningParser::new(false);
            let mut t = crate::ToolCallParser::new(["Bash"]);
            let (mut reasoning, mut events) = (String::new(), Vec::new());
            let mut take = |evs: Vec<ReasoningEvent>, t: &mut crate::ToolCallParser| {
                for e in evs {
                    match e {
                        ReasoningEvent::Reasoning(x) => reasoning.push_str(&x),
                        ReasoningEvent::Content(x) => events.extend(t.push(&x)),
                    }
                }
            };
            for p in pieces {
                take(r.push(p), &mut t);
            }
            take(r.finish(), &mut t);
            events.extend(t.finish());
            (reasoning, events)
        };
        let (reasoning, events) = run(&[text]);
        assert_eq!(reasoning, "Call <tool_call> maybe?\n{\"name\": \"Bash\"}");
        assert!(matches!(&events[..], [crate::ParseEvent::ToolCall(c)] if c.name == "Bash"), "{events:?}");
        for i in (1..text.len()).filter(|&i| text.is_char_boundary(i)) {
            assert_eq!(run(&[&text[..i], &text[i..]]), (reasoning.clone(), events.clone()), "split at {i}");
        }
    }

    #[test]
    fn token_accounting_states() {
        let mut p = ReasoningParser::new(false);
        assert!(!p.in_reasoning() && !p.in_content());
        p.push("<think>");
        assert!(p.in_reasoning());
        p.push("x</think>");
        assert!(p.in_content() && !p.in_reasoning());
        let mut p = ReasoningParser::new(false);
        p.push("Hi");
        assert!(p.in_content());
        assert!(ReasoningParser::new(true).in_reasoning());
    }

    #[test]
    fn detection() {
        assert!(template_thinks("{{ '<think>\\n' + r + '\\n</think>' }}"));
        assert!(!template_thinks("<|im_start|>assistant\n"));
        assert!(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n"));
        assert!(!prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
        assert!(!prompt_opens_reasoning("<|im_start|>assistant\n"));
    }
}
