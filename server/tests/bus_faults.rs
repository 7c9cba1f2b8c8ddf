//! The relay path between nodes under a bus that loses, repeats, delays and reorders
//! messages, and under forged messages: two in-process nodes on one PostgreSQL database and
//! a private NATS server, with faults injected into what a node publishes
//! (`quire_server::bus::Faults`). What the tests check with is what a loss would hide from
//! the clients that made the edits: a fresh client, the log rows, and the durable acks the
//! clients were (not) given. PostgreSQL pass only (several nodes need it), like cluster.rs.

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use quire_server::app::TestHooks;
use quire_server::auth::{Auth, Permission};
use quire_server::bus::{Change, ClusterKey, Credential, Envelope, FaultAction, Faults, Kind};
use quire_server::protocol;
use yrs::{Doc, Text, Transact};

const KEY: &str = "k1:test-secret-0123456789";
const ADMIN: &str = "admin-key-for-tests";

/// A token signed with the nodes' key.
fn token(user: &str, doc: &str, permission: Permission) -> String {
    let auth = Auth::new(&[KEY.into()], None).expect("key");
    auth.issue(user, doc, permission, 3600, quire_server::auth::now_secs())
        .expect("issue")
        .0
}

/// Node A (the owner of every document its client opens first) and node B (which relays
/// its clients to A), each with its own fault plan.
struct Pair {
    a: TestServer,
    b: TestServer,
    a_faults: Arc<Faults>,
    b_faults: Arc<Faults>,
    _nats: Nats,
}

async fn pair(dir: &std::path::Path) -> Pair {
    pair_with(dir, 0, None).await
}

/// A pair whose node A buffers only `a_capacity` messages per subscription (0: the default),
/// with the bus tick `tick` (`None`: the default).
async fn pair_with(dir: &std::path::Path, a_capacity: usize, tick: Option<Duration>) -> Pair {
    let nats = Nats::start().await;
    let node = |id: &str, faults: &Arc<Faults>| {
        let hooks = TestHooks {
            bus_faults: Some(faults.clone()),
            ..TestHooks::default()
        };
        let mut config = node_config(dir, id, &nats.url);
        if let Some(tick) = tick {
            config.bus_tick = tick;
        }
        (config, hooks)
    };
    let (a_faults, b_faults): (Arc<Faults>, Arc<Faults>) = (Arc::default(), Arc::default());
    a_faults.set_subscription_capacity(a_capacity);
    let (a_config, a_hooks) = node("node-a", &a_faults);
    let a = TestServer::start_with_hooks(a_config, a_hooks).await;
    let (b_config, b_hooks) = node("node-b", &b_faults);
    let b = TestServer::start_with_hooks(b_config, b_hooks).await;
    Pair {
        a,
        b,
        a_faults,
        b_faults,
        _nats: nats,
    }
}

impl Pair {
    async fn stop(self) {
        self.b.stop().await;
        self.a.stop().await;
    }
}

/// The frame carrying an update is lost between the relaying node and the owner, and the
/// client then asks for a durable ack. The owner must not echo it (it never received the
/// update): it sees the hole in the relayed connection's sequence numbers and closes it with
/// 1012. The client reconnects, resyncs, and only then is the edit stored.
#[tokio::test]
#[ignore = "PostgreSQL pass only: QUIRE_TEST_DATABASE=postgres cargo test -- --include-ignored"]
async fn a_lost_frame_is_never_acknowledged_and_closes_the_relayed_connection() {
    require_postgres();
    let dir = tempfile::tempdir().expect("tempdir");
    let p = pair(dir.path()).await;
    let _on_a = Client::connect(&p.a.url("lost"), 1).await;
    let mut on_b = Client::connect(&p.b.url("lost"), 2).await;
    on_b.insert(0, "kept ").await;
    on_b.durable_ack(1).await;

    p.b_faults.arm(FaultAction::Drop, Kind::Frame, 0);
    on_b.insert(5, "lost").await;
    let ack = protocol::encode_durable_ack(2);
    on_b.send_raw(ack.clone()).await;
    assert_eq!(on_b.wait_closed().await, Some(1012), "closed to resync");
    assert_eq!(p.b_faults.applied(), 1, "the update's frame was dropped");
    assert!(
        !on_b.acks_received.contains(&ack),
        "the owner acknowledged an update it never received"
    );
    assert!(p.a.metric("quire_bus_gaps_total").await >= 1.0);
    assert_eq!(fresh_text(&p.a.url("lost")).await, "kept ");

    // Reconnected (through B again), the client's resync delivers the edit.
    let mut again = Client::connect_with_doc(&p.b.url("lost"), on_b.doc.clone()).await;
    again.sync().await;
    again.durable_ack(3).await;
    assert_eq!(fresh_text(&p.a.url("lost")).await, "kept lost");
    p.stop().await;
}

