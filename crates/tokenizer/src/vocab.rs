//! The vocabulary as llama.cpp sees it: token texts, per-token attributes, the special ids, and the
//! end-of-generation set.
//!
//! In: GGUF metadata (`tokenizer.ggml.*`). Out: a [`Vocab`]. The attribute and EOG rules copy llama.cpp's
//! `llama_vocab::impl::load` (including its text-based detection of EOT/FIM tokens and the upgrade of such tokens to
//! control tokens), so that what counts as special, and what stops generation, is the same as in llama.cpp.

use crate::error::{Error, Result};

/// Token attribute bits, numbered as llama.cpp's `llama_token_attr`. A token can carry several (llama.cpp adds
/// `CONTROL` to a normal token whose text marks end of generation, e.g. Qwen's `</s>`).
pub(crate) mod attr {
    pub const UNKNOWN: u8 = 1 << 0;
    pub const UNUSED: u8 = 1 << 1;
    pub const NORMAL: u8 = 1 << 2;
    pub const CONTROL: u8 = 1 << 3;
    pub const USER_DEFINED: u8 = 1 << 4;
    pub const BYTE: u8 = 1 << 5;
}

/// Ids of the tokens with a role, as read from the GGUF or detected from token texts. `None`: the model has none.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpecialIds {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    /// End of turn (`<|im_end|>`, `<|eot_id|>`, ...).
    pub eot: Option<u32>,
    /// End of message (`<|eom_id|>`).
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub sep: Option<u32>,
    pub pad: Option<u32>,
    pub mask: Option<u32>,
    pub fim_pre: Option<u32>,
    pub fim_suf: Option<u32>,
    pub fim_mid: Option<u32>,
    pub fim_pad: Option<u32>,
    pub fim_rep: Option<u32>,
    pub fim_sep: Option<u32>,
}

pub(crate) struct Vocab {
    /// Token texts as stored in the GGUF (byte-level encoded for normal tokens, raw for special ones).
    pub texts: Vec<String>,
    /// [`attr`] bits per token.
    pub attrs: Vec<u8>,
    pub special: SpecialIds,
    /// End-of-generation ids, sorted.
    pub eog: Vec<u32>,
    pub add_bos: Option<bool>,
    pub add_eos: Option<bool>,
}

// Texts llama.cpp recognises when the GGUF does not name the token (llama-vocab.cpp, "auto-detect special tokens by
// text"). Kept in llama.cpp's order.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];
/// Every token with one of these texts ends generation (and becomes a control token).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

impl Vocab {
    pub fn from_gguf(file: &gguf::GgufFile) -> Result<Self> {
        let raw = file.get_str_array("tokenizer.ggml.tokens")?.ok_or(Error::MissingKey("tokenizer.ggml.tokens"))?;
        let num_tokens = raw.len();
        if num_tokens == 0 {
            return Err(Error::BadVocab("tokenizer.ggml.tokens is empty".into()));
        }
        if u32::try_from(num_tokens).is_err() {
            return Err(Error::BadVocab(format!("{num_tokens} tokens do not fit 32-bit ids")));
        }
        // llama.cpp renames empty tokens so that every text is unique and non-empty.
        let texts: Vec<String> = raw
            .iter()
            .enumerate()
            .map(|(i, t)| if t.is_empty() { format!("[EMPTY_{i}]") } else { (*t).to_owned() })
            .collect();

        let attrs = match file.get_i64_array("tokenizer.ggml.token_type")? {
            None => vec![attr::NORMAL; num_tokens],
            Some(types) => {
                if types.len() < num_tokens {
                    return Err(Error::LengthMismatch {
                        key: "tokenizer.ggml.token_type",
                        found: types.len(),
                        expected: num_tokens,
                    });
                }
                types[..num_tokens].iter().map(|&t| attr_from_type(t)).collect()
            }
        };

        let mut vocab = Vocab {
            texts,
            attrs,
            special: SpecialIds::default(),
            eog: Vec::new(),
            add_bos: file.get_bool("tokenizer.ggml.add_bos_token")?,
            add_eos: file.get_bool("tokenizer.ggml.add_eos_token")?,
        };
        vocab.read_special_ids(file);
        vocab.detect_special_by_text();
        Ok(vocab)
    }

    pub fn num_tokens(&self) -> usize {
        self.texts.len()
    }

    fn read_special_ids(&mut self, file: &gguf::GgufFile) {
        let num_tokens = self.num_tokens() as u64;
        // An id outside the vocabulary is ignored, as llama.cpp does ("bad special token").
        let id = |key: &str| -> Option<u32> {
            let v = file.get(key)?.as_i64()?;
            u64::try_from(v).ok().filter(|&v| v < num_tokens).map(|v| v as u32)
        };
        let s = &mut self.special;
        s.bos = id("tokenizer.ggml.bos_token_id");
        s.eos = id("tokenizer.ggml.eos_token_id");
        s.eot = id("tokenizer.ggml.eot_token_id");
        s.eom = id("tokenizer.ggml.eom_token_id");
        s.unk = id("tokenizer.ggml.unknown_token_id");
        s.sep = id("tokenizer.ggml.seperator_token_id");
        s.pad = id("tokenizer.ggml.padding_token_id");
        s.mask = id("tokenizer.ggml.mask_token_id");
        s.fim_pre = id("tokenizer.ggml.fim_pre_token_id");
        s.fim_suf = id("tokenizer.ggml.fim_suf_token_id");
        s.fim_mid = id("tokenizer.ggml.fim_mid_token_id");
        s.fim_pad = id("tokenizer.ggml.fim_pad_token_id");
        s.fim_rep = id("tokenizer.ggml.fim_rep_token_id");
        s.fim_sep = id("tokenizer.ggml.fim_sep_token_id");
        // Deprecated names, read after the new ones as llama.cpp does.
        s.fim_pre = id("tokenizer.ggml.prefix_token_id").or(s.fim_pre);
        s.fim_suf = id("tokenizer.ggml.suffix_token_id").or(s.fim_suf);
        s.fim_mid = id("tokenizer.ggml.middle_token_id").or(s.fim_mid);
    }

