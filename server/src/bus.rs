//! The bus between nodes (NATS): a node that does not own a document relays its clients'
//! frames to the owner, and the owner's frames back.
//!
//! Every node subscribes to `quire.node.<node-id>`; everything addressed to a node goes there.
//! A relaying node sends `Open` (a client wants document D), `Frame` (bytes the client sent),
//! `Alive` (the client is still there) and `Close`; the owner answers with `Out` (bytes for the
//! client) and `Kill` (close the client with this code). On the owner, each relayed client is
//! a *remote peer*: it joins the room like a WebSocket connection does, so sync replies,
//! broadcasts, awareness and durable acknowledgements (sent only after the owner's commit)
//! reach it the same way. NATS delivers at most once: when the connection to NATS drops, both
//! sides close what they relay (clients reconnect and resync, which loses nothing that was
//! acknowledged).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::close;
use crate::config::Limits;
use crate::limits::PeerRates;
use crate::room::queue::{Bounds, Next, QueueRx, QueueTx, SendError};
use crate::room::{CloseReason, DocName, PeerAuth, PeerId, Registry};

const OPEN: u8 = 1;
const FRAME: u8 = 2;
const ALIVE: u8 = 3;
const CLOSE: u8 = 4;
const OUT: u8 = 5;
const KILL: u8 = 6;

/// How often a relaying node says its client is still there; the owner drops a remote peer
/// not heard from for three times this.
pub const ALIVE_EVERY: Duration = Duration::from_secs(1);

/// One message on the bus.
#[derive(Debug, Clone, PartialEq)]
pub enum Envelope {
    Open {
        from: String,
        conn: u64,
        doc: String,
        user: Option<String>,
        can_write: bool,
        /// When the client's token expires (seconds since the epoch): the owner closes the
        /// remote peer then, as it would a local one.
        expires_at: Option<i64>,
    },
    Frame {
        from: String,
        conn: u64,
        data: Bytes,
    },
    Alive {
        from: String,
        conn: u64,
    },
    Close {
        from: String,
        conn: u64,
    },
    Out {
        conn: u64,
        data: Bytes,
    },
    Kill {
        conn: u64,
        code: u16,
        reason: String,
    },
}

fn put_str(b: &mut BytesMut, s: &str) {
    let s = &s.as_bytes()[..s.len().min(u16::MAX as usize)];
    b.put_u16(s.len() as u16);
    b.put_slice(s);
}

fn get_str(b: &mut Bytes) -> Option<String> {
    if b.remaining() < 2 {
        return None;
    }
    let n = b.get_u16() as usize;
    if b.remaining() < n {
        return None;
    }
    String::from_utf8(b.split_to(n).to_vec()).ok()
}

impl Envelope {
    pub fn encode(&self) -> Bytes {
        let mut b = BytesMut::new();
        match self {
            Envelope::Open {
                from,
                conn,
                doc,
                user,
                can_write,
                expires_at,
            } => {
                b.put_u8(OPEN);
                b.put_u64(*conn);
                put_str(&mut b, from);
                put_str(&mut b, doc);
                b.put_u8(u8::from(*can_write));
                match user {
                    Some(u) => {
                        b.put_u8(1);
                        put_str(&mut b, u);
                    }
                    None => b.put_u8(0),
                }
                match expires_at {
                    Some(exp) => {
                        b.put_u8(1);
                        b.put_i64(*exp);
                    }
                    None => b.put_u8(0),
                }
            }
            Envelope::Frame { from, conn, data } => {
                b.put_u8(FRAME);
                b.put_u64(*conn);
                put_str(&mut b, from);
                b.put_slice(data);
            }
            Envelope::Alive { from, conn } => {
                b.put_u8(ALIVE);
                b.put_u64(*conn);
                put_str(&mut b, from);
            }
            Envelope::Close { from, conn } => {
                b.put_u8(CLOSE);
                b.put_u64(*conn);
                put_str(&mut b, from);
            }
            Envelope::Out { conn, data } => {
                b.put_u8(OUT);
                b.put_u64(*conn);
                b.put_slice(data);
            }
            Envelope::Kill { conn, code, reason } => {
                b.put_u8(KILL);
                b.put_u64(*conn);
                b.put_u16(*code);
                put_str(&mut b, reason);
            }
        }
        b.freeze()
    }

