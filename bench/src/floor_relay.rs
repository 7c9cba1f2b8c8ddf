//! The floor of relaying: several floor processes sharing documents through NATS, the least a
//! cluster of y-websocket servers can do when a document's clients are on different nodes
//! (`bench/nodes.sh` with `SERVER=floor`).
//!
//! Set `QUIRE_FLOOR_NATS` (the NATS URL) and `QUIRE_FLOOR_NODE` (this node's name) to join;
//! one node, with `QUIRE_FLOOR_DIRECTORY` set, also keeps the directory of owners: the first
//! node to ask for a document owns it (one request per connection, none per update). A client
//! whose document another node owns is relayed: its frames go to the owner as they come, one
//! NATS message each; the owner answers it (sync replies, acknowledgements) with one message
//! per answer, and an update or awareness change reaches each other node with clients of the
//! document as **one** message, which that node hands to each of its clients (except the
//! sender). Nothing else: no signing, no numbering or loss detection, no heartbeats, no
//! batching (so under load it publishes more NATS messages than Quire, which batches per pair
//! of nodes), no bounds. A message over the NATS server's `max_payload` (1 MiB by default) is
//! not sent (a relayed client is closed when it sends such a frame; an answer that large is
//! dropped): the floor of relaying is for the typing scenarios, not for large documents.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures_util::StreamExt;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::WebSocketStream;
use yrs::{ReadTxn, Transact};

use crate::{lock, on_frame, write_queued, Peer, Room, Rooms};

/// A relayed client opens document ROOM: `[OPEN][conn][from][room]`.
const OPEN: u8 = 1;
/// A relayed client's frame: `[FRAME][conn][from][bytes]`.
const FRAME: u8 = 2;
/// A relayed client went away: `[CLOSE][conn][from]`.
const CLOSE: u8 = 3;
/// Bytes for one relayed client: `[OUT][conn][bytes]`.
const OUT: u8 = 4;
/// Bytes for every relayed client of a document on the receiving node but one (0: none):
/// `[FAN][except][room][bytes]`.
const FAN: u8 = 5;

const DIRECTORY: &str = "floor.directory";

fn subject(node: &str) -> String {
    format!("floor.node.{node}")
}

static CLUSTER: OnceLock<Cluster> = OnceLock::new();
static NEXT_CONN: AtomicU64 = AtomicU64::new(1);

/// This node's place in the cluster, if it joined one.
pub fn cluster() -> Option<&'static Cluster> {
    CLUSTER.get()
}

pub struct Cluster {
    pub node: Arc<str>,
    client: async_nats::Client,
    /// What this node publishes, in order, by one task: (subject, payload).
    out: mpsc::UnboundedSender<(String, Bytes)>,
    /// The owner of each document (on the directory node only).
    directory: Option<Mutex<HashMap<String, Arc<str>>>>,
    /// This node's relayed clients.
    relays: Mutex<Relays>,
    /// Clients of other nodes in this node's rooms: (node, conn) -> (room, peer id).
    remotes: Mutex<HashMap<(Arc<str>, u64), RemotePeer>>,
}

/// A client of another node in one of this node's rooms: the room and its peer id there.
type RemotePeer = (Arc<Mutex<Room>>, u64);

#[derive(Default)]
struct Relays {
    conns: HashMap<u64, mpsc::UnboundedSender<Bytes>>,
    by_room: HashMap<String, Vec<u64>>,
}

