//! [`Tokenizer`]: text to token ids and back, with llama.cpp's behaviour.
//!
//! Encoding runs in three steps, as in llama.cpp's `llama_vocab::impl::tokenize`: special tokens are cut out of the
//! text (longest text first; control tokens only when `parse_special` is on, user-defined ones always), each
//! remaining piece is split into words by the pre-tokenizer, and each word, written in the byte-level alphabet, is
//! merged by the BPE model of the `tokenizers` crate. Decoding concatenates per-token byte pieces precomputed at load.

use ahash::AHashMap;
use tokenizers::models::bpe::BPE;
use tokenizers::{Model, Normalizer};

use crate::bytes;
use crate::error::{Error, Result};
use crate::memo::Memo;
use crate::pretokenizer::PreTokenizer;
use crate::prompt::{self, Guard};
use crate::vocab::{SpecialIds, Vocab, attr};

/// A byte-level BPE tokenizer read from a GGUF file. Cheap to share (`Send + Sync`); all methods take `&self`.
pub struct Tokenizer {
    vocab: Vocab,
    pre: PreTokenizer,
    bpe: BPE,
    /// Tokens cut out of the text before BPE (control, user-defined, unknown), longest text first.
    special_tokens: Vec<u32>,
    /// `piece_bytes[piece_offsets[id]..piece_offsets[id + 1]]` is token `id`'s text as llama.cpp's
    /// `token_to_piece(special = true)` renders it.
    piece_bytes: Vec<u8>,
    piece_offsets: Vec<u32>,
    /// Bytes whose byte-level character is not in the vocabulary (SmolLM2 has no token for 0x04, for one).
    byte_missing: [bool; 256],
    add_bos: bool,
    add_eos: bool,
    /// The control-token texts content must not spell in a chat prompt.
    guard: Guard,
    /// Ids of long chat-prompt pieces already tokenized ([`Tokenizer::encode_prompt`]).
    pub(crate) memo: Memo,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("pre", &self.pre.name)
            .field("vocab_size", &self.vocab_size())
            .field("num_special_tokens", &self.special_tokens.len())
            .field("special", &self.vocab.special)
            .field("eog", &self.vocab.eog)
            .field("add_bos", &self.add_bos)
            .finish()
    }
}

pub(crate) enum Fragment {
    Token(u32),
    /// A byte range of the text.
    Text(usize, usize),
}

impl Tokenizer {
    /// Builds the tokenizer from `tokenizer.ggml.*` metadata. Only byte-level BPE (`tokenizer.ggml.model = "gpt2"`)
    /// is supported.
    pub fn from_gguf(file: &gguf::GgufFile) -> Result<Self> {
        let model = file.get_str("tokenizer.ggml.model")?.ok_or(Error::MissingKey("tokenizer.ggml.model"))?;
        if model != "gpt2" {
            return Err(Error::UnsupportedModel(model.to_owned()));
        }
        let pre = PreTokenizer::from_name(file.get_str("tokenizer.ggml.pre")?)?;
        let vocab = Vocab::from_gguf(file)?;
        let merges = file.get_str_array("tokenizer.ggml.merges")?.ok_or(Error::MissingKey("tokenizer.ggml.merges"))?;
        let bpe = build_bpe(&vocab, &merges, pre.ignore_merges)?;

        let mut special_tokens: Vec<u32> = (0..vocab.num_tokens() as u32)
            .filter(|&id| vocab.attrs[id as usize] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0)
            .collect();
        // Longest first; llama.cpp's sort is unstable, ties here go by id.
        special_tokens.sort_by_key(|&id| std::cmp::Reverse(vocab.texts[id as usize].len()));

        let (piece_bytes, piece_offsets) = build_pieces(&vocab);
        let mut byte_missing = [false; 256];
        for (b, missing) in byte_missing.iter_mut().enumerate() {
            *missing = bpe.token_to_id(bytes::ENCODE[b].encode_utf8(&mut [0; 4])).is_none();
        }
        let add_bos = vocab.add_bos.unwrap_or(pre.add_bos_default);
        let add_eos = vocab.add_eos.unwrap_or(false);
        if add_bos && vocab.special.bos.is_none() {
            return Err(Error::BadVocab("add_bos_token is set but there is no BOS token".into()));
        }
        let guard = Guard::new(
            special_tokens
                .iter()
                .filter(|&&id| vocab.attrs[id as usize] & (attr::CONTROL | attr::UNKNOWN) != 0)
                .map(|&id| vocab.texts[id as usize].as_str()),
        );
        Ok(Tokenizer {
            vocab,
            pre,
            bpe,
            special_tokens,
            piece_bytes,
            piece_offsets,
            byte_missing,
            add_bos,
            add_eos,
            guard,
            memo: Memo::default(),
        })
    }

