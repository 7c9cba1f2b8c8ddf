//! The bus between nodes (NATS): a node that does not own a document relays its clients'
//! frames to the owner, and the owner's frames back; and changes that must reach every node
//! (a document deleted, a user's access changed) are announced to all.
//!
//! Every node subscribes to `quire.node.<node-id>` and to `quire.all`. A relaying node sends
//! `Open` (a client wants document D), `Frame` (bytes the client sent), `Alive` (the client is
//! still there) and `Close`; the owner answers with `Out` (bytes for the client), `Beat` (its
//! answer to `Alive`) and `Kill` (close the client with this code). On the owner, each relayed
//! client is a *remote peer*: it joins the room like a WebSocket connection does, so sync
//! replies, broadcasts, awareness and durable acknowledgements (sent only after the owner's
//! commit) reach it the same way.
//!
//! **Batching.** What a node sends to another node leaves through one link task per
//! destination (`link.rs`), which publishes every envelope waiting for that node as one
//! signed message (a batch, at most [`BATCH_BYTES`] and [`BATCH_ENVELOPES`]), in the order
//! they were sent (with [`BusConfig::tick`] set, at most one message per tick); the receiver
//! checks the signature once and hands the envelopes on in order. A frame after a quiet tick
//! leaves at once, so a lone frame costs no latency.
//!
//! **Delivery.** NATS delivers at most once: a message may be lost (a slow subscriber, a
//! dropped link), and [`Faults`] can also duplicate, delay or reorder one in tests. Each
//! direction of a relayed connection therefore numbers its messages (`Frame` and `Out` carry
//! a sequence number from 1); the receiver hands them on strictly in order ([`InOrder`]: a
//! duplicate is ignored, a message ahead of a missing one waits in a small window), and
//! `Alive` and `Beat` carry the last number their sender published, so a lost last message
//! is seen within a second. A gap, a failed publish, a slow-consumer event or a lost link
//! closes the relayed connection with 1012; the client reconnects and resyncs. Because the
//! owner applies a client's frames only in order and without holes, a durable-ack request is
//! echoed only after every frame the client sent before it was received and committed.
//!
//! **Trust.** Every message is signed with the cluster key (HMAC-SHA256 over the subject it
//! is published on and its bytes); unsigned or badly signed messages are dropped and counted,
//! so a process that can publish on NATS cannot open a writable connection to a document or
//! write into one. NATS credentials come from the bus URL (`nats://user:pass@host`, or a
//! token) or a credentials file.

mod batch;
mod envelope;
mod faults;
mod link;
mod order;
pub mod owners;
pub mod replay;

pub use batch::*;
pub use envelope::*;
pub use faults::*;
pub use link::{BATCH_BYTES, LINK_QUEUE};
pub use order::*;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, warn};

use crate::close;
use crate::config::{Limits, Secret};
use crate::metrics::Metrics;
use crate::room::queue::{Bounds, QueueRx, QueueTx, SendError};
use crate::room::{CloseReason, DocName, PeerAuth, PeerFilter, PeerId, Registry};

/// How often a relaying node says its client is still there; the owner drops a remote peer
/// not heard from for three times this.
pub const ALIVE_EVERY: Duration = Duration::from_secs(1);

/// Messages of one relayed direction held while an earlier one is missing; one more is a gap.
pub const REORDER_WINDOW: usize = 16;

/// The subject every node listens on for cluster-wide changes.
const ALL: &str = "quire.all";

/// Oldest announcement of a change a node acts on (clock skew between nodes included).
pub const CHANGE_MAX_AGE: Duration = Duration::from_secs(30);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// How a node joins the bus.
#[derive(Debug, Clone)]
pub struct BusConfig {
    pub url: Secret,
    /// A NATS credentials file (`.creds`: a user JWT and its NKey seed), if the server wants one.
    pub credentials: Option<PathBuf>,
    pub key: ClusterKey,
    /// At most one message per destination node per tick (`link.rs`); zero (the default): as
    /// soon as it can.
    pub tick: Duration,
    /// Tests only: faults to inject into what this node publishes.
    pub faults: Option<Arc<Faults>>,
}

