//! Typed configuration, layered: built-in defaults, then an optional TOML file, then `QUIRE_*`
//! environment variables, then command-line flags (the last one set wins).
//!
//! One struct, [`Settings`], is both the clap argument group and the TOML schema, with every
//! field optional; [`Settings::resolve`] merges the layers into a [`Config`] with no options left.

mod unquoted;
use unquoted::unquoted;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// A duration written the human way (`30s`, `500ms`, `2m`) in flags, env vars and TOML.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HumanDuration(pub Duration);

impl FromStr for HumanDuration {
    type Err = humantime::DurationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        humantime::parse_duration(s).map(HumanDuration)
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A setting that must not appear in logs: `Debug` prints `[redacted]`. Read it with
/// [`Secret::expose`] where it is used.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Secret(String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[redacted]")
    }
}

impl From<&str> for Secret {
    fn from(s: &str) -> Secret {
        Secret(s.to_owned())
    }
}

impl From<String> for Secret {
    fn from(s: String) -> Secret {
        Secret(s)
    }
}

impl FromStr for Secret {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Secret(s.to_owned()))
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Secret)
    }
}

/// A writer's group-commit window (SQLite's writer; PostgreSQL's writers share one): when
/// writes of other documents are expected soon (judged from the recent rate of writes and how
/// many documents made them), the writer holds a commit open until `siblings` of them are
/// expected (those already waiting count), at most `delay`, so they share the transaction and
/// its fsync (on PostgreSQL also its statement). It does not wait when not even one is
/// expected within `delay`; a busy document never waits for itself (its next write cannot come
/// before this commit answers; the others' rate leaves out the busiest document's), nor does a
/// quiet store. The busier the store, the shorter the wait: at 800 writes/s over
/// 200 documents the default holds a commit 10 ms, at 4,000 writes/s 2 ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommitWindowSettings {
    pub delay: Duration,
    pub siblings: u32,
}

impl Default for CommitWindowSettings {
    fn default() -> Self {
        CommitWindowSettings {
            delay: Duration::from_millis(10),
            siblings: 8,
        }
    }
}

/// The heavy-work gate (`gate.rs`): how much whole-document work (history rebuilds, diffs,
/// forks, exports) runs at once, how long callers may wait for it, and how much of its
/// results is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GateConfig {
    /// Heavy computations running at once on the node.
    pub per_node: usize,
    /// Heavy requests running at once per document.
    pub per_doc: usize,
    /// Requests waiting (for a document's share or a node slot) at once.
    pub queue: usize,
    /// Longest a request waits for a node slot.
    pub wait: Duration,
    /// Bytes of computed answers kept.
    pub cache_bytes: usize,
    /// Whole-document requests in flight at once per caller (computing, waiting or sending).
    pub per_caller: usize,
}

/// SQLite's `synchronous` pragma. `full` (the default) fsyncs the WAL on every commit, so an
/// acknowledged update survives power loss; `normal` survives a process crash only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum SqliteSync {
    Off,
    Normal,
    Full,
    Extra,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

