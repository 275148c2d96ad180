//! Sessions for the proxy: a client that sends its whole conversation with every call (as
//! every agent on the OpenAI and Anthropic SDKs does) is placed in its conversation's tree
//! of messages ([`crate::store::ProxyCall`]), what it has not sent before is appended, and what
//! goes upstream is the context of its branch.
//!
//! A session the proxy makes belongs to the API key that made it (a hash of it: the key is
//! never stored). A call with another key can neither continue nor read it; a session made
//! through the socket API is never continued by the proxy, and a session a key owns takes no
//! socket appends. Over the loopback listener (any local user) a named session lives in the
//! key's own namespace.

use super::fingerprint::{fingerprint, opening, text_hash};
use super::{Service, ServiceError, views};
use crate::protocol::{ContextView, SessionId};
use crate::provider::wire::{WireReply, WireRequest};
use crate::store::{
    AppendRules, Branch, ContextSnapshot, ContextVersion, Fingerprints, NewMessage, NewSession,
    ProxyCall, StoreError,
};
use compactd_core::SessionKind;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::sync::Arc;

/// Who is calling the proxy.
#[derive(Debug, Clone)]
pub struct Caller {
    /// SHA-256 of the client's credential, hex.
    pub owner: String,
    /// Over the Unix socket (this user) rather than a network listener.
    pub local: bool,
}

impl Caller {
    pub fn new(credential: &str, local: bool) -> Caller {
        Caller {
            owner: hex::encode(Sha256::digest(credential.as_bytes())),
            local,
        }
    }

    /// The id a name the client chose (`x-compactd-session`) stands for: the name itself over
    /// the socket (this user's own), in the key's namespace over the loopback listener, so no
    /// other local user can name, and squat, a session of someone else's.
    pub fn session_named(&self, name: &SessionId) -> Result<SessionId, ServiceError> {
        if self.local {
            return Ok(name.clone());
        }
        SessionId::parse(format!("{}.{name}", &self.owner[..12])).map_err(|_| {
            ServiceError::BadRequest(format!(
                "x-compactd-session `{name}` is too long: over the loopback listener it lives in the key's namespace and may have at most {} characters",
                SessionId::MAX_LEN - 13
            ))
        })
    }
}

/// How a call names its conversation.
#[derive(Debug, Clone, Default)]
pub struct Identity {
    /// `x-compactd-session`.
    pub named: Option<SessionId>,
    /// A conversation header the client sends (`X-Claude-Code-Session-Id`, Codex's
    /// `session-id`, opencode's `x-session-id`): its value.
    pub conversation: Option<String>,
    /// The sub-agent a call under a conversation header names (Claude Code's
    /// `x-claude-code-agent-id`, Codex's `thread-id` of another thread): a conversation of its
    /// own.
    pub agent: Option<String>,
    /// `x-compactd-context-limit`.
    pub context_limit: Option<usize>,
}

/// A call's context, previewed.
#[derive(Debug)]
pub struct Preview {
    pub turn: ProxyTurn,
    /// How many of the call's messages the context already stands for.
    pub matched: usize,
}

/// What the proxy sends upstream for one call.
#[derive(Debug)]
pub struct ProxyTurn {
    pub id: SessionId,
    pub context: ContextView,
    /// The call's branch: where each message of the context stands in the call's own list.
    pub branch: Branch,
    pub kind: SessionKind,
    /// The seq of the call's last message: its answer is recorded after it.
    pub last_seq: u64,
    /// The context sent: the answer's usage counts only while the session still serves it.
    pub sent: ContextVersion,
}

impl ProxyTurn {
    /// The turn a previewed `snapshot` makes (nothing stored: its answer is not recorded);
    /// its summary names the session for recall when the session is `stored`.
    pub(super) fn previewed(snapshot: ContextSnapshot, stored: bool) -> ProxyTurn {
        ProxyTurn {
            id: snapshot.session.id.clone(),
            branch: snapshot.branch.clone(),
            sent: snapshot.session.context_version(),
            kind: snapshot.session.kind,
            last_seq: snapshot.session.head_seq,
            context: views::context_view_recalling(snapshot, stored),
        }
    }
}

