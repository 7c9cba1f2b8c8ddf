//! Several nodes: a private NATS server, node configurations, editors across nodes and the
//! checks a cluster test makes with a fresh client.
#![allow(dead_code, unused_imports)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use quire_server::config::{Config, Settings};
use quire_server::protocol::{self, Message};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use tokio_util::sync::CancellationToken;
use yrs::updates::decoder::Decode;
use yrs::{Doc, GetString, ReadTxn, StateVector, Text, Transact, Update};

use super::*;

/// The cluster key the tests' nodes share.
pub const CLUSTER_KEY: &str = "test-cluster-key-0123456789";

/// A private NATS server on a free loopback port (killed when dropped).
pub struct Nats {
    pub child: tokio::process::Child,
    pub url: String,
    pub port: u16,
}

impl Nats {
    pub async fn start() -> Nats {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .expect("bind")
            .local_addr()
            .expect("addr")
            .port();
        Nats::start_on(port).await
    }

    pub async fn start_on(port: u16) -> Nats {
        Nats::start_with(port, &[]).await
    }

    /// On a free port, with these extra `nats-server` arguments (`--user`, `--pass`, ...).
    pub async fn start_args(extra: &[&str]) -> Nats {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .expect("bind")
            .local_addr()
            .expect("addr")
            .port();
        Nats::start_with(port, extra).await
    }

    pub async fn start_with(port: u16, extra: &[&str]) -> Nats {
        let child = tokio::process::Command::new("nats-server")
            .args(["-a", "127.0.0.1", "-p", &port.to_string()])
            .args(extra)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("nats-server is installed (Debian package nats-server)");
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            assert!(tokio::time::Instant::now() < deadline, "nats-server starts");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Nats {
            child,
            url: format!("nats://127.0.0.1:{port}"),
            port,
        }
    }
}

/// A client that never held the document: connects to `url` (client id 999,999), syncs,
/// returns the text, and goes. What a durability test checks with, since a client that
/// held the data would upload it again on reconnect.
pub async fn fresh_text(url: &str) -> String {
    let c = Client::connect(url, 999_999).await;
    let text = c.text();
    c.close().await;
    text
}

/// Settings of an in-process cluster node: the test's PostgreSQL database, node `id`, the
/// bus at `bus` signed with [`CLUSTER_KEY`], a 2 s lease.
pub fn node_config(dir: &Path, id: &str, bus: &str) -> Config {
    let mut cfg = test_config(dir);
    cfg.database_url = pg_database_url(dir).into();
    cfg.node_id = id.to_owned();
    cfg.bus_url = Some(bus.into());
    cfg.cluster_key = Some(CLUSTER_KEY.into());
    cfg.lease_ttl = Duration::from_secs(2);
    cfg
}

/// A client that edits without pause through servers that fail under it: each edit is a
/// marker of its own at the end of the text, followed by a durable-ack request; a marker is
/// *acknowledged* once its ack is echoed. When its connection drops, refuses or times out it
/// reconnects (with its document, as y-websocket does) through the current `urls`, in turn.
pub struct Editor {
    pub id: u64,
    pub doc: Doc,
    pub acked: Vec<String>,
    /// Every editor's acknowledged markers, shared (for checks while they run).
    pub log: Arc<std::sync::Mutex<Vec<String>>>,
    pub sent: u64,
    pub reconnects: u64,
}

/// The servers editors connect through (a test replaces one when it restarts a node).
pub type Urls = Arc<std::sync::Mutex<Vec<String>>>;

impl Editor {
    pub fn new(id: u64) -> Editor {
        Editor {
            id,
            doc: Doc::with_client_id(id),
            acked: Vec::new(),
            log: Arc::default(),
            sent: 0,
            reconnects: 0,
        }
    }