/// Frames duplicated, reordered and delayed on their way to the owner are applied once each,
/// in the order the client sent them, without closing the connection; the ack comes after
/// all of them.
#[tokio::test]
#[ignore = "PostgreSQL pass only: QUIRE_TEST_DATABASE=postgres cargo test -- --include-ignored"]
async fn repeated_reordered_and_late_frames_are_applied_once_in_order() {
    require_postgres();
    let dir = tempfile::tempdir().expect("tempdir");
    let p = pair(dir.path()).await;
    let _on_a = Client::connect(&p.a.url("order"), 1).await;
    let mut on_b = Client::connect(&p.b.url("order"), 2).await;
    p.b_faults.arm(FaultAction::Duplicate, Kind::Frame, 0);
    p.b_faults.arm(FaultAction::Reorder, Kind::Frame, 1);
    p.b_faults.arm(
        FaultAction::Delay(Duration::from_millis(300)),
        Kind::Frame,
        2,
    );
    let mut expected = String::new();
    for i in 0..8 {
        let part = format!("<{i}>");
        on_b.insert(expected.len() as u32, &part).await;
        expected.push_str(&part);
    }
    on_b.durable_ack(1).await;
    assert_eq!(p.b_faults.applied(), 3);
    assert!(on_b.closed.is_none());
    assert_eq!(fresh_text(&p.a.url("order")).await, expected);
    assert_eq!(
        log_rows(dir.path(), "order").await,
        8,
        "each update logged once"
    );
    assert!(p.a.metric("quire_bus_duplicates_total").await >= 1.0);
    assert_eq!(p.a.metric("quire_bus_gaps_total").await, 0.0);
    p.stop().await;
}

/// Frames sent to a node while its link is busy travel together: a burst of a relayed
/// client's updates reaches the owner in a few messages, each update applied once, and the
/// owner's client sees them all.
#[tokio::test]
#[ignore = "PostgreSQL pass only: QUIRE_TEST_DATABASE=postgres cargo test -- --include-ignored"]
async fn a_burst_of_frames_travels_batched_and_each_is_applied_once() {
    require_postgres();
    let dir = tempfile::tempdir().expect("tempdir");
    let p = pair(dir.path()).await;
    let mut on_a = Client::connect(&p.a.url("burst"), 1).await;
    let mut on_b = Client::connect(&p.b.url("burst"), 2).await;
    let messages = p.b.metric("quire_bus_messages_total").await;
    let envelopes = p.b.metric("quire_bus_envelopes_total").await;
    // B's links hold their next message until let go: the burst queues behind it.
    p.b_faults.hold_links();
    let mut expected = String::new();
    for i in 0..20 {
        let part = format!("<{i}>");
        on_b.insert(expected.len() as u32, &part).await;
        expected.push_str(&part);
    }
    // (The relaying connection reads the frames off its socket meanwhile.)
    tokio::time::sleep(Duration::from_millis(300)).await;
    p.b_faults.release_links();
    on_b.durable_ack(1).await;
    let messages = p.b.metric("quire_bus_messages_total").await - messages;
    let envelopes = p.b.metric("quire_bus_envelopes_total").await - envelopes;
    assert!(
        envelopes >= 21.0,
        "20 frames and the ack request: {envelopes}"
    );
    assert!(
        messages * 4.0 <= envelopes,
        "{envelopes} envelopes in {messages} messages: the burst was not batched"
    );
    assert!(on_b.closed.is_none());
    assert_eq!(fresh_text(&p.a.url("burst")).await, expected);
    assert_eq!(
        log_rows(dir.path(), "burst").await,
        20,
        "each update logged once"
    );
    let seen = on_a.pump_until(PATIENCE, |c| c.text() == expected).await;
    assert!(seen, "the owner's client has {:?}", on_a.text());
    p.stop().await;
}

