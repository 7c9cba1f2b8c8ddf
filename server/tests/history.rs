//! Version history (docs/history.md), on whichever database the suite runs (SQLite, or
//! PostgreSQL with `QUIRE_TEST_DATABASE=postgres`): attributed sessions, automatic and named
//! versions, content at a position or a time, diffs with authors, restore as a forward change
//! that concurrent and offline clients merge, fork, retention and its prune job.
//! Content is checked with fresh clients or the API, never with the clients that wrote it.

mod common;

use std::time::Duration;

use common::*;
use quire_server::auth::Permission;
use reqwest::StatusCode;
use serde_json::{json, Value};

/// A secured server whose editing sessions end after `idle` without an edit.
async fn start(dir: &std::path::Path, idle: Duration) -> TestServer {
    let mut cfg = secured(dir);
    cfg.room.history.version_idle = idle;
    TestServer::start(cfg).await
}

fn ws(server: &TestServer, doc: &str, user: &str, perm: Permission) -> String {
    format!("{}?token={}", server.url(doc), token(user, doc, perm))
}

async fn get(http: &reqwest::Client, server: &TestServer, path: &str) -> (StatusCode, Value) {
    let resp = http
        .get(api(server, path))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("get");
    let status = resp.status();
    (status, resp.json().await.unwrap_or(Value::Null))
}

