//! The sync protocol end to end: a real server on port 0, Rust clients over WebSocket.

mod common;

use bytes::Bytes;
use common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::time::Duration;

#[tokio::test]
async fn many_clients_converge_and_a_late_joiner_gets_everything() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(test_config(dir.path())).await;
    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let url = server.url("converge");

    let mut clients = Vec::new();
    for i in 0..6u64 {
        clients.push(Client::connect(&url, 100 + i).await);
    }
    // Every client makes edits at random positions; messages interleave at the server.
    for round in 0..20 {
        for c in clients.iter_mut() {
            let len = c.text().chars().count() as u32;
            let at = rng.random_range(0..=len);
            c.insert(at, &format!("{round}")).await;
        }
    }
    for (i, c) in clients.iter_mut().enumerate() {
        c.durable_ack(i as u64).await;
    }
    let late = Client::connect(&url, 999).await;
    let expected = late.text();
    assert_eq!(
        expected.len(),
        6 * (10 + 10 * 2),
        "every insert is in the late joiner's copy"
    );
    for c in clients.iter_mut() {
        let ok = c.pump_until(PATIENCE, |c| c.text() == expected).await;
        assert!(
            ok,
            "client converged (seed {seed}): {} vs {}",
            c.text(),
            expected
        );
    }
    server.stop().await;
}

#[tokio::test]
async fn a_duplicate_update_is_neither_logged_nor_broadcast() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(test_config(dir.path())).await;
    let url = server.url("dup");
    let mut a = Client::connect(&url, 1).await;
    let mut b = Client::connect(&url, 2).await;

    let update = a.insert(0, "hello").await;
    a.durable_ack(1).await;
    assert!(b.pump_until(PATIENCE, |c| c.text() == "hello").await);
    let received = b.updates_received;

    // A retry of the same update, from the same and from another connection.
    a.send_update(&update).await;
    b.send_update(&update).await;
    a.durable_ack(2).await;
    b.durable_ack(3).await;

    // Something new after the duplicates: b must receive it, and nothing else in between.
    a.insert(5, "!").await;
    a.durable_ack(4).await;
    assert!(b.pump_until(PATIENCE, |c| c.text() == "hello!").await);
    assert_eq!(
        b.updates_received,
        received + 1,
        "the duplicate was not broadcast"
    );
    assert_eq!(server.metric("quire_updates_duplicate_total").await, 2.0);
    assert_eq!(server.metric("quire_updates_logged_total").await, 2.0);
    assert_eq!(log_rows(dir.path(), "dup").await, 2);
    server.stop().await;
}

#[tokio::test]
async fn an_update_is_acknowledged_only_once_committed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(test_config(dir.path())).await;
    let url = server.url("ack");
    let mut a = Client::connect(&url, 1).await;
    for i in 0..50 {
        a.insert(i, "x").await;
    }
    a.durable_ack(7).await;
    // The echo is the exact bytes sent.
    assert_eq!(
        a.acks_received,
        vec![quire_server::protocol::encode_durable_ack(7)]
    );
    // Everything before the ack is in the log at the moment the echo arrives.
    assert_eq!(log_rows(dir.path(), "ack").await, 50);
    server.stop().await;
}

#[tokio::test]
async fn malformed_frames_close_only_the_sender() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(test_config(dir.path())).await;
    let url = server.url("malformed");
    let mut good = Client::connect(&url, 1).await;
    let mut other = Client::connect(&url, 2).await;

    let cases: Vec<(Bytes, u16)> = vec![
        (Bytes::from_static(&[0, 2, 10, 1, 2]), 1007), // truncated update
        (Bytes::from_static(&[0, 2, 3, 0xff, 0xff, 0xff]), 1007), // not a Yjs update
        (Bytes::from_static(&[0, 9, 0]), 1007),        // unknown sync type
        (Bytes::from_static(&[1, 3, 1, 2]), 1007),     // bad awareness
    ];
    for (frame, code) in cases {
        let mut bad = Client::connect(&url, 3).await;
        bad.send_raw(frame.clone()).await;
        assert_eq!(bad.wait_closed().await, Some(code), "frame {frame:?}");
    }
    // A text frame is refused with 1003.
    {
        use futures_util::SinkExt;
        let (mut ws, _) = tokio_tungstenite::connect_async(&url)
            .await
            .expect("connect");
        ws.send(tokio_tungstenite::tungstenite::Message::Text("hi".into()))
            .await
            .expect("send");
        let mut c = ClientCloseWatcher(ws);
        assert_eq!(c.close_code().await, Some(1003));
    }
    // Unknown message types are ignored, not fatal.
    good.send_raw(Bytes::from_static(&[77, 1, 0])).await;
    good.insert(0, "still here").await;
    good.durable_ack(1).await;
    assert!(
        other
            .pump_until(PATIENCE, |c| c.text() == "still here")
            .await
    );
    assert!(server.metric("quire_malformed_messages_total").await >= 4.0);
    server.stop().await;
}

