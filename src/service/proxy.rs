//! Sessions for the proxy: a client that sends its whole conversation with every call (as
//! every agent on the OpenAI SDK does) is mapped to a session, the messages it has not sent
//! before are appended, and what goes upstream is the session's context.
//!
//! A session the proxy makes belongs to the API key that made it (a hash of it: the key is
//! never stored). A call with another key can neither continue nor read it; a session made
//! through the socket API can be continued only over the socket, whose peer is this user.

use super::{AppendRequest, Service, ServiceError};
use crate::message::{Message, Part, Role};
use crate::protocol::{ContextView, SessionId};
use crate::store::{NewSession, StoreError};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::sync::Arc;

/// How many forks of one conversation the proxy keeps apart (`ID`, `ID-2`, ... `ID-64`).
const MAX_FORKS: usize = 64;

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
            owner: hex(&Sha256::digest(credential.as_bytes())),
            local,
        }
    }

    fn may_use(&self, owner: Option<&str>) -> bool {
        match owner {
            Some(owner) => owner == self.owner,
            None => self.local,
        }
    }
}

/// What the proxy sends upstream for one call.
#[derive(Debug)]
pub struct ProxyTurn {
    pub id: SessionId,
    /// The session this call's history diverged from (the user edited or rewound it).
    pub forked_from: Option<SessionId>,
    pub context: ContextView,
}

impl Service {
    /// Maps a client's whole conversation to its session, appends what the session has not
    /// seen, and returns the context to send upstream (after any compaction that append
    /// made due). `wanted` is the session the client named (`x-compactd-session`).
    pub async fn proxy_turn(
        self: &Arc<Self>,
        caller: &Caller,
        wanted: Option<SessionId>,
        conversation: Vec<Message>,
    ) -> Result<ProxyTurn, ServiceError> {
        if conversation.is_empty() {
            return Err(ServiceError::BadRequest("no messages".into()));
        }
        let base = match wanted {
            Some(id) => id,
            None => derived_id(caller, &conversation),
        };
        let mut best: Option<(SessionId, usize)> = None;
        let mut free = None;
        for n in 1..=MAX_FORKS {
            let id = fork_id(&base, n)?;
            let stored = match self.stored_conversation(caller, &id).await? {
                Some(stored) => stored,
                None => {
                    free = Some(id);
                    break;
                }
            };
            if is_prefix(&stored, &conversation)
                && best.as_ref().is_none_or(|b| stored.len() >= b.1)
            {
                best = Some((id, stored.len()));
            }
        }
        let (id, seen, forked_from) = match best {
            Some((id, seen)) => (id, seen, None),
            None => {
                let id = free.ok_or_else(|| {
                    ServiceError::BadRequest(format!("{MAX_FORKS} forks of `{base}` already"))
                })?;
                self.create_owned(&id, caller).await?;
                let forked = (id != base).then(|| base.clone());
                (id, 0, forked)
            }
        };
        if seen < conversation.len() {
            let request = AppendRequest {
                messages: conversation[seen..].to_vec(),
                input_tokens: None,
                wait: false,
                idempotency_key: None,
            };
            self.append(&id, request).await?;
        }
        let context = self.context(&id, true).await?;
        Ok(ProxyTurn {
            id,
            forked_from,
            context,
        })
    }

    /// Records the model's answer to a proxied call and what the call really cost.
    pub async fn proxy_reply(
        self: &Arc<Self>,
        id: &SessionId,
        reply: Message,
        context_tokens: Option<usize>,
    ) -> Result<(), ServiceError> {
        let request = AppendRequest {
            messages: vec![reply],
            input_tokens: context_tokens,
            wait: false,
            idempotency_key: None,
        };
        self.append(id, request).await.map(|_| ())
    }

    /// The session's messages when it exists and `caller` may use it; `None` when it does not
    /// exist; not found when it belongs to someone else.
    async fn stored_conversation(
        &self,
        caller: &Caller,
        id: &SessionId,
    ) -> Result<Option<Vec<Message>>, ServiceError> {
        let mut messages = Vec::new();
        let mut after = 0;
        loop {
            let (session, page) = match self
                .store
                .history(id.as_str(), after, 1_000, super::MAX_PAGE_BYTES)
                .await
            {
                Ok(found) => found,
                Err(StoreError::NotFound(_)) if after == 0 => return Ok(None),
                Err(e) => return Err(e.into()),
            };
            if !caller.may_use(session.owner.as_deref()) {
                return Err(StoreError::NotFound(id.to_string()).into());
            }
            let Some(last) = page.last().map(|m| m.seq) else {
                return Ok(Some(messages));
            };
            for stored in &page {
                messages.push(stored.to_message()?);
            }
            after = last;
        }
    }

