//! The current step: what the agent needs next, kept in every context.
//!
//! The spec's preserve boundary spends a token budget from the newest message back; an output
//! larger than that budget would fall into the summarized part, and the agent would be handed
//! a context without the result of the command it just ran (it would run it again, or guess).
//! So the current step, the newest assistant message with every result and user message
//! after it, is a floor under the boundary: always in the tail, never summarized, never
//! masked.
//!
//! When the step is too large to fit (a 50,000-token `cat` at a 16,000-token window), its
//! messages are *shortened in the context only*: each large output (and a user message's text)
//! keeps its head and its tail, with a marker between that says how much was cut and which
//! seq holds the whole message. The stored message stays whole. Each message of the step gets
//! its share of the step budget ([`CompactionConfig::step_budget`](super::CompactionConfig::step_budget)),
//! so the whole step fits it. A tool call is shortened only when its message cannot fit
//! otherwise (a file of 20,000 tokens written at a 16,000-token window): the longest string
//! among its arguments keeps its head and tail, the call its id, its name and valid JSON.

use super::estimate::{LazyEstimator, byte_at_count, counted_chars, part_chars};
use super::origin::Origin;
use super::prompt::render_args;
use crate::message::{Message, Part, Role};
use serde_json::Value;

/// Where the current step starts in `messages`: at the newest assistant message (the agent's
/// last turn: the results answering it and a user message after them belong to the step),
/// or, with no assistant message, at the newest user message. `messages.len()` when there is
/// neither.
///
/// A person who wrote more than once since the agent's last turn (a chat client whose model
/// did not answer, a plugin that logs what its user types, notes arriving one by one) has
/// moved on: the step is their newest message. Counted from the agent's turn, every later
/// message was a floor under the boundary, and a context at a 16,000-token window held 60
/// of them, 55,000 tokens, compaction or not. The older ones are compacted like any
/// message (a summary keeps every instruction: see [`super::kept_instructions`]).
pub fn current_step_start(messages: &[Message]) -> usize {
    let written = |m: &Message| m.role == Role::User && m.tool_result_ids().next().is_none();
    let newest_written = || messages.iter().rposition(written);
    let Some(turn) = messages.iter().rposition(|m| m.role == Role::Assistant) else {
        return newest_written()
            .or_else(|| messages.iter().rposition(|m| m.role == Role::User))
            .unwrap_or(messages.len());
    };
    match messages[turn + 1..].iter().filter(|m| written(m)).count() {
        0 | 1 => turn,
        _ => newest_written().unwrap_or(turn),
    }
}

/// What the current step has to share among its messages: its budget
/// ([`CompactionConfig::step_budget`](super::CompactionConfig::step_budget)), the calls of the
/// agent's turn, and the tokens the results after the turn already take as the context shows
/// them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepRoom {
    pub budget: usize,
    pub calls: usize,
    pub results_shown: usize,
}

impl StepRoom {
    /// A step whose results after the turn are not counted: each result takes its share.
    pub fn shares(budget: usize, calls: usize) -> StepRoom {
        StepRoom {
            budget,
            calls,
            results_shown: 0,
        }
    }

    /// The share of the budget a message of `results` tool results takes among the turn's
    /// calls: parallel results split it, a message answering them all takes all of it.
    pub fn result_share(&self, results: usize) -> usize {
        self.budget.saturating_mul(results) / results.max(self.calls)
    }
}

/// How many tokens `message` may take in the context, or `None` if it is never shortened. A
/// message with tool results takes the share of the step's budget its results have among the
/// turn's calls (parallel results split the budget), and never more than the budget leaves
/// after the results already shown since the turn: results answering calls of an *earlier*
/// turn (a client appending them late, or out of order) are no part of the turn's shares, and
/// twelve of them each took the whole budget (a 16,000-token context held 38,500). Results
/// of the turn's own calls, one each, never meet that cap: their shares add up to the budget.
/// A user message or an assistant's answer may take the whole budget (most of the usable
/// context: only an answer of megabytes, which a model server can send, is ever shortened);
/// a system message is shown as it is. The floor of a step so bounded fits the
/// usable context.
pub fn message_budget(message: &Message, room: StepRoom) -> Option<usize> {
    let results = message.tool_result_ids().count();
    match message.role {
        _ if results > 0 => Some(
            room.result_share(results)
                .min(room.budget.saturating_sub(room.results_shown)),
        ),
        Role::User | Role::Assistant => Some(room.budget),
        _ => None,
    }
}