/// What the bus hands on to the rest of the node (see `crate::socket::relay` and `crate::changes`):
/// the bus itself knows nothing of rooms' peers or of what a change does.
pub enum Inbound {
    /// A client of another node wants a document this node owns.
    Open(RemoteOpen),
    /// Another node announced a change the sockets on `name` must see.
    Changed { name: DocName, change: Change },
    /// Another node forwards an HTTP request only this node (the owner) may serve: answer
    /// it with [`Bus::respond`].
    Request(Forwarded),
}

/// A relayed client opened on this node (the owner): who it is and its inbox.
pub struct RemoteOpen {
    pub name: DocName,
    /// The relaying node and its id for the connection.
    pub from: NodeName,
    pub conn: u64,
    pub auth: PeerAuth,
    pub inbox: RemoteInbox,
}

/// A remote peer's inbox on the owner: what the relaying node sent for it, in order.
pub struct RemoteInbox {
    rx: mpsc::UnboundedReceiver<RemoteIn>,
    /// Bytes of frames waiting in it (bounded by `room_queue_bytes`).
    queued: Arc<AtomicUsize>,
}

impl RemoteInbox {
    pub async fn recv(&mut self) -> Option<RemoteIn> {
        self.rx.recv().await
    }

    /// A frame of `bytes` taken from the inbox was handed to the room.
    pub fn consumed(&self, bytes: usize) {
        self.queued.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// A remote peer's inbox on the owner.
pub enum RemoteIn {
    Frame(Bytes),
    /// The relaying node says the client is there: answer with a `Beat`.
    Alive,
    Close,
    /// Its frames waiting here passed the bound: close it with 1013.
    Overflow,
    /// A frame from the relaying node was lost: close it with 1012 so it resyncs.
    Gap,
    /// The client's credential was refreshed: its new permission and expiry.
    Reauth(PeerAuth),
}

/// This node's end of the bus.
pub struct Bus {
    /// Itself, for the tasks it starts (which must not keep it alive).
    me: Weak<Bus>,
    client: async_nats::Client,
    /// What this node publishes to each other node, by node id, and to every node: one
    /// batching task each (`link.rs`).
    links: Mutex<HashMap<String, link::LinkTx>>,
    everyone: Mutex<Option<link::LinkTx>>,
    pub node: Arc<str>,
    key: ClusterKey,
    /// See [`BusConfig::tick`].
    tick: Duration,
    faults: Option<Arc<Faults>>,
    /// Added to this process's connection ids to name relayed connections on the bus, so a
    /// restarted node's ids never meet its previous life's on an owner.
    conn_base: u64,
    /// Relayed connections of this node, by bus connection id.
    relays: Mutex<HashMap<u64, Relay>>,
    /// Remote peers this node serves as owner, by (relaying node, connection id).
    remotes: Mutex<Remotes>,
    /// Most bytes of a relayed client's frames waiting for its remote peer on the owner;
    /// past it the remote peer is closed with 1013.
    remote_inbox_bytes: usize,
    /// The connection limits, applied to remote peers as to local ones.
    limits: Limits,
    metrics: Arc<Metrics>,
    /// Opens and announced changes, to whoever serves them.
    inbound: mpsc::UnboundedSender<Inbound>,
    /// Forwarded requests of this node waiting for their responses, by id.
    pending: Mutex<HashMap<u64, oneshot::Sender<ForwardAnswer>>>,
    next_request: AtomicU64,
}

/// A relayed connection on the relaying node: the owner's frames for it wait in a queue
/// bounded like a local peer's (frames and bytes; overflow closes with 1013).
struct Relay {
    tx: QueueTx,
    order: InOrder,
    doc: DocName,
    user: Option<Arc<str>>,
    /// See [`PeerAuth::seen_change`].
    seen_change: i64,
}

/// The owner's end of a relayed client: its inbox, the bytes of frames waiting in it, and
/// the order of the frames received.
struct Remote {
    tx: mpsc::UnboundedSender<RemoteIn>,
    queued: Arc<AtomicUsize>,
    order: InOrder,
}

/// Remote peers by relaying node, then connection id: found without building a key (no
/// allocation per frame).
#[derive(Default)]
struct Remotes(HashMap<String, HashMap<u64, Remote>>);

impl Remotes {
    fn get_mut(&mut self, from: &str, conn: u64) -> Option<&mut Remote> {
        self.0.get_mut(from)?.get_mut(&conn)
    }

    fn insert(&mut self, from: String, conn: u64, remote: Remote) {
        self.0.entry(from).or_default().insert(conn, remote);
    }

    fn remove(&mut self, from: &str, conn: u64) -> Option<Remote> {
        let of_node = self.0.get_mut(from)?;
        let remote = of_node.remove(&conn);
        if of_node.is_empty() {
            self.0.remove(from);
        }
        remote
    }

    fn drain(&mut self) -> impl Iterator<Item = Remote> {
        std::mem::take(&mut self.0)
            .into_values()
            .flat_map(HashMap::into_values)
    }
}

/// NATS credentials given in the bus URL.
#[derive(Debug, PartialEq, Eq)]
enum Login {
    UserPass(String, String),
    Token(String),
}

/// The bus URL without its credentials, and the credentials (`user:password@` or `token@`,
/// percent-decoded): the NATS client reads them from its options, not from the URL.
fn split_login(url: &str) -> (String, Option<Login>) {
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8_lossy()
            .into_owned()
    };
    let (scheme, rest) = url.split_once("://").unwrap_or(("nats", url));
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return (url.to_owned(), None);
    };
    let login = match rest[..at].split_once(':') {
        Some((user, pass)) => Login::UserPass(decode(user), decode(pass)),
        None => Login::Token(decode(&rest[..at])),
    };
    (format!("{scheme}://{}", &rest[at + 1..]), Some(login))
}

