//! The OpenAPI document: the checked-in `docs/openapi.json` is what the code generates, the
//! daemon serves it, and every real answer of every endpoint (errors and events included)
//! validates against the schema the document gives for it.

use crate::common::{TestDaemon, bash_round, user};
use compactd_api::client::Client;
use hyper::Method;
use serde_json::{Value, json};

#[test]
fn the_checked_in_document_is_the_generated_one() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/openapi.json");
    let checked_in = std::fs::read_to_string(path).unwrap();
    assert!(
        checked_in == compactd_daemon::openapi_pretty(),
        "docs/openapi.json is stale: regenerate it with `cargo run -- openapi > docs/openapi.json`"
    );
    let doc: Value = serde_json::from_str(&checked_in).unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
}

/// Validates answers against the document's schemas, made strict: an object schema with
/// declared properties accepts no others, so an undocumented field fails too.
struct Contract {
    doc: Value,
    components: Value,
}

impl Contract {
    fn new(doc: Value) -> Contract {
        let mut components = doc["components"].clone();
        // A schema another one extends with `allOf` stays open (each member sees only its own
        // properties); the one extending it is strict.
        let mut extended = Vec::new();
        all_of_refs(&doc, &mut extended);
        for (name, schema) in components["schemas"].as_object_mut().unwrap() {
            strict_in(schema, extended.contains(name));
        }
        Contract { doc, components }
    }

    /// The schema of `method path` answering `status` with `content_type`.
    fn schema(&self, method: &str, path: &str, status: u16, content_type: &str) -> Value {
        let response = &self.doc["paths"][path][method]["responses"][status.to_string()];
        assert!(
            !response.is_null(),
            "{method} {path} does not document {status}"
        );
        let mut schema = response["content"][content_type]["schema"].clone();
        assert!(
            !schema.is_null(),
            "{method} {path} {status}: no {content_type} schema"
        );
        strict(&mut schema);
        schema["components"] = self.components.clone();
        schema
    }

    fn check(&self, method: &str, path: &str, status: u16, body: &Value) {
        self.check_as(method, path, status, "application/json", body);
    }

    fn check_as(&self, method: &str, path: &str, status: u16, content_type: &str, body: &Value) {
        let schema = self.schema(method, path, status, content_type);
        let validator = jsonschema::validator_for(&schema).unwrap();
        let errors: Vec<String> = validator
            .iter_errors(body)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .collect();
        assert!(
            errors.is_empty(),
            "{method} {path} {status}: {errors:#?}\n{body:#}"
        );
    }
}

/// No undeclared properties: an object schema with declared properties (or one combining
/// them with `allOf`, which flattened types give) accepts no others. Members of an `allOf` are
/// left open, since each sees only its own properties.
fn strict(schema: &mut Value) {
    strict_in(schema, false);
}

fn strict_in(schema: &mut Value, member_of_all_of: bool) {
    if let Some(object) = schema.as_object_mut() {
        let declares = object.contains_key("properties") || object.contains_key("allOf");
        if declares && !member_of_all_of && !object.contains_key("additionalProperties") {
            object.insert("unevaluatedProperties".into(), Value::Bool(false));
        }
        for (key, value) in object.iter_mut() {
            if key == "allOf" {
                for member in value.as_array_mut().into_iter().flatten() {
                    strict_in(member, true);
                }
            } else {
                strict_in(value, false);
            }
        }
    } else if let Some(items) = schema.as_array_mut() {
        items.iter_mut().for_each(|v| strict_in(v, false));
    }
}

/// The component names referenced by `allOf` members anywhere in `schema`.
fn all_of_refs(schema: &Value, out: &mut Vec<String>) {
    if let Some(object) = schema.as_object() {
        for member in object
            .get("allOf")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(r) = member["$ref"].as_str() {
                out.push(r.trim_start_matches("#/components/schemas/").to_string());
            }
        }
        object.values().for_each(|v| all_of_refs(v, out));
    } else if let Some(items) = schema.as_array() {
        items.iter().for_each(|v| all_of_refs(v, out));
    }
}

/// `method path` (a real path), returning status and JSON body.
async fn call(client: &Client, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
    let bytes = body.map(|b| b.to_string()).unwrap_or_default();
    let answer = client.raw(method, path, bytes).await.unwrap();
    (answer.status.as_u16(), answer.json())
}

