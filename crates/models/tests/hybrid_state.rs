//! The recurrent state of the qwen35 and qwen35moe hybrids on the CPU runner (`models::state`), on the transformers
//! fixtures (fixtures/hf/qwen35/ and fixtures/hf/qwen35moe/, f32 and q8_0): exact in every way a sequence can be cut,
//! resumed or batched. Each test compares logits bit for bit with an uninterrupted run of the same tokens on the same
//! runner kind:
//! - a request resumes from the longest cached prefix with a state checkpoint (periodic ones of a long prefill, the
//!   end of a prompt, the end of a request) and recomputes only the rest; checkpoints leave with their KV blocks;
//! - the second turn of a conversation (prompt, reply, new tokens) recomputes only the new tokens and the tail of
//!   the last block of the first turn;
//! - speculative rollback: after k + 1 verification rows, cutting back to any accepted length (and far back, into
//!   the prompt) continues exactly;
//! - sequences batched together compute what they compute alone.
//!
//! `cargo test --release -p splash-models --test hybrid_state`

mod golden;

use std::path::PathBuf;

use golden::{configs, one, open, prefill};
use models::cpu::CpuRunner;
use models::kv_cache::BLOCK_TOKENS;
use models::{Batch, LogitsWanted, Runner, SeqChunk, SeqId, argmax};

const FILES: [&str; 2] = ["model-f32.gguf", "model-q8_0.gguf"];