/// What stands where a shortened text was cut.
pub fn cut_marker(cut_chars: usize, total_chars: usize, at: Origin) -> String {
    format!(
        "\n[… {} of {} characters cut here; the whole message is {at} …]\n",
        super::microcompact::thousands(cut_chars),
        super::microcompact::thousands(total_chars)
    )
}

/// `text` cut to its first and last characters, `keep` in all (counted as the estimate
/// counts them: [`counted_chars`]), with the marker between; `None` when it has no more than
/// `keep`. A cut falls on a line break when one is near, so the head and the tail read as
/// whole lines.
pub fn head_and_tail(text: &str, keep: usize, at: Origin) -> Option<String> {
    let total = counted_chars(text);
    if total <= keep {
        return None;
    }
    let head_chars = keep.div_ceil(2);
    let tail_chars = keep - head_chars;
    let head_end = byte_at_count(text, head_chars);
    let tail_start = byte_at_count(text, total - tail_chars);
    // Snap to a line break within the last fifth of the head or the first fifth of the tail.
    let head_end = text[..head_end]
        .rfind('\n')
        .filter(|&nl| counted_chars(&text[nl..head_end]) <= head_chars / 5)
        .map_or(head_end, |nl| nl + 1);
    let tail_start = text[tail_start..]
        .find('\n')
        .filter(|&nl| counted_chars(&text[tail_start..tail_start + nl]) <= tail_chars / 5)
        .map_or(tail_start, |nl| tail_start + nl + 1);
    let (head, tail) = (&text[..head_end], &text[tail_start..]);
    // The marker tells a person characters as they are.
    let all = text.chars().count();
    let cut = all - head.chars().count() - tail.chars().count();
    Some(format!("{head}{}{tail}", cut_marker(cut, all, at)))
}

/// The parts of message `at` (of `tokens` estimated tokens) as the context shows it in a step
/// with `room`: shortened when it takes more than its budget ([`message_budget`]), `None`
/// when it is shown whole. `kept_media` are the tokens of its media that every form of it
/// keeps (a pasted screenshot beside a long text, see [`super::media::Media`]): its text
/// makes room for them.
pub fn shown_in_step(
    message: &Message,
    tokens: usize,
    kept_media: usize,
    at: Origin,
    room: StepRoom,
) -> Option<Vec<Part>> {
    message_budget(message, room)
        .filter(|&budget| tokens > budget)
        .and_then(|budget| {
            let estimator = LazyEstimator::default();
            shorten_message(message, at, budget.saturating_sub(kept_media), &estimator)
        })
}

/// The parts of message `seq` shortened so the message takes at most `max_tokens`, or `None`
/// when it fits already. What is shortened: tool outputs and text (a user's instruction, or
/// an answer so long that it alone would not fit: a model server can send megabytes); a tool
/// call's longest argument only if the message does not fit without it (a call of the step
/// alone over the window would put every context over it until the next step); reasoning is
/// kept as it is. The room left is shared fairly: outputs smaller than an even share stay
/// whole and leave the rest to the larger ones.
pub fn shorten_message(
    message: &Message,
    at: Origin,
    max_tokens: usize,
    estimator: &LazyEstimator,
) -> Option<Vec<Part>> {
    if estimator.message(message) <= max_tokens {
        return None;
    }
    let (outputs, fits) = shorten_parts(message, at, max_tokens, estimator, false);
    let has_call = message
        .parts
        .iter()
        .any(|p| matches!(p, Part::ToolCall { .. }));
    if fits || !has_call {
        return Some(outputs);
    }
    Some(shorten_parts(message, at, max_tokens, estimator, true).0)
}