    async fn create_owned(&self, id: &SessionId, caller: &Caller) -> Result<(), ServiceError> {
        let settings = self.settings();
        let new = NewSession {
            id: id.to_string(),
            model: None,
            context_limit: settings.config.compaction.default_context_limit,
            overrides: Value::Object(Default::default()),
            owner: Some(caller.owner.clone()),
        };
        self.store.create_session(new).await?;
        Ok(())
    }
}

/// A conversation's session when the client names none: the same key, system text and first
/// user message make the same session, so a client that restarts continues where it was.
fn derived_id(caller: &Caller, conversation: &[Message]) -> SessionId {
    let mut hash = Sha256::new();
    hash.update(caller.owner.as_bytes());
    for role in [Role::System, Role::User] {
        hash.update([0]);
        if let Some(first) = conversation.iter().find(|m| m.role == role) {
            hash.update(first.joined_text().as_bytes());
        }
    }
    let digest = hex(&hash.finalize());
    SessionId::parse(format!("proxy-{}", &digest[..24]))
        .expect("24 hex digits after `proxy-` make a valid id")
}

/// The `n`th fork of `base`: `base` itself, then `base-2`, `base-3`, ...
fn fork_id(base: &SessionId, n: usize) -> Result<SessionId, ServiceError> {
    if n == 1 {
        return Ok(base.clone());
    }
    SessionId::parse(format!("{base}-{n}"))
        .map_err(|e| ServiceError::BadRequest(format!("session id `{base}`: {e}")))
}

/// Whether `stored` is where `conversation` starts, message by message (see [`same`]).
fn is_prefix(stored: &[Message], conversation: &[Message]) -> bool {
    stored.len() <= conversation.len() && stored.iter().zip(conversation).all(|(a, b)| same(a, b))
}

/// Two messages are the same one as a client re-sends it: same role and the same text, calls
/// and results, whatever whitespace around the text and whatever reasoning came along (SDKs
/// drop or re-encode those).
fn same(a: &Message, b: &Message) -> bool {
    fn essential(m: &Message) -> Vec<Part> {
        m.parts
            .iter()
            .filter_map(|p| match p {
                Part::Reasoning { .. } => None,
                Part::Text { text } if text.trim().is_empty() => None,
                Part::Text { text } => Some(Part::Text {
                    text: text.trim().to_string(),
                }),
                Part::ToolResult {
                    call_id,
                    output,
                    is_error,
                    ..
                } => Some(Part::ToolResult {
                    call_id: call_id.clone(),
                    name: None,
                    output: output.clone(),
                    is_error: *is_error,
                }),
                other => Some(other.clone()),
            })
            .collect()
    }
    a.role == b.role && essential(a) == essential(b)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resent_conversation_matches_and_an_edited_one_does_not() {
        let stored = vec![
            Message::text(Role::System, "be brief"),
            Message::text(Role::User, "fix it"),
            Message {
                role: Role::Assistant,
                parts: vec![
                    Part::Reasoning { text: "hmm".into() },
                    Part::Text {
                        text: "done\n".into(),
                    },
                ],
            },
        ];
        let mut resent = stored.clone();
        resent[2] = Message::text(Role::Assistant, "done");
        resent.push(Message::text(Role::User, "thanks"));
        assert!(is_prefix(&stored, &resent));
        let mut edited = resent.clone();
        edited[1] = Message::text(Role::User, "fix it properly");
        assert!(!is_prefix(&stored, &edited));
        assert!(!is_prefix(&resent, &stored), "longer than the conversation");
    }

    #[test]
    fn keys_own_sessions_and_the_socket_owns_the_rest() {
        let a = Caller::new("Bearer sk-a", false);
        let b = Caller::new("Bearer sk-b", false);
        assert_ne!(a.owner, b.owner);
        assert!(!a.owner.contains("sk-a"));
        assert!(a.may_use(Some(&a.owner)) && !b.may_use(Some(&a.owner)));
        assert!(!a.may_use(None));
        assert!(Caller::new("Bearer sk-a", true).may_use(None));
        let conversation = [Message::text(Role::User, "hi")];
        assert_ne!(derived_id(&a, &conversation), derived_id(&b, &conversation));
        assert_eq!(derived_id(&a, &conversation), derived_id(&a, &conversation));
    }
}