struct ClientCloseWatcher(
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
);

impl ClientCloseWatcher {
    async fn close_code(&mut self) -> Option<u16> {
        use futures_util::StreamExt;
        while let Ok(Some(msg)) = tokio::time::timeout(PATIENCE, self.0.next()).await {
            if let Ok(tokio_tungstenite::tungstenite::Message::Close(f)) = msg {
                return f.map(|f| u16::from(f.code));
            }
        }
        None
    }
}

#[tokio::test]
async fn a_client_that_stops_reading_is_closed_with_1013_and_others_keep_receiving() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = test_config(dir.path());
    cfg.room.peer_queue = 8;
    let server = TestServer::start(cfg).await;
    let url = server.url("slow");
    let mut writer = Client::connect(&url, 1).await;
    let fast = Client::connect(&url, 2).await;
    let mut slow = Client::connect(&url, 3).await; // never reads until the end
    let total = flood_past_a_client_that_does_not_read(&mut writer, fast).await;
    assert!(server.metric("quire_broadcast_overflows_total").await >= 1.0);
    // Now the slow client reads: what was queued, then a 1013 close.
    assert_eq!(slow.wait_closed().await, Some(1013));
    // It resyncs on reconnect.
    let again = Client::connect(&url, 3).await;
    assert_eq!(again.text_len(), total);
    server.stop().await;
}

/// The room's close order overtakes a write stuck on a client that never reads again, and
/// the connection ends `slow_close_timeout` later, although its close frame never left: the
/// client holds nothing of the server's for longer than that.
#[tokio::test]
async fn a_client_that_never_reads_again_is_dropped_after_the_slow_close_timeout() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = test_config(dir.path());
    cfg.room.peer_queue = 8;
    cfg.slow_close_timeout = std::time::Duration::from_millis(300);
    let server = TestServer::start(cfg).await;
    let url = server.url("never-reads");
    let mut writer = Client::connect(&url, 1).await;
    let fast = Client::connect(&url, 2).await;
    let slow = Client::connect(&url, 3).await; // never reads again
    flood_past_a_client_that_does_not_read(&mut writer, fast).await;
    assert!(server.metric("quire_broadcast_overflows_total").await >= 1.0);
    // The fast client has left; the writer stays. The slow client's connection must end too,
    // while it still reads nothing.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let open = server.metric("quire_connections").await;
        if open == 1.0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{open} connections still open: the one that never reads is held"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    drop(slow);
    server.stop().await;
}

