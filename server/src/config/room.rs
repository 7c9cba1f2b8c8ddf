//! Rooms: document size, queues, commits, presence, snapshots, unloading.

use super::*;

layered! {
    /// Rooms: document size, queues, commits, presence, snapshots, unloading.
    pub struct RoomSettings {
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
        /// Inbound queue length per room, in messages [default: 1024]
        #[arg(long, env = "QUIRE_ROOM_QUEUE")]
        pub room_queue: Option<usize>,
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
        /// Most updates committed in one transaction [default: 1024]
        #[arg(long, env = "QUIRE_COMMIT_BATCH")]
        pub commit_batch: Option<usize>,
        /// WebSocket ping interval [default: 30s]
        #[arg(long, env = "QUIRE_PING_INTERVAL")]
        pub ping_interval: Option<HumanDuration>,
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
        /// Deadline of each storage operation of a room (load, append, snapshot, lease); past it
        /// the room stops taking updates (1013, retry) until storage answers again [default: 10s]
        #[arg(long, env = "QUIRE_STORAGE_TIMEOUT")]
        pub storage_timeout: Option<HumanDuration>,
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
        /// Bytes of document content one JSON edit request may scan (a replace searching a text,
        /// an XML walk) on the document's room; past it 422 `edit-too-costly`, nothing applied
        /// [default: 33554432]
        #[arg(long, env = "QUIRE_EDIT_WORK_BYTES")]
        pub edit_work_bytes: Option<usize>,
    }
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

impl RoomSettings {
    pub(super) fn resolve(&self, history: HistoryConfig) -> RoomConfig {
        let d = or_default;
        RoomConfig {
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
            history,
        }
    }
}
