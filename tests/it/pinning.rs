//! Pinned messages over random sessions, through the real service and store: system messages
//! and the task are in every context, verbatim and in order, across repeated compactions,
//! and no context exceeds the limit.

use crate::common::random_session::{messages, step};
use compactd_api::{ContextMessage, SessionId};
use compactd_core::compaction::{Message, Role};
use compactd_core::message::MessageBatch;
use compactd_daemon::Config;
use compactd_daemon::{CreateSession, Service};
use compactd_store::Store;
use compactd_store::Synchronous;
use proptest::prelude::*;
use serde_json::json;

/// The messages a context must start its pinned part with, in order: every system message
/// and the first user message (small enough here to be pinned).
fn expected_pins(appended: &[Message]) -> Vec<Message> {
    let task = appended.iter().position(|m| m.role == Role::User);
    appended
        .iter()
        .enumerate()
        .filter(|(i, m)| m.role == Role::System || Some(*i) == task)
        .map(|(_, m)| m.clone())
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    #[test]
    fn pinned_messages_are_in_every_context_and_no_context_overflows(
        steps in prop::collection::vec(step([(1, 400), (3, 3000), (8, 6000)]), 10..60),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let dir = tempfile::TempDir::new().unwrap();
            let store = Store::open(&dir.path().join("p.db"), Synchronous::Normal).unwrap();
            let service = Service::new(store.clone(), Config::default()).unwrap();
            service.create_session(CreateSession {
                id: Some(sid()),
                context_limit: Some(16_000),
                config: Some(json!({"max_messages": 20})),
                ..Default::default()
            }).await.unwrap();
            let all = messages(&steps);
            let mut compactions = 0;
            for (n, message) in all.iter().enumerate() {
                let answer = service.append(&sid(), MessageBatch {
                    messages: vec![message.clone()],
                    input_tokens: None,
                    compaction_num: None,
                    wait: true,
                }, None).await.unwrap();
                compactions += usize::from(answer.compaction.is_some_and(|c| c.status == compactd_api::CompactionState::Completed));
                let context = service.context(&sid(), true).await.unwrap();
                prop_assert!(context.tokens <= 16_000, "context of {} tokens", context.tokens);
                let pinned: Vec<Message> = context.messages.iter().filter_map(|m| match m {
                    ContextMessage::Stored(s) if s.pinned => Some(s.to_message().unwrap()),
                    _ => None,
                }).collect();
                prop_assert_eq!(&pinned, &expected_pins(&all[..=n]), "after message {}", n);
                // Pinned messages never reach a summary.
                if let Some(ContextMessage::Summary { parts, .. }) =
                    context.messages.iter().find(|m| matches!(m, ContextMessage::Summary { .. }))
                {
                    let summary = serde_json::to_string(parts).unwrap();
                    for pin in &pinned {
                        if pin.role == Role::System {
                            prop_assert!(!summary.contains(&pin.joined_text()));
                        }
                    }
                }
            }
            service.shutdown().await;
            store.close();
            // More than max_messages messages: the session compacted, so pins were tested
            // across compactions, not only before the first.
            prop_assert!(all.len() <= 20 || compactions > 0, "{} messages, no compaction", all.len());
            Ok(())
        })?;
    }
}

/// The session these tests use.
fn sid() -> SessionId {
    SessionId::parse("p").unwrap()
}
