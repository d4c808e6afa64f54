//! The CPU runner on a tiny random qwen2 model written with `gguf::GgufWriter`: KV bookkeeping (append, truncate,
//! release), batching several sequences, and request-scoped errors that leave every sequence unchanged.

use std::sync::Arc;

use gguf::{GgmlType, GgufWriter, Value, ValueType};
use models::cpu::CpuRunner;
use models::{Batch, Error, LogitsWanted, Runner, SeqChunk, SeqId, argmax};

const HIDDEN: usize = 64;
const FFN: usize = 128;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = HIDDEN / HEADS;
const VOCAB: usize = 96;
const LAYERS: usize = 2;
const CONTEXT: usize = 48;
/// The tiny model's control tokens.
const CONTROL: [u32; 2] = [90, 95];

/// Deterministic values in [-scale, scale).
fn values(seed: usize, n: usize, scale: f32) -> Vec<f32> {
    let mut x = seed as u64 * 0x9E37_79B9_7F4A_7C15 + 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

fn tiny_model() -> CpuRunner {
    let mut w = GgufWriter::new();
    w.add("general.architecture", Value::String("qwen2".into()));
    for (k, v) in [
        ("block_count", LAYERS),
        ("embedding_length", HIDDEN),
        ("feed_forward_length", FFN),
        ("attention.head_count", HEADS),
        ("attention.head_count_kv", KV_HEADS),
        ("context_length", CONTEXT),
    ] {
        w.add(format!("qwen2.{k}"), Value::U32(v as u32));
    }
    w.add("qwen2.attention.layer_norm_rms_epsilon", Value::F32(1e-6));
    w.add("qwen2.rope.freq_base", Value::F32(10000.0));
    // Normal tokens (1) but for two control tokens (3) at the end, as a chat model's end-of-turn markers.
    let types = (0..VOCAB).map(|i| Value::I32(if CONTROL.contains(&(i as u32)) { 3 } else { 1 })).collect();
    w.add("tokenizer.ggml.token_type", Value::Array(ValueType::I32, types));
    let mut seed = 0;
    let mut matrix = |w: &mut GgufWriter, name: &str, rows: usize, cols: usize| {
        seed += 1;
        let data = gguf::quant::quantize(GgmlType::Q8_0, &values(seed, rows * cols, 0.3)).expect("quantize");
        w.add_tensor(name, &[cols as u64, rows as u64], GgmlType::Q8_0, data).expect("tensor");
    };
    matrix(&mut w, "token_embd.weight", VOCAB, HIDDEN);
    matrix(&mut w, "output.weight", VOCAB, HIDDEN);
    let vector = |w: &mut GgufWriter, name: &str, n: usize, base: f32| {
        let v: Vec<u8> = values(n + name.len(), n, 0.1).iter().flat_map(|x| (x + base).to_le_bytes()).collect();
        w.add_tensor(name, &[n as u64], GgmlType::F32, v).expect("tensor");
    };
    vector(&mut w, "output_norm.weight", HIDDEN, 1.0);
    let kv = KV_HEADS * HEAD_DIM;
    for l in 0..LAYERS {
        let n = |s: &str| format!("blk.{l}.{s}");
        vector(&mut w, &n("attn_norm.weight"), HIDDEN, 1.0);
        vector(&mut w, &n("ffn_norm.weight"), HIDDEN, 1.0);
        vector(&mut w, &n("attn_q.bias"), HIDDEN, 0.0);
        vector(&mut w, &n("attn_k.bias"), kv, 0.0);
        vector(&mut w, &n("attn_v.bias"), kv, 0.0);
        matrix(&mut w, &n("attn_q.weight"), HIDDEN, HIDDEN);
        matrix(&mut w, &n("attn_k.weight"), kv, HIDDEN);
        matrix(&mut w, &n("attn_v.weight"), kv, HIDDEN);
        matrix(&mut w, &n("attn_output.weight"), HIDDEN, HIDDEN);
        matrix(&mut w, &n("ffn_gate.weight"), FFN, HIDDEN);
        matrix(&mut w, &n("ffn_up.weight"), FFN, HIDDEN);
        matrix(&mut w, &n("ffn_down.weight"), HIDDEN, FFN);
    }
    let file = gguf::GgufFile::from_bytes(w.to_bytes()).expect("tiny model parses");
    CpuRunner::new(Arc::new(file), 2).expect("tiny model loads")
}

fn chunk(seq: u64, tokens: &[u32], start_pos: usize, logits: LogitsWanted) -> SeqChunk<'_> {
    SeqChunk { seq: SeqId(seq), tokens, start_pos, logits }
}

