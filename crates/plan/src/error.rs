//! The planner's errors: a refusal that carries the breakdown, and bad user input (sizes).

use crate::Breakdown;

/// Everything the planner can refuse.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    /// Not even the minimal useful context fits one sequence. The message is the whole story: the breakdown, how much
    /// is missing, and what to try.
    #[error(
        "not enough memory to run this model with a useful context ({min_context} tokens): {short} more are \
         needed\n{breakdown}\nsuggestion: {suggestion}",
        short = crate::human_bytes(*short_bytes)
    )]
    DoesNotFit { min_context: usize, short_bytes: u64, breakdown: Breakdown, suggestion: String },
    /// A shape that cannot be planned (zero layers, zero context, ...).
    #[error("invalid model shapes: {0}")]
    BadShapes(String),
    /// A size such as `8G` that does not parse.
    #[error("expected a size such as 8G, 512M, 1.5GiB or a number of bytes, got {0:?}")]
    BadSize(String),
}
