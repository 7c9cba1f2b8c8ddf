//! A y-websocket client in Rust for the tests: a `Doc` kept in sync over one socket.
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

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// An awareness message announcing one client's state (clock 1) as `json`.
pub fn presence(client: u64, json: &str) -> Bytes {
    presence_at(client, 1, json)
}

/// [`presence`] with a clock of the sender's choosing.
pub fn presence_at(client: u64, clock: u32, json: &str) -> Bytes {
    let update = yrs::sync::AwarenessUpdate {
        clients: [(
            yrs::ClientID::new(client),
            yrs::sync::awareness::AwarenessUpdateEntry {
                clock,
                json: json.into(),
            },
        )]
        .into_iter()
        .collect(),
    };
    protocol::encode_awareness(&update)
}

/// A y-websocket client in Rust: a `Doc` kept in sync over one socket.
pub struct Client {
    pub doc: Doc,
    ws: Ws,
    pub synced: bool,
    pub acks_received: Vec<Bytes>,
    pub awareness: HashMap<u64, String>,
    /// Awareness messages received (a frame may carry several clients' states).
    pub awareness_frames: usize,
    pub updates_received: usize,
    pub closed: Option<CloseFrame>,
    /// The reason of the last Auth permission-denied message.
    pub permission_denied: Option<String>,
}

impl Client {
    /// Connects with a fixed client id and waits for the initial sync.
    pub async fn connect(url: &str, client_id: u64) -> Client {
        let mut c = Client::connect_unsynced(url, client_id).await;
        c.sync().await;
        c
    }

    /// Connects and sends Sync/Step1 without waiting for anything.
    pub async fn connect_unsynced(url: &str, client_id: u64) -> Client {
        Client::connect_with_doc(url, Doc::with_client_id(client_id)).await
    }

    pub async fn connect_with_doc(url: &str, doc: Doc) -> Client {
        match Client::try_connect_with_doc(url, doc).await {
            Ok(c) => c,
            Err(e) => panic!("websocket connect: {e}"),
        }
    }

    /// Like [`Client::connect_with_doc`], but a refused connection is an error (a server
    /// that is down, or answers 503/429).
    pub async fn try_connect_with_doc(
        url: &str,
        doc: Doc,
    ) -> Result<Client, tokio_tungstenite::tungstenite::Error> {
        // Large documents arrive as one large Step2 frame; lift tungstenite's 16 MiB default.
        let config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
            .max_frame_size(None)
            .max_message_size(None);
        let (ws, _) = tokio_tungstenite::connect_async_with_config(url, Some(config), true).await?;
        let mut c = Client {
            doc,
            ws,
            synced: false,
            acks_received: Vec::new(),
            awareness: HashMap::new(),
            awareness_frames: 0,
            updates_received: 0,
            closed: None,
            permission_denied: None,
        };
        let sv = c.doc.transact().state_vector();
        c.send_raw(protocol::encode_step1(&sv)).await;
        Ok(c)
    }

    pub async fn sync(&mut self) {
        let ok = self.pump_until(PATIENCE, |c| c.synced).await;
        assert!(ok, "initial sync completes");
    }

    pub fn text(&self) -> String {
        let t = self.doc.get_or_insert_text("text");
        t.get_string(&self.doc.transact())
    }

    /// Length of the shared text, without building the string.
    pub fn text_len(&self) -> usize {
        let t = self.doc.get_or_insert_text("text");
        t.len(&self.doc.transact()) as usize
    }

    pub fn state_vector(&self) -> StateVector {
        self.doc.transact().state_vector()
    }

    /// Inserts into the shared text "text" and sends the update; returns it.
    pub async fn insert(&mut self, index: u32, s: &str) -> Vec<u8> {
        let t = self.doc.get_or_insert_text("text");
        let update = {
            let mut txn = self.doc.transact_mut();
            let len = t.len(&txn);
            t.insert(&mut txn, index.min(len), s);
            txn.encode_update_v1()
        };
        self.send_update(&update).await;
        update
    }

    pub async fn send_update(&mut self, update: &[u8]) {
        self.send_raw(protocol::encode_update(update)).await;
    }

    pub async fn send_raw(&mut self, frame: Bytes) {
        let _ = self.ws.send(WsMessage::Binary(frame)).await;
    }

    /// Sends a durable-ack request and waits for its echo.
    pub async fn durable_ack(&mut self, n: u64) {
        let frame = protocol::encode_durable_ack(n);
        self.send_raw(frame.clone()).await;
        let ok = self
            .pump_until(PATIENCE, |c| c.acks_received.contains(&frame))
            .await;
        assert!(ok, "durable ack {n} not echoed (closed: {:?})", self.closed);
    }