fn forward(r: &mut CpuRunner, chunks: Vec<SeqChunk<'_>>) -> Vec<f32> {
    r.forward(&Batch { chunks }).expect("forward").to_vec()
}

fn close(a: &[f32], b: &[f32]) -> bool {
    let num: f32 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
    let den: f32 = b.iter().map(|y| y * y).sum();
    (num / den).sqrt() < 2e-2
}

#[test]
fn truncate_rolls_back_exactly() {
    let mut r = tiny_model();
    let prompt = [1u32, 5, 9, 13, 17, 21];
    forward(&mut r, vec![chunk(1, &prompt, 0, LogitsWanted::None)]);
    let first = forward(&mut r, vec![chunk(1, &[30, 31], 6, LogitsWanted::All)]);
    assert_eq!(r.seq_len(SeqId(1)), 8);
    r.truncate(SeqId(1), 6);
    assert_eq!(r.seq_len(SeqId(1)), 6);
    let again = forward(&mut r, vec![chunk(1, &[30, 31], 6, LogitsWanted::All)]);
    assert_eq!(first, again, "recomputing after a rollback must give the same logits");
    r.release(SeqId(1));
    assert_eq!(r.seq_len(SeqId(1)), 0);
}

#[test]
fn chunked_prefill_and_batching_agree_with_one_shot() {
    let mut r = tiny_model();
    let prompt: Vec<u32> = (0..20).map(|i| (i * 7 % VOCAB) as u32).collect();
    let one_shot = forward(&mut r, vec![chunk(1, &prompt, 0, LogitsWanted::Last)]);
    // The same prompt in three chunks, batched next to another sequence's prefill.
    let other: Vec<u32> = (0..9).map(|i| (i * 5 % VOCAB) as u32).collect();
    forward(&mut r, vec![chunk(2, &prompt[..7], 0, LogitsWanted::None), chunk(3, &other, 0, LogitsWanted::Last)]);
    forward(&mut r, vec![chunk(2, &prompt[7..15], 7, LogitsWanted::None)]);
    let chunked =
        forward(&mut r, vec![chunk(3, &[4], 9, LogitsWanted::Last), chunk(2, &prompt[15..], 15, LogitsWanted::Last)]);
    assert_eq!(chunked.len(), 2 * VOCAB);
    assert!(close(&chunked[VOCAB..], &one_shot), "chunked and batched prefill must match the one-shot prefill");
    // Token by token gives the same distribution too.
    let mut last = Vec::new();
    for (i, t) in prompt.iter().enumerate() {
        last = forward(&mut r, vec![chunk(4, std::slice::from_ref(t), i, LogitsWanted::Last)]);
    }
    assert!(close(&last, &one_shot));
}

#[test]
fn bad_batches_are_refused_and_change_nothing() {
    let mut r = tiny_model();
    forward(&mut r, vec![chunk(1, &[1, 2, 3], 0, LogitsWanted::None)]);
    let before = forward(&mut r, vec![chunk(9, &[1, 2, 3, 4], 0, LogitsWanted::Last)]);
    r.truncate(SeqId(9), 3);
    type Case<'a> = (Vec<SeqChunk<'a>>, fn(&Error) -> bool);
    let cases: Vec<Case> = vec![
        (vec![chunk(1, &[4], 5, LogitsWanted::Last)], |e| matches!(e, Error::BadPosition { .. })),
        (vec![chunk(1, &[VOCAB as u32], 3, LogitsWanted::Last)], |e| matches!(e, Error::BadToken(_))),
        (vec![chunk(1, &[1; CONTEXT], 3, LogitsWanted::Last)], |e| matches!(e, Error::ContextOverflow(..))),
        (vec![chunk(1, &[4], 3, LogitsWanted::Last), chunk(1, &[5], 4, LogitsWanted::Last)], |e| {
            matches!(e, Error::DuplicateSeq(1))
        }),
        // A good chunk next to a bad one: the whole batch is refused, the good sequence untouched.
        (vec![chunk(9, &[4], 3, LogitsWanted::Last), chunk(1, &[4], 0, LogitsWanted::Last)], |e| {
            matches!(e, Error::BadPosition { .. })
        }),
    ];
    for (chunks, is_expected) in cases {
        let err = r.forward(&Batch { chunks }).expect_err("must be refused");
        assert!(is_expected(&err), "unexpected error: {err}");
        assert_eq!(r.seq_len(SeqId(1)), 3);
        assert_eq!(r.seq_len(SeqId(9)), 3);
    }
    let after = forward(&mut r, vec![chunk(9, &[4], 3, LogitsWanted::Last)]);
    assert!(close(&after, &before));
}