    /// Token ids of `text`, without BOS/EOS (see [`Tokenizer::add_bos`]). With `parse_special`, the texts of control
    /// tokens (`<|im_start|>`, ...) become their ids; without it they are tokenized as plain text. User-defined
    /// tokens (token type 4, e.g. Qwen's `<tool_call>`) are matched either way, as in llama.cpp.
    pub fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<u32>> {
        let mut ids = Vec::with_capacity(text.len() / 3 + 1);
        self.encode_into(text, parse_special, &mut ids)?;
        Ok(ids)
    }

    /// [`Tokenizer::encode`], appending to `ids`.
    pub fn encode_into(&self, text: &str, parse_special: bool, ids: &mut Vec<u32>) -> Result<()> {
        let mut words = Vec::new();
        let mut word = String::new();
        for fragment in self.partition(text, parse_special, false) {
            match fragment {
                Fragment::Token(id) => ids.push(id),
                Fragment::Text(start, end) => {
                    let piece = self.normalise(&text[start..end])?;
                    let piece = piece.as_ref();
                    words.clear();
                    self.pre.split(piece, &mut words)?;
                    for range in &words {
                        // A byte without a token is dropped, and nothing merges across it (llama.cpp keeps it as a
                        // symbol of its own until the end; `tokenizers` would drop it first and merge its neighbours).
                        for part in piece.as_bytes()[range.clone()].split(|&b| self.byte_missing[b as usize]) {
                            if part.is_empty() {
                                continue;
                            }
                            word.clear();
                            word.extend(part.iter().map(|&b| bytes::ENCODE[b as usize]));
                            let tokens = self.bpe.tokenize(&word).map_err(|e| Error::Bpe(e.to_string()))?;
                            ids.extend(tokens.iter().map(|t| t.id));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// `piece` in the form the pre-tokenizer splits: NFC where the vocabulary wants it (special tokens are ASCII, so
    /// normalising the pieces between them equals normalising the whole text).
    fn normalise<'a>(&self, piece: &'a str) -> Result<std::borrow::Cow<'a, str>> {
        if !self.pre.nfc || piece.is_ascii() {
            return Ok(piece.into());
        }
        let mut n = tokenizers::NormalizedString::from(piece);
        tokenizers::normalizers::unicode::NFC.normalize(&mut n).map_err(|e| Error::Bpe(e.to_string()))?;
        Ok(n.get().to_owned().into())
    }

    /// Splits `text` around the special tokens in it (llama.cpp's `tokenizer_st_partition`). `in_prompt`: a chat
    /// prompt, in which control tokens whose text cannot be protected are never parsed (see `prompt`).
    pub(crate) fn partition(&self, text: &str, parse_special: bool, in_prompt: bool) -> Vec<Fragment> {
        let mut fragments = Vec::new();
        if text.is_empty() {
            return fragments;
        }
        fragments.push(Fragment::Text(0, text.len()));
        for &id in &self.special_tokens {
            let pattern = self.vocab.texts[id as usize].as_str();
            if self.vocab.attrs[id as usize] & (attr::CONTROL | attr::UNKNOWN) != 0
                && (!parse_special || (in_prompt && !prompt::parsed_in_prompts(pattern)))
            {
                continue;
            }
            if !text.contains(pattern) {
                continue;
            }
            let mut next = Vec::with_capacity(fragments.len() + 2);
            for fragment in fragments {
                let Fragment::Text(start, end) = fragment else {
                    next.push(fragment);
                    continue;
                };
                let mut cur = start;
                while let Some(pos) = text[cur..end].find(pattern) {
                    let at = cur + pos;
                    if at > cur {
                        next.push(Fragment::Text(cur, at));
                    }
                    next.push(Fragment::Token(id));
                    cur = at + pattern.len();
                }
                if cur < end {
                    next.push(Fragment::Text(cur, end));
                }
            }
            fragments = next;
        }
        fragments
    }

    /// Whether a BOS token should start a prompt (`tokenizer.ggml.add_bos_token`, else the pre-tokenizer's default).
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Puts BOS at the start of a prompt's ids where the model wants it (and it is not there yet).
    pub fn prepend_bos(&self, ids: &mut Vec<u32>) {
        if let Some(bos) = self.bos().filter(|_| self.add_bos)
            && ids.first() != Some(&bos)
        {
            ids.insert(0, bos);
        }
    }

    /// Whether an EOS token should end a prompt (`tokenizer.ggml.add_eos_token`; off when absent).
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    pub fn bos(&self) -> Option<u32> {
        self.vocab.special.bos
    }

    pub fn eos(&self) -> Option<u32> {
        self.vocab.special.eos
    }

    pub fn pad(&self) -> Option<u32> {
        self.vocab.special.pad
    }

    /// All role ids (bos, eos, eot, fim, ...).
    pub fn special_ids(&self) -> &SpecialIds {
        &self.vocab.special
    }

    /// Whether sampling `id` ends generation (llama.cpp's `llama_vocab_is_eog`).
    pub fn is_eog(&self, id: u32) -> bool {
        self.vocab.eog.binary_search(&id).is_ok()
    }

    /// The end-of-generation ids, sorted.
    pub fn eog_ids(&self) -> &[u32] {
        &self.vocab.eog
    }

    /// Whether `id` is a control token (rendered only when special tokens are rendered).
    pub fn is_control(&self, id: u32) -> bool {
        self.attr(id) & attr::CONTROL != 0
    }

    /// Whether `id` is matched as a whole in text before BPE: control, user-defined or unknown tokens.
    pub fn is_special(&self, id: u32) -> bool {
        self.attr(id) & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0
    }

    /// Number of token ids, including unused filler rows such as Qwen's `[PAD151665]`.
    pub fn vocab_size(&self) -> usize {
        self.vocab.num_tokens()
    }

    /// The token's text as stored in the vocabulary (byte-level alphabet for normal tokens: `Ġhello`).
    pub fn token_str(&self, id: u32) -> Option<&str> {
        self.vocab.texts.get(id as usize).map(String::as_str)
    }

    /// The id of the token whose vocabulary text is exactly `text` (`"<tool_call>"`, `"Ġhello"`).
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.bpe.token_to_id(text)
    }

    /// The bytes token `id` stands for, special tokens rendered as their text; empty for unused rows and ids out of
    /// range.
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        let i = id as usize;
        match (self.piece_offsets.get(i), self.piece_offsets.get(i + 1)) {
            (Some(&start), Some(&end)) => &self.piece_bytes[start as usize..end as usize],
            _ => &[],
        }
    }

    /// The bytes of `id` as llama.cpp's `token_to_piece` gives them: control and unknown tokens are empty unless
    /// `render_special`.
    pub fn piece(&self, id: u32, render_special: bool) -> &[u8] {
        if !render_special && self.attr(id) & (attr::CONTROL | attr::UNKNOWN) != 0 {
            return &[];
        }
        self.token_bytes(id)
    }

    /// The text of `ids`, special tokens rendered as their text. Bytes that are not valid UTF-8 become U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> String {
        String::from_utf8_lossy(&self.decode_bytes(ids, true)).into_owned()
    }

    /// The raw bytes of `ids`; control tokens are left out unless `render_special`.
    pub fn decode_bytes(&self, ids: &[u32], render_special: bool) -> Vec<u8> {
        let mut out = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            out.extend_from_slice(self.piece(id, render_special));
        }
        out
    }

