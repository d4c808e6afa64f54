//! Prompt lookup as a [`Proposer`]: the tokens that followed the latest earlier occurrence of the sequence's last
//! few tokens ([`super::ngram_match`]). Free (no passes of its own), and strong when a reply copies what it was
//! shown. Its acceptance is kept per sequence and per match length ([`NgramAcceptance`]), and keeps being measured
//! while another proposer is chosen: its untaken offers are compared with what the target produced.

use std::collections::HashMap;

use models::SeqId;

use super::proposer::{Draft, Offer, Proposer, SeqView, StepPlan, Verified};
use super::{NgramAcceptance, SpecConfig};

#[derive(Default)]
struct SeqState {
    acceptance: NgramAcceptance,
    /// The last offer's tokens and the length of the suffix match behind them.
    offer: Vec<u32>,
    match_len: usize,
}

/// Prompt lookup; see the module docs.
#[derive(Default)]
pub struct NgramProposer {
    seqs: HashMap<SeqId, SeqState>,
}

impl Proposer for NgramProposer {
    fn name(&self) -> &'static str {
        "ngram"
    }

    fn runs_passes(&self) -> bool {
        false
    }

    fn admit(&mut self, seq: SeqId, _prompt: &[u32], _cached: usize, _cfg: &SpecConfig, _constrained: bool) {
        self.seqs.insert(seq, SeqState::default());
    }

    fn proposes_for(&self, seq: SeqId, cfg: &SpecConfig) -> bool {
        cfg.ngram && self.seqs.contains_key(&seq)
    }

    fn offer(&mut self, s: &SeqView<'_>, max_k: usize, cfg: &SpecConfig) -> Option<Offer> {
        let st = self.seqs.get_mut(&s.seq)?;
        st.offer.clear();
        if !cfg.ngram {
            return None;
        }
        let (tokens, match_len) = super::ngram_match(s.tokens, cfg.ngram_min_match, cfg.ngram_max_match, max_k);
        if tokens.is_empty() {
            return None;
        }
        st.offer.clone_from(&tokens);
        st.match_len = match_len;
        Some(Offer { max_k: tokens.len(), tokens, rate: st.acceptance.rate(match_len), ..Offer::default() })
    }

    fn propose(&mut self, drafts: &mut [Draft<'_>], _plan: &StepPlan<'_>) -> models::Result<Vec<f64>> {
        for d in drafts {
            let offer = self.seqs.get(&d.seq).map_or(&[][..], |s| &s.offer[..]);
            d.out = offer[..d.k.min(offer.len())].to_vec();
            d.weights = vec![None; d.out.len()];
        }
        Ok(Vec::new())
    }

    fn verified(&mut self, seq: SeqId, v: &Verified<'_>) {
        let Some(st) = self.seqs.get_mut(&seq) else { return };
        if v.chosen {
            st.acceptance.update(st.match_len, v.proposed, v.accepted);
        } else if v.others && !st.offer.is_empty() {
            let matched = st.offer.iter().zip(v.output).take_while(|(a, b)| a == b).count();
            st.acceptance.update(st.match_len, st.offer.len().min(v.output.len()), matched);
        }
        st.offer.clear();
    }

    fn release(&mut self, seq: SeqId) {
        self.seqs.remove(&seq);
    }
}
