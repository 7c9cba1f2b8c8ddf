//! The map from document name to running room, and the shared context rooms need.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::actor;
use super::stats::RoomStats;
use super::{DocName, JoinError, RoomHandle};
use crate::config::RoomConfig;
use crate::metrics::Metrics;
use crate::storage::DocStore;

struct Entry {
    generation: u64,
    handle: RoomHandle,
    /// What the room reports of itself (the admin dashboard).
    stats: Arc<RoomStats>,
}

/// Starts rooms on demand and forgets them when they stop. The mutex guards only the map and
/// is never held across an `.await`.
/// Snapshots of large documents encoded away from their rooms at one time (the others wait
/// their turn while their rooms go on).
const SNAPSHOT_ENCODERS: usize = 1;

pub struct Registry {
    rooms: Mutex<HashMap<DocName, Entry>>,
    next_generation: AtomicU64,
    pub(crate) store: Arc<dyn DocStore>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) config: RoomConfig,
    pub(crate) shutdown: CancellationToken,
    pub(crate) tracker: TaskTracker,
    /// Why the last failed append failed (read by `/readyz` while rooms are stalled).
    storage_error: Mutex<String>,
    /// The role changes this node has acted on (`crate::changes`).
    pub(crate) changes: super::seen::Seen,
    /// Snapshots encoded away from their rooms at one time (each replays a large document:
    /// several at once would hold that many copies of large documents in memory).
    pub(crate) snapshot_encoders: Arc<tokio::sync::Semaphore>,
}

impl Registry {
    /// Records why an append failed (for `/readyz`).
    pub(crate) fn set_storage_error(&self, why: String) {
        *self.storage_error.lock().unwrap_or_else(|e| e.into_inner()) = why;
    }

    /// Rooms stalled on a failing storage, and why the last append failed; `None` if none is.
    pub fn storage_stalled(&self) -> Option<(i64, String)> {
        let stalled = self.metrics.rooms_stalled.get();
        (stalled > 0).then(|| {
            let why = self.storage_error.lock().unwrap_or_else(|e| e.into_inner());
            (stalled, why.clone())
        })
    }

    pub fn new(
        store: Arc<dyn DocStore>,
        metrics: Arc<Metrics>,
        config: RoomConfig,
        shutdown: CancellationToken,
    ) -> Arc<Registry> {
        Arc::new(Registry {
            rooms: Mutex::new(HashMap::new()),
            next_generation: AtomicU64::new(1),
            store,
            metrics,
            config,
            shutdown,
            tracker: TaskTracker::new(),
            storage_error: Mutex::new(String::new()),
            changes: super::seen::Seen::default(),
            snapshot_encoders: Arc::new(tokio::sync::Semaphore::new(SNAPSHOT_ENCODERS)),
        })
    }

    /// The running room for `name`, started (and loading) if there is none.
    pub fn get_or_start(self: &Arc<Self>, name: &DocName) -> Result<RoomHandle, JoinError> {
        if self.shutdown.is_cancelled() {
            return Err(JoinError::ShuttingDown);
        }
        let mut rooms = self.rooms.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = rooms.get(name) {
            // A room that stopped without deregistering (it cannot, but be safe) is replaced.
            if !entry.handle.tx.is_closed() {
                return Ok(entry.handle.clone());
            }
        }
        let generation = self.next_generation.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(self.config.room_queue);
        let handle = RoomHandle::new(tx, self.config.room_queue_bytes);
        let stats = Arc::new(RoomStats::default());
        rooms.insert(
            name.clone(),
            Entry {
                generation,
                handle: handle.clone(),
                stats: stats.clone(),
            },
        );
        self.tracker.spawn(actor::run(
            self.clone(),
            name.clone(),
            generation,
            rx,
            stats,
        ));
        Ok(handle)
    }

    /// The running room for `name`, if it is loaded.
    pub fn get(&self, name: &DocName) -> Option<RoomHandle> {
        let rooms = self.rooms.lock().unwrap_or_else(|p| p.into_inner());
        rooms.get(name).map(|e| e.handle.clone())
    }

    /// Every loaded room (for revocations, which apply to all).
    pub fn all(&self) -> Vec<RoomHandle> {
        let rooms = self.rooms.lock().unwrap_or_else(|p| p.into_inner());
        rooms.values().map(|e| e.handle.clone()).collect()
    }

    /// Every loaded room's name and live figures (the admin dashboard), in no order.
    pub fn live_stats(&self) -> Vec<(DocName, Arc<RoomStats>)> {
        let rooms = self.rooms.lock().unwrap_or_else(|p| p.into_inner());
        rooms
            .iter()
            .map(|(name, e)| (name.clone(), e.stats.clone()))
            .collect()
    }

    /// Forgets the room if it is still the given generation.
    pub(crate) fn remove(&self, name: &DocName, generation: u64) {
        let mut rooms = self.rooms.lock().unwrap_or_else(|p| p.into_inner());
        if rooms.get(name).is_some_and(|e| e.generation == generation) {
            rooms.remove(name);
        }
    }

    /// Number of rooms running.
    pub fn len(&self) -> usize {
        self.rooms.lock().map(|r| r.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits for every room task to finish (after shutdown was signalled).
    pub async fn wait_stopped(&self) {
        self.tracker.close();
        self.tracker.wait().await;
    }
}
