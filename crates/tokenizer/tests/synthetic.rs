//! Model-free tests on a tiny tokenizer written into an in-memory GGUF: special-token rules, streaming decoding and
//! load errors. (Parity with llama.cpp on real vocabularies is in `parity.rs`.)

use gguf::{GgufFile, GgufWriter, Value, ValueType};
use tokenizer::{Detokenizer, Error, Tokenizer};

/// GPT-2's byte-to-character table.
fn byte_char(b: u8) -> char {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable(b) {
        return b as char;
    }
    let rank = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + rank).unwrap()
}

const IM_START: u32 = 256;
const IM_END: u32 = 257;
const TOOL_CALL: u32 = 258;
const PAD: u32 = 259;
const HE: u32 = 260;
const LL: u32 = 261;
const HELL: u32 = 262;
const HELLO: u32 = 263;
const SPACE_W: u32 = 264;

struct Spec {
    model: &'static str,
    pre: Option<&'static str>,
    add_bos: Option<bool>,
    bos: Option<u32>,
}

fn build(spec: Spec) -> GgufFile {
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_char(b).to_string()).collect();
    let mut types = vec![1i32; 256];
    for (text, ty) in [
        ("<|im_start|>", 3),
        ("<|im_end|>", 3),
        ("<tool_call>", 4),
        ("[PAD259]", 5),
        ("he", 1),
        ("ll", 1),
        ("hell", 1),
        ("hello", 1),
        ("Ġw", 1),
    ] {
        tokens.push(text.to_owned());
        types.push(ty);
    }
    let merges = ["h e", "l l", "he ll", "hell o", "Ġ w"];
    let strings = |v: Vec<String>| Value::Array(ValueType::String, v.into_iter().map(Value::String).collect());

    let mut w = GgufWriter::new();
    w.add("general.architecture", Value::String("llama".into()));
    w.add("tokenizer.ggml.model", Value::String(spec.model.into()));
    if let Some(pre) = spec.pre {
        w.add("tokenizer.ggml.pre", Value::String(pre.into()));
    }
    w.add("tokenizer.ggml.tokens", strings(tokens));
    w.add("tokenizer.ggml.token_type", Value::Array(ValueType::I32, types.into_iter().map(Value::I32).collect()));
    w.add("tokenizer.ggml.merges", strings(merges.iter().map(|s| s.to_string()).collect()));
    if let Some(bos) = spec.bos {
        w.add("tokenizer.ggml.bos_token_id", Value::U32(bos));
    }
    w.add("tokenizer.ggml.eos_token_id", Value::U32(IM_END));
    if let Some(add_bos) = spec.add_bos {
        w.add("tokenizer.ggml.add_bos_token", Value::Bool(add_bos));
    }
    GgufFile::from_bytes(w.to_bytes()).unwrap()
}

fn qwen_like() -> Tokenizer {
    let file = build(Spec { model: "gpt2", pre: Some("qwen2"), add_bos: Some(false), bos: Some(IM_START) });
    Tokenizer::from_gguf(&file).unwrap()
}

fn byte_id(b: u8) -> u32 {
    b as u32
}

#[test]
fn merges_apply_and_specials_follow_parse_special() {
    let tok = qwen_like();
    assert_eq!(tok.encode("hello world", false).unwrap(), vec![HELLO, SPACE_W, 111, 114, 108, 100]);
    assert_eq!(tok.encode("", true).unwrap(), Vec::<u32>::new());
    assert_eq!(tok.encode("he hell ll", false).unwrap(), vec![HE, 32, HELL, 32, LL]);

    let text = "<|im_start|>hello<|im_end|>";
    assert_eq!(tok.encode(text, true).unwrap(), vec![IM_START, HELLO, IM_END]);
    // As plain text the control tokens go through BPE byte by byte.
    let plain = tok.encode(text, false).unwrap();
    assert!(!plain.contains(&IM_START) && plain.contains(&HELLO));
    assert_eq!(tok.decode(&plain), text);

    // User-defined tokens are matched even without parse_special.
    assert_eq!(tok.encode("<tool_call>hello", false).unwrap(), vec![TOOL_CALL, HELLO]);
    // A partial special text stays text; the unused filler row is never produced.
    assert!(!tok.encode("<|im_start|", true).unwrap().contains(&IM_START));
    assert!(!tok.encode("[PAD259]", true).unwrap().contains(&PAD));
}

#[test]
fn roles_eog_and_rendering() {
    let tok = qwen_like();
    assert_eq!(tok.bos(), Some(IM_START));
    assert_eq!(tok.eos(), Some(IM_END));
    assert!(!tok.add_bos());
    assert!(tok.is_eog(IM_END));
    assert!(!tok.is_eog(IM_START));
    // `<|im_end|>` is also found by text as the end-of-turn token.
    assert_eq!(tok.special_ids().eot, Some(IM_END));
    assert_eq!(tok.vocab_size(), 265);
    assert_eq!(tok.token_str(SPACE_W), Some("Ġw"));
    assert_eq!(tok.token_id("<tool_call>"), Some(TOOL_CALL));
    assert_eq!(tok.decode(&[IM_START, HELLO, PAD, IM_END]), "<|im_start|>hello<|im_end|>");
    assert_eq!(tok.decode_bytes(&[IM_START, HELLO, TOOL_CALL, IM_END], false), b"hello<tool_call>");
    assert_eq!(tok.decode(&[HELLO, 100_000]), "hello");
}

