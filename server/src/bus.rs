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

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures_util::StreamExt;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::close;
use crate::config::{Limits, Secret};
use crate::limits::PeerRates;
use crate::metrics::Metrics;
use crate::room::queue::{Bounds, Next, QueueRx, QueueTx, SendError};
use crate::room::{CloseReason, DocName, PeerAuth, PeerFilter, PeerId, Registry, RoomCmd};

const OPEN: u8 = 1;
const FRAME: u8 = 2;
const ALIVE: u8 = 3;
const CLOSE: u8 = 4;
const OUT: u8 = 5;
const KILL: u8 = 6;
const BEAT: u8 = 7;
const CHANGED: u8 = 8;

/// Length of the signature in front of every message.
const MAC_LEN: usize = 32;

/// Shortest cluster key accepted, in bytes.
pub const MIN_CLUSTER_KEY: usize = 16;

/// How often a relaying node says its client is still there; the owner drops a remote peer
/// not heard from for three times this.
pub const ALIVE_EVERY: Duration = Duration::from_secs(1);

/// Messages of one relayed direction held while an earlier one is missing; one more is a gap.
pub const REORDER_WINDOW: usize = 16;

/// The subject every node listens on for cluster-wide changes.
const ALL: &str = "quire.all";

/// Oldest announcement of a change a node acts on (clock skew between nodes included).
pub const CHANGE_MAX_AGE: Duration = Duration::from_secs(30);

/// What must reach every node's sockets on a document.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// The document was deleted: close every socket on it (4404) and unload its room.
    Deleted,
    /// A user's role on the document changed: close that user's sockets on it (4403; they
    /// reconnect under the new role). `id` is the change's row in `doc_changes`, so each node
    /// acts on it once whether it learns of it from the bus or from the table.
    Access { user: String, id: i64 },
}

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
        /// The newest role change the client's permission reflects (`PeerAuth::seen_change`).
        seen_change: i64,
    },
    Frame {
        from: String,
        conn: u64,
        seq: u64,
        data: Bytes,
    },
    Alive {
        from: String,
        conn: u64,
        /// The last `Frame` sequence number sent for this connection (0: none yet).
        sent: u64,
    },
    Close {
        from: String,
        conn: u64,
    },
    Out {
        conn: u64,
        seq: u64,
        data: Bytes,
    },
    /// The owner's answer to `Alive`: the last `Out` sequence number it sent.
    Beat {
        conn: u64,
        sent: u64,
    },
    Kill {
        conn: u64,
        code: u16,
        reason: String,
    },
    /// To every node: a change to a document that its sockets must see.
    Changed {
        from: String,
        /// When it was announced (milliseconds since the epoch, the sender's clock): a
        /// replayed announcement older than [`CHANGE_MAX_AGE`] is ignored.
        at_ms: i64,
        doc: String,
        change: Change,
    },
}

/// Which kind of message (for [`Faults`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Open,
    Frame,
    Alive,
    Close,
    Out,
    Beat,
    Kill,
    Changed,
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

fn get_u64(b: &mut Bytes) -> Option<u64> {
    (b.remaining() >= 8).then(|| b.get_u64())
}