impl Service {
    /// Places a client's whole conversation in its session's tree, appends what the session
    /// has not seen, and returns the context of its branch to send upstream (after any
    /// compaction that append made due).
    pub async fn proxy_turn(
        self: &Arc<Self>,
        caller: &Caller,
        identity: Identity,
        request: &WireRequest,
    ) -> Result<ProxyTurn, ServiceError> {
        if request.messages.is_empty() {
            return Err(ServiceError::BadRequest("no messages".into()));
        }
        let call = self.proxy_call(caller, &identity, request)?;
        self.unless_locked_elsewhere()?;
        let placed = self.store.place_call(call, self.proxy_rules()).await?;
        if placed.created && !caller.local {
            self.session_rate
                .made(&caller.owner, std::time::Instant::now());
        }
        let id = placed.session.id.clone();
        if placed.unpinned_system_tokens > 0 {
            self.unpinned_system_prompt(&id, placed.unpinned_system_tokens);
        }
        if placed.matched < request.messages.len() {
            self.after_append(&placed.session, false).await;
        }
        let head = placed.session.head_seq;
        let snapshot = self.context_snapshot(&id, true, Some(head)).await?;
        Ok(ProxyTurn {
            id,
            branch: snapshot.branch.clone(),
            sent: snapshot.session.context_version(),
            context: views::context_view(snapshot),
            kind: placed.session.kind,
            last_seq: head,
        })
    }

    /// The context a call would be sent with, without storing anything (for counting its
    /// tokens): `None` when the call does not extend its conversation's current branch.
    pub async fn proxy_preview(
        self: &Arc<Self>,
        caller: &Caller,
        identity: Identity,
        request: &WireRequest,
    ) -> Result<Option<Preview>, ServiceError> {
        if request.messages.is_empty() {
            return Ok(None);
        }
        let call = self.proxy_call(caller, &identity, request)?;
        let previewed = self.previewed(call).await?;
        Ok(previewed.map(|(snapshot, matched)| Preview {
            turn: ProxyTurn::previewed(snapshot, true),
            matched,
        }))
    }

    /// The stored context of the branch `call` extends, read, and how many of the call's
    /// messages it stands for: `None` when the call does not extend its conversation's
    /// current branch.
    pub(super) async fn previewed(
        self: &Arc<Self>,
        call: ProxyCall,
    ) -> Result<Option<(ContextSnapshot, usize)>, ServiceError> {
        let Some((session, matched)) = self.store.preview_call(call).await? else {
            return Ok(None);
        };
        let snapshot = self
            .context_snapshot(&session.id, false, Some(session.head_seq))
            .await?;
        Ok(Some((snapshot, matched)))
    }

    /// [`StoreError::Busy`] at once while another process holds the database's write lock
    /// (see `store::outside_lock`): a proxied write would wait for it and fail, and the call
    /// goes on unrecorded either way, so it does not wait.
    fn unless_locked_elsewhere(&self) -> Result<(), ServiceError> {
        match self.store.write_lock_held_elsewhere() {
            true => Err(ServiceError::Store(StoreError::Busy)),
            false => Ok(()),
        }
    }

    /// Records the model's answer to a proxied call (after the message it answered, the last
    /// of the call) and what the call really cost (when the call was `sent` with the context
    /// the session still serves).
    pub async fn proxy_reply(
        self: &Arc<Self>,
        id: &SessionId,
        after_seq: u64,
        sent: ContextVersion,
        reply: WireReply,
    ) -> Result<(), ServiceError> {
        let WireReply {
            message: reply,
            context_tokens,
            unrecorded_chars,
        } = reply;
        reply
            .validate()
            .map_err(|error| ServiceError::InvalidMessage { index: 0, error })?;
        self.unless_locked_elsewhere()?;
        // What was not recorded of a huge answer still counts: the client sends it back whole.
        let tokens =
            self.estimator.message(&reply) + self.estimator.left_out(&reply, unrecorded_chars);
        let bound = self.settings().config.proxy.max_recorded_bytes;
        let message =
            NewMessage::new(&reply, tokens).with_hash(fingerprint(&reply, bound), opening(&reply));
        let session = self
            .store
            .append_reply(
                id,
                after_seq,
                message,
                context_tokens,
                sent,
                self.proxy_rules(),
            )
            .await?;
        if let Some(session) = session {
            self.doubt_report(&session);
            self.after_append(&session, false).await;
        }
        Ok(())
    }