/// Every setting, optional, as read from one layer.
#[derive(Debug, Default, Clone, clap::Args, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// Address to listen on [default: 127.0.0.1:1234]
    #[arg(long, env = "QUIRE_BIND")]
    pub bind: Option<SocketAddr>,
    /// Database URL [default: sqlite://quire.db]
    #[arg(long = "database", env = "QUIRE_DATABASE_URL")]
    pub database_url: Option<Secret>,
    /// SQLite `synchronous` pragma [default: full]
    #[arg(long, env = "QUIRE_SQLITE_SYNCHRONOUS", value_enum)]
    pub sqlite_synchronous: Option<SqliteSync>,
    /// Longest the SQLite writer holds a commit open for other documents' writes to share
    /// its fsync; 0 commits at once [default: 10ms]
    #[arg(long, env = "QUIRE_SQLITE_COMMIT_DELAY")]
    pub sqlite_commit_delay: Option<HumanDuration>,
    /// Writes of other documents the SQLite writer waits for before committing, at most
    /// the commit delay [default: 8]
    #[arg(long, env = "QUIRE_SQLITE_COMMIT_SIBLINGS")]
    pub sqlite_commit_siblings: Option<u32>,
    /// Longest a PostgreSQL writer holds a commit open for other documents' writes to share
    /// its statement and commit; 0 commits at once [default: 10ms]
    #[arg(long, env = "QUIRE_POSTGRES_COMMIT_DELAY")]
    pub postgres_commit_delay: Option<HumanDuration>,
    /// Writes of other documents the PostgreSQL writers wait for before committing, at most
    /// the commit delay [default: 8]
    #[arg(long, env = "QUIRE_POSTGRES_COMMIT_SIBLINGS")]
    pub postgres_commit_siblings: Option<u32>,
    /// Log format [default: text]
    #[arg(long, env = "QUIRE_LOG_FORMAT", value_enum)]
    pub log_format: Option<LogFormat>,
    /// Log filter, tracing-subscriber syntax [default: info]
    #[arg(long, env = "QUIRE_LOG")]
    pub log: Option<String>,
    /// Largest WebSocket message accepted, in bytes [default: 16777216]
    #[arg(long, env = "QUIRE_MAX_MESSAGE_SIZE")]
    pub max_message_size: Option<usize>,
    /// Largest document (snapshot plus log since), in bytes [default: 268435456]
    #[arg(long, env = "QUIRE_MAX_DOC_SIZE")]
    pub max_doc_size: Option<u64>,
    /// Most connections to one document [default: 1000]
    #[arg(long, env = "QUIRE_MAX_CONNECTIONS_PER_DOC")]
    pub max_connections_per_doc: Option<usize>,
    /// Outbound queue length per connection, in messages; overflow closes with 1013 [default: 1024]
    #[arg(long, env = "QUIRE_PEER_QUEUE")]
    pub peer_queue: Option<usize>,
    /// Outbound bytes queued per connection beyond the frame being written; overflow closes
    /// with 1013 [default: 16777216]
    #[arg(long, env = "QUIRE_PEER_QUEUE_BYTES")]
    pub peer_queue_bytes: Option<usize>,
    /// Inbound bytes queued per room: frames sent to the room and updates not yet applied; a
    /// connection waits (stops reading its socket) while the room is over it [default: 67108864]
    #[arg(long, env = "QUIRE_ROOM_QUEUE_BYTES")]
    pub room_queue_bytes: Option<usize>,
    /// Bytes of updates one connection may have held back because what they depend on has
    /// not arrived (from anyone); one more closes the connection with 1013 and it resyncs
    /// [default: 8388608]
    #[arg(long, env = "QUIRE_HELD_UPDATE_BYTES")]
    pub held_update_bytes: Option<u64>,
    /// How long an update may be held back waiting for what it depends on; past it the
    /// connection is closed with 1013 and it resyncs [default: 30s]
    #[arg(long, env = "QUIRE_HELD_UPDATE_TIMEOUT")]
    pub held_update_timeout: Option<HumanDuration>,
    /// Sync Step 1 and QueryAwareness messages a connection may send per minute (a burst of
    /// that many, refilled evenly); over it the connection is closed with 1008 [default: 120]
    #[arg(long, env = "QUIRE_SYNC_REQUESTS_PER_MINUTE")]
    pub sync_requests_per_minute: Option<u32>,
    /// Awareness updates a connection may send per second (bursts of twice that); over it the
    /// connection is closed with 1008 [default: 50]
    #[arg(long, env = "QUIRE_AWARENESS_PER_SECOND")]
    pub awareness_per_second: Option<u32>,
    /// New WebSocket connections one client address may open per minute (a burst of that
    /// many); over it the upgrade gets 429 [default: 600]
    #[arg(long, env = "QUIRE_CONNECTIONS_PER_MINUTE_PER_ADDR")]
    pub connections_per_minute_per_addr: Option<u32>,
    /// Failed authentications (bad, expired or revoked tokens) one client address may make per
    /// minute; over it every request from the address gets 429 until the minute passes
    /// [default: 30]
    #[arg(long, env = "QUIRE_AUTH_FAILURES_PER_MINUTE_PER_ADDR")]
    pub auth_failures_per_minute_per_addr: Option<u32>,
    /// Apply the per-address limits to loopback clients too (they are exempt by default, so
    /// local tools and a reverse proxy on the same host are never limited) [default: false]
    #[arg(long, env = "QUIRE_RATE_LIMIT_LOOPBACK")]
    pub rate_limit_loopback: Option<bool>,
    /// Time a client has to send its request headers (a WebSocket upgrade included) after
    /// connecting; slower ones are disconnected [default: 10s]
    #[arg(long, env = "QUIRE_HEADER_TIMEOUT")]
    pub header_timeout: Option<HumanDuration>,
    /// Most documents one socket of the Hocuspocus endpoint may have open or waiting for
    /// authentication; one more open is refused (PermissionDenied), one more waiting closes
    /// the socket with 1008 [default: 100]
    #[arg(long, env = "QUIRE_HOCUSPOCUS_MAX_DOCUMENTS")]
    pub hocuspocus_max_documents: Option<usize>,
    /// Frames a Hocuspocus socket may send for documents not yet authenticated (held until
    /// their Auth is answered); more close the socket with 1008 [default: 1000]
    #[arg(long, env = "QUIRE_HOCUSPOCUS_PENDING_FRAMES")]
    pub hocuspocus_pending_frames: Option<usize>,
    /// The same in bytes [default: 4194304]
    #[arg(long, env = "QUIRE_HOCUSPOCUS_PENDING_BYTES")]
    pub hocuspocus_pending_bytes: Option<usize>,
    /// How long a document's frames may wait for its Auth message on a Hocuspocus socket
    /// before the socket is closed with 1008 [default: 10s]
    #[arg(long, env = "QUIRE_HOCUSPOCUS_AUTH_TIMEOUT")]
    pub hocuspocus_auth_timeout: Option<HumanDuration>,
    /// Largest stateless message (Hocuspocus), in bytes; larger ones close the socket with
    /// 1009 [default: 65536]
    #[arg(long, env = "QUIRE_MAX_STATELESS_BYTES")]
    pub max_stateless_bytes: Option<usize>,
    /// Stateless messages one Hocuspocus socket may send per second (bursts of twice that),
    /// each a webhook event; over it the socket is closed with 1008 [default: 20]
    #[arg(long, env = "QUIRE_STATELESS_PER_SECOND")]
    pub stateless_per_second: Option<u32>,
    /// NATS URL of the bus between nodes sharing a PostgreSQL database (nats://HOST:PORT, with
    /// NATS credentials as nats://USER:PASSWORD@HOST:PORT or nats://TOKEN@HOST:PORT; tls://
    /// for TLS); none: clients of a document another node owns are refused with 1013
    #[arg(long = "bus", env = "QUIRE_BUS_URL")]
    pub bus_url: Option<Secret>,
    /// A NATS credentials file (.creds: user JWT and NKey seed) for the bus [default: none]
    #[arg(long, env = "QUIRE_BUS_CREDENTIALS")]
    pub bus_credentials: Option<PathBuf>,
    /// Shared secret every node signs its bus messages with and checks others' against (at
    /// least 16 bytes, the same on every node); required with --bus
    #[arg(long, env = "QUIRE_CLUSTER_KEY")]
    pub cluster_key: Option<Secret>,
    /// A node publishes at most one bus message per other node per tick (at most 100ms),
    /// carrying every frame that waited for that node: a frame after a quiet tick leaves at
    /// once, frames that come sooner wait for the tick's end (a full message leaves at once).
    /// Fewer NATS messages and less NATS CPU under load, a higher delivery p99 for relayed
    /// clients; 0 publishes whatever waits as soon as it can [default: 0]
    #[arg(long, env = "QUIRE_BUS_TICK")]
    pub bus_tick: Option<HumanDuration>,
    /// Deadline of each storage operation of a room (load, append, snapshot, lease); past it
    /// the room stops taking updates (1013, retry) until storage answers again [default: 10s]
    #[arg(long, env = "QUIRE_STORAGE_TIMEOUT")]
    pub storage_timeout: Option<HumanDuration>,
    /// This node's name in room leases (PostgreSQL) [default: node-<random>]
    #[arg(long, env = "QUIRE_NODE_ID")]
    pub node_id: Option<String>,
    /// How long a node's lease on a document's room lasts without renewal (PostgreSQL) [default: 5s]
    #[arg(long, env = "QUIRE_LEASE_TTL")]
    pub lease_ttl: Option<HumanDuration>,
    /// Directory of web pages served at / to browsers (requests without a WebSocket upgrade)
    /// instead of the editor compiled into the binary (web/build.sh writes web/dist, which the
    /// next build compiles in) [default: the compiled-in editor]
    #[arg(long, env = "QUIRE_WEB_ROOT")]
    pub web_root: Option<PathBuf>,
    /// Bytes a WebSocket connection reads per system call; small keeps idle connections cheap [default: 128]
    #[arg(long, env = "QUIRE_WS_READ_BUFFER")]
    pub ws_read_buffer: Option<usize>,
    /// Inbound queue length per room, in messages [default: 1024]
    #[arg(long, env = "QUIRE_ROOM_QUEUE")]
    pub room_queue: Option<usize>,
    /// Most updates committed in one transaction [default: 1024]
    #[arg(long, env = "QUIRE_COMMIT_BATCH")]
    pub commit_batch: Option<usize>,
    /// WebSocket ping interval [default: 30s]
    #[arg(long, env = "QUIRE_PING_INTERVAL")]
    pub ping_interval: Option<HumanDuration>,
    /// Close a connection silent for this long [default: 90s]
    #[arg(long, env = "QUIRE_IDLE_TIMEOUT")]
    pub idle_timeout: Option<HumanDuration>,
    /// How long the close frame of a client closed for not reading (1013) may take to leave
    /// before its socket is dropped [default: 30s]
    #[arg(long, env = "QUIRE_SLOW_CLOSE_TIMEOUT")]
    pub slow_close_timeout: Option<HumanDuration>,
    /// Drop awareness states not refreshed for this long [default: 30s]
    #[arg(long, env = "QUIRE_AWARENESS_TIMEOUT")]
    pub awareness_timeout: Option<HumanDuration>,
    /// How long a closed connection's presence client ids stay bound to its user: within
    /// it only the same user may take one (a reconnect), so nobody else's state shows under
    /// it; at least the awareness timeout [default: the awareness timeout]
    #[arg(long, env = "QUIRE_PRESENCE_GRACE")]
    pub presence_grace: Option<HumanDuration>,
    /// Relay presence changes once per this long, every change of the tick in one frame per
    /// connection; 0 relays each change at once [default: 50ms]
    #[arg(long, env = "QUIRE_AWARENESS_TICK")]
    pub awareness_tick: Option<HumanDuration>,
    /// Unload a room this long after its last connection closes [default: 30s]
    #[arg(long, env = "QUIRE_ROOM_UNLOAD_DELAY")]
    pub room_unload_delay: Option<HumanDuration>,
    /// After a failed load, refuse the document for this long before retrying [default: 2s]
    #[arg(long, env = "QUIRE_LOAD_RETRY_DELAY")]
    pub load_retry_delay: Option<HumanDuration>,
    /// Snapshot after this many logged updates [default: 1000]
    #[arg(long, env = "QUIRE_SNAPSHOT_UPDATES")]
    pub snapshot_updates: Option<u64>,
    /// Snapshot after this many logged bytes [default: 4194304]
    #[arg(long, env = "QUIRE_SNAPSHOT_BYTES")]
    pub snapshot_bytes: Option<u64>,
    /// A snapshot due by update count also waits until the log since the last snapshot holds
    /// this percentage of the snapshot's size, so a large document is not re-encoded every
    /// `snapshot_updates` small updates [default: 50]
    #[arg(long, env = "QUIRE_SNAPSHOT_LOG_PERCENT")]
    pub snapshot_log_percent: Option<u64>,
    /// How long log rows are kept after a snapshot covers them, for the version history
    /// (docs/history.md); `0` keeps no history (snapshots delete the rows they cover)
    /// [default: 30days]
    #[arg(long, env = "QUIRE_HISTORY_RETENTION")]
    pub history_retention: Option<HumanDuration>,
    /// An editing session ends after this long without an edit: an automatic version is
    /// taken then [default: 5m]
    #[arg(long, env = "QUIRE_VERSION_IDLE")]
    pub version_idle: Option<HumanDuration>,
    /// During a long editing session, an automatic version at least this often [default: 1h]
    #[arg(long, env = "QUIRE_VERSION_EVERY")]
    pub version_every: Option<HumanDuration>,
    /// How often the history prune job runs [default: 1h]
    #[arg(long, env = "QUIRE_HISTORY_PRUNE_INTERVAL")]
    pub history_prune_interval: Option<HumanDuration>,
    /// Time allowed for a graceful shutdown [default: 10s]
    #[arg(long, env = "QUIRE_SHUTDOWN_GRACE")]
    pub shutdown_grace: Option<HumanDuration>,
    /// Token signing keys as `kid:secret` (secret of 16+ bytes); the first signs, all verify.
    /// Repeat the flag or separate with commas. None: open development mode [default: none]
    #[arg(long = "auth-key", env = "QUIRE_AUTH_KEYS", value_delimiter = ',')]
    pub auth_keys: Option<Vec<Secret>>,
    /// Admin key: a bearer credential with every permission, for issuing tokens [default: none]
    #[arg(long, env = "QUIRE_ADMIN_KEY")]
    pub admin_key: Option<Secret>,
    /// How often the admin dashboard's figures are sampled and sent to open dashboards
    /// [default: 1s]
    #[arg(long, env = "QUIRE_ADMIN_SAMPLE_EVERY")]
    pub admin_sample_every: Option<HumanDuration>,
    /// How much of the sampled figures the server keeps for the dashboard's plots [default: 1h]
    #[arg(long, env = "QUIRE_ADMIN_HISTORY")]
    pub admin_history: Option<HumanDuration>,
    /// How long an Idempotency-Key is remembered [default: 24h]
    #[arg(long, env = "QUIRE_IDEMPOTENCY_TTL")]
    pub idempotency_ttl: Option<HumanDuration>,
    /// With several nodes: how long a request forwarded to the document's owner (a content
    /// write made on another node) may wait for its answer before 503 [default: 10s]
    #[arg(long, env = "QUIRE_FORWARD_TIMEOUT")]
    pub forward_timeout: Option<HumanDuration>,
    /// Whole-document computations (history rebuilds, diffs, forks, exports) running at
    /// once on this node, on the blocking pool [default: the number of cores]
    #[arg(long, env = "QUIRE_HEAVY_PER_NODE")]
    pub heavy_per_node: Option<usize>,
    /// Whole-document requests running at once per document; more wait in the queue, and
    /// get 429 if no share comes free within the wait [default: 2]
    #[arg(long, env = "QUIRE_HEAVY_PER_DOC")]
    pub heavy_per_doc: Option<usize>,
    /// Whole-document requests waiting (for their document's share or a node slot) at once on
    /// this node; more get 503 [default: 32]
    #[arg(long, env = "QUIRE_HEAVY_QUEUE")]
    pub heavy_queue: Option<usize>,
    /// Longest a whole-document request waits for a free slot before 503 [default: 5s]
    #[arg(long, env = "QUIRE_HEAVY_WAIT")]
    pub heavy_wait: Option<HumanDuration>,
    /// Whole-document requests one caller (a user; an address when no credentials are
    /// configured) may have in flight at once on this node, from admission until its answer
    /// is sent; more get 429 `too-many-heavy-requests` [default: 4]
    #[arg(long, env = "QUIRE_HEAVY_PER_CALLER")]
    pub heavy_per_caller: Option<usize>,
    /// Longest a connection's write may make no progress (an HTTP answer the client does not
    /// read, a WebSocket whose client stopped reading); then the connection is closed
    /// [default: 30s]
    #[arg(long, env = "QUIRE_WRITE_TIMEOUT")]
    pub write_timeout: Option<HumanDuration>,
    /// Longest a merge, a reject or a restore waits for the document's merge lock (another
    /// one under way); then 503 `document-busy-merging` [default: 10s]
    #[arg(long, env = "QUIRE_MERGE_LOCK_WAIT")]
    pub merge_lock_wait: Option<HumanDuration>,
    /// Bytes of document content one JSON edit request may scan (a replace searching a text,
    /// an XML walk) on the document's room; past it 422 `edit-too-costly`, nothing applied
    /// [default: 33554432]
    #[arg(long, env = "QUIRE_EDIT_WORK_BYTES")]
    pub edit_work_bytes: Option<usize>,
    /// Bytes of computed history answers (content at a position or version, encoded
    /// states) kept so repeated reads cost one computation [default: 67108864]
    #[arg(long, env = "QUIRE_HISTORY_CACHE_BYTES")]
    pub history_cache_bytes: Option<usize>,
    /// Bytes of named and restore versions one document may hold (each a full copy of the
    /// content); past it creating one gets 507 [default: 1073741824]
    #[arg(long, env = "QUIRE_MAX_VERSION_BYTES")]
    pub max_version_bytes: Option<u64>,
    /// Webhook URLs that receive events; repeat or separate with commas [default: none]
    #[arg(
        long = "webhook-url",
        env = "QUIRE_WEBHOOK_URLS",
        value_delimiter = ','
    )]
    pub webhook_urls: Option<Vec<String>>,
    /// Secret for the webhook signature header [default: none, unsigned]
    #[arg(long, env = "QUIRE_WEBHOOK_SECRET")]
    pub webhook_secret: Option<Secret>,
    /// Delivery attempts before an event moves to the dead-letter table [default: 8]
    #[arg(long, env = "QUIRE_WEBHOOK_MAX_ATTEMPTS")]
    pub webhook_max_attempts: Option<u32>,
    /// At most one document.updated event per document per this interval [default: 10s]
    #[arg(long, env = "QUIRE_WEBHOOK_DEBOUNCE")]
    pub webhook_debounce: Option<HumanDuration>,
    /// First retry delay; doubles per attempt, with jitter [default: 1s]
    #[arg(long, env = "QUIRE_WEBHOOK_BACKOFF")]
    pub webhook_backoff: Option<HumanDuration>,
    /// Time allowed for one webhook POST [default: 10s]
    #[arg(long, env = "QUIRE_WEBHOOK_TIMEOUT")]
    pub webhook_timeout: Option<HumanDuration>,
}