impl Envelope {
    pub fn kind(&self) -> Kind {
        match self {
            Envelope::Open { .. } => Kind::Open,
            Envelope::Frame { .. } => Kind::Frame,
            Envelope::Alive { .. } => Kind::Alive,
            Envelope::Close { .. } => Kind::Close,
            Envelope::Out { .. } => Kind::Out,
            Envelope::Beat { .. } => Kind::Beat,
            Envelope::Kill { .. } => Kind::Kill,
            Envelope::Changed { .. } => Kind::Changed,
        }
    }

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
                seen_change,
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
                // Left out when 0, as a node of an earlier version leaves it out.
                if *seen_change != 0 {
                    b.put_i64(*seen_change);
                }
            }
            Envelope::Frame {
                from,
                conn,
                seq,
                data,
            } => {
                b.put_u8(FRAME);
                b.put_u64(*conn);
                b.put_u64(*seq);
                put_str(&mut b, from);
                b.put_slice(data);
            }
            Envelope::Alive { from, conn, sent } => {
                b.put_u8(ALIVE);
                b.put_u64(*conn);
                b.put_u64(*sent);
                put_str(&mut b, from);
            }
            Envelope::Close { from, conn } => {
                b.put_u8(CLOSE);
                b.put_u64(*conn);
                put_str(&mut b, from);
            }
            Envelope::Out { conn, seq, data } => {
                b.put_u8(OUT);
                b.put_u64(*conn);
                b.put_u64(*seq);
                b.put_slice(data);
            }
            Envelope::Beat { conn, sent } => {
                b.put_u8(BEAT);
                b.put_u64(*conn);
                b.put_u64(*sent);
            }
            Envelope::Kill { conn, code, reason } => {
                b.put_u8(KILL);
                b.put_u64(*conn);
                b.put_u16(*code);
                put_str(&mut b, reason);
            }
            Envelope::Changed {
                from,
                at_ms,
                doc,
                change,
            } => {
                b.put_u8(CHANGED);
                // The change's id (0 for a delete, which needs none).
                b.put_u64(match change {
                    Change::Access { id, .. } => *id as u64,
                    Change::Deleted => 0,
                });
                b.put_i64(*at_ms);
                put_str(&mut b, from);
                put_str(&mut b, doc);
                match change {
                    Change::Deleted => b.put_u8(1),
                    Change::Access { user, .. } => {
                        b.put_u8(2);
                        put_str(&mut b, user);
                    }
                }
            }
        }
        b.freeze()
    }

    /// Decodes a bus message (without its signature); `None` if it is malformed.
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
                // (Absent from an earlier version's message: every role change then applies.)
                let seen_change = match b.remaining() {
                    0 => 0,
                    8.. => b.get_i64(),
                    _ => return None,
                };
                Envelope::Open {
                    from,
                    conn,
                    doc,
                    user,
                    can_write,
                    expires_at,
                    seen_change,
                }
            }
            FRAME => {
                let seq = get_u64(&mut b)?;
                let from = get_str(&mut b)?;
                Envelope::Frame {
                    from,
                    conn,
                    seq,
                    data: b,
                }
            }
            ALIVE => {
                let sent = get_u64(&mut b)?;
                Envelope::Alive {
                    from: get_str(&mut b)?,
                    conn,
                    sent,
                }
            }
            CLOSE => Envelope::Close {
                from: get_str(&mut b)?,
                conn,
            },
            OUT => {
                let seq = get_u64(&mut b)?;
                Envelope::Out { conn, seq, data: b }
            }
            BEAT => Envelope::Beat {
                conn,
                sent: get_u64(&mut b)?,
            },
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
            CHANGED => {
                let at_ms = get_u64(&mut b)? as i64;
                let from = get_str(&mut b)?;
                let doc = get_str(&mut b)?;
                let change = match (b.remaining() >= 1).then(|| b.get_u8())? {
                    1 => Change::Deleted,
                    2 => Change::Access {
                        user: get_str(&mut b)?,
                        // The header's u64, which is a connection id in the other kinds.
                        id: conn as i64,
                    },
                    _ => return None,
                };
                Envelope::Changed {
                    from,
                    at_ms,
                    doc,
                    change,
                }
            }
            _ => return None,
        })
    }
}

/// The cluster key: every message on the bus is signed with it, and only messages signed
/// with it are read.
#[derive(Clone)]
pub struct ClusterKey(Hmac<Sha256>);

impl ClusterKey {
    /// A key from the configured secret (at least [`MIN_CLUSTER_KEY`] bytes).
    pub fn new(secret: &str) -> anyhow::Result<ClusterKey> {
        if secret.len() < MIN_CLUSTER_KEY {
            anyhow::bail!(
                "the cluster key must be at least {MIN_CLUSTER_KEY} bytes (use a long random \
                 string, the same on every node)"
            );
        }
        Hmac::<Sha256>::new_from_slice(secret.as_bytes())
            .map(ClusterKey)
            .map_err(|e| anyhow::anyhow!("invalid cluster key: {e}"))
    }

