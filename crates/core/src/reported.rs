//! What a model server reports of its own count, believed only within what a model could
//! count: a report is a figure from outside (a client or an upstream), so nonsense in it is
//! no report rather than a number to plan with. A refusal for length is such a report too:
//! its counts are the model's own (read from each API's error in `compactd-formats`).

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

/// What an upstream said when it refused a prompt as too long for the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overflow {
    /// The prompt's tokens, as the upstream counted them, when it said.
    pub tokens: Option<usize>,
    /// The model's window, when it said.
    pub limit: Option<usize>,
    /// The completion the client asked room for beside the prompt, when it said.
    pub completion: Option<usize>,
}

impl Overflow {
    /// The window the refusal says the model has, for a session told `limit`: the one it
    /// named, else the count it refused when that is not over `limit` (the window is under
    /// the count, and a count over the session's limit says nothing the limit does not).
    pub fn window_under(&self, limit: usize) -> Option<usize> {
        self.limit.or(self.tokens.filter(|t| *t <= limit))
    }
}
