//! What a model server reports of its own count, believed only within what a model could
//! count: a report is a figure from outside (a client or an upstream), so nonsense in it is
//! no report rather than a number to plan with.

/// No model reads more tokens than this in one call: a larger report (from a client or a
/// model server) is a mistake, never believed.
pub const MAX_REPORTED_TOKENS: u64 = 1_000_000_000;

/// A usage report's figures added up, when the sum is one a model could have counted (at
/// most [`MAX_REPORTED_TOKENS`]); a model server's nonsense (figures past it, or summing past
/// what a number holds) is no report.
pub fn reported_tokens(figures: impl IntoIterator<Item = u64>) -> Option<usize> {
    let sum = figures
        .into_iter()
        .try_fold(0u64, |sum, n| sum.checked_add(n))?;
    (sum <= MAX_REPORTED_TOKENS).then_some(sum as usize)
}