    /// The store's view of a call: who, which conversation, its messages fingerprinted, and
    /// the session it would start.
    pub(super) fn proxy_call(
        &self,
        caller: &Caller,
        identity: &Identity,
        request: &WireRequest,
    ) -> Result<ProxyCall, ServiceError> {
        let settings = self.settings();
        let bound = settings.config.proxy.max_recorded_bytes;
        let mut fingerprints = Vec::with_capacity(request.messages.len());
        for (index, message) in request.messages.iter().enumerate() {
            message
                .validate()
                .map_err(|error| ServiceError::InvalidMessage { index, error })?;
            fingerprints.push(Fingerprints {
                hash: fingerprint(message, bound),
                opening: opening(message),
            });
        }
        let system_hash = text_hash(request.system.trim());
        let first_hash = fingerprints.first().map_or(0, |f| f.hash);
        let Placement {
            conversation,
            root_hash,
            named,
            id,
        } = placement(caller, identity, system_hash, first_hash)?;
        let (context_limit, limit_source) = context_limit_of(identity, request, &settings);
        settings
            .config
            .compaction
            .check_context_limit(context_limit)
            .map_err(crate::config::OverrideError::from)?;
        let may_create = match caller.local {
            true => Ok(()),
            false => self
                .session_rate
                .allows(&caller.owner, std::time::Instant::now()),
        };
        Ok(ProxyCall {
            may_create,
            windows_taught_since: settings.windows_taught_since(),
            owner: caller.owner.clone(),
            named: named.map(|n| n.to_string()),
            conversation,
            root_hash,
            messages: request.messages.clone(),
            fingerprints,
            media: request.media.clone(),
            estimator: self.estimator,
            has_tools: request.has_tools,
            overhead_tokens: request.overhead_tokens,
            completion_tokens: request.completion_tokens,
            new_session: NewSession {
                id,
                model: Some(request.model.clone()).filter(|m| !m.is_empty()),
                context_limit,
                overrides: Value::Object(Default::default()),
                owner: Some(caller.owner.clone()),
                limit_source: Some(limit_source),
            },
        })
    }

    /// Says, once per session, that a proxied agent's system prompt could not stay whole: it
    /// does not fit beside the smallest summary and the current step, so compaction will
    /// summarize it (the session's view and `/health` say so too).
    fn unpinned_system_prompt(&self, id: &SessionId, tokens: usize) {
        if self.unpinned_prompts.last(id.as_str()).is_none() {
            tracing::warn!(
                session = %id,
                tokens,
                "the agent's system prompt does not fit beside the smallest summary and the current step at this window: it is not pinned, and compaction will summarize it (raise the context limit, or shorten the prompt or the tools)"
            );
        }
        self.unpinned_prompts.record(id.as_str(), tokens);
    }

    /// How a proxied call's messages are stored: nothing the client sends is refused, its
    /// system messages and task are pinned while they fit beside the smallest summary and
    /// tail, the rest of its preamble while pinned messages take at most a quarter of the
    /// usable context (see `store::messages::pins`).
    fn proxy_rules(
        &self,
    ) -> impl Fn(&crate::store::SessionRow) -> AppendRules + Send + Sync + 'static {
        let base = self.append_rules();
        let settings = self.settings();
        move |session| {
            let config = settings.session_config(session);
            AppendRules {
                lenient: true,
                pin_cap: config.usable(session.estimated_limit(), session.overhead_tokens) / 4,
                max_pinned_tokens: config
                    .max_pinned_tokens(session.estimated_limit())
                    .saturating_sub(session.overhead_tokens),
                // Masking follows each proxied call's own append (`after_append`).
                masking: None,
                ..base(session)
            }
        }
    }
}

