//! The HTTP API: metadata with optimistic versions, idempotency keys, the content API through
//! the room, deletion (tokens and roles: `tokens.rs`).

mod common;

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use common::*;
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::sync::Barrier;
use yrs::updates::decoder::Decode;
use yrs::{GetString, ReadTxn, Text, Transact};

/// Every `/docs/{name}` route takes the document's name, the one in its WebSocket URL,
/// percent-encoded: `/` and spaces in a name are one path segment, and the `Location` of a
/// created document is its address. The name is what a new user tries first.
#[tokio::test]
async fn documents_are_addressed_by_their_websocket_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(test_config(dir.path())).await;
    let http = reqwest::Client::new();
    let resp = http
        .post(api(&server, "/docs"))
        .json(&json!({ "name": "team/plan b", "title": "t" }))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), StatusCode::CREATED);
    assert_eq!(resp.headers()["location"], "/api/v1/docs/team%2Fplan%20b");
    let created: Value = resp.json().await.expect("json");
    assert!(created["id"].is_i64(), "the id stays a field: {created}");

    let mut c = Client::connect(&server.url("team%2Fplan%20b"), 1).await;
    c.insert(0, "hello").await;
    c.durable_ack(1).await;
    let got: Value = http
        .get(api(&server, "/docs/team%2Fplan%20b/json"))
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    assert_eq!(got["text"], "hello");
    let meta: Value = http
        .get(api(&server, "/docs/team%2Fplan%20b"))
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    assert_eq!(meta["name"], "team/plan b");
    // A numeric id is a name like any other: no document has it.
    let by_id = http
        .get(api(&server, &format!("/docs/{}", created["id"])))
        .send()
        .await
        .expect("get");
    assert_eq!(by_id.status(), StatusCode::NOT_FOUND);
    c.close().await;
    server.stop().await;
}

#[tokio::test]
async fn documents_carry_versions_in_etags_and_patch_requires_if_match() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(test_config(dir.path())).await;
    let http = reqwest::Client::new();
    let doc = create(&http, &server, "meta").await;
    let id = quire_server::http::doc_path(doc["name"].as_str().expect("name"));
    assert_eq!(doc["version"], 1);

    let got = http
        .get(api(&server, &format!("/docs/{id}")))
        .send()
        .await
        .expect("get");
    assert_eq!(got.headers()["etag"], "\"1\"");

    let url = api(&server, &format!("/docs/{id}"));
    let missing = http
        .patch(&url)
        .json(&json!({"title": "x"}))
        .send()
        .await
        .expect("patch");
    assert_eq!(missing.status(), StatusCode::PRECONDITION_REQUIRED);
    assert!(problem_type(missing).await.ends_with("/if-match-required"));

    let ok = http
        .patch(&url)
        .header("if-match", "\"1\"")
        .json(&json!({"title": "first"}))
        .send()
        .await
        .expect("patch");
    assert_eq!(ok.status(), StatusCode::OK);
    assert_eq!(ok.headers()["etag"], "\"2\"");

    let stale = http
        .patch(&url)
        .header("if-match", "\"1\"")
        .json(&json!({"title": "second"}))
        .send()
        .await
        .expect("patch");
    assert_eq!(stale.status(), StatusCode::PRECONDITION_FAILED);
    assert_eq!(stale.headers()["etag"], "\"2\"");
    let body: Value = stale.json().await.expect("json");
    assert_eq!(
        body["current"]["title"], "first",
        "412 carries the current row"
    );

    // A taken name is a conflict; a bad one a 400.
    let dup = http
        .post(api(&server, "/docs"))
        .json(&json!({"name": "meta"}))
        .send()
        .await
        .expect("post");
    assert_eq!(dup.status(), StatusCode::CONFLICT);
    let bad = http
        .post(api(&server, "/docs"))
        .json(&json!({"name": ""}))
        .send()
        .await
        .expect("post");
    assert!(problem_type(bad).await.ends_with("/invalid-document-name"));
    server.stop().await;
}

#[tokio::test]
async fn listing_pages_with_a_cursor_and_filters() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(test_config(dir.path())).await;
    let http = reqwest::Client::new();
    for n in ["a/1", "a/2", "a/3", "b/1", "a/4"] {
        create(&http, &server, n).await;
    }
    let mut names = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut url = api(&server, "/docs?prefix=a/&limit=2");
        if let Some(c) = &cursor {
            url.push_str(&format!("&cursor={c}"));
        }
        let page: Value = http.get(url).json_body().await;
        pages += 1;
        for d in page["items"].as_array().expect("items") {
            names.push(d["name"].as_str().expect("name").to_owned());
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    assert_eq!(names, ["a/1", "a/2", "a/3", "a/4"]);
    assert_eq!(pages, 2, "two full pages, the second ends the listing");
    let by_owner: Value = http
        .get(api(&server, "/docs?owner=nobody"))
        .json_body()
        .await;
    assert_eq!(by_owner["items"].as_array().map(Vec::len), Some(0));
    let bad = http
        .get(api(&server, "/docs?cursor=zzz"))
        .send()
        .await
        .expect("get");
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    server.stop().await;
}