async fn post(
    http: &reqwest::Client,
    server: &TestServer,
    path: &str,
    bearer: &str,
    body: Value,
) -> (StatusCode, Value) {
    let resp = http
        .post(api(server, path))
        .bearer_auth(bearer)
        .json(&body)
        .send()
        .await
        .expect("post");
    let status = resp.status();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// Polls the versions list until `done` holds (automatic versions are written by the room).
async fn versions_until(
    http: &reqwest::Client,
    server: &TestServer,
    doc: &str,
    done: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    for _ in 0..200 {
        let (status, list) = get(http, server, &format!("/docs/{doc}/versions")).await;
        assert_eq!(status, StatusCode::OK, "{list}");
        let list = list.as_array().cloned().unwrap_or_default();
        if done(&list) {
            return list;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("versions never matched");
}

/// What a fresh client reads of the document's text.
async fn fresh_text(server: &TestServer, doc: &str) -> String {
    let url = format!(
        "{}?token={}",
        server.url(doc),
        token("reader", "*", Permission::Read)
    );
    let c = Client::connect(&url, 900).await;
    let text = c.text();
    c.close().await;
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_edit_is_attributed_and_the_history_groups_editing_sessions() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start(dir.path(), Duration::from_millis(400)).await;
    let http = reqwest::Client::new();

    let mut ann = Client::connect(&ws(&server, "notes", "ann", Permission::Write), 1).await;
    ann.insert(0, "hello").await;
    ann.insert(5, " world").await;
    ann.durable_ack(1).await;
    // A pause longer than version_idle: the next edits are another session.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let mut bob = Client::connect(&ws(&server, "notes", "bob", Permission::Write), 2).await;
    bob.insert(11, "!").await;
    bob.durable_ack(1).await;

    let (status, page) = get(&http, &server, "/docs/notes/history").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let items = page["items"].as_array().expect("items");
    assert_eq!(items.len(), 2, "two sessions: {page}");
    // Newest first: bob's, then ann's.
    assert_eq!(items[0]["authors"][0]["author"], "bob");
    assert_eq!(items[0]["updates"], 1);
    assert_eq!(items[0]["inserted"], 1);
    assert_eq!(items[1]["authors"][0]["author"], "ann");
    assert_eq!(items[1]["updates"], 2);
    assert_eq!(items[1]["inserted"], 11);
    assert_eq!(
        (
            items[1]["first_seq"].as_i64(),
            items[1]["last_seq"].as_i64()
        ),
        (Some(1), Some(2))
    );
    assert!(page["next_cursor"].is_null());

    // One session per page: the cursor leads to the older one.
    let (_, first) = get(&http, &server, "/docs/notes/history?limit=1").await;
    assert_eq!(first["items"][0]["authors"][0]["author"], "bob");
    let cursor = first["next_cursor"].as_str().expect("cursor");
    let (_, second) = get(
        &http,
        &server,
        &format!("/docs/notes/history?limit=1&cursor={cursor}"),
    )
    .await;
    assert_eq!(second["items"][0]["authors"][0]["author"], "ann");
    assert!(second["next_cursor"].is_null());

    // The session's end made an automatic version, attributed to its last author.
    let versions = versions_until(&http, &server, "notes", |v| !v.is_empty()).await;
    assert_eq!(versions[0]["kind"], "auto");
    assert_eq!(versions[0]["author"], "ann");
    assert_eq!(versions[0]["seq"], 2);

    // Every item is attributed: the diff from ann's version to now names bob's "!" and
    // ann's text (through the client ids each introduced).
    let v = versions[0]["id"].as_i64().expect("id");
    let (status, diff) = get(&http, &server, &format!("/docs/notes/diff?from={v}")).await;
    assert_eq!(status, StatusCode::OK, "{diff}");
    assert_eq!(
        diff["texts"][0]["runs"],
        json!([
            {"kind": "kept", "text": "hello world", "author": null},
            {"kind": "inserted", "text": "!", "author": "bob"},
        ])
    );
    ann.close().await;
    bob.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_at_any_position_or_time_and_at_each_version() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start(dir.path(), Duration::from_millis(300)).await;
    let http = reqwest::Client::new();
    let mut ann = Client::connect(&ws(&server, "plan", "ann", Permission::Write), 1).await;
    ann.insert(0, "one").await;
    ann.durable_ack(1).await;
    let auto = versions_until(&http, &server, "plan", |v| !v.is_empty()).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let between = std::time::SystemTime::now();
    tokio::time::sleep(Duration::from_millis(20)).await;
    ann.insert(3, " two").await;
    ann.insert(7, " three").await;
    ann.durable_ack(2).await;

    let at_position = |n: i64| format!("/docs/plan/json?at_position={n}");
    assert_eq!(
        get(&http, &server, &at_position(0)).await.1["text"],
        Value::Null
    );
    assert_eq!(get(&http, &server, &at_position(1)).await.1["text"], "one");
    assert_eq!(
        get(&http, &server, &at_position(2)).await.1["text"],
        "one two"
    );
    assert_eq!(
        get(&http, &server, &at_position(3)).await.1["text"],
        "one two three"
    );
    let (status, body) = get(&http, &server, &at_position(4)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body["type"]
        .as_str()
        .unwrap_or("")
        .ends_with("/position-out-of-range"));

    let time = humantime::format_rfc3339_millis(between).to_string();
    let (status, then) = get(&http, &server, &format!("/docs/plan/json?at={time}")).await;
    assert_eq!(status, StatusCode::OK, "{then}");
    assert_eq!(then["text"], "one");
    let (status, bad) = get(&http, &server, "/docs/plan/json?at=yesterday").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");

    let id = auto[0]["id"].as_i64().expect("id");
    let (status, content) = get(&http, &server, &format!("/docs/plan/versions/{id}/json")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(content, json!({"text": "one"}));
    let (status, _) = get(&http, &server, "/docs/plan/versions/999999/json").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    ann.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_versions_are_created_listed_and_deleted_with_permissions_and_idempotency() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start(dir.path(), Duration::from_secs(600)).await;
    let http = reqwest::Client::new();
    let mut ann = Client::connect(&ws(&server, "spec", "ann", Permission::Write), 1).await;
    ann.insert(0, "draft").await;
    ann.durable_ack(1).await;

    let writer = token("ann", "spec", Permission::Write);
    let body = json!({"label": "first draft"});
    let send = |key: &'static str| {
        http.post(api(&server, "/docs/spec/versions"))
            .bearer_auth(&writer)
            .header("idempotency-key", key)
            .json(&body)
            .send()
    };
    let first = send("v-1").await.expect("post");
    assert_eq!(first.status(), StatusCode::CREATED);
    let first: Value = first.json().await.expect("json");
    assert_eq!(first["label"], "first draft");
    assert_eq!(first["kind"], "named");
    assert_eq!(first["author"], "ann");
    // The same key: the same version, not a second one.
    let again: Value = send("v-1").await.expect("post").json().await.expect("json");
    assert_eq!(again["id"], first["id"]);
    let (_, list) = get(&http, &server, "/docs/spec/versions").await;
    assert_eq!(list.as_array().map(Vec::len), Some(1), "{list}");

    let reader = token("rita", "spec", Permission::Read);
    let (status, _) = post(&http, &server, "/docs/spec/versions", &reader, body.clone()).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let outsider = token("olga", "other", Permission::Write);
    let (status, _) = post(
        &http,
        &server,
        "/docs/spec/versions",
        &outsider,
        body.clone(),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = post(
        &http,
        &server,
        "/docs/spec/versions",
        &writer,
        json!({"label": ""}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    let id = first["id"].as_i64().expect("id");
    let url = api(&server, &format!("/docs/spec/versions/{id}"));
    // Another writer may not delete a version someone else named; its author may.
    let other_writer = token("bo", "spec", Permission::Write);
    let refused = http
        .delete(&url)
        .bearer_auth(&other_writer)
        .send()
        .await
        .expect("delete");
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    let deleted = http
        .delete(&url)
        .bearer_auth(&writer)
        .send()
        .await
        .expect("delete");
    assert_eq!(deleted.status(), StatusCode::NO_CONTENT);
    let gone = http
        .delete(&url)
        .bearer_auth(&writer)
        .send()
        .await
        .expect("delete");
    assert_eq!(gone.status(), StatusCode::NOT_FOUND);
    let (_, list) = get(&http, &server, "/docs/spec/versions").await;
    assert_eq!(list, json!([]));
    ann.close().await;
    server.stop().await;
}

/// A restore is a forward change: committed, broadcast, attributed to the caller, recorded
/// as a version. A client typing while it happens and a client offline during it (with
/// edits of its own) converge on the restored text plus their own edits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_is_a_new_change_that_live_and_offline_clients_merge() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start(dir.path(), Duration::from_secs(600)).await;
    let http = reqwest::Client::new();
    let writer = token("ann", "essay", Permission::Write);
    let mut ann = Client::connect(&ws(&server, "essay", "ann", Permission::Write), 1).await;
    ann.insert(0, "The cat sat.").await;
    ann.durable_ack(1).await;
    let (status, v1) = post(
        &http,
        &server,
        "/docs/essay/versions",
        &writer,
        json!({"label": "v1"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{v1}");
    let v1 = v1["id"].as_i64().expect("id");

    // Bob goes offline with the document as it is, and edits it offline at its start.
    let mut bob = Client::connect(&ws(&server, "essay", "bob", Permission::Write), 2).await;
    bob.sync().await;
    let offline_doc = bob.doc.clone();
    bob.close().await;
    // Meanwhile the cat's sentence is rewritten.
    ann.insert(4, "big ").await; // "The big cat sat."
    ann.insert(16, " It purred.").await;
    ann.durable_ack(2).await;
    assert_eq!(
        fresh_text(&server, "essay").await,
        "The big cat sat. It purred."
    );

    // Carl types at the end while the restore happens: his edit is made before he sees the
    // restore and reaches the server after it (what the restore did not see, it keeps).
    let mut carl = Client::connect(&ws(&server, "essay", "carl", Permission::Write), 3).await;
    let typed = {
        use yrs::{Text, Transact};
        let text = carl.doc.get_or_insert_text("text");
        let mut txn = carl.doc.transact_mut();
        let end = text.len(&txn);
        text.insert(&mut txn, end, " [carl]");
        txn.encode_update_v1()
    };
    let restore_path = format!("/docs/essay/versions/{v1}/restore");
    let (status, restored) = post(&http, &server, &restore_path, &writer, json!({})).await;
    assert_eq!(status, StatusCode::OK, "{restored}");
    carl.send_update(&typed).await;
    carl.durable_ack(3).await;
    assert_eq!(restored["version"]["kind"], "restore");
    assert_eq!(restored["version"]["author"], "ann");

    // Bob comes back with his offline edit.
    let mut bob =
        Client::connect_with_doc(&ws(&server, "essay", "bob", Permission::Write), offline_doc)
            .await;
    bob.insert(0, ">> ").await;
    bob.durable_ack(4).await;

    let expected = ">> The cat sat. [carl]";
    assert_eq!(fresh_text(&server, "essay").await, expected);
    // The live clients converged too.
    for c in [&mut ann, &mut carl, &mut bob] {
        let ok = c
            .pump_until(Duration::from_secs(5), |c| c.text() == expected)
            .await;
        assert!(ok, "a live client has {:?}", c.text());
    }
    // The restore is in the history as ann's change.
    let (_, page) = get(&http, &server, "/docs/essay/history").await;
    let authors: Vec<&str> = page["items"][0]["authors"]
        .as_array()
        .expect("authors")
        .iter()
        .filter_map(|a| a["author"].as_str())
        .collect();
    assert!(
        authors.contains(&"ann") && authors.contains(&"bob") && authors.contains(&"carl"),
        "{page}"
    );
    // The restore version holds the restored content (with what was committed with it).
    let rid = restored["version"]["id"].as_i64().expect("id");
    let (_, content) = get(&http, &server, &format!("/docs/essay/versions/{rid}/json")).await;
    let text = content["text"].as_str().unwrap_or("");
    assert!(text.starts_with("The cat sat."), "{content}");

    let reader = token("rita", "essay", Permission::Read);
    let (status, _) = post(
        &http,
        &server,
        &format!("/docs/essay/versions/{v1}/restore"),
        &reader,
        json!({}),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    for c in [ann, bob, carl] {
        c.close().await;
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_is_a_new_document_with_the_content_at_a_version_or_position() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start(dir.path(), Duration::from_secs(600)).await;
    let http = reqwest::Client::new();
    let writer = token("ann", "*", Permission::Write);
    let mut ann = Client::connect(&ws(&server, "origin", "ann", Permission::Write), 1).await;
    ann.insert(0, "alpha").await;
    ann.durable_ack(1).await;
    let (_, v) = post(
        &http,
        &server,
        "/docs/origin/versions",
        &writer,
        json!({"label": "a"}),
    )
    .await;
    ann.insert(5, " beta").await;
    ann.durable_ack(2).await;

    let (status, forked) = post(
        &http,
        &server,
        "/docs/origin/fork",
        &writer,
        json!({"name": "copy/at-version", "version": v["id"]}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{forked}");
    assert_eq!(forked["owner"], "ann");
    assert_eq!(fresh_text(&server, "copy%2Fat-version").await, "alpha");
    let (status, _) = post(
        &http,
        &server,
        "/docs/origin/fork",
        &writer,
        json!({"name": "at-two", "at_position": 2}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(fresh_text(&server, "at-two").await, "alpha beta");
    // The fork is a document of its own: the origin is untouched by its edits.
    let mut c = Client::connect(&ws(&server, "at-two", "ann", Permission::Write), 5).await;
    c.insert(0, "forked ").await;
    c.durable_ack(1).await;
    assert_eq!(fresh_text(&server, "origin").await, "alpha beta");
    let (status, _) = post(
        &http,
        &server,
        "/docs/origin/fork",
        &writer,
        json!({"name": "at-two"}),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT);
    let narrow = token("ann", "origin", Permission::Write);
    let (status, _) = post(
        &http,
        &server,
        "/docs/origin/fork",
        &narrow,
        json!({"name": "elsewhere"}),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    c.close().await;
    ann.close().await;
    server.stop().await;
}

/// With `history_retention`, snapshots keep the rows they cover until the prune job removes
/// those older than the retention behind a version; named versions stay. With retention 0,
/// a snapshot deletes the rows it covers, as before history existed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_keeps_history_past_snapshots_and_the_prune_job_removes_it_after() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = secured(dir.path());
    cfg.room.snapshot_updates = 2;
    cfg.room.snapshot_log_percent = 0;
    cfg.room.history.version_idle = Duration::from_millis(100);
    cfg.room.history.retention = Duration::from_millis(1500);
    cfg.room.history.prune_interval = Duration::from_millis(200);
    let server = TestServer::start(cfg).await;
    let http = reqwest::Client::new();
    let writer = token("ann", "kept", Permission::Write);
    let mut ann = Client::connect(&ws(&server, "kept", "ann", Permission::Write), 1).await;
    for (i, word) in ["a", "b", "c", "d", "e"].iter().enumerate() {
        ann.insert(i as u32, word).await;
        ann.durable_ack(i as u64 + 1).await;
    }
    // Snapshots were written (every 2 updates), yet every position is still there.
    assert_eq!(
        get(&http, &server, "/docs/kept/json?at_position=1").await.1["text"],
        "a"
    );
    assert_eq!(
        get(&http, &server, "/docs/kept/json?at_position=3").await.1["text"],
        "abc"
    );
    let (_, named) = post(
        &http,
        &server,
        "/docs/kept/versions",
        &writer,
        json!({"label": "keep me"}),
    )
    .await;
    versions_until(&http, &server, "kept", |v| {
        v.iter().any(|v| v["kind"] == "auto")
    })
    .await;
    // More editing after the retention has passed, so the first rows are behind a version.
    tokio::time::sleep(Duration::from_millis(1600)).await;
    ann.insert(5, "f").await;
    ann.insert(6, "g").await;
    ann.durable_ack(7).await;
    server
        .wait_metric("quire_history_rows_pruned_total", |v| v >= 5.0)
        .await;
    let (status, body) = get(&http, &server, "/docs/kept/json?at_position=1").await;
    assert_eq!(status, StatusCode::GONE, "{body}");
    assert!(body["type"]
        .as_str()
        .unwrap_or("")
        .ends_with("/not-retained"));
    // The named version stays; the content is whole for a fresh client.
    let id = named["id"].as_i64().expect("id");
    let (status, content) = get(&http, &server, &format!("/docs/kept/versions/{id}/json")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(content["text"], "abcde");
    assert_eq!(fresh_text(&server, "kept").await, "abcdefg");
    // The versions at the retained history's first position: all but the last may go; the
    // last is what the positions after it are rebuilt from (409), and they still are.
    let (_, versions) = get(&http, &server, "/docs/kept/versions").await;
    let versions = versions.as_array().cloned().unwrap_or_default();
    let base = versions
        .iter()
        .filter_map(|v| v["seq"].as_i64())
        .min()
        .expect("a version");
    let at_base: Vec<i64> = versions
        .iter()
        .filter(|v| v["seq"].as_i64() == Some(base))
        .filter_map(|v| v["id"].as_i64())
        .collect();
    for (i, id) in at_base.iter().enumerate() {
        let resp = http
            .delete(api(&server, &format!("/docs/kept/versions/{id}")))
            .bearer_auth(&writer)
            .send()
            .await
            .expect("delete");
        let last = i + 1 == at_base.len();
        let want = if last {
            StatusCode::CONFLICT
        } else {
            StatusCode::NO_CONTENT
        };
        assert_eq!(
            resp.status(),
            want,
            "version {id} at the base position {base}"
        );
    }
    let (status, _) = get(
        &http,
        &server,
        &format!("/docs/kept/json?at_position={}", base + 1),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(server.metric("quire_history_prune_runs_total").await >= 1.0);
    assert!(
        server
            .metric("quire_history_prune_last_success_seconds")
            .await
            > 0.0
    );
    ann.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_retention_a_snapshot_deletes_the_rows_it_covers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = secured(dir.path());
    cfg.room.snapshot_updates = 2;
    cfg.room.snapshot_log_percent = 0;
    cfg.room.history.retention = Duration::ZERO;
    let server = TestServer::start(cfg).await;
    let http = reqwest::Client::new();
    let mut ann = Client::connect(&ws(&server, "lean", "ann", Permission::Write), 1).await;
    for (i, word) in ["a", "b", "c", "d"].iter().enumerate() {
        ann.insert(i as u32, word).await;
        ann.durable_ack(i as u64 + 1).await;
    }
    // Wait for the snapshot covering the first rows (written after a commit).
    let mut gone = false;
    for _ in 0..100 {
        let (status, _) = get(&http, &server, "/docs/lean/json?at_position=1").await;
        if status == StatusCode::GONE {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(gone, "a covered position is no longer retained");
    assert_eq!(
        get(&http, &server, "/docs/lean/json").await.1["text"],
        "abcd"
    );
    let (_, versions) = get(&http, &server, "/docs/lean/versions").await;
    assert_eq!(versions, json!([]), "no automatic versions without history");
    ann.close().await;
    server.stop().await;
}

/// Two restores of one version at once (a double click, a retried request) restore its text
/// once: they run one at a time, the second finding the content already restored. The
/// server's restore hold makes them meet after reading the content, if they can both get
/// there (without the one-at-a-time rule they do, and the text came back twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_restores_at_once_restore_the_text_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = secured(dir.path());
    cfg.room.history.version_idle = Duration::from_secs(600);
    let hooks = quire_server::app::TestHooks {
        restore_hold: Some(std::sync::Arc::new(tokio::sync::Barrier::new(2))),
        ..Default::default()
    };
    let server = TestServer::start_with_hooks(cfg, hooks).await;
    let http = reqwest::Client::new();
    let writer = token("ann", "twice", Permission::Write);
    let mut ann = Client::connect(&ws(&server, "twice", "ann", Permission::Write), 1).await;
    ann.insert(0, "keep this").await;
    ann.durable_ack(1).await;
    let (_, v) = post(
        &http,
        &server,
        "/docs/twice/versions",
        &writer,
        json!({"label": "v"}),
    )
    .await;
    let id = v["id"].as_i64().expect("id");
    // Everything deleted and rewritten since.
    {
        use yrs::{Text, Transact};
        let text = ann.doc.get_or_insert_text("text");
        let update = {
            let mut txn = ann.doc.transact_mut();
            text.remove_range(&mut txn, 0, 9);
            text.insert(&mut txn, 0, "other words");
            txn.encode_update_v1()
        };
        ann.send_update(&update).await;
    }
    ann.durable_ack(2).await;
    let path = format!("/docs/twice/versions/{id}/restore");
    let (a, b) = tokio::join!(
        post(&http, &server, &path, &writer, json!({})),
        post(&http, &server, &path, &writer, json!({}))
    );
    assert_eq!((a.0, b.0), (StatusCode::OK, StatusCode::OK), "{a:?} {b:?}");
    assert_eq!(fresh_text(&server, "twice").await, "keep this");
    ann.close().await;
    server.stop().await;
}

/// Whole-document reads pass the heavy-work gate and its cache: the same version's content
/// read three times is computed once (the cache's counters say so), and so is the content at
/// one position; named versions count against `max_version_bytes`, and a restore that would
/// pass it is refused before it changes anything.
#[tokio::test]
async fn heavy_reads_are_computed_once_and_versions_fit_their_budget() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = secured(dir.path());
    cfg.max_version_bytes = 2_000;
    let server = TestServer::start(cfg).await;
    let http = reqwest::Client::new();
    let writer = token("ann", "cached", Permission::Write);
    let mut ann = Client::connect(&ws(&server, "cached", "ann", Permission::Write), 1).await;
    ann.insert(0, &"x".repeat(600)).await;
    ann.durable_ack(1).await;
    let (status, first) = post(
        &http,
        &server,
        "/docs/cached/versions",
        &writer,
        json!({"label": "one"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    let id = first["id"].as_i64().expect("id");

    let misses = server.metric("quire_heavy_cache_misses_total").await;
    let hits = server.metric("quire_heavy_cache_hits_total").await;
    for _ in 0..3 {
        let (status, content) =
            get(&http, &server, &format!("/docs/cached/versions/{id}/json")).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(content["text"].as_str().map(str::len), Some(600));
    }
    for _ in 0..3 {
        let (status, content) = get(&http, &server, "/docs/cached/json?at_position=1").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(content["text"].as_str().map(str::len), Some(600));
    }
    assert_eq!(
        server.metric("quire_heavy_cache_misses_total").await - misses,
        2.0,
        "one computation per content"
    );
    assert_eq!(
        server.metric("quire_heavy_cache_hits_total").await - hits,
        4.0
    );

    // Each named version holds the whole content: the budget takes a few, then 507.
    let mut refused = None;
    for i in 0..10 {
        let (status, body) = post(
            &http,
            &server,
            "/docs/cached/versions",
            &writer,
            json!({"label": format!("v{i}")}),
        )
        .await;
        if status != StatusCode::CREATED {
            refused = Some((status, body));
            break;
        }
    }
    let (status, body) = refused.expect("the budget filled up");
    assert_eq!(status, StatusCode::INSUFFICIENT_STORAGE, "{body}");
    assert!(body["type"]
        .as_str()
        .unwrap_or("")
        .ends_with("/version-budget-full"));
    assert!(server.metric("quire_versions_refused_total").await >= 1.0);
    // A restore records a version too: refused, and the content is untouched.
    ann.insert(600, "after").await;
    ann.durable_ack(2).await;
    let (status, body) = post(
        &http,
        &server,
        &format!("/docs/cached/versions/{id}/restore"),
        &writer,
        json!(null),
    )
    .await;
    assert_eq!(status, StatusCode::INSUFFICIENT_STORAGE, "{body}");
    assert!(fresh_text(&server, "cached").await.ends_with("after"));
    ann.close().await;
    server.stop().await;
}

/// A fork is atomic: when its content cannot be written (a fault injected in the database:
/// a trigger refuses the new document's log row), the request fails and no empty document is
/// left behind; once the fault is gone, the retry with the same name succeeds with the content.
#[tokio::test]
async fn a_fork_whose_content_cannot_be_written_leaves_nothing_and_its_retry_succeeds() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start(dir.path(), Duration::from_secs(600)).await;
    let http = reqwest::Client::new();
    let writer = token("ann", "*", Permission::Write);
    let mut ann = Client::connect(&ws(&server, "source", "ann", Permission::Write), 1).await;
    ann.insert(0, "forked text").await;
    ann.durable_ack(1).await;

    let pool = open_db(dir.path()).await;
    let (create, drop) = if on_postgres() {
        (
            vec![
                "CREATE FUNCTION refuse_doomed() RETURNS trigger AS $$ BEGIN \
                   IF (SELECT name FROM documents WHERE id = NEW.doc_id) = 'doomed' THEN \
                     RAISE EXCEPTION 'injected fault'; END IF; RETURN NEW; END $$ LANGUAGE plpgsql",
                "CREATE TRIGGER refuse_doomed BEFORE INSERT ON doc_updates \
                   FOR EACH ROW EXECUTE FUNCTION refuse_doomed()",
            ],
            vec!["DROP TRIGGER refuse_doomed ON doc_updates"],
        )
    } else {
        (
            vec![
                "CREATE TRIGGER refuse_doomed BEFORE INSERT ON doc_updates \
                   WHEN (SELECT name FROM documents WHERE id = NEW.doc_id) = 'doomed' \
                   BEGIN SELECT RAISE(ABORT, 'injected fault'); END",
            ],
            vec!["DROP TRIGGER refuse_doomed"],
        )
    };
    for sql in create {
        sqlx::query(sql).execute(&pool).await.expect("fault");
    }
    let (status, body) = post(
        &http,
        &server,
        "/docs/source/fork",
        &writer,
        json!({"name": "doomed"}),
    )
    .await;
    assert!(status.is_server_error(), "{status} {body}");
    let (status, _) = get(&http, &server, "/docs/doomed").await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "no empty document left behind"
    );
    for sql in drop {
        sqlx::query(sql)
            .execute(&pool)
            .await
            .expect("fault removed");
    }
    let (status, body) = post(
        &http,
        &server,
        "/docs/source/fork",
        &writer,
        json!({"name": "doomed"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(fresh_text(&server, "doomed").await, "forked text");
    // The fork's row is attributed to whoever forked it.
    let (_, page) = get(&http, &server, "/docs/doomed/history").await;
    assert_eq!(page["items"][0]["authors"][0]["author"], "ann", "{page}");
    ann.close().await;
    server.stop().await;
}

/// Deleting a version and the prune job are serialized per document. The test holds the
/// prune's half open: in a transaction that locks the document's row as prune does, the log
/// rows up to a named version are deleted (the version becomes the history's base). A
/// DELETE of that version arriving meanwhile waits for that transaction, then sees the
/// version is the base and answers 409, so the positions after it stay readable. (On
/// PostgreSQL, READ COMMITTED let the delete run at once, see the rows not yet pruned and
/// delete the base; the positions then answered 410.)
#[tokio::test]
async fn deleting_the_version_a_prune_is_making_the_base_waits_and_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start(dir.path(), Duration::from_secs(600)).await;
    let http = reqwest::Client::new();
    let writer = token("ann", "raced", Permission::Write);
    let mut ann = Client::connect(&ws(&server, "raced", "ann", Permission::Write), 1).await;
    ann.insert(0, "ab").await;
    ann.durable_ack(1).await;
    let (_, version) = post(
        &http,
        &server,
        "/docs/raced/versions",
        &writer,
        json!({"label": "base"}),
    )
    .await;
    let (id, seq) = (
        version["id"].as_i64().expect("id"),
        version["seq"].as_i64().expect("seq"),
    );
    ann.insert(2, "cd").await;
    ann.durable_ack(2).await;
    let (_, doc) = get(&http, &server, "/docs/raced").await;
    let doc_id = doc["id"].as_i64().expect("doc id");

    // The prune's transaction, held open.
    let pool = open_db(dir.path()).await;
    let mut prune = pool.begin().await.expect("begin");
    let lock = if on_postgres() {
        "SELECT id FROM documents WHERE id = $1 FOR NO KEY UPDATE"
    } else {
        // (SQLite: the write lock, as the prune's first delete takes it.)
        "UPDATE documents SET id = id WHERE id = $1"
    };
    sqlx::query(lock)
        .bind(doc_id)
        .execute(&mut *prune)
        .await
        .expect("lock");
    sqlx::query("DELETE FROM doc_updates WHERE doc_id = $1 AND seq <= $2")
        .bind(doc_id)
        .bind(seq)
        .execute(&mut *prune)
        .await
        .expect("prune rows");
    let delete = tokio::spawn({
        let url = api(&server, &format!("/docs/raced/versions/{id}"));
        let http = http.clone();
        async move {
            http.delete(url)
                .bearer_auth(ADMIN)
                .send()
                .await
                .expect("delete")
                .status()
        }
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        !delete.is_finished(),
        "the delete did not wait for the prune"
    );
    prune.commit().await.expect("commit");
    assert_eq!(delete.await.expect("joins"), StatusCode::CONFLICT);
    let (status, content) = get(
        &http,
        &server,
        &format!("/docs/raced/json?at_position={}", seq + 1),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{content}");
    assert_eq!(content["text"], "abcd");
    ann.close().await;
    server.stop().await;
}

/// A version's metadata (the list, and one version) is read from the covering index of
/// migration 0011, never from the row: on SQLite, a column after a large `state` is reached
/// by walking the state's overflow pages (7 ms per read of a 20 MiB document's version).
#[tokio::test]
async fn version_metadata_is_read_from_the_index_not_the_row_on_sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    if !database_url(dir.path()).starts_with("sqlite") {
        return;
    }
    let server = TestServer::start(test_config(dir.path())).await;
    server.stop().await;
    let pool = open_db(dir.path()).await;
    use quire_server::storage::history::{VERSIONS_SQL, VERSION_SQL};
    for sql in [VERSIONS_SQL, VERSION_SQL] {
        let explain = format!(
            "EXPLAIN QUERY PLAN {}",
            sql.replace("$1", "1").replace("$2", "1")
        );
        let plan: Vec<(i64, i64, i64, String)> = sqlx::query_as(&explain)
            .fetch_all(&pool)
            .await
            .expect("plan");
        let plan: Vec<&str> = plan.iter().map(|row| row.3.as_str()).collect();
        assert!(
            plan.iter()
                .any(|step| step.contains("COVERING INDEX doc_versions_meta")),
            "{sql}: {plan:?}"
        );
    }
}