    /// llama.cpp's text-based detection of EOT/EOM/FIM tokens and of the EOG set. llama.cpp walks a hash map, so when
    /// several tokens match one role its pick is unspecified; we take the lowest id.
    fn detect_special_by_text(&mut self) {
        // Every text that matters starts with one of these bytes; skip the rest of the vocabulary cheaply.
        let candidates: Vec<u32> =
            (0..self.texts.len() as u32).filter(|&id| may_be_role_text(&self.texts[id as usize])).collect();
        let texts = &self.texts;
        let attrs = &mut self.attrs;
        let mut find_role = |slot: &mut Option<u32>, role_texts: &[&str]| {
            if slot.is_some() {
                return;
            }
            if let Some(&id) = candidates.iter().find(|&&id| role_texts.contains(&texts[id as usize].as_str())) {
                *slot = Some(id);
                attrs[id as usize] |= attr::CONTROL;
            }
        };
        let s = &mut self.special;
        find_role(&mut s.eot, EOT_TEXTS);
        find_role(&mut s.eom, EOM_TEXTS);
        find_role(&mut s.fim_pre, FIM_PRE_TEXTS);
        find_role(&mut s.fim_suf, FIM_SUF_TEXTS);
        find_role(&mut s.fim_mid, FIM_MID_TEXTS);
        find_role(&mut s.fim_pad, FIM_PAD_TEXTS);
        find_role(&mut s.fim_rep, FIM_REP_TEXTS);
        find_role(&mut s.fim_sep, FIM_SEP_TEXTS);

        let mut eog: Vec<u32> = [s.fim_pad, s.fim_rep, s.fim_sep].into_iter().flatten().collect();
        for &id in &candidates {
            let text = self.texts[id as usize].as_str();
            if EOG_TEXTS.contains(&text) {
                eog.push(id);
                self.attrs[id as usize] |= attr::CONTROL;
            }
            // llama.cpp always renders these gpt-oss tokens.
            if matches!(text, "<|channel|>" | "<|message|>" | "<|start|>" | "<|constrain|>") {
                self.attrs[id as usize] = attr::USER_DEFINED;
            }
        }
        eog.extend([s.eos, s.eot, s.eom].into_iter().flatten());
        eog.sort_unstable();
        eog.dedup();

        // o200k_harmony / solar-open: `<|end|>` does not end generation when `<|return|>`+`<|call|>` (or
        // `<|calls|>`+`<|flush|>`) exist.
        let has = |eog: &[u32], t: &str| eog.iter().any(|&id| self.texts[id as usize] == t);
        let has_call = has(&eog, "<|call|>") || has(&eog, "<|calls|>");
        if has_call
            && (has(&eog, "<|return|>") || has(&eog, "<|flush|>"))
            && let Some(pos) = eog.iter().position(|&id| self.texts[id as usize] == "<|end|>")
        {
            let id = eog.remove(pos);
            self.attrs[id as usize] = attr::USER_DEFINED;
        }
        // gemma4 / plamo: `</s>` is a normal token there.
        if (has(&eog, "<|tool_response>") || has(&eog, "<|plamo:eos|>"))
            && let Some(pos) = eog.iter().position(|&id| self.texts[id as usize] == "</s>")
        {
            let id = eog.remove(pos);
            self.attrs[id as usize] = attr::NORMAL;
        }
        self.eog = eog;
    }
}

/// Whether `text` can be one of the texts above: all start with `<`, `[`, `_` or `▁` (0xE2 0x96 0x81).
fn may_be_role_text(text: &str) -> bool {
    matches!(text.as_bytes().first(), Some(b'<' | b'[' | b'_' | 0xE2))
}

/// `tokenizer.ggml.token_type` values (gguf-py `TokenType`) to attribute bits.
fn attr_from_type(t: i64) -> u8 {
    match t {
        1 => attr::NORMAL,
        2 => attr::UNKNOWN,
        3 => attr::CONTROL,
        4 => attr::USER_DEFINED,
        5 => attr::UNUSED,
        6 => attr::BYTE,
        _ => 0, // undefined
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefilter_admits_every_role_text() {
        let lists = [EOT_TEXTS, EOM_TEXTS, FIM_PRE_TEXTS, FIM_SUF_TEXTS, FIM_MID_TEXTS, FIM_PAD_TEXTS, FIM_REP_TEXTS];
        for text in lists.iter().flat_map(|l| l.iter()).chain(FIM_SEP_TEXTS).chain(EOG_TEXTS) {
            assert!(may_be_role_text(text), "{text}");
        }
        for text in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>", "<|end|>", "</s>"] {
            assert!(may_be_role_text(text), "{text}");
        }
    }
}