/// A busy pair of nodes exchanges one message per tick: a relayed client's frames, sent
/// further apart than a link takes to publish one (without the tick each would travel
/// alone), reach the owner a tick's worth per message, each applied once and in order.
#[tokio::test]
#[ignore = "PostgreSQL pass only: QUIRE_TEST_DATABASE=postgres cargo test -- --include-ignored"]
async fn frames_sent_within_a_tick_travel_in_one_message() {
    require_postgres();
    let dir = tempfile::tempdir().expect("tempdir");
    let p = pair_with(dir.path(), 0, Some(Duration::from_millis(500))).await;
    let mut on_a = Client::connect(&p.a.url("tick"), 1).await;
    let mut on_b = Client::connect(&p.b.url("tick"), 2).await;
    let messages = p.b.metric("quire_bus_messages_total").await;
    let envelopes = p.b.metric("quire_bus_envelopes_total").await;
    let mut expected = String::new();
    for i in 0..30 {
        let part = format!("<{i}>");
        on_b.insert(expected.len() as u32, &part).await;
        expected.push_str(&part);
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
    on_b.durable_ack(1).await;
    let messages = p.b.metric("quire_bus_messages_total").await - messages;
    let envelopes = p.b.metric("quire_bus_envelopes_total").await - envelopes;
    assert!(
        envelopes >= 31.0,
        "30 frames and the ack request: {envelopes}"
    );
    assert!(
        messages * 4.0 <= envelopes,
        "{envelopes} envelopes in {messages} messages: frames within a tick travelled apart"
    );
    assert!(on_b.closed.is_none());
    assert_eq!(fresh_text(&p.a.url("tick")).await, expected);
    assert_eq!(
        log_rows(dir.path(), "tick").await,
        30,
        "each update logged once"
    );
    let seen = on_a.pump_until(PATIENCE, |c| c.text() == expected).await;
    assert!(seen, "the owner's client has {:?}", on_a.text());
    p.stop().await;
}

/// A frame NATS will not take (longer than the server's `max_payload`) is never published,
/// and its relayed connection is closed with 1012 instead of going on past it: the durable
/// ack asked after it never comes, and a fresh client does not have the update.
#[tokio::test]
#[ignore = "PostgreSQL pass only: QUIRE_TEST_DATABASE=postgres cargo test -- --include-ignored"]
async fn a_frame_nats_refuses_closes_its_relayed_connection() {
    require_postgres();
    let dir = tempfile::tempdir().expect("tempdir");
    let conf = dir.path().join("nats.conf");
    std::fs::write(&conf, "max_payload: 16384\n").expect("nats config");
    let nats = Nats::start_args(&["-c", conf.to_str().expect("utf-8 path")]).await;
    let a = TestServer::start(node_config(dir.path(), "node-a", &nats.url)).await;
    let b = TestServer::start(node_config(dir.path(), "node-b", &nats.url)).await;
    let _on_a = Client::connect(&a.url("big"), 1).await;
    let mut on_b = Client::connect(&b.url("big"), 2).await;
    on_b.insert(0, "kept ").await;
    on_b.durable_ack(1).await;

    on_b.insert(5, &"x".repeat(40_000)).await;
    let ack = protocol::encode_durable_ack(2);
    on_b.send_raw(ack.clone()).await;
    assert_eq!(on_b.wait_closed().await, Some(1012), "closed to resync");
    // At once, by the failed publish (the numbering's check would close it a second or two
    // later, as "a message between nodes was lost").
    let reason = on_b.closed.as_ref().map(|f| f.reason.to_string());
    assert_eq!(
        reason.as_deref(),
        Some("lost the link to the document's node, reconnect")
    );
    assert!(
        !on_b.acks_received.contains(&ack),
        "acknowledged an update that never left its node"
    );
    assert!(b.metric("quire_bus_publish_failures_total").await >= 1.0);
    assert_eq!(fresh_text(&a.url("big")).await, "kept ");
    b.stop().await;
    a.stop().await;
}

/// A frame from the owner to a relayed client (here a broadcast) is lost: the owner's next
/// heartbeat shows the relaying node the hole, and it closes the client with 1012 instead of
/// leaving it without the update.
#[tokio::test]
#[ignore = "PostgreSQL pass only: QUIRE_TEST_DATABASE=postgres cargo test -- --include-ignored"]
async fn a_lost_frame_to_a_relayed_client_closes_it_so_it_resyncs() {
    require_postgres();
    let dir = tempfile::tempdir().expect("tempdir");
    let p = pair(dir.path()).await;
    let mut on_a = Client::connect(&p.a.url("out"), 1).await;
    let mut on_b = Client::connect(&p.b.url("out"), 2).await;
    p.a_faults.arm(FaultAction::Drop, Kind::Out, 0);
    on_a.insert(0, "news").await;
    on_a.durable_ack(1).await;
    assert_eq!(on_b.wait_closed().await, Some(1012));
    assert_eq!(p.a_faults.applied(), 1);
    assert!(
        !on_b.text().contains("news"),
        "the broadcast was the lost frame"
    );
    let mut again = Client::connect_with_doc(&p.b.url("out"), on_b.doc.clone()).await;
    assert!(again.pump_until(PATIENCE, |c| c.text() == "news").await);
    p.stop().await;
}

/// The owner falls behind reading the bus while a relayed client sends a burst of updates and
/// asks for a durable ack: NATS buffers a few messages per subscription and drops the rest (a
/// slow consumer, which it reports as an event, not a disconnect). The owner must not
/// acknowledge what NATS dropped: it closes its relayed connections (1012), the client
/// resyncs, and a fresh client then has every update.
#[tokio::test]
#[ignore = "PostgreSQL pass only: QUIRE_TEST_DATABASE=postgres cargo test -- --include-ignored"]
async fn a_slow_consumer_owner_closes_its_relayed_connections_so_they_resync() {
    require_postgres();
    let dir = tempfile::tempdir().expect("tempdir");
    let p = pair_with(dir.path(), 4, None).await;
    let _on_a = Client::connect(&p.a.url("slow"), 1).await;
    let mut on_b = Client::connect(&p.b.url("slow"), 2).await;
    on_b.insert(0, "start.").await;
    on_b.durable_ack(1).await;

    p.a_faults.pause_inbox_once(Duration::from_millis(800));
    // Spaced out, so that B's link publishes them as separate messages (a burst would travel
    // as one batch, which a buffer of 4 holds).
    for _ in 0..40 {
        on_b.insert(0, "x").await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let ack = protocol::encode_durable_ack(2);
    on_b.send_raw(ack.clone()).await;
    assert_eq!(on_b.wait_closed().await, Some(1012), "closed to resync");
    assert!(
        !on_b.acks_received.contains(&ack),
        "the owner acknowledged updates NATS dropped"
    );
    assert!(
        p.a.metric("quire_bus_resets_total").await >= 1.0,
        "the owner saw the slow-consumer event"
    );

    let mut again = Client::connect_with_doc(&p.b.url("slow"), on_b.doc.clone()).await;
    again.sync().await;
    again.durable_ack(3).await;
    let expected = format!("{}start.", "x".repeat(40));
    assert_eq!(fresh_text(&p.a.url("slow")).await, expected);
    p.stop().await;
}

/// An `Open` claiming write access and a `Frame` with an update, published on the bus by a
/// process with NATS credentials but without the cluster key (unsigned, or signed with
/// another key), write nothing; the same messages signed with the cluster key do (so the
/// test would see a forged write). A client without NATS credentials cannot connect at all.
#[tokio::test]
#[ignore = "PostgreSQL pass only: QUIRE_TEST_DATABASE=postgres cargo test -- --include-ignored"]
async fn messages_not_signed_with_the_cluster_key_cannot_write() {
    require_postgres();
    let dir = tempfile::tempdir().expect("tempdir");
    let nats = Nats::start_args(&["--user", "quire", "--pass", "bus-secret"]).await;
    let authed = format!("nats://quire:bus-secret@127.0.0.1:{}", nats.port);
    let a = TestServer::start(node_config(dir.path(), "node-a", &authed)).await;
    let mut owner = Client::connect(&a.url("guarded"), 1).await;
    owner.insert(0, "mine").await;
    owner.durable_ack(1).await;

    assert!(
        async_nats::connect(&nats.url).await.is_err(),
        "NATS refuses a client without credentials"
    );
    // (The NATS client takes credentials from its options, not from the URL as Quire does.)
    let forger = async_nats::ConnectOptions::new()
        .user_and_password("quire".into(), "bus-secret".into())
        .connect(&nats.url)
        .await
        .expect("connect");
    let subject = "quire.node.node-a";
    let messages = |conn: u64, text: &str| {
        let doc = Doc::with_client_id(conn);
        let t = doc.get_or_insert_text("text");
        let update = {
            let mut txn = doc.transact_mut();
            t.insert(&mut txn, 0, text);
            txn.encode_update_v1()
        };
        let open = Envelope::Open {
            from: "mallory".into(),
            conn,
            doc: "guarded".into(),
            auth: Credential {
                user: Some("mallory".into()),
                can_write: true,
                expires_at: None,
                seen_change: 0,
                hocuspocus: false,
                profile: None,
            },
        };
        let frame = Envelope::Frame {
            from: "mallory".into(),
            conn,
            seq: 1,
            data: protocol::encode_update(&update),
        };
        [open.encode(), frame.encode()]
    };
    let wrong = ClusterKey::new("not-the-cluster-key-at-all").expect("key");
    let right = ClusterKey::new(CLUSTER_KEY).expect("key");
    for body in messages(71, "U") {
        forger.publish(subject, body).await.expect("publish");
    }
    for body in messages(72, "W") {
        let sealed: Bytes = wrong.seal(subject, &body);
        forger.publish(subject, sealed).await.expect("publish");
    }
    for body in messages(73, "R") {
        forger
            .publish(subject, right.seal(subject, &body))
            .await
            .expect("publish");
    }
    forger.flush().await.expect("flush");
    // The signed update arrives last; once it is there, the others were read and refused.
    assert!(owner.pump_until(PATIENCE, |c| c.text().contains('R')).await);
    let text = fresh_text(&a.url("guarded")).await;
    assert!(text.contains("mine") && text.contains('R'), "{text}");
    assert!(!text.contains('U') && !text.contains('W'), "forged: {text}");
    assert_eq!(a.metric("quire_bus_refused_total").await, 4.0);

    // A signed delete announcement (replayed, or from a node gone wrong) for a document the
    // database does not have deleted closes nothing.
    let all = "quire.all";
    let announced = Envelope::Changed {
        from: "mallory".into(),
        at_ms: quire_server::storage::now_ms(),
        doc: "guarded".into(),
        change: Change::Deleted,
    };
    forger
        .publish(all, right.seal(all, &announced.encode()))
        .await
        .expect("publish");
    forger.flush().await.expect("flush");
    tokio::time::sleep(Duration::from_millis(300)).await;
    owner.insert(0, "still ").await;
    owner.durable_ack(2).await;
    assert!(owner.closed.is_none(), "closed by an unconfirmed delete");
    a.stop().await;
}

/// A role change, then a delete, made through the API of a node that holds none of the
/// document's sockets reach them on every node: the owner's own client and the client
/// relayed through another node (4403, then 4404), within two seconds (a few milliseconds in
/// practice). The clients that reconnect after the role change are not closed again.
#[tokio::test]
#[ignore = "PostgreSQL pass only: QUIRE_TEST_DATABASE=postgres cargo test -- --include-ignored"]
async fn a_role_change_or_a_delete_on_one_node_reaches_sockets_on_every_node() {
    require_postgres();
    role_change_and_delete_reach_every_node(false).await;
}

/// The same when the bus loses both announcements: every node reads the change from the
/// `doc_changes` rows within a poll (`quire_server::changes::POLL`).
#[tokio::test]
#[ignore = "PostgreSQL pass only: QUIRE_TEST_DATABASE=postgres cargo test -- --include-ignored"]
async fn a_role_change_or_a_delete_whose_announcement_the_bus_loses_still_reaches_every_node() {
    require_postgres();
    role_change_and_delete_reach_every_node(true).await;
}

async fn role_change_and_delete_reach_every_node(lose_announcements: bool) {
    let dir = tempfile::tempdir().expect("tempdir");
    let nats = Nats::start().await;
    let mut nodes = Vec::new();
    let faults: Arc<Faults> = Arc::default();
    if lose_announcements {
        faults.arm(FaultAction::Drop, Kind::Changed, 0);
        faults.arm(FaultAction::Drop, Kind::Changed, 0);
    }
    for id in ["node-a", "node-b", "node-c"] {
        let mut cfg = node_config(dir.path(), id, &nats.url);
        cfg.auth_keys = vec![KEY.into()];
        cfg.admin_key = Some(ADMIN.into());
        let mut hooks = TestHooks::default();
        if id == "node-c" {
            hooks.bus_faults = Some(faults.clone());
        }
        nodes.push(TestServer::start_with_hooks(cfg, hooks).await);
    }
    let ann = token("ann", "doomed", Permission::Write);
    let url = |n: &TestServer| format!("{}?token={ann}", n.url("doomed"));
    let mut on_a = Client::connect(&url(&nodes[0]), 1).await;
    let mut on_b = Client::connect(&url(&nodes[1]), 2).await;
    on_b.insert(0, "bye").await;
    on_b.durable_ack(1).await;
    let http = reqwest::Client::new();
    let id = "doomed";

    let started = tokio::time::Instant::now();
    let resp = http
        .put(nodes[2].http(&format!("/api/v1/docs/{id}/access/ann")))
        .bearer_auth(ADMIN)
        .json(&serde_json::json!({"role": "viewer"}))
        .send()
        .await
        .expect("put access");
    assert!(resp.status().is_success(), "{}", resp.status());
    assert_eq!(
        on_a.wait_closed().await,
        Some(4403),
        "the owner's own client"
    );
    assert_eq!(on_b.wait_closed().await, Some(4403), "the relayed client");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    // Back at once, read-only now (with the announcements lost, before the last node has
    // read the change).
    let mut on_a = Client::connect(&url(&nodes[0]), 3).await;
    let mut on_b = Client::connect(&url(&nodes[1]), 4).await;
    on_b.insert(0, "no ").await;
    assert!(
        on_b.pump_until(PATIENCE, |c| c.permission_denied.is_some())
            .await
    );
    // The change closes only sockets whose permission was read before it: nodes acting on
    // it later (the row read a poll after the announcement, or each node at its own poll
    // when the announcement is lost) leave the reconnected clients alone.
    let again = 4 * quire_server::changes::POLL;
    for c in [&mut on_a, &mut on_b] {
        let closed = c.pump_until(again, |c| c.closed.is_some()).await;
        assert!(!closed, "closed again after reconnecting: {:?}", c.closed);
    }

    let started = tokio::time::Instant::now();
    let resp = http
        .delete(nodes[2].http(&format!("/api/v1/docs/{id}")))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("delete");
    assert!(resp.status().is_success(), "{}", resp.status());
    assert_eq!(
        on_a.wait_closed().await,
        Some(4404),
        "the owner's own client"
    );
    assert_eq!(on_b.wait_closed().await, Some(4404), "the relayed client");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    let lost = if lose_announcements { 2 } else { 0 };
    assert_eq!(faults.applied(), lost, "announcements lost on the bus");
    for n in nodes {
        n.stop().await;
    }
}