/// Joins the cluster named by the environment (see the module's notes); nothing without it.
pub async fn start(rooms: Rooms) -> anyhow::Result<()> {
    let Ok(url) = std::env::var("QUIRE_FLOOR_NATS") else {
        return Ok(());
    };
    let node: Arc<str> = std::env::var("QUIRE_FLOOR_NODE")
        .map_err(|_| anyhow::anyhow!("QUIRE_FLOOR_NODE names this node"))?
        .into();
    let client = async_nats::connect(url.as_str()).await?;
    let directory = std::env::var_os("QUIRE_FLOOR_DIRECTORY").map(|_| Mutex::default());
    let (out, mut out_rx) = mpsc::unbounded_channel::<(String, Bytes)>();
    let publisher = client.clone();
    tokio::spawn(async move {
        while let Some((subject, payload)) = out_rx.recv().await {
            if let Err(e) = publisher.publish(subject, payload).await {
                eprintln!("publish: {e}");
            }
        }
    });
    let mut inbox = client.subscribe(subject(&node)).await?;
    let asked = match directory {
        Some(_) => Some(client.subscribe(DIRECTORY).await?),
        None => None,
    };
    let joined = Cluster {
        node,
        client,
        out,
        directory,
        relays: Mutex::default(),
        remotes: Mutex::default(),
    };
    CLUSTER
        .set(joined)
        .map_err(|_| anyhow::anyhow!("joined twice"))?;
    let cluster = cluster().ok_or_else(|| anyhow::anyhow!("not joined"))?;
    if let Some(mut asked) = asked {
        tokio::spawn(async move {
            while let Some(msg) = asked.next().await {
                let Some(reply) = msg.reply else { continue };
                let Some((node, room)) = std::str::from_utf8(&msg.payload)
                    .ok()
                    .and_then(|text| text.split_once('\n'))
                else {
                    continue;
                };
                let owner = cluster.claim(room, node);
                let answer = Bytes::copy_from_slice(owner.as_bytes());
                let _ = cluster.client.publish(reply, answer).await;
            }
        });
    }
    tokio::spawn(async move {
        while let Some(msg) = inbox.next().await {
            cluster.on_message(&rooms, msg.payload);
        }
    });
    Ok(())
}

/// A message's head: the connection id and, for the owner's messages, the sender's name.
fn take_u64(p: &mut Bytes) -> Option<u64> {
    (p.len() >= 8).then(|| p.get_u64())
}

fn take_name(p: &mut Bytes) -> Option<Arc<str>> {
    let len = usize::from(u16::from_be_bytes([*p.first()?, *p.get(1)?]));
    let name = p.get(2..2 + len)?;
    let name = std::str::from_utf8(name).ok()?.into();
    p.advance(2 + len);
    Some(name)
}

fn message(tag: u8, conn: u64, from: Option<&str>, room: Option<&str>, data: &[u8]) -> Bytes {
    let mut m = BytesMut::with_capacity(16 + data.len());
    m.put_u8(tag);
    m.put_u64(conn);
    for name in [from, room].into_iter().flatten() {
        // (Names are checked to fit on the way in: `Cluster::relay`, and node names are ours.)
        m.put_u16(name.len() as u16);
        m.put_slice(name.as_bytes());
    }
    m.put_slice(data);
    m.freeze()
}

impl Cluster {
    /// The node that owns document `room` (asking the directory; the first to ask owns it).
    pub async fn owner(&self, room: &str) -> anyhow::Result<Arc<str>> {
        if self.directory.is_some() {
            return Ok(self.claim(room, &self.node));
        }
        let ask = Bytes::from(format!("{}\n{room}", self.node));
        let answer = self.client.request(DIRECTORY, ask).await?;
        Ok(std::str::from_utf8(&answer.payload)?.into())
    }

    fn claim(&self, room: &str, node: &str) -> Arc<str> {
        let Some(directory) = &self.directory else {
            return node.into();
        };
        lock(directory)
            .entry(room.to_owned())
            .or_insert_with(|| node.into())
            .clone()
    }

    fn send(&self, node: &str, payload: Bytes) {
        let _ = self.out.send((subject(node), payload));
    }

    /// An update or awareness frame of `room` for every client of it on `node` but `except`.
    pub fn fan(&self, node: &str, room: &str, except: u64, frame: &[u8]) {
        self.send(node, message(FAN, except, None, Some(room), frame));
    }