    /// Connects through `urls` (trying each in turn) until a sync completes. `patience`
    /// counts only time in which there was a server to try: while the test holds
    /// reconnections back (no urls), the clock starts again.
    pub async fn connect(&mut self, urls: &Urls, patience: Duration) -> Client {
        let mut deadline = tokio::time::Instant::now() + patience;
        let mut i = self.id as usize;
        loop {
            let url = {
                let urls = urls.lock().unwrap_or_else(|e| e.into_inner());
                (!urls.is_empty()).then(|| urls[i % urls.len()].clone())
            };
            i += 1;
            // (No url: the test holds reconnections back for a moment.)
            let attempt = match url {
                Some(url) => Client::try_connect_with_doc(&url, self.doc.clone())
                    .await
                    .ok(),
                None => {
                    deadline = tokio::time::Instant::now() + patience;
                    None
                }
            };
            if let Some(mut c) = attempt {
                // A large document's sync on a busy machine takes a while: wait for it
                // rather than start over.
                if c.pump_until(Duration::from_secs(10), |c| c.synced).await {
                    return c;
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "editor {} cannot reconnect",
                self.id
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Edits until `stop` fires; returns itself with what was acknowledged.
    pub async fn run(mut self, urls: Urls, stop: CancellationToken) -> Editor {
        let mut client: Option<Client> = None;
        while !stop.is_cancelled() {
            let mut c = match client.take() {
                Some(c) => c,
                None => {
                    self.reconnects += 1;
                    self.connect(&urls, PATIENCE * 3).await
                }
            };
            self.sent += 1;
            let marker = format!("[{}.{}]", self.id, self.sent);
            let end = c.text_len() as u32;
            c.insert(end, &marker).await;
            let ack = protocol::encode_durable_ack(self.sent);
            c.send_raw(ack.clone()).await;
            let acked = c
                .pump_until(Duration::from_secs(3), |c| c.acks_received.contains(&ack))
                .await;
            if acked {
                self.log
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(marker.clone());
                self.acked.push(marker);
                client = Some(c);
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            // Otherwise closed or silent: dropped, and the next round reconnects.
        }
        self
    }
}

/// After a soak: a client that never held the document must have every marker the editors
/// saw acknowledged; then every editor reconnects (uploading what it has) and all converge.
/// Returns the number of acknowledged markers checked.
pub async fn check_soak(editors: Vec<Editor>, urls: &Urls) -> usize {
    let mut fresh = Editor::new(999_999);
    let c = fresh.connect(urls, PATIENCE * 3).await;
    let text = c.text();
    c.close().await;
    let checked = editors.iter().map(|e| e.acked.len()).sum();
    let lost = super::lost_markers(&text, editors.iter().flat_map(|e| &e.acked));
    assert!(lost.is_empty(), "acknowledged, then lost: {lost:?}");
    let mut clients = Vec::new();
    for mut e in editors {
        let mut c = e.connect(urls, PATIENCE * 3).await;
        c.durable_ack(u64::MAX).await;
        clients.push(c);
    }
    let c = fresh.connect(urls, PATIENCE).await;
    let all = c.text();
    c.close().await;
    for c in clients.iter_mut() {
        assert!(
            c.pump_until(PATIENCE, |c| c.text() == all).await,
            "an editor converges"
        );
    }
    checked
}

/// The text a client that never held the document gets through `urls` (retrying until a
/// node serves it).
pub async fn fresh_text_via(urls: &[String]) -> String {
    let mut fresh = Editor::new(999_998);
    let urls: Urls = Arc::new(std::sync::Mutex::new(urls.to_vec()));
    let c = fresh.connect(&urls, PATIENCE * 3).await;
    let text = c.text();
    c.close().await;
    text
}

/// `quire serve` arguments of cluster node `id` on the bus at `bus` (signed with
/// [`CLUSTER_KEY`]), with a lease of `lease_ttl`.
pub fn node_args<'a>(id: &'a str, bus: &'a str, lease_ttl: &'a str) -> [&'a str; 8] {
    [
        "--node-id",
        id,
        "--bus",
        bus,
        "--cluster-key",
        CLUSTER_KEY,
        "--lease-ttl",
        lease_ttl,
    ]
}

/// A Yjs v1 update by client `client` inserting `text` into an empty shared text "text".
pub fn one_edit(client: u64, text: &str) -> Vec<u8> {
    let doc = Doc::with_client_id(client);
    let shared = doc.get_or_insert_text("text");
    let mut txn = doc.transact_mut();
    shared.insert(&mut txn, 0, text);
    txn.encode_update_v1()
}