fn subject(node: &str) -> String {
    format!("quire.node.{node}")
}

/// Why a relayed connection closes when the bus lost its way to the document's node (a failed
/// publish, a dropped link): the client reconnects and resyncs.
pub fn lost_link() -> CloseReason {
    CloseReason::new(
        close::RESTART,
        "lost the link to the document's node, reconnect",
    )
}

fn lost(metrics: &Metrics) -> CloseReason {
    metrics.bus_gaps.inc();
    CloseReason::new(
        close::RESTART,
        "a message between nodes was lost; reconnect",
    )
}

impl Bus {
    /// Connects to NATS (retrying in the background until it answers) and starts serving
    /// this node's subject and the cluster-wide one.
    pub async fn start(
        config: BusConfig,
        node: Arc<str>,
        registry: Arc<Registry>,
        limits: Limits,
    ) -> anyhow::Result<(Arc<Bus>, mpsc::UnboundedReceiver<Inbound>)> {
        // One envelope: a frame of at most max_message_size and its head; one message: a
        // batch of at most BATCH_BYTES, or one envelope alone.
        let max_envelope = limits.max_message_size + 1024;
        let max_message = max_envelope.max(BATCH_BYTES + 64);
        let (events_tx, mut events_rx) = mpsc::unbounded_channel();
        let (url, login) = split_login(config.url.expose());
        let mut options = match login {
            Some(Login::UserPass(user, pass)) => {
                async_nats::ConnectOptions::new().user_and_password(user, pass)
            }
            Some(Login::Token(token)) => async_nats::ConnectOptions::new().token(token),
            None => async_nats::ConnectOptions::new(),
        };
        if let Some(path) = &config.credentials {
            options = options.credentials_file(path).await.map_err(|e| {
                anyhow::anyhow!("cannot read the bus credentials {}: {e}", path.display())
            })?;
        }
        if let Some(n) = config
            .faults
            .as_ref()
            .map(|f| f.subscription_capacity.load(Ordering::Relaxed))
        {
            if n > 0 {
                options = options.subscription_capacity(n);
            }
        }
        let client = options
            .retry_on_initial_connect()
            .event_callback(move |event| {
                let events_tx = events_tx.clone();
                async move {
                    let _ = events_tx.send(event);
                }
            })
            .connect(url.as_str())
            .await?;
        let own = subject(&node);
        let mut inbox = futures_util::stream::select(
            client.subscribe(own.clone()).await?,
            client.subscribe(ALL).await?,
        );
        let (inbound, inbound_rx) = mpsc::unbounded_channel();
        let bus = Arc::new_cyclic(|me| Bus {
            me: me.clone(),
            client,
            links: Mutex::new(HashMap::new()),
            everyone: Mutex::new(None),
            node,
            key: config.key,
            tick: config.tick,
            faults: config.faults,
            conn_base: rand::random::<u64>() & !0xFFFF_FFFF,
            relays: Mutex::new(HashMap::new()),
            remotes: Mutex::new(Remotes::default()),
            remote_inbox_bytes: registry.config.room_queue_bytes,
            limits,
            metrics: registry.metrics.clone(),
            inbound,
            pending: Mutex::new(HashMap::new()),
            // Not from 1: a late response meant for this node's previous life (same node id)
            // must not answer a request of this one.
            next_request: AtomicU64::new(rand::random::<u64>() >> 1),
        });
        let weak = Arc::downgrade(&bus);
        tokio::spawn(async move {
            while let Some(msg) = inbox.next().await {
                let Some(bus) = weak.upgrade() else { return };
                let pause = bus
                    .faults
                    .as_ref()
                    .and_then(|f| lock(&f.inbox_pause).take());
                if let Some(pause) = pause {
                    tokio::time::sleep(pause).await;
                }
                if msg.payload.len() > max_message {
                    bus.metrics.bus_refused.inc();
                    continue;
                }
                let envelopes = bus
                    .key
                    .open(msg.subject.as_str(), msg.payload)
                    .and_then(|body| decode_message(body, max_envelope));
                match envelopes {
                    Some((envelopes, refused)) => {
                        bus.metrics.bus_refused.inc_by(refused as u64);
                        for env in envelopes {
                            bus.dispatch(env).await;
                        }
                    }
                    None => {
                        bus.metrics.bus_refused.inc();
                        debug!("ignoring a bus message that is malformed or not signed");
                    }
                }
            }
        });
        let weak = Arc::downgrade(&bus);
        tokio::spawn(async move {
            while let Some(event) = events_rx.recv().await {
                let Some(bus) = weak.upgrade() else { return };
                match event {
                    async_nats::Event::Disconnected => {
                        warn!("lost the bus; closing relayed connections so they resync");
                        bus.drop_all();
                    }
                    async_nats::Event::SlowConsumer(_) => {
                        warn!("NATS dropped messages for this node; closing relayed connections");
                        bus.drop_all();
                    }
                    event => debug!(%event, "bus event"),
                }
            }
        });
        Ok((bus, inbound_rx))
    }