    fn mac(&self, subject: &str, body: &[u8]) -> Hmac<Sha256> {
        let mut mac = self.0.clone();
        mac.update(subject.as_bytes());
        mac.update(&[0]);
        mac.update(body);
        mac
    }

    /// `body` with its signature for `subject` in front.
    pub fn seal(&self, subject: &str, body: &[u8]) -> Bytes {
        let tag = self.mac(subject, body).finalize().into_bytes();
        let mut b = BytesMut::with_capacity(MAC_LEN + body.len());
        b.put_slice(&tag);
        b.put_slice(body);
        b.freeze()
    }

    /// The body of a message received on `subject`, if its signature is good.
    pub fn open(&self, subject: &str, mut msg: Bytes) -> Option<Bytes> {
        if msg.len() < MAC_LEN {
            return None;
        }
        let body = msg.split_off(MAC_LEN);
        self.mac(subject, &body).verify_slice(&msg).ok()?;
        Some(body)
    }
}

impl std::fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterKey([redacted])")
    }
}

/// Hands on one direction of a relayed connection's numbered messages strictly in order.
#[derive(Debug)]
pub struct InOrder {
    next: u64,
    held: BTreeMap<u64, Bytes>,
    /// The number an earlier `check_sent` found missing.
    suspect: Option<u64>,
}

/// A message was lost: the relayed connection must be closed.
#[derive(Debug, PartialEq, Eq)]
pub struct Gap;

/// What one numbered message gave.
#[derive(Debug, PartialEq, Eq)]
pub enum Arrival {
    /// These messages, in order, are next (one, or several once a missing one arrived).
    Ready(Vec<Bytes>),
    /// Ahead of a missing one: held until it arrives.
    Held,
    /// Seen before: ignored.
    Duplicate,
}

impl Default for InOrder {
    fn default() -> Self {
        InOrder {
            next: 1,
            held: BTreeMap::new(),
            suspect: None,
        }
    }
}

impl InOrder {
    pub fn push(&mut self, seq: u64, data: Bytes) -> Result<Arrival, Gap> {
        if seq < self.next || self.held.contains_key(&seq) {
            return Ok(Arrival::Duplicate);
        }
        if seq > self.next {
            if self.held.len() >= REORDER_WINDOW {
                return Err(Gap);
            }
            self.held.insert(seq, data);
            return Ok(Arrival::Held);
        }
        let mut ready = vec![data];
        self.next += 1;
        while let Some(d) = self.held.remove(&self.next) {
            ready.push(d);
            self.next += 1;
        }
        Ok(Arrival::Ready(ready))
    }

    /// The sender says it sent up to `sent`. A number up to it still missing at the next
    /// such report (a second later) is lost: the bus keeps one publisher's order, so it would
    /// have arrived before the report, and the second look lets a delayed or reordered
    /// message through.
    pub fn check_sent(&mut self, sent: u64) -> Result<(), Gap> {
        if sent < self.next {
            self.suspect = None;
            return Ok(());
        }
        if self.suspect == Some(self.next) {
            return Err(Gap);
        }
        self.suspect = Some(self.next);
        Ok(())
    }
}

/// What a [`Faults`] plan does to one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultAction {
    /// Never published.
    Drop,
    /// Published twice.
    Duplicate,
    /// Published after this long (later messages overtake it).
    Delay(Duration),
    /// Published right after the next message (to any node).
    Reorder,
}