#[tokio::test]
async fn awareness_is_relayed_and_removed_when_its_connection_closes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(test_config(dir.path())).await;
    let url = server.url("presence");
    let mut a = Client::connect(&url, 1).await;
    let mut b = Client::connect(&url, 2).await;
    a.send_raw(presence(1, r#"{"user":{"name":"ann"}}"#)).await;
    assert!(
        b.pump_until(PATIENCE, |c| c.awareness.contains_key(&1))
            .await
    );
    // A newcomer gets the full awareness state on open.
    let mut c = Client::connect(&url, 3).await;
    assert!(
        c.pump_until(PATIENCE, |c| c.awareness.contains_key(&1))
            .await
    );
    a.close().await;
    assert!(
        b.pump_until(PATIENCE, |c| !c.awareness.contains_key(&1))
            .await
    );
    assert!(
        c.pump_until(PATIENCE, |c| !c.awareness.contains_key(&1))
            .await
    );
    server.stop().await;
}

/// Presence is coalesced: every change of one `awareness_tick` reaches each peer in one frame,
/// the sender's own change included (with the clock it has, which y-protocols ignores); the
/// newest clock per client wins and a state removed within the tick arrives as removed.
#[tokio::test]
async fn presence_changes_of_one_tick_reach_each_peer_in_one_frame() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = test_config(dir.path());
    // Long enough that the five sends below land in one tick on a loaded machine.
    cfg.room.awareness_tick = Duration::from_secs(2);
    let server = TestServer::start(cfg).await;
    let url = server.url("coalesced");
    let mut a = Client::connect(&url, 1).await;
    let mut b = Client::connect(&url, 2).await;
    let mut c = Client::connect(&url, 3).await;
    let mut observer = Client::connect(&url, 4).await;
    assert_eq!(
        observer.awareness_frames, 0,
        "nobody was present at the join"
    );
    a.send_raw(presence_at(1, 1, r#"{"cursor":1}"#)).await;
    a.send_raw(presence_at(1, 2, r#"{"cursor":2}"#)).await;
    b.send_raw(presence_at(2, 1, r#"{"cursor":9}"#)).await;
    b.send_raw(presence_at(2, 1, "null")).await;
    c.send_raw(presence_at(3, 1, r#"{"cursor":3}"#)).await;
    assert!(
        observer
            .pump_until(PATIENCE, |o| o.awareness.len() >= 2)
            .await
    );
    // Whatever else is queued behind it has had time to arrive.
    observer
        .pump_until(Duration::from_millis(300), |_| false)
        .await;
    assert_eq!(observer.awareness_frames, 1, "one frame for the whole tick");
    assert!(
        observer.awareness[&1].contains(r#""cursor":2"#),
        "{:?}",
        observer.awareness
    );
    assert!(observer.awareness[&3].contains(r#""cursor":3"#));
    assert!(
        !observer.awareness.contains_key(&2),
        "removed within the tick"
    );
    // The senders get the same frame, their own state in it.
    for client in [&mut a, &mut c] {
        assert!(
            client
                .pump_until(PATIENCE, |c| c.awareness.len() >= 2)
                .await
        );
        assert_eq!(client.awareness_frames, 1);
    }
    assert_eq!(server.metric("quire_awareness_relays_total").await, 1.0);
    server.stop().await;
}

#[tokio::test]
async fn bad_document_names_get_400_before_the_upgrade() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(test_config(dir.path())).await;
    let long = format!("/{}", "x".repeat(300));
    for path in ["/", "/bad%0Aname", "/%FF%FE", long.as_str()] {
        let err = tokio_tungstenite::connect_async(format!("ws://{}{}", server.addr, path)).await;
        assert!(err.is_err(), "upgrade refused for {path}");
        if path == "/" {
            continue; // a plain GET of / is the web editor's page (tests/web.rs)
        }
        let (status, body) = http_get(server.addr, path).await;
        assert_eq!(status, 400, "{path}");
        assert!(body.contains("invalid-document-name"), "{body}");
    }
    // A query string is accepted and not part of the name; names are URL-decoded.
    let mut a = Client::connect(&server.url("my%20doc?token=abc&x=1"), 1).await;
    a.insert(0, "q").await;
    a.durable_ack(1).await;
    let b = Client::connect(&server.url("%6Dy%20doc"), 2).await;
    assert_eq!(b.text(), "q");
    assert_eq!(http_get(server.addr, "/healthz").await.0, 200);
    assert_eq!(http_get(server.addr, "/readyz").await.0, 200);
    server.stop().await;
}

#[tokio::test]
async fn too_many_connections_and_oversized_documents_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = test_config(dir.path());
    cfg.room.max_connections = 2;
    cfg.room.max_doc_size = 1000;
    let server = TestServer::start(cfg).await;
    let url = server.url("bounded");
    let mut a = Client::connect(&url, 1).await;
    let _b = Client::connect(&url, 2).await;
    let mut c = Client::connect_unsynced(&url, 3).await;
    assert_eq!(c.wait_closed().await, Some(1013));

    a.insert(0, &"z".repeat(2000)).await;
    assert_eq!(a.wait_closed().await, Some(4413));
    server.stop().await;
}

#[tokio::test]
async fn graceful_shutdown_commits_and_closes_sockets_with_1001() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(test_config(dir.path())).await;
    let url = server.url("bye");
    let mut a = Client::connect(&url, 1).await;
    for i in 0..20 {
        a.insert(i, "s").await;
    }
    a.durable_ack(1).await;
    server.shutdown.cancel();
    assert_eq!(a.wait_closed().await, Some(1001));
    server.stop().await;
    // Reconnecting later (clients do) finds every acknowledged update.
    let server = TestServer::start(test_config(dir.path())).await;
    let b = Client::connect(&server.url("bye"), 2).await;
    assert_eq!(b.text(), "s".repeat(20));
    server.stop().await;
}

#[tokio::test]
async fn several_messages_in_one_frame_are_all_handled() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(test_config(dir.path())).await;
    let url = server.url("batched");
    let mut a = Client::connect(&url, 1).await;
    let mut b = Client::connect(&url, 2).await;

    // Two updates, an awareness state, a query and an ack request in a single frame.
    let doc = yrs::Doc::with_client_id(5);
    let text = doc.get_or_insert_text("text");
    let mut frame = bytes::BytesMut::new();
    for s in ["one ", "two"] {
        use yrs::{Text, Transact};
        let mut txn = doc.transact_mut();
        let len = text.len(&txn);
        text.insert(&mut txn, len, s);
        frame.extend_from_slice(&quire_server::protocol::encode_update(
            &txn.encode_update_v1(),
        ));
    }
    frame.extend_from_slice(&presence(5, r#"{"user":"bo"}"#));
    frame.extend_from_slice(&[3]);
    let ack = quire_server::protocol::encode_durable_ack(9);
    frame.extend_from_slice(&ack);
    a.send_raw(frame.freeze()).await;

    assert!(
        a.pump_until(PATIENCE, |c| c.acks_received.contains(&ack))
            .await
    );
    // The query was answered with the full state, which includes a's own presence entry.
    assert!(a.awareness.contains_key(&5));
    assert!(
        b.pump_until(PATIENCE, |c| c.text() == "one two"
            && c.awareness.contains_key(&5))
            .await
    );
    assert_eq!(log_rows(dir.path(), "batched").await, 2);
    server.stop().await;
}

#[tokio::test]
async fn a_message_over_the_size_limit_closes_only_its_sender_with_1009() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = test_config(dir.path());
    cfg.limits.max_message_size = 4096;
    let server = TestServer::start(cfg).await;
    let url = server.url("big");
    let mut big = Client::connect(&url, 1).await;
    let mut other = Client::connect(&url, 2).await;
    big.insert(0, &"b".repeat(10_000)).await;
    assert_eq!(big.wait_closed().await, Some(1009));
    other.insert(0, "fine").await;
    other.durable_ack(1).await;
    assert_eq!(log_rows(dir.path(), "big").await, 1);
    server.stop().await;
}

/// Every WebSocket the running server accepted has Nagle's algorithm off: small frames (an
/// update is a few dozen bytes) must not wait for the client's delayed ACK. Checked on the
/// server's own sockets, which this process holds (the server runs in-process): each open
/// descriptor that is a TCP socket on the server's address with a peer is an accepted one.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn the_server_turns_off_nagle_on_every_accepted_socket() {
    use std::os::fd::{BorrowedFd, RawFd};
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(test_config(dir.path())).await;
    let url = server.url("nodelay");
    let _a = Client::connect(&url, 1).await;
    let _b = Client::connect(&url, 2).await;
    let mut accepted = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd").expect("fds") {
        let Ok(entry) = entry else { continue };
        let Some(fd) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<RawFd>().ok())
        else {
            continue;
        };
        let is_socket = std::fs::read_link(entry.path())
            .map(|l| l.to_string_lossy().starts_with("socket:"))
            .unwrap_or(false);
        if !is_socket {
            continue;
        }
        // SAFETY: the descriptor was open a moment ago and is only borrowed for getsockname,
        // getpeername and getsockopt, which fail harmlessly (EBADF) if it has closed since.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        let sock = socket2::SockRef::from(&fd);
        let local = sock.local_addr().ok().and_then(|a| a.as_socket());
        let has_peer = sock.peer_addr().is_ok();
        if local == Some(server.addr) && has_peer {
            accepted.push(sock.tcp_nodelay().expect("TCP_NODELAY"));
        }
    }
    assert_eq!(accepted, vec![true, true], "one entry per accepted socket");
}

/// The connections gauge counts a socket from its join to its close, whichever way it closes.
#[tokio::test]
async fn the_connections_gauge_counts_open_sockets() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(test_config(dir.path())).await;
    let a = Client::connect(&server.url("counted"), 1).await;
    let b = Client::connect(&server.url("counted"), 2).await;
    server.wait_metric("quire_connections", |n| n == 2.0).await;
    a.close().await;
    server.wait_metric("quire_connections", |n| n == 1.0).await;
    drop(b); // no close frame: the server sees the socket end
    server.wait_metric("quire_connections", |n| n == 0.0).await;
    server.stop().await;
}
