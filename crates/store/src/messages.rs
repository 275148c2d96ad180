//! Messages: append (with the tool-call check); reading them is `reading`.

use super::maskings::MaskingRow;
use super::rows::SessionRow;
use super::sessions::{NewSession, get_live, insert};
use super::shortened::{encoded, origin, results_since_turn, shortened};
use super::{Result, Store, StoreError};
use crate::compaction::Origin;
use crate::compaction::constants::PRESERVE_RECENT_OUTPUTS;
use crate::compaction::instruction::is_instruction;
use crate::compaction::media::Media;
use crate::compaction::microcompact::{MaskingStart, masked_parts};
use crate::compaction::step::StepRoom;
use crate::message::{Message, Part, Role, answers_exactly};
use compactd_core::SessionId;
use rusqlite::{Connection, OptionalExtension, params};
use std::collections::{HashMap, HashSet};

/// A message ready to store: validated, estimated and encoded before it reaches the writer.
#[derive(Debug, Clone)]
pub struct NewMessage {
    role: &'static str,
    parts_json: String,
    tokens: usize,
    /// (call id, tool name) of each tool_call part.
    calls: Vec<(String, String)>,
    /// Call ids this message answers.
    answers: Vec<String>,
    /// A user instruction: it opens a turn, and the session's first is its task.
    instruction: bool,
    system: bool,
    /// A message the context may show otherwise (its outputs masked, or shortened when too
    /// large): any but a system message (those are pinned, shown as they are).
    content: Option<Message>,
    /// Proxied messages: the fingerprint the client's next call is matched by.
    hash: Option<i64>,
    /// Proxied messages: the fingerprint of its opening (first paragraph), by which a
    /// conversation's task is recognised wherever a client puts it again.
    opening: Option<i64>,
    /// Proxied messages: what their images and documents cost the model (in `tokens`
    /// already), by where they sit: the forms the context shows count those they keep.
    media: Media,
}

/// What the session's config says about the messages of an append: how they are pinned,
/// and how much room the current step has. Decided from the session as the append finds it.
#[derive(Debug, Clone, Copy)]
pub struct AppendRules {
    /// The task is pinned when it takes at most this many tokens.
    pub task_max_tokens: usize,
    /// Pinned messages may take at most this many tokens in all.
    pub max_pinned_tokens: usize,
    /// What the current step may take in the context (see [`crate::compaction::step`]), once
    /// the context with it would pass `step_whole_under`.
    pub step_budget: usize,
    /// A message of the current step stays whole, whatever its budget, while the context
    /// with it stays under this many estimated tokens: the session's trigger against its
    /// limit in estimated tokens, as a compaction plans (the model's rate rounded up, never
    /// under the estimate). A cut the window does not need loses the agent its newest output
    /// for nothing: an 11,300-character output reached the model as 1,366 characters in a
    /// request of 9,000 tokens at a 20,000-token window. (Counted as the trigger counts, from
    /// the model's last report, a context kept whole this way went up to 554 tokens past a
    /// 32,000-token window: the report's rate is not rounded up.)
    pub step_whole_under: usize,
    /// A proxied client's call: nothing it sends is refused. Results may answer calls the
    /// session never saw, and system messages (and the client's prefix) are pinned only
    /// while pinned messages stay within `pin_cap`; later ones stay at their place and are
    /// compacted like any message, so a client sending one every turn cannot fill the
    /// context with them.
    pub lenient: bool,
    /// With `lenient`: what pinned messages may take.
    pub pin_cap: usize,
    /// Where masking old tool outputs starts: an append over it masks in its own transaction
    /// when that saves a batch's worth, so the agent's next step needs no second write to
    /// find out. `None`: microcompaction is off, or the caller masks on its own (the proxy).
    pub masking: Option<MaskingStart>,
    /// The session's token trigger. The first usage report after a compaction of a context
    /// the model server measured is that compaction's verdict (see
    /// [`crate::Store::commit_compaction`]): under this line, the compaction did its
    /// work and the breaker's count starts over; over it, the attempt stays counted.
    pub token_trigger: usize,
}

