//! The native build of Quire's own client (`client-wasm/`, crate `quire-client`) against a real
//! server: the foundation's convergence and reconnect scenarios, offline edits across a server
//! restart, durable acknowledgements, awareness and permanent closes.

mod common;

use std::time::Duration;

use common::*;
use quire_client::{Client as QuireClient, ClientConfig, Status};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use yrs::{GetString, Observable, Text, Transact};

fn config(server: &str, doc: &str, client_id: u64) -> ClientConfig {
    let mut cfg = ClientConfig::new(server, doc);
    cfg.client_id = Some(yrs::ClientID::new(client_id));
    cfg.min_backoff = Duration::from_millis(20);
    cfg.max_backoff = Duration::from_millis(200);
    cfg
}

fn ws_base(addr: std::net::SocketAddr) -> String {
    format!("ws://{addr}")
}

fn text(c: &QuireClient) -> String {
    let t = c.doc().get_or_insert_text("content");
    let txn = c.doc().transact();
    t.get_string(&txn)
}

fn insert(c: &QuireClient, index: u32, chunk: &str) {
    let t = c.doc().get_or_insert_text("content");
    t.insert(&mut c.doc().transact_mut(), index, chunk);
}

/// Clients 1 and 2 on `doc`, both synced.
async fn connected_pair(base: &str, doc: &str) -> (QuireClient, QuireClient) {
    let a = QuireClient::connect(config(base, doc, 1));
    let b = QuireClient::connect(config(base, doc, 2));
    let (sa, sb) = within("synced", async { tokio::join!(a.synced(), b.synced()) }).await;
    sa.and(sb).expect("synced");
    (a, b)
}

async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, f)
        .await
        .unwrap_or_else(|_| panic!("timed out: {what}"))
}

async fn until(what: &str, done: impl Fn() -> bool) {
    within(what, async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
}

#[tokio::test]
async fn native_clients_converge_on_random_concurrent_edits() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(test_config(dir.path())).await;
    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let base = ws_base(server.addr);
    let clients: Vec<QuireClient> = (0..5)
        .map(|i| QuireClient::connect(config(&base, "converge", 100 + i)))
        .collect();
    for c in &clients {
        within("synced", c.synced()).await.expect("synced");
    }
    for round in 0..30 {
        for c in &clients {
            let len = text(c).len() as u32;
            if len > 4 && rng.random_bool(0.25) {
                let at = rng.random_range(0..len - 2);
                let t = c.doc().get_or_insert_text("content");
                t.remove_range(&mut c.doc().transact_mut(), at, 2);
            } else {
                insert(c, rng.random_range(0..=len), &format!("{round}"));
            }
        }
        if rng.random_bool(0.3) {
            tokio::task::yield_now().await;
        }
    }
    for c in &clients {
        within("saved", c.saved()).await.expect("saved");
    }
    let expected = text(&clients[0]);
    until("convergence", || {
        clients.iter().all(|c| text(c) == expected)
    })
    .await;
    assert!(!expected.is_empty());
    // Saved means committed: a late joiner loads it from the server.
    let late = QuireClient::connect(config(&base, "converge", 999));
    within("late joiner synced", late.synced())
        .await
        .expect("synced");
    assert_eq!(text(&late), expected, "seed {seed}");
    assert!(log_rows(dir.path(), "converge").await > 0);
    for c in clients {
        c.close().await;
    }
    server.stop().await;
}

