//! The scheduler: which requests run, and which of their tokens the next step computes.
//!
//! Its answer for a step is a [`SchedulerOutput`]: per scheduled sequence, the tokens it feeds (a prompt chunk, or the
//! pending token of a decoding sequence), the drafts verified after them, and which rows need logits. The rules:
//!
//! - **Budget.** A step carries at most `max_batch_tokens` tokens (drafts included). Decoding sequences go first; while
//!   any decodes, prompts share at most `max_prefill_tokens_while_decoding` of what is left, so a long prompt never
//!   stalls the streams already running. Both come from the device: a CPU's step costs grow with every token (a few
//!   hundred a step), a GPU's hardly change up to thousands.
//! - **Memory.** A step only schedules tokens whose KV blocks the runner can supply: its free blocks plus the
//!   unreferenced blocks of the prefix cache, which it evicts on demand ([`models::KvUsage`]). A runner that reports
//!   no capacity has no limit.
//! - **Admission by memory.** A waiting request enters when the blocks of its prompt (and first output token) that
//!   the prefix cache does not already hold fit beside one block of growth per running sequence: the number of
//!   running requests is only capped by `max_running`, never fixed by the worst case of a full context each.
//!   Requests enter in arrival order; one that does not fit holds the queue, so a long prompt is never overtaken
//!   forever.
//! - **Preemption by recompute.** When the running sequences need more blocks than are left, the most recently
//!   admitted one that this step has not scheduled yet is preempted: its KV is released (its full blocks stay in the
//!   prefix cache, so the recompute is mostly a cache hit), and it goes back to the front of the queue with its tokens,
//!   its output so far kept. On re-admission it computes all its tokens as a prompt and then samples its next token
//!   as it would have: greedy output does not change. A request fails for lack of memory never; one that cannot fit
//!   even alone in the pool ends with `Length`, as at the end of the context.
//! - **Chunked prefill, short prompts first, with aging.** Prompts are ordered by the tokens they have left minus one
//!   step's prompt budget for every step since their admission, ties in admission order. A short request arriving
//!   during a long prefill therefore starts at once (its first token comes within a bounded number of steps), and a
//!   long prompt overtaken by a stream of short ones gets to the front within (its length / budget) steps.

use std::collections::VecDeque;

use models::{Runner, SeqId};

use crate::sequence::Sequence;
use crate::spec::proposer::Proposers;
use crate::speculate::Proposal;
use crate::{RequestId, SpecConfig};

/// One sequence's part of a step.
pub(crate) struct Scheduled {
    /// Index into the running sequences (after this step's preemptions).
    pub(crate) index: usize,
    /// Tokens fed from the sequence's uncomputed tokens.
    pub(crate) num_tokens: usize,
    /// Drafts verified after them (decoding sequences only; the chooser may trim them).
    pub(crate) proposal: Proposal,
}

impl Scheduled {
    /// Whether the step reaches the sequence's end, so that its last row (and the drafts' rows) need logits.
    pub(crate) fn wants_logits(&self, s: &Sequence) -> bool {
        s.num_computed_tokens + self.num_tokens == s.tokens.len()
    }
}

/// What the next step does.
#[derive(Default)]
pub(crate) struct SchedulerOutput {
    /// In step order: decoding sequences first, then prompt chunks.
    pub(crate) scheduled: Vec<Scheduled>,
    /// Running sequences that cannot fit the KV pool even alone: the engine ends them with `Length`.
    pub(crate) cannot_fit: Vec<usize>,
}

/// The queue of requests waiting for memory, and the counters of admission.
#[derive(Default)]
pub(crate) struct Scheduler {
    /// Requests not holding KV: new ones in arrival order, preempted ones in front.
    pub(crate) waiting: VecDeque<Sequence>,
    /// Most sequences running at once.
    pub(crate) max_running: usize,
    /// Steps scheduled so far: the clock of prompt aging.
    step: u64,
    /// Blocks available when the head of the queue last did not fit: it is not tried again (nor its prefix looked
    /// up) until more are.
    blocked_at: Option<usize>,
    /// Requests admitted for the first time since [`Self::take_admitted`], with their prompt tokens served from the
    /// prefix cache.
    admitted: Vec<(RequestId, usize)>,
    pub(crate) num_preemptions: u64,
}

/// The limits of one step.
pub(crate) struct StepLimits {
    pub(crate) max_batch_tokens: usize,
    pub(crate) max_prefill_tokens_while_decoding: usize,
}