    /// The connection limits, applied to remote peers as to local ones.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Forgets remote peer `conn` of node `from` (it has left its room).
    pub fn forget_remote(&self, from: &str, conn: u64) {
        lock(&self.remotes).remove(from, conn);
    }

    /// A lost message between nodes: counted, and the reason the connection closes with.
    pub fn lost(&self) -> CloseReason {
        lost(&self.metrics)
    }

    /// The bus id of this process's connection `peer`.
    pub fn conn_id(&self, peer: PeerId) -> u64 {
        self.conn_base.wrapping_add(peer)
    }

    /// Queues `env` for `node`: its link signs and publishes it, batched with whatever else
    /// waits for that node, in the order sent. An error means it will not be sent: the
    /// caller closes the relayed connection it belongs to. (A message that fails to publish
    /// later closes the connections its envelopes belong to: [`Bus::undelivered`].)
    pub async fn send(&self, node: &str, env: Envelope) -> Result<(), ()> {
        self.publish(Some(node), env).await
    }

    /// The largest message NATS takes (its server's `max_payload`; 1 MiB by default).
    pub fn max_payload(&self) -> usize {
        self.client.max_payload()
    }

    /// Sends `request` to `node` and waits up to `deadline` for its response. `Err` if it
    /// could not be sent or no response came in time (it may still have been served: the
    /// requests forwarded are ones a retry does no harm with).
    pub async fn request(
        &self,
        node: &str,
        mut request: Forwarded,
        deadline: std::time::Duration,
    ) -> Result<ForwardAnswer, ()> {
        let id = self.next_request.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        lock(&self.pending).insert(id, tx);
        request.from = self.node.clone();
        request.id = id;
        let env = Envelope::Request(request);
        let answer = match self.send(node, env).await {
            Ok(()) => tokio::time::timeout(deadline, rx)
                .await
                .ok()
                .and_then(Result::ok),
            Err(()) => None,
        };
        lock(&self.pending).remove(&id);
        answer.ok_or(())
    }