/// The KV pool holds exactly the blocks it is given (the memory plan's pages): every promised sequence runs to the
/// full context at once, one token more is a clean `KvCacheFull` error that changes nothing, and a released sequence's
/// blocks serve the next one.
#[test]
fn kv_pool_serves_exactly_the_promised_sequences() {
    let mut r = tiny_model();
    let num_seqs = 3;
    let pages_per_seq = CONTEXT.div_ceil(models::kv_cache::BLOCK_TOKENS);
    r.set_kv_blocks(num_seqs * pages_per_seq);
    let tokens: Vec<u32> = (0..CONTEXT as u32).map(|t| t % VOCAB as u32).collect();
    for s in 0..num_seqs as u64 {
        forward(&mut r, vec![chunk(s, &tokens, 0, LogitsWanted::Last)]);
        assert_eq!(r.seq_len(SeqId(s)), CONTEXT);
    }
    let usage = r.kv_usage();
    assert_eq!(usage.used_blocks, num_seqs * pages_per_seq);
    let extra = r.forward(&Batch { chunks: vec![chunk(9, &tokens[..1], 0, LogitsWanted::Last)] });
    assert!(matches!(extra, Err(models::Error::KvCacheFull { needed: 1, available: 0 })), "{:?}", extra.err());
    assert_eq!(r.seq_len(SeqId(9)), 0);
    r.release(SeqId(0));
    // Sequence 0's blocks stay cached (its prefix), yet are handed out again when needed.
    let mut other = tokens.clone();
    other[0] = 1;
    forward(&mut r, vec![chunk(10, &other, 0, LogitsWanted::Last)]);
    assert_eq!(r.seq_len(SeqId(10)), CONTEXT);
}

#[test]
fn a_narrowed_head_gives_the_full_heads_logits_for_its_ids() {
    let mut full = tiny_model();
    let mut narrow = tiny_model();
    // 16 ids: the two control tokens, then the lowest ids (the tiny vocabulary has no ranking).
    assert_eq!(narrow.limit_logits(16), 96, "logits by token id, up to the largest id in the head");
    let ids: Vec<usize> = (0..14).chain(CONTROL.iter().map(|&c| c as usize)).collect();
    let long: Vec<u32> = (0..40).map(|i| (i * 13 % VOCAB) as u32).collect();
    let prompts: [&[u32]; 3] = [&[3, 8, 1, 40, 77], &[5, 5, 60], &long];
    let mut picked_control = false;
    for (seq, prompt) in prompts.iter().enumerate() {
        let c = || vec![chunk(seq as u64, prompt, 0, LogitsWanted::All)];
        let want = forward(&mut full, c());
        let got = forward(&mut narrow, c());
        assert_eq!(got.len(), want.len());
        for (row_got, row_want) in got.chunks_exact(VOCAB).zip(want.chunks_exact(VOCAB)) {
            for id in 0..VOCAB {
                if ids.contains(&id) {
                    assert_eq!(row_got[id], row_want[id], "id {id}: the head's row is the full head's");
                } else {
                    assert_eq!(row_got[id], f32::NEG_INFINITY, "id {id} is not in the head");
                }
            }
        }
        // The greedy picks come from the narrowed rows, as token ids.
        for r in [&mut full, &mut narrow] {
            r.truncate(SeqId(seq as u64), 0);
        }
        let picks = narrow.forward_top(&Batch { chunks: c() }).expect("forward_top");
        for (row, &(id, p)) in got.chunks_exact(VOCAB).zip(&picks) {
            assert_eq!(id, argmax(row), "the pick is the best id in the head");
            assert!(p > 0.0 && p <= 1.0);
            picked_control |= CONTROL.contains(&id);
        }
        narrow.truncate(SeqId(seq as u64), 0);
        let argmaxes = narrow.forward_argmax(&Batch { chunks: c() }).expect("forward_argmax");
        assert_eq!(argmaxes, picks.iter().map(|&(id, _)| id).collect::<Vec<_>>());
    }
    assert!(picked_control, "some pick is a control token, whose row in the head is not its id");
    // Back to the whole vocabulary.
    assert_eq!(narrow.limit_logits(0), VOCAB);
    narrow.release(SeqId(0));
    full.release(SeqId(0));
    let c = || vec![chunk(0, &[1, 2, 3], 0, LogitsWanted::Last)];
    assert_eq!(forward(&mut narrow, c()), forward(&mut full, c()));
}

