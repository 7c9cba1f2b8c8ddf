//! The admin dashboard's server side: figures sampled every `admin_sample_every` from the
//! server's own metrics and rooms, an hour of them (`admin_history`) kept in memory, and each
//! new one sent to every open dashboard (`GET /api/v1/admin/stream`); the node's heartbeat in
//! the `nodes` table; and the page itself (`/admin`, files compiled into the binary so the
//! dashboard works wherever the binary runs). The routes are in `http/admin.rs`.

pub mod page;
pub mod sampler;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

pub use sampler::{LiveRoom, Sample, Sampler, Tick};

use crate::storage::api::ApiStore;

/// Most samples kept, whatever `admin_history / admin_sample_every` says (a day at one a
/// second: about 7 MB of memory, and the history a dashboard loads first).
pub const MAX_SAMPLES: usize = 86_400;
/// Ticks a slow dashboard may fall behind before it skips to the newest.
const TICK_BACKLOG: usize = 16;
/// Rooms listed in each tick: the busiest, so a dashboard's tick stays small with many rooms.
pub const LIVE_ROOMS: usize = 100;
/// How often a node writes its row in `nodes`; a row older than [`NODE_GONE_AFTER`] is shown
/// as a node that is gone.
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(5);
pub const NODE_GONE_AFTER: Duration = Duration::from_secs(15);

/// What the dashboard's routes share: the kept figures and the channel of new ones.
pub struct Admin {
    pub every: Duration,
    pub keep: Duration,
    /// When this process started (ms since the epoch).
    pub started_at: i64,
    history: Mutex<History>,
    ticks: broadcast::Sender<Arc<Tick>>,
}

struct History {
    samples: VecDeque<Sample>,
    capacity: usize,
    /// The newest tick's rooms, for a dashboard that opens between two ticks.
    rooms: Arc<Tick>,
}

impl Admin {
    pub fn new(every: Duration, keep: Duration) -> Admin {
        let every_ms = every.as_millis().max(1);
        let capacity = usize::try_from(keep.as_millis() / every_ms)
            .unwrap_or(usize::MAX)
            .clamp(1, MAX_SAMPLES);
        let (ticks, _) = broadcast::channel(TICK_BACKLOG);
        Admin {
            every,
            keep,
            started_at: crate::storage::now_ms(),
            history: Mutex::new(History {
                samples: VecDeque::with_capacity(capacity.min(4096)),
                capacity,
                rooms: Arc::new(Tick::default()),
            }),
            ticks,
        }
    }

    /// Keeps `tick`'s sample (dropping the oldest beyond `admin_history`) and sends the tick
    /// to every open dashboard.
    pub fn record(&self, tick: Tick) {
        let tick = Arc::new(tick);
        {
            let mut h = self.history.lock().unwrap_or_else(|p| p.into_inner());
            if h.samples.len() == h.capacity {
                h.samples.pop_front();
            }
            h.samples.push_back(tick.sample);
            h.rooms = tick.clone();
        }
        // No dashboard open: nobody to tell.
        let _ = self.ticks.send(tick);
    }

    /// The kept samples, oldest first, and the newest tick; then every tick after them. Taken
    /// under one lock, so a tick is either in the history or comes through the receiver.
    pub fn subscribe(&self) -> (Vec<Sample>, Arc<Tick>, broadcast::Receiver<Arc<Tick>>) {
        let h = self.history.lock().unwrap_or_else(|p| p.into_inner());
        let rx = self.ticks.subscribe();
        (h.samples.iter().copied().collect(), h.rooms.clone(), rx)
    }

    /// The newest tick (its rooms and their rates).
    pub fn newest(&self) -> Arc<Tick> {
        let h = self.history.lock().unwrap_or_else(|p| p.into_inner());
        h.rooms.clone()
    }

    /// Samples kept now.
    pub fn kept(&self) -> usize {
        let h = self.history.lock().unwrap_or_else(|p| p.into_inner());
        h.samples.len()
    }
}

/// Samples the server every `admin.every` until shutdown.
pub async fn sample(
    admin: Arc<Admin>,
    metrics: Arc<crate::metrics::Metrics>,
    registry: Arc<crate::room::Registry>,
    shutdown: CancellationToken,
) {
    let mut sampler = Sampler::new(&metrics, crate::storage::now_ms());
    let mut every = tokio::time::interval(admin.every);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    every.tick().await;
    loop {
        tokio::select! {
            _ = every.tick() => {}
            _ = shutdown.cancelled() => return,
        }
        let rooms = registry.live_stats();
        let tick = sampler.sample(
            &metrics,
            &rooms,
            crate::storage::now_ms(),
            sampler::resident_bytes(),
        );
        admin.record(tick);
    }
}

/// Writes this node's row in `nodes` every [`HEARTBEAT_EVERY`] until shutdown (a failure is
/// logged and tried again at the next beat).
pub async fn heartbeat(
    api: Arc<dyn ApiStore>,
    node_id: String,
    address: String,
    started_at: i64,
    shutdown: CancellationToken,
) {
    let version = env!("CARGO_PKG_VERSION");
    loop {
        if let Err(e) = api
            .node_heartbeat(&node_id, &address, version, started_at)
            .await
        {
            tracing::warn!(error = %e, "cannot write this node's heartbeat");
        }
        tokio::select! {
            _ = tokio::time::sleep(HEARTBEAT_EVERY) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}
