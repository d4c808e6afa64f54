//! The planner on simulated machines (1 to 141 GiB), with and without a draft, under a cgroup limit, with user caps,
//! and the no-over-commit check against a page pool that hands out exactly what the plan promises.

use super::*;

const GIB: u64 = 1 << 30;

/// Qwen2.5-Coder-1.5B-Instruct (GGUF header values; Q4_K_M file size).
fn qwen_1_5b() -> ModelInput {
    ModelInput {
        shapes: ModelShapes {
            num_layers: 28,
            hidden_size: 1536,
            ffn_size: 8960,
            num_heads: 12,
            num_kv_heads: 2,
            head_dim: 128,
            vocab_size: 151_936,
            max_context: 32_768,
        },
        weight_bytes: 1_117_320_768,
        kv_value_bytes: 2,
        experts: None,
        recurrent: None,
    }
}

/// Qwen2.5-Coder-0.5B-Instruct, the draft.
fn qwen_0_5b() -> ModelInput {
    ModelInput {
        shapes: ModelShapes {
            num_layers: 24,
            hidden_size: 896,
            ffn_size: 4864,
            num_heads: 14,
            num_kv_heads: 2,
            head_dim: 64,
            vocab_size: 151_936,
            max_context: 32_768,
        },
        weight_bytes: 491_400_064,
        kv_value_bytes: 2,
        experts: None,
        recurrent: None,
    }
}

/// Qwen2.5-Coder-32B-Instruct at Q4_K_M (about 19.9 GB).
fn qwen_32b() -> ModelInput {
    ModelInput {
        shapes: ModelShapes {
            num_layers: 64,
            hidden_size: 5120,
            ffn_size: 27_648,
            num_heads: 40,
            num_kv_heads: 8,
            head_dim: 128,
            vocab_size: 152_064,
            max_context: 32_768,
        },
        weight_bytes: 19_851_336_384,
        kv_value_bytes: 2,
        experts: None,
        recurrent: None,
    }
}

fn input(target: ModelInput, draft: Option<ModelInput>, gib: u64) -> PlanInput {
    let mut i = PlanInput::new(target, DeviceMemory::simulated(gib * GIB), Device::Cpu);
    i.draft = draft;
    i.num_threads = 2;
    i
}

/// Everything the plan promises, added up the way a runner would allocate it: margin, weights, workspaces, and each
/// promised sequence's pages at full context — must fit the budget; and the pool itself must fit too.
fn assert_no_overcommit(i: &PlanInput, p: &Plan) {
    let b = &p.breakdown;
    let budget = i.max_memory_bytes.map_or(i.memory.available_bytes, |m| m.min(i.memory.available_bytes));
    assert_eq!(b.budget_bytes, budget);
    let seq_kv = p.max_sequences as u64 * p.pages_for(p.max_context) as u64 * PAGE_TOKENS as u64 * p.kv_bytes_per_token;
    assert!(b.deducted_bytes() + seq_kv <= budget, "promised sequences exceed the budget:\n{p}");
    assert!(b.deducted_bytes() + p.kv_pool_bytes() <= budget, "KV pool exceeds the budget:\n{p}");
    assert!(p.num_kv_pages >= p.max_sequences * p.pages_for(p.max_context), "pool smaller than promised:\n{p}");
    // The per-token KV the plan uses is the models' own (target + draft, f16 K and V of every layer).
    let expect_kv: u64 = std::iter::once(&i.target)
        .chain(i.draft.as_ref())
        .map(|m| {
            // A hybrid's recurrent layers keep no KV.
            let layers = m.recurrent.map_or(m.shapes.num_layers, |r| r.num_kv_layers);
            (layers * m.shapes.num_kv_heads * m.shapes.head_dim * 2 * 2) as u64
        })
        .sum();
    assert_eq!(p.kv_bytes_per_token, expect_kv);
    assert!(
        p.max_context <= i.target.shapes.max_context && p.max_context >= MIN_USEFUL_CONTEXT.min(p.model_max_context)
    );
    assert!(p.max_batch_tokens <= p.max_context && p.max_sequences >= 1);
}

/// A page pool as a paged KV manager would keep it: sequences take a page when their last one is full, and every
/// promised sequence runs to the full context at once (the worst case) without the pool running dry.
fn run_pool(p: &Plan) {
    let mut free = p.num_kv_pages;
    let mut pages = vec![0usize; p.max_sequences];
    for num_tokens in 1..=p.max_context {
        for held in pages.iter_mut() {
            if num_tokens > *held * p.page_tokens {
                assert!(free > 0, "pool ran dry at token {num_tokens}:\n{p}");
                free -= 1;
                *held += 1;
            }
        }
    }
    assert!(pages.iter().all(|&n| n * p.page_tokens >= p.max_context));
}

