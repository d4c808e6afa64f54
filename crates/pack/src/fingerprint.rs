//! A tokenizer's fingerprint: the SHA-256 of what decides which id is which text, hashed from a GGUF's tokenizer
//! metadata — the tokenizer model and pre-tokenizer names, every token's text and type (specials are types), the
//! merges, and the ids of the special tokens generation depends on (BOS, EOS, end of turn, end of message).
//!
//! A draft can only propose for a target when both read ids the same way; two files with the same fingerprint do,
//! whatever they are called. Pairing a bare target file with a pack's draft goes by it ([`draft_pack_for`]), and
//! with the shapes and size it tells a pack's own target under any name ([`pack_for_target`]).

use std::path::Path;

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::{Manifest, Shapes};

/// The special-token ids that are part of the fingerprint.
const SPECIAL_IDS: [&str; 4] = [
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.eot_token_id",
    "tokenizer.ggml.eom_token_id",
];

/// The fingerprint of `file`'s tokenizer (lower-case hex); an error when it has no token list.
pub fn tokenizer_fingerprint(file: &gguf::GgufFile) -> Result<String> {
    let bad = |e: gguf::Error| Error::Manifest { name: "tokenizer metadata".into(), message: e.to_string() };
    let tokens = file
        .get_str_array("tokenizer.ggml.tokens")
        .map_err(bad)?
        .filter(|t| !t.is_empty())
        .ok_or_else(|| Error::Manifest { name: "tokenizer metadata".into(), message: "no token list".into() })?;
    let mut h = Sha256::new();
    // Every field is length-prefixed and tagged, so no two different metadata sets hash the same bytes.
    let mut field = |tag: &str, bytes: &[u8]| {
        h.update(tag.as_bytes());
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    for key in ["tokenizer.ggml.model", "tokenizer.ggml.pre"] {
        field(key, file.get_str(key).map_err(bad)?.unwrap_or("").as_bytes());
    }
    for t in &tokens {
        field("token", t.as_bytes());
    }
    let types = file.get_i64_array("tokenizer.ggml.token_type").map_err(bad)?.unwrap_or_default();
    for t in types {
        field("type", &t.to_le_bytes());
    }
    for m in file.get_str_array("tokenizer.ggml.merges").map_err(bad)?.unwrap_or_default() {
        field("merge", m.as_bytes());
    }
    for key in SPECIAL_IDS {
        let id = file.get_u64(key).map_err(bad)?.map_or(-1, |v| v as i64);
        field(key, &id.to_le_bytes());
    }
    Ok(hex::encode(h.finalize()))
}

/// [`tokenizer_fingerprint`] of the GGUF at `path`.
pub fn tokenizer_fingerprint_of(path: &Path) -> Result<String> {
    let file = gguf::GgufFile::open(path)
        .map_err(|e| Error::Manifest { name: path.display().to_string(), message: e.to_string() })?;
    tokenizer_fingerprint(&file)
}

/// The pack among `packs` whose draft reads ids as a target with tokenizer fingerprint `fingerprint` does (its
/// target's or its draft's recorded fingerprint equals it), for a target file of `target_size` bytes that is not
/// that draft itself (a draft drafting for itself gains nothing).
pub fn draft_pack_for<'a>(packs: &'a [Manifest], fingerprint: &str, target_size: u64) -> Option<&'a Manifest> {
    packs.iter().find(|m| {
        let Some(draft) = &m.draft else { return false };
        let same = |f: &crate::FileSpec| f.tokenizer.as_deref() == Some(fingerprint);
        (same(&m.target) || same(draft)) && draft.size_bytes != target_size
    })
}

/// The pack among `packs` whose target a file is, by its content rather than its name: the target's tokenizer
/// fingerprint, shapes (layers, widths, heads, vocabulary, trained context, tensor bytes) and file size. A renamed
/// or copied target then serves as its pack does (draft, chat template, sampling); a fine-tune of the same model
/// with another tokenizer or size does not pass for it.
pub fn pack_for_target<'a>(
    packs: &'a [Manifest],
    fingerprint: &str,
    shapes: &Shapes,
    size_bytes: u64,
) -> Option<&'a Manifest> {
    packs.iter().find(|m| {
        let t = &m.target;
        t.tokenizer.as_deref() == Some(fingerprint) && t.shapes.as_ref() == Some(shapes) && t.size_bytes == size_bytes
    })
}
