//! The floor: the least a y-websocket-compatible server can do, the limit Quire is measured
//! against in `bench/run.sh`.
//!
//! tokio, the y-websocket framing, one yrs `Doc` per room in memory; nothing else: no
//! storage, no limits, no authentication, no awareness bookkeeping, no metrics, one task per
//! connection. A client's Sync Step 1 gets the room's Step 2 (and the server's own Step 1 is
//! sent on connect, as the reference server does); an update is applied to the room's `Doc`
//! and, if it changed anything, encoded once and queued to every other peer; awareness is
//! relayed as is; a durable-ack request (tag 102) is echoed at once (nothing is ever durable
//! here). Rooms live until the process ends.
//!
//! Two things keep a join storm (many clients opening one large document) from measuring
//! waste instead of the floor: the answer to an empty state vector (the whole document) is
//! encoded once per document version and shared, and a message over 64 KiB leaves as
//! WebSocket fragments of that one buffer (tungstenite copies a whole message into each
//! connection's write buffer otherwise). Quire does both; the floor's storm figure is then
//! the cost of moving the bytes.
//!
//! Usage: `quire-floor [ADDR] [READ_BUFFER]` (default `127.0.0.1:1234`, and tungstenite's
//! default read buffer of 128 KiB, allocated for every connection up front). With a
//! `READ_BUFFER` of 128, Quire's default (`--ws-read-buffer`), it is the floor for idle
//! memory: what any server on tokio and tungstenite keeps per connection, with nothing of its
//! own besides one task and one queue. Not for production: it exists to be measured.
//!
//! With `QUIRE_FLOOR_LOAD=DIR`, a room whose document has a file `DIR/NAME.v1` (its encoded
//! state, Yjs v1) starts from it when its first client opens it: the floor of a server
//! loading a document from storage (decode and integrate, nothing else).
//!
//! With `QUIRE_FLOOR_NATS` and `QUIRE_FLOOR_NODE`, several floor processes share their
//! documents through NATS: the floor of relaying (`floor_relay.rs`).

mod floor_relay;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use quire_protocol::{self as protocol, Message};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
use tokio_tungstenite::tungstenite::protocol::frame::Frame;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use yrs::updates::decoder::Decode;
use yrs::{Doc, ReadTxn, Transact, Update};

/// One document: its `Doc` and its connections.
#[derive(Default)]
struct Room {
    name: String,
    doc: Doc,
    peers: HashMap<u64, Peer>,
    /// The Sync Step 2 answering an empty state vector, until the document changes.
    whole: Option<Bytes>,
}

/// A connection to a room: this process's (its outbound queue), or a client of another node
/// (`floor_relay.rs`).
enum Peer {
    Local(mpsc::UnboundedSender<Bytes>),
    Remote { node: Arc<str>, conn: u64 },
}

impl Room {
    /// An empty room, or one holding the state in `$QUIRE_FLOOR_LOAD/NAME.v1`.
    fn load(name: &str) -> Room {
        let room = Room {
            name: name.to_owned(),
            ..Room::default()
        };
        let Some(dir) = std::env::var_os("QUIRE_FLOOR_LOAD") else {
            return room;
        };
        let path = std::path::Path::new(&dir).join(format!("{name}.v1"));
        let Ok(state) = std::fs::read(&path) else {
            return room;
        };
        match yrs::Update::decode_v1(&state) {
            Ok(update) => {
                if let Err(e) = room.doc.transact_mut().apply_update(update) {
                    eprintln!("{}: {e}", path.display());
                }
            }
            Err(e) => eprintln!("{}: {e}", path.display()),
        }
        room
    }
}

/// Messages longer than this leave as fragments.
const FRAGMENT: usize = 64 * 1024;

/// Queues `frame` on `sink` as one message, fragmented if long.
async fn feed<S>(sink: &mut S, frame: Bytes) -> Result<(), S::Error>
where
    S: futures_util::Sink<WsMessage> + Unpin,
{
    if frame.len() <= FRAGMENT {
        return sink.feed(WsMessage::Binary(frame)).await;
    }
    let mut at = 0;
    while at < frame.len() {
        let end = (at + FRAGMENT).min(frame.len());
        let opcode = if at == 0 {
            OpCode::Data(Data::Binary)
        } else {
            OpCode::Data(Data::Continue)
        };
        let part = Frame::message(frame.slice(at..end), opcode, end == frame.len());
        sink.feed(WsMessage::Frame(part)).await?;
        at = end;
    }
    Ok(())
}

/// Writes `frame` and whatever else is queued on `rx` in one flush.
async fn write_queued<S>(
    sink: &mut S,
    frame: Bytes,
    rx: &mut mpsc::UnboundedReceiver<Bytes>,
) -> Result<(), S::Error>
where
    S: futures_util::Sink<WsMessage> + Unpin,
{
    feed(sink, frame).await?;
    while let Ok(frame) = rx.try_recv() {
        feed(sink, frame).await?;
    }
    sink.flush().await
}

type Rooms = Arc<Mutex<HashMap<String, Arc<Mutex<Room>>>>>;

