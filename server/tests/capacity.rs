//! No client holds what others share (issue 50): whole-document answers a client never reads
//! hold no slot of the heavy-work gate and only their caller's own, and are dropped after
//! `write_timeout`; sockets whose write is stuck are still idle-closed, in both protocols.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use futures_util::SinkExt;
use quire_server::protocol::hocuspocus as hp;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use yrs::StateVector;

/// A connection to `addr` with a 4 KiB receive window: what it does not read stays in the
/// server's socket.
async fn small_window(addr: SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("SO_RCVBUF");
    socket.connect(addr).await.expect("connect")
}

/// Asks for `path` on a small-window connection and never reads the answer.
async fn ask_and_never_read(addr: SocketAddr, path: &str) -> TcpStream {
    let mut tcp = small_window(addr).await;
    let request = format!("GET {path} HTTP/1.1\r\nHost: quire\r\n\r\n");
    tcp.write_all(request.as_bytes()).await.expect("request");
    tcp
}

/// A plain request's status and body, and how long it took.
async fn timed(request: reqwest::RequestBuilder) -> (u16, String, Duration) {
    let started = Instant::now();
    let resp = request.send().await.expect("request");
    let status = resp.status().as_u16();
    let body = resp.text().await.expect("body");
    (status, body, started.elapsed())
}

/// Bytes readable from `tcp` until the server closes it (or `patience` runs out: `None`).
async fn read_to_close(tcp: &mut TcpStream, patience: Duration) -> Option<usize> {
    let mut total = 0;
    let mut buf = vec![0u8; 1 << 20];
    let read = tokio::time::timeout(patience, async {
        loop {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => total += n,
            }
        }
    })
    .await;
    read.ok().map(|()| total)
}

const BIG: usize = 12 << 20;

/// A server that pings every 100 ms and closes a client silent for 600 ms, whose write
/// deadline is far off (so it is not what closes a stuck socket), holding a `BIG` document.
async fn idle_checking_server(dir: &std::path::Path) -> TestServer {
    let mut cfg = test_config(dir);
    cfg.room.ping_interval = Duration::from_millis(100);
    cfg.idle_timeout = Duration::from_millis(600);
    cfg.write_timeout = Duration::from_secs(600);
    let server = TestServer::start(cfg).await;
    fill_text(&server.url("big"), BIG).await;
    server
}

