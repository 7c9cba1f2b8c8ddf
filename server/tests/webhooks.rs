//! Webhooks through the transactional outbox: at-least-once delivery through failures, the
//! same id on duplicates, signatures, debouncing, the dead-letter table, and delivery after
//! the server is killed between the commit and the delivery.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use common::*;
use serde_json::{json, Value};

const SECRET: &str = "webhook-secret";

#[derive(Clone, Debug)]
struct Received {
    id: String,
    kind: String,
    body: Value,
    signature: String,
    raw: String,
    accepted: bool,
}

/// A local webhook receiver that fails the first `fail_first` attempts of every event id
/// (all of them when `fail_first` is `usize::MAX`).
#[derive(Clone)]
struct Receiver {
    log: Arc<Mutex<Vec<Received>>>,
    fail_first: usize,
}

impl Receiver {
    async fn start(fail_first: usize, listener: tokio::net::TcpListener) -> Receiver {
        let r = Receiver {
            log: Arc::new(Mutex::new(Vec::new())),
            fail_first,
        };
        let app = Router::new()
            .route("/hook", post(hook))
            .with_state(r.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        r
    }

    fn accepted(&self) -> Vec<Received> {
        self.log
            .lock()
            .map(|l| l.iter().filter(|r| r.accepted).cloned().collect())
            .unwrap_or_default()
    }

    fn all(&self) -> Vec<Received> {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }

    async fn wait_for(&self, pred: impl Fn(&[Received]) -> bool) -> bool {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while tokio::time::Instant::now() < deadline {
            if pred(&self.accepted()) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }
}

async fn hook(State(r): State<Receiver>, headers: HeaderMap, raw: String) -> StatusCode {
    let body: Value = serde_json::from_str(&raw).unwrap_or(Value::Null);
    let id = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let mut log = match r.log.lock() {
        Ok(l) => l,
        Err(_) => return StatusCode::INTERNAL_SERVER_ERROR,
    };
    let tries = log.iter().filter(|x| x.id == id).count();
    let accepted = tries >= r.fail_first;
    log.push(Received {
        id,
        kind: body["type"].as_str().unwrap_or("").to_owned(),
        signature: headers
            .get("quire-signature")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned(),
        body,
        raw,
        accepted,
    });
    if accepted {
        StatusCode::NO_CONTENT
    } else {
        StatusCode::INTERNAL_SERVER_ERROR
    }
}

async fn listener() -> (tokio::net::TcpListener, SocketAddr) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let a = l.local_addr().expect("addr");
    (l, a)
}

fn webhook_config(dir: &std::path::Path, receiver: SocketAddr) -> quire_server::config::Config {
    let mut cfg = test_config(dir);
    cfg.webhooks.urls = vec![format!("http://{receiver}/hook")];
    cfg.webhooks.secret = Some(SECRET.into());
    cfg.webhooks.backoff = Duration::from_millis(20);
    cfg.webhooks.debounce = Duration::from_millis(300);
    cfg.webhooks.max_attempts = 10;
    cfg
}

#[tokio::test]
async fn every_event_arrives_despite_failures_with_one_id_per_event() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (l, addr) = listener().await;
    let receiver = Receiver::start(2, l).await;
    let server = TestServer::start(webhook_config(dir.path(), addr)).await;
    let http = reqwest::Client::new();
    let api = |p: &str| server.http(&format!("/api/v1{p}"));

    let doc: Value = http
        .post(api("/docs"))
        .json(&json!({"name": "hooked"}))
        .json_body()
        .await;
    let id = quire_server::http::doc_path(doc["name"].as_str().expect("name"));
    // Thirty edits well inside one debounce interval: one document.updated, with the last seq.
    let mut c = Client::connect(&server.url("hooked"), 1).await;
    for i in 0..30 {
        c.insert(i, "e").await;
    }
    c.durable_ack(1).await;
    // In open mode the caller is `anonymous@ADDRESS`.
    let me: Value = http
        .get(api("/me"))
        .send()
        .await
        .expect("me")
        .json()
        .await
        .expect("json");
    let me = me["id"].as_str().expect("user id").to_owned();
    let patched = http
        .patch(api(&format!("/users/{me}")))
        .header("if-match", "\"1\"")
        .json(&json!({"display_name": "Dev"}))
        .send()
        .await
        .expect("patch");
    assert_eq!(patched.status(), StatusCode::OK);