impl AppendRules {
    /// Rules that refuse nothing and pin nothing, the current step unbounded: for a message
    /// stored off the current branch, whose counters describe another branch.
    pub(super) const AS_SENT: AppendRules = AppendRules {
        task_max_tokens: 0,
        max_pinned_tokens: 0,
        step_budget: usize::MAX,
        step_whole_under: 0,
        lenient: true,
        pin_cap: 0,
        masking: None,
        token_trigger: 0,
    };
}

impl NewMessage {
    pub fn new(message: &Message, tokens: usize) -> NewMessage {
        NewMessage::owned(message.clone(), tokens)
    }

    /// The same, keeping `message` itself (a large append holds its text once parsed and once
    /// encoded, not a third time as a copy).
    pub fn owned(message: Message, tokens: usize) -> NewMessage {
        NewMessage {
            system: message.role == Role::System,
            role: message.role.as_str(),
            parts_json: serde_json::to_string(&message.parts).unwrap_or_else(|_| "[]".into()),
            tokens,
            calls: message
                .parts
                .iter()
                .filter_map(|p| match p {
                    Part::ToolCall { id, name, .. } => Some((id.clone(), name.clone())),
                    _ => None,
                })
                .collect(),
            answers: message.tool_result_ids().map(str::to_string).collect(),
            instruction: is_instruction(&message),
            content: (message.role != Role::System).then_some(message),
            hash: None,
            opening: None,
            media: Media::default(),
        }
    }

    pub fn hash(&self) -> Option<i64> {
        self.hash
    }

    /// The message with the fingerprints a proxied conversation matches it by: of what the
    /// client sends, and of its opening.
    pub fn with_hash(mut self, hash: i64, opening: Option<i64>) -> NewMessage {
        self.hash = Some(hash);
        self.opening = opening;
        self
    }

    /// The message with what its images and documents cost the model (counted in its
    /// tokens already).
    pub fn with_media(mut self, media: Media) -> NewMessage {
        self.media = media;
        self
    }

    pub fn tokens(&self) -> usize {
        self.tokens
    }

    #[cfg(test)]
    pub(crate) fn content(&self) -> Option<&Message> {
        self.content.as_ref()
    }
}

/// An append's Idempotency-Key and the fingerprint of its request.
#[derive(Debug, Clone)]
pub struct Idempotency {
    pub key: String,
    pub request_hash: i64,
}

impl Idempotency {
    /// The key for an append of `messages` with `reported_tokens`: the fingerprint is FNV-1a
    /// over what the append stores, stable across builds (a retry may reach a newer daemon).
    pub fn new(
        key: String,
        messages: &[NewMessage],
        reported_tokens: Option<usize>,
    ) -> Idempotency {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        let mut feed = |bytes: &[u8]| {
            for b in bytes {
                hash ^= u64::from(*b);
                hash = hash.wrapping_mul(0x0100_0000_01b3);
            }
        };
        for m in messages {
            feed(m.role.as_bytes());
            feed(&[0]);
            feed(m.parts_json.as_bytes());
            feed(&[0]);
        }
        feed(format!("{reported_tokens:?}").as_bytes());
        Idempotency {
            key,
            request_hash: hash as i64,
        }
    }
}

/// What an append did.
#[derive(Debug, Clone)]
pub struct AppendOutcome {
    pub session: SessionRow,
    pub first_seq: u64,
    pub last_seq: u64,
    /// Whether the session was created by this append.
    pub created: bool,
    /// The append was made before under the same Idempotency-Key: nothing new was stored.
    pub replayed: bool,
    /// The masking of old tool outputs this append made (see [`AppendRules::masking`]).
    pub masking: Option<MaskingRow>,
    /// Tokens of the system messages stored unpinned: they did not fit beside the smallest
    /// summary and tail (a proxied agent's system prompt too large for its window).
    pub unpinned_system_tokens: usize,
}

