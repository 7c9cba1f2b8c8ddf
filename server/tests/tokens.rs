//! Tokens, revocations and roles end to end: what a token lets a socket and an API call do, and
//! how a revoked token or a changed role closes the sockets it opened.

mod common;

use std::time::Duration;

use common::*;
use quire_server::auth::{Auth, Permission};
use reqwest::StatusCode;
use serde_json::{json, Value};

#[tokio::test]
async fn tokens_scope_sockets_and_api_calls() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(secured(dir.path())).await;
    let http = reqwest::Client::new();
    let ws = |doc: &str, t: &str| format!("{}?token={t}", server.url(doc));

    // No token, a bad token, an expired token: 401 before the upgrade.
    for url in [
        server.url("doc-a"),
        ws("doc-a", "not-a-token"),
        ws("doc-a", &{
            let auth = Auth::new(&[KEY.into()], None).expect("key");
            auth.issue(
                "ann",
                "*",
                Permission::Write,
                60,
                quire_server::auth::now_secs() - 3600,
            )
            .expect("issue")
            .0
        }),
    ] {
        let err = tokio_tungstenite::connect_async(&url)
            .await
            .expect_err("refused");
        assert!(err.to_string().contains("401"), "{url}: {err}");
    }
    // A token for document A on document B: refused.
    let for_a = token("ann", "doc-a", Permission::Write);
    let err = tokio_tungstenite::connect_async(ws("doc-b", &for_a))
        .await
        .expect_err("refused");
    assert!(err.to_string().contains("403"), "{err}");

    // Read-only: receives, may not write; the refused update is not logged.
    let mut writer = Client::connect(&ws("doc-a", &for_a), 1).await;
    writer.insert(0, "from writer").await;
    writer.durable_ack(1).await;
    let reader_token = token("bo", "doc-*", Permission::Read);
    let mut reader = Client::connect(&ws("doc-a", &reader_token), 2).await;
    assert_eq!(reader.text(), "from writer");
    reader.insert(0, "sneaky ").await;
    assert!(
        reader
            .pump_until(PATIENCE, |c| c.permission_denied.is_some())
            .await,
        "told with an Auth permission-denied message"
    );
    reader.durable_ack(2).await;
    assert_eq!(log_rows(dir.path(), "doc-a").await, 1);
    let check = Client::connect(&ws("doc-a", &for_a), 3).await;
    assert_eq!(check.text(), "from writer");

    // The token in the Authorization header works too.
    let req = tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(
        server.url("doc-a"),
    )
    .map(|mut r| {
        r.headers_mut().insert(
            "authorization",
            format!("Bearer {for_a}").parse().expect("header"),
        );
        r
    })
    .expect("request");
    assert!(tokio_tungstenite::connect_async(req).await.is_ok());

    // The token as a WebSocket subprotocol (what browsers can send): "quire" is selected.
    let req = tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(
        server.url("doc-a"),
    )
    .map(|mut r| {
        r.headers_mut().insert(
            "sec-websocket-protocol",
            format!("quire, {for_a}").parse().expect("header"),
        );
        r
    })
    .expect("request");
    let (_, resp) = tokio_tungstenite::connect_async(req)
        .await
        .expect("subprotocol token");
    assert_eq!(resp.headers()["sec-websocket-protocol"], "quire");

    // API: no token 401, read token can read but not patch, admin key issues tokens.
    for path in ["/docs", "/openapi.json", "/me"] {
        let none = http.get(api(&server, path)).send().await.expect("get");
        assert_eq!(none.status(), StatusCode::UNAUTHORIZED, "{path}");
    }
    let issued: Value = http
        .post(api(&server, "/tokens"))
        .bearer_auth(ADMIN)
        .json(&json!({"user": "cy", "doc": "doc-a", "permission": "read"}))
        .json_body()
        .await;
    let cy = issued["token"].as_str().expect("token").to_owned();
    let mine: Value = http
        .get(api(&server, "/me"))
        .bearer_auth(&cy)
        .json_body()
        .await;
    assert_eq!(mine["id"], "cy");
    let forbidden = http
        .post(api(&server, "/tokens"))
        .bearer_auth(&cy)
        .json(&json!({"user": "cy", "doc": "*", "permission": "admin"}))
        .send()
        .await
        .expect("post");
    assert_eq!(forbidden.status(), StatusCode::FORBIDDEN);
    // Health and metrics stay open.
    assert_eq!(http_get(server.addr, "/healthz").await.0, 200);
    assert_eq!(http_get(server.addr, "/metrics").await.0, 200);
    server.stop().await;
}

#[tokio::test]
async fn revoking_a_token_or_a_user_closes_their_sockets_with_4403() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(secured(dir.path())).await;
    let http = reqwest::Client::new();
    let issue = |user: &str| {
        http.post(api(&server, "/tokens"))
            .bearer_auth(ADMIN)
            .json(&json!({"user": user, "doc": "*", "permission": "write"}))
            .send()
    };
    let t1: Value = issue("ann")
        .await
        .expect("post")
        .json()
        .await
        .expect("json");
    let t2: Value = issue("bo").await.expect("post").json().await.expect("json");
    let url = |t: &Value| {
        format!(
            "{}?token={}",
            server.url("shared"),
            t["token"].as_str().unwrap_or("")
        )
    };
    let mut ann = Client::connect(&url(&t1), 1).await;
    let mut bo = Client::connect(&url(&t2), 2).await;

    let started = tokio::time::Instant::now();
    let r = http
        .post(api(&server, "/tokens/revoke"))
        .bearer_auth(ADMIN)
        .json(&json!({"token_id": t1["token_id"]}))
        .send()
        .await
        .expect("revoke");
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(ann.wait_closed().await, Some(4403));
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "within a second"
    );
    let again = tokio_tungstenite::connect_async(url(&t1))
        .await
        .expect_err("revoked");
    assert!(again.to_string().contains("401"));

    // A revocation written by another process (the CLI) is picked up by the watcher.
    let store = open_test_stores(dir.path()).await.api;
    let started = tokio::time::Instant::now();
    quire_server::storage::api::RevocationStore::revoke(
        &*store,
        None,
        Some("bo"),
        quire_server::storage::now_ms(),
    )
    .await
    .expect("revoke");
    assert_eq!(bo.wait_closed().await, Some(4403));
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "within a second"
    );
    server.stop().await;
}