/// Fault injection for tests: messages of a kind that this node publishes are dropped,
/// duplicated, delayed or reordered, one at a time, as planned; and this node can be made a
/// slow consumer (a small subscription buffer, a pause before it reads the next message).
#[derive(Debug, Default)]
pub struct Faults {
    /// (action, kind, messages of that kind still to let through first)
    plan: Mutex<Vec<(FaultAction, Kind, usize)>>,
    /// A message held back by `Reorder`.
    held: Mutex<Option<(String, Bytes)>>,
    applied: AtomicUsize,
    /// Messages each subscription buffers (0: the client library's default).
    subscription_capacity: AtomicUsize,
    /// A pause before reading the next message, taken once.
    inbox_pause: Mutex<Option<Duration>>,
}

impl Faults {
    /// Each of this node's subscriptions buffers `n` messages; NATS drops what arrives while
    /// they are full (a slow consumer). Set before the node starts.
    pub fn set_subscription_capacity(&self, n: usize) {
        self.subscription_capacity.store(n, Ordering::Relaxed);
    }

    /// This node stops reading the bus for `pause` when it next takes a message.
    pub fn pause_inbox_once(&self, pause: Duration) {
        *lock(&self.inbox_pause) = Some(pause);
    }

    /// Applies `action` to the message of `kind` after the next `skip` ones.
    pub fn arm(&self, action: FaultAction, kind: Kind, skip: usize) {
        lock(&self.plan).push((action, kind, skip));
    }

    /// Faults applied so far.
    pub fn applied(&self) -> usize {
        self.applied.load(Ordering::Relaxed)
    }

    fn take(&self, kind: Kind) -> Option<FaultAction> {
        let mut plan = lock(&self.plan);
        let mut fire = None;
        // The first plan for this kind that is due fires; the others count this message.
        for (i, (action, k, skip)) in plan.iter_mut().enumerate() {
            if *k != kind {
                continue;
            }
            if *skip == 0 && fire.is_none() {
                fire = Some((i, *action));
            } else {
                *skip = skip.saturating_sub(1);
            }
        }
        let (i, action) = fire?;
        plan.remove(i);
        self.applied.fetch_add(1, Ordering::Relaxed);
        Some(action)
    }
}

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
    /// Tests only: faults to inject into what this node publishes.
    pub faults: Option<Arc<Faults>>,
}

/// A remote peer's inbox on the owner.
enum RemoteIn {
    Frame(Bytes),
    /// The relaying node says the client is there: answer with a `Beat`.
    Alive,
    Close,
    /// Its frames waiting here passed the bound: close it with 1013.
    Overflow,
    /// A frame from the relaying node was lost: close it with 1012 so it resyncs.
    Gap,
}