/// The outcome stored for `idempotency`'s key, if its append was made before.
fn earlier_append(
    conn: &Connection,
    session_id: &str,
    idempotency: &Idempotency,
) -> Result<Option<AppendOutcome>> {
    let found: Option<(i64, u64, u64)> = conn
        .prepare_cached(
            "SELECT request_hash, first_seq, last_seq FROM idempotency_keys WHERE session_id = ?1 AND key = ?2",
        )?
        .query_row(params![session_id, idempotency.key], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .optional()?;
    let Some((hash, first_seq, last_seq)) = found else {
        return Ok(None);
    };
    if hash != idempotency.request_hash {
        return Err(StoreError::IdempotencyMismatch(idempotency.key.clone()));
    }
    Ok(Some(AppendOutcome {
        session: get_live(conn, session_id)?,
        first_seq,
        last_seq,
        created: false,
        replayed: true,
        masking: None,
        unpinned_system_tokens: 0,
    }))
}

fn append_one(
    conn: &Connection,
    append: &Append,
    rules: &dyn Fn(&SessionRow) -> AppendRules,
) -> Result<AppendOutcome> {
    let session_id = append.session.as_str();
    let idempotency = append.idempotency.as_ref();
    if let Some(earlier) = idempotency
        .map(|i| earlier_append(conn, session_id, i))
        .transpose()?
        .flatten()
    {
        return Ok(earlier);
    }
    let (session, created) = match (get_live(conn, session_id), &append.create) {
        (Ok(session), _) => (session, false),
        (Err(StoreError::NotFound(_)), Some(new)) => (insert(conn, new)?, true),
        (Err(e), _) => return Err(e),
    };
    if session.owner.is_some() {
        // A conversation the proxy records belongs to the API key that made it: no message
        // through the socket API lands in it (over the loopback listener any local user
        // could have made it, and chosen its name).
        return Err(StoreError::Conflict(format!(
            "session `{session_id}` is a conversation the proxy records for an API key; it takes messages only through the proxy"
        )));
    }
    let rules = rules(&session);
    // A compaction landed while the agent's model call was out: its usage counts the context
    // before it, and would make the session look as full as then.
    let reported_tokens = append.reported_tokens.filter(|_| {
        append
            .reported_of
            .is_none_or(|num| num == session.compaction_count)
    });
    let mut outcome = append_to(conn, &session, &append.messages, reported_tokens, rules)?;
    outcome.created = created;
    if let Some(idempotency) = idempotency {
        remember_key(conn, idempotency, &outcome)?;
    }
    if let Some(start) = rules.masking {
        mask_if_due(conn, &mut outcome, start);
    }
    Ok(outcome)
}

/// Masks old tool outputs once the append has put the context past where masking starts
/// (and it saves a batch's worth): a masking that fails is logged and tried at a later
/// append, and never undoes the append (see [`super::maskings::mask`]).
fn mask_if_due(conn: &Connection, outcome: &mut AppendOutcome, start: MaskingStart) {
    let session = &outcome.session;
    let Some(min_saving) = start.saving_due(session.context_tokens().0, session.pinned_tokens)
    else {
        return;
    };
    match super::maskings::mask(conn, session, PRESERVE_RECENT_OUTPUTS, min_saving) {
        Ok(Some((row, after))) => {
            outcome.session = after;
            outcome.masking = Some(row);
        }
        Ok(None) => {}
        Err(e) => {
            tracing::warn!(session = %outcome.session.id, error = %e, "cannot mask old outputs")
        }
    }
}

/// Appends `messages` after the session's current head, by `rules`.
pub(super) fn append_to(
    conn: &Connection,
    session: &SessionRow,
    messages: &[NewMessage],
    reported_tokens: Option<usize>,
    rules: AppendRules,
) -> Result<AppendOutcome> {
    let tools = tools_of_results(conn, session, messages, rules.lenient)?;
    let first_seq = session.message_count + 1;
    let now = super::clock::now();
    let inserted = insert_messages(conn, session, messages, &tools, rules, &now)?;
    if !rules.lenient
        && inserted.pinned_tokens > session.pinned_tokens
        && inserted.pinned_tokens > rules.max_pinned_tokens
    {
        return Err(StoreError::PinnedTooLarge {
            pinned: inserted.pinned_tokens,
            max: rules.max_pinned_tokens,
        });
    }
    let mut after = count_appended(
        conn,
        session,
        messages.len(),
        reported_tokens,
        &inserted,
        now,
        rules.token_trigger,
    )?;
    let whole_under = rules.step_whole_under;
    if session.estimated_tokens() <= whole_under && after.estimated_tokens() > whole_under {
        after = super::shortened::shorten_step(conn, &after, rules.step_budget)?;
    }
    Ok(AppendOutcome {
        session: after,
        first_seq,
        last_seq: first_seq + messages.len() as u64 - 1,
        created: false,
        replayed: false,
        masking: None,
        unpinned_system_tokens: inserted.unpinned_system_tokens,
    })
}

/// Stores `message` as a child of `parent`, off the session's current branch: its counters
/// stay as they are (they describe another branch), only the message count grows.
pub(super) fn append_leaf(
    conn: &Connection,
    session: &SessionRow,
    parent: u64,
    message: &NewMessage,
) -> Result<()> {
    let tools = tools_of_results(conn, session, std::slice::from_ref(message), true)?;
    let off_branch = SessionRow {
        head_seq: parent,
        ..session.clone()
    };
    insert_messages(
        conn,
        &off_branch,
        std::slice::from_ref(message),
        &tools,
        AppendRules::AS_SENT,
        &super::clock::now(),
    )?;
    conn.prepare_cached(
        "UPDATE sessions SET message_count = message_count + 1, branch_points = branch_points + 1 WHERE id = ?1",
    )?
    .execute([session.id.as_str()])?;
    Ok(())
}

/// The tool of every call the batch's results answer, made earlier or earlier in this batch
/// (a masked result is named after it). A result that answers no call is refused, and so is
/// a second result for a call (its newest, when an agent reuses ids): every model API refuses
/// a conversation that answers a call twice, and each result after the agent's turn was shown
/// whole in its step (40 results of one call held a 16,000-token context at 41,800).
fn tools_of_results(
    conn: &Connection,
    session: &SessionRow,
    messages: &[NewMessage],
    lenient: bool,
) -> Result<HashMap<String, String>> {
    let session_id = session.id.as_str();
    let mut tools: HashMap<String, String> = HashMap::new();
    // Calls answered in this batch (a result answers the newest call of its id).
    let mut answered: HashSet<&str> = HashSet::new();
    let mut known = conn.prepare_cached(
        "SELECT name, seq FROM tool_calls WHERE session_id = ?1 AND call_id = ?2",
    )?;
    for message in messages {
        for call_id in &message.answers {
            if !lenient && !answered.insert(call_id) {
                return Err(answered_already(call_id, None));
            }
            // Made in this batch, or looked up for an earlier result (a proxied batch may
            // answer a call twice: the client's request is its own).
            if tools.contains_key(call_id) {
                continue;
            }
            let stored: Option<(String, u64)> = known
                .query_row(params![session_id, call_id], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()?;
            match stored {
                Some((name, seq)) => {
                    let from = seq.max(session.active_from_seq.saturating_sub(1));
                    if !lenient && let Some(at) = result_after(conn, session_id, call_id, from)? {
                        return Err(answered_already(call_id, Some(at)));
                    }
                    tools.insert(call_id.clone(), name);
                }
                // A proxied client's own history may answer calls compactd never saw
                // (the provider compacted them away): its request is its own to send.
                None if lenient => {}
                None => return Err(StoreError::UnknownCall(call_id.clone())),
            }
        }
        for (id, name) in &message.calls {
            answered.remove(id.as_str());
            tools.insert(id.clone(), name.clone());
        }
    }
    Ok(tools)
}

/// How many of the newest results a second result of a call is looked for among.
const RESULTS_LOOKED_THROUGH: u32 = 1_000;

/// The seq of a result of call `call_id` stored after seq `after`, if there is one among the
/// newest [`RESULTS_LOOKED_THROUGH`] results. Only active messages are looked at (a result
/// compacted away is in no context), so a late result to an old call reads a bounded few.
fn result_after(
    conn: &Connection,
    session_id: &str,
    call_id: &str,
    after: u64,
) -> Result<Option<u64>> {
    Ok(conn
        .prepare_cached(
            "SELECT m.seq FROM (
                 SELECT seq, parts FROM messages
                 WHERE session_id = ?1 AND seq > ?2 AND tool_results > 0
                 ORDER BY seq DESC LIMIT ?4
             ) m, json_each(m.parts) p
             WHERE p.value ->> '$.type' = 'tool_result' AND p.value ->> '$.call_id' = ?3
             LIMIT 1",
        )?
        .query_row(
            params![session_id, after, call_id, RESULTS_LOOKED_THROUGH],
            |r| r.get(0),
        )
        .optional()?)
}

fn answered_already(call_id: &str, at: Option<u64>) -> StoreError {
    let seq = at.map_or(String::from(" in this append"), |seq| {
        format!(" (seq {seq})")
    });
    StoreError::Conflict(format!(
        "call `{call_id}` has its result already{seq}: a call takes one result (retry an append with the same Idempotency-Key to make it once)"
    ))
}

/// What inserting a batch changed in the session's bookkeeping.
struct Inserted {
    /// The seq of the batch's last user instruction, which starts a new turn.
    turn_start: Option<u64>,
    task_seq: Option<u64>,
    pinned_tokens: usize,
    /// Tokens of the unpinned messages as the context shows them.
    unpinned_tokens: usize,
    /// Tokens of every message as the context shows them.
    shown_tokens: usize,
    /// Tool calls of the newest assistant message, once the batch is in.
    step_calls: usize,
    /// Tokens of the system messages left unpinned.
    unpinned_system_tokens: usize,
}

/// Inserts the batch's messages and their tool calls after the session's last seq, pinning
/// system messages and the task (when it is small enough), created at `now`.
fn insert_messages(
    conn: &Connection,
    session: &SessionRow,
    messages: &[NewMessage],
    tools: &HashMap<String, String>,
    rules: AppendRules,
    now: &str,
) -> Result<Inserted> {
    let mut insert_message = conn.prepare_cached(
        "INSERT INTO messages (session_id, seq, role, parts, tokens, created_at, pinned,
             tool_results, masked_parts, masked_tokens, shortened_parts, shortened_tokens,
             parent_seq, hash, media)
         VALUES (?1, ?2, ?3, ?4, ?5, ?14, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?15)",
    )?;
    let mut insert_call = conn.prepare_cached(
        "INSERT OR REPLACE INTO tool_calls (session_id, call_id, seq, name) VALUES (?1, ?2, ?3, ?4)",
    )?;
    let mut done = Inserted {
        turn_start: None,
        task_seq: session.task_seq,
        pinned_tokens: session.pinned_tokens,
        unpinned_tokens: 0,
        shown_tokens: 0,
        step_calls: session.step_calls,
        unpinned_system_tokens: 0,
    };
    let mut parent = (session.head_seq > 0).then_some(session.head_seq);
    let task = match session.task_seq {
        Some(_) => None,
        None => messages.iter().position(|m| is_task(session, m)),
    };
    let pins = pins(session, messages, task, &rules);
    // What the results after the newest assistant message take (see `step::message_budget`):
    // read when the batch's first result needs it, counted on from there. A proxied client's
    // results are its own, placed as its model API requires: each takes its share.
    let mut results_shown = rules.lenient.then_some(0);
    for ((seq, message), pinned) in (session.message_count + 1..).zip(messages).zip(pins) {
        if task.is_some_and(|t| seq == session.message_count + 1 + t as u64) {
            done.task_seq = Some(seq);
        }
        if message.role == Role::Assistant.as_str() {
            done.step_calls = message.calls.len();
            results_shown = Some(0);
        }
        let answers = !message.answers.is_empty();
        let room = StepRoom {
            budget: rules.step_budget,
            calls: done.step_calls,
            results_shown: match results_shown {
                Some(shown) => shown,
                None if answers => results_since_turn(
                    conn,
                    session,
                    StepRoom::shares(rules.step_budget, done.step_calls),
                )?,
                None => 0,
            },
        };
        let (budgeted_json, budgeted_tokens) = match pinned {
            true => (None, None),
            false => shortened_form(message, origin(session, seq), room)?,
        };
        // Whole while the context with it stays under the trigger (see `step_whole_under`);
        // charged to the step at its budget all the same, so the step's later results keep
        // their shares.
        let context_with_it = session.estimated_tokens() + done.shown_tokens + message.tokens;
        let (shortened_json, shortened_tokens) = match context_with_it <= rules.step_whole_under {
            true => (None, None),
            false => (budgeted_json, budgeted_tokens),
        };
        let shown = shortened_tokens.unwrap_or(message.tokens);
        if answers && !rules.lenient {
            results_shown = Some(room.results_shown + budgeted_tokens.unwrap_or(message.tokens));
        }
        if pinned {
            done.pinned_tokens += message.tokens;
        } else {
            done.unpinned_tokens += shown;
            if message.system {
                done.unpinned_system_tokens += message.tokens;
            }
        }
        done.shown_tokens += shown;
        let (masked_json, masked_tokens) = masked_form(message, origin(session, seq), tools)?;
        let media = match message.media.is_empty() {
            true => None,
            false => Some(serde_json::to_string(&message.media)?),
        };
        insert_message.execute(params![
            session.id.as_str(),
            seq,
            message.role,
            message.parts_json,
            message.tokens,
            pinned,
            message.answers.len(),
            masked_json,
            masked_tokens,
            shortened_json,
            shortened_tokens,
            parent,
            message.hash,
            now,
            media
        ])?;
        parent = Some(seq);
        for (call_id, name) in &message.calls {
            insert_call.execute(params![session.id.as_str(), call_id, seq, name])?;
        }
        if message.instruction {
            done.turn_start = Some(seq);
        }
    }
    Ok(done)
}

