//! Which token ids a draft model's narrowed output head computes ([`crate::Runner::limit_logits`]).
//!
//! A draft only proposes tokens and the target checks every one, so the draft's output head (its largest single
//! matrix: 145 of the 392 MB the Qwen2.5-Coder-0.5B reads per token) is computed for a subset of the vocabulary.
//! The lowest ids (BPE merge order) are a poor subset for code: ids below 32768 cover ~94% of the tokens of real
//! source files, and ` OSError`, `?;\n`, ` &[` or `(Debug` lie above it, each one a draft that cannot be right.
//! For tokenizers we have a ranking for (`data/*-draft-ranking.bin`, made by `scripts/draft_vocab.py` from source
//! code and documentation with llama.cpp's tokenizer), the head holds the most frequent tokens instead; any other
//! tokenizer keeps the lowest ids. Control and user-defined tokens (end of turn, tool-call tags) are always in.

use gguf::GgufFile;

/// Rankings built into the binary, each for the tokenizer with its fingerprint ([`tokenizer_fingerprint`]).
const RANKINGS: &[&[u8]] = &[include_bytes!("../data/qwen2-draft-ranking.bin")];

/// `tokenizer.ggml.token_type` values of tokens the head always keeps: control (3) and user-defined (4).
const ALWAYS_KEPT_TYPES: [i64; 2] = [3, 4];

/// FNV-1a (64-bit) over each token string followed by a 0 byte: identifies a vocabulary (the same function as
/// `scripts/draft_vocab.py`).
pub fn tokenizer_fingerprint<S: AsRef<str>>(tokens: &[S]) -> u64 {
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for t in tokens {
        for &b in t.as_ref().as_bytes().iter().chain(std::iter::once(&0)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01B3);
        }
    }
    h
}

/// The ranked ids of a ranking file, when it is for the vocabulary `(fingerprint, num_tokens)`. `None` for another
/// vocabulary or a malformed file.
fn parse_ranking(data: &[u8], fingerprint: u64, num_tokens: usize) -> Option<Vec<u32>> {
    let header = data.get(..28)?;
    let word = |at: usize| u32::from_le_bytes(header[at..at + 4].try_into().expect("INVARIANT: 4 bytes"));
    let fp = u64::from_le_bytes(header[12..20].try_into().expect("INVARIANT: 8 bytes"));
    if &header[..8] != b"SPLDRAFT" || word(8) != 1 || fp != fingerprint || word(20) as usize != num_tokens {
        return None;
    }
    let n = word(24) as usize;
    let ids = data.get(28..28 + 4 * n)?;
    Some(ids.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().expect("INVARIANT: 4 bytes"))).collect())
}

/// The `n` token ids (ascending, all below `vocab`) that a head narrowed to `n` rows computes for the model in
/// `file`: its control and user-defined tokens, then the ranking's most frequent tokens where there is a ranking for
/// its vocabulary, then the lowest ids not taken yet. `n` at or past `vocab` gives every id.
pub fn head_ids(file: &GgufFile, vocab: usize, n: usize) -> Vec<u32> {
    if n >= vocab {
        return (0..vocab as u32).collect();
    }
    let tokens = file.get_str_array("tokenizer.ggml.tokens").ok().flatten().unwrap_or_default();
    // `SPLASH_DRAFT_RANKING=0`: the lowest ids even where there is a ranking (for A/B measurements).
    let use_ranking = std::env::var("SPLASH_DRAFT_RANKING").map_or(true, |v| v != "0");
    let ranked = (use_ranking && !tokens.is_empty())
        .then(|| {
            let fp = tokenizer_fingerprint(&tokens);
            RANKINGS.iter().find_map(|data| parse_ranking(data, fp, tokens.len()))
        })
        .flatten()
        .unwrap_or_default();
    let types = file.get_i64_array("tokenizer.ggml.token_type").ok().flatten().unwrap_or_default();
    let always = types.iter().enumerate().filter(|(_, t)| ALWAYS_KEPT_TYPES.contains(t)).map(|(i, _)| i as u32);

    let mut taken = vec![false; vocab];
    let mut ids = Vec::with_capacity(n);
    for id in always.chain(ranked).chain(0..vocab as u32) {
        if ids.len() == n {
            break;
        }
        if let Some(t) = taken.get_mut(id as usize)
            && !*t
        {
            *t = true;
            ids.push(id);
        }
    }
    ids.sort_unstable();
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_built_in_ranking_parses_and_a_wrong_vocabulary_is_refused() {
        let data = RANKINGS[0];
        let fp = u64::from_le_bytes(data[12..20].try_into().unwrap());
        let num = u32::from_le_bytes(data[20..24].try_into().unwrap()) as usize;
        let ranked = parse_ranking(data, fp, num).expect("the ranking parses");
        assert!(ranked.len() > 32768, "the ranking covers a 32K head: {}", ranked.len());
        assert!(ranked.iter().all(|&id| (id as usize) < num));
        let mut seen = ranked.clone();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), ranked.len(), "no id twice");
        assert!(parse_ranking(data, fp ^ 1, num).is_none());
        assert!(parse_ranking(data, fp, num + 1).is_none());
        assert!(parse_ranking(&data[..20], fp, num).is_none());
    }

    #[test]
    fn fingerprint_separates_token_boundaries() {
        assert_ne!(tokenizer_fingerprint(&["ab", "c"]), tokenizer_fingerprint(&["a", "bc"]));
        assert_eq!(tokenizer_fingerprint(&["ab", "c"]), tokenizer_fingerprint(&[String::from("ab"), "c".into()]));
    }
}