/// 24 hex digits no other session has: the caller and a stamp unique to this process
/// ([`super::unique_stamp`]), hashed.
fn fresh_suffix(owner: &str) -> String {
    let stamp = super::unique_stamp();
    hex::encode(Sha256::digest(format!("{owner}\0{stamp}").as_bytes()))[..24].to_string()
}

/// Where a call belongs: the conversation its header names (with a sub-agent's digits),
/// the hash its first call is matched by, the session a client named, and the session
/// it would make.
fn placement(
    caller: &Caller,
    identity: &Identity,
    system_hash: i64,
    first_hash: i64,
) -> Result<Placement, ServiceError> {
    let header = identity
        .conversation
        .as_ref()
        .map(|c| hex::encode(Sha256::digest(format!("{}\0{c}", caller.owner).as_bytes())));
    // A sub-agent under the header: 16 hex digits of its id after the header's (without a
    // header, below, it names nothing).
    let agent = identity
        .agent
        .as_ref()
        .map(|a| hex::encode(Sha256::digest(a.as_bytes()))[..16].to_string());
    let conversation = match (&header, &agent) {
        (Some(header), Some(agent)) => Some(format!("{header}.{agent}")),
        _ => header.clone(),
    };
    // A conversation named by its header is told from its side calls by their
    // instructions; one without, by its first message too.
    let root_hash = match &conversation {
        Some(_) => system_hash,
        None => system_hash ^ first_hash.rotate_left(1),
    };
    let named = identity
        .named
        .as_ref()
        .map(|n| caller.session_named(n))
        .transpose()?;
    // `proxy-` and hex digits: an id by construction. A sub-agent's is the one its header
    // and instructions name, then its own digits: a Codex sub-agent has its parent's
    // instructions, so `sqlite3` lists it beside its parent; a Claude Code sub-agent beside
    // the others of its kind (a fork: of its parent's instructions, but for one flag).
    let id = match (&named, &header) {
        (Some(named), _) => named.clone(),
        (None, Some(header)) => {
            let session = conversation_session(header, system_hash);
            SessionId::unchecked(match &agent {
                Some(agent) => format!("{session}.{agent}"),
                None => session,
            })
        }
        (None, None) => SessionId::unchecked(format!("proxy-{}", fresh_suffix(&caller.owner))),
    };
    Ok(Placement {
        conversation,
        root_hash,
        named,
        id,
    })
}

/// Where a proxied call belongs (see [`placement`]).
struct Placement {
    conversation: Option<String>,
    root_hash: i64,
    named: Option<SessionId>,
    id: SessionId,
}

/// The session of a conversation its header names: the same for every call of it, and for
/// its side calls with other instructions, another.
fn conversation_session(conversation: &str, system_hash: i64) -> String {
    let digest = hex::encode(Sha256::digest(
        format!("{conversation}\0{system_hash}").as_bytes(),
    ));
    format!("proxy-{}", &digest[..24])
}

/// A new proxied session's context limit and why: the client's header, else the model's
/// window ([proxy.models], then the table), else the default.
fn context_limit_of(
    identity: &Identity,
    request: &WireRequest,
    settings: &super::Settings,
) -> (usize, String) {
    match identity.context_limit {
        Some(limit) => (limit, "x-compactd-context-limit".to_string()),
        None => settings
            .config
            .proxy
            .model_window(&request.model)
            .unwrap_or_else(|| {
                (
                    settings.config.compaction.default_context_limit,
                    "default_context_limit".to_string(),
                )
            }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_own_sessions_and_names_over_tcp_live_in_the_key_namespace() {
        let a = Caller::new("Bearer sk-a", false);
        let b = Caller::new("Bearer sk-b", false);
        assert_ne!(a.owner, b.owner);
        assert!(!a.owner.contains("sk-a"));
        let name = SessionId::parse("myproject").unwrap();
        assert_ne!(a.session_named(&name).unwrap(), name);
        assert_ne!(
            a.session_named(&name).unwrap(),
            b.session_named(&name).unwrap()
        );
        assert_eq!(
            Caller::new("Bearer sk-a", true)
                .session_named(&name)
                .unwrap(),
            name
        );
        assert!(
            a.session_named(&SessionId::parse("x".repeat(128)).unwrap())
                .is_err()
        );
    }
}
