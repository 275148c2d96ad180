//! Images and PDFs through the proxy. A model bills an image by its size (a screenshot: 1,000
//! to 1,600 tokens) and a PDF by its pages (a page of text: over 2,000), not by their base64
//! text, and compactd reads either as a note of a few tokens: unless it counts what they
//! cost, an agent that takes screenshots or reads PDFs reaches the model with a context
//! compactd thought was a tenth of its window. The mock here bills them as the providers do
//! and refuses as they do.

use crate::common::mock_model::MockModel;
use crate::common::vision::{
    PDF_PAGE_TOKENS, media_tokens, pdf_base64, png_base64, without_media_data,
};
use crate::proxy::{KEY, anthropic_call, anthropic_call_as, call, proxy_to};
use crate::proxy_overflow::{model, results_follow_their_calls};
use compactd_api::client::Client;
use hyper::HeaderMap;
use serde_json::{Value, json};

/// The mock's window (tokens), and what each call asks room for beside its prompt.
const WINDOW: usize = 16_000;
const MAX_TOKENS: usize = 1_024;

/// One step of Claude Code driving a browser: its whole conversation to the model, then the
/// model's screenshot call and its result (a 1366 × 768 PNG: 1,399 tokens to Anthropic)
/// kept. Returns the call's headers.
async fn browser_step(client: &Client, messages: &mut Vec<Value>, i: usize) -> HeaderMap {
    let body = json!({"model": "claude-test", "max_tokens": MAX_TOKENS,
                      "system": "You drive a browser.", "messages": messages});
    let (status, head, answer) = anthropic_call(client, &body).await;
    assert_eq!(status, 200, "step {i}: {answer}");
    messages.push(json!({"role": "assistant", "content": [
        {"type": "text", "text": format!("Opening page {i}.")},
        {"type": "tool_use", "id": format!("toolu_{i}"), "name": "browser_take_screenshot",
         "input": {"url": format!("https://example.test/page/{i}")}}]}));
    messages.push(json!({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": format!("toolu_{i}"), "content": [
            {"type": "text", "text": format!("Screenshot of page {i}")},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": png_base64(1366, 768)}}]}]}));
    head
}

/// Every call the mock received reached it once (none refused and sent again), inside its
/// window beside the completion asked for, each tool result after its call, the newest
/// step's image or document among what reached the model.
fn each_call_fit(mock: &MockModel, calls: usize) {
    let requests = mock.requests();
    assert_eq!(requests.len(), calls, "no call was refused and sent again");
    for request in &requests {
        let sent = &request.body["messages"];
        let images = media_tokens(sent, true);
        let text = without_media_data(sent).to_string().len() / 4;
        assert!(
            images + text + MAX_TOKENS <= WINDOW,
            "{images} + {text} tokens sent"
        );
        results_follow_their_calls(sent.as_array().unwrap());
    }
    // The newest screenshot reaches the model; the oldest steps are in the summary.
    let last = &requests[calls - 1].body["messages"];
    assert!(
        last.to_string().contains(&format!("toolu_{}", calls - 2)),
        "{last}"
    );
    assert!(
        media_tokens(last, true) >= 1_399,
        "the newest screenshot or report is sent"
    );
}

/// Claude Code driving a browser, 24 steps: 33,576 tokens of images against a window of
/// 16,000. compactd counts each image as the model does, compacts before the window, and the
/// model refuses nothing: every call reaches it once, under its window, with every result
/// beside its call. (Counting an image as its note, two calls were refused.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn screenshots_are_counted_as_the_model_bills_them_and_compacted_before_the_window() {
    let mock = model(WINDOW, 4);
    let daemon = proxy_to(&mock);
    let client = daemon.client();
    let mut messages =
        vec![json!({"role": "user", "content": "Check every page of the site renders."})];
    let mut session = String::new();
    for i in 0..24 {
        let head = browser_step(&client, &mut messages, i).await;
        session = head["x-compactd-session"].to_str().unwrap().to_string();
    }
    each_call_fit(&mock, 24);
    let state = client.get(&format!("/session/{session}")).await.unwrap();
    assert!(state["compaction_count"].as_u64().unwrap() >= 1, "{state}");
}

/// Claude Code reading a two-page PDF at every step, as its `Read` sends one (a `document`
/// block in the tool's result: checked against Claude Code 2.1.332), 12 steps: 56,328 tokens of
/// pages against a window of 16,000. compactd counts each PDF by its pages, compacts before
/// the window, and the model refuses nothing. (Counting a PDF as its note, the agent got the
/// model's 400 at the fifth call: "prompt is too long: 19107 tokens > 16000 maximum".)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pdfs_are_counted_by_their_pages_and_compacted_before_the_window() {
    let mock = model(WINDOW, 4);
    let daemon = proxy_to(&mock);
    let client = daemon.client();
    let mut messages = vec![json!({"role": "user", "content": "Summarize every report."})];
    let mut session = String::new();
    for i in 0..12 {
        let body = json!({"model": "claude-test", "max_tokens": MAX_TOKENS,
                          "system": "You read reports.", "messages": messages});
        let (status, head, answer) = anthropic_call(&client, &body).await;
        assert_eq!(status, 200, "step {i}: {answer}");
        session = head["x-compactd-session"].to_str().unwrap().to_string();
        messages.push(json!({"role": "assistant", "content": [
            {"type": "tool_use", "id": format!("toolu_{i}"), "name": "Read",
             "input": {"file_path": format!("/work/report-{i}.pdf")}}]}));
        messages.push(json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": format!("toolu_{i}"), "content": [
                {"type": "text", "text": format!("PDF file read: /work/report-{i}.pdf (1.1KB)")},
                {"type": "document", "source": {"type": "base64", "media_type": "application/pdf",
                                                "data": pdf_base64(2)}}]}]}));
    }
    each_call_fit(&mock, 12);
    let last = &mock.requests()[11].body["messages"];
    assert!(
        media_tokens(last, true) >= 2 * PDF_PAGE_TOKENS,
        "the newest report is sent: {last}"
    );
    let state = client.get(&format!("/session/{session}")).await.unwrap();
    assert!(state["compaction_count"].as_u64().unwrap() >= 1, "{state}");
}