/// Two PATCHes with the same If-Match, released together by a barrier: exactly one wins.
#[tokio::test]
async fn two_patches_with_one_version_forced_to_interleave_give_one_200_and_one_412() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(test_config(dir.path())).await;
    let http = reqwest::Client::new();
    let id = create(&http, &server, "race").await["name"]
        .as_str()
        .expect("name")
        .to_owned();
    let url = api(&server, &format!("/docs/{id}"));
    for round in 0..5 {
        let version = http
            .get(&url)
            .send()
            .await
            .expect("get")
            .json::<Value>()
            .await
            .expect("json")["version"]
            .as_i64()
            .expect("version");
        let barrier = Arc::new(Barrier::new(2));
        let mut tasks = Vec::new();
        for who in ["left", "right"] {
            let (barrier, http, url) = (barrier.clone(), http.clone(), url.clone());
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                let resp = http
                    .patch(&url)
                    .header("if-match", format!("\"{version}\""))
                    .json(&json!({ "title": format!("{who}-{round}") }))
                    .send()
                    .await
                    .expect("patch");
                (who, resp.status())
            }));
        }
        let mut results = Vec::new();
        for t in tasks {
            results.push(t.await.expect("task"));
        }
        let winners: Vec<_> = results
            .iter()
            .filter(|(_, s)| *s == StatusCode::OK)
            .collect();
        let losers: Vec<_> = results
            .iter()
            .filter(|(_, s)| *s == StatusCode::PRECONDITION_FAILED)
            .collect();
        assert_eq!(
            (winners.len(), losers.len()),
            (1, 1),
            "round {round}: {results:?}"
        );
        let row: Value = http.get(&url).json_body().await;
        assert_eq!(row["title"], format!("{}-{round}", winners[0].0));
        assert_eq!(row["version"], version + 1);
    }
    server.stop().await;
}

#[tokio::test]
async fn idempotency_keys_replay_refuse_mismatches_and_allow_one_effect() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(test_config(dir.path())).await;
    let http = reqwest::Client::new();
    let post = |key: &str, name: &str| {
        http.post(api(&server, "/docs"))
            .header("idempotency-key", key)
            .json(&json!({ "name": name }))
            .send()
    };
    let first = post("k-1", "idem").await.expect("post");
    assert_eq!(first.status(), StatusCode::CREATED);
    let first_body = first.text().await.expect("body");
    let again = post("k-1", "idem").await.expect("post");
    assert_eq!(
        again.status(),
        StatusCode::CREATED,
        "replayed, not a 409 conflict"
    );
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.text().await.expect("body"), first_body);
    let other = post("k-1", "something-else").await.expect("post");
    assert_eq!(other.status(), StatusCode::UNPROCESSABLE_ENTITY);

    // Two concurrent requests with one key, released together: one effect, same response.
    for round in 0..5 {
        let barrier = Arc::new(Barrier::new(2));
        let mut tasks = Vec::new();
        for _ in 0..2 {
            let (barrier, http) = (barrier.clone(), http.clone());
            let url = api(&server, "/docs");
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                let r = http
                    .post(url)
                    .header("idempotency-key", format!("race-{round}"))
                    .json(&json!({ "name": format!("race-{round}") }))
                    .send()
                    .await
                    .expect("post");
                (r.status(), r.text().await.expect("body"))
            }));
        }
        let a = tasks.remove(0).await.expect("task");
        let b = tasks.remove(0).await.expect("task");
        assert_eq!(a, b, "round {round}: both callers get the same response");
        assert_eq!(a.0, StatusCode::CREATED);
    }
    let all: Value = http
        .get(api(&server, "/docs?prefix=race-"))
        .json_body()
        .await;
    assert_eq!(
        all["items"].as_array().map(Vec::len),
        Some(5),
        "one document per key"
    );
    server.stop().await;
}