static NEXT_PEER: AtomicU64 = AtomicU64::new(1);

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:1234".to_owned());
    let config = match std::env::args().nth(2) {
        Some(n) => Some(WebSocketConfig::default().read_buffer_size(n.parse()?)),
        None => None,
    };
    // Joined before listening: a client that finds the port open finds the cluster too.
    let rooms: Rooms = Arc::default();
    floor_relay::start(rooms.clone()).await?;
    let listener = TcpListener::bind(&addr).await?;
    eprintln!("quire-floor listening on ws://{addr}");
    loop {
        let (tcp, _) = listener.accept().await?;
        let rooms = rooms.clone();
        tokio::spawn(async move {
            // A client that goes away without a close handshake (every benchmark client at
            // the end of a run) is not worth a line; anything else is.
            if let Err(e) = serve(tcp, rooms, config).await {
                let gone = e.downcast_ref::<tokio_tungstenite::tungstenite::Error>().is_some_and(|e| {
                    matches!(
                        e,
                        tokio_tungstenite::tungstenite::Error::ConnectionClosed
                            | tokio_tungstenite::tungstenite::Error::AlreadyClosed
                            | tokio_tungstenite::tungstenite::Error::Protocol(
                                tokio_tungstenite::tungstenite::error::ProtocolError::ResetWithoutClosingHandshake
                                    | tokio_tungstenite::tungstenite::error::ProtocolError::HandshakeIncomplete
                            )
                    )
                });
                if !gone {
                    eprintln!("connection: {e}");
                }
            }
        });
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

// The handshake callback's error type is tungstenite's, not ours.
#[allow(clippy::result_large_err)]
async fn serve(
    tcp: TcpStream,
    rooms: Rooms,
    config: Option<WebSocketConfig>,
) -> anyhow::Result<()> {
    tcp.set_nodelay(true)?;
    let mut path = String::new();
    let callback = |req: &Request, resp: Response| {
        path = req.uri().path().trim_start_matches('/').to_owned();
        Ok(resp)
    };
    let ws = tokio_tungstenite::accept_hdr_async_with_config(tcp, callback, config).await?;
    if let Some(cluster) = floor_relay::cluster() {
        let owner = cluster.owner(&path).await?;
        if owner != cluster.node {
            return cluster.relay(ws, path, owner).await;
        }
    }
    let room = lock(&rooms)
        .entry(path)
        .or_insert_with_key(|name| Arc::new(Mutex::new(Room::load(name))))
        .clone();
    let peer = NEXT_PEER.fetch_add(1, Ordering::Relaxed);
    let (tx, mut rx) = mpsc::unbounded_channel::<Bytes>();
    let hello = {
        let mut r = lock(&room);
        r.peers.insert(peer, Peer::Local(tx));
        let sv = r.doc.transact().state_vector();
        protocol::encode_step1(&sv)
    };
    let (mut sink, mut stream) = ws.split();
    let result = async {
        sink.send(WsMessage::Binary(hello)).await?;
        loop {
            tokio::select! {
                out = rx.recv() => {
                    let Some(frame) = out else { return Ok(()) };
                    write_queued(&mut sink, frame, &mut rx).await?;
                }
                msg = stream.next() => match msg {
                    Some(Ok(WsMessage::Binary(frame))) => {
                        for reply in on_frame(&room, peer, &frame)? {
                            feed(&mut sink, reply).await?;
                        }
                        sink.flush().await?;
                    }
                    Some(Ok(WsMessage::Close(_))) | None => return Ok(()),
                    Some(Ok(_)) => {}
                    Some(Err(e)) => return Err(anyhow::Error::from(e)),
                },
            }
        }
    }
    .await;
    lock(&room).peers.remove(&peer);
    result
}

/// Handles one frame from `peer`; returns the replies for it.
fn on_frame(room: &Mutex<Room>, peer: u64, frame: &Bytes) -> anyhow::Result<Vec<Bytes>> {
    let mut replies = Vec::new();
    for msg in protocol::decode_frame(frame)? {
        match msg {
            Message::SyncStep1(sv) => {
                let mut r = lock(room);
                let encode = |doc: &Doc| {
                    protocol::encode_step2(&doc.transact().encode_state_as_update_v1(&sv))
                };
                let reply = if sv.is_empty() {
                    let Room { doc, whole, .. } = &mut *r;
                    whole.get_or_insert_with(|| encode(doc)).clone()
                } else {
                    encode(&r.doc)
                };
                replies.push(reply);
            }
            Message::SyncStep2(update) | Message::Update(update) => {
                let decoded = Update::decode_v1(&update)?;
                let mut r = lock(room);
                let changed = {
                    let mut txn = r.doc.transact_mut();
                    txn.apply_update(decoded)?;
                    !txn.insert_set().is_empty() || !txn.delete_set().is_empty()
                };
                if changed {
                    r.whole = None;
                    broadcast(&r, peer, protocol::encode_update(&update));
                }
            }
            Message::Awareness { raw, .. } => broadcast(&lock(room), peer, raw),
            Message::DurableAck { raw } => replies.push(raw),
            _ => {}
        }
    }
    Ok(replies)
}

/// Queues `frame` to every peer of `room` but `from`: one message per other node with peers
/// there, which hands it to each (except `from`, when it is one of them).
fn broadcast(room: &Room, from: u64, frame: Bytes) {
    let sender = match room.peers.get(&from) {
        Some(Peer::Remote { node, conn }) => Some((node, *conn)),
        _ => None,
    };
    let mut nodes: Vec<(&Arc<str>, u64)> = Vec::new();
    for (id, peer) in &room.peers {
        if *id == from {
            continue;
        }
        match peer {
            Peer::Local(tx) => {
                let _ = tx.send(frame.clone());
            }
            Peer::Remote { node, .. } => {
                if !nodes.iter().any(|(n, _)| *n == node) {
                    let except = sender.filter(|(n, _)| *n == node).map_or(0, |(_, c)| c);
                    nodes.push((node, except));
                }
            }
        }
    }
    if let Some(cluster) = floor_relay::cluster() {
        for (node, except) in nodes {
            cluster.fan(node, &room.name, except, &frame);
        }
    }
}