    /// Decodes a bus message; `None` if it is malformed (it is then ignored).
    pub fn decode(mut b: Bytes) -> Option<Envelope> {
        if b.remaining() < 9 {
            return None;
        }
        let kind = b.get_u8();
        let conn = b.get_u64();
        Some(match kind {
            OPEN => {
                let from = get_str(&mut b)?;
                let doc = get_str(&mut b)?;
                if b.remaining() < 2 {
                    return None;
                }
                let can_write = b.get_u8() == 1;
                let user = match b.get_u8() {
                    1 => Some(get_str(&mut b)?),
                    _ => None,
                };
                if b.remaining() < 1 {
                    return None;
                }
                let expires_at = match b.get_u8() {
                    1 if b.remaining() >= 8 => Some(b.get_i64()),
                    1 => return None,
                    _ => None,
                };
                Envelope::Open {
                    from,
                    conn,
                    doc,
                    user,
                    can_write,
                    expires_at,
                }
            }
            FRAME => {
                let from = get_str(&mut b)?;
                Envelope::Frame {
                    from,
                    conn,
                    data: b,
                }
            }
            ALIVE => Envelope::Alive {
                from: get_str(&mut b)?,
                conn,
            },
            CLOSE => Envelope::Close {
                from: get_str(&mut b)?,
                conn,
            },
            OUT => Envelope::Out { conn, data: b },
            KILL => {
                if b.remaining() < 2 {
                    return None;
                }
                let code = b.get_u16();
                Envelope::Kill {
                    conn,
                    code,
                    reason: get_str(&mut b)?,
                }
            }
            _ => return None,
        })
    }
}

/// A remote peer's inbox on the owner.
enum RemoteIn {
    Frame(Bytes),
    Alive,
    Close,
    /// Its frames waiting here passed the bound: close it with 1013.
    Overflow,
}

/// This node's end of the bus.
pub struct Bus {
    client: async_nats::Client,
    pub node: Arc<str>,
    /// Relayed connections of this node, by connection id: the owner's frames for each wait
    /// in a queue bounded like a local peer's (frames and bytes; overflow closes with 1013).
    relays: Mutex<HashMap<u64, QueueTx>>,
    /// Remote peers this node serves as owner, by (relaying node, connection id).
    remotes: Mutex<HashMap<(String, u64), Remote>>,
    /// Most bytes of a relayed client's frames waiting for its remote peer on the owner;
    /// past it the remote peer is closed with 1013.
    remote_inbox_bytes: usize,
    /// The connection limits, applied to remote peers as to local ones.
    limits: Limits,
}

/// The owner's end of a relayed client: its inbox and the bytes of frames waiting in it.
struct Remote {
    tx: mpsc::UnboundedSender<RemoteIn>,
    queued: Arc<AtomicUsize>,
}

fn subject(node: &str) -> String {
    format!("quire.node.{node}")
}

impl Bus {
    /// Connects to NATS at `url` (retrying in the background until it answers) and starts
    /// serving this node's subject.
    pub async fn start(
        url: &str,
        node: Arc<str>,
        registry: Arc<Registry>,
        limits: Limits,
    ) -> anyhow::Result<Arc<Bus>> {
        let max_message_size = limits.max_message_size;
        let (events_tx, mut events_rx) = mpsc::unbounded_channel();
        let client = async_nats::ConnectOptions::new()
            .retry_on_initial_connect()
            .event_callback(move |event| {
                let events_tx = events_tx.clone();
                async move {
                    let _ = events_tx.send(event);
                }
            })
            .connect(url)
            .await?;
        let mut inbox = client.subscribe(subject(&node)).await?;
        let bus = Arc::new(Bus {
            client,
            node,
            relays: Mutex::new(HashMap::new()),
            remotes: Mutex::new(HashMap::new()),
            remote_inbox_bytes: registry.config.room_queue_bytes,
            limits,
        });
        let weak = Arc::downgrade(&bus);
        tokio::spawn(async move {
            while let Some(msg) = inbox.next().await {
                let Some(bus) = weak.upgrade() else { return };
                if msg.payload.len() > max_message_size + 1024 {
                    continue;
                }
                match Envelope::decode(msg.payload) {
                    Some(env) => bus.dispatch(env, &registry),
                    None => debug!("ignoring a malformed bus message"),
                }
            }
        });
        let weak = Arc::downgrade(&bus);
        tokio::spawn(async move {
            while let Some(event) = events_rx.recv().await {
                let Some(bus) = weak.upgrade() else { return };
                if matches!(event, async_nats::Event::Disconnected) {
                    warn!("lost the bus; closing relayed connections so they resync");
                    bus.drop_all();
                } else {
                    debug!(%event, "bus event");
                }
            }
        });
        Ok(bus)
    }