/// The message's parts shortened toward `max_tokens` (outputs and text; with `arguments`,
/// each tool call's longest argument too), as far as they go, and whether they fit it.
fn shorten_parts(
    message: &Message,
    at: Origin,
    max_tokens: usize,
    estimator: &LazyEstimator,
    arguments: bool,
) -> (Vec<Part>, bool) {
    // Each call's longest argument, found (and measured) once for every try below.
    let longest: Vec<Option<LongestArgument>> = message
        .parts
        .iter()
        .map(|p| match p {
            Part::ToolCall { args, .. } if arguments => longest_argument(args),
            _ => None,
        })
        .collect();
    let sizes: Vec<Option<usize>> = message
        .parts
        .iter()
        .zip(&longest)
        .map(|(p, longest)| match p {
            Part::ToolResult { .. } | Part::Text { .. } => Some(counted_chars(part_text(p))),
            _ => longest.as_ref().map(|a| a.shown),
        })
        .collect();
    // What stays of each part besides its shortenable text (a call's name and other arguments).
    let fixed_chars: usize = message
        .parts
        .iter()
        .zip(&sizes)
        .map(|(p, size)| part_chars(p).saturating_sub(size.unwrap_or(0)))
        .sum();
    let max_chars = (max_tokens as f64 / estimator.tokens_per_char) as usize;
    // The markers' own length comes out of the room; shrink until the estimate fits.
    let mut room = max_chars.saturating_sub(fixed_chars);
    loop {
        let shares = fair_shares(&sizes, room.saturating_sub(marker_room(&sizes)));
        let parts = apply_shares(&message.parts, &sizes, &longest, &shares, at);
        let shortened = Message {
            role: message.role,
            parts,
        };
        let fits = estimator.message(&shortened) <= max_tokens;
        if fits || room == 0 {
            return (shortened.parts, fits);
        }
        room = room.saturating_sub(room / 10 + 1);
    }
}

/// The longest string in a call's arguments, with its JSON pointer (`""` when the arguments
/// are that string).
fn longest_string(args: &Value) -> Option<(String, &str)> {
    let inner: Vec<(String, &str)> = match args {
        Value::String(text) => return Some((String::new(), text)),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .filter_map(|(i, v)| longest_string(v).map(|(p, s)| (format!("/{i}{p}"), s)))
            .collect(),
        Value::Object(fields) => fields
            .iter()
            .filter_map(|(key, v)| {
                let key = key.replace('~', "~0").replace('/', "~1");
                longest_string(v).map(|(p, s)| (format!("/{key}{p}"), s))
            })
            .collect(),
        _ => return None,
    };
    inner.into_iter().max_by_key(|(_, s)| s.len())
}

/// A call's longest argument: where it is, and its characters as they are and as the
/// context shows them (escaped, when it lies inside a nested value), counted as the estimate
/// counts them ([`counted_chars`]).
struct LongestArgument {
    pointer: String,
    chars: usize,
    shown: usize,
}

fn longest_argument(args: &Value) -> Option<LongestArgument> {
    let (pointer, text) = longest_string(args)?;
    let chars = counted_chars(text);
    let mut without = args.clone();
    *without.pointer_mut(&pointer)? = Value::String(String::new());
    let shown =
        counted_chars(&render_args(args)).saturating_sub(counted_chars(&render_args(&without)));
    Some(LongestArgument {
        pointer,
        chars,
        shown,
    })
}

/// `args` with its `longest` string shown in about `share` characters, head and tail (see
/// [`head_and_tail`]).
fn shortened_args(args: &Value, longest: &LongestArgument, share: usize, at: Origin) -> Value {
    let mut args = args.clone();
    let keep = share * longest.chars / longest.shown.max(1);
    let short = args
        .pointer(&longest.pointer)
        .and_then(Value::as_str)
        .and_then(|text| head_and_tail(text, keep, at));
    if let Some(short) = short
        && let Some(slot) = args.pointer_mut(&longest.pointer)
    {
        *slot = Value::String(short);
    }
    args
}

/// Characters each shortened part's marker may take, at most (its numbers included).
const MARKER_CHARS: usize = 96;

fn marker_room(sizes: &[Option<usize>]) -> usize {
    sizes.iter().flatten().count() * MARKER_CHARS
}