/// A three-page report padded in its middle (a comment), and a forgery of it: the padding
/// replaced by bare page objects nothing refers to. Same length, same first and last
/// 4,096 base64 characters.
fn report_and_forgery() -> (String, String) {
    let mut file = crate::common::vision::pdf_file(3);
    let eof = file.len() - "%%EOF\n".len();
    let padding = format!("% {}\n", "x".repeat(30_000));
    file.splice(eof..eof, padding.bytes());
    let mut forged = file.clone();
    let bare = b"<</Type/Page>>".repeat(2_000);
    forged[eof + 2..eof + 2 + bare.len()].copy_from_slice(&bare);
    use base64::Engine;
    let encode = |f: &[u8]| base64::engine::general_purpose::STANDARD.encode(f);
    (encode(&file), encode(&forged))
}

/// One Claude Code step that read `pdf` with `key`, then the model's next call: both reach
/// the model with the document in them.
async fn read_pdf_twice(client: &Client, mock: &MockModel, key: &str, pdf: &str) {
    let mut messages = vec![
        json!({"role": "user", "content": "Summarize the report."}),
        json!({"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "Read",
             "input": {"file_path": "/work/report.pdf"}}]}),
        json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [
                {"type": "document", "source": {"type": "base64",
                    "media_type": "application/pdf", "data": pdf}}]}]}),
    ];
    for step in 0..2 {
        let body = json!({"model": "claude-test", "max_tokens": MAX_TOKENS,
                          "system": "You read reports.", "messages": messages});
        let (status, _, answer) = anthropic_call_as(client, key, &body).await;
        assert_eq!(status, 200, "{answer}");
        let sent = mock.requests().last().unwrap().body["messages"].to_string();
        assert!(
            sent.contains(pdf),
            "step {step}: the document reached the model"
        );
        messages.push(json!({"role": "assistant", "content": "Reading it."}));
        messages.push(json!({"role": "user", "content": "Go on."}));
    }
}

/// A forged PDF (thousands of bare page objects beside a page tree of three) counted as
/// its bare objects cost 787 million tokens and was left out of every call after; and the
/// count was remembered by the document's length and ends, so another key's genuine report
/// of the same length and ends counted the forgery's and was left out too. Now each counts
/// its page tree's three pages, and both reach the model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_pdf_stays_in_the_context_and_sets_no_other_keys_count() {
    let mock = model(WINDOW, 4);
    let daemon = proxy_to(&mock);
    let client = daemon.client();
    let (report, forgery) = report_and_forgery();
    assert_eq!(report.len(), forgery.len());
    read_pdf_twice(&client, &mock, "sk-forger-0123456789abcdef", &forgery).await;
    read_pdf_twice(&client, &mock, KEY, &report).await;
    assert_eq!(mock.requests().len(), 4, "no call was refused");
}

