//! The context as a model's tokenizer counts it, not as compactd estimates it: OpenAI's
//! cl100k (the stricter of its two on Chinese, Japanese and Korean text) over every text,
//! call and output of the context an agent is handed, plus four tokens a message for the
//! API's framing. Estimated at the spec's four characters a token, sessions in Japanese and
//! in Greek, and one reading lockfiles, reached their model over its window; with digits
//! counted, sessions reading base64 or minified code still did.

use compactd_core::compaction::{Message, Part};
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

const JAPANESE: [&str; 6] = [
    "設定ファイルを読み込んで、接続先のサーバーを確認しました。",
    "関数の戻り値が期待と異なるため、テストが失敗しています。",
    "ログによると、三番目の要求で応答が遅れています。",
    "この変更は公開されているインターフェースを変えません。",
    "利用者の指示に従い、古い形式の読み込みも残します。",
    "次の手順では、修正したモジュールの単体テストを実行します。",
];

const GREEK: [&str; 6] = [
    "Διάβασα το αρχείο ρυθμίσεων και έλεγξα τη διεύθυνση του διακομιστή.",
    "Η συνάρτηση επιστρέφει λάθος τιμή, γι' αυτό αποτυγχάνει το τεστ.",
    "Σύμφωνα με το αρχείο καταγραφής, το τρίτο αίτημα καθυστερεί.",
    "Η αλλαγή δεν αγγίζει τη δημόσια διεπαφή.",
    "Όπως ζήτησε ο χρήστης, κρατάμε και την ανάγνωση της παλιάς μορφής.",
    "Στο επόμενο βήμα τρέχουμε τα τεστ της διορθωμένης μονάδας.",
];

/// A line of prose from `sentences`, numbered: line `i` of the file read at `step`.
fn prose<'a>(sentences: &'a [&'a str]) -> impl Fn(usize, usize) -> String + 'a {
    move |step, i| format!("{step} {i}: {}\n", sentences[i % sentences.len()])
}

/// An agent working in a language written outside ASCII: its task, then 24 reads of files
/// in it (one larger than the whole window), each after a note. The context it is handed
/// never passes its window as cl100k counts it, after every append; the session compacts on
/// its way, and its contexts are not kept needlessly small.
async fn session_fits_as_the_model_counts_it(
    task: &str,
    sentences: &[&str],
    line: impl Fn(usize, usize) -> String,
) {
    let bpe = tiktoken_rs::cl100k_base().unwrap();
    let daemon = crate::common::TestDaemon::start("");
    let client = daemon.client();
    let limit = 16_000;
    client
        .post("/session", &json!({"id": "s", "context_limit": limit}))
        .await
        .unwrap();
    let mut appended: Vec<Value> = vec![json!({"role": "user", "content": task})];
    for step in 0..24 {
        let id = format!("c{step}");
        let lines = if step == 9 { 1_200 } else { 40 + step * 3 };
        appended.push(json!({"role": "assistant", "parts": [
            {"type": "text", "text": sentences[step % sentences.len()]},
            {"type": "tool_call", "id": id, "name": "read", "args": {"file_path": format!("src/{step}.md")}}]}));
        appended.push(json!({"role": "tool", "parts": [
            {"type": "tool_result", "call_id": id, "output": (0..lines).map(|i| line(step, i)).collect::<String>()}]}));
    }
    let mut peak = 0;
    for (n, message) in appended.iter().enumerate() {
        client.post("/session/s/message", message).await.unwrap();
        let context = client.get("/session/s/context").await.unwrap();
        let messages: Vec<Message> = serde_json::from_value(context["messages"].clone()).unwrap();
        let counted = model_tokens(&bpe, &messages);
        assert!(
            counted <= limit,
            "after message {n}: the model counts {counted} tokens in a window of {limit} (compactd: {})",
            context["tokens"]
        );
        peak = peak.max(counted);
    }
    let stats = client.get("/session/s").await.unwrap();
    assert!(
        stats["compaction_count"].as_u64().unwrap() >= 1,
        "the session compacted on its way: {stats}"
    );
    assert!(
        peak > limit / 2,
        "the context was not kept needlessly small: peak {peak}"
    );
}

/// Japanese: with the spec's four characters a token, the file larger than the window was
/// shortened to 27,770 tokens as the model counts them (compactd: 7,309) in a window of 16,000.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_in_japanese_fits_its_window_as_the_model_counts_it() {
    session_fits_as_the_model_counts_it(
        "設定の読み込みで失敗しているテストを直してください。公開インターフェースは変えないでください。",
        &JAPANESE,
        prose(&JAPANESE),
    )
    .await;
}