    pub(crate) fn guard(&self) -> &Guard {
        &self.guard
    }

    fn attr(&self, id: u32) -> u8 {
        self.vocab.attrs.get(id as usize).copied().unwrap_or(0)
    }
}

fn build_bpe(vocab: &Vocab, merges: &[&str], ignore_merges: bool) -> Result<BPE> {
    // The two inputs of the model are independent; build them side by side (most of the load time is allocation).
    let (map, pairs) = std::thread::scope(|scope| {
        let pairs = scope.spawn(|| merge_pairs(merges));
        let map = vocab_map(vocab);
        (map, pairs.join())
    });
    let pairs = pairs.map_err(|_| Error::Bpe("parsing the merges panicked".into()))??;
    BPE::builder()
        .vocab_and_merges(map?, pairs)
        .ignore_merges(ignore_merges)
        .build()
        .map_err(|e| Error::Bpe(e.to_string()))
}

/// Token text to id. A byte with no token of its own (SmolLM2 has none for 0x04 or 0xF1..0xFF) is dropped from the
/// input, as llama.cpp does (`text_to_token` fails and the byte fallback finds nothing); see `encode_into`.
fn vocab_map(vocab: &Vocab) -> Result<AHashMap<String, u32>> {
    let mut map: AHashMap<String, u32> = AHashMap::with_capacity(vocab.num_tokens());
    for (id, text) in vocab.texts.iter().enumerate() {
        if map.insert(text.clone(), id as u32).is_some() {
            return Err(Error::BadVocab(format!("token text {text:?} appears twice")));
        }
    }
    Ok(map)
}