/// The same while a person holds the database's write lock from the fourth step on: nothing
/// is stored, each call goes upstream from the stored context and its newer messages,
/// compacted in memory past the trigger, and those count their images too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn screenshots_sent_while_nothing_is_stored_are_counted_as_well() {
    let mock = model(WINDOW, 4);
    let mut daemon = proxy_to(&mock);
    let mut messages =
        vec![json!({"role": "user", "content": "Check every page of the site renders."})];
    for i in 0..3 {
        let head = browser_step(&daemon.client(), &mut messages, i).await;
        assert!(head.get("x-compactd-unrecorded").is_none(), "step {i}");
    }
    let person = crate::common::restart_under_a_held_lock(&mut daemon);
    let client = daemon.client();
    for i in 3..24 {
        let head = browser_step(&client, &mut messages, i).await;
        assert_eq!(head["x-compactd-unrecorded"], "busy", "step {i}");
    }
    each_call_fit(&mock, 24);
    assert!(
        daemon.log().contains("compacted in memory"),
        "{}",
        daemon.log()
    );
    crate::common::let_go(person, &client).await;
}

/// The same through Chat Completions (an OpenAI-compatible agent sending `image_url` data
/// URLs, two screenshots a step): OpenAI bills each 1,105 tokens (six tiles), and compactd
/// counts that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_completions_images_are_counted_as_openai_bills_them() {
    let mock = model(WINDOW, 4);
    let daemon = proxy_to(&mock);
    let client = daemon.client();
    let url = format!("data:image/png;base64,{}", png_base64(1366, 768));
    let mut messages =
        vec![json!({"role": "user", "content": "Check every page of the site renders."})];
    for i in 0..24 {
        let body = json!({"model": "gpt-test", "max_tokens": MAX_TOKENS, "messages": messages});
        let (status, _, answer) = call(&client, KEY, None, &body).await;
        assert_eq!(
            status,
            200,
            "step {i}: {}",
            String::from_utf8_lossy(&answer)
        );
        messages.push(
            json!({"role": "assistant", "content": format!("Opening page {i}."),
            "tool_calls": [{"id": format!("call_{i}"), "type": "function",
                "function": {"name": "screenshot", "arguments": format!("{{\"page\": {i}}}")}}]}),
        );
        messages.push(json!({"role": "tool", "tool_call_id": format!("call_{i}"),
            "content": format!("Screenshot of page {i} follows.")}));
        messages.push(json!({"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "image_url", "image_url": {"url": url}}]}));
    }
    let requests = mock.requests();
    assert_eq!(requests.len(), 24, "no call was refused and sent again");
    for request in &requests {
        let sent = &request.body["messages"];
        let images = media_tokens(sent, false);
        let text = without_media_data(sent).to_string().len() / 4;
        assert!(images + text <= WINDOW, "{images} + {text} tokens sent");
        crate::proxy::no_orphans(sent.as_array().unwrap());
    }
}

/// How an agent speaks to the model, for [`pasted_screenshots`].
#[derive(Clone, Copy, PartialEq)]
enum Api {
    Anthropic,
    Chat,
}

/// An agent's eight steps of `cargo test` (about 800 tokens of output each), then a person's
/// message pasting a long log (about 12,000 tokens of text, too much for the step's room: the
/// context shows its head and tail) and six screenshots (8,394 tokens to Anthropic, 6,630 to
/// OpenAI), then one more call. With `lock_from`, a person holds the database's write lock
/// from that step on (nothing is stored; the calls go up from the stored context and what is
/// newer, counted in memory). Returns the daemon's log.
async fn pasted_screenshots(api: Api, lock_from: Option<usize>) -> String {
    let mock = model(WINDOW, 4);
    let mut daemon = proxy_to(&mock);
    let mut person = None;
    let mut messages = vec![json!({"role": "user", "content": "Make the tests pass."})];
    for i in 0..10 {
        if lock_from == Some(i) {
            person = Some(crate::common::restart_under_a_held_lock(&mut daemon));
        }
        let client = daemon.client();
        let (status, answer) = match api {
            Api::Anthropic => {
                let body = json!({"model": "claude-test", "max_tokens": MAX_TOKENS,
                                  "system": "You fix tests.", "messages": messages});
                let (status, _, answer) = anthropic_call(&client, &body).await;
                (status, answer)
            }
            Api::Chat => {
                let body = json!({"model": "gpt-test", "max_tokens": MAX_TOKENS,
                                  "messages": messages});
                let (status, _, answer) = call(&client, KEY, None, &body).await;
                (status, String::from_utf8_lossy(&answer).into_owned())
            }
        };
        assert_eq!(status, 200, "step {i}: {answer}");
        if i == 9 {
            break;
        }
        let id = format!("call_{i}");
        let output = format!(
            "run {i}\n{}",
            "test parse::it_reads ... FAILED\n".repeat(90)
        );
        let (call, result) = match api {
            Api::Anthropic => (
                json!({"role": "assistant", "content": [
                    {"type": "tool_use", "id": id, "name": "Bash", "input": {"command": "cargo test"}}]}),
                json!({"type": "tool_result", "tool_use_id": id, "content": output}),
            ),
            Api::Chat => (
                json!({"role": "assistant", "content": null, "tool_calls": [{"id": id,
                    "type": "function", "function": {"name": "bash", "arguments": "{\"command\":\"cargo test\"}"}}]}),
                json!({"role": "tool", "tool_call_id": id, "content": output}),
            ),
        };
        messages.push(call);
        if i < 8 {
            messages.push(match api {
                Api::Anthropic => json!({"role": "user", "content": [result]}),
                Api::Chat => result,
            });
            continue;
        }
        let log = format!(
            "Here is what I see:\n{}",
            "error[E0308]: mismatched types in src/parse.rs\n".repeat(1_000)
        );
        let data = png_base64(1366, 768);
        let (text, screenshot) = match api {
            Api::Anthropic => (
                json!({"type": "text", "text": log}),
                json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}),
            ),
            Api::Chat => (
                json!({"type": "text", "text": log}),
                json!({"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{data}")}}),
            ),
        };
        let mut pasted = vec![text];
        pasted.extend(std::iter::repeat_n(screenshot, 6));
        match api {
            Api::Anthropic => {
                pasted.insert(0, result);
                messages.push(json!({"role": "user", "content": pasted}));
            }
            Api::Chat => {
                messages.push(result);
                messages.push(json!({"role": "user", "content": pasted}));
            }
        }
    }
    // Every call reached the model once, inside its window, the screenshots in the last.
    let requests = mock.requests();
    assert_eq!(requests.len(), 10, "no call was refused and sent again");
    for request in &requests {
        let sent = &request.body["messages"];
        let images = media_tokens(sent, api == Api::Anthropic);
        let text = without_media_data(sent).to_string().len() / 4;
        assert!(
            images + text + MAX_TOKENS <= WINDOW,
            "{images} + {text} tokens sent"
        );
        match api {
            Api::Anthropic => results_follow_their_calls(sent.as_array().unwrap()),
            Api::Chat => crate::proxy::no_orphans(sent.as_array().unwrap()),
        }
    }
    let last = &requests[9].body["messages"];
    let screenshot = match api {
        Api::Anthropic => 1_399,
        Api::Chat => 1_105,
    };
    assert_eq!(
        media_tokens(last, api == Api::Anthropic),
        6 * screenshot,
        "the person's screenshots reach the model beside their shortened text"
    );
    assert!(last.to_string().contains("characters cut here"), "{last}");
    if let Some(person) = person {
        crate::common::let_go(person, &daemon.client()).await;
    }
    daemon.log()
}

/// A person's screenshots beside a text too long for the step go upstream with the text's
/// head and tail: compactd counts them in what the message costs, so it compacts the steps
/// before and the model refuses nothing. (Counting the shortened text alone, the last call
/// went up at 17,300 tokens of a 16,000 window: the model refused it, and compactd compacted
/// and sent it once more.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn screenshots_beside_a_shortened_text_still_count() {
    let log = pasted_screenshots(Api::Anthropic, None).await;
    assert!(log.contains("compacted"), "{log}");
}

/// The same through Chat Completions: the screenshots stay in the message beside its
/// shortened text (they were dropped with the rest of its content), and count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_screenshots_beside_a_shortened_text_stay_and_count() {
    pasted_screenshots(Api::Chat, None).await;
}

/// The same while a person holds the write lock from the fourth step: the calls go up from
/// what is stored and what is newer, compacted in memory, and the screenshots count there too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn screenshots_beside_a_shortened_text_count_while_nothing_is_stored() {
    let log = pasted_screenshots(Api::Anthropic, Some(4)).await;
    assert!(log.contains("compacted in memory"), "{log}");
}