/// How many characters each shortenable part keeps of `room`: parts under an even share keep
/// all of theirs, the rest split what is left evenly.
fn fair_shares(sizes: &[Option<usize>], room: usize) -> Vec<usize> {
    let mut order: Vec<(usize, usize)> = sizes
        .iter()
        .enumerate()
        .filter_map(|(i, s)| s.map(|s| (i, s)))
        .collect();
    order.sort_by_key(|&(_, size)| size);
    let mut shares = vec![0; sizes.len()];
    let mut left = room;
    let mut remaining = order.len();
    for (i, size) in order {
        let even = left / remaining.max(1);
        shares[i] = size.min(even);
        left -= shares[i];
        remaining -= 1;
    }
    shares
}

fn apply_shares(
    parts: &[Part],
    sizes: &[Option<usize>],
    longest: &[Option<LongestArgument>],
    shares: &[usize],
    at: Origin,
) -> Vec<Part> {
    parts
        .iter()
        .zip(sizes.iter().zip(longest.iter().zip(shares)))
        .map(|(part, (size, (longest, &share)))| {
            if size.is_none() {
                return part.clone();
            }
            match part {
                Part::ToolResult {
                    call_id,
                    name,
                    output,
                    is_error,
                } => Part::ToolResult {
                    call_id: call_id.clone(),
                    name: name.clone(),
                    output: head_and_tail(output, share, at).unwrap_or_else(|| output.clone()),
                    is_error: *is_error,
                },
                Part::Text { text } => Part::Text {
                    text: head_and_tail(text, share, at).unwrap_or_else(|| text.clone()),
                },
                Part::ToolCall { id, name, args } => Part::ToolCall {
                    id: id.clone(),
                    name: name.clone(),
                    args: match longest {
                        Some(longest) => shortened_args(args, longest, share, at),
                        None => args.clone(),
                    },
                },
                other => other.clone(),
            }
        })
        .collect()
}