#[tokio::test]
async fn native_clients_converge_through_random_disconnects() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(test_config(dir.path())).await;
    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let base = ws_base(server.addr);
    let clients: Vec<QuireClient> = (0..4)
        .map(|i| QuireClient::connect(config(&base, "flaky", 200 + i)))
        .collect();
    let mut online = [true; 4];
    for round in 0..40 {
        for (i, c) in clients.iter().enumerate() {
            // At either end, so no edit lands inside another one and each stays findable.
            let at = if rng.random_bool(0.5) {
                0
            } else {
                text(c).len() as u32
            };
            insert(c, at, &format!("<{i}.{round}>"));
            // Go offline or come back now and then, in the middle of the edits.
            if rng.random_bool(0.1) {
                if online[i] {
                    c.disconnect();
                } else {
                    c.reconnect();
                }
                online[i] = !online[i];
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..3))).await;
    }
    for c in &clients {
        c.reconnect();
    }
    for c in &clients {
        within("saved", c.saved()).await.expect("saved");
    }
    let expected = text(&clients[0]);
    until("convergence", || {
        clients.iter().all(|c| text(c) == expected)
    })
    .await;
    for i in 0..4 {
        for round in 0..40 {
            let part = format!("<{i}.{round}>");
            assert!(expected.contains(&part), "{part} lost (seed {seed})");
        }
    }
    let late = QuireClient::connect(config(&base, "flaky", 999));
    within("late joiner synced", late.synced())
        .await
        .expect("synced");
    assert_eq!(text(&late), expected, "seed {seed}");
    for c in clients {
        c.close().await;
    }
    server.stop().await;
}

#[tokio::test]
async fn offline_edits_made_while_the_server_is_down_are_merged_after_it_restarts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(test_config(dir.path())).await;
    let addr = server.addr;
    let base = ws_base(addr);
    let (a, b) = connected_pair(&base, "restart").await;
    insert(&a, 0, "before ");
    within("saved", a.saved()).await.expect("saved");

    server.stop().await;
    within("a offline", a.wait_for(|s| s.status != Status::Connected)).await;
    within("b offline", b.wait_for(|s| s.status != Status::Connected)).await;
    until("b has the text", || text(&b) == "before ").await;
    let len = text(&a).len() as u32;
    insert(&a, len, "offline-a ");
    insert(&b, 0, "offline-b ");
    assert!(a.state().unsaved > 0 && b.state().unsaved > 0);
    assert!(!a.state().synced);

    let server = TestServer::start_at(test_config(dir.path()), addr).await;
    within("a saved", a.saved()).await.expect("saved");
    within("b saved", b.saved()).await.expect("saved");
    until("convergence", || text(&a) == text(&b)).await;
    let merged = text(&a);
    for part in ["before", "offline-a", "offline-b"] {
        assert!(merged.contains(part), "{part} missing from {merged:?}");
    }
    a.close().await;
    b.close().await;
    server.stop().await;

    // Everything acknowledged survived another restart.
    let server = TestServer::start_at(test_config(dir.path()), addr).await;
    let c = QuireClient::connect(config(&base, "restart", 3));
    within("c synced", c.synced()).await.expect("synced");
    assert_eq!(text(&c), merged);
    c.close().await;
    server.stop().await;
}

#[tokio::test]
async fn an_acknowledged_edit_survives_a_crash() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut server = ServerProcess::start(dir.path(), &[]).await;
    let base = ws_base(server.addr);
    let a = QuireClient::connect(config(&base, "crash", 1));
    within("synced", a.synced()).await.expect("synced");
    for i in 0..50 {
        insert(&a, 0, &format!("{i},"));
    }
    within("saved", a.saved()).await.expect("saved");
    let acked = text(&a);
    server.child.start_kill().expect("kill");
    let _ = server.child.wait().await;
    let server = ServerProcess::start(dir.path(), &[]).await;
    let b = QuireClient::connect(config(&ws_base(server.addr), "crash", 2));
    within("synced", b.synced()).await.expect("synced");
    assert_eq!(text(&b), acked);
    b.close().await;
}

#[tokio::test]
async fn awareness_reaches_peers_and_leaves_with_the_client() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(test_config(dir.path())).await;
    let base = ws_base(server.addr);
    let (a, b) = connected_pair(&base, "presence").await;
    a.set_local_state(Some(serde_json::json!({"user": {"name": "Ada"}})));
    let has_ada = || {
        b.states()
            .iter()
            .any(|(id, s)| id.get() == 1 && s["user"]["name"] == "Ada")
    };
    until("b sees a", has_ada).await;
    a.close().await;
    until("a's state removed at b", || {
        b.states().iter().all(|(id, _)| id.get() != 1)
    })
    .await;
    b.close().await;
    server.stop().await;
}