    fn on_message(&self, rooms: &Rooms, mut p: Bytes) {
        if p.is_empty() {
            return;
        }
        match p.get_u8() {
            OPEN => {
                let (Some(conn), Some(from)) = (take_u64(&mut p), take_name(&mut p)) else {
                    return;
                };
                let Some(name) = take_name(&mut p) else {
                    return;
                };
                let room = lock(rooms)
                    .entry(name.to_string())
                    .or_insert_with_key(|name| Arc::new(Mutex::new(Room::load(name))))
                    .clone();
                let peer = crate::NEXT_PEER.fetch_add(1, Ordering::Relaxed);
                let hello = {
                    let mut r = lock(&room);
                    let node = from.clone();
                    r.peers.insert(peer, Peer::Remote { node, conn });
                    let sv = r.doc.transact().state_vector();
                    quire_protocol::encode_step1(&sv)
                };
                lock(&self.remotes).insert((from.clone(), conn), (room, peer));
                self.send(&from, message(OUT, conn, None, None, &hello));
            }
            FRAME => {
                let (Some(conn), Some(from)) = (take_u64(&mut p), take_name(&mut p)) else {
                    return;
                };
                let Some((room, peer)) = lock(&self.remotes).get(&(from.clone(), conn)).cloned()
                else {
                    return;
                };
                match on_frame(&room, peer, &p) {
                    Ok(replies) => {
                        for reply in replies {
                            self.send(&from, message(OUT, conn, None, None, &reply));
                        }
                    }
                    Err(e) => eprintln!("relayed frame: {e}"),
                }
            }
            CLOSE => {
                let (Some(conn), Some(from)) = (take_u64(&mut p), take_name(&mut p)) else {
                    return;
                };
                if let Some((room, peer)) = lock(&self.remotes).remove(&(from, conn)) {
                    lock(&room).peers.remove(&peer);
                }
            }
            OUT => {
                let Some(conn) = take_u64(&mut p) else { return };
                if let Some(tx) = lock(&self.relays).conns.get(&conn) {
                    let _ = tx.send(p);
                }
            }
            FAN => {
                let (Some(except), Some(room)) = (take_u64(&mut p), take_name(&mut p)) else {
                    return;
                };
                let relays = lock(&self.relays);
                for conn in relays.by_room.get(&*room).into_iter().flatten() {
                    if *conn != except {
                        if let Some(tx) = relays.conns.get(conn) {
                            let _ = tx.send(p.clone());
                        }
                    }
                }
            }
            _ => {}
        }
    }

    /// Relays a client of `room`, which `owner` holds, until either side closes.
    pub async fn relay(
        &self,
        ws: WebSocketStream<TcpStream>,
        room: String,
        owner: Arc<str>,
    ) -> anyhow::Result<()> {
        anyhow::ensure!(
            room.len() <= usize::from(u16::MAX),
            "document name too long"
        );
        let conn = NEXT_CONN.fetch_add(1, Ordering::Relaxed);
        let (tx, mut rx) = mpsc::unbounded_channel::<Bytes>();
        {
            let mut relays = lock(&self.relays);
            relays.conns.insert(conn, tx);
            relays.by_room.entry(room.clone()).or_default().push(conn);
        }
        self.send(
            &owner,
            message(OPEN, conn, Some(&self.node), Some(&room), &[]),
        );
        let (mut sink, mut stream) = ws.split();
        let result = async {
            loop {
                tokio::select! {
                    out = rx.recv() => {
                        let Some(frame) = out else { return Ok(()) };
                        write_queued(&mut sink, frame, &mut rx).await?;
                    }
                    msg = stream.next() => match msg {
                        Some(Ok(WsMessage::Binary(frame))) => {
                            let frame = message(FRAME, conn, Some(&self.node), None, &frame);
                            anyhow::ensure!(
                                frame.len() <= self.client.max_payload(),
                                "a frame larger than the NATS server takes"
                            );
                            self.send(&owner, frame);
                        }
                        Some(Ok(WsMessage::Close(_))) | None => return Ok(()),
                        Some(Ok(_)) => {}
                        Some(Err(e)) => return Err(anyhow::Error::from(e)),
                    },
                }
            }
        }
        .await;
        {
            let mut relays = lock(&self.relays);
            relays.conns.remove(&conn);
            if let Some(conns) = relays.by_room.get_mut(&room) {
                conns.retain(|c| *c != conn);
                if conns.is_empty() {
                    relays.by_room.remove(&room);
                }
            }
        }
        self.send(&owner, message(CLOSE, conn, Some(&self.node), None, &[]));
        result
    }
}