fn part_text(part: &Part) -> &str {
    match part {
        Part::Text { text } | Part::Reasoning { text } => text,
        Part::ToolResult { output, .. } => output,
        Part::ToolCall { .. } => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seq: u64) -> Origin<'static> {
        Origin { session: "", seq }
    }
    use serde_json::json;

    fn call(id: &str) -> Message {
        Message {
            role: Role::Assistant,
            parts: vec![Part::ToolCall {
                id: id.into(),
                name: "bash".into(),
                args: json!({"command": "cat big.log"}),
            }],
        }
    }

    fn result(id: &str, output: String) -> Message {
        Message {
            role: Role::Tool,
            parts: vec![Part::ToolResult {
                call_id: id.into(),
                name: None,
                output,
                is_error: false,
            }],
        }
    }

    #[test]
    fn the_step_starts_at_the_newest_assistant_message() {
        let m = vec![
            Message::text(Role::User, "go"),
            call("a"),
            result("a", "x".into()),
            call("b"),
            result("b", "y".into()),
            Message::text(Role::User, "and then?"),
        ];
        assert_eq!(current_step_start(&m), 3);
        assert_eq!(current_step_start(&m[..1]), 0);
        assert_eq!(current_step_start(&[]), 0);
        assert_eq!(
            current_step_start(&[Message::text(Role::System, "s")]),
            1,
            "nothing the agent said or was asked"
        );
    }

    /// A person who writes on after the agent's turn has moved on: the step is their newest
    /// message, and the results before it are no floor (their calls go with them).
    #[test]
    fn a_person_writing_more_than_once_since_the_agents_turn_starts_the_step() {
        let mut m = vec![
            Message::text(Role::User, "go"),
            call("a"),
            result("a", "x".into()),
            Message::text(Role::User, "and then?"),
        ];
        assert_eq!(current_step_start(&m), 1, "one message after the results");
        m.push(Message::text(Role::User, "also this"));
        assert_eq!(current_step_start(&m), 4);
        m.extend((0..60).map(|i| Message::text(Role::User, format!("change {i}"))));
        assert_eq!(current_step_start(&m), m.len() - 1);
        // A result of the turn that comes after them still finds its call (the boundary pulls
        // the call in: see `boundary`).
        m.push(result("a", "late".into()));
        assert_eq!(current_step_start(&m), m.len() - 2);
    }

    #[test]
    fn a_long_text_keeps_its_head_and_tail_and_says_what_was_cut() {
        let text: String = (0..1000).map(|i| format!("line {i}\n")).collect();
        let total = text.chars().count();
        let short = head_and_tail(&text, 400, at(17)).unwrap();
        assert!(short.starts_with("line 0\nline 1\n"), "{short}");
        assert!(short.ends_with("line 998\nline 999\n"), "{short}");
        assert!(short.contains("the whole message is seq 17"), "{short}");
        let kept = short.lines().filter(|l| l.starts_with("line ")).count();
        let cut: usize = text.lines().count() - kept;
        assert!(cut > 900, "{cut}");
        assert!(short.contains(&format!(
            "of {} characters cut here",
            super::super::microcompact::thousands(total)
        )));
        assert_eq!(head_and_tail("short", 10, at(1)), None);
    }

    #[test]
    fn multibyte_text_is_cut_on_character_boundaries() {
        let text = "日本語🦀é".repeat(500);
        for keep in [0, 1, 7, 100, 2499] {
            let short = head_and_tail(&text, keep, at(3)).unwrap();
            assert!(short.contains("the whole message is seq 3"));
        }
    }

    #[test]
    fn a_message_is_shortened_to_its_budget_sharing_it_fairly() {
        let e = LazyEstimator::default();
        let m = Message {
            role: Role::User,
            parts: vec![
                Part::ToolResult {
                    call_id: "a".into(),
                    name: None,
                    output: "a".repeat(40_000),
                    is_error: false,
                },
                Part::ToolResult {
                    call_id: "b".into(),
                    name: None,
                    output: "small".into(),
                    is_error: false,
                },
            ],
        };
        let parts = shorten_message(&m, at(9), 1_000, &e).unwrap();
        let shortened = Message {
            role: Role::User,
            parts,
        };
        assert!(e.message(&shortened) <= 1_000);
        assert!(e.message(&shortened) > 900, "uses its room");
        let Part::ToolResult { output, .. } = &shortened.parts[1] else {
            panic!()
        };
        assert_eq!(output, "small", "the small output stays whole");
        assert_eq!(shorten_message(&m, at(9), 20_000, &e), None);
    }

    /// A message's media (a pasted screenshot) count in its tokens but are never cut: its
    /// text makes room for them, so the message shown stays within its budget as the model
    /// counts it (the text alone cut to the budget put a 16,000-token context at 17,420).
    #[test]
    fn a_messages_text_makes_room_for_its_media() {
        let e = LazyEstimator::default();
        let text = Message::text(Role::User, "a pasted log line\n".repeat(2_000));
        let media = 1_500;
        let tokens = e.message(&text) + media;
        let parts = shown_in_step(&text, tokens, media, at(4), StepRoom::shares(3_000, 0))
            .expect("over its budget");
        let shown = Message {
            role: Role::User,
            parts,
        };
        assert!(e.message(&shown) + media <= 3_000, "{}", e.message(&shown));
        assert!(e.message(&shown) + media > 2_500, "and uses its room");
    }

    #[test]
    fn parallel_results_share_the_step_budget() {
        let one = result("a", "x".into());
        let shares = |calls| StepRoom::shares(3_000, calls);
        assert_eq!(message_budget(&one, shares(3)), Some(1_000));
        assert_eq!(
            message_budget(&one, shares(0)),
            Some(3_000),
            "after a turn without calls"
        );
        assert_eq!(
            message_budget(&Message::text(Role::User, "u"), shares(3)),
            Some(3_000)
        );
        assert_eq!(
            message_budget(&call("a"), shares(1)),
            Some(3_000),
            "an answer may take the step's room"
        );
        assert_eq!(
            message_budget(&Message::text(Role::System, "s"), shares(1)),
            None
        );
    }

    /// Results after the turn never take more than the step's budget together: a result
    /// answering an earlier turn's call gets what the results before it left, and nothing
    /// once they took it all (its marker still names the seq that holds it whole).
    #[test]
    fn results_after_the_turn_share_what_the_step_has_left() {
        let one = result("a", "x".into());
        let shown = |results_shown| StepRoom {
            budget: 3_000,
            calls: 1,
            results_shown,
        };
        assert_eq!(message_budget(&one, shown(0)), Some(3_000));
        assert_eq!(message_budget(&one, shown(2_000)), Some(1_000));
        assert_eq!(message_budget(&one, shown(3_500)), Some(0));
        let room = StepRoom {
            budget: 3_000,
            calls: 3,
            results_shown: 1_000,
        };
        assert_eq!(
            message_budget(&one, room),
            Some(1_000),
            "the turn's own results keep their shares"
        );
        assert_eq!(
            message_budget(&Message::text(Role::User, "u"), shown(3_000)),
            Some(3_000),
            "a user message keeps its room"
        );
        let e = LazyEstimator::default();
        let late = result("a", "log line\n".repeat(2_000));
        let parts = shown_in_step(&late, e.message(&late), 0, at(12), shown(3_000)).unwrap();
        let Part::ToolResult { output, .. } = &parts[0] else {
            panic!()
        };
        assert!(output.contains("the whole message is seq 12"), "{output}");
        assert!(output.len() < 200, "{output}");
    }

    #[test]
    fn an_answer_of_megabytes_is_shortened_but_its_calls_are_kept() {
        let e = LazyEstimator::default();
        let m = Message {
            role: Role::Assistant,
            parts: vec![
                Part::Text {
                    text: format!("{}{}", "head ".repeat(2_000), "tail ".repeat(2_000)),
                },
                call("a").parts[0].clone(),
            ],
        };
        let parts = shorten_message(&m, at(1), 300, &e).unwrap();
        let Part::Text { text } = &parts[0] else {
            panic!()
        };
        assert!(text.starts_with("head ") && text.ends_with("tail "));
        assert!(text.contains("seq 1"), "the marker names the seq: {text}");
        assert!(text.len() < 2_000);
        assert_eq!(
            parts[1], m.parts[1],
            "a call is kept whole when the text makes room"
        );
    }

    /// A call alone larger than its room (a file written whole at a small window) keeps its
    /// id, its name and its other arguments; its longest argument keeps its head and tail.
    #[test]
    fn a_call_alone_over_its_room_has_its_longest_argument_shortened() {
        let e = LazyEstimator::default();
        let content: String = (0..4_000).map(|i| format!("line {i}\n")).collect();
        let args = json!({"file_path": "src/big.rs", "edits": [{"old": "a", "new": content}]});
        let m = Message {
            role: Role::Assistant,
            parts: vec![
                Part::Text {
                    text: "Writing it.".into(),
                },
                Part::ToolCall {
                    id: "w1".into(),
                    name: "Write".into(),
                    args: args.clone(),
                },
            ],
        };
        assert!(e.message(&m) > 10_000);
        let parts = shorten_message(&m, at(7), 2_000, &e).unwrap();
        let shortened = Message {
            role: Role::Assistant,
            parts: parts.clone(),
        };
        assert!(e.message(&shortened) <= 2_000, "{}", e.message(&shortened));
        assert!(e.message(&shortened) > 1_500, "uses its room");
        assert_eq!(parts[0], m.parts[0], "the small text stays whole");
        let Part::ToolCall {
            id,
            name,
            args: cut,
        } = &parts[1]
        else {
            panic!()
        };
        assert_eq!((id.as_str(), name.as_str()), ("w1", "Write"));
        assert_eq!(cut["file_path"], "src/big.rs");
        assert_eq!(cut["edits"][0]["old"], "a");
        let new = cut["edits"][0]["new"].as_str().unwrap();
        assert!(
            new.starts_with("line 0\n") && new.ends_with("line 3999\n"),
            "{new}"
        );
        assert!(new.contains("the whole message is seq 7"), "{new}");
        // Arguments that are one string stay one string.
        let m = Message {
            role: Role::Assistant,
            parts: vec![Part::ToolCall {
                id: "r".into(),
                name: "raw".into(),
                args: Value::String("x".repeat(40_000)),
            }],
        };
        let parts = shorten_message(&m, at(8), 1_000, &e).unwrap();
        let Part::ToolCall { args, .. } = &parts[0] else {
            panic!()
        };
        assert!(args.as_str().unwrap().contains("seq 8"));
        assert!(
            e.message(&Message {
                role: Role::Assistant,
                parts
            }) <= 1_000
        );
    }
}