#[tokio::test]
async fn permanent_refusals_stop_the_client() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = test_config(dir.path());
    cfg.room.max_doc_size = 1000;
    cfg.auth_keys = vec!["k1:0123456789abcdef0123".into()];
    let server = TestServer::start(cfg).await;
    let base = ws_base(server.addr);

    // No token: the upgrade is refused with 401, which retrying cannot fix.
    let anonymous = QuireClient::connect(config(&base, "limits", 1));
    let state = within("closed", anonymous.wait_for(|s| s.status == Status::Closed)).await;
    assert_eq!(state.closed.map(|c| c.code), Some(401));
    server.stop().await;

    // A document too large: 4413 from the room.
    let mut cfg = test_config(dir.path());
    cfg.room.max_doc_size = 1000;
    let server = TestServer::start(cfg).await;
    let base = ws_base(server.addr);
    let a = QuireClient::connect(config(&base, "limits", 2));
    within("synced", a.synced()).await.expect("synced");
    insert(&a, 0, &"x".repeat(5000));
    let state = within("closed", a.wait_for(|s| s.status == Status::Closed)).await;
    assert_eq!(state.closed.map(|c| c.code), Some(4413));
    assert!(state.unsaved > 0, "a refused change is not reported saved");
    server.stop().await;
}

#[tokio::test]
async fn disconnect_and_reconnect_on_purpose() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(test_config(dir.path())).await;
    let base = ws_base(server.addr);
    let (a, b) = connected_pair(&base, "toggle").await;
    a.disconnect();
    within("offline", a.wait_for(|s| s.status == Status::Offline)).await;
    insert(&a, 0, "away");
    insert(&b, 0, "here");
    within("b saved", b.saved()).await.expect("saved");
    // Offline stays offline: no reconnect without being asked.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(a.state().status, Status::Offline);
    assert_eq!(a.state().unsaved, 1);
    assert!(!text(&b).contains("away"));
    a.reconnect();
    within("a saved", a.saved()).await.expect("saved");
    until("convergence", || {
        text(&a) == text(&b) && text(&b).len() == 8
    })
    .await;
    a.close().await;
    b.close().await;
    server.stop().await;
}

#[tokio::test]
async fn a_read_only_clients_refused_edits_are_never_reported_saved() {
    use quire_server::auth::{now_secs, Auth, Permission};
    const KEY: &str = "k1:test-secret-0123456789";
    let token = |user: &str, perm| {
        let auth = Auth::new(&[KEY.into()], None).expect("key");
        auth.issue(user, "shared", perm, 3600, now_secs())
            .expect("issue")
            .0
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = test_config(dir.path());
    cfg.auth_keys = vec![KEY.into()];
    let server = TestServer::start(cfg).await;
    let base = ws_base(server.addr);
    let mut writer_cfg = config(&base, "shared", 1);
    writer_cfg.token = Some(token("owner", Permission::Write));
    let writer = QuireClient::connect(writer_cfg);
    within("writer synced", writer.synced())
        .await
        .expect("synced");
    insert(&writer, 0, "owner's text");
    within("writer saved", writer.saved()).await.expect("saved");

    let mut reader_cfg = config(&base, "shared", 2);
    reader_cfg.token = Some(token("reader", Permission::Read));
    let reader = QuireClient::connect(reader_cfg);
    let mut events = reader.events();
    within("reader synced", reader.synced())
        .await
        .expect("synced");
    assert_eq!(text(&reader), "owner's text");
    insert(&reader, 0, "not allowed ");
    let denied = within("denied", async {
        loop {
            if let Ok(quire_client::Event::PermissionDenied(reason)) = events.recv().await {
                return reason;
            }
        }
    })
    .await;
    assert!(denied.contains("read-only"), "{denied}");
    // The server echoes the acknowledgement right after refusing: it must not count.
    let refused = tokio::time::timeout(Duration::from_millis(500), reader.saved()).await;
    assert!(
        refused.is_err(),
        "saved() must not resolve for a refused change"
    );
    assert_eq!(reader.state().unsaved, 1);
    assert_eq!(text(&writer), "owner's text");
    reader.close().await;
    writer.close().await;
    server.stop().await;
}

#[tokio::test]
async fn the_client_can_be_read_from_inside_document_observers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(test_config(dir.path())).await;
    let base = ws_base(server.addr);
    let a = std::sync::Arc::new(QuireClient::connect(config(&base, "observed", 1)));
    let b = QuireClient::connect(config(&base, "observed", 2));
    within("synced", a.synced()).await.expect("synced");
    within("synced", b.synced()).await.expect("synced");
    // The observer runs inside the transaction that applies the remote change, on the
    // connection task: reading the client there must not wait for that task.
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let (client, log) = (a.clone(), seen.clone());
    a.doc()
        .get_or_insert_text("content")
        .observe("test", move |_txn, _e| {
            let state = client.state();
            let peers = client.states().len();
            log.lock().expect("log").push((state.unsaved, peers));
        });
    insert(&b, 0, "remote");
    until("observer ran", || !seen.lock().expect("log").is_empty()).await;
    until("a has it", || text(&a) == "remote").await;
    b.close().await;
    server.stop().await;
}

