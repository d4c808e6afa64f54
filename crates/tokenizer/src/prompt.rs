//! Chat prompts in which only the template's own text can write control tokens.
//!
//! A chat template writes control tokens (`<|im_start|>`, `<|im_end|>`, ...) around the conversation's content;
//! the content (messages, tool results, tool definitions, system prompts given by a client) must tokenize as plain
//! text, or `<|im_end|>\n<|im_start|>system\n` inside a tool result opens a real system turn.
//!
//! In: each content string, before it goes into the template, through [`Tokenizer::protect`]; the rendered prompt
//! through [`Tokenizer::encode_prompt`]. Out: the prompt's ids, with control tokens only where the template's own
//! text wrote them.
//!
//! `protect` writes a [`BREAK`] (U+FDD0, a Unicode noncharacter) inside every control-token text of the string,
//! after its first character, and at the string's edges (inside its leading and trailing blanks) when an edge is a
//! piece of a control-token text that neighbouring text could complete; the marks already in the string are escaped
//! with [`ESCAPE`]. A string without any of these is passed unchanged, so the template renders exactly what it
//! renders without protection. `encode_prompt` cuts control tokens out of the prompt where their text stands whole
//! (no text with a BREAK in it matches), then removes the marks and tokenizes each piece between two cut tokens as
//! plain text in one piece, so BPE and the pre-tokenizer see the same pieces as when the whole prompt is tokenized
//! with special tokens parsed: a prompt whose content holds no control-token text gets the same ids.
//!
//! Why it holds under what templates do to content: a BREAK is neither blank nor cased, and JSON (`tojson`,
//! `ensure_ascii=False`) and Python `repr` write it as it is. So trimming, splitting (on `</think>`, say), slicing,
//! `tojson` and concatenation keep every BREAK that lies inside a piece they keep: a piece of a protected string
//! holds no whole control-token text, and where it meets other text it meets it across a BREAK whenever its edge
//! is the start of a control-token text (or its end). User-defined tokens (Qwen's `<tool_call>`) are not control
//! tokens and match in content too, as in llama.cpp without special-token parsing.

use std::borrow::Cow;

use crate::error::Result;
use crate::memo;
use crate::tokenizer::{Fragment, Tokenizer};

/// Marks a place in a prompt that no control-token text may span.
pub const BREAK: char = '\u{FDD0}';
/// Marks the next character (a [`BREAK`] or an `ESCAPE`) as the content's own.
pub const ESCAPE: char = '\u{FDD1}';

/// Characters a template may trim from either end of a string (Python's `str.isspace` or Rust's whitespace).
fn is_blank(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// The texts `protect` breaks: those of control and unknown tokens (what special-token parsing matches).
#[derive(Debug, Default)]
pub(crate) struct Guard {
    /// Texts of two or more characters, without the marks.
    texts: Vec<String>,
}

impl Guard {
    /// `texts`: the texts of the control and unknown tokens.
    pub(crate) fn new<'a>(texts: impl Iterator<Item = &'a str>) -> Self {
        Guard { texts: texts.filter(|t| parsed_in_prompts(t)).map(str::to_owned).collect() }
    }

    /// Whether `s` starts with a proper, non-empty tail of a control-token text.
    fn starts_with_tail(&self, s: &str) -> bool {
        self.texts.iter().any(|t| t.char_indices().skip(1).any(|(i, _)| s.starts_with(&t[i..])))
    }

    /// Whether `s` ends with a proper, non-empty head of a control-token text.
    fn ends_with_head(&self, s: &str) -> bool {
        self.texts.iter().any(|t| t.char_indices().skip(1).any(|(i, _)| s.ends_with(&t[..i])))
    }
}

/// Whether a control token with this text is cut out of a chat prompt: one character cannot be broken by a mark,
/// and a text holding a mark could be forged with it, so such tokens are never parsed in chat prompts (no
/// vocabulary Splash reads has one).
pub(crate) fn parsed_in_prompts(text: &str) -> bool {
    text.chars().nth(1).is_some() && !text.contains([BREAK, ESCAPE])
}