/// A case's name, its file (directory and name), its prompt's ids and the file's runner.
type Case = (String, (PathBuf, &'static str), Vec<u32>, CpuRunner);

/// The longest prompt of each config of both hybrids (several prefill chunks), on each of the config's files.
fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    for g in ["qwen35", "qwen35moe"].into_iter().flat_map(configs) {
        let p = g.prompts.iter().max_by_key(|p| p.ids.len()).expect("a prompt");
        assert!(p.ids.len() > 300, "{}: the long prompt has {} tokens", g.dir.display(), p.ids.len());
        for file in FILES {
            let r = CpuRunner::new(open(&g.dir, file), 0).expect("the CPU runner loads the hybrid");
            out.push((format!("{} {file}", g.dir.display()), (g.dir.clone(), file), p.ids.clone(), r));
        }
    }
    out
}

/// Runs `ids[start..]` of `seq` in chunks of `chunk` as the engine prefills: no logits but the last chunk's last
/// row's.
fn prefill_chunks(r: &mut CpuRunner, seq: SeqId, ids: &[u32], start: usize, chunk: usize) {
    let mut at = start;
    while at < ids.len() {
        let end = (at + chunk).min(ids.len());
        let logits = if end == ids.len() { LogitsWanted::Last } else { LogitsWanted::None };
        r.forward(&one(seq, &ids[at..end], at, logits)).expect("prefill chunk");
        at = end;
    }
}

/// Every position's logits of `ids[from..]` of `seq`, which holds `from` tokens.
fn rest(r: &mut CpuRunner, seq: SeqId, ids: &[u32], from: usize) -> Vec<f32> {
    r.forward(&one(seq, &ids[from..], from, LogitsWanted::All)).expect("rest").to_vec()
}

fn state_usage(r: &CpuRunner) -> models::state::StateUsage {
    r.kv_usage().state.expect("a hybrid reports its state")
}

#[test]
fn a_request_resumes_from_its_longest_checkpoint() {
    for (name, _, ids, mut r) in cases() {
        let vocab = r.config().vocab_size;
        let whole = prefill(&mut r, &ids);
        r.evict_prefix_cache();
        assert_eq!(state_usage(&r).checkpoints, 0, "{name}: checkpoints leave with their blocks");
        // A first request of 200 tokens in chunks of 64, with checkpoints every 64: at 64, 128, 192, and the
        // prompt's last two boundaries before its last token, 176 and 192 (also the end of the request).
        r.set_checkpoint_every(64);
        prefill_chunks(&mut r, SeqId(10), &ids[..200], 0, 64);
        r.release(SeqId(10));
        assert_eq!(state_usage(&r).checkpoints, 4, "{name}");
        // The next request shares 200 tokens: it resumes at 192, where both the KV and a checkpoint are.
        let before = r.kv_usage();
        let cached = r.attach_prefix(SeqId(11), &ids[..ids.len() - 1]);
        assert_eq!(cached, 192, "{name}");
        assert_eq!(r.kv_usage().hit_tokens - before.hit_tokens, 192, "{name}: prefix hits count the resumed tokens");
        let got = rest(&mut r, SeqId(11), &ids, cached);
        assert!(got == whole[cached * vocab..], "{name}: resumed at {cached} differs from one pass");
        r.release(SeqId(11));
        // A prompt that leaves the shared prefix at 150 resumes at the checkpoint before: 128.
        let mut other = ids[..150].to_vec();
        other.extend(ids[..60].iter().rev());
        assert_eq!(r.attach_prefix(SeqId(12), &other), 128, "{name}");
        let resumed = rest(&mut r, SeqId(12), &other, 128);
        r.release(SeqId(12));
        r.evict_prefix_cache();
        assert_eq!(r.attach_prefix(SeqId(13), &other), 0, "{name}: evicted with the blocks");
        let cold = rest(&mut r, SeqId(13), &other, 0);
        assert!(resumed == cold[128 * vocab..], "{name}: a diverging prompt");
        r.release(SeqId(13));
        let u = state_usage(&r);
        assert_eq!(u.checkpoint_hits, 2, "{name}: {u:?}");
    }
}

#[test]
fn the_second_turn_recomputes_only_the_new_tokens() {
    for (name, _, ids, mut r) in cases() {
        let vocab = r.config().vocab_size;
        // Turn 1: a 150-token prompt and a 20-token greedy reply (its last token is never run).
        let seq = SeqId(20);
        let prompt = &ids[..150];
        let mut last = *r.forward_argmax(&one(seq, prompt, 0, LogitsWanted::Last)).expect("prompt").last().expect("id");
        let mut turn = prompt.to_vec();
        for _ in 0..20 {
            turn.push(last);
            let pos = turn.len() - 1;
            if turn.len() < 150 + 20 {
                last = r.forward_argmax(&one(seq, &[last], pos, LogitsWanted::Last)).expect("decode")[0];
            }
        }
        assert_eq!(r.seq_len(seq), 169);
        r.release(seq);
        // Turn 2: the conversation so far and 40 new tokens.
        let new = &ids[150..190];
        turn.extend_from_slice(new);
        let before = r.kv_usage();
        let cached = r.attach_prefix(SeqId(21), &turn[..turn.len() - 1]);
        let recomputed = turn.len() - cached;
        // The reply's tokens past its last full block are run again (at most a block), and the unrun last one.
        assert_eq!(cached, 169 / BLOCK_TOKENS * BLOCK_TOKENS, "{name}");
        assert!(recomputed < new.len() + BLOCK_TOKENS + 1, "{name}: {recomputed} tokens recomputed");
        let u = r.kv_usage();
        assert_eq!(u.hit_tokens - before.hit_tokens, cached as u64, "{name}");
        assert_eq!(u.lookup_tokens - before.lookup_tokens, (turn.len() - 1) as u64, "{name}");
        eprintln!("{name}: turn 2 of {} tokens, {cached} reused, {recomputed} recomputed", turn.len());
        let got = rest(&mut r, SeqId(21), &turn, cached);
        r.release(SeqId(21));
        let whole = prefill(&mut r, &turn);
        assert!(got == whole[cached * vocab..], "{name}: the second turn differs from one pass");
    }
}

#[test]
fn rollback_after_verification_continues_exactly() {
    for (name, _, ids, mut r) in cases() {
        let vocab = r.config().vocab_size;
        let whole = prefill(&mut r, &ids);
        let (start, k1) = (100, 9);
        // Every accepted length of a 9-row verification, the row before it, and a cut far back into the prompt.
        let cuts: Vec<usize> = (start..=start + k1).chain([37, 64]).collect();
        for (i, &keep) in cuts.iter().enumerate() {
            let seq = SeqId(100 + i as u64);
            r.forward(&one(seq, &ids[..start], 0, LogitsWanted::Last)).expect("prompt");
            // The verification rows: the prompt's own next tokens, some of which a real draft would get wrong.
            r.forward(&one(seq, &ids[start..start + k1], start, LogitsWanted::All)).expect("verify");
            r.truncate(seq, keep);
            assert_eq!(r.seq_len(seq), keep.min(start + k1), "{name}");
            let next = &ids[keep..keep + 5];
            let got = r.forward(&one(seq, next, keep, LogitsWanted::All)).expect("after rollback").to_vec();
            assert!(got == whole[keep * vocab..(keep + 5) * vocab], "{name}: cut back to {keep}");
            r.release(seq);
        }
        let u = state_usage(&r);
        eprintln!("{name}: {u:?}");
        assert!(u.replayed_tokens > 0, "{name}: the far cuts replay from a checkpoint");
    }
}

#[test]
fn batched_sequences_compute_what_they_compute_alone() {
    for (name, _, ids, mut r) in cases() {
        let vocab = r.config().vocab_size;
        let (a, b) = (&ids[..120], &ids[40..230]);
        let alone_a = prefill(&mut r, a);
        let alone_b = prefill(&mut r, b);
        // Both prompts in chunks side by side, then decode steps and a verification of 4 rows together.
        let (sa, sb) = (SeqId(30), SeqId(31));
        let mut got_a = Vec::new();
        let mut got_b = Vec::new();
        for (ca, cb) in [((0, 50), (0, 70)), ((50, 110), (70, 150)), ((110, 111), (150, 154)), ((111, 120), (154, 160))]
        {
            let batch = Batch {
                chunks: vec![
                    SeqChunk { seq: sa, tokens: &a[ca.0..ca.1], start_pos: ca.0, logits: LogitsWanted::All },
                    SeqChunk { seq: sb, tokens: &b[cb.0..cb.1], start_pos: cb.0, logits: LogitsWanted::All },
                ],
            };
            let out = r.forward(&batch).expect("batch").to_vec();
            let split = (ca.1 - ca.0) * vocab;
            got_a.extend_from_slice(&out[..split]);
            got_b.extend_from_slice(&out[split..]);
        }
        let rest_b = rest(&mut r, sb, b, 160);
        got_b.extend(rest_b);
        assert!(got_a == alone_a, "{name}: sequence a batched");
        assert!(got_b == alone_b, "{name}: sequence b batched");
        // Greedy tokens agree with the one-pass logits too.
        let picks: Vec<u32> = got_a.chunks_exact(vocab).map(argmax).collect();
        assert_eq!(picks, alone_a.chunks_exact(vocab).map(argmax).collect::<Vec<_>>());
        r.release(sa);
        r.release(sb);
    }
}

/// The disk tier keeps the checkpoints too: a new runner (a restart) resumes a prompt from blocks and a state read
/// back from disk, and continues it bit for bit as one pass did.
#[test]
fn checkpoints_survive_a_restart_through_the_disk_tier() {
    for (i, (name, (dir, file), ids, mut first)) in cases().into_iter().enumerate() {
        let vocab = first.config().vocab_size;
        let root = std::env::temp_dir().join(format!("splash-hybrid-disk-{}-{i}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        first.enable_prefix_store(&root, 1 << 30).expect("store");
        let whole = prefill(&mut first, &ids);
        while first.idle_work() {}
        let identity = first.identity();
        drop(first);
        let mut second = CpuRunner::new(open(&dir, file), 0).expect("cpu");
        second.enable_prefix_store(&root, 1 << 30).expect("store");
        assert_eq!(second.identity(), identity);
        let cached = second.attach_prefix(SeqId(2), &ids[..ids.len() - 1]);
        assert_eq!(cached, (ids.len() - 1) / BLOCK_TOKENS * BLOCK_TOKENS, "{name}: resumed from disk");
        let u = state_usage(&second);
        assert_eq!((u.checkpoint_hits, u.checkpoint_hit_tokens), (1, cached as u64), "{name}");
        let got = rest(&mut second, SeqId(2), &ids, cached);
        assert!(got == whole[cached * vocab..], "{name}: after a restart");
        std::fs::remove_dir_all(&root).expect("cleans up");
    }
}
