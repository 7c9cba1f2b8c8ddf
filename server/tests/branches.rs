//! Branches and suggestions (docs/branches.md), on whichever database the suite runs: a
//! branch edited by two authors while the parent moves on, its changes reviewed with their
//! dependencies, a selective merge refused without a dependency and accepted with it, merges
//! retried with and without an Idempotency-Key, rejection, update from the parent, close, and
//! who may do what. The parent's content is always read by a fresh client, never by the
//! clients that wrote it.

mod common;

use std::time::Duration;

use common::*;
use quire_server::auth::Permission;
use reqwest::StatusCode;
use serde_json::{json, Value};
use yrs::{Text, Transact};

const GAP: Duration = Duration::from_millis(300);

async fn start(dir: &std::path::Path) -> TestServer {
    let mut cfg = secured(dir);
    // Editing sessions (and so changes) end after this long without an edit.
    cfg.room.history.version_idle = GAP;
    TestServer::start(cfg).await
}

fn ws(server: &TestServer, doc: &str, user: &str, perm: Permission) -> String {
    format!("{}?token={}", server.url(doc), token(user, doc, perm))
}

async fn call(
    http: &reqwest::Client,
    server: &TestServer,
    method: reqwest::Method,
    path: &str,
    bearer: &str,
    body: Option<Value>,
    key: Option<&str>,
) -> (StatusCode, Value) {
    // A merge is sent as a reviewer sends it: naming what the change list showed.
    let (body, if_match) = if method == reqwest::Method::POST && path.ends_with("/merge") {
        as_reviewed(http, server, path, bearer, body).await
    } else {
        (body, None)
    };
    let mut req = http.request(method, api(server, path)).bearer_auth(bearer);
    if let Some(body) = body {
        req = req.json(&body);
    }
    if let Some(tag) = if_match {
        req = req.header("if-match", tag);
    }
    if let Some(key) = key {
        req = req.header("idempotency-key", key);
    }
    let resp = req.send().await.expect("request");
    let status = resp.status();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// A merge's body as a reviewer sends it: each change named with the `last_seq` the change
/// list shows; without a body ("every open change"), the list's ETag as `If-Match`.
async fn as_reviewed(
    http: &reqwest::Client,
    server: &TestServer,
    merge_path: &str,
    bearer: &str,
    body: Option<Value>,
) -> (Option<Value>, Option<String>) {
    let changes_path = format!("{}/changes", merge_path.trim_end_matches("/merge"));
    let resp = http
        .get(api(server, &changes_path))
        .bearer_auth(bearer)
        .send()
        .await
        .expect("changes");
    let tag = resp
        .headers()
        .get("etag")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let listing: Value = resp.json().await.unwrap_or(Value::Null);
    let Some(ids) = body.as_ref().and_then(|b| b["changes"].as_array()) else {
        return (body, tag);
    };
    let named: Vec<Value> = ids
        .iter()
        .map(|id| {
            let last_seq = listing["changes"]
                .as_array()
                .and_then(|l| l.iter().find(|c| c["id"] == *id))
                .map_or(json!(0), |c| c["last_seq"].clone());
            json!({"id": id, "last_seq": last_seq})
        })
        .collect();
    (Some(json!({ "changes": named })), None)
}

async fn get(http: &reqwest::Client, server: &TestServer, path: &str) -> Value {
    let (status, body) = call(http, server, reqwest::Method::GET, path, ADMIN, None, None).await;
    assert_eq!(status, StatusCode::OK, "GET {path}: {body}");
    body
}

async fn post(
    http: &reqwest::Client,
    server: &TestServer,
    path: &str,
    bearer: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    call(
        http,
        server,
        reqwest::Method::POST,
        path,
        bearer,
        body,
        None,
    )
    .await
}

/// What a fresh client reads of the document's text.
async fn fresh_text(server: &TestServer, doc: &str) -> String {
    let c = Client::connect(&ws(server, doc, "reader", Permission::Read), 900).await;
    let text = c.text();
    c.close().await;
    text
}

/// Edits the client's text and sends the update; waits until it is committed.
async fn edit(c: &mut Client, f: impl FnOnce(&yrs::TextRef, &mut yrs::TransactionMut)) {
    let text = c.doc.get_or_insert_text("text");
    let update = {
        let mut txn = c.doc.transact_mut();
        f(&text, &mut txn);
        txn.encode_update_v1()
    };
    c.send_update(&update).await;
    let n = c.acks_received.len() as u64 + 1;
    c.durable_ack(n).await;
}

/// The ids of the changes by `author`.
fn ids_by(changes: &Value, author: &str) -> Vec<i64> {
    changes["changes"]
        .as_array()
        .expect("changes")
        .iter()
        .filter(|c| c["author"] == author)
        .filter_map(|c| c["id"].as_i64())
        .collect()
}

/// A parent "spec" holding "Hello world", its branch "spec-review" made by carol, alice's
/// " dear" (change A), bob's "world" -> "there" (change B) and, in a later session, alice
/// deleting part of bob's word (change C, which needs B).
async fn scenario(server: &TestServer, http: &reqwest::Client) -> (Client, Value) {
    let (status, _) = post(http, server, "/docs", ADMIN, Some(json!({"name": "spec"}))).await;
    assert_eq!(status, StatusCode::CREATED);
    let mut owner = Client::connect(&ws(server, "spec", "olga", Permission::Write), 1).await;
    edit(&mut owner, |t, txn| t.insert(txn, 0, "Hello world")).await;
    let carol = token("carol", "spec*", Permission::Write);
    let (status, branch) = post(
        http,
        server,
        "/docs/spec/branches",
        &carol,
        Some(json!({"name": "spec-review"})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{branch}");
    assert_eq!(branch["parent"], "spec");
    assert_eq!(branch["state"], "open");
    assert_eq!(branch["author"], "carol");

    let mut alice =
        Client::connect(&ws(server, "spec-review", "alice", Permission::Write), 2).await;
    assert_eq!(
        alice.text(),
        "Hello world",
        "the branch starts with the parent's content"
    );
    edit(&mut alice, |t, txn| t.insert(txn, 5, " dear")).await;
    let mut bob = Client::connect(&ws(server, "spec-review", "bob", Permission::Write), 3).await;
    edit(&mut bob, |t, txn| {
        t.remove_range(txn, 11, 5);
        t.insert(txn, 11, "there");
    })
    .await;
    tokio::time::sleep(GAP * 2).await;
    alice
        .pump_until(Duration::from_secs(5), |c| c.text() == "Hello dear there")
        .await;
    edit(&mut alice, |t, txn| t.remove_range(txn, 13, 2)).await;
    alice.close().await;
    bob.close().await;
    let changes = get(http, server, "/docs/spec-review/changes").await;
    (owner, changes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_branch_is_reviewed_and_merged_change_by_change_into_the_live_parent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start(dir.path()).await;
    let http = reqwest::Client::new();
    let (mut owner, changes) = scenario(&server, &http).await;

    // Three changes: alice's, bob's, alice's again (a later session).
    let list = changes["changes"].as_array().expect("changes");
    assert_eq!(list.len(), 3, "{changes}");
    let alice = ids_by(&changes, "alice");
    let bob = ids_by(&changes, "bob");
    assert_eq!((alice.len(), bob.len()), (2, 1), "{changes}");
    let (a, b, c) = (alice[0], bob[0], alice[1]);
    assert_eq!(
        list[2]["depends_on"],
        json!([b]),
        "alice's deletion of bob's text needs his change"
    );
    assert_eq!(list[0]["depends_on"], json!([]));
    // Each change's diff against the parent, and the branch's text with its runs marked.
    let runs = |change: &Value| -> Vec<(String, String)> {
        change["texts"][0]["runs"]
            .as_array()
            .expect("runs")
            .iter()
            .map(|r| {
                (
                    r["kind"].as_str().unwrap_or("").to_owned(),
                    r["text"].as_str().unwrap_or("").to_owned(),
                )
            })
            .collect()
    };
    assert_eq!(
        runs(&list[0]),
        vec![
            ("kept".into(), "Hello".into()),
            ("inserted".into(), " dear".into()),
            ("kept".into(), " world".into())
        ]
    );
    assert!(
        runs(&list[1]).contains(&("deleted".into(), "world".into())),
        "{}",
        list[1]
    );
    let view: String = changes["view"][0]["runs"]
        .as_array()
        .expect("view")
        .iter()
        .filter(|r| r["kind"] != "deleted")
        .filter_map(|r| r["text"].as_str())
        .collect();
    assert_eq!(view, "Hello dear the");
    assert_eq!(changes["branch"]["ahead"], 3);

    // The parent moves on meanwhile (at its start: two insertions at the same place would be
    // ordered by client id, which is not what this test is about).
    edit(&mut owner, |t, txn| t.insert(txn, 0, ">> ")).await;
    let rows_before = log_rows(dir.path(), "spec").await;

    // Alice's second change alone: refused, naming bob's, nothing applied.
    let reviewer = token("rita", "spec*", Permission::Write);
    let (status, problem) = post(
        &http,
        &server,
        "/docs/spec-review/merge",
        &reviewer,
        Some(json!({"changes": [c]})),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{problem}");
    assert!(
        problem["type"]
            .as_str()
            .unwrap_or("")
            .ends_with("/missing-dependencies"),
        "{problem}"
    );
    assert_eq!(problem["current"]["missing"], json!([b]));
    assert_eq!(log_rows(dir.path(), "spec").await, rows_before);
    assert_eq!(fresh_text(&server, "spec").await, ">> Hello world");

    // With bob's: merged, broadcast to the parent's live client, kept by a fresh one.
    let (status, merged) = call(
        &http,
        &server,
        reqwest::Method::POST,
        "/docs/spec-review/merge",
        &reviewer,
        Some(json!({"changes": [b, c]})),
        Some("merge-1"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{merged}");
    assert_eq!(merged["merged"], json!([b, c]));
    assert!(merged["version_before"]["id"].is_i64() && merged["version_after"]["id"].is_i64());
    assert!(
        owner
            .pump_until(Duration::from_secs(5), |cl| cl.text() == ">> Hello the")
            .await,
        "the parent's live client got the merge: {}",
        owner.text()
    );
    assert_eq!(fresh_text(&server, "spec").await, ">> Hello the");
    let rows_merged = log_rows(dir.path(), "spec").await;

    // The same merge again: with the key, the first answer; without, nothing to apply.
    let (status, again) = call(
        &http,
        &server,
        reqwest::Method::POST,
        "/docs/spec-review/merge",
        &reviewer,
        Some(json!({"changes": [b, c]})),
        Some("merge-1"),
    )
    .await;
    assert_eq!((status, &again), (StatusCode::OK, &merged));
    let (status, again) = post(
        &http,
        &server,
        "/docs/spec-review/merge",
        &reviewer,
        Some(json!({"changes": [b, c]})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["merged"], json!([]));
    assert_eq!(again["already_merged"], json!([b, c]));
    assert_eq!(
        log_rows(dir.path(), "spec").await,
        rows_merged,
        "nothing applied twice"
    );

    // The parent's log attributes the merged edits to their authors.
    let history = get(&http, &server, "/docs/spec/history").await;
    let authors: Vec<&str> = history["items"]
        .as_array()
        .expect("items")
        .iter()
        .flat_map(|s| s["authors"].as_array().into_iter().flatten())
        .filter_map(|a| a["author"].as_str())
        .collect();
    assert!(
        authors.contains(&"bob") && authors.contains(&"alice"),
        "{history}"
    );
    assert!(
        !authors.contains(&"rita"),
        "the merger is recorded on the versions, not as the author"
    );
    let versions = get(&http, &server, "/docs/spec/versions").await;
    let labels: Vec<&str> = versions
        .as_array()
        .expect("versions")
        .iter()
        .filter(|v| v["author"] == "rita")
        .filter_map(|v| v["label"].as_str())
        .collect();
    assert_eq!(
        labels,
        vec![
            "before merging branch spec-review",
            "after merging branch spec-review"
        ]
    );

    // Alice's first change rejected: never merged, and "merge all" has nothing left.
    let (status, rejected) = post(
        &http,
        &server,
        &format!("/docs/spec-review/changes/{a}/reject"),
        &reviewer,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{rejected}");
    assert_eq!(rejected["state"], "rejected");
    let (status, problem) = post(
        &http,
        &server,
        "/docs/spec-review/merge",
        &reviewer,
        Some(json!({"changes": [a]})),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{problem}");
    let (status, all) = post(&http, &server, "/docs/spec-review/merge", &reviewer, None).await;
    assert_eq!(status, StatusCode::OK, "{all}");
    assert_eq!(all["merged"], json!([]));
    assert_eq!(fresh_text(&server, "spec").await, ">> Hello the");
    let branches = get(&http, &server, "/docs/spec/branches").await;
    assert_eq!(branches["branches"][0]["state"], "merged", "{branches}");
    owner.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_cannot_merge_nor_can_a_branch_writer_into_a_parent_it_cannot_write() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start(dir.path()).await;
    let http = reqwest::Client::new();
    let (owner, changes) = scenario(&server, &http).await;
    let b = ids_by(&changes, "bob")[0];
    let body = Some(json!({"changes": [b]}));
    let reader = token("rex", "spec*", Permission::Read);
    // The branch's record tells each caller whether it may decide the changes.
    let (_, seen) = call(
        &http,
        &server,
        reqwest::Method::GET,
        "/docs/spec-review/branch",
        &reader,
        None,
        None,
    )
    .await;
    assert_eq!(seen["can_review"], false, "{seen}");
    let writer = token("wes", "spec*", Permission::Write);
    let (_, seen) = call(
        &http,
        &server,
        reqwest::Method::GET,
        "/docs/spec-review/branch",
        &writer,
        None,
        None,
    )
    .await;
    assert_eq!(seen["can_review"], true, "{seen}");
    let (status, _) = post(
        &http,
        &server,
        "/docs/spec-review/merge",
        &reader,
        body.clone(),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    // Write on the branch only.
    let branch_writer = token("bob", "spec-review", Permission::Write);
    let (status, _) = post(
        &http,
        &server,
        "/docs/spec-review/merge",
        &branch_writer,
        body.clone(),
    )
    .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "merge by a branch writer: the parent is not visible to it"
    );
    let (status, _) = post(
        &http,
        &server,
        &format!("/docs/spec-review/changes/{b}/reject"),
        &branch_writer,
        None,
    )
    .await;
    // The parent is not visible to it: 404, as for any document it cannot see.
    assert_eq!(status, StatusCode::NOT_FOUND, "reject by a branch writer");
    // A reader of the parent may branch it (into a name it may write) but not write the parent.
    let reader_of_spec = token("rex", "spec", Permission::Read);
    let (status, body) = post(
        &http,
        &server,
        "/docs/spec/branches",
        &reader_of_spec,
        Some(json!({"name": "spec-rex"})),
    )
    .await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "no write on the new name: {body}"
    );
    assert_eq!(fresh_text(&server, "spec").await, "Hello world");
    // Closed: nothing more merges.
    let (status, closed) = post(&http, &server, "/docs/spec-review/close", ADMIN, None).await;
    assert_eq!(
        (status, closed["state"].as_str()),
        (StatusCode::OK, Some("closed"))
    );
    let (status, problem) = post(&http, &server, "/docs/spec-review/merge", ADMIN, None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{problem}");
    assert_eq!(fresh_text(&server, "spec").await, "Hello world");
    owner.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_parents_changes_come_into_the_branch_and_are_not_changes_of_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    // One heavy-work slot per node and per document: a route that held an admission while
    // taking another would wait for itself (and answer 503 after heavy_wait).
    let mut cfg = secured(dir.path());
    cfg.room.history.version_idle = GAP;
    cfg.gate.per_node = 1;
    cfg.gate.per_doc = 1;
    cfg.gate.wait = Duration::from_secs(2);
    let server = TestServer::start(cfg).await;
    let http = reqwest::Client::new();
    let (mut owner, _) = scenario(&server, &http).await;
    edit(&mut owner, |t, txn| t.insert(txn, 0, ">> ")).await;
    let branch = get(&http, &server, "/docs/spec-review/branch").await;
    assert_eq!(branch["behind"], 1, "{branch}");
    let (status, pulled) = post(
        &http,
        &server,
        "/docs/spec-review/update-from-parent",
        ADMIN,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{pulled}");
    assert!(pulled["seq"].is_i64(), "{pulled}");
    assert_eq!(
        fresh_text(&server, "spec-review").await,
        ">> Hello dear the"
    );
    let changes = get(&http, &server, "/docs/spec-review/changes").await;
    assert_eq!(
        changes["changes"].as_array().map(Vec::len),
        Some(3),
        "{changes}"
    );
    assert_eq!(changes["branch"]["behind"], 0);
    // The change list revalidates: 304 while nothing changed, a new answer once the branch
    // moves.
    let changes_of = |tag: Option<String>| {
        let http = http.clone();
        let url = api(&server, "/docs/spec-review/changes");
        async move {
            let mut req = http.get(url).bearer_auth(ADMIN);
            if let Some(tag) = tag {
                req = req.header("if-none-match", tag);
            }
            let resp = req.send().await.expect("changes");
            let tag = resp
                .headers()
                .get("etag")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            (resp.status(), tag)
        }
    };
    let (status, tag) = changes_of(None).await;
    assert_eq!(status, StatusCode::OK);
    let tag = tag.expect("an ETag");
    assert_eq!(
        changes_of(Some(tag.clone())).await.0,
        StatusCode::NOT_MODIFIED
    );
    let mut carl = Client::connect(&ws(&server, "spec-review", "carl", Permission::Write), 7).await;
    edit(&mut carl, |t, txn| t.insert(txn, 0, "# ")).await;
    carl.close().await;
    let (status, newer) = changes_of(Some(tag.clone())).await;
    assert_eq!(status, StatusCode::OK);
    assert_ne!(newer, Some(tag));

    // Nothing new: nothing applied.
    let (status, again) = post(
        &http,
        &server,
        "/docs/spec-review/update-from-parent",
        ADMIN,
        None,
    )
    .await;
    assert_eq!(
        (status, again["seq"].clone()),
        (StatusCode::OK, Value::Null)
    );
    // Merging everything now: the parent keeps its own edit and gets the branch's.
    let (status, merged) = post(&http, &server, "/docs/spec-review/merge", ADMIN, None).await;
    assert_eq!(status, StatusCode::OK, "{merged}");
    assert_eq!(fresh_text(&server, "spec").await, "# >> Hello dear the");
    // Not a branch.
    let (status, problem) = call(
        &http,
        &server,
        reqwest::Method::GET,
        "/docs/spec/changes",
        ADMIN,
        None,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{problem}");
    owner.close().await;
}
