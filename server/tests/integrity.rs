//! Only updates that integrate enter a document, and what a reviewer accepts is what merges
//! (docs/durability.md, docs/branches.md), on whichever database the suite runs. Every
//! outcome is read back by a fresh client or from the stored rows, never by the clients that
//! sent the updates.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use quire_server::auth::Permission;
use reqwest::StatusCode;
use serde_json::{json, Value};
use yrs::updates::decoder::Decode;
use yrs::updates::encoder::Encode;
use yrs::{Doc, ReadTxn, StateVector, Text, Transact, Update};

fn ws(server: &TestServer, doc: &str, user: &str, perm: Permission) -> String {
    format!("{}?token={}", server.url(doc), token(user, doc, perm))
}

async fn send(
    http: &reqwest::Client,
    req: reqwest::RequestBuilder,
    what: &str,
) -> (StatusCode, Value) {
    let _ = http;
    let resp = req.send().await.unwrap_or_else(|e| panic!("{what}: {e}"));
    let status = resp.status();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// The stored document (snapshot and log, as a load replays it): its text, and whether yrs
/// holds anything pending in it.
async fn stored(dir: &std::path::Path, name: &str) -> (String, bool) {
    use yrs::GetString;
    let stores = open_test_stores(dir).await;
    let doc = stores.docs.load(name).await.expect("load");
    let replayed = quire_server::room::replay_stored(&doc).expect("replays");
    let text = replayed
        .get_or_insert_text("text")
        .get_string(&replayed.transact());
    let pending = replayed.transact().has_missing_updates();
    (text, pending)
}

/// Every route the wedge used to block answers as on a clean document: the content, a
/// version, a JSON edit, a restore of that version.
async fn document_answers(http: &reqwest::Client, server: &TestServer, doc: &str) {
    let (status, _) = send(
        http,
        http.get(api(server, &format!("/docs/{doc}/update")))
            .bearer_auth(ADMIN),
        "update",
    )
    .await;
    assert_eq!(status, StatusCode::OK, "GET /update");
    let (status, version) = send(
        http,
        http.post(api(server, &format!("/docs/{doc}/versions")))
            .bearer_auth(ADMIN)
            .json(&json!({"label": "after the attack"})),
        "version",
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "POST /versions: {version}");
    let (status, edited) = send(
        http,
        http.post(api(server, &format!("/docs/{doc}/edits")))
            .bearer_auth(ADMIN)
            .json(&json!({"ops": [{"text": "other", "insert": "edit"}]})),
        "edits",
    )
    .await;
    assert_eq!(status, StatusCode::OK, "POST /edits: {edited}");
    let id = version["id"].as_i64().expect("version id");
    let (status, restored) = send(
        http,
        http.post(api(server, &format!("/docs/{doc}/versions/{id}/restore")))
            .bearer_auth(ADMIN),
        "restore",
    )
    .await;
    assert_eq!(status, StatusCode::OK, "restore: {restored}");
}

/// A writer sends the second of two updates of its own and never the first, and a delete set
/// for the victim's clocks that do not exist yet. Neither enters the document: the first is
/// held for the attacker's connection until `held_update_timeout` closes it (1013), the
/// deletions are cut to what exists (nothing). The victim's thirty later edits all reach a
/// fresh client; reads, versions, edits and restores answer; the document snapshots again.
#[tokio::test]
async fn a_writer_cannot_wedge_a_document() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = secured(dir.path());
    cfg.room.held_update_timeout = Duration::from_millis(300);
    cfg.room.snapshot_updates = 10;
    cfg.room.snapshot_log_percent = 0;
    let server = TestServer::start(cfg).await;
    let http = reqwest::Client::new();
    let doc = "wedge";
    let mut victim = Client::connect(&ws(&server, doc, "alice", Permission::Write), 1).await;
    victim.insert(0, "start ").await;
    victim.durable_ack(1).await;

    let mut attacker = Client::connect(&ws(&server, doc, "mallory", Permission::Write), 2).await;
    let (_, second) = ahead_pair(77);
    attacker.send_update(&second).await;
    // Clocks 6.. of the victim's client do not exist yet.
    attacker.send_update(&deletes_only(1, 6, 100_000)).await;
    assert_eq!(
        attacker.wait_closed().await,
        Some(1013),
        "the attacker's held update timed out"
    );

    for i in 0..30 {
        let len = victim.text_len() as u32;
        victim.insert(len, &format!("<{i}>")).await;
    }
    victim.durable_ack(2).await;
    let fresh = Client::connect(&ws(&server, doc, "reader", Permission::Read), 3).await;
    let text = fresh.text();
    let expected: String = std::iter::once("start ".to_owned())
        .chain((0..30).map(|i| format!("<{i}>")))
        .collect();
    assert_eq!(
        text, expected,
        "every edit the victim typed, nothing of the attacker's"
    );
    fresh.close().await;

    document_answers(&http, &server, doc).await;
    // The stored rows replay without anything pending, and snapshots were written again
    // (the log holds fewer rows than were committed).
    let (stored_text, pending) = stored(dir.path(), doc).await;
    assert!(!pending, "the stored document holds nothing pending");
    assert!(stored_text.starts_with(&expected), "{stored_text}");
    assert!(
        log_rows(dir.path(), doc).await < 31,
        "snapshots compact the log"
    );
    victim.close().await;
    server.stop().await;
}