/// `tokenizer.ggml.merges` lines (`"Ġ t"`) as pairs, in rank order.
fn merge_pairs(merges: &[&str]) -> Result<Vec<(String, String)>> {
    let mut pairs = Vec::with_capacity(merges.len());
    let mut seen = ahash::AHashSet::with_capacity(merges.len());
    for (rank, merge) in merges.iter().enumerate() {
        // llama.cpp splits at the first space after the first byte.
        let split = merge.as_bytes().iter().skip(1).position(|&b| b == b' ').map(|p| p + 1);
        let Some(split) = split else {
            return Err(Error::BadVocab(format!("merge #{rank} {merge:?} has no separating space")));
        };
        let (left, right) = (&merge[..split], &merge[split + 1..]);
        // llama.cpp keeps the first rank of a repeated merge; `tokenizers` would keep the last.
        if !seen.insert((left, right)) {
            continue;
        }
        pairs.push((left.to_owned(), right.to_owned()));
    }
    Ok(pairs)
}

/// Every token's rendering with special tokens shown, as llama.cpp's `token_to_piece(special = true)`.
fn build_pieces(vocab: &Vocab) -> (Vec<u8>, Vec<u32>) {
    let mut bytes_out = Vec::with_capacity(vocab.num_tokens() * 6);
    let mut offsets = Vec::with_capacity(vocab.num_tokens() + 1);
    offsets.push(0u32);
    for (text, &a) in vocab.texts.iter().zip(&vocab.attrs) {
        if a & (attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED) != 0 {
            bytes_out.extend_from_slice(text.as_bytes());
        } else if a & attr::NORMAL != 0 {
            for c in text.chars() {
                match bytes::decode_char(c) {
                    Some(b) => bytes_out.push(b),
                    None => {
                        // llama.cpp's `llama_decode_text` marker for a character outside the byte alphabet.
                        bytes_out.extend_from_slice(b"[UNK_BYTE_0x");
                        for b in c.encode_utf8(&mut [0; 4]).bytes() {
                            bytes_out.extend_from_slice(format!("{b:02x}").as_bytes());
                        }
                        bytes_out.extend_from_slice(text.as_bytes());
                        bytes_out.push(b']');
                    }
                }
            }
        } else if a & attr::BYTE != 0 {
            // `<0xAB>` byte-fallback tokens.
            if let Some(b) =
                text.strip_prefix("<0x").and_then(|h| h.get(..2)).and_then(|h| u8::from_str_radix(h, 16).ok())
            {
                bytes_out.push(b);
            }
        }
        // Unused and undefined tokens render as nothing.
        offsets.push(u32::try_from(bytes_out.len()).unwrap_or(u32::MAX));
    }
    (bytes_out, offsets)
}