    /// Answers a forwarded request of node `to` (`answer.id` is the request's).
    pub async fn respond(&self, to: &str, answer: ForwardAnswer) {
        let _ = self.send(to, Envelope::Response(answer)).await;
    }

    /// Tells every node (this one included) about a change its sockets must see.
    pub async fn announce(&self, doc: &DocName, change: Change) {
        let env = Envelope::Changed {
            from: self.node.clone(),
            at_ms: crate::storage::now_ms(),
            doc: doc.as_str().to_owned(),
            change,
        };
        let _ = self.publish(None, env).await;
    }

    /// Registers a relayed connection (bus id `conn`) of a client of `doc`; the owner's
    /// frames for it, in order, and the order to close it arrive on the receiver.
    pub fn register_relay(
        &self,
        conn: u64,
        bounds: Bounds,
        doc: DocName,
        auth: &PeerAuth,
    ) -> QueueRx {
        let (tx, rx) = crate::room::queue::queue(bounds);
        let relay = Relay {
            tx,
            order: InOrder::default(),
            doc,
            user: auth.user.clone(),
            seen_change: auth.seen_change,
        };
        lock(&self.relays).insert(conn, relay);
        rx
    }

    pub fn unregister_relay(&self, conn: u64) {
        lock(&self.relays).remove(&conn);
    }

    /// Closes everything relayed in either direction (the bus dropped messages).
    fn drop_all(&self) {
        self.metrics.bus_resets.inc();
        let gone = lost_link();
        for (_, relay) in lock(&self.relays).drain() {
            relay.tx.kill(gone.clone());
        }
        for remote in lock(&self.remotes).drain() {
            let _ = remote.tx.send(RemoteIn::Close);
        }
    }

    /// Whether this node relays any connection to `doc`.
    pub(crate) fn relays_to(&self, doc: &DocName) -> bool {
        lock(&self.relays).values().any(|relay| &relay.doc == doc)
    }

    /// Closes this node's relayed connections to `doc` that `filter` matches.
    pub(crate) fn kill_relays(&self, doc: &DocName, filter: &PeerFilter, reason: &CloseReason) {
        lock(&self.relays).retain(|_, relay| {
            // (A relay holds no token: revocations reach it through the owner's room.)
            let hit =
                &relay.doc == doc && filter.matches(relay.user.as_deref(), None, relay.seen_change);
            if hit {
                relay.tx.kill(reason.clone());
            }
            !hit
        });
    }

    /// Hands a message from the bus to whoever it is for.
    async fn dispatch(&self, env: Envelope) {
        match env {
            Envelope::Out { conn, seq, data } => self.on_out(conn, seq, data),
            Envelope::Beat { conn, sent } => self.on_beat(conn, sent),
            Envelope::Kill { conn, code, reason } => self.on_kill(conn, code, reason),
            Envelope::Open {
                from,
                conn,
                doc,
                auth,
            } => self.on_open(from, conn, &doc, auth),
            Envelope::Frame {
                from,
                conn,
                seq,
                data,
            } => self.on_frame(&from, conn, seq, data).await,
            Envelope::Alive { from, conn, sent } => self.on_alive(&from, conn, sent).await,
            Envelope::Close { from, conn } => self.on_close(&from, conn),
            Envelope::Reauth { from, conn, auth } => self.on_reauth(&from, conn, auth),
            Envelope::Request(request) => self.on_request(request),
            Envelope::Response(answer) => self.on_response(answer),
            Envelope::Changed {
                from,
                at_ms,
                doc,
                change,
            } => self.on_changed(&from, at_ms, &doc, change),
        }
    }