/// Whether `message` is the session's task (when it has none yet): a proxied
/// conversation's is the message its first call ended with, wherever the branch has it; a
/// session of the socket API's is its first instruction.
fn is_task(session: &SessionRow, message: &NewMessage) -> bool {
    match session.task_hash {
        Some(task) => message.opening == Some(task),
        None => message.instruction,
    }
}

/// Why a message would be pinned, in the order such messages claim room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Claim {
    System,
    Task,
    Preamble,
}

/// Which of the batch's messages are pinned: system messages, the client's preamble (but
/// never half a tool call: a pinned call whose result was compacted, or the reverse, would
/// break the conversation) and the task, message `task` of the batch, when small enough, with
/// the calls it answers ([`task_messages`]). Leniently (the proxy), system messages and the
/// preamble only while the pinned part stays within the rules' cap (what a client repeats must
/// not fill the context), and the task, which comes once, while it stays within the most
/// pinned messages may take, as on the socket API. Claimed in that order: system messages,
/// then the task, then the rest of the preamble, so an agent's long preamble (SWE-agent's
/// 4,800-token demonstration) never leaves the user's own request to the summary.
fn pins(
    session: &SessionRow,
    messages: &[NewMessage],
    task: Option<usize>,
    rules: &AppendRules,
) -> Vec<bool> {
    let task = task
        .and_then(|t| task_messages(messages, t))
        .filter(|range| {
            messages[range.clone()]
                .iter()
                .map(|m| m.tokens)
                .sum::<usize>()
                <= rules.task_max_tokens
        });
    let claim = |(i, message): (usize, &NewMessage)| {
        let seq = session.message_count + 1 + i as u64;
        let preamble =
            seq <= session.static_seq && message.calls.is_empty() && message.answers.is_empty();
        if message.system {
            Some(Claim::System)
        } else if task.as_ref().is_some_and(|range| range.contains(&i)) {
            Some(Claim::Task)
        } else if preamble {
            Some(Claim::Preamble)
        } else {
            None
        }
    };
    let claims: Vec<Option<Claim>> = messages.iter().enumerate().map(claim).collect();
    let mut pinned = vec![false; messages.len()];
    let mut pinned_tokens = session.pinned_tokens;
    for turn in [Claim::System, Claim::Task, Claim::Preamble] {
        // The agent's own instructions (system messages) and the person's task stay whole
        // while they fit beside the smallest summary and tail; what a client repeats after
        // them (few-shot examples, files shown) while it stays within the cap.
        let cap = match turn {
            Claim::System | Claim::Task => rules.pin_cap.max(rules.max_pinned_tokens),
            Claim::Preamble => rules.pin_cap,
        };
        // The task's messages are pinned together or not at all.
        let units: Vec<std::ops::Range<usize>> = match turn {
            Claim::Task => task.iter().cloned().collect(),
            Claim::System | Claim::Preamble => (0..messages.len())
                .filter(|&i| claims[i] == Some(turn))
                .map(|i| i..i + 1)
                .collect(),
        };
        for unit in units {
            let tokens: usize = messages[unit.clone()].iter().map(|m| m.tokens).sum();
            if !rules.lenient || pinned_tokens + tokens <= cap {
                pinned[unit].fill(true);
                pinned_tokens += tokens;
            }
        }
    }
    pinned
}