#[test]
fn one_gib_refuses_the_default_pack_with_a_breakdown() {
    let i = input(qwen_1_5b(), Some(qwen_0_5b()), 1);
    let err = plan(&i).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, PlanError::DoesNotFit { min_context: 2048, .. }), "{msg}");
    for needle in [
        "not enough memory",
        "target weights",
        "draft weights",
        "safety margin",
        "over budget by",
        "suggestion:",
        "KV cache (2048 tokens, 1 sequence)",
    ] {
        assert!(msg.contains(needle), "missing {needle:?} in:\n{msg}");
    }
    // Without the draft the 1.5B alone still does not fit 1 GiB, so the draft is not suggested.
    assert!(!msg.contains("without the draft"), "{msg}");
    assert!(plan(&input(qwen_1_5b(), None, 1)).is_err());
}

#[test]
fn two_gib_fits_the_target_alone_and_suggests_dropping_the_draft() {
    let alone = input(qwen_1_5b(), None, 2);
    let p = plan(&alone).expect("1.5B fits 2 GiB");
    assert_no_overcommit(&alone, &p);
    run_pool(&p);
    // 2 GiB - 0.36 GiB margin - 1.04 GiB weights leaves ~0.5 GiB: 28 KiB/token → ~18K tokens.
    assert!(p.max_context >= 8192 && p.context_limit != ContextLimit::User, "{p}");
    let with_draft = input(qwen_1_5b(), Some(qwen_0_5b()), 2);
    match plan(&with_draft) {
        Ok(p) => {
            assert_no_overcommit(&with_draft, &p);
            assert!(p.max_context < 32_768);
        }
        Err(e) => assert!(e.to_string().contains("without the draft"), "{e}"),
    }
}

#[test]
fn machines_from_1_to_141_gib() {
    let mut last: Option<(usize, usize)> = None;
    for gib in [1u64, 2, 8, 24, 80, 141] {
        for draft in [None, Some(qwen_0_5b())] {
            let i = input(qwen_1_5b(), draft.clone(), gib);
            let Ok(p) = plan(&i) else {
                assert!(gib <= 2, "{gib} GiB refused");
                continue;
            };
            assert_no_overcommit(&i, &p);
            if gib >= 8 {
                assert_eq!(p.max_context, 32_768, "{gib} GiB, draft {}:\n{p}", draft.is_some());
                assert_eq!(p.context_limit, ContextLimit::Model);
            }
            if gib >= 24 {
                // CPU default ceiling: 8 sequences; memory allows far more.
                assert_eq!(p.max_sequences, 8, "{p}");
                assert!(p.num_kv_pages > 8 * p.pages_for(32_768));
            }
            if draft.is_none() {
                if let Some((ctx, pages)) = last {
                    assert!(p.max_context >= ctx && p.num_kv_pages > pages, "more memory, smaller plan at {gib} GiB");
                }
                last = Some((p.max_context, p.num_kv_pages));
            }
        }
    }
}

#[test]
fn the_pool_serves_every_promised_sequence_at_full_context() {
    for (gib, draft) in [(2, None), (8, Some(qwen_0_5b())), (24, Some(qwen_0_5b()))] {
        let mut i = input(qwen_1_5b(), draft, gib);
        i.max_sequences = Some(64);
        let p = plan(&i).expect("fits");
        assert_no_overcommit(&i, &p);
        run_pool(&p);
    }
}

#[test]
fn an_f32_kv_cache_costs_twice_the_bytes() {
    let f16 = plan(&input(qwen_1_5b(), None, 8)).expect("fits");
    let f32 = plan(&input(ModelInput { kv_value_bytes: 4, ..qwen_1_5b() }, None, 8)).expect("fits");
    assert_eq!(f32.kv_bytes_per_token, 2 * f16.kv_bytes_per_token);
    assert_eq!(f32.kv_pool_bytes(), f32.num_kv_pages as u64 * PAGE_TOKENS as u64 * 28 * 2048);
    assert!(f32.num_kv_pages < f16.num_kv_pages);
}