    /// An `Out` for relayed connection `conn`: its frames in order into its queue.
    fn on_out(&self, conn: u64, seq: u64, data: Bytes) {
        let mut relays = lock(&self.relays);
        let Some(relay) = relays.get_mut(&conn) else {
            return;
        };
        let reason = match relay.order.push(seq, data) {
            Ok(Arrival::Ready(frames)) => {
                frames
                    .into_iter()
                    .find_map(|frame| match relay.tx.try_send(frame) {
                        Err(SendError::Full) => Some(CloseReason::new(
                            close::TRY_AGAIN_LATER,
                            "outbound queue full; reconnect",
                        )),
                        _ => None,
                    })
            }
            Ok(Arrival::Held) => None,
            Ok(Arrival::Duplicate) => {
                self.metrics.bus_duplicates.inc();
                None
            }
            Err(Gap) => Some(lost(&self.metrics)),
        };
        if let Some(reason) = reason {
            if let Some(relay) = relays.remove(&conn) {
                relay.tx.kill(reason);
            }
        }
    }

    /// A `Beat` for relayed connection `conn`: the owner's count of `Out`s sent, checked
    /// against those received.
    fn on_beat(&self, conn: u64, sent: u64) {
        let mut relays = lock(&self.relays);
        let gap = relays
            .get_mut(&conn)
            .is_some_and(|r| r.order.check_sent(sent).is_err());
        if gap {
            if let Some(relay) = relays.remove(&conn) {
                relay.tx.kill(lost(&self.metrics));
            }
        }
    }

    /// A `Kill` for relayed connection `conn`: the owner closed it.
    fn on_kill(&self, conn: u64, code: u16, reason: String) {
        if let Some(relay) = lock(&self.relays).remove(&conn) {
            relay.tx.kill(CloseReason::new(code, reason));
        }
    }

