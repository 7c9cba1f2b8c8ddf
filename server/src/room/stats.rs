//! What a running room tells the admin dashboard about itself: a few counters the room task
//! updates as it goes (relaxed atomics, no lock) and the registry hands out with the room.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

/// Live figures of one room. Written only by its room task; read by anyone.
#[derive(Debug, Default)]
pub struct RoomStats {
    /// When the room started (ms since the epoch).
    pub loaded_at: AtomicI64,
    /// Peers connected (y-websocket and Hocuspocus, local and relayed).
    pub peers: AtomicU64,
    /// Updates committed to the log since the room started.
    pub updates_in: AtomicU64,
    /// Update deliveries queued to peers since the room started (one per update per peer).
    pub updates_out: AtomicU64,
    /// Bytes stored for the document: its snapshot and the log after it.
    pub stored_bytes: AtomicU64,
    /// Log rows after the snapshot (what a load replays).
    pub log_rows: AtomicU64,
    /// When the room last committed an append, and last wrote a snapshot (ms; 0: not yet).
    pub last_commit: AtomicI64,
    pub last_snapshot: AtomicI64,
    /// The lease epoch the room's writes carry (0: no leases).
    pub epoch: AtomicI64,
}

/// A copy of [`RoomStats`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct RoomFigures {
    pub loaded_at: i64,
    pub peers: u64,
    pub updates_in: u64,
    pub updates_out: u64,
    pub stored_bytes: u64,
    pub log_rows: u64,
    pub last_commit: i64,
    pub last_snapshot: i64,
    pub epoch: i64,
}

impl RoomStats {
    pub fn read(&self) -> RoomFigures {
        RoomFigures {
            loaded_at: self.loaded_at.load(Relaxed),
            peers: self.peers.load(Relaxed),
            updates_in: self.updates_in.load(Relaxed),
            updates_out: self.updates_out.load(Relaxed),
            stored_bytes: self.stored_bytes.load(Relaxed),
            log_rows: self.log_rows.load(Relaxed),
            last_commit: self.last_commit.load(Relaxed),
            last_snapshot: self.last_snapshot.load(Relaxed),
            epoch: self.epoch.load(Relaxed),
        }
    }
}