    /// Sends `env` to `node`; a failure only logs (the bus delivers at most once anyway).
    pub async fn send(&self, node: &str, env: Envelope) {
        if let Err(e) = self.client.publish(subject(node), env.encode()).await {
            debug!(error = %e, "bus publish failed");
        }
    }

    /// Registers a relayed connection; its frames from the owner, and the owner's order to
    /// close it, arrive on the receiver.
    pub fn register_relay(&self, conn: u64, bounds: Bounds) -> QueueRx {
        let (tx, rx) = crate::room::queue::queue(bounds);
        self.lock_relays().insert(conn, tx);
        rx
    }

    pub fn unregister_relay(&self, conn: u64) {
        self.lock_relays().remove(&conn);
    }

    fn lock_relays(&self) -> std::sync::MutexGuard<'_, HashMap<u64, QueueTx>> {
        self.relays.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_remotes(&self) -> std::sync::MutexGuard<'_, HashMap<(String, u64), Remote>> {
        self.remotes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Closes everything relayed in either direction (the bus dropped messages).
    fn drop_all(&self) {
        let gone = CloseReason::new(
            close::RESTART,
            "lost the link to the document's node, reconnect",
        );
        for (_, tx) in self.lock_relays().drain() {
            tx.kill(gone.clone());
        }
        for (_, remote) in self.lock_remotes().drain() {
            let _ = remote.tx.send(RemoteIn::Close);
        }
    }

    fn dispatch(self: &Arc<Self>, env: Envelope, registry: &Arc<Registry>) {
        match env {
            Envelope::Out { conn, data } => {
                let mut relays = self.lock_relays();
                let full = relays
                    .get(&conn)
                    .is_some_and(|tx| tx.try_send(data) == Err(SendError::Full));
                if full {
                    if let Some(tx) = relays.remove(&conn) {
                        tx.kill(CloseReason::new(
                            close::TRY_AGAIN_LATER,
                            "outbound queue full; reconnect",
                        ));
                    }
                }
            }
            Envelope::Kill { conn, code, reason } => {
                if let Some(tx) = self.lock_relays().remove(&conn) {
                    tx.kill(CloseReason::new(code, reason));
                }
            }
            Envelope::Open {
                from,
                conn,
                doc,
                user,
                can_write,
                expires_at,
            } => {
                let Ok(name) = DocName::parse(&doc) else {
                    return;
                };
                let (tx, rx) = mpsc::unbounded_channel();
                let queued = Arc::new(AtomicUsize::new(0));
                self.lock_remotes().insert(
                    (from.clone(), conn),
                    Remote {
                        tx,
                        queued: queued.clone(),
                    },
                );
                let auth = PeerAuth {
                    user: user.map(Into::into),
                    token_id: None,
                    issued_at: 0,
                    can_write,
                    expires_at,
                };
                tokio::spawn(remote_peer(
                    self.clone(),
                    registry.clone(),
                    name,
                    from,
                    conn,
                    auth,
                    (rx, queued),
                ));
            }
            Envelope::Frame { from, conn, data } => {
                let mut remotes = self.lock_remotes();
                let key = (from, conn);
                let Some(remote) = remotes.get(&key) else {
                    return;
                };
                let queued = remote.queued.fetch_add(data.len(), Ordering::Relaxed);
                if queued + data.len() > self.remote_inbox_bytes && queued > 0 {
                    // The room is that far behind this client: close it like a local peer
                    // whose frames the room cannot take (it reconnects and resyncs).
                    if let Some(remote) = remotes.remove(&key) {
                        let _ = remote.tx.send(RemoteIn::Overflow);
                    }
                } else {
                    let _ = remote.tx.send(RemoteIn::Frame(data));
                }
            }
            Envelope::Alive { from, conn } => {
                if let Some(remote) = self.lock_remotes().get(&(from, conn)) {
                    let _ = remote.tx.send(RemoteIn::Alive);
                }
            }
            Envelope::Close { from, conn } => {
                if let Some(remote) = self.lock_remotes().remove(&(from, conn)) {
                    let _ = remote.tx.send(RemoteIn::Close);
                }
            }
        }
    }
}