    let kinds = ["document.created", "document.updated", "profile.updated"];
    let ok = receiver
        .wait_for(|got| kinds.iter().all(|k| got.iter().any(|r| r.kind == *k)))
        .await;
    assert!(ok, "all events delivered: {:?}", receiver.all());
    http.delete(api(&format!("/docs/{id}")))
        .send()
        .await
        .expect("delete");
    assert!(
        receiver
            .wait_for(|got| got.iter().any(|r| r.kind == "document.deleted"))
            .await
    );

    let accepted = receiver.accepted();
    let all = receiver.all();
    for r in &accepted {
        // Failed attempts and the success carry the same id, in the body too.
        let attempts: Vec<_> = all.iter().filter(|x| x.id == r.id).collect();
        assert!(attempts.len() >= 3, "{}: two failures then success", r.kind);
        assert!(attempts.iter().all(|x| x.body["id"] == r.id.as_str()));
        // The signature is HMAC-SHA256 over "<t>.<body>".
        let t: i64 = r
            .signature
            .split(',')
            .find_map(|p| p.strip_prefix("t="))
            .and_then(|t| t.parse().ok())
            .expect("t=");
        assert_eq!(
            r.signature,
            quire_server::webhooks::signature(SECRET, t, &r.raw)
        );
    }
    let updated: Vec<_> = accepted
        .iter()
        .filter(|r| r.kind == "document.updated")
        .collect();
    assert_eq!(updated.len(), 1, "debounced to one event");
    assert_eq!(
        updated[0].body["data"]["seq"], 30,
        "carrying the new log sequence"
    );
    assert_eq!(updated[0].body["data"]["name"], "hooked");

    // The worker marks an event delivered once the receiver's answer is back, which can be
    // just after the receiver has counted it: wait for the outbox to say so.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let events = loop {
        let outbox: Value = http.get(api("/admin/outbox")).json_body().await;
        let events = outbox["events"].as_array().expect("events").clone();
        let done = events.iter().all(|e| e["status"] == "delivered");
        if done || tokio::time::Instant::now() > deadline {
            break events;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(events.len(), 4);
    assert!(
        events.iter().all(|e| e["status"] == "delivered"),
        "{events:?}"
    );
    server.stop().await;
}

/// Creates document `name` and waits until the outbox view holds a dead letter (the event's
/// attempts have all failed); returns the view.
async fn create_until_dead(server: &TestServer, name: &str) -> Value {
    let http = reqwest::Client::new();
    let api = |p: &str| server.http(&format!("/api/v1{p}"));
    http.post(api("/docs"))
        .json(&json!({ "name": name }))
        .send()
        .await
        .expect("post");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let outbox: Value = http.get(api("/admin/outbox")).json_body().await;
        if outbox["dead"].as_array().is_some_and(|d| !d.is_empty()) {
            return outbox;
        }
        assert!(tokio::time::Instant::now() < deadline, "event never died");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn an_event_that_exhausts_its_attempts_moves_to_the_dead_letter_table() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (l, addr) = listener().await;
    let receiver = Receiver::start(usize::MAX, l).await;
    let mut cfg = webhook_config(dir.path(), addr);
    cfg.webhooks.max_attempts = 3;
    let server = TestServer::start(cfg).await;
    let outbox = create_until_dead(&server, "undeliverable").await;
    assert!(outbox["events"].as_array().is_some_and(|e| e.is_empty()));
    let dead = outbox["dead"].clone();
    assert_eq!(dead[0]["type"], "document.created");
    assert_eq!(dead[0]["attempts"], 3);
    assert!(dead[0]["last_error"].as_str().unwrap_or("").contains("500"));
    assert_eq!(receiver.all().len(), 3);
    server.stop().await;
}

/// The dashboard's Retry: a dead event goes back to the outbox with its event id, is
/// delivered, and leaves the dead-letter table; retrying it again changes nothing, and an id
/// that is no dead event is 404.
#[tokio::test]
async fn a_dead_event_retried_is_delivered_with_its_event_id() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (l, addr) = listener().await;
    // Fails the first 3 attempts of each event: with 3 attempts allowed, every event dies;
    // its retry is the 4th attempt, which the receiver accepts.
    let receiver = Receiver::start(3, l).await;
    let mut cfg = webhook_config(dir.path(), addr);
    cfg.webhooks.max_attempts = 3;
    let server = TestServer::start(cfg).await;
    let http = reqwest::Client::new();
    let api = |p: &str| server.http(&format!("/api/v1{p}"));
    let dead = create_until_dead(&server, "retried").await["dead"][0].clone();
    assert!(receiver.accepted().is_empty());
    let id = dead["id"].as_i64().expect("id");