#[test]
fn a_draft_costs_weights_and_kv() {
    let alone = plan(&input(qwen_1_5b(), None, 8)).expect("fits");
    let paired = plan(&input(qwen_1_5b(), Some(qwen_0_5b()), 8)).expect("fits");
    assert_eq!(alone.kv_bytes_per_token, 28 * 1024);
    assert_eq!(paired.kv_bytes_per_token, 28 * 1024 + 12 * 1024);
    assert!(paired.num_kv_pages < alone.num_kv_pages);
    assert!(paired.breakdown.items.iter().any(|i| i.label == "draft weights" && i.bytes == 491_400_064));
}

#[test]
fn memory_limits_context_of_a_big_model_and_gpu_defaults() {
    // 32B on a 24 GiB machine: weights fit, the full 32K context (8 GiB of KV) does not.
    let i = input(qwen_32b(), None, 24);
    let p = plan(&i).expect("fits with a shorter context");
    assert_no_overcommit(&i, &p);
    assert_eq!((p.context_limit, p.max_sequences), (ContextLimit::Memory, 1), "{p}");
    assert!(p.max_context < 32_768 && p.max_context >= 2048 && p.max_context.is_multiple_of(PAGE_TOKENS));
    // The same model on an H200 (141 GiB): full context, many sequences, the GPU's ceiling.
    let mut i = input(qwen_32b(), Some(qwen_0_5b()), 141);
    i.device = Device::Cuda;
    let p = plan(&i).expect("fits");
    assert_no_overcommit(&i, &p);
    run_pool(&p);
    assert_eq!((p.max_context, p.max_batch_tokens), (32_768, 2048));
    assert!(p.max_sequences > 8, "{p}");
    // 80 GiB: full context for fewer sequences than 141 GiB.
    let mut i80 = i.clone();
    i80.memory = DeviceMemory::simulated(80 * GIB);
    let p80 = plan(&i80).expect("fits");
    assert_no_overcommit(&i80, &p80);
    assert!(p80.max_sequences < p.max_sequences && p80.max_context == 32_768, "{p80}");
}

#[test]
fn cgroup_limit_below_physical_memory_bounds_the_plan() {
    let mut i = input(qwen_1_5b(), Some(qwen_0_5b()), 64);
    i.memory = DeviceMemory::from_parts(64 * GIB, 60 * GIB, Some(3 * GIB), Some(GIB / 2));
    assert_eq!(i.memory.available_bytes, 5 * GIB / 2);
    let p = plan(&i).expect("2.5 GiB fits the 1.5B with some context");
    assert_no_overcommit(&i, &p);
    assert_eq!(p.breakdown.budget_bytes, 5 * GIB / 2);
    assert!(p.breakdown.memory_source.contains("cgroup"));
    // A cgroup of 1 GiB refuses.
    i.memory = DeviceMemory::from_parts(64 * GIB, 60 * GIB, Some(GIB), None);
    assert!(plan(&i).is_err());
}

#[test]
fn user_caps_only_lower() {
    let base = input(qwen_1_5b(), None, 24);
    let full = plan(&base).expect("fits");
    // --max-context below and above the model's.
    let mut i = base.clone();
    i.max_context = Some(8192);
    let p = plan(&i).expect("fits");
    assert_eq!((p.max_context, p.context_limit), (8192, ContextLimit::User));
    i.max_context = Some(1 << 20);
    assert_eq!(plan(&i).expect("fits").max_context, 32_768);
    // A tiny --max-context is the user's choice, not a refusal.
    i.max_context = Some(512);
    let p = plan(&i).expect("fits");
    assert_eq!((p.max_context, p.max_batch_tokens), (512, 512));
    // --max-memory lowers the budget, never raises it.
    let mut i = base.clone();
    i.max_memory_bytes = Some(4 * GIB);
    let p = plan(&i).expect("fits");
    assert_no_overcommit(&i, &p);
    assert_eq!(p.breakdown.budget_bytes, 4 * GIB);
    assert!(p.num_kv_pages < full.num_kv_pages);
    i.max_memory_bytes = Some(1000 * GIB);
    assert_eq!(plan(&i).expect("fits"), full);
    // --max-memory too small: the suggestion says to raise it.
    i.max_memory_bytes = Some(GIB);
    let msg = plan(&i).unwrap_err().to_string();
    assert!(msg.contains("raise --max-memory"), "{msg}");
    // --max-sequences replaces the device ceiling; memory still bounds it.
    let mut i = base.clone();
    i.max_sequences = Some(2);
    assert_eq!(plan(&i).expect("fits").max_sequences, 2);
    i.max_sequences = Some(10_000);
    let p = plan(&i).expect("fits");
    assert!(p.max_sequences < 10_000 && p.max_sequences > 8);
    assert_no_overcommit(&i, &p);
}