/// Waits (at most 10 s) until the gauge `metric` is 0, failing with `what` otherwise.
async fn until_none_left(server: &TestServer, metric: &str, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.metric(metric).await > 0.0 {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Before the fix, the gate's admission travelled inside the answer's body: `heavy_per_node`
/// sockets that never read held every node slot, and whole-document reads of any document
/// got 503 (edits 429) for as long as they stayed open.
#[tokio::test]
async fn answers_nobody_reads_hold_no_gate_slot_and_are_dropped_after_the_write_timeout() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = test_config(dir.path());
    cfg.gate.per_node = 2;
    cfg.gate.per_caller = 100;
    cfg.gate.wait = Duration::from_secs(2);
    cfg.write_timeout = Duration::from_secs(3);
    let server = TestServer::start(cfg).await;
    fill_text(&server.url("big"), BIG).await;
    let mut small = Client::connect(&server.url("small"), 1).await;
    small.insert(0, "hello").await;
    small.durable_ack(1).await;

    let http = reqwest::Client::new();
    let version: serde_json::Value = http
        .post(server.http("/api/v1/docs/big/versions"))
        .json(&serde_json::json!({"label": "v"}))
        .send()
        .await
        .expect("version")
        .json()
        .await
        .expect("json");
    let id = version["id"].as_i64().expect("a version id");
    // More than heavy_per_node readers of every whole-document answer, none of which reads.
    let heavy = [
        "/api/v1/docs/big/json".to_owned(),
        "/api/v1/docs/big/json".to_owned(),
        "/api/v1/docs/big/update".to_owned(),
        format!("/api/v1/docs/big/versions/{id}/json"),
        "/api/v1/docs/big/json?at_position=1".to_owned(),
        format!("/api/v1/docs/big/diff?from={id}"),
    ];
    let mut stuck = Vec::new();
    for path in &heavy {
        stuck.push(ask_and_never_read(server.addr, path).await);
    }
    server
        .wait_metric("quire_heavy_admitted_total", |v| v >= 1.0)
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Everyone else's whole-document work goes on at its usual pace.
    let (status, body, took) = timed(http.get(server.http("/api/v1/docs/small/json"))).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        took < Duration::from_secs(1),
        "another document's read took {took:?}"
    );
    let (status, body, _) = timed(http.get(server.http("/api/v1/docs/big/json"))).await;
    assert_eq!(
        status, 200,
        "the same document, read by a client that reads"
    );
    assert_eq!(body.len(), BIG + r#"{"text":""}"#.len());
    let edit = serde_json::json!({"ops": [{"text": "text", "insert": "!", "at": 0}]});
    let (status, body, took) =
        timed(http.post(server.http("/api/v1/docs/big/edits")).json(&edit)).await;
    assert_eq!(status, 200, "{body}");
    assert!(took < Duration::from_secs(1), "an edit took {took:?}");
    let (status, _, _) = timed(http.get(server.http("/api/v1/docs/small/versions"))).await;
    assert_eq!(status, 200);

    // The write deadline closes the connections that do not read: each gets less than its
    // answer (what was in the server's socket buffers), then the end.
    tokio::time::sleep(Duration::from_secs(4)).await;
    for tcp in &mut stuck {
        let read = read_to_close(tcp, Duration::from_secs(30)).await;
        let read = read.expect("the server closed the connection");
        assert!(read < BIG, "read {read} bytes of an answer of about {BIG}");
    }
    server.stop().await;
}

/// A caller's whole-document requests in flight are bounded (`heavy_per_caller`), answers it
/// does not read included; its slots come back once the write deadline drops them.
#[tokio::test]
async fn a_caller_has_at_most_its_share_of_whole_document_requests_in_flight() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = test_config(dir.path());
    cfg.gate.per_caller = 2;
    cfg.write_timeout = Duration::from_secs(2);
    let server = TestServer::start(cfg).await;
    fill_text(&server.url("big"), BIG).await;
    let mut stuck = vec![
        ask_and_never_read(server.addr, "/api/v1/docs/big/json").await,
        ask_and_never_read(server.addr, "/api/v1/docs/big/update").await,
    ];
    server
        .wait_metric("quire_heavy_admitted_total", |v| v >= 2.0)
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    // (Open mode: every caller from this address is the same user.)
    let http = reqwest::Client::new();
    let (status, body, _) = timed(http.get(server.http("/api/v1/docs/big/json"))).await;
    assert_eq!(status, 429, "{body}");
    assert!(body.contains("too-many-heavy-requests"), "{body}");
    // Routes whose cost does not grow with the document are not counted.
    let (status, _, _) = timed(http.get(server.http("/api/v1/docs/big"))).await;
    assert_eq!(status, 200);
    for tcp in &mut stuck {
        read_to_close(tcp, Duration::from_secs(30))
            .await
            .expect("closed by the write deadline");
    }
    let (status, body, _) = timed(http.get(server.http("/api/v1/docs/big/json"))).await;
    assert_eq!(status, 200, "{body}");
    server.stop().await;
}

/// Before the fix, the keep-alive check was skipped while a write was pending: a y-websocket
/// client that asked for a large document, then neither read nor sent, kept its socket (and
/// its room) for good.
#[tokio::test]
async fn a_y_websocket_client_whose_write_is_stuck_is_still_idle_closed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = idle_checking_server(dir.path()).await;
    let url = server.url("big");
    let tcp = small_window(server.addr).await;
    let (mut ws, _) = tokio_tungstenite::client_async(url.as_str(), tcp)
        .await
        .expect("handshake");
    let step1 = quire_server::protocol::encode_step1(&StateVector::default());
    ws.send(Message::Binary(step1)).await.expect("step 1");
    wait_metric_at(server.addr, "quire_connections", |v| v == 1.0).await;
    // Its Step 2 (the whole document) cannot be written; it sends nothing more.
    let what = "a silent client with a stuck write is still connected";
    until_none_left(&server, "quire_connections", what).await;
    drop(ws);
    server.stop().await;
}

/// The same for a Hocuspocus socket (its writer's timer was not polled while a ping waited
/// behind a stuck write).
#[tokio::test]
async fn a_hocuspocus_socket_whose_write_is_stuck_is_still_idle_closed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = idle_checking_server(dir.path()).await;
    let tcp = small_window(server.addr).await;
    let url = format!("ws://{}/hocuspocus", server.addr);
    let (mut ws, _) = tokio_tungstenite::client_async(url.as_str(), tcp)
        .await
        .expect("handshake");
    let step1 = quire_server::protocol::encode_step1(&StateVector::default());
    for frame in [
        hp::encode_auth_with_version("big", "", "4.8.0"),
        hp::wrap("big", &step1),
    ] {
        ws.send(Message::Binary(frame)).await.expect("send");
    }
    wait_metric_at(server.addr, "quire_hocuspocus_sockets", |v| v == 1.0).await;
    let what = "a silent socket with a stuck write is still open";
    until_none_left(&server, "quire_hocuspocus_sockets", what).await;
    drop(ws);
    server.stop().await;
}