/// This node's end of the bus.
pub struct Bus {
    client: async_nats::Client,
    pub node: Arc<str>,
    key: ClusterKey,
    faults: Option<Arc<Faults>>,
    /// Added to this process's connection ids to name relayed connections on the bus, so a
    /// restarted node's ids never meet its previous life's on an owner.
    conn_base: u64,
    /// Relayed connections of this node, by bus connection id.
    relays: Mutex<HashMap<u64, Relay>>,
    /// Remote peers this node serves as owner, by (relaying node, connection id).
    remotes: Mutex<HashMap<(String, u64), Remote>>,
    /// Most bytes of a relayed client's frames waiting for its remote peer on the owner;
    /// past it the remote peer is closed with 1013.
    remote_inbox_bytes: usize,
    /// The connection limits, applied to remote peers as to local ones.
    limits: Limits,
    metrics: Arc<Metrics>,
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
    ) -> anyhow::Result<Arc<Bus>> {
        let max_message_size = limits.max_message_size;
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
        let bus = Arc::new(Bus {
            client,
            node,
            key: config.key,
            faults: config.faults,
            conn_base: rand::random::<u64>() & !0xFFFF_FFFF,
            relays: Mutex::new(HashMap::new()),
            remotes: Mutex::new(HashMap::new()),
            remote_inbox_bytes: registry.config.room_queue_bytes,
            limits,
            metrics: registry.metrics.clone(),
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
                if msg.payload.len() > max_message_size + 1024 {
                    bus.metrics.bus_refused.inc();
                    continue;
                }
                let env = bus
                    .key
                    .open(msg.subject.as_str(), msg.payload)
                    .and_then(Envelope::decode);
                match env {
                    Some(env) => bus.dispatch(env, &registry).await,
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
        Ok(bus)
    }

    /// The bus id of this process's connection `peer`.
    pub fn conn_id(&self, peer: PeerId) -> u64 {
        self.conn_base.wrapping_add(peer)
    }

    /// Signs and publishes `env` to `node`. An error means it was not sent: the caller
    /// closes the relayed connection it belongs to.
    pub async fn send(&self, node: &str, env: Envelope) -> Result<(), ()> {
        self.publish(subject(node), &env).await
    }

    /// Tells every node (this one included) about a change its sockets must see.
    pub async fn announce(&self, doc: &DocName, change: Change) {
        let env = Envelope::Changed {
            from: self.node.to_string(),
            at_ms: crate::storage::now_ms(),
            doc: doc.as_str().to_owned(),
            change,
        };
        let _ = self.publish(ALL.to_owned(), &env).await;
    }

    async fn publish(&self, subject: String, env: &Envelope) -> Result<(), ()> {
        let payload = self.key.seal(&subject, &env.encode());
        let Some(faults) = &self.faults else {
            return self.publish_raw(subject, payload).await;
        };
        let held = lock(&faults.held).take();
        let result = match faults.take(env.kind()) {
            None => self.publish_raw(subject, payload).await,
            Some(FaultAction::Drop) => Ok(()),
            Some(FaultAction::Duplicate) => {
                let first = self.publish_raw(subject.clone(), payload.clone()).await;
                first.and(self.publish_raw(subject, payload).await)
            }
            Some(FaultAction::Delay(after)) => {
                let client = self.client.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(after).await;
                    let _ = client.publish(subject, payload).await;
                });
                Ok(())
            }
            Some(FaultAction::Reorder) => {
                *lock(&faults.held) = Some((subject, payload));
                Ok(())
            }
        };
        if let Some((subject, payload)) = held {
            let _ = self.publish_raw(subject, payload).await;
        }
        result
    }

    async fn publish_raw(&self, subject: String, payload: Bytes) -> Result<(), ()> {
        self.client.publish(subject, payload).await.map_err(|e| {
            self.metrics.bus_publish_failures.inc();
            debug!(error = %e, "bus publish failed");
        })
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
        let gone = CloseReason::new(
            close::RESTART,
            "lost the link to the document's node, reconnect",
        );
        for (_, relay) in lock(&self.relays).drain() {
            relay.tx.kill(gone.clone());
        }
        for (_, remote) in lock(&self.remotes).drain() {
            let _ = remote.tx.send(RemoteIn::Close);
        }
    }

    /// Whether this node relays any connection to `doc`.
    pub(crate) fn relays_to(&self, doc: &DocName) -> bool {
        lock(&self.relays).values().any(|relay| &relay.doc == doc)
    }

    /// Closes this node's relayed connections to `doc` that `filter` matches.
    fn kill_relays(&self, doc: &DocName, filter: &PeerFilter, reason: &CloseReason) {
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

    async fn dispatch(self: &Arc<Self>, env: Envelope, registry: &Arc<Registry>) {
        match env {
            Envelope::Out { conn, seq, data } => self.on_out(conn, seq, data),
            Envelope::Beat { conn, sent } => {
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
            Envelope::Kill { conn, code, reason } => {
                if let Some(relay) = lock(&self.relays).remove(&conn) {
                    relay.tx.kill(CloseReason::new(code, reason));
                }
            }
            Envelope::Open {
                from,
                conn,
                doc,
                user,
                can_write,
                expires_at,
                seen_change,
            } => {
                let Ok(name) = DocName::parse(&doc) else {
                    return;
                };
                let (tx, rx) = mpsc::unbounded_channel();
                let queued = Arc::new(AtomicUsize::new(0));
                {
                    let mut remotes = lock(&self.remotes);
                    let key = (from.clone(), conn);
                    if remotes.contains_key(&key) {
                        // A duplicate.
                        self.metrics.bus_duplicates.inc();
                        return;
                    }
                    let remote = Remote {
                        tx,
                        queued: queued.clone(),
                        order: InOrder::default(),
                    };
                    remotes.insert(key, remote);
                }
                let auth = PeerAuth {
                    user: user.map(Into::into),
                    token_id: None,
                    issued_at: 0,
                    can_write,
                    expires_at,
                    seen_change,
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
            Envelope::Frame {
                from,
                conn,
                seq,
                data,
            } => {
                if !self.on_frame(&from, conn, seq, data) {
                    self.refuse_unknown(&from, conn).await;
                }
            }
            Envelope::Alive { from, conn, sent } => {
                let known = {
                    let mut remotes = lock(&self.remotes);
                    let key = (from.clone(), conn);
                    match remotes.get_mut(&key) {
                        Some(r) => {
                            if r.order.check_sent(sent).is_ok() {
                                let _ = r.tx.send(RemoteIn::Alive);
                            } else if let Some(remote) = remotes.remove(&key) {
                                let _ = remote.tx.send(RemoteIn::Gap);
                            }
                            true
                        }
                        None => false,
                    }
                };
                if !known {
                    self.refuse_unknown(&from, conn).await;
                }
            }
            Envelope::Close { from, conn } => {
                if let Some(remote) = lock(&self.remotes).remove(&(from, conn)) {
                    let _ = remote.tx.send(RemoteIn::Close);
                }
            }
            Envelope::Changed {
                from,
                at_ms,
                doc,
                change,
            } => {
                let age = crate::storage::now_ms()
                    .saturating_sub(at_ms)
                    .unsigned_abs();
                if *from == *self.node || age > CHANGE_MAX_AGE.as_millis() as u64 {
                    return;
                }
                let Ok(name) = DocName::parse(&doc) else {
                    return;
                };
                // Not inline: a room slow to take the command must not hold up the bus.
                let (bus, registry) = (self.clone(), registry.clone());
                tokio::spawn(async move {
                    if change == Change::Deleted && !deleted_in_storage(&registry, &name).await {
                        // A replayed or forged-by-a-node announcement: the database, the
                        // source of truth, says the document is not deleted.
                        debug!(doc = %name, "ignoring a delete announcement storage does not confirm");
                        return;
                    }
                    crate::changes::apply_once(Some(&bus), &registry, &name, change).await;
                });
            }
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

    /// A `Frame` from a relaying node: into its remote peer's inbox, in order. False if no
    /// remote peer has that name here.
    fn on_frame(&self, from: &str, conn: u64, seq: u64, data: Bytes) -> bool {
        let mut remotes = lock(&self.remotes);
        let key = (from.to_owned(), conn);
        let Some(remote) = remotes.get_mut(&key) else {
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
            if let Some(remote) = remotes.remove(&key) {
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

/// Whether storage says `name` is deleted (false if it cannot tell in time).
async fn deleted_in_storage(registry: &Registry, name: &DocName) -> bool {
    let limit = registry.config.storage_timeout;
    matches!(
        tokio::time::timeout(limit, registry.store.load(name.as_str())).await,
        Ok(Ok(stored)) if stored.deleted
    )
}

impl Change {
    /// Which sockets on the document it closes, with what, and whether the room unloads.
    pub fn effect(self) -> (PeerFilter, CloseReason, bool) {
        match self {
            Change::Deleted => (
                PeerFilter::All,
                CloseReason::new(close::DELETED, "document deleted"),
                true,
            ),
            // Only the sockets whose permission was read before the change (0: the id of a
            // change from an earlier version, which applies to all of the user's).
            Change::Access { user, id } => (
                if id > 0 {
                    PeerFilter::UserBefore(user, id)
                } else {
                    PeerFilter::User(user)
                },
                CloseReason::new(close::FORBIDDEN, "access changed; reconnect"),
                false,
            ),
        }
    }
}

/// Applies `change` to this node's sockets on `name`: the room's, if this node serves it
/// (its remote peers' relays are closed through it), and this node's relayed connections.
pub async fn apply_change(bus: Option<&Bus>, registry: &Registry, name: &DocName, change: Change) {
    let (filter, reason, unload) = change.effect();
    if let Some(bus) = bus {
        bus.kill_relays(name, &filter, &reason);
    }
    if let Some(room) = registry.get(name) {
        let close = RoomCmd::Close {
            filter,
            reason,
            unload,
        };
        let _ = room.command(close).await;
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
            lock(&bus.remotes).remove(&(from.clone(), conn));
            let _ = bus.send(&from, kill(reason)).await;
            return;
        }
    };
    let mut last_heard = Instant::now();
    let opened = Instant::now();
    let mut rates = PeerRates::new(&bus.limits);
    // The last `Out` sequence number published to the relaying node.
    let mut sent = 0u64;
    let failed = || CloseReason::new(close::RESTART, "lost the link to the client's node");
    let reason = loop {
        tokio::select! {
            next = out_rx.recv() => match next {
                Next::Frame(frame) => {
                    sent += 1;
                    let out = Envelope::Out { conn, seq: sent, data: frame };
                    if bus.send(&from, out).await.is_err() {
                        break Some(failed());
                    }
                }
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
                Some(RemoteIn::Gap) => break Some(lost(&bus.metrics)),
                Some(RemoteIn::Alive) => {
                    last_heard = Instant::now();
                    if bus.send(&from, Envelope::Beat { conn, sent }).await.is_err() {
                        break Some(failed());
                    }
                }
                Some(RemoteIn::Close) | None => break None,
            },
        }
    };
    room.leave(peer).await;
    lock(&bus.remotes).remove(&(from.clone(), conn));
    if let Some(reason) = reason {
        let _ = bus.send(&from, kill(reason)).await;
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
                seen_change: 3,
            },
            Envelope::Open {
                from: "n1".into(),
                conn: 8,
                doc: "d".into(),
                user: None,
                can_write: false,
                expires_at: None,
                seen_change: 3,
            },
            Envelope::Frame {
                from: "n2".into(),
                conn: u64::MAX,
                seq: 3,
                data: Bytes::from_static(&[0, 1, 2]),
            },
            Envelope::Alive {
                from: "n2".into(),
                conn: 1,
                sent: 9,
            },
            Envelope::Close {
                from: "n2".into(),
                conn: 1,
            },
            Envelope::Out {
                conn: 3,
                seq: 1,
                data: Bytes::from_static(b"xyz"),
            },
            Envelope::Beat { conn: 3, sent: 4 },
            Envelope::Kill {
                conn: 3,
                code: 1012,
                reason: "moved".into(),
            },
            Envelope::Changed {
                from: "n1".into(),
                at_ms: 1_800_000_000_000,
                doc: "a/b".into(),
                change: Change::Deleted,
            },
            Envelope::Changed {
                from: "n1".into(),
                at_ms: 1,
                doc: "a/b".into(),
                change: Change::Access {
                    user: "ann".into(),
                    id: 7,
                },
            },
        ];
        for env in all {
            assert_eq!(Envelope::decode(env.encode()), Some(env));
        }
        assert_eq!(Envelope::decode(Bytes::from_static(&[1, 2, 3])), None);
        assert_eq!(Envelope::decode(Bytes::from_static(&[9; 20])), None);
        // Cut into the change id, or (without one) into the user's name.
        for seen_change in [3, 0] {
            let mut truncated = Envelope::Open {
                from: "n1".into(),
                conn: 1,
                doc: "doc".into(),
                user: Some("user".into()),
                can_write: true,
                expires_at: None,
                seen_change,
            }
            .encode();
            truncated.truncate(truncated.len() - 3);
            assert_eq!(Envelope::decode(truncated), None, "{seen_change}");
        }
    }

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

    #[test]
    fn only_messages_signed_with_the_cluster_key_for_their_subject_are_read() {
        let key = ClusterKey::new("a-cluster-key-of-some-length").expect("key");
        let other = ClusterKey::new("another-cluster-key-entirely").expect("key");
        let body = Envelope::Open {
            from: "n1".into(),
            conn: 1,
            doc: "d".into(),
            user: Some("mallory".into()),
            can_write: true,
            expires_at: None,
            seen_change: 3,
        }
        .encode();
        let sealed = key.seal("quire.node.n2", &body);
        assert_eq!(
            key.open("quire.node.n2", sealed.clone()),
            Some(body.clone())
        );
        // Signed with another key, sent to another node, unsigned, or altered: refused.
        assert_eq!(other.open("quire.node.n2", sealed.clone()), None);
        assert_eq!(key.open("quire.node.n3", sealed.clone()), None);
        assert_eq!(key.open("quire.node.n2", body.clone()), None);
        let mut altered = sealed.to_vec();
        let last = altered.len() - 1;
        altered[last] ^= 1;
        assert_eq!(key.open("quire.node.n2", Bytes::from(altered)), None);
        assert_eq!(
            key.open("quire.node.n2", Bytes::from_static(b"short")),
            None
        );
        assert!(ClusterKey::new("short").is_err());
        assert!(!format!("{key:?}").contains("cluster-key"));
    }

    fn b(n: u8) -> Bytes {
        Bytes::from(vec![n])
    }

    #[test]
    fn numbered_messages_come_out_in_order_once_and_a_hole_is_a_gap() {
        let mut order = InOrder::default();
        assert_eq!(order.push(1, b(1)), Ok(Arrival::Ready(vec![b(1)])));
        assert_eq!(order.check_sent(1), Ok(()));
        // Duplicated: ignored.
        assert_eq!(order.push(1, b(1)), Ok(Arrival::Duplicate));
        // Reordered: 3 waits for 2, then both come out in order.
        assert_eq!(order.push(3, b(3)), Ok(Arrival::Held));
        assert_eq!(order.push(3, b(3)), Ok(Arrival::Duplicate));
        // 2 is missing when the sender reports 3 sent: suspect, not yet lost (it may be late).
        assert_eq!(order.check_sent(3), Ok(()));
        assert_eq!(order.push(2, b(2)), Ok(Arrival::Ready(vec![b(2), b(3)])));
        assert_eq!(order.check_sent(3), Ok(()));
        // Lost, with nothing after it: the sender's count shows it at its second report.
        assert_eq!(order.check_sent(4), Ok(()));
        assert_eq!(order.check_sent(4), Err(Gap));
        let mut order = InOrder::default();
        assert_eq!(order.push(1, b(1)), Ok(Arrival::Ready(vec![b(1)])));
        // Lost, with more after it than the window holds.
        for seq in 5..5 + REORDER_WINDOW as u64 {
            assert_eq!(order.push(seq, b(0)), Ok(Arrival::Held));
        }
        assert_eq!(order.push(5 + REORDER_WINDOW as u64, b(0)), Err(Gap));
    }

    #[test]
    fn planned_faults_hit_the_nth_message_of_their_kind_once() {
        let faults = Faults::default();
        faults.arm(FaultAction::Drop, Kind::Frame, 1);
        faults.arm(FaultAction::Duplicate, Kind::Frame, 2);
        assert_eq!(faults.take(Kind::Out), None);
        assert_eq!(faults.take(Kind::Frame), None);
        assert_eq!(faults.take(Kind::Frame), Some(FaultAction::Drop));
        assert_eq!(faults.take(Kind::Frame), Some(FaultAction::Duplicate));
        assert_eq!(faults.take(Kind::Frame), None);
        assert_eq!(faults.applied(), 2);
    }
}