#[tokio::test]
async fn content_goes_through_the_room_and_reaches_live_clients() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(test_config(dir.path())).await;
    let http = reqwest::Client::new();
    let id = create(&http, &server, "content").await["name"]
        .as_str()
        .expect("name")
        .to_owned();
    let mut live = Client::connect(&server.url("content"), 1).await;

    let author = yrs::Doc::with_client_id(77);
    let text = author.get_or_insert_text("text");
    let update = {
        let mut txn = author.transact_mut();
        text.insert(&mut txn, 0, "over http");
        txn.encode_update_v1()
    };
    let resp = http
        .post(api(&server, &format!("/docs/{id}/update")))
        .header("content-type", "application/octet-stream")
        .body(update.clone())
        .send()
        .await
        .expect("post");
    assert_eq!(resp.status(), StatusCode::OK);
    let body: Value = resp.json().await.expect("json");
    assert_eq!(body["seq"], 1, "committed as log row 1");
    assert!(live.pump_until(PATIENCE, |c| c.text() == "over http").await);
    assert_eq!(log_rows(dir.path(), "content").await, 1);

    // Full state, then only the difference from a state vector.
    let full = http
        .get(api(&server, &format!("/docs/{id}/update")))
        .send()
        .await
        .expect("get")
        .bytes()
        .await
        .expect("bytes");
    let fresh = yrs::Doc::new();
    fresh
        .transact_mut()
        .apply_update(yrs::Update::decode_v1(&full).expect("v1"))
        .expect("apply");
    assert_eq!(
        fresh
            .get_or_insert_text("text")
            .get_string(&fresh.transact()),
        "over http"
    );
    let sv = base64::engine::general_purpose::STANDARD
        .encode(author.transact().state_vector().encode_v1_bytes());
    let diff = http
        .get(api(
            &server,
            &format!("/docs/{id}/update?sv={}", urlencode(&sv)),
        ))
        .send()
        .await
        .expect("get")
        .bytes()
        .await
        .expect("bytes");
    assert_eq!(diff.as_ref(), [0, 0], "nothing the author lacks");

    let json: Value = http
        .get(api(&server, &format!("/docs/{id}/json")))
        .json_body()
        .await;
    assert_eq!(json, json!({ "text": "over http" }));

    let bad = http
        .post(api(&server, &format!("/docs/{id}/update")))
        .body(vec![0xff, 0xff, 0xff])
        .send()
        .await
        .expect("post");
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    server.stop().await;
}

#[tokio::test]
async fn deleting_a_document_closes_its_sockets_with_4404_until_restored() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(test_config(dir.path())).await;
    let http = reqwest::Client::new();
    let id = create(&http, &server, "doomed").await["name"]
        .as_str()
        .expect("name")
        .to_owned();
    let url = server.url("doomed");
    let mut a = Client::connect(&url, 1).await;
    let mut b = Client::connect(&url, 2).await;
    a.insert(0, "keep me").await;
    a.durable_ack(1).await;

    let del = http
        .delete(api(&server, &format!("/docs/{id}")))
        .send()
        .await
        .expect("delete");
    assert_eq!(del.status(), StatusCode::OK);
    assert_eq!(a.wait_closed().await, Some(4404));
    assert_eq!(b.wait_closed().await, Some(4404));
    let mut again = Client::connect_unsynced(&url, 3).await;
    assert_eq!(
        again.wait_closed().await,
        Some(4404),
        "cannot reconnect while deleted"
    );
    let gone = http
        .get(api(&server, &format!("/docs/{id}/json")))
        .send()
        .await
        .expect("get");
    assert_eq!(gone.status(), StatusCode::GONE);

    let restored = http
        .post(api(&server, &format!("/docs/{id}/restore")))
        .send()
        .await
        .expect("restore");
    assert_eq!(restored.status(), StatusCode::OK);
    let back = Client::connect(&url, 4).await;
    assert_eq!(back.text(), "keep me");
    server.stop().await;
}

#[tokio::test]
async fn idempotency_keys_expire() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = test_config(dir.path());
    cfg.idempotency_ttl = Duration::from_millis(200);
    let server = TestServer::start(cfg).await;
    let http = reqwest::Client::new();
    let post = |name: &str| {
        http.post(api(&server, "/docs"))
            .header("idempotency-key", "short-lived")
            .json(&json!({ "name": name }))
            .send()
    };
    assert_eq!(
        post("one").await.expect("post").status(),
        StatusCode::CREATED
    );
    assert_eq!(
        post("two").await.expect("post").status(),
        StatusCode::UNPROCESSABLE_ENTITY,
        "reused within the TTL"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        post("two").await.expect("post").status(),
        StatusCode::CREATED,
        "an expired key is free again"
    );
    server.stop().await;
}