#[tokio::test]
async fn every_endpoint_answers_as_documented() {
    let daemon = TestDaemon::start("[compaction]\nmax_messages = 6\n");
    let client = daemon.client();
    let (status, doc) = call(&client, Method::GET, "/v1/openapi.json", None).await;
    assert_eq!(status, 200);
    assert_eq!(
        doc,
        compactd_daemon::openapi_document(),
        "served = generated"
    );
    let c = Contract::new(doc);
    let mut events = client.events().await.unwrap();

    let (s, b) = call(&client, Method::GET, "/v1/health", None).await;
    c.check("get", "/v1/health", s, &b);
    let (s, b) = call(
        &client,
        Method::POST,
        "/v1/session",
        Some(json!({"id": "doc", "model": "m", "context_limit": 32000, "config": {"max_messages": 6}})),
    )
    .await;
    assert_eq!(s, 201);
    c.check("post", "/v1/session", s, &b);
    let (s, b) = call(
        &client,
        Method::POST,
        "/v1/session",
        Some(json!({"id": "doc"})),
    )
    .await;
    assert_eq!(s, 409);
    c.check("post", "/v1/session", s, &b);
    let (s, b) = call(
        &client,
        Method::POST,
        "/v1/session",
        Some(json!({"id": "a b"})),
    )
    .await;
    assert_eq!(s, 400);
    c.check("post", "/v1/session", s, &b);

    // The three body forms of an append, then a compaction by count.
    let [call_msg, result_msg] = bash_round("c1", "cat a.py", "print(1)\n");
    let forms = [
        user("fix a.py"),
        json!([call_msg, result_msg]),
        json!({"messages": [user("go on")], "usage": {"input_tokens": 900}}),
    ];
    for form in forms {
        let (s, b) = call(&client, Method::POST, "/v1/session/doc/message", Some(form)).await;
        assert_eq!(s, 200, "{b}");
        c.check("post", "/v1/session/{id}/message", s, &b);
    }
    let mut more = vec![];
    for i in 0..4 {
        more.extend(bash_round(&format!("d{i}"), "ls", &"out\n".repeat(50)));
    }
    let (s, b) = call(
        &client,
        Method::POST,
        "/v1/session/doc/message",
        Some(json!({"messages": more, "wait": true})),
    )
    .await;
    assert_eq!(b["compaction"]["status"], "completed", "{b}");
    c.check("post", "/v1/session/{id}/message", s, &b);
    let (s, b) = call(
        &client,
        Method::POST,
        "/v1/session/doc/message",
        Some(json!({"role": "tool", "parts": [{"type": "tool_result", "call_id": "nope", "output": ""}]})),
    )
    .await;
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (400, Some("unknown_call"))
    );
    c.check("post", "/v1/session/{id}/message", s, &b);

    for path in ["/v1/session", "/v1/session/doc"] {
        let (s, b) = call(&client, Method::GET, path, None).await;
        c.check(
            "get",
            if path.ends_with("doc") {
                "/v1/session/{id}"
            } else {
                path
            },
            s,
            &b,
        );
    }
    let (s, b) = call(&client, Method::GET, "/v1/session/ghost", None).await;
    assert_eq!(s, 404);
    c.check("get", "/v1/session/{id}", s, &b);
    let (s, b) = call(
        &client,
        Method::PATCH,
        "/v1/session/doc",
        Some(json!({"model": "m2"})),
    )
    .await;
    c.check("patch", "/v1/session/{id}", s, &b);

    let (s, b) = call(
        &client,
        Method::GET,
        "/v1/session/doc/message?limit=3",
        None,
    )
    .await;
    assert!(b["next_after"].is_u64());
    c.check("get", "/v1/session/{id}/message", s, &b);
    let (s, b) = call(
        &client,
        Method::GET,
        "/v1/session/doc/message?limit=0",
        None,
    )
    .await;
    assert_eq!(s, 400);
    c.check("get", "/v1/session/{id}/message", s, &b);
    for (query, status) in [("?q=cat%20log", 200), ("?q=%22%28", 400)] {
        let path = format!("/v1/session/doc/search{query}");
        let (s, b) = call(&client, Method::GET, &path, None).await;
        assert_eq!(s, status, "{b}");
        c.check("get", "/v1/session/{id}/search", s, &b);
    }
    for format in ["", "?format=openai", "?format=anthropic"] {
        let (s, b) = call(
            &client,
            Method::GET,
            &format!("/v1/session/doc/context{format}"),
            None,
        )
        .await;
        assert_eq!(s, 200);
        assert!(b["compaction_num"].as_u64() >= Some(1));
        c.check("get", "/v1/session/{id}/context", s, &b);
    }
    let (s, b) = call(
        &client,
        Method::POST,
        "/v1/session/doc/summarize",
        Some(json!({"focus": "a.py"})),
    )
    .await;
    c.check("post", "/v1/session/{id}/summarize", s, &b);
    let (s, b) = call(
        &client,
        Method::GET,
        "/v1/session/doc/compaction?limit=1",
        None,
    )
    .await;
    assert!(!b["compactions"].as_array().unwrap().is_empty());
    c.check("get", "/v1/session/{id}/compaction", s, &b);

    // Events: the compaction's start and finish match the Event schema.
    let mut names = Vec::new();
    while !names.contains(&"compaction_finished".to_string()) {
        let (name, data) = tokio::time::timeout(std::time::Duration::from_secs(30), events.next())
            .await
            .expect("an event within 30 s")
            .expect("stream open")
            .unwrap();
        assert_eq!(data["event"], name.as_str());
        c.check_as("get", "/v1/events", 200, "text/event-stream", &data);
        names.push(name);
    }
    assert_eq!(names, ["compaction_started", "compaction_finished"]);

    let (s, b) = call(&client, Method::DELETE, "/v1/session/doc", None).await;
    c.check("delete", "/v1/session/{id}", s, &b);
    let (s, b) = call(&client, Method::DELETE, "/v1/session/doc", None).await;
    assert_eq!(s, 404);
    c.check("delete", "/v1/session/{id}", s, &b);
}

#[test]
fn docs_api_md_describes_every_endpoint_and_error_code() {
    let root = env!("CARGO_MANIFEST_DIR");
    let api = std::fs::read_to_string(format!("{root}/docs/API.md")).unwrap();
    let doc = compactd_daemon::openapi_document();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            let heading = format!("## {} {path}", method.to_uppercase());
            assert!(api.contains(&heading), "docs/API.md lacks `{heading}`");
        }
    }
    let codes = &doc["components"]["schemas"]["ErrorCode"]["enum"];
    for code in codes.as_array().unwrap() {
        let code = format!("`{}`", code.as_str().unwrap());
        assert!(
            api.contains(&code),
            "docs/API.md lacks the error code {code}"
        );
    }
}