/// A node's identity and lease time in room leases.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    pub node_id: std::sync::Arc<str>,
    pub ttl: Duration,
}

/// The resolved configuration handed to `crate::run`.
#[derive(Debug, Clone)]
pub struct Config {
    pub bind: SocketAddr,
    /// May hold a password: `Debug` redacts it; logs use `storage::redact_url`.
    pub database_url: Secret,
    pub sqlite_synchronous: SqliteSync,
    pub sqlite_commit: CommitWindowSettings,
    pub postgres_commit: CommitWindowSettings,
    pub log_format: LogFormat,
    pub log: String,
    pub limits: Limits,
    pub idle_timeout: Duration,
    /// How long a 1013 close (a client that stopped reading) may take before the socket is
    /// dropped: the client may be slow rather than gone, and should learn why it was closed
    /// once it reads again; the bound frees the connection of one that never does.
    pub slow_close_timeout: Duration,
    pub shutdown_grace: Duration,
    pub room: RoomConfig,
    pub auth_keys: Vec<Secret>,
    pub admin_key: Option<Secret>,
    pub idempotency_ttl: Duration,
    /// The admin dashboard: how often its figures are sampled, and how long they are kept.
    pub admin_sample_every: Duration,
    pub admin_history: Duration,
    pub forward_timeout: Duration,
    /// The heavy-work gate.
    pub gate: GateConfig,
    /// Longest a connection's write may make no progress before it is closed.
    pub write_timeout: Duration,
    /// Longest a merge, reject or restore waits for the document's merge lock.
    pub merge_lock_wait: Duration,
    /// Bytes of named and restore versions one document may hold.
    pub max_version_bytes: u64,
    pub webhooks: WebhookConfig,
    /// The bus between nodes (NATS), if any.
    pub bus_url: Option<Secret>,
    pub bus_credentials: Option<PathBuf>,
    /// Signs bus messages (required with `bus_url`).
    pub cluster_key: Option<Secret>,
    /// At most one bus message per destination node per tick.
    pub bus_tick: Duration,
    /// This node's name in room leases.
    pub node_id: String,
    pub lease_ttl: Duration,
    /// A directory of web pages served instead of those compiled in (may not exist: then /
    /// explains how to build them). `None`: the pages compiled into the binary.
    pub web_root: Option<PathBuf>,
}