/// Greek (cl100k spends 0.87 tokens on each of its letters): with the spec's four characters
/// a token, the model counted 16,629 tokens in a window of 16,000 at the sixth read (compactd:
/// 4,860).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_in_greek_fits_its_window_as_the_model_counts_it() {
    session_fits_as_the_model_counts_it(
        "Διόρθωσε το τεστ που αποτυγχάνει στην ανάγνωση των ρυθμίσεων, χωρίς να αλλάξεις τη δημόσια διεπαφή.",
        &GREEK,
        prose(&GREEK),
    )
    .await;
}

/// A lockfile's entry: a package, its version and its SHA-256, different at every line.
fn lockfile_entry(step: usize, i: usize) -> String {
    let checksum: String = pseudo_random((step * 100_003 + i) as u64)
        .take(4)
        .map(|x| format!("{x:016x}"))
        .collect();
    format!(
        "[[package]]\nname = \"crate-{i}\"\nversion = \"{}.{}.{step}\"\nchecksum = \"{checksum}\"\n\n",
        i % 3,
        i % 17
    )
}

/// Lockfiles (cl100k spends a token on about every two of their characters: it never joins a
/// digit to a letter), read by an agent that writes English: with every ASCII character a
/// quarter token, the model counted 17,171 tokens in a window of 16,000 after the twelfth
/// message (compactd: 9,224).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_reading_lockfiles_fits_its_window_as_the_model_counts_it() {
    const NOTES: [&str; 3] = [
        "Reading the lockfile to see which version of the parser is pinned.",
        "The checksum changed between the two lockfiles; comparing the entries.",
        "Next I read the workspace's lockfile, then update the pinned crate.",
    ];
    session_fits_as_the_model_counts_it(
        "Find why the build picks the old parser crate and pin the new one.",
        &NOTES,
        lockfile_entry,
    )
    .await;
}

/// A pseudo-random stream of words, the same for the same `seed`.
fn pseudo_random(seed: u64) -> impl Iterator<Item = u64> {
    let step = |x: u64| {
        x.wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407)
    };
    std::iter::successors(Some(step(seed ^ 0x9e37_79b9_7f4a_7c15)), move |&x| {
        Some(step(x))
    })
}

/// `n` pseudo-random bytes, the same for the same `seed`.
fn pseudo_random_bytes(seed: u64, n: usize) -> Vec<u8> {
    pseudo_random(seed)
        .take(n)
        .map(|x| (x >> 33) as u8)
        .collect()
}

/// A line of a base64 attachment (57 bytes, 76 characters), different at every line.
fn base64_line(step: usize, i: usize) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes = pseudo_random_bytes((step * 100_003 + i) as u64, 57);
    let mut line: String = bytes
        .chunks(3)
        .flat_map(|c| {
            let n = (u32::from(c[0]) << 16) | (u32::from(c[1]) << 8) | u32::from(c[2]);
            (0..4)
                .rev()
                .map(move |k| char::from(ALPHABET[((n >> (6 * k)) & 63) as usize]))
        })
        .collect();
    line.push('\n');
    line
}

/// A function of a minified bundle: short names in both cases, punctuation between them.
fn minified_line(step: usize, i: usize) -> String {
    const LETTERS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_$";
    let b = pseudo_random_bytes((step * 7_919 + i) as u64, 64);
    let name = |k: usize| -> String {
        (0..1 + usize::from(b[k] % 3))
            .map(|j| char::from(LETTERS[usize::from(b[(k + j) % 64]) % LETTERS.len()]))
            .collect()
    };
    format!(
        "function {}({},{}){{var {}={}.{}({}),{}=[{},{}];return {}?{}.{}({},!0):void 0}},{}=\"{}\";",
        name(0),
        name(1),
        name(2),
        name(3),
        name(4),
        name(5),
        name(6),
        name(7),
        b[8] % 10,
        b[9],
        name(10),
        name(11),
        name(12),
        name(13),
        name(14),
        name(15)
    )
}

/// Base64 (random letters in both cases, which the tokenizers take about two at a time): with
/// a quarter token to each character but digits, the model counted 16,056 tokens in a window
/// of 16,000 after the twelfth message (compactd: 9,189).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_reading_base64_fits_its_window_as_the_model_counts_it() {
    session_fits_as_the_model_counts_it(
        "Find which of the attached certificates is the expired one.",
        &["Reading the next attachment."],
        base64_line,
    )
    .await;
}

/// Minified code (a token to every name and to most punctuation): with a quarter token to
/// each character but digits, the model counted 17,738 tokens in a window of 16,000 after the
/// sixteenth message (compactd: 9,321).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_reading_minified_code_fits_its_window_as_the_model_counts_it() {
    session_fits_as_the_model_counts_it(
        "Find where the bundle drops the request's headers.",
        &["Reading the next chunk of the bundle."],
        minified_line,
    )
    .await;
}