/// The runner's KV blocks as the scheduler counts them: what the runner has available, less what this step has
/// given out so far.
struct Blocks {
    /// Available at the last read; None: the runner has no limit.
    available: Option<usize>,
    given: usize,
    block_tokens: usize,
}

impl Blocks {
    fn read<R: Runner>(runner: &R) -> Blocks {
        let kv = runner.kv_usage();
        let available = (kv.capacity_blocks > 0).then(|| kv.capacity_blocks.saturating_sub(kv.used_blocks));
        Blocks { available, given: 0, block_tokens: kv.block_tokens.max(1) }
    }

    /// Reads the runner again (a preemption freed blocks), keeping what this step has given out.
    fn reread<R: Runner>(&mut self, runner: &R) {
        self.available = Blocks::read(runner).available;
    }

    fn free(&self) -> Option<usize> {
        self.available.map(|a| a.saturating_sub(self.given))
    }

    /// New blocks a sequence holding `len` positions needs to hold `len + n`.
    fn needed(&self, len: usize, n: usize) -> usize {
        (len + n).div_ceil(self.block_tokens) - len.div_ceil(self.block_tokens)
    }

    /// Most of `n` tokens that fit after `len` positions.
    fn fit(&self, len: usize, n: usize) -> usize {
        match self.free() {
            None => n,
            Some(free) => n.min((len.div_ceil(self.block_tokens) + free) * self.block_tokens - len),
        }
    }

    fn take(&mut self, len: usize, n: usize) {
        self.given += self.needed(len, n);
    }
}

impl Scheduler {
    pub(crate) fn new() -> Self {
        Scheduler { max_running: usize::MAX, ..Default::default() }
    }

    /// Requests admitted for the first time since the last call, with their prompt tokens served from the prefix
    /// cache.
    pub(crate) fn take_admitted(&mut self) -> Vec<(RequestId, usize)> {
        std::mem::take(&mut self.admitted)
    }

    /// Moves waiting requests into `running` while their prompts fit (see the module's rules), attaching each one's
    /// cached prefix. A request admitted for the first time is admitted by the proposers too; a preempted one they
    /// still know (its proposer state kept, the KV of a draft model dropped: it catches up as a prompt).
    fn admit<R: Runner>(
        &mut self,
        running: &mut Vec<Sequence>,
        runner: &mut R,
        proposers: &mut Proposers<R>,
        spec: &SpecConfig,
    ) {
        while running.len() < self.max_running {
            let Some(s) = self.waiting.front() else { break };
            let before = Blocks::read(runner).available;
            if !running.is_empty() && before.is_some() && before <= self.blocked_at {
                break;
            }
            let seq = SeqId(s.id.0);
            let num_cached = runner.attach_prefix(seq, reusable(s));
            let blocks = Blocks::read(runner);
            // What the running sequences still need: the rest of each prompt, a block of growth for each decoder.
            let committed: usize = running
                .iter()
                .map(|r| {
                    if r.is_prefill() {
                        blocks.needed(r.num_computed_tokens, r.tokens.len() + 1 - r.num_computed_tokens)
                    } else {
                        1
                    }
                })
                .sum();
            let needed = blocks.needed(num_cached, s.tokens.len() + 1 - num_cached);
            if blocks.free().is_some_and(|free| !running.is_empty() && needed + committed > free) {
                runner.release(seq);
                self.blocked_at = before;
                break;
            }
            self.blocked_at = None;
            let mut s = self.waiting.pop_front().expect("INVARIANT: the front was read above");
            s.num_computed_tokens = num_cached;
            s.admitted_step = self.step;
            if !s.was_admitted {
                let constrained = s.constraint.as_ref().is_some_and(|c| !c.is_dormant());
                for slot in 0..proposers.len() {
                    if let Some(p) = proposers.get_mut(slot) {
                        p.admit(seq, &s.tokens, num_cached, spec, constrained);
                    }
                }
                s.was_admitted = true;
                s.num_cached_tokens = num_cached;
                self.admitted.push((s.id, num_cached));
            }
            running.push(s);
        }
    }

    /// Preempts `s`: frees its KV in the runner, drops the proposers' KV of it (they keep what they learned of it)
    /// and resets it to be recomputed from its tokens.
    fn preempt<R: Runner>(&mut self, s: &mut Sequence, runner: &mut R, proposers: &mut Proposers<R>) {
        runner.release(SeqId(s.id.0));
        for slot in 0..proposers.len() {
            if let Some(p) = proposers.get_mut(slot) {
                p.truncate(SeqId(s.id.0), 0);
            }
        }
        s.num_computed_tokens = 0;
        s.prefill_len = s.tokens.len();
        s.hidden.clear();
        self.num_preemptions += 1;
    }