/// The messages message `t` of the batch, the task, is pinned as: itself; or, when it is an
/// instruction that answers tool calls too, with the message before it in the batch if it
/// answers that message's calls and no others (Claude Code's fork: the fork's directive
/// follows, in one user message, the result of its parent's `Agent` call). `None` otherwise:
/// results alone are no instruction, and a pinned result without its call would break the
/// conversation.
fn task_messages(messages: &[NewMessage], t: usize) -> Option<std::ops::Range<usize>> {
    let task = &messages[t];
    if task.answers.is_empty() {
        return Some(t..t + 1);
    }
    if !task.instruction {
        return None;
    }
    let calls = &messages[t.checked_sub(1)?].calls;
    let answers_them = answers_exactly(
        task.answers.iter().map(String::as_str),
        calls.iter().map(|(id, _)| id.as_str()),
    );
    answers_them.then_some(t - 1..t + 1)
}

/// The message as microcompaction would show it once its outputs are masked (JSON parts and
/// their tokens); `None` for messages without tool results.
fn masked_form(
    message: &NewMessage,
    at: Origin,
    tools: &HashMap<String, String>,
) -> Result<(Option<String>, Option<usize>)> {
    let Some(content) = &message.content else {
        return Ok((None, None));
    };
    let masked = masked_parts(&content.parts, at, |id| tools.get(id).map(String::as_str));
    encoded(masked, &content.parts, &message.media)
}