/// The out-of-order case stock providers produce still works: a client's second update before
/// its first, on one connection or on two (a tab relaying another's edit). The held update
/// integrates as soon as its dependency arrives from anyone, and its sender's durable
/// acknowledgement comes once it is committed.
#[tokio::test]
async fn an_out_of_order_pair_integrates_from_anyone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(test_config(dir.path())).await;
    let (first, second) = ahead_pair(40);
    let mut a = Client::connect(&server.url("order"), 1).await;
    let mut b = Client::connect(&server.url("order"), 2).await;
    a.send_update(&second).await;
    let ack = quire_server::protocol::encode_durable_ack(1);
    a.send_raw(ack.clone()).await;
    assert!(
        !a.pump_until(Duration::from_millis(300), |c| c
            .acks_received
            .contains(&ack))
            .await,
        "no acknowledgement while the update is held"
    );
    b.send_update(&first).await;
    b.durable_ack(1).await;
    assert!(
        a.pump_until(PATIENCE, |c| c.acks_received.contains(&ack))
            .await,
        "acknowledged once the held update integrated"
    );
    let fresh = Client::connect(&server.url("order"), 3).await;
    assert_eq!(fresh.text(), "FIRSTSECOND");
    // One connection, the two in reverse order.
    let (first, second) = ahead_pair(41);
    a.send_update(&second).await;
    a.send_update(&first).await;
    a.durable_ack(2).await;
    let fresh = Client::connect(&server.url("order"), 4).await;
    assert_eq!(fresh.text().matches("FIRSTSECOND").count(), 2);
    // A connection's later deletion of what its held update inserts waits behind it, and
    // applies once it does (judged before it, the deletion would be cut and "b" come back).
    // Client 50 types "XY", then "abc", then deletes the "b": three updates, the first never
    // sent on this connection.
    let xy = {
        let d = Doc::with_client_id(50);
        d.get_or_insert_text("w")
            .insert(&mut d.transact_mut(), 0, "XY");
        let u = d
            .transact()
            .encode_state_as_update_v1(&StateVector::default());
        u
    };
    let insert_abc = {
        let d = Doc::with_client_id(50);
        let t = d.get_or_insert_text("w");
        t.insert(&mut d.transact_mut(), 0, "XY");
        let sv = d.transact().state_vector();
        t.insert(&mut d.transact_mut(), 2, "abc");
        let u = d.transact().encode_state_as_update_v1(&sv);
        u
    };
    let delete_b = {
        let d = Doc::with_client_id(50);
        let t = d.get_or_insert_text("w");
        t.insert(&mut d.transact_mut(), 0, "XY");
        t.insert(&mut d.transact_mut(), 2, "abc");
        let before = d.transact().snapshot();
        t.remove_range(&mut d.transact_mut(), 3, 1);
        let after = d.transact().snapshot();
        let mut ds = after.delete_set.clone();
        ds.diff_with(&before.delete_set);
        let mut u = Update::new();
        u.set_delete_set(ds);
        u.encode_v1()
    };
    a.send_update(&insert_abc).await;
    a.send_update(&delete_b).await;
    b.send_update(&xy).await;
    b.durable_ack(2).await;
    a.durable_ack(3).await;
    let fresh = Client::connect(&server.url("order"), 5).await;
    let w_text = {
        use yrs::GetString;
        let t = fresh.doc.get_or_insert_text("w");
        let txn = fresh.doc.transact();
        t.get_string(&txn)
    };
    assert_eq!(
        w_text, "XYac",
        "the deletion applied after the insertion it follows"
    );
    // Over HTTP an update that does not integrate is refused, nothing applied.
    let (_, second) = ahead_pair(42);
    let resp = reqwest::Client::new()
        .post(server.http("/api/v1/docs/order/update"))
        .header("content-type", "application/octet-stream")
        .body(second)
        .send()
        .await
        .expect("post");
    assert_eq!(resp.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let problem: Value = resp.json().await.expect("problem");
    assert!(
        problem["type"]
            .as_str()
            .is_some_and(|t| t.ends_with("update-missing-dependencies")),
        "{problem}"
    );
    server.stop().await;
}

