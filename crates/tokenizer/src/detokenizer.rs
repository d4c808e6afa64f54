//! [`Detokenizer`]: turns one sequence's generated tokens into text as they arrive.
//!
//! A token can end in the middle of a multi-byte UTF-8 character (emoji and CJK often span two or three byte-level
//! tokens), so each [`Detokenizer::push`] returns only complete characters and keeps the incomplete tail for the
//! next token. Bytes that can never become valid UTF-8 are emitted as U+FFFD at once; an incomplete tail left at
//! [`Detokenizer::finish`] becomes U+FFFD too. The concatenated output always equals `String::from_utf8_lossy` of all
//! the tokens' bytes, i.e. [`Tokenizer::decode`](crate::Tokenizer::decode).

use std::borrow::Borrow;

use crate::Tokenizer;

/// Streaming decoder for one sequence. `T` is any handle on the tokenizer: `&Tokenizer`, `Arc<Tokenizer>`, ...
pub struct Detokenizer<T: Borrow<Tokenizer>> {
    tokenizer: T,
    render_special: bool,
    /// Bytes of an incomplete UTF-8 character (at most 3).
    pending: Vec<u8>,
}

impl<T: Borrow<Tokenizer>> Detokenizer<T> {
    /// A decoder that renders special tokens as their text (`<|im_end|>`).
    pub fn new(tokenizer: T) -> Self {
        Self::with_special(tokenizer, true)
    }

    /// A decoder that renders control tokens only if `render_special`.
    pub fn with_special(tokenizer: T, render_special: bool) -> Self {
        Detokenizer { tokenizer, render_special, pending: Vec::with_capacity(4) }
    }

    /// Adds one token; returns the text it completes (possibly empty).
    pub fn push(&mut self, id: u32) -> String {
        let mut out = String::new();
        self.push_into(id, &mut out);
        out
    }

    /// [`Detokenizer::push`], appending to `out`.
    pub fn push_into(&mut self, id: u32, out: &mut String) {
        let piece = self.tokenizer.borrow().piece(id, self.render_special);
        if self.pending.is_empty() {
            // Fast path: the whole piece is valid text.
            match std::str::from_utf8(piece) {
                Ok(s) => {
                    out.push_str(s);
                    return;
                }
                Err(_) => self.pending.extend_from_slice(piece),
            }
        } else {
            self.pending.extend_from_slice(piece);
        }
        let mut start = 0;
        loop {
            match std::str::from_utf8(&self.pending[start..]) {
                Ok(s) => {
                    out.push_str(s);
                    start = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = start + e.valid_up_to();
                    out.push_str(std::str::from_utf8(&self.pending[start..valid]).unwrap_or_default());
                    match e.error_len() {
                        // Invalid whatever follows: replace it, as `from_utf8_lossy` does, and go on.
                        Some(len) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            start = valid + len;
                        }
                        // A character that the next token may complete.
                        None => {
                            start = valid;
                            break;
                        }
                    }
                }
            }
        }
        self.pending.drain(..start);
    }

    /// Bytes held back for an incomplete character.
    pub fn num_pending_bytes(&self) -> usize {
        self.pending.len()
    }

    /// Ends the sequence: returns what is held back, an incomplete character as U+FFFD.
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}