/// The message as the context shows it when it is too large for its share of the current
/// step's room (long outputs keep their head and tail); `None` when it is shown whole.
fn shortened_form(
    message: &NewMessage,
    at: Origin,
    room: StepRoom,
) -> Result<(Option<String>, Option<usize>)> {
    match &message.content {
        Some(content) => shortened(content, message.tokens, &message.media, at, room),
        None => Ok((None, None)),
    }
}

/// Adds the batch to the session's counters (messages, tokens, turn, task, usage, the
/// breaker's count) and returns the session as it now is. The counters are computed here from
/// `session`, the row as this write read it (the writer is the only one), and stored as they
/// are: an UPDATE that did the arithmetic and read the row back with RETURNING cost a quarter
/// of an append's SQL (SQLite fills a temporary table with RETURNING's rows).
fn count_appended(
    conn: &Connection,
    session: &SessionRow,
    count: usize,
    reported_tokens: Option<usize>,
    inserted: &Inserted,
    now: String,
    token_trigger: usize,
) -> Result<SessionRow> {
    let new_turn = inserted.turn_start.is_some();
    let mut after = SessionRow {
        message_count: session.message_count + count as u64,
        active_messages: session.active_messages + count,
        active_tokens: session.active_tokens + inserted.unpinned_tokens,
        pinned_tokens: inserted.pinned_tokens,
        task_seq: inserted.task_seq,
        // A report measures the context up to this append; estimates count from there.
        reported_tokens: reported_tokens.or(session.reported_tokens),
        tokens_since_report: match reported_tokens {
            Some(_) => inserted.shown_tokens,
            None => session.tokens_since_report + inserted.shown_tokens,
        },
        turn_start_seq: inserted.turn_start.unwrap_or(session.turn_start_seq),
        turn_attempts: if new_turn { 0 } else { session.turn_attempts },
        step_calls: inserted.step_calls,
        head_seq: session.message_count + count as u64,
        // Appended after a head that is not the newest message: the first starts a branch.
        branch_points: session.branch_points + u64::from(session.head_seq != session.message_count),
        updated_at: now,
        ..session.clone()
    };
    // A report's rate outlives the report (a compaction drops the report); one not believed
    // leaves the rate kept before.
    if reported_tokens.is_some() {
        after.token_rate = after.report_rate();
    }
    // The first report since a compaction (or a masking) dropped the last one: a context
    // under the trigger by the model server's own count closes the breaker.
    if session.reported_tokens.is_none()
        && reported_tokens.is_some()
        && after.context_tokens().0 < token_trigger
    {
        after.turn_attempts = 0;
    }
    conn.prepare_cached(
        "UPDATE sessions SET message_count = ?2, active_messages = ?3, active_tokens = ?4,
             pinned_tokens = ?5, task_seq = ?6, reported_tokens = ?7, tokens_since_report = ?8,
             turn_start_seq = ?9, turn_attempts = ?10, step_calls = ?11, head_seq = ?12,
             branch_points = ?13, updated_at = ?14, token_rate = ?15
         WHERE id = ?1",
    )?
    .execute(params![
        after.id.as_str(),
        after.message_count,
        after.active_messages,
        after.active_tokens,
        after.pinned_tokens,
        after.task_seq,
        after.reported_tokens,
        after.tokens_since_report,
        after.turn_start_seq,
        after.turn_attempts,
        after.step_calls,
        after.head_seq,
        after.branch_points,
        after.updated_at,
        after.token_rate
    ])?;
    Ok(after)
}