    /// Handles incoming frames until `done` holds or `patience` passes. Returns whether `done`.
    pub async fn pump_until(&mut self, patience: Duration, done: impl Fn(&Client) -> bool) -> bool {
        let deadline = tokio::time::Instant::now() + patience;
        while !done(self) {
            if self.closed.is_some() {
                return false;
            }
            match tokio::time::timeout_at(deadline, self.ws.next()).await {
                Err(_) => return false,
                Ok(None) => {
                    self.closed = Some(CloseFrame {
                        code: CloseCode::Abnormal,
                        reason: "eof".into(),
                    });
                }
                Ok(Some(Err(_))) => {
                    self.closed = Some(CloseFrame {
                        code: CloseCode::Abnormal,
                        reason: "error".into(),
                    });
                }
                Ok(Some(Ok(msg))) => self.handle(msg).await,
            }
        }
        true
    }

    /// Waits for the server to close the connection; returns the close code.
    pub async fn wait_closed(&mut self) -> Option<u16> {
        self.pump_until(PATIENCE, |c| c.closed.is_some()).await;
        self.closed.as_ref().map(|f| u16::from(f.code))
    }

    async fn handle(&mut self, msg: WsMessage) {
        match msg {
            WsMessage::Binary(data) => {
                let msgs = protocol::decode_frame(&data).expect("server frames decode");
                for m in msgs {
                    match m {
                        Message::SyncStep1(sv) => {
                            let diff = self.doc.transact().encode_diff_v1(&sv);
                            self.send_raw(protocol::encode_step2(&diff)).await;
                        }
                        Message::SyncStep2(u) => {
                            self.apply(&u);
                            self.synced = true;
                        }
                        Message::Update(u) => {
                            self.updates_received += 1;
                            self.apply(&u);
                        }
                        Message::Awareness { update, .. } => {
                            self.awareness_frames += 1;
                            for (id, e) in update.clients {
                                if &*e.json == "null" {
                                    self.awareness.remove(&id.get());
                                } else {
                                    self.awareness.insert(id.get(), e.json.to_string());
                                }
                            }
                        }
                        Message::DurableAck { raw } => self.acks_received.push(raw),
                        Message::Auth(Some(reason)) => self.permission_denied = Some(reason),
                        _ => {}
                    }
                }
            }
            WsMessage::Close(frame) => {
                self.closed = Some(frame.unwrap_or(CloseFrame {
                    code: CloseCode::Status,
                    reason: "".into(),
                }));
            }
            _ => {}
        }
    }

    fn apply(&mut self, update: &[u8]) {
        let u = Update::decode_v1(update).expect("server sends valid updates");
        self.doc.transact_mut().apply_update(u).expect("apply");
    }

    pub async fn close(mut self) {
        let _ = self.ws.close(None).await;
    }
}

/// Sends 400 updates of 64 KiB through `writer`, paced on `fast`, which must receive them
/// all: they fill the socket buffers of a client that does not read (loopback buffers hold a
/// few MiB), then its queue of 8. Returns the text length `fast` ends with.
pub async fn flood_past_a_client_that_does_not_read(
    writer: &mut Client,
    mut fast: Client,
) -> usize {
    let chunk = "y".repeat(64 * 1024);
    let n = 400usize;
    let seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen_by_reader = seen.clone();
    let reader = tokio::spawn(async move {
        // Progress is checked per update by the writer below; this bound is for all 400
        // (debug builds on a busy two-core machine took over 20 s once).
        let ok = fast
            .pump_until(PATIENCE * 10, |c| {
                seen_by_reader.store(c.updates_received, std::sync::atomic::Ordering::SeqCst);
                c.updates_received == n
            })
            .await;
        (ok, fast.closed.clone(), fast.text_len())
    });
    for i in 0..n {
        writer.insert(0, &chunk).await;
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while seen.load(std::sync::atomic::Ordering::SeqCst) < i + 1 && !reader.is_finished() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "fast client stalled"
            );
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }
    let (ok, closed, len) = reader.await.expect("reader task");
    assert!(
        ok,
        "the fast client received every update (closed: {closed:?})"
    );
    assert_eq!(len, n * chunk.len());
    len
}

/// A document of about `bytes` bytes of text, written by one client (id 100) in 64 KiB
/// inserts and acknowledged durable.
pub async fn fill_text(url: &str, bytes: usize) {
    let mut writer = Client::connect(url, 100).await;
    let chunk = "x".repeat(64 * 1024);
    for _ in 0..bytes / chunk.len() {
        writer.insert(0, &chunk).await;
    }
    writer.durable_ack(1).await;
    writer.close().await;
}