/// Where and how events are delivered.
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    pub urls: Vec<String>,
    pub secret: Option<Secret>,
    pub max_attempts: u32,
    pub debounce: Duration,
    pub backoff: Duration,
    /// Time allowed for one POST; an event's claim lasts long enough for one attempt at
    /// every URL.
    pub timeout: Duration,
}

/// Size and rate bounds on what clients may send and what is held for them.
#[derive(Debug, Clone)]
pub struct Limits {
    pub max_message_size: usize,
    pub ws_read_buffer: usize,
    pub sync_requests_per_minute: u32,
    pub awareness_per_second: u32,
    pub connections_per_minute_per_addr: u32,
    pub auth_failures_per_minute_per_addr: u32,
    pub rate_limit_loopback: bool,
    pub header_timeout: Duration,
    pub hocuspocus_max_documents: usize,
    pub hocuspocus_pending_frames: usize,
    pub hocuspocus_pending_bytes: usize,
    pub hocuspocus_auth_timeout: Duration,
    pub max_stateless_bytes: usize,
    pub stateless_per_second: u32,
}

/// What a room task needs to know.
#[derive(Debug, Clone)]
pub struct RoomConfig {
    pub max_doc_size: u64,
    /// Bytes of content one JSON edit may scan on the room (`edit_work_bytes`).
    pub edit_work_bytes: usize,
    pub max_connections: usize,
    pub commit_batch: usize,
    pub awareness_timeout: Duration,
    /// How long a closed connection's presence ids stay its user's (at least
    /// `awareness_timeout`).
    pub presence_grace: Duration,
    /// How long presence changes are held to go out together (0: at once).
    pub awareness_tick: Duration,
    pub unload_delay: Duration,
    pub load_retry_delay: Duration,
    /// Deadline of each storage call a room makes (load, append, snapshot, lease).
    pub storage_timeout: Duration,
    pub snapshot_updates: u64,
    pub snapshot_bytes: u64,
    pub snapshot_log_percent: u64,
    /// Room leases (PostgreSQL: several nodes may share the database): this node's name and
    /// the lease time. `None`: no leases (SQLite, one process).
    pub lease: Option<LeaseConfig>,
    /// Outbound queue length of a peer: frames the room has queued for one client (either
    /// protocol, local or relayed) that its socket has not written yet.
    pub peer_queue: usize,
    /// The same in bytes.
    pub peer_queue_bytes: usize,
    /// Frames that may wait in a room's inbound queue.
    pub room_queue: usize,
    /// Inbound bytes a room holds: frames sent to it and updates not yet applied.
    pub room_queue_bytes: usize,
    /// Bytes of updates one connection may have held back for missing dependencies.
    pub held_update_bytes: u64,
    /// How long one may be held.
    pub held_update_timeout: Duration,
    /// How often connections ping their clients: the room drives it for its peers, so idle
    /// connections need no timer of their own; a Hocuspocus socket pings on its own.
    pub ping_interval: Duration,
    /// The version history: retention and automatic versions.
    pub history: HistoryConfig,
}