    /// Admits what fits and schedules the next step over `running`; `proposals[i]` is what running sequence `i`
    /// would draft if it decodes (taken from it when scheduled). Preempted sequences leave `running` (and their
    /// proposals) for the front of the queue.
    pub(crate) fn schedule<R: Runner>(
        &mut self,
        limits: &StepLimits,
        running: &mut Vec<Sequence>,
        proposals: &mut Vec<Proposal>,
        runner: &mut R,
        proposers: &mut Proposers<R>,
        spec: &SpecConfig,
    ) -> SchedulerOutput {
        self.admit(running, runner, proposers, spec);
        proposals.resize_with(running.len(), Proposal::default);
        self.step += 1;
        let mut budget = limits.max_batch_tokens;
        let prefill_cap = limits.max_prefill_tokens_while_decoding.max(1);
        // Decoding first (in admission order), then prompts by tokens left less their aging credit.
        let mut order: Vec<usize> = (0..running.len()).collect();
        order.sort_by_key(|&i| {
            let s = &running[i];
            if s.is_prefill() {
                let left = s.tokens.len() - s.num_computed_tokens;
                let credit = (self.step - s.admitted_step) as usize * prefill_cap;
                (1, left.saturating_sub(credit))
            } else {
                (0, 0)
            }
        });
        let mut blocks = Blocks::read(runner);
        let mut out = SchedulerOutput::default();
        let mut done = vec![false; running.len()];
        let mut preempted = vec![false; running.len()];
        let mut prefill_budget = None;
        for &i in &order {
            if preempted[i] {
                continue;
            }
            let s = &running[i];
            let decoding = !s.is_prefill();
            let remaining = s.tokens.len() - s.num_computed_tokens;
            let want = if decoding {
                remaining.min(budget)
            } else {
                let cap = *prefill_budget.get_or_insert(if out.scheduled.is_empty() { budget } else { prefill_cap });
                remaining.min(cap).min(budget)
            };
            if want == 0 {
                continue;
            }
            // Room for at least one token: preempt the latest admitted sequences not scheduled yet, this one last.
            while blocks.fit(running[i].num_computed_tokens, 1) == 0 {
                let victim = (0..running.len()).rev().find(|&j| !done[j] && !preempted[j]);
                let Some(j) = victim else { break };
                if j == i && preempted.iter().filter(|&&p| !p).count() == 1 {
                    // Alone and still too big: it can never run.
                    out.cannot_fit.push(i);
                    break;
                }
                preempted[j] = true;
                self.preempt(&mut running[j], runner, proposers);
                blocks.reread(runner);
                if j == i {
                    break;
                }
            }
            if preempted[i] || out.cannot_fit.last() == Some(&i) {
                continue;
            }
            let s = &running[i];
            let n = blocks.fit(s.num_computed_tokens, want);
            blocks.take(s.num_computed_tokens, n);
            budget -= n;
            if !decoding {
                *prefill_budget.as_mut().expect("INVARIANT: set above") -= n;
            }
            let mut proposal = std::mem::take(&mut proposals[i]);
            if decoding {
                // Drafts only where their rows fit the budget and the blocks left (a full pool drafts nothing).
                let k = blocks.fit(s.num_computed_tokens + n, proposal.tokens.len().min(budget));
                if k < proposal.tokens.len() {
                    proposal.tokens.truncate(k);
                    proposal.weights.truncate(k);
                    if k == 0 {
                        proposal.proposer = None;
                    }
                }
                blocks.take(s.num_computed_tokens + n, k);
                budget -= k;
            }
            done[i] = true;
            out.scheduled.push(Scheduled { index: i, num_tokens: n, proposal });
        }
        // Preempted sequences leave the running list; indices after them shift down.
        let shift: Vec<usize> = preempted
            .iter()
            .scan(0, |n, &p| {
                let before = *n;
                *n += usize::from(p);
                Some(before)
            })
            .collect();
        for x in &mut out.scheduled {
            x.index -= shift[x.index];
        }
        for i in &mut out.cannot_fit {
            *i -= shift[*i];
        }
        for i in (0..running.len()).rev().filter(|&i| preempted[i]) {
            proposals.remove(i);
            self.waiting.push_front(running.remove(i));
        }
        out
    }
}

/// The tokens whose KV may come from the prefix cache: all but the last, which is computed in any case (its logits
/// give the next token).
fn reusable(s: &Sequence) -> &[u32] {
    &s.tokens[..s.tokens.len() - 1]
}