#[test]
fn bad_shapes_and_sizes() {
    let mut t = qwen_1_5b();
    t.shapes.num_layers = 0;
    assert!(matches!(plan(&input(t, None, 8)), Err(PlanError::BadShapes(_))));
    assert_eq!(parse_bytes("8G").unwrap(), 8 * GIB);
    assert_eq!(parse_bytes("8GiB").unwrap(), 8 * GIB);
    assert_eq!(parse_bytes("8gb").unwrap(), 8 * GIB);
    assert_eq!(parse_bytes("1.5G").unwrap(), 3 * GIB / 2);
    assert_eq!(parse_bytes("512M").unwrap(), 512 << 20);
    assert_eq!(parse_bytes("4096").unwrap(), 4096);
    assert_eq!(parse_bytes("4096B").unwrap(), 4096);
    for bad in ["", "G", "b", "-1G", "lots", "0"] {
        assert!(parse_bytes(bad).is_err(), "{bad:?}");
    }
    assert_eq!(human_bytes(3 * GIB / 2), "1.5 GiB");
    assert_eq!(human_bytes(12), "12 B");
}

#[test]
fn the_prefix_cache_cap_bounds_the_pool_issue_22() {
    // Issue 22: a 24 GiB machine, `--max-context 2048 --max-sequences 2`, the 1.5B with its draft, planned a
    // 20.9 GiB pool that the prefix cache filled over a day.
    let mut i = input(qwen_1_5b(), Some(qwen_0_5b()), 24);
    i.max_context = Some(2048);
    i.max_sequences = Some(2);
    let uncapped = plan(&i).unwrap();
    assert!(uncapped.kv_pool_bytes() > 15 * GIB, "{uncapped}");
    assert_eq!(uncapped.max_cached_pages, None);
    let cap = default_prefix_cache_bytes(&i.memory);
    assert_eq!(cap, 3 * GIB);
    i.prefix_cache_bytes = Some(cap);
    let p = plan(&i).unwrap();
    assert_no_overcommit(&i, &p);
    run_pool(&p);
    let active = p.max_sequences * p.pages_for(p.max_context);
    assert_eq!((p.max_context, p.max_sequences), (2048, 2));
    assert_eq!(p.num_kv_pages, active + p.max_cached_pages.unwrap());
    assert!(
        p.prefix_cache_bytes().unwrap() <= cap && p.prefix_cache_bytes().unwrap() > cap - p.kv_bytes_per_token * 16
    );
    assert!(p.kv_pool_bytes() < 4 * GIB, "{p}");
    assert!(p.to_string().contains("prefix cache     at most"), "{p}");
    // The default cap is an eighth of memory, at most 4 GiB; memory left below the cap bounds it instead.
    assert_eq!(default_prefix_cache_bytes(&DeviceMemory::simulated(8 * GIB)), GIB);
    assert_eq!(default_prefix_cache_bytes(&DeviceMemory::simulated(141 * GIB)), 4 * GIB);
    let mut small = input(qwen_0_5b(), None, 2);
    small.prefix_cache_bytes = Some(64 * GIB);
    let s = plan(&small).unwrap();
    assert_no_overcommit(&small, &s);
    let all = plan(&input(qwen_0_5b(), None, 2)).unwrap();
    assert_eq!(s.num_kv_pages, all.num_kv_pages);
}

/// Qwen3-30B-A3B Q4_K_M (the synthetic file of `splash synth --like qwen3-30b-a3b`: its header's shapes and bytes).
fn qwen3_30b_a3b() -> ModelInput {
    ModelInput {
        shapes: ModelShapes {
            num_layers: 48,
            hidden_size: 2048,
            ffn_size: 6144,
            num_heads: 32,
            num_kv_heads: 4,
            head_dim: 128,
            vocab_size: 151_936,
            max_context: 40_960,
        },
        weight_bytes: 18_550_716_416,
        kv_value_bytes: 2,
        experts: Some(ExpertShapes { num_experts: 128, num_used: 8, expert_ffn: 768, bytes: 17_553_162_240 }),
        recurrent: None,
    }
}