/// Text with U+0000 is refused with 400 on both backends (PostgreSQL cannot store it in a
/// text column; found by schemathesis on the PostgreSQL pass), in JSON bodies and in query
/// strings, and nothing is written.
#[tokio::test]
async fn text_with_a_nul_character_is_refused_everywhere_with_400() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(secured(dir.path())).await;
    let http = reqwest::Client::new();
    let resp = http
        .post(api(&server, "/tokens/revoke"))
        .bearer_auth(ADMIN)
        .json(&json!({"token_id": "a\u{0}b"}))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert!(problem_type(resp).await.ends_with("invalid-text"));
    let resp = http
        .post(api(&server, "/docs"))
        .bearer_auth(ADMIN)
        .json(&json!({"name": "fine", "title": "ti\u{0}tle"}))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let resp = http
        .get(api(&server, "/docs?prefix=a%00"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    // Nothing was created, and a title with an escaped backslash before "u0000" is fine.
    let resp = http
        .post(api(&server, "/docs"))
        .bearer_auth(ADMIN)
        .json(&json!({"name": "fine", "title": "\\u0000 is how JSON writes NUL"}))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), StatusCode::CREATED);
    server.stop().await;
}

/// Presence cannot be forged: mallory (another user) sends alice's client id with a higher
/// clock and a name of its choosing, and the others keep seeing alice's state, stamped with
/// the identity the server verified (with alice's profile name and colour); alice's second
/// tab (the same user) may take the id over, and mallory's own id works as usual.
#[tokio::test]
async fn presence_cannot_be_forged_and_carries_the_verified_identity() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(secured(dir.path())).await;
    let http = reqwest::Client::new();
    let alice_token = token("alice", "room", quire_server::auth::Permission::Write);
    let me = http
        .get(api(&server, "/me"))
        .bearer_auth(&alice_token)
        .send()
        .await
        .expect("me");
    let etag = me.headers()["etag"].to_str().expect("etag").to_owned();
    let resp = http
        .patch(api(&server, "/users/alice"))
        .bearer_auth(&alice_token)
        .header("If-Match", etag)
        .json(&json!({"display_name": "Alice Example", "color": "#e11d48"}))
        .send()
        .await
        .expect("profile");
    assert!(resp.status().is_success(), "{}", resp.status());
    let url = |user: &str| {
        format!(
            "{}?token={}",
            server.url("room"),
            token(user, "room", quire_server::auth::Permission::Write)
        )
    };
    let mut alice = Client::connect(&url("alice"), 1).await;
    let mut bob = Client::connect(&url("bob"), 2).await;
    let mut mallory = Client::connect(&url("mallory"), 3).await;
    alice
        .send_raw(presence_at(
            1,
            1,
            r#"{"name":"alice","quire":{"user":"root"}}"#,
        ))
        .await;
    assert!(
        bob.pump_until(PATIENCE, |c| c.awareness.contains_key(&1))
            .await
    );
    let state: Value = serde_json::from_str(&bob.awareness[&1]).expect("json");
    assert_eq!(state["name"], "alice");
    assert_eq!(
        state["quire"],
        json!({"user": "alice", "name": "Alice Example", "color": "#e11d48"}),
        "the verified identity, not the client's"
    );

    // Mallory speaks for alice's id, then for its own.
    mallory
        .send_raw(presence_at(1, 9, r#"{"name":"mallory-as-alice"}"#))
        .await;
    mallory
        .send_raw(presence_at(3, 1, r#"{"name":"mallory"}"#))
        .await;
    assert!(
        bob.pump_until(PATIENCE, |c| c.awareness.contains_key(&3))
            .await
    );
    let state: Value = serde_json::from_str(&bob.awareness[&1]).expect("json");
    assert_eq!(state["name"], "alice", "a forged state reached bob");
    let own: Value = serde_json::from_str(&bob.awareness[&3]).expect("json");
    assert_eq!(own["quire"]["user"], "mallory");
    assert!(server.metric("quire_awareness_refused_total").await >= 1.0);

    // Alice's second tab (the same user) takes the id over while the first is open.
    let mut tab = Client::connect(&url("alice"), 4).await;
    tab.send_raw(presence_at(1, 10, r#"{"name":"alice (tab 2)"}"#))
        .await;
    assert!(
        bob.pump_until(PATIENCE, |c| c
            .awareness
            .get(&1)
            .is_some_and(|s| s.contains("tab 2")))
            .await
    );
    alice
        .pump_until(Duration::from_millis(100), |_| false)
        .await;
    for c in [alice, bob, mallory, tab] {
        c.close().await;
    }
    server.stop().await;
}
