//! The context as a model's tokenizer counts it, not as compactd estimates it: OpenAI's
//! cl100k (the stricter of its two on Chinese, Japanese and Korean text) over every text,
//! call and output of the context an agent is handed, plus four tokens a message for the
//! API's framing. A session in Japanese, estimated at the spec's four characters a token,
//! reached its model at three and a half times its window.

use compactd::compaction::{Message, Part};
use serde_json::{Value, json};
use tiktoken_rs::CoreBPE;

/// Tokens the API adds around each message (its role and separators).
const PER_MESSAGE: usize = 4;

/// What `messages` cost the model, counted by `bpe`.
fn model_tokens(bpe: &CoreBPE, messages: &[Message]) -> usize {
    let count = |text: &str| bpe.encode_ordinary(text).len();
    messages
        .iter()
        .map(|m| {
            let parts: usize = m
                .parts
                .iter()
                .map(|p| match p {
                    Part::Text { text } | Part::Reasoning { text } => count(text),
                    Part::ToolCall { name, args, .. } => count(name) + count(&args.to_string()),
                    Part::ToolResult { output, .. } => count(output),
                })
                .sum();
            parts + PER_MESSAGE
        })
        .sum()
}

/// A file's worth of Japanese prose, `lines` lines, each line its own (numbered) sentence.
fn japanese(lines: usize, about: &str) -> String {
    const SENTENCES: [&str; 6] = [
        "設定ファイルを読み込んで、接続先のサーバーを確認しました。",
        "関数の戻り値が期待と異なるため、テストが失敗しています。",
        "ログによると、三番目の要求で応答が遅れています。",
        "この変更は公開されているインターフェースを変えません。",
        "利用者の指示に従い、古い形式の読み込みも残します。",
        "次の手順では、修正したモジュールの単体テストを実行します。",
    ];
    (0..lines)
        .map(|i| format!("{about}{i}行目：{}\n", SENTENCES[i % SENTENCES.len()]))
        .collect()
}

/// An agent working in Japanese: its reads of long Japanese files (one of them larger than
/// the whole window) and its notes never take the context it is handed past its window as
/// cl100k counts it, after every append.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_in_japanese_fits_its_window_as_the_model_counts_it() {
    let bpe = tiktoken_rs::cl100k_base().unwrap();
    let daemon = crate::common::TestDaemon::start("");
    let client = daemon.client();
    let limit = 16_000;
    client
        .post("/session", &json!({"id": "ja", "context_limit": limit}))
        .await
        .unwrap();
    let mut appended: Vec<Value> = vec![json!({"role": "user",
        "content": "設定の読み込みで失敗しているテストを直してください。公開インターフェースは変えないでください。"})];
    for step in 0..24 {
        let id = format!("c{step}");
        let lines = if step == 9 { 1_200 } else { 40 + step * 3 };
        appended.push(json!({"role": "assistant", "parts": [
            {"type": "text", "text": format!("ファイル{step}を読みます。")},
            {"type": "tool_call", "id": id, "name": "read", "args": {"file_path": format!("src/設定{step}.md")}}]}));
        appended.push(json!({"role": "tool", "parts": [
            {"type": "tool_result", "call_id": id, "output": japanese(lines, &format!("設定{step}の"))}]}));
    }
    let mut peak = 0;
    for (n, message) in appended.iter().enumerate() {
        client.post("/session/ja/message", message).await.unwrap();
        let context = client.get("/session/ja/context").await.unwrap();
        let messages: Vec<Message> = serde_json::from_value(context["messages"].clone()).unwrap();
        let counted = model_tokens(&bpe, &messages);
        assert!(
            counted <= limit,
            "after message {n}: the model counts {counted} tokens in a window of {limit} (compactd: {})",
            context["tokens"]
        );
        peak = peak.max(counted);
    }
    let stats = client.get("/session/ja").await.unwrap();
    assert!(
        stats["compaction_count"].as_u64().unwrap() >= 1,
        "the session compacted on its way: {stats}"
    );
    assert!(
        peak > limit / 3,
        "the context was not kept needlessly small: peak {peak}"
    );
}