/// How much history is kept, and when automatic versions are taken (docs/history.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryConfig {
    /// Log rows are kept this long after a snapshot covers them; zero keeps no history.
    pub retention: Duration,
    /// An automatic version after this long without an edit.
    pub version_idle: Duration,
    /// And at least this often during a long session.
    pub version_every: Duration,
    /// How often the prune job runs.
    pub prune_interval: Duration,
}

impl HistoryConfig {
    /// Whether history is kept at all.
    pub fn enabled(&self) -> bool {
        !self.retention.is_zero()
    }
}

impl Default for Config {
    fn default() -> Self {
        Settings::default().resolve()
    }
}

impl Settings {
    /// Reads a TOML file of settings.
    pub fn from_file(path: &PathBuf) -> anyhow::Result<Settings> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read config file {}: {e}", path.display()))?;
        // The error's message and place only: its usual display quotes the offending line,
        // which may hold a secret.
        toml::from_str(&text).map_err(|e| {
            let line = e
                .span()
                .map(|span| text[..span.start.min(text.len())].lines().count().max(1));
            let message = unquoted(e.message());
            match line {
                Some(line) => anyhow::anyhow!(
                    "invalid config file {}, line {line}: {message}",
                    path.display(),
                ),
                None => anyhow::anyhow!("invalid config file {}: {message}", path.display()),
            }
        })
    }

    /// Fills every field this layer leaves unset from `lower`.
    pub fn or(self, lower: Settings) -> Settings {
        macro_rules! pick {
            ($($f:ident),*) => { Settings { $($f: self.$f.or(lower.$f)),* } };
        }
        pick!(
            bind,
            database_url,
            sqlite_synchronous,
            sqlite_commit_delay,
            sqlite_commit_siblings,
            postgres_commit_delay,
            postgres_commit_siblings,
            log_format,
            log,
            max_message_size,
            max_doc_size,
            max_connections_per_doc,
            peer_queue,
            peer_queue_bytes,
            room_queue_bytes,
            held_update_bytes,
            held_update_timeout,
            sync_requests_per_minute,
            awareness_per_second,
            connections_per_minute_per_addr,
            auth_failures_per_minute_per_addr,
            rate_limit_loopback,
            header_timeout,
            hocuspocus_max_documents,
            hocuspocus_pending_frames,
            hocuspocus_pending_bytes,
            hocuspocus_auth_timeout,
            max_stateless_bytes,
            stateless_per_second,
            bus_url,
            bus_credentials,
            cluster_key,
            bus_tick,
            storage_timeout,
            node_id,
            lease_ttl,
            web_root,
            ws_read_buffer,
            room_queue,
            commit_batch,
            ping_interval,
            idle_timeout,
            slow_close_timeout,
            awareness_timeout,
            presence_grace,
            awareness_tick,
            room_unload_delay,
            load_retry_delay,
            snapshot_updates,
            snapshot_bytes,
            snapshot_log_percent,
            history_retention,
            version_idle,
            version_every,
            history_prune_interval,
            shutdown_grace,
            auth_keys,
            admin_key,
            idempotency_ttl,
            admin_sample_every,
            admin_history,
            forward_timeout,
            heavy_per_node,
            heavy_per_doc,
            heavy_queue,
            heavy_wait,
            history_cache_bytes,
            heavy_per_caller,
            write_timeout,
            merge_lock_wait,
            edit_work_bytes,
            max_version_bytes,
            webhook_urls,
            webhook_secret,
            webhook_max_attempts,
            webhook_debounce,
            webhook_backoff,
            webhook_timeout
        )
    }

    /// Applies the built-in defaults to whatever is still unset.
    pub fn resolve(self) -> Config {
        let d = |v: Option<HumanDuration>, default: Duration| v.map(|h| h.0).unwrap_or(default);
        Config {
            bind: self
                .bind
                .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 1234))),
            database_url: self
                .database_url
                .unwrap_or_else(|| "sqlite://quire.db".into()),
            sqlite_synchronous: self.sqlite_synchronous.unwrap_or(SqliteSync::Full),
            sqlite_commit: CommitWindowSettings {
                delay: d(
                    self.sqlite_commit_delay,
                    CommitWindowSettings::default().delay,
                ),
                siblings: self
                    .sqlite_commit_siblings
                    .unwrap_or(CommitWindowSettings::default().siblings),
            },
            postgres_commit: CommitWindowSettings {
                delay: d(
                    self.postgres_commit_delay,
                    CommitWindowSettings::default().delay,
                ),
                siblings: self
                    .postgres_commit_siblings
                    .unwrap_or(CommitWindowSettings::default().siblings),
            },
            log_format: self.log_format.unwrap_or(LogFormat::Text),
            log: self.log.unwrap_or_else(|| "info".to_owned()),
            limits: Limits {
                max_message_size: self.max_message_size.unwrap_or(16 << 20),
                ws_read_buffer: self.ws_read_buffer.unwrap_or(128).max(16),
                sync_requests_per_minute: self.sync_requests_per_minute.unwrap_or(120).max(1),
                awareness_per_second: self.awareness_per_second.unwrap_or(50).max(1),
                connections_per_minute_per_addr: self
                    .connections_per_minute_per_addr
                    .unwrap_or(600)
                    .max(1),
                auth_failures_per_minute_per_addr: self
                    .auth_failures_per_minute_per_addr
                    .unwrap_or(30)
                    .max(1),
                rate_limit_loopback: self.rate_limit_loopback.unwrap_or(false),
                header_timeout: d(self.header_timeout, Duration::from_secs(10)),
                hocuspocus_max_documents: self.hocuspocus_max_documents.unwrap_or(100).max(1),
                hocuspocus_pending_frames: self.hocuspocus_pending_frames.unwrap_or(1000).max(1),
                hocuspocus_pending_bytes: self.hocuspocus_pending_bytes.unwrap_or(4 << 20).max(1),
                hocuspocus_auth_timeout: d(self.hocuspocus_auth_timeout, Duration::from_secs(10)),
                max_stateless_bytes: self.max_stateless_bytes.unwrap_or(64 << 10).max(1),
                stateless_per_second: self.stateless_per_second.unwrap_or(20).max(1),
            },
            idle_timeout: d(self.idle_timeout, Duration::from_secs(90)),
            slow_close_timeout: d(self.slow_close_timeout, Duration::from_secs(30)),
            shutdown_grace: d(self.shutdown_grace, Duration::from_secs(10)),
            room: RoomConfig {
                lease: None,
                // The room pushes at least two messages (step 1, awareness) on join.
                peer_queue: self.peer_queue.unwrap_or(1024).max(4),
                peer_queue_bytes: self.peer_queue_bytes.unwrap_or(16 << 20),
                room_queue: self.room_queue.unwrap_or(1024).max(1),
                room_queue_bytes: self.room_queue_bytes.unwrap_or(64 << 20).max(1),
                held_update_bytes: self.held_update_bytes.unwrap_or(8 << 20),
                edit_work_bytes: self.edit_work_bytes.unwrap_or(32 << 20).max(1),
                held_update_timeout: d(self.held_update_timeout, Duration::from_secs(30))
                    .max(Duration::from_millis(10)),
                ping_interval: d(self.ping_interval, Duration::from_secs(30)),
                max_doc_size: self.max_doc_size.unwrap_or(256 << 20),
                max_connections: self.max_connections_per_doc.unwrap_or(1000).max(1),
                commit_batch: self.commit_batch.unwrap_or(1024).max(1),
                awareness_timeout: d(self.awareness_timeout, Duration::from_secs(30)),
                presence_grace: d(self.presence_grace, Duration::ZERO)
                    .max(d(self.awareness_timeout, Duration::from_secs(30))),
                awareness_tick: d(self.awareness_tick, Duration::from_millis(50))
                    .min(Duration::from_secs(5)),
                unload_delay: d(self.room_unload_delay, Duration::from_secs(30)),
                load_retry_delay: d(self.load_retry_delay, Duration::from_secs(2)),
                storage_timeout: d(self.storage_timeout, Duration::from_secs(10))
                    .max(Duration::from_millis(10)),
                snapshot_updates: self.snapshot_updates.unwrap_or(1000).max(1),
                snapshot_bytes: self.snapshot_bytes.unwrap_or(4 << 20).max(1),
                snapshot_log_percent: self.snapshot_log_percent.unwrap_or(50),
                history: HistoryConfig {
                    retention: d(self.history_retention, Duration::from_secs(30 * 24 * 3600)),
                    version_idle: d(self.version_idle, Duration::from_secs(300))
                        .max(Duration::from_millis(10)),
                    version_every: d(self.version_every, Duration::from_secs(3600))
                        .max(Duration::from_millis(10)),
                    prune_interval: d(self.history_prune_interval, Duration::from_secs(3600))
                        .max(Duration::from_millis(10)),
                },
            },
            auth_keys: self.auth_keys.unwrap_or_default(),
            admin_key: self.admin_key,
            idempotency_ttl: d(self.idempotency_ttl, Duration::from_secs(24 * 3600)),
            admin_sample_every: d(self.admin_sample_every, Duration::from_secs(1))
                .max(Duration::from_millis(50)),
            admin_history: d(self.admin_history, Duration::from_secs(3600)),
            forward_timeout: d(self.forward_timeout, Duration::from_secs(10)),
            gate: GateConfig {
                per_node: self
                    .heavy_per_node
                    .unwrap_or_else(|| {
                        std::thread::available_parallelism().map_or(2, std::num::NonZeroUsize::get)
                    })
                    .max(1),
                per_doc: self.heavy_per_doc.unwrap_or(2).max(1),
                queue: self.heavy_queue.unwrap_or(32),
                wait: d(self.heavy_wait, Duration::from_secs(5)),
                cache_bytes: self.history_cache_bytes.unwrap_or(64 << 20),
                per_caller: self.heavy_per_caller.unwrap_or(4).max(1),
            },
            write_timeout: d(self.write_timeout, Duration::from_secs(30))
                .max(Duration::from_millis(10)),
            merge_lock_wait: d(self.merge_lock_wait, Duration::from_secs(10)),
            max_version_bytes: self.max_version_bytes.unwrap_or(1 << 30),
            bus_url: self.bus_url,
            bus_credentials: self.bus_credentials,
            cluster_key: self.cluster_key,
            bus_tick: d(self.bus_tick, Duration::ZERO).min(Duration::from_millis(100)),
            node_id: self
                .node_id
                .unwrap_or_else(|| format!("node-{:08x}", rand::random::<u32>())),
            lease_ttl: d(self.lease_ttl, Duration::from_secs(5)).max(Duration::from_millis(100)),
            web_root: self.web_root,
            webhooks: WebhookConfig {
                urls: self.webhook_urls.unwrap_or_default(),
                secret: self.webhook_secret,
                max_attempts: self.webhook_max_attempts.unwrap_or(8).max(1),
                debounce: d(self.webhook_debounce, Duration::from_secs(10)),
                backoff: d(self.webhook_backoff, Duration::from_secs(1)),
                timeout: d(self.webhook_timeout, Duration::from_secs(10)),
            },
        }
    }
}

#[cfg(test)]
mod tests;