/// The MoE model fits a 24 GiB machine (its experts memory-mapped, counted once), the breakdown names the experts,
/// and a chunk's activations count the picked experts' rows.
#[test]
fn moe_counts_its_experts_and_fits_24_gib() {
    let i = input(qwen3_30b_a3b(), Some(qwen_0_5b()), 24);
    let p = plan(&i).expect("fits");
    assert_no_overcommit(&i, &p);
    let text = p.to_string();
    assert!(text.contains("target experts (8 of 128 per token)"), "{text}");
    assert!(text.contains("target weights (all but the experts)"), "{text}");
    let m = qwen3_30b_a3b();
    let dense = m.shapes.activation_bytes_per_token();
    assert!(m.activation_bytes_per_token() > dense + 8 * 4 * (2 * 2048 + 3 * 768), "{text}");
}

/// On a GPU the plan also counts the tensor-core path's f16 copies of one layer's experts (128 x 3 x 768 x 2048
/// values) and its f16 rows.
#[test]
fn moe_on_a_gpu_counts_the_experts_f16_copies() {
    let mut i = input(qwen3_30b_a3b(), None, 141);
    i.device = Device::Cuda;
    let p = plan(&i).expect("fits");
    assert_no_overcommit(&i, &p);
    let item = (p.breakdown.items.iter()).find(|it| it.label.contains("f16 copies")).expect("the experts' f16 copies");
    assert!(item.bytes >= 128 * 3 * 768 * 2048 * 2, "{}", item.bytes);
    let mut cpu = input(qwen3_30b_a3b(), None, 141);
    cpu.device = Device::Cpu;
    let p = plan(&cpu).expect("fits");
    assert!(!p.breakdown.items.iter().any(|it| it.label.contains("f16 copies")), "the CPU keeps no copies");
}

/// A Qwen3.8-27B-shaped hybrid at Q4_K_M (64 layers, 16 of them gated attention with 4 KV heads of 256; 48 Gated
/// DeltaNet layers of 16 key and 48 value heads of 128, conv kernel 4).
fn qwen38_27b() -> ModelInput {
    let conv_dim = 2 * 16 * 128 + 48 * 128;
    let state_len = 3 * conv_dim + 48 * 128 * 128;
    ModelInput {
        shapes: ModelShapes {
            num_layers: 64,
            hidden_size: 5120,
            ffn_size: 17_408,
            num_heads: 24,
            num_kv_heads: 4,
            head_dim: 256,
            vocab_size: 248_320,
            max_context: 262_144,
        },
        weight_bytes: 16_500_000_000,
        kv_value_bytes: 2,
        experts: None,
        recurrent: Some(RecurrentShapes { num_kv_layers: 16, state_bytes: 48 * 4 * state_len as u64 }),
    }
}

/// A hybrid's KV cache counts its attention layers only; its states (each sequence's own, its rollback rows, its
/// latest boundary) and checkpoints are in the breakdown and fit beside the KV; a machine too small is refused
/// with the breakdown.
#[test]
fn a_hybrid_counts_its_recurrent_state_and_checkpoints() {
    let m = qwen38_27b();
    assert_eq!(m.kv_bytes_per_token(), 2 * 16 * 4 * 256 * 2, "attention layers only");
    let i = input(m.clone(), None, 48);
    let p = plan(&i).expect("fits 48 GiB");
    assert_no_overcommit(&i, &p);
    let state = m.recurrent.expect("recurrent").state_bytes;
    let item = |label: &str| p.breakdown.items.iter().find(|it| it.label.starts_with(label)).map(|it| it.bytes);
    let n = p.max_sequences as u64;
    assert_eq!(item("recurrent state"), Some(n * STATES_PER_SEQUENCE as u64 * state), "{p}");
    assert_eq!(item("state checkpoints"), Some(n * CHECKPOINTS_PER_SEQUENCE as u64 * state), "{p}");
    assert_eq!(p.max_state_checkpoints, p.max_sequences * CHECKPOINTS_PER_SEQUENCE);
    assert!(p.to_string().contains("recurrent state checkpoints in memory"), "{p}");
    // Dense models keep none.
    assert_eq!(plan(&input(qwen_1_5b(), None, 8)).expect("fits").max_state_checkpoints, 0);
    match plan(&input(m, None, 16)) {
        Err(PlanError::DoesNotFit { breakdown, .. }) => {
            assert!(breakdown.items.iter().any(|it| it.label.starts_with("recurrent state")), "{breakdown}")
        }
        other => panic!("16 GiB for 16.5 GB of weights: {other:?}"),
    }
}