/// Hidden rows for a proposer: after the layers asked for, one row per token of the batch in chunk order, the same
/// in one pass as token by token; none once none are asked for; a layer past the model's is refused.
#[test]
fn hidden_rows_of_chosen_layers_come_back_per_token() {
    let mut r = tiny_model();
    assert!(r.set_hidden_layers(&[LAYERS]).is_err());
    r.set_hidden_layers(&[LAYERS - 1, 0]).expect("layers in range");
    let tokens = [5u32, 17, 3, 42];
    forward(&mut r, vec![chunk(1, &tokens, 0, LogitsWanted::Last)]);
    let whole = r.hidden_rows().to_vec();
    assert_eq!(whole.len(), 2 * tokens.len() * HIDDEN);
    let mut one = tiny_model();
    one.set_hidden_layers(&[LAYERS - 1, 0]).expect("layers in range");
    for (i, &t) in tokens.iter().enumerate() {
        forward(&mut one, vec![chunk(1, &[t], i, LogitsWanted::Last)]);
        let rows = one.hidden_rows();
        for l in 0..2 {
            let got = &rows[l * HIDDEN..(l + 1) * HIDDEN];
            let want = &whole[(l * tokens.len() + i) * HIDDEN..(l * tokens.len() + i + 1) * HIDDEN];
            assert!(close(got, want), "layer slot {l}, token {i}");
        }
    }
    // The two layers' rows differ (they are not one row copied).
    assert!(!close(&whole[..HIDDEN], &whole[tokens.len() * HIDDEN..(tokens.len() + 1) * HIDDEN]));
    r.set_hidden_layers(&[]).expect("none");
    forward(&mut r, vec![chunk(2, &tokens, 0, LogitsWanted::Last)]);
    assert!(r.hidden_rows().is_empty());
}

/// A capped prefix cache that evicts a block the disk tier has not written yet (no idle time came for the idle
/// writer) writes it first: a warm restart finds the whole prefix on disk, with the same keys and values.
#[test]
fn an_evicted_block_reaches_the_disk_tier_first() {
    let root = std::env::temp_dir().join(format!("splash-spill-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let bt = models::kv_cache::BLOCK_TOKENS;
    let a: Vec<u32> = (0..2 * bt as u32 + 1).map(|i| (i * 7) % 90).collect();
    let b: Vec<u32> = (0..2 * bt as u32).map(|i| (i * 11 + 3) % 90).collect();
    let mut r = tiny_model();
    r.enable_prefix_store(&root, 1 << 30).expect("store");
    // One cached block in memory: releasing `a` evicts its first block at once, `b`'s prefill its second.
    r.set_prefix_cache_blocks(Some(1));
    let want = forward(&mut r, vec![chunk(1, &a, 0, LogitsWanted::Last)]);
    r.release(SeqId(1));
    forward(&mut r, vec![chunk(2, &b, 0, LogitsWanted::Last)]);
    r.release(SeqId(2));
    assert!(r.kv_usage().evicted_blocks >= 3, "{:?}", r.kv_usage());
    let mut warm = tiny_model();
    warm.enable_prefix_store(&root, 1 << 30).expect("store");
    assert_eq!(warm.attach_prefix(SeqId(3), &a), 2 * bt, "both of a's blocks are on disk");
    let got = forward(&mut warm, vec![chunk(3, &a[2 * bt..], 2 * bt, LogitsWanted::Last)]);
    assert!(close(&got, &want), "the blocks read back hold a's keys and values");
    let _ = std::fs::remove_dir_all(&root);
}
