//! The JSON edit API (`POST /api/v1/docs/{name}/edits`, docs/api.md), on whichever database
//! the suite runs (SQLite, or PostgreSQL with `QUIRE_TEST_DATABASE=postgres`): every
//! operation on every root kind, read back through `GET /json` and by a fresh y-websocket
//! client; the preconditions; a malformed edit leaving the document byte for byte as it was;
//! Idempotency-Key; permissions; and a live client's edit racing the edit.

mod common;

use common::*;
use quire_server::app::{EditHold, TestHooks};
use quire_server::auth::Permission;
use reqwest::StatusCode;
use serde_json::{json, Value};
use yrs::updates::encoder::Encode;
use yrs::{
    Any, Array, Doc, GetString, Map, Out, StateVector, Text, Transact, Xml, XmlElementPrelim,
    XmlFragment, XmlOut, XmlTextPrelim,
};

const DOC: &str = "agent-notes";

fn ws(server: &TestServer, user: &str, perm: Permission) -> String {
    format!("{}?token={}", server.url(DOC), token(user, DOC, perm))
}

/// A secured server with `DOC` created, and the HTTP client.
async fn start(dir: &std::path::Path, hooks: TestHooks) -> (TestServer, reqwest::Client) {
    let server = TestServer::start_with_hooks(secured(dir), hooks).await;
    let http = reqwest::Client::new();
    let resp = http
        .post(api(&server, "/docs"))
        .bearer_auth(ADMIN)
        .json(&json!({"name": DOC}))
        .send()
        .await
        .expect("create");
    assert_eq!(resp.status(), StatusCode::CREATED);
    (server, http)
}

/// Writes the starting content as a live client (user "ann", client 1) would: `content`
/// (text), `meta` (map), `list` (array), `default` (a Tiptap fragment with one paragraph).
/// The client stays connected.
async fn seed(server: &TestServer) -> Client {
    let mut ann = Client::connect(&ws(server, "ann", Permission::Write), 1).await;
    let update = {
        let doc = &ann.doc;
        let text = doc.get_or_insert_text("content");
        let meta = doc.get_or_insert_map("meta");
        let list = doc.get_or_insert_array("list");
        let xml = doc.get_or_insert_xml_fragment("default");
        let mut txn = doc.transact_mut();
        text.insert(&mut txn, 0, "old words and more old words");
        meta.insert(&mut txn, "status", "review");
        meta.insert(&mut txn, "stale", true);
        list.insert_range(&mut txn, 0, [1, 2, 3]);
        let p = xml.push_back(&mut txn, XmlElementPrelim::empty("paragraph"));
        p.push_back(&mut txn, XmlTextPrelim::new("first old paragraph"));
        txn.encode_update_v1()
    };
    ann.send_update(&update).await;
    ann.durable_ack(1).await;
    ann
}

async fn edit(
    http: &reqwest::Client,
    server: &TestServer,
    bearer: &str,
    body: &Value,
) -> (StatusCode, Value) {
    let resp = http
        .post(api(server, &format!("/docs/{DOC}/edits")))
        .bearer_auth(bearer)
        .json(body)
        .send()
        .await
        .expect("post edits");
    let status = resp.status();
    if status != StatusCode::OK {
        assert_eq!(
            resp.headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok()),
            Some("application/problem+json"),
            "errors are problem+json"
        );
    }
    (status, resp.json().await.unwrap_or(Value::Null))
}

fn writer() -> String {
    token("bot", DOC, Permission::Write)
}

async fn get_json(http: &reqwest::Client, server: &TestServer) -> Value {
    let resp = http
        .get(api(server, &format!("/docs/{DOC}/json")))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("json");
    assert_eq!(resp.status(), StatusCode::OK);
    resp.json().await.expect("json body")
}

/// The document's whole state (`GET /update`) and its log position (the newest session's
/// last position in `GET /history`).
async fn snapshot(http: &reqwest::Client, server: &TestServer) -> (Vec<u8>, i64) {
    let resp = http
        .get(api(server, &format!("/docs/{DOC}/update")))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("update");
    assert_eq!(resp.status(), StatusCode::OK);
    let state = resp.bytes().await.expect("bytes").to_vec();
    let history: Value = http
        .get(api(server, &format!("/docs/{DOC}/history")))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("history")
        .json()
        .await
        .expect("json");
    let seq = history["items"][0]["last_seq"].as_i64().unwrap_or(0);
    (state, seq)
}