/// Records the request's idempotency key with the seqs it appended, so a retry is answered
/// from them.
fn remember_key(conn: &Connection, idempotency: &Idempotency, made: &AppendOutcome) -> Result<()> {
    conn.prepare_cached(
        "INSERT INTO idempotency_keys (session_id, key, request_hash, first_seq, last_seq, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?
    .execute(params![
        made.session.id.as_str(),
        idempotency.key,
        idempotency.request_hash,
        made.first_seq,
        made.last_seq,
        made.session.updated_at
    ])?;
    Ok(())
}

/// One append as the writer takes it: messages for a session, and what makes the session
/// when it does not exist yet.
#[derive(Debug)]
pub struct Append {
    pub session: SessionId,
    /// The session to make when there is none by that id (else the append is `NotFound`).
    pub create: Option<NewSession>,
    pub messages: Vec<NewMessage>,
    /// The agent's `usage.input_tokens` for its last model call.
    pub reported_tokens: Option<usize>,
    /// The `compaction_num` of the context that call was sent with, when the client says
    /// (`usage.compaction_num`): a report of a context compacted since is not counted.
    pub reported_of: Option<u32>,
    /// A retried append with the same key is answered with the first one's outcome.
    pub idempotency: Option<Idempotency>,
}

impl Store {
    /// Appends the messages, making the session first if it does not exist; `rules` say,
    /// for the session as stored, how much a message may take.
    pub async fn append(
        &self,
        append: Append,
        rules: impl Fn(&SessionRow) -> AppendRules + Send + 'static,
    ) -> Result<AppendOutcome> {
        self.write(move |conn| append_one(conn, &append, &rules))
            .await
    }
}