impl Tokenizer {
    /// A content string as it goes into a chat template: control-token texts broken, edges that could complete one
    /// marked, marks of its own escaped (see the module docs). Borrowed (unchanged) when there is nothing to mark.
    pub fn protect<'a>(&self, s: &'a str) -> Cow<'a, str> {
        let guard = self.guard();
        // Byte offsets in `s` where a BREAK goes.
        let mut cuts = Vec::new();
        for t in &guard.texts {
            let first = t.chars().next().map_or(1, char::len_utf8);
            let mut from = 0;
            while let Some(pos) = s[from..].find(t.as_str()) {
                cuts.push(from + pos + first);
                from += pos + first;
            }
        }
        let core_start = s.len() - s.trim_start_matches(is_blank).len();
        let core_end = s.trim_end_matches(is_blank).len().max(core_start);
        if guard.starts_with_tail(&s[core_start..]) {
            cuts.push(core_start);
        }
        if core_start > 0 && guard.starts_with_tail(&s[..core_start]) {
            cuts.push(0);
        }
        if guard.ends_with_head(&s[..core_end]) {
            cuts.push(core_end);
        }
        if core_end < s.len() && guard.ends_with_head(&s[core_end..]) {
            cuts.push(s.len());
        }
        if cuts.is_empty() && !s.contains([BREAK, ESCAPE]) {
            return Cow::Borrowed(s);
        }
        cuts.sort_unstable();
        cuts.dedup();
        let mut out = String::with_capacity(s.len() + 3 * cuts.len() + 8);
        let mut cuts = cuts.into_iter().peekable();
        for (i, c) in s.char_indices() {
            while cuts.next_if(|&cut| cut <= i).is_some() {
                out.push(BREAK);
            }
            if c == BREAK || c == ESCAPE {
                out.push(ESCAPE);
            }
            out.push(c);
        }
        out.extend(cuts.map(|_| BREAK));
        Cow::Owned(out)
    }

    /// Token ids of a chat prompt whose content went through [`Tokenizer::protect`]: control tokens where the
    /// template's text has them, everything else plain text (user-defined tokens still match). Without BOS/EOS.
    /// Long pieces between control tokens (a conversation's messages) are remembered (`memo.rs`), so a turn that
    /// re-sends a conversation runs BPE over its new messages only.
    pub fn encode_prompt(&self, prompt: &str) -> Result<Vec<u32>> {
        let mut ids = Vec::with_capacity(prompt.len() / 3 + 1);
        let mut piece = String::new();
        for fragment in self.partition(prompt, true, true) {
            match fragment {
                Fragment::Token(id) => ids.push(id),
                Fragment::Text(start, end) => {
                    piece.clear();
                    unmark_into(&prompt[start..end], &mut piece);
                    if piece.len() < memo::MIN_BYTES {
                        self.encode_into(&piece, false, &mut ids)?;
                    } else if let Some(known) = self.memo.get(&piece) {
                        ids.extend_from_slice(&known);
                    } else {
                        let from = ids.len();
                        self.encode_into(&piece, false, &mut ids)?;
                        self.memo.put(&piece, &ids[from..]);
                    }
                }
            }
        }
        Ok(ids)
    }
}

/// The text a protected prompt stands for: marks removed, escaped characters kept.
pub fn unmark(text: &str) -> Cow<'_, str> {
    if !text.contains([BREAK, ESCAPE]) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    unmark_into(text, &mut out);
    Cow::Owned(out)
}

fn unmark_into(text: &str, out: &mut String) {
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            BREAK => {}
            // An escape keeps the next character (a lone one at the end is kept as itself).
            ESCAPE => out.push(chars.next().unwrap_or(ESCAPE)),
            c => out.push(c),
        }
    }
}