/// A client of another node, served by this node's room for `name` as if it were local.
async fn remote_peer(
    bus: Arc<Bus>,
    registry: Arc<Registry>,
    name: DocName,
    from: String,
    conn: u64,
    auth: PeerAuth,
    (mut inbox, queued): (mpsc::UnboundedReceiver<RemoteIn>, Arc<AtomicUsize>),
) {
    let peer: PeerId = crate::ws::next_peer_id();
    let kill = |reason: CloseReason| Envelope::Kill {
        conn,
        code: reason.code,
        reason: reason.reason.to_string(),
    };
    let (room, out_rx) = match crate::ws::join_room(&registry, &name, peer, auth).await {
        Ok(joined) => joined,
        Err(reason) => {
            bus.lock_remotes().remove(&(from.clone(), conn));
            bus.send(&from, kill(reason)).await;
            return;
        }
    };
    let mut last_heard = Instant::now();
    let opened = Instant::now();
    let mut rates = PeerRates::new(&bus.limits);
    let reason = loop {
        tokio::select! {
            next = out_rx.recv() => match next {
                Next::Frame(frame) => bus.send(&from, Envelope::Out { conn, data: frame }).await,
                Next::Ping => {
                    if last_heard.elapsed() > ALIVE_EVERY * 3 {
                        break None;
                    }
                }
                Next::Kill(reason) => break Some(reason),
                Next::Closed => break Some(crate::room::queue::closed_reason()),
            },
            msg = inbox.recv() => match msg {
                Some(RemoteIn::Frame(data)) => {
                    last_heard = Instant::now();
                    let now_ms = u32::try_from(opened.elapsed().as_millis()).unwrap_or(u32::MAX);
                    let checked = crate::ws::to_peer_msgs(&data)
                        .map_err(|detail| CloseReason::new(close::MALFORMED, detail))
                        .and_then(|msgs| {
                            rates.check(&msgs, now_ms, &bus.limits).map(|()| msgs).inspect_err(|_| {
                                registry.metrics.rate_limited.inc();
                            })
                        });
                    let sent = match checked {
                        Ok(msgs) if msgs.is_empty() => Ok(()),
                        Ok(msgs) => room.send(peer, msgs, data.len()).await,
                        Err(reason) => break Some(reason),
                    };
                    queued.fetch_sub(data.len(), Ordering::Relaxed);
                    if sent.is_err() {
                        break Some(crate::room::queue::closed_reason());
                    }
                }
                Some(RemoteIn::Overflow) => {
                    break Some(CloseReason::new(close::TRY_AGAIN_LATER, "inbound queue full; reconnect"));
                }
                Some(RemoteIn::Alive) => last_heard = Instant::now(),
                Some(RemoteIn::Close) | None => break None,
            },
        }
    };
    room.leave(peer).await;
    bus.lock_remotes().remove(&(from.clone(), conn));
    if let Some(reason) = reason {
        bus.send(&from, kill(reason)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_round_trip_and_garbage_is_refused() {
        let all = [
            Envelope::Open {
                from: "n1".into(),
                conn: 7,
                doc: "team/notes".into(),
                user: Some("ann".into()),
                can_write: true,
                expires_at: Some(1_800_000_000),
            },
            Envelope::Open {
                from: "n1".into(),
                conn: 8,
                doc: "d".into(),
                user: None,
                can_write: false,
                expires_at: None,
            },
            Envelope::Frame {
                from: "n2".into(),
                conn: u64::MAX,
                data: Bytes::from_static(&[0, 1, 2]),
            },
            Envelope::Alive {
                from: "n2".into(),
                conn: 1,
            },
            Envelope::Close {
                from: "n2".into(),
                conn: 1,
            },
            Envelope::Out {
                conn: 3,
                data: Bytes::from_static(b"xyz"),
            },
            Envelope::Kill {
                conn: 3,
                code: 1012,
                reason: "moved".into(),
            },
        ];
        for env in all {
            assert_eq!(Envelope::decode(env.encode()), Some(env));
        }
        assert_eq!(Envelope::decode(Bytes::from_static(&[1, 2, 3])), None);
        assert_eq!(Envelope::decode(Bytes::from_static(&[9; 20])), None);
        let mut truncated = Envelope::Open {
            from: "n1".into(),
            conn: 1,
            doc: "doc".into(),
            user: Some("u".into()),
            can_write: true,
            expires_at: None,
        }
        .encode();
        truncated.truncate(truncated.len() - 2);
        assert_eq!(Envelope::decode(truncated), None);
    }
}
