//! The context is cache-stable: between two compactions or maskings, every context is the
//! previous one plus the new messages, byte for byte, so a model API's prompt cache reads
//! the whole previous prefix. Masking never touches the newest `preserveRecentOutputs`
//! outputs nor a pinned message, and a masked output is retrievable whole from the history.
//! Random sessions through the real service and store.

use crate::common::random_session::{Step, messages, step};
use compactd_api::{ContextMessage, SessionId};
use compactd_core::compaction::Part;
use compactd_core::compaction::constants::PRESERVE_RECENT_OUTPUTS;
use compactd_core::message::MessageBatch;
use compactd_daemon::Config;
use compactd_daemon::{CreateSession, HistoryRequest, Service};
use compactd_store::Store;
use compactd_store::Synchronous;
use proptest::prelude::*;
use std::sync::Arc;

/// How many compactions and maskings the session has had.
async fn rewrites(service: &Arc<Service>) -> (u32, usize) {
    let compactions = service.session(&sid()).await.unwrap().compaction_count;
    let mut maskings = 0;
    let mut after = 0;
    loop {
        let page = service
            .compaction_history(
                &sid(),
                HistoryRequest {
                    after: u32::MAX,
                    failures_after: u64::MAX,
                    maskings_after: after,
                    limit: 100,
                },
            )
            .await
            .unwrap();
        maskings += page.maskings.len();
        match page.maskings_next_after {
            Some(next) => after = next,
            None => return (compactions, maskings),
        }
    }
}

fn stored(context: &[ContextMessage]) -> impl Iterator<Item = &compactd_api::StoredMessage> {
    context.iter().filter_map(|m| match m {
        ContextMessage::Stored(s) => Some(s),
        ContextMessage::Summary { .. } => None,
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    #[test]
    fn the_context_only_grows_between_rewrites_and_masking_spares_the_newest_outputs(
        steps in prop::collection::vec(step([(1, 300), (2, 2000), (10, 8000)]), 40..110),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let dir = tempfile::TempDir::new().unwrap();
            let store = Store::open(&dir.path().join("c.db"), Synchronous::Normal).unwrap();
            let service = Service::new(store.clone(), Config::default()).unwrap();
            service.create_session(CreateSession {
                id: Some(sid()),
                context_limit: Some(32_000),
                ..Default::default()
            }).await.unwrap();
            let all = messages(&steps);
            let mut previous: Option<(String, (u32, usize))> = None;
            let mut stable_steps = 0;
            let mut masked_seen = 0;
            for message in &all {
                service.append(&sid(), MessageBatch {
                    messages: vec![message.clone()],
                    input_tokens: None,
                    compaction_num: None,
                    wait: true,
                }, None).await.unwrap();
                let context = service.context(&sid(), true).await.unwrap();
                let now = rewrites(&service).await;
                let items: Vec<String> = context.messages.iter().map(|m| serde_json::to_string(m).unwrap()).collect();
                let bytes = items.join("\n");

                // No compaction or masking since the previous context: it, then the new
                // message, byte for byte.
                if let Some((before, _)) = previous.as_ref().filter(|(_, then)| *then == now) {
                    prop_assert!(bytes.starts_with(before.as_str()), "prefix changed without a rewrite");
                    prop_assert_eq!(items.last().unwrap().len() + 1, bytes.len() - before.len());
                    stable_steps += 1;
                }
                previous = Some((bytes, now));

                let tail: Vec<_> = stored(&context.messages).collect();
                // Pinned messages are never masked.
                prop_assert!(tail.iter().all(|m| !(m.pinned && m.masked)));
                // The newest preserveRecentOutputs outputs read whole.
                let with_outputs: Vec<_> = tail.iter().filter(|m| m.parts.get().contains("\"tool_result\"")).collect();
                for m in with_outputs.iter().rev().take(PRESERVE_RECENT_OUTPUTS) {
                    prop_assert!(!m.masked, "seq {} among the newest outputs is masked", m.seq);
                }
                // A masked output says where it is, and the history has it whole.
                for m in tail.iter().filter(|m| m.masked) {
                    masked_seen += 1;
                    let marker = format!("; seq {} of session {}, read_messages has it]", m.seq, sid());
                    prop_assert!(m.parts.get().contains("masked: ") && m.parts.get().contains(&marker), "{}", m.parts.get());
                    let page = service.history(&sid(), m.seq - 1, 1).await.unwrap();
                    let original = serde_json::from_str::<Vec<Part>>(page.messages[0].parts.get()).unwrap();
                    prop_assert_eq!(&original, &all[m.seq as usize - 1].parts);
                }
            }
            service.shutdown().await;
            store.close();
            // The property was exercised, and masking happened in most sessions.
            prop_assert!(stable_steps > all.len() / 2, "{stable_steps} stable steps of {}", all.len());
            let total_chars: usize = steps.iter().map(|s| if let Step::Round(n) = s { *n } else { 0 }).sum();
            prop_assert!(total_chars < 60_000 || masked_seen > 0, "{total_chars} chars of outputs, nothing masked");
            Ok(())
        })?;
    }
}

/// The session these tests use.
fn sid() -> SessionId {
    SessionId::parse("s").unwrap()
}