#[tokio::test]
async fn changing_a_role_closes_open_sockets_and_takes_effect_on_reconnect() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(secured(dir.path())).await;
    let http = reqwest::Client::new();
    let owner = token("owner", "team/*", Permission::Admin);
    let doc: Value = http
        .post(api(&server, "/docs"))
        .bearer_auth(&owner)
        .json(&json!({"name": "team/plan"}))
        .json_body()
        .await;
    let id = quire_server::http::doc_path(doc["name"].as_str().expect("name"));
    let dee = token("dee", "team/*", Permission::Write);
    let url = format!("{}?token={dee}", server.url("team/plan"));
    let mut c = Client::connect(&url, 5).await;
    c.insert(0, "draft").await;
    c.durable_ack(1).await;

    let started = tokio::time::Instant::now();
    let put = http
        .put(api(&server, &format!("/docs/{id}/access/dee")))
        .bearer_auth(&owner)
        .json(&json!({"role": "viewer"}))
        .send()
        .await
        .expect("put");
    assert_eq!(put.status(), StatusCode::OK);
    assert_eq!(c.wait_closed().await, Some(4403));
    assert!(started.elapsed() < Duration::from_secs(1));
    // Back with the same token: now read-only.
    let mut c = Client::connect(&url, 6).await;
    c.insert(0, "edit ").await;
    assert!(
        c.pump_until(PATIENCE, |c| c.permission_denied.is_some())
            .await
    );
    let access: Value = http
        .get(api(&server, &format!("/docs/{id}/access")))
        .bearer_auth(&owner)
        .json_body()
        .await;
    assert_eq!(
        access,
        json!([{"user": "dee", "role": "viewer"}, {"user": "owner", "role": "owner"}])
    );
    server.stop().await;
}

#[tokio::test]
async fn scopes_hold_at_the_edges() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(secured(dir.path())).await;
    let http = reqwest::Client::new();

    // A read-only token cannot create a document by opening it.
    let reader = token("ro", "*", Permission::Read);
    let err = tokio_tungstenite::connect_async(format!("{}?token={reader}", server.url("fresh")))
        .await
        .expect_err("refused");
    assert!(err.to_string().contains("404"), "{err}");

    // `*` is not allowed in names: a token for "notes*" is a pattern, never one document.
    let star = http
        .post(api(&server, "/docs"))
        .bearer_auth(ADMIN)
        .json(&json!({"name": "notes*"}))
        .send()
        .await
        .expect("post");
    assert_eq!(star.status(), StatusCode::BAD_REQUEST);

    // A token whose subject is "admin" does not share the admin key's idempotency keys.
    let body = json!({"user": "x", "doc": "*", "permission": "admin"});
    let by_key = http
        .post(api(&server, "/tokens"))
        .bearer_auth(ADMIN)
        .header("idempotency-key", "same")
        .json(&body)
        .send()
        .await
        .expect("post");
    assert_eq!(by_key.status(), StatusCode::CREATED);
    let impostor = token("admin", "d", Permission::Read);
    let by_token = http
        .post(api(&server, "/tokens"))
        .bearer_auth(&impostor)
        .header("idempotency-key", "same")
        .json(&body)
        .send()
        .await
        .expect("post");
    assert_eq!(
        by_token.status(),
        StatusCode::FORBIDDEN,
        "no replay of the admin's token"
    );

    // Moving ownership moves the owner role.
    let ann = token("ann", "*", Permission::Admin);
    let doc: Value = http
        .post(api(&server, "/docs"))
        .bearer_auth(&ann)
        .json(&json!({"name": "handover"}))
        .json_body()
        .await;
    let id = quire_server::http::doc_path(doc["name"].as_str().expect("name"));
    let moved = http
        .patch(api(&server, &format!("/docs/{id}")))
        .bearer_auth(&ann)
        .header("if-match", "\"1\"")
        .json(&json!({"owner": "bo"}))
        .send()
        .await
        .expect("patch");
    assert_eq!(moved.status(), StatusCode::OK);
    let access: Value = http
        .get(api(&server, &format!("/docs/{id}/access")))
        .bearer_auth(ADMIN)
        .json_body()
        .await;
    assert_eq!(
        access,
        json!([{"user": "ann", "role": "editor"}, {"user": "bo", "role": "owner"}])
    );
    // A weak validator does not satisfy If-Match.
    let weak = http
        .patch(api(&server, &format!("/docs/{id}")))
        .bearer_auth(ADMIN)
        .header("if-match", "W/\"2\"")
        .json(&json!({"title": "w"}))
        .send()
        .await
        .expect("patch");
    assert_eq!(weak.status(), StatusCode::PRECONDITION_FAILED);
    server.stop().await;
}