    let resp = http
        .post(api(&format!("/admin/dead/{id}/retry")))
        .send()
        .await
        .expect("retry");
    assert_eq!(resp.status(), StatusCode::OK);
    let back: Value = resp.json().await.expect("json");
    assert_eq!(back["event_id"], dead["event_id"]);
    assert_eq!(back["attempts"], 0, "its attempts are counted afresh");
    assert!(
        receiver
            .wait_for(|r| r.iter().any(|x| x.id == dead["event_id"]))
            .await,
        "the retried event was never delivered: {:?}",
        receiver.all()
    );
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let outbox: Value = http.get(api("/admin/outbox")).json_body().await;
        let delivered = outbox["events"]
            .as_array()
            .and_then(|e| e.iter().find(|e| e["id"] == id))
            .is_some_and(|e| e["status"] == "delivered");
        if delivered {
            assert_eq!(outbox["dead"], json!([]), "it left the dead-letter table");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never marked delivered"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Again (a double click): the event as it is, delivered, and nothing sent again.
    let again: Value = http
        .post(api(&format!("/admin/dead/{id}/retry")))
        .json_body()
        .await;
    assert_eq!(again["status"], "delivered");
    assert_eq!(again["event_id"], dead["event_id"]);
    let resp = http
        .post(api("/admin/dead/987654/retry"))
        .send()
        .await
        .expect("retry");
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    assert_eq!(
        receiver
            .all()
            .iter()
            .filter(|r| r.id == dead["event_id"])
            .count(),
        4,
        "three failed attempts and the retry's"
    );
    server.stop().await;
}

/// The outbox row is committed with the change; the process dies before delivering it; the
/// restarted server delivers it.
#[tokio::test]
async fn an_event_committed_before_sigkill_is_delivered_after_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path();
    // Reserve a port for the receiver, which is down at first (deliveries fail).
    let (l, addr) = listener().await;
    drop(l);
    let hook = format!("http://{addr}/hook");
    let args = [
        "--webhook-url",
        hook.as_str(),
        "--webhook-backoff",
        "100ms",
        "--webhook-max-attempts",
        "1000",
    ];
    let server = ServerProcess::start(db, &args).await;
    let http = reqwest::Client::new();
    let base = format!("http://{}/api/v1", server.addr);
    let created = http
        .post(format!("{base}/docs"))
        .json(&json!({"name": "survivor"}))
        .send()
        .await
        .expect("post");
    assert_eq!(created.status(), StatusCode::CREATED);
    // Wait until a delivery has been tried (and failed), then kill the process.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let event_id = loop {
        let outbox: Value = http.get(format!("{base}/admin/outbox")).json_body().await;
        let e = &outbox["events"][0];
        if e["attempts"].as_i64().unwrap_or(0) >= 1 {
            assert_eq!(e["status"], "pending");
            break e["event_id"].as_str().expect("id").to_owned();
        }
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    server.signal("KILL");
    drop(server);

    let l = tokio::net::TcpListener::bind(addr)
        .await
        .expect("rebind the receiver port");
    let receiver = Receiver::start(0, l).await;
    let server = ServerProcess::start(db, &args).await;
    assert!(
        receiver
            .wait_for(|got| got.iter().any(|r| r.id == event_id))
            .await,
        "delivered after the restart"
    );
    let got: HashMap<_, _> = receiver
        .accepted()
        .into_iter()
        .map(|r| (r.id.clone(), r.kind))
        .collect();
    assert_eq!(
        got.get(&event_id).map(String::as_str),
        Some("document.created")
    );
    server.signal("TERM");
}