/// A store an earlier Quire wrote holds a row that waits for content never stored and a row
/// deleting clocks that never existed. Loading it sets both aside (listed by the admin API),
/// applies the deletions of what exists, and snapshots at once; the document then answers
/// every route.
#[tokio::test]
async fn a_store_holding_a_pending_row_sets_it_aside_and_snapshots() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(secured(dir.path())).await;
    let http = reqwest::Client::new();
    let (status, created) = send(
        &http,
        http.post(api(&server, "/docs"))
            .bearer_auth(ADMIN)
            .json(&json!({"name": "legacy"})),
        "create",
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = created["id"].as_i64().expect("id");
    // The rows, written as an earlier Quire logged them (no room checked them).
    let d = Doc::with_client_id(1);
    d.get_or_insert_text("text")
        .insert(&mut d.transact_mut(), 0, "hello");
    let hello = d
        .transact()
        .encode_state_as_update_v1(&StateVector::default());
    let (_, pending) = ahead_pair(77);
    let beyond = deletes_only(1, 3, 1000);
    let stores = open_test_stores(dir.path()).await;
    stores
        .docs
        .append(
            id,
            None,
            1,
            vec![hello.into(), pending.into(), beyond.clone().into()],
        )
        .await
        .expect("append");
    let fresh = Client::connect(&ws(&server, "legacy", "reader", Permission::Read), 2).await;
    assert_eq!(fresh.text(), "hel", "the deletions of what existed apply");
    fresh.close().await;
    // Set aside and listed: the whole pending row, the deletions cut from the other.
    let (status, listed) = send(
        &http,
        http.get(api(&server, "/admin/set-aside?document=legacy"))
            .bearer_auth(ADMIN),
        "set-aside",
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    let rows = listed["rows"].as_array().expect("rows");
    let mut seqs: Vec<i64> = rows.iter().filter_map(|r| r["seq"].as_i64()).collect();
    seqs.sort_unstable();
    assert_eq!(seqs, vec![2, 3], "{listed}");
    assert!(server.metric("quire_updates_set_aside_total").await >= 2.0);
    // A reader may not list them.
    let (status, _) = send(
        &http,
        http.get(api(&server, "/admin/set-aside"))
            .bearer_auth(token("reader", "legacy", Permission::Write)),
        "set-aside as a user",
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    // Snapshotted at load: the next load starts past those rows.
    let mut snapshotted = false;
    for _ in 0..50 {
        if log_rows(dir.path(), "legacy").await == 0 {
            snapshotted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        snapshotted,
        "the document snapshotted after setting rows aside"
    );
    let (text, pending) = stored(dir.path(), "legacy").await;
    assert_eq!((text.as_str(), pending), ("hel", false));
    document_answers(&http, &server, "legacy").await;
    server.stop().await;
}

const GAP: Duration = Duration::from_millis(300);

async fn branch_server(dir: &std::path::Path, hooks: quire_server::app::TestHooks) -> TestServer {
    let mut cfg = secured(dir);
    cfg.room.history.version_idle = GAP;
    cfg.room.held_update_timeout = Duration::from_millis(300);
    TestServer::start_with_hooks(cfg, hooks).await
}

/// A parent "spec" with "Hello world", and its branch "spec-review".
async fn parent_and_branch(http: &reqwest::Client, server: &TestServer) -> Client {
    let (status, _) = send(
        http,
        http.post(api(server, "/docs"))
            .bearer_auth(ADMIN)
            .json(&json!({"name": "spec"})),
        "create",
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let mut owner = Client::connect(&ws(server, "spec", "olga", Permission::Write), 10).await;
    owner.insert(0, "Hello world").await;
    owner.durable_ack(1).await;
    let (status, branch) = send(
        http,
        http.post(api(server, "/docs/spec/branches"))
            .bearer_auth(ADMIN)
            .json(&json!({"name": "spec-review"})),
        "branch",
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{branch}");
    owner
}

/// The branch's change list and its ETag.
async fn changes(http: &reqwest::Client, server: &TestServer) -> (Value, String) {
    let resp = http
        .get(api(server, "/docs/spec-review/changes"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("changes");
    assert_eq!(resp.status(), StatusCode::OK);
    let tag = resp.headers()["etag"].to_str().expect("etag").to_owned();
    (resp.json().await.expect("json"), tag)
}

/// The wedge sent to a branch next to an innocent insertion, by a user who may only read the
/// parent: the branch holds it for that connection, never logs it, and closes it; "accept
/// all" merges nothing of it and the parent's later typing survives. A branch row an earlier
/// Quire logged with the same bytes is shown as not reviewable and cannot be merged.
#[tokio::test]
async fn a_wedge_through_a_branch_never_reaches_the_parent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = branch_server(dir.path(), Default::default()).await;
    let http = reqwest::Client::new();
    let mut owner = parent_and_branch(&http, &server).await;
    let mut mallory = Client::connect(
        &ws(&server, "spec-review", "mallory", Permission::Write),
        20,
    )
    .await;
    let innocent = mallory.insert(0, "Suggested title. ").await;
    let (_, second) = ahead_pair(77);
    let both = Update::merge_updates([
        Update::decode_v1(&innocent).expect("decodes"),
        Update::decode_v1(&second).expect("decodes"),
    ])
    .encode_v1();
    mallory.send_update(&both).await;
    mallory.send_update(&deletes_only(10, 11, 100_000)).await;
    assert_eq!(mallory.wait_closed().await, Some(1013));
    let (listed, tag) = changes(&http, &server).await;
    let list = listed["changes"].as_array().expect("changes");
    assert_eq!(list.len(), 1, "the innocent insertion alone: {listed}");
    assert_eq!(list[0]["mergeable"], true);
    let (status, merged) = send(
        &http,
        http.post(api(&server, "/docs/spec-review/merge"))
            .bearer_auth(ADMIN)
            .header("if-match", tag)
            .json(&json!({})),
        "merge",
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{merged}");
    for i in 0..10 {
        let len = owner.text_len() as u32;
        owner.insert(len, &format!("<{i}>")).await;
    }
    owner.durable_ack(2).await;
    let fresh = Client::connect(&ws(&server, "spec", "reader", Permission::Read), 30).await;
    let expected: String = std::iter::once("Suggested title. Hello world".to_owned())
        .chain((0..10).map(|i| format!("<{i}>")))
        .collect();
    assert_eq!(fresh.text(), expected);
    fresh.close().await;
    let (_, pending) = stored(dir.path(), "spec").await;
    assert!(!pending);

    // An earlier Quire's branch row holding the wedge: shown as not reviewable, refused.
    let (status, b) = send(
        &http,
        http.get(api(&server, "/docs/spec-review"))
            .bearer_auth(ADMIN),
        "branch doc",
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let branch_id = b["id"].as_i64().expect("id");
    let last = log_rows_all(dir.path(), "spec-review").await;
    let stores = open_test_stores(dir.path()).await;
    // Unloaded first, so its room does not hold a stale position.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let row = quire_server::storage::LogEntry {
        data: both.clone().into(),
        author: Some("mallory".into()),
        inserted: 0,
        deleted: 0,
        clients: Vec::new(),
    };
    stores
        .docs
        .append_log(branch_id, None, last + 1, vec![row])
        .await
        .expect("append");
    let (listed, tag) = changes(&http, &server).await;
    let open: Vec<&Value> = listed["changes"]
        .as_array()
        .expect("changes")
        .iter()
        .filter(|c| c["state"] == "open")
        .collect();
    assert_eq!(open.len(), 1, "{listed}");
    assert_eq!(open[0]["mergeable"], false, "{listed}");
    assert!(open[0]["unshown"].as_str().is_some(), "{listed}");
    let (status, refused) = send(
        &http,
        http.post(api(&server, "/docs/spec-review/merge"))
            .bearer_auth(ADMIN)
            .header("if-match", tag)
            .json(&json!({})),
        "merge",
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{refused}");
    assert!(
        refused["type"]
            .as_str()
            .is_some_and(|t| t.ends_with("change-not-reviewable")),
        "{refused}"
    );
    owner.close().await;
    server.stop().await;
}

/// Every log row of a document, snapshots or not.
async fn log_rows_all(dir: &std::path::Path, name: &str) -> i64 {
    let pool = open_db(dir).await;
    let n: i64 = sqlx::query_scalar(
        "SELECT CAST(COALESCE(MAX(u.seq), 0) AS BIGINT) FROM doc_updates u \
         JOIN documents d ON d.id = u.doc_id WHERE d.name = $1",
    )
    .bind(name)
    .fetch_one(&pool)
    .await
    .expect("max seq");
    pool.close().await;
    n
}

/// A merge names what the reviewer saw: a change that grew since is refused (409
/// `change-grew`), "every open change" with a listing that no longer holds (a change
/// appeared) is refused (412), and a merge naming neither is refused (428); nothing applied.
#[tokio::test]
async fn a_change_that_grows_after_the_listing_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = branch_server(dir.path(), Default::default()).await;
    let http = reqwest::Client::new();
    let owner = parent_and_branch(&http, &server).await;
    let mut alice =
        Client::connect(&ws(&server, "spec-review", "alice", Permission::Write), 21).await;
    alice.insert(5, " dear").await;
    alice.durable_ack(1).await;
    let (listed, old_tag) = changes(&http, &server).await;
    let change = listed["changes"][0].clone();
    let (id, seen) = (
        change["id"].as_i64().expect("id"),
        change["last_seq"].clone(),
    );
    // Alice goes on typing within the session: her change grows past what was reviewed.
    alice.insert(0, "HIDDEN ").await;
    alice.durable_ack(2).await;
    let merge = |body: Value, tag: Option<&str>| {
        let mut req = http
            .post(api(&server, "/docs/spec-review/merge"))
            .bearer_auth(ADMIN)
            .json(&body);
        if let Some(tag) = tag {
            req = req.header("if-match", tag);
        }
        req
    };
    let (status, grew) = send(
        &http,
        merge(json!({"changes": [{"id": id, "last_seq": seen}]}), None),
        "merge",
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{grew}");
    assert!(grew["type"]
        .as_str()
        .is_some_and(|t| t.ends_with("change-grew")));
    assert!(grew["current"]["last_seq"].as_i64() > seen.as_i64());
    let (status, stale) = send(&http, merge(json!({}), Some(&old_tag)), "merge").await;
    assert_eq!(status, StatusCode::PRECONDITION_FAILED, "{stale}");
    let (status, unnamed) = send(&http, merge(json!({"changes": [id]}), None), "merge").await;
    assert_eq!(status, StatusCode::PRECONDITION_REQUIRED, "{unnamed}");
    let fresh = Client::connect(&ws(&server, "spec", "reader", Permission::Read), 31).await;
    assert_eq!(fresh.text(), "Hello world", "nothing merged");
    fresh.close().await;
    // Reviewed again, it merges, all of it.
    let (listed, tag) = changes(&http, &server).await;
    let last = listed["changes"][0]["last_seq"].clone();
    let (status, merged) = send(
        &http,
        merge(
            json!({"changes": [{"id": id, "last_seq": last}]}),
            Some(&tag),
        ),
        "merge",
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{merged}");
    let fresh = Client::connect(&ws(&server, "spec", "reader", Permission::Read), 32).await;
    assert_eq!(fresh.text(), "HIDDEN Hello dear world");
    fresh.close().await;
    alice.close().await;
    owner.close().await;
    server.stop().await;
}

/// A reject sent while a merge of the same change is between applying it and recording it
/// waits for the merge (the parent's merge lock) and is then refused: the change is merged,
/// and the parent holds it. Content and decision agree.
#[tokio::test]
async fn a_reject_racing_a_merge_leaves_content_and_decision_in_agreement() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hold = Arc::new(quire_server::app::EditHold::default());
    let hooks = quire_server::app::TestHooks {
        merge_hold: Some(hold.clone()),
        ..Default::default()
    };
    let server = Arc::new(branch_server(dir.path(), hooks).await);
    let http = reqwest::Client::new();
    let owner = parent_and_branch(&http, &server).await;
    let mut alice =
        Client::connect(&ws(&server, "spec-review", "alice", Permission::Write), 21).await;
    alice.insert(5, " dear").await;
    alice.durable_ack(1).await;
    let (listed, _) = changes(&http, &server).await;
    let change = listed["changes"][0].clone();
    let id = change["id"].as_i64().expect("id");
    let merging = {
        let (http, server) = (http.clone(), server.clone());
        let body = json!({"changes": [{"id": id, "last_seq": change["last_seq"]}]});
        tokio::spawn(async move {
            send(
                &http,
                http.post(api(&server, "/docs/spec-review/merge"))
                    .bearer_auth(ADMIN)
                    .json(&body),
                "merge",
            )
            .await
        })
    };
    tokio::time::timeout(Duration::from_secs(10), hold.reached.notified())
        .await
        .expect("the merge applied its change");
    let rejecting = {
        let (http, server) = (http.clone(), server.clone());
        tokio::spawn(async move {
            send(
                &http,
                http.post(api(
                    &server,
                    &format!("/docs/spec-review/changes/{id}/reject"),
                ))
                .bearer_auth(ADMIN),
                "reject",
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!rejecting.is_finished(), "the reject waits for the merge");
    hold.resume.notify_one();
    let (status, merged) = merging.await.expect("merge task");
    assert_eq!(status, StatusCode::OK, "{merged}");
    let (status, refused) = rejecting.await.expect("reject task");
    assert_eq!(status, StatusCode::CONFLICT, "{refused}");
    let (listed, _) = changes(&http, &server).await;
    assert_eq!(listed["changes"][0]["state"], "merged");
    let fresh = Client::connect(&ws(&server, "spec", "reader", Permission::Read), 33).await;
    assert_eq!(fresh.text(), "Hello dear world");
    fresh.close().await;
    alice.close().await;
    owner.close().await;
}

/// A merge waiting for the parent's merge lock (a reject here, behind a merge paused between
/// applying and recording) holds no slot of the gate while it waits, and gives up after
/// `merge_lock_wait` with 503. Before the fix it took its admission first and waited without
/// a deadline: on a node with one slot, every whole-document read waited behind it.
#[tokio::test]
async fn a_decision_waiting_for_the_parents_lock_holds_no_slot_and_has_a_deadline() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hold = Arc::new(quire_server::app::EditHold::default());
    let hooks = quire_server::app::TestHooks {
        merge_hold: Some(hold.clone()),
        ..Default::default()
    };
    let mut cfg = secured(dir.path());
    cfg.room.history.version_idle = GAP;
    cfg.gate.per_node = 1;
    cfg.gate.wait = Duration::from_millis(500);
    cfg.merge_lock_wait = Duration::from_secs(2);
    let server = Arc::new(TestServer::start_with_hooks(cfg, hooks).await);
    let http = reqwest::Client::new();
    let owner = parent_and_branch(&http, &server).await;
    let mut alice =
        Client::connect(&ws(&server, "spec-review", "alice", Permission::Write), 21).await;
    alice.insert(5, " dear").await;
    alice.durable_ack(1).await;
    alice.insert(0, "Oh ").await;
    alice.durable_ack(2).await;
    let (listed, _) = changes(&http, &server).await;
    let change = listed["changes"][0].clone();
    let id = change["id"].as_i64().expect("id");
    let merging = {
        let (http, server) = (http.clone(), server.clone());
        let body = json!({"changes": [{"id": id, "last_seq": change["last_seq"]}]});
        tokio::spawn(async move {
            send(
                &http,
                http.post(api(&server, "/docs/spec-review/merge"))
                    .bearer_auth(ADMIN)
                    .json(&body),
                "merge",
            )
            .await
        })
    };
    tokio::time::timeout(Duration::from_secs(10), hold.reached.notified())
        .await
        .expect("the merge applied its change");
    let started = std::time::Instant::now();
    let rejecting = {
        let (http, server) = (http.clone(), server.clone());
        tokio::spawn(async move {
            send(
                &http,
                http.post(api(
                    &server,
                    &format!("/docs/spec-review/changes/{id}/reject"),
                ))
                .bearer_auth(ADMIN),
                "reject",
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    // While the reject waits, the node's one slot is free: a whole-document read answers.
    let (status, body) = send(
        &http,
        http.get(api(&server, "/docs/spec/json")).bearer_auth(ADMIN),
        "read",
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, refused) = rejecting.await.expect("reject task");
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{refused}");
    assert_eq!(
        refused["type"],
        "https://quire.dev/problems/document-busy-merging"
    );
    assert!(started.elapsed() >= Duration::from_secs(2));
    hold.resume.notify_one();
    let (status, merged) = merging.await.expect("merge task");
    assert_eq!(status, StatusCode::OK, "{merged}");
    alice.close().await;
    owner.close().await;
}

/// A closed connection's presence client id stays its user's for `presence_grace`: another
/// user's state under it is refused, the same user reconnecting takes it back.
#[tokio::test]
async fn a_closed_connections_presence_cannot_be_taken_over() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(secured(dir.path())).await;
    let doc = "presence";
    let http = reqwest::Client::new();
    let (status, _) = send(
        &http,
        http.post(api(&server, "/docs"))
            .bearer_auth(ADMIN)
            .json(&json!({ "name": doc })),
        "create",
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let mut watcher = Client::connect(&ws(&server, doc, "walt", Permission::Read), 1).await;
    let mut alice = Client::connect(&ws(&server, doc, "alice", Permission::Write), 2).await;
    alice
        .send_raw(presence_at(55, 1, r#"{"name":"alice"}"#))
        .await;
    assert!(
        watcher
            .pump_until(PATIENCE, |c| c
                .awareness
                .get(&55)
                .is_some_and(|s| s.contains("alice")))
            .await
    );
    alice.close().await;
    assert!(
        watcher
            .pump_until(PATIENCE, |c| !c.awareness.contains_key(&55))
            .await,
        "alice's state removed when she left"
    );
    let mut mallory = Client::connect(&ws(&server, doc, "mallory", Permission::Write), 3).await;
    mallory
        .send_raw(presence_at(55, 9, r#"{"name":"alice"}"#))
        .await;
    mallory.durable_ack(1).await;
    assert!(
        !watcher
            .pump_until(Duration::from_millis(300), |c| c
                .awareness
                .contains_key(&55))
            .await,
        "mallory's state never shows under alice's id"
    );
    let mut back = Client::connect(&ws(&server, doc, "alice", Permission::Write), 4).await;
    back.send_raw(presence_at(55, 12, r#"{"name":"alice"}"#))
        .await;
    assert!(
        watcher
            .pump_until(PATIENCE, |c| c
                .awareness
                .get(&55)
                .is_some_and(|s| s.contains("\"user\":\"alice\"")))
            .await,
        "alice reconnecting takes her id back"
    );
    back.close().await;
    mallory.close().await;
    watcher.close().await;
    server.stop().await;
}

/// A merge that applied a change and stopped before recording it (the process died between
/// the append and the decision) leaves the change in the parent with no decision: a reject then
/// finds it there, records it as merged and is refused. (The gap is made here by applying the
/// change's own update to the parent.)
#[tokio::test]
async fn a_reject_of_a_change_already_in_the_parent_records_it_merged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = branch_server(dir.path(), Default::default()).await;
    let http = reqwest::Client::new();
    let owner = parent_and_branch(&http, &server).await;
    let mut alice =
        Client::connect(&ws(&server, "spec-review", "alice", Permission::Write), 21).await;
    let update = alice.insert(5, " dear").await;
    alice.durable_ack(1).await;
    let (status, applied) = send(
        &http,
        http.post(api(&server, "/docs/spec/update"))
            .bearer_auth(ADMIN)
            .header("content-type", "application/octet-stream")
            .body(update),
        "update",
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{applied}");
    let (listed, _) = changes(&http, &server).await;
    let id = listed["changes"][0]["id"].as_i64().expect("id");
    assert_eq!(listed["changes"][0]["state"], "open");
    let (status, refused) = send(
        &http,
        http.post(api(
            &server,
            &format!("/docs/spec-review/changes/{id}/reject"),
        ))
        .bearer_auth(ADMIN),
        "reject",
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{refused}");
    let (listed, _) = changes(&http, &server).await;
    assert_eq!(listed["changes"][0]["state"], "merged", "{listed}");
    let fresh = Client::connect(&ws(&server, "spec", "reader", Permission::Read), 34).await;
    assert_eq!(fresh.text(), "Hello dear world");
    fresh.close().await;
    alice.close().await;
    owner.close().await;
    server.stop().await;
}