#[test]
fn detokenizer_holds_back_partial_characters() {
    let tok = qwen_like();
    let mut d = Detokenizer::new(&tok);
    // 你 = E4 BD A0, 🦀 = F0 9F A6 80
    assert_eq!(d.push(byte_id(0xE4)), "");
    assert_eq!(d.push(byte_id(0xBD)), "");
    assert_eq!(d.num_pending_bytes(), 2);
    assert_eq!(d.push(byte_id(0xA0)), "你");
    assert_eq!(d.push(HELLO), "hello");
    assert_eq!(d.push(byte_id(0xF0)), "");
    assert_eq!(d.push(byte_id(0x9F)), "");
    assert_eq!(d.push(byte_id(0xA6)), "");
    assert_eq!(d.push(byte_id(0x80)), "🦀");
    // An invalid byte is replaced at once; an unfinished character at the end becomes U+FFFD.
    assert_eq!(d.push(byte_id(0xFF)), "\u{FFFD}");
    assert_eq!(d.push(byte_id(0xE4)), "");
    assert_eq!(d.push(byte_id(b'x')), "\u{FFFD}x");
    assert_eq!(d.push(byte_id(0xE4)), "");
    assert_eq!(d.finish(), "\u{FFFD}");
    assert_eq!(d.finish(), "");
}

#[test]
fn detokenizer_stream_equals_lossy_decode() {
    let tok = qwen_like();
    // Pieces drawn from valid text, broken sequences and special tokens, by a fixed pseudo-random sequence.
    let pool: Vec<u32> = [0xE4, 0xBD, 0xA0, 0xF0, 0x9F, 0xA6, 0x80, 0xC3, 0xA9, 0xFF, 0xC0, b'a', b' ']
        .into_iter()
        .map(|b| b as u32)
        .chain([IM_END, HELLO, PAD, TOOL_CALL])
        .collect();
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..500 {
        let len = (state % 24) as usize;
        let mut ids = Vec::with_capacity(len);
        for _ in 0..len {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ids.push(pool[(state % pool.len() as u64) as usize]);
        }
        for render_special in [true, false] {
            let mut d = Detokenizer::with_special(&tok, render_special);
            let mut streamed = String::new();
            for &id in &ids {
                d.push_into(id, &mut streamed);
                assert!(d.num_pending_bytes() <= 3);
            }
            streamed.push_str(&d.finish());
            let want = String::from_utf8_lossy(&tok.decode_bytes(&ids, render_special)).into_owned();
            assert_eq!(streamed, want, "ids {ids:?}");
        }
    }
}

#[test]
fn detokenizer_works_through_an_arc() {
    let tok = std::sync::Arc::new(qwen_like());
    let mut d = Detokenizer::new(std::sync::Arc::clone(&tok));
    assert_eq!(d.push(HELLO), "hello");
}

#[test]
fn load_errors_are_clear() {
    let err = |spec| Tokenizer::from_gguf(&build(spec)).unwrap_err();
    assert!(matches!(
        err(Spec { model: "llama", pre: None, add_bos: None, bos: None }),
        Error::UnsupportedModel(m) if m == "llama"
    ));
    assert!(matches!(
        err(Spec { model: "gpt2", pre: Some("no-such-pre"), add_bos: None, bos: None }),
        Error::UnsupportedPreTokenizer(_)
    ));
    assert!(matches!(
        err(Spec { model: "gpt2", pre: Some("qwen2"), add_bos: Some(true), bos: None }),
        Error::BadVocab(_)
    ));

    let empty = GgufFile::from_bytes(GgufWriter::new().to_bytes()).unwrap();
    assert!(matches!(Tokenizer::from_gguf(&empty).unwrap_err(), Error::MissingKey("tokenizer.ggml.model")));
}

#[test]
fn llama_bpe_adds_bos_by_default() {
    let file = build(Spec { model: "gpt2", pre: Some("llama-bpe"), add_bos: None, bos: Some(IM_START) });
    let tok = Tokenizer::from_gguf(&file).unwrap();
    assert!(tok.add_bos());
    // ignore_merges: a word that is itself a token is taken whole.
    assert_eq!(tok.encode("hello", false).unwrap(), vec![HELLO]);
    // No pre-tokenizer name: llama.cpp's default chain.
    let file = build(Spec { model: "gpt2", pre: None, add_bos: None, bos: None });
    let tok = Tokenizer::from_gguf(&file).unwrap();
    assert!(!tok.add_bos());
    assert_eq!(tok.encode("hello world", false).unwrap(), vec![HELLO, SPACE_W, 111, 114, 108, 100]);
}