/// A fresh y-websocket client of the document (a reader), synced.
async fn fresh(server: &TestServer) -> Client {
    Client::connect(&ws(server, "reader", Permission::Read), 900).await
}

fn text_of(doc: &Doc, root: &str) -> String {
    let t = doc.get_or_insert_text(root);
    let s = t.get_string(&doc.transact());
    s
}

/// The top-level nodes of an XML root: (type, `level` attribute, text).
fn nodes_of(doc: &Doc, root: &str) -> Vec<(String, Option<Out>, String)> {
    let xml = doc.get_or_insert_xml_fragment(root);
    let txn = doc.transact();
    xml.children(&txn)
        .filter_map(|node| match node {
            XmlOut::Element(e) => {
                let text: String = e
                    .children(&txn)
                    .filter_map(|c| match c {
                        XmlOut::Text(t) => Some(t.get_string(&txn)),
                        _ => None,
                    })
                    .collect();
                Some((e.tag().to_string(), e.get_attribute(&txn, "level"), text))
            }
            _ => None,
        })
        .collect()
}

fn b64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_on_every_root_kind_reaches_the_json_and_every_client() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (server, http) = start(dir.path(), TestHooks::default()).await;
    let mut ann = seed(&server).await;

    let body = json!({"ops": [
        {"text": "content", "replace": "old words", "with": "new words"},
        {"text": "content", "insert": "» ", "at": 0},
        {"text": "content", "insert": "!"},
        {"text": "content", "delete": 5, "at": 16},
        {"text": "content", "replace": "o", "with": "0", "all": true},
        {"map": "meta", "set": "status", "value": "draft"},
        {"map": "meta", "set": "reviewers", "value": ["ann", {"bot": 2}]},
        {"map": "meta", "delete": "stale"},
        {"array": "list", "insert": ["zero"], "at": 0},
        {"array": "list", "delete": 1, "at": 2},
        {"array": "list", "push": [4, {"five": 5}]},
        {"xml": "default", "insert": {"type": "heading", "attrs": {"level": 2}, "text": "Plan"}, "at": 0},
        {"xml": "default", "append": {"type": "paragraph", "text": "second old paragraph"}},
        {"xml": "default", "replace": "old", "with": "new", "element": 2}
    ]});
    let (status, answer) = edit(&http, &server, &writer(), &body).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let changes: Vec<(u64, u64, u64)> = answer["changes"]
        .as_array()
        .expect("changes")
        .iter()
        .map(|c| {
            let n = |k: &str| c[k].as_u64().expect("count");
            (n("inserted"), n("deleted"), n("replaced"))
        })
        .collect();
    assert_eq!(
        changes,
        vec![
            (9, 9, 1),
            (2, 0, 0),
            (1, 0, 0),
            (0, 5, 0),
            (3, 3, 3),
            (1, 1, 0),
            (1, 0, 0),
            (0, 1, 0),
            (1, 0, 0),
            (0, 1, 0),
            (2, 0, 0),
            (1, 0, 0),
            (1, 0, 0),
            (3, 3, 1),
        ]
    );
    assert!(answer["seq"].as_i64().expect("seq") > 1);

    let content = "» new w0rds and 0ld w0rds!";
    let json = get_json(&http, &server).await;
    assert_eq!(json["content"], content);
    assert_eq!(
        json["meta"],
        json!({"status": "draft", "reviewers": ["ann", {"bot": 2}]})
    );
    assert_eq!(json["list"], json!(["zero", 1, 3, 4, {"five": 5}]));
    // (`GET /json` reads an XML root filled by clients, which declare no type, as the list
    // of its nodes.)
    let xml = match &json["default"] {
        Value::String(s) => s.clone(),
        Value::Array(nodes) => nodes.iter().filter_map(Value::as_str).collect(),
        other => panic!("the XML root as JSON: {other}"),
    };
    assert!(xml.contains("Plan</heading>"), "{xml}");
    assert!(
        xml.contains("<paragraph>first old paragraph</paragraph>"),
        "{xml}"
    );
    assert!(
        xml.contains("<paragraph>second new paragraph</paragraph>"),
        "{xml}"
    );

    // A fresh client reads the same, the heading's level a number as y-prosemirror writes
    // it; the state vector answered is the document's.
    let reader = fresh(&server).await;
    assert_eq!(text_of(&reader.doc, "content"), content);
    assert_eq!(
        nodes_of(&reader.doc, "default"),
        vec![
            (
                "heading".into(),
                Some(Out::Any(Any::from(2))),
                "Plan".into()
            ),
            ("paragraph".into(), None, "first old paragraph".into()),
            ("paragraph".into(), None, "second new paragraph".into()),
        ]
    );
    {
        let meta = reader.doc.get_or_insert_map("meta");
        let list = reader.doc.get_or_insert_array("list");
        let txn = reader.doc.transact();
        assert_eq!(meta.get(&txn, "status"), Some(Out::Any(Any::from("draft"))));
        assert_eq!(list.len(&txn), 5);
    }
    assert_eq!(
        answer["state_vector"],
        b64(&reader.state_vector().encode_v1())
    );
    // The live client got the edit as a broadcast.
    let arrived = ann
        .pump_until(PATIENCE, |c| text_of(&c.doc, "content") == content)
        .await;
    assert!(arrived, "the live client has the edit");

    // Attributed to the caller in the history.
    let history: Value = http
        .get(api(&server, &format!("/docs/{DOC}/history")))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("history")
        .json()
        .await
        .expect("json");
    let authors: Vec<&str> = history["items"][0]["authors"]
        .as_array()
        .expect("authors")
        .iter()
        .filter_map(|a| a["author"].as_str())
        .collect();
    assert!(authors.contains(&"bot"), "{history}");
    reader.close().await;
    ann.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_precondition_is_409_and_changes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (server, http) = start(dir.path(), TestHooks::default()).await;
    let ann = seed(&server).await;
    let bot = writer();

    // if_contains holds: applied; the answer's state vector is where the document is.
    let (status, first) = edit(
        &http,
        &server,
        &bot,
        &json!({"ops": [{"text": "content", "insert": "."}],
                "if_contains": [{"text": "content", "value": "more old"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let sv = first["state_vector"].as_str().expect("sv").to_owned();
    // The same state vector: applied.
    let (status, second) = edit(
        &http,
        &server,
        &bot,
        &json!({"ops": [{"text": "content", "insert": "."}], "state_vector": sv}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{second}");

    let before = snapshot(&http, &server).await;
    let refused = [
        // Text no longer there.
        (
            json!({"ops": [{"text": "content", "insert": "x"}],
                   "if_contains": [{"text": "content", "value": "more old"}, {"xml": "default", "value": "absent"}]}),
            json!({"if_contains": 1}),
        ),
        // A state vector the document has moved past (the second edit).
        (
            json!({"ops": [{"text": "content", "insert": "x"}], "state_vector": sv}),
            json!({"state_vector": second["state_vector"]}),
        ),
        // A replace that finds nothing, after operations that would apply.
        (
            json!({"ops": [{"map": "meta", "set": "a", "value": 1},
                           {"text": "content", "replace": "no such words", "with": "x"}]}),
            json!({"op": 1}),
        ),
    ];
    for (body, current) in refused {
        let (status, problem) = edit(&http, &server, &bot, &body).await;
        assert_eq!(status, StatusCode::CONFLICT, "{body}: {problem}");
        assert!(
            problem["type"]
                .as_str()
                .is_some_and(|t| t.ends_with("/precondition-failed")),
            "{problem}"
        );
        assert_eq!(problem["current"], current, "{problem}");
    }
    assert_eq!(
        snapshot(&http, &server).await,
        before,
        "nothing was applied"
    );
    ann.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_edit_names_the_operation_and_leaves_the_document_byte_for_byte() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (server, http) = start(dir.path(), TestHooks::default()).await;
    let mut ann = seed(&server).await;
    let before = snapshot(&http, &server).await;
    let good = json!({"text": "content", "insert": "applied?"});
    let cases = [
        // Malformed on its face: an unknown key.
        (
            json!({"ops": [good, {"map": "meta", "set": "k", "value": 1, "at": 3}, good]}),
            1,
            "unknown key \"at\"",
        ),
        // Out of range once the operations before it applied.
        (
            json!({"ops": [good, good, {"text": "content", "delete": 10, "at": 40}, good]}),
            2,
            "past the text's end",
        ),
        // A root of another kind than the document holds.
        (
            json!({"ops": [good, {"array": "meta", "push": [1]}]}),
            1,
            "root \"meta\" is a map, not an array",
        ),
        // The wrong JSON type.
        (
            json!({"ops": [good, {"xml": "default", "append": {"type": "paragraph", "text": 7}}]}),
            1,
            "\"text\" must be a string",
        ),
    ];
    for (body, op, reason) in cases {
        let (status, problem) = edit(&http, &server, &writer(), &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {problem}");
        assert!(
            problem["type"]
                .as_str()
                .is_some_and(|t| t.ends_with("/invalid-edit")),
            "{problem}"
        );
        assert_eq!(problem["current"], json!({ "op": op }), "{problem}");
        let detail = problem["detail"].as_str().unwrap_or("");
        assert!(detail.starts_with(&format!("op {op}: ")), "{detail}");
        assert!(detail.contains(reason), "{detail} (wanted {reason})");
    }
    // Not JSON operations at all.
    let (status, problem) = edit(&http, &server, &writer(), &json!({"ops": "all"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{problem}");
    assert_eq!(
        snapshot(&http, &server).await,
        before,
        "the document is byte for byte as it was, at the same log position"
    );
    // Nothing reached the live client either.
    let quiet = ann
        .pump_until(std::time::Duration::from_millis(300), |c| {
            c.updates_received > 0
        })
        .await;
    assert!(!quiet, "no update was broadcast");
    ann.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_with_the_same_idempotency_key_applies_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (server, http) = start(dir.path(), TestHooks::default()).await;
    let ann = seed(&server).await;
    let body = json!({"ops": [{"text": "content", "insert": " +1"}]});
    let send = |key: Option<&'static str>| {
        let mut req = http
            .post(api(&server, &format!("/docs/{DOC}/edits")))
            .bearer_auth(writer())
            .json(&body);
        if let Some(key) = key {
            req = req.header("Idempotency-Key", key);
        }
        async move {
            let resp = req.send().await.expect("send");
            assert_eq!(resp.status(), StatusCode::OK);
            resp.json::<Value>().await.expect("json")
        }
    };
    let first = send(Some("agent-step-1")).await;
    let again = send(Some("agent-step-1")).await;
    assert_eq!(first, again, "the stored answer is replayed");
    let json = get_json(&http, &server).await;
    assert_eq!(json["content"], "old words and more old words +1");
    // Without the key, a repeat is another edit.
    send(None).await;
    let json = get_json(&http, &server).await;
    assert_eq!(json["content"], "old words and more old words +1 +1");
    ann.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_cannot_edit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (server, http) = start(dir.path(), TestHooks::default()).await;
    let ann = seed(&server).await;
    let before = snapshot(&http, &server).await;
    let body = json!({"ops": [{"text": "content", "insert": "x"}]});
    let reader = token("reader", DOC, Permission::Read);
    let (status, problem) = edit(&http, &server, &reader, &body).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{problem}");
    let resp = http
        .post(api(&server, &format!("/docs/{DOC}/edits")))
        .json(&body)
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    // A token for another document does not see this one.
    let other = token("bot", "elsewhere", Permission::Write);
    let (status, _) = edit(&http, &server, &other, &body).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(snapshot(&http, &server).await, before);
    ann.close().await;
    server.stop().await;
}

/// A live client's edit lands between the request's arrival and its turn in the room (the
/// test hook holds the edit there): the room makes the edit on the state it lands on, Ann's
/// edit included, its precondition checked there, and both edits are in the document. The
/// answer's state vector is the document's after both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_edit_racing_the_edit_ends_with_both() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hold = std::sync::Arc::new(EditHold::default());
    let hooks = TestHooks {
        edit_hold: Some(hold.clone()),
        ..TestHooks::default()
    };
    let (server, http) = start(dir.path(), hooks).await;
    let mut ann = seed(&server).await;
    let body = json!({"ops": [{"text": "content", "replace": "more", "with": "many more"}],
                      "if_contains": [{"text": "content", "value": "old words and"}]});
    let request = http
        .post(api(&server, &format!("/docs/{DOC}/edits")))
        .bearer_auth(writer())
        .json(&body)
        .send();
    let request = tokio::spawn(request);
    tokio::time::timeout(PATIENCE, hold.reached.notified())
        .await
        .expect("the edit is held");
    // Ann types at the start meanwhile, and it is committed.
    let update = {
        let text = ann.doc.get_or_insert_text("content");
        let mut txn = ann.doc.transact_mut();
        text.insert(&mut txn, 0, "Ann: ");
        txn.encode_update_v1()
    };
    ann.send_update(&update).await;
    ann.durable_ack(2).await;
    hold.resume.notify_one();
    let resp = request.await.expect("task").expect("send");
    assert_eq!(resp.status(), StatusCode::OK);
    let answer: Value = resp.json().await.expect("json");

    let reader = fresh(&server).await;
    assert_eq!(
        text_of(&reader.doc, "content"),
        "Ann: old words and many more old words"
    );
    assert_eq!(
        answer["state_vector"],
        b64(&reader.state_vector().encode_v1()),
        "made on the state with Ann's edit"
    );
    reader.close().await;
    ann.close().await;
    server.stop().await;
}

/// The same race without a precondition, with an index: the index counts in the state the
/// edit lands on (Ann's insert at 0 came first, so the edit's insert at 0 goes before it),
/// as any edit made on the document would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_indexes_into_the_state_it_lands_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hold = std::sync::Arc::new(EditHold::default());
    let hooks = TestHooks {
        edit_hold: Some(hold.clone()),
        ..TestHooks::default()
    };
    let (server, http) = start(dir.path(), hooks).await;
    let mut ann = seed(&server).await;
    let body = json!({"ops": [{"text": "content", "insert": "Bot: ", "at": 0}]});
    let request = http
        .post(api(&server, &format!("/docs/{DOC}/edits")))
        .bearer_auth(writer())
        .json(&body)
        .send();
    let request = tokio::spawn(request);
    tokio::time::timeout(PATIENCE, hold.reached.notified())
        .await
        .expect("the edit is held");
    let update = {
        let text = ann.doc.get_or_insert_text("content");
        let mut txn = ann.doc.transact_mut();
        text.insert(&mut txn, 0, "Ann: ");
        txn.encode_update_v1()
    };
    ann.send_update(&update).await;
    ann.durable_ack(2).await;
    hold.resume.notify_one();
    let resp = request.await.expect("task").expect("send");
    assert_eq!(resp.status(), StatusCode::OK);
    let answer: Value = resp.json().await.expect("json");
    let reader = fresh(&server).await;
    assert_eq!(
        text_of(&reader.doc, "content"),
        "Bot: Ann: old words and more old words"
    );
    assert_eq!(
        answer["state_vector"],
        b64(&reader.state_vector().encode_v1()),
        "made on the state it landed on"
    );
    reader.close().await;
    ann.close().await;
    server.stop().await;
}

/// The same race, but Ann's edit breaks the precondition: checked on the state the edit lands
/// on, it no longer holds and the edit is refused (409); blind, it would have been applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_precondition_broken_by_a_racing_edit_refuses_the_edit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hold = std::sync::Arc::new(EditHold::default());
    let hooks = TestHooks {
        edit_hold: Some(hold.clone()),
        ..TestHooks::default()
    };
    let (server, http) = start(dir.path(), hooks).await;
    let mut ann = seed(&server).await;
    let body = json!({"ops": [{"text": "content", "insert": " (checked)"}],
                      "if_contains": [{"text": "content", "value": "and more"}]});
    let request = http
        .post(api(&server, &format!("/docs/{DOC}/edits")))
        .bearer_auth(writer())
        .json(&body)
        .send();
    let request = tokio::spawn(request);
    tokio::time::timeout(PATIENCE, hold.reached.notified())
        .await
        .expect("the edit is held");
    // Ann deletes "and more " ("old words " is 10 units).
    let update = {
        let text = ann.doc.get_or_insert_text("content");
        let mut txn = ann.doc.transact_mut();
        text.remove_range(&mut txn, 10, 9);
        txn.encode_update_v1()
    };
    ann.send_update(&update).await;
    ann.durable_ack(2).await;
    hold.resume.notify_one();
    let resp = request.await.expect("task").expect("send");
    assert_eq!(resp.status(), StatusCode::CONFLICT);
    let reader = fresh(&server).await;
    assert_eq!(text_of(&reader.doc, "content"), "old words old words");
    // And a state vector held by the caller is never recomputed: it is refused at once.
    let sv = b64(&StateVector::default().encode_v1());
    let (status, problem) = edit(
        &http,
        &server,
        &writer(),
        &json!({"ops": [{"text": "content", "insert": "x"}], "state_vector": sv}),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{problem}");
    reader.close().await;
    ann.close().await;
    server.stop().await;
}

/// An agent's edits continue one client id in the document, assigned by the server: a
/// hundred edits (and retries of none) leave the state vector one entry longer, the stored
/// rows attribute them to the agent, and a second author gets a client of their own. Before,
/// every edit took a new random client id, so an agent's every call added a client forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_authors_edits_add_one_client_to_the_document() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (server, http) = start(dir.path(), TestHooks::default()).await;
    let ann = seed(&server).await;
    for i in 0..100 {
        let body = json!({"ops": [{"text": "content", "insert": format!(" {i}")}]});
        let (status, answer) = edit(&http, &server, &writer(), &body).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
    }
    let reader = fresh(&server).await;
    let sv = reader.state_vector();
    assert_eq!(sv.len(), 2, "ann's client and the agent's: {sv:?}");
    let other = token("eve", DOC, Permission::Write);
    let body = json!({"ops": [{"map": "meta", "set": "by", "value": "eve"}]});
    let (status, answer) = edit(&http, &server, &other, &body).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    reader.close().await;
    let reader = fresh(&server).await;
    assert_eq!(
        reader.state_vector().len(),
        3,
        "eve's edit has a client of its own"
    );
    // The document's history names the agent once per session, not per client.
    let history = http
        .get(api(&server, &format!("/docs/{DOC}/history")))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("history");
    let history: Value = history.json().await.expect("json");
    assert!(history.to_string().contains("bot"), "{history}");
    reader.close().await;
    ann.close().await;
    server.stop().await;
}

/// The example agent (examples/agent-edits.sh, bash and curl) proposes its edits on a branch:
/// the document is untouched, the branch holds them as one open change by the agent, and
/// merging it brings them to the document.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_agent_proposes_its_edits_on_a_branch_for_review() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(test_config(dir.path())).await;
    let http = reqwest::Client::new();
    let api = |path: &str| server.http(&format!("/api/v1{path}"));
    let resp = http
        .post(api("/docs"))
        .json(&json!({"name": "plan"}))
        .send()
        .await
        .expect("create");
    assert_eq!(resp.status(), StatusCode::CREATED);
    let resp = http
        .post(api("/docs/plan/edits"))
        .json(&json!({"ops": [{"text": "content", "insert": "The plan is old words here."}]}))
        .send()
        .await
        .expect("edit");
    assert_eq!(resp.status(), StatusCode::OK);
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/agent-edits.sh");
    let base = server.http("");
    let out = tokio::process::Command::new("bash")
        .arg(&script)
        .arg("plan")
        .env("QUIRE_URL", base.trim_end_matches('/'))
        .env("AGENT_BRANCH", "plan-agent")
        .output()
        .await
        .expect("run the example");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json = |path: &'static str| {
        let http = http.clone();
        let url = api(path);
        async move {
            http.get(url)
                .send()
                .await
                .expect("get")
                .json::<Value>()
                .await
                .expect("json")
        }
    };
    assert_eq!(
        json("/docs/plan/json").await["content"],
        "The plan is old words here."
    );
    let changes = json("/docs/plan-agent/changes").await;
    let list = changes["changes"].as_array().expect("changes");
    assert_eq!(list.len(), 1, "{changes}");
    assert_eq!(list[0]["state"], "open");
    let branch_text = json("/docs/plan-agent/json").await["content"].clone();
    assert_ne!(branch_text, "The plan is old words here.");
    // Every open change, with the change list's ETag: what the reviewer saw is what merges.
    let listed = http
        .get(api("/docs/plan-agent/changes"))
        .send()
        .await
        .expect("changes");
    let tag = listed.headers()["etag"].to_str().expect("etag").to_owned();
    let resp = http
        .post(api("/docs/plan-agent/merge"))
        .header("if-match", tag)
        .send()
        .await
        .expect("merge");
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(json("/docs/plan/json").await["content"], branch_text);
}