/// A page whose tokens expire keeps editing: the server closes the socket at each token's
/// expiry (4401), the client asks its provider for a new token, reconnects and resyncs, and
/// not a character typed across the expiries is lost (checked with a fresh reader).
#[tokio::test]
async fn a_token_provider_keeps_a_client_editing_across_token_expiries() {
    use quire_client::TokenProvider;
    use quire_server::auth::{now_secs, Auth, Permission};
    use std::sync::atomic::{AtomicU32, Ordering};
    const KEY: &str = "k1:test-secret-0123456789";
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = test_config(dir.path());
    cfg.auth_keys = vec![KEY.into()];
    let server = TestServer::start(cfg).await;
    let base = ws_base(server.addr);
    let issue = |ttl: i64| {
        let auth = Auth::new(&[KEY.into()], None).expect("key");
        auth.issue("ann", "*", Permission::Write, ttl, now_secs())
            .expect("issue")
            .0
    };
    let calls = std::sync::Arc::new(AtomicU32::new(0));
    let counted = calls.clone();
    let mut cfg = config(&base, "expiring", 1);
    cfg.token_provider = Some(TokenProvider::new(move || {
        counted.fetch_add(1, Ordering::SeqCst);
        // Two-second tokens (one to two seconds of life: `exp` counts whole seconds).
        let token = issue(2);
        async move { Ok(token) }
    }));
    let client = QuireClient::connect(cfg);
    within("synced", client.synced()).await.expect("synced");
    let mut typed = String::new();
    let started = std::time::Instant::now();
    let mut i = 0u32;
    while started.elapsed() < Duration::from_millis(4500) {
        let ch = char::from(b'a' + (i % 26) as u8);
        let len = text(&client).chars().count() as u32;
        insert(&client, len, &ch.to_string());
        typed.push(ch);
        i += 1;
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    within("saved", client.saved()).await.expect("saved");
    assert!(
        server.metric("quire_tokens_expired_total").await >= 2.0,
        "the server closed the client at least twice for an expired token"
    );
    assert!(
        calls.load(Ordering::SeqCst) >= 3,
        "a new token per connection"
    );
    assert_eq!(client.state().status, Status::Connected);
    // A fresh reader sees every character, in order.
    let mut reader_cfg = config(&base, "expiring", 2);
    reader_cfg.token = Some(issue(3600));
    let reader = QuireClient::connect(reader_cfg);
    within("reader synced", reader.synced())
        .await
        .expect("synced");
    assert_eq!(text(&reader), typed);
    client.close().await;
    reader.close().await;

    // Without a provider the client reconnects with its expired token, is refused with
    // 401, and stops.
    let mut cfg = config(&base, "expiring", 3);
    cfg.token = Some(issue(1));
    let stale = QuireClient::connect(cfg);
    let state = within("closed", stale.wait_for(|s| s.status == Status::Closed)).await;
    assert_eq!(state.closed.map(|c| c.code), Some(401));
    server.stop().await;
}