    /// An `Open` from a relaying node: a remote peer for its client, handed on to join
    /// `doc`'s room (a duplicate is ignored).
    fn on_open(&self, from: NodeName, conn: u64, doc: &str, credential: Credential) {
        let Ok(name) = DocName::parse(doc) else {
            return;
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let queued = Arc::new(AtomicUsize::new(0));
        {
            let mut remotes = lock(&self.remotes);
            if remotes.get_mut(&from, conn).is_some() {
                // A duplicate.
                self.metrics.bus_duplicates.inc();
                return;
            }
            let remote = Remote {
                tx,
                queued: queued.clone(),
                order: InOrder::default(),
            };
            remotes.insert(from.to_string(), conn, remote);
        }
        let inbox = RemoteInbox { rx, queued };
        let open = RemoteOpen {
            name,
            from,
            conn,
            auth: credential.into(),
            inbox,
        };
        let _ = self.inbound.send(Inbound::Open(open));
    }

    /// A `Frame` from a relaying node: into its remote peer's inbox, or refused if no remote
    /// peer has that name here.
    async fn on_frame(&self, from: &str, conn: u64, seq: u64, data: Bytes) {
        if !self.take_frame(from, conn, seq, data) {
            self.refuse_unknown(from, conn).await;
        }
    }

    /// An `Alive` from a relaying node: passed to its remote peer (which answers with a
    /// `Beat`) if no `Frame` it counts was lost, or refused if no remote peer has that name.
    async fn on_alive(&self, from: &str, conn: u64, sent: u64) {
        let known = {
            let mut remotes = lock(&self.remotes);
            match remotes.get_mut(from, conn) {
                Some(r) => {
                    if r.order.check_sent(sent).is_ok() {
                        let _ = r.tx.send(RemoteIn::Alive);
                    } else if let Some(remote) = remotes.remove(from, conn) {
                        let _ = remote.tx.send(RemoteIn::Gap);
                    }
                    true
                }
                None => false,
            }
        };
        if !known {
            self.refuse_unknown(from, conn).await;
        }
    }

    /// A `Close` from a relaying node: its client left.
    fn on_close(&self, from: &str, conn: u64) {
        if let Some(remote) = lock(&self.remotes).remove(from, conn) {
            let _ = remote.tx.send(RemoteIn::Close);
        }
    }

    /// A `Reauth` from a relaying node: its client's new credential, for its remote peer.
    fn on_reauth(&self, from: &str, conn: u64, credential: Credential) {
        if let Some(remote) = lock(&self.remotes).get_mut(from, conn) {
            let _ = remote.tx.send(RemoteIn::Reauth(credential.into()));
        }
    }

    /// A `Request` forwarded to this node as the owner: handed on to be served.
    fn on_request(&self, request: Forwarded) {
        let _ = self.inbound.send(Inbound::Request(request));
    }

    /// A `Response` to a request this node forwarded: to whoever waits for it.
    fn on_response(&self, response: ForwardAnswer) {
        // (A duplicate or a late response finds nothing waiting.)
        if let Some(waiting) = lock(&self.pending).remove(&response.id) {
            let _ = waiting.send(response);
        }
    }

    /// A `Changed` announced by another node: handed on unless it is this node's own or too
    /// old.
    fn on_changed(&self, from: &str, at_ms: i64, doc: &str, change: Change) {
        let age = crate::storage::now_ms()
            .saturating_sub(at_ms)
            .unsigned_abs();
        if *from == *self.node || age > CHANGE_MAX_AGE.as_millis() as u64 {
            return;
        }
        let Ok(name) = DocName::parse(doc) else {
            return;
        };
        let _ = self.inbound.send(Inbound::Changed { name, change });
    }

    /// A `Frame`'s bytes into its remote peer's inbox, in order. False if no remote peer has
    /// that name here.
    fn take_frame(&self, from: &str, conn: u64, seq: u64, data: Bytes) -> bool {
        let mut remotes = lock(&self.remotes);
        let Some(remote) = remotes.get_mut(from, conn) else {
            return false;
        };
        let close = match remote.order.push(seq, data) {
            Ok(Arrival::Ready(frames)) => frames.into_iter().find_map(|data| {
                let queued = remote.queued.fetch_add(data.len(), Ordering::Relaxed);
                if queued + data.len() > self.remote_inbox_bytes && queued > 0 {
                    // The room is that far behind this client: close it like a local peer
                    // whose frames the room cannot take (it reconnects and resyncs).
                    Some(RemoteIn::Overflow)
                } else {
                    let _ = remote.tx.send(RemoteIn::Frame(data));
                    None
                }
            }),
            Ok(Arrival::Held) => None,
            Ok(Arrival::Duplicate) => {
                self.metrics.bus_duplicates.inc();
                None
            }
            Err(Gap) => Some(RemoteIn::Gap),
        };
        if let Some(close) = close {
            if let Some(remote) = remotes.remove(from, conn) {
                let _ = remote.tx.send(close);
            }
        }
        true
    }

    /// A message for a relayed connection this owner does not serve (its `Open` was lost, or
    /// it was closed and the `Kill` lost): tell the relaying node to close it.
    async fn refuse_unknown(&self, from: &str, conn: u64) {
        let kill = Envelope::Kill {
            conn,
            code: close::RESTART,
            reason: "the document's node lost this connection; reconnect".into(),
        };
        let _ = self.send(from, kill).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_in_the_bus_url_are_taken_out_of_it() {
        assert_eq!(
            split_login("nats://127.0.0.1:4222"),
            ("nats://127.0.0.1:4222".into(), None)
        );
        assert_eq!(
            split_login("nats://quire:p%40ss@nats:4222"),
            (
                "nats://nats:4222".into(),
                Some(Login::UserPass("quire".into(), "p@ss".into()))
            )
        );
        assert_eq!(
            split_login("tls://s3cr3t@nats.example:4222/x@y"),
            (
                "tls://nats.example:4222/x@y".into(),
                Some(Login::Token("s3cr3t".into()))
            )
        );
    }
}
