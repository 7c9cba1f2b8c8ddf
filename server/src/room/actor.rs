//! The room task: applies updates, commits them to the log, broadcasts them, snapshots.
//!
//! The pipeline keeps one rule: **no peer ever receives state that is not committed**.
//! - Updates arrive in `queued`, unapplied.
//! - When no write is in flight, the room applies the queued updates to the `Doc` (dropping the
//!   ones that add nothing) and starts one append for all the new ones: group commit, since
//!   everything that arrived during the previous commit goes into this one.
//! - When a full batch (`commit_batch` updates) is queued while an append is in flight, the room
//!   applies it at once and stages it, so applying overlaps committing; the staged batch is
//!   appended as soon as the one in flight commits (one append in flight at a time keeps the
//!   log's sequence numbers gapless). Nothing is staged while reads wait for committed state or
//!   a snapshot is due, so neither waits for a busy room to fall quiet.
//! - When the append commits, the room broadcasts those updates, echoes durable
//!   acknowledgements that were waiting for them, and answers Sync/Step1 requests that were
//!   deferred because the `Doc` held uncommitted data. Then it starts the next batch.
//! - Snapshots are written between appends, when the `Doc` is exactly the committed state.
//! - While storage is stalled (an append failed or passed its deadline and is being retried),
//!   the waiting reads are answered from the committed copy (`committed.rs`) instead.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::time::{sleep, sleep_until, Duration, Instant};
use tracing::{debug, error, info, info_span, warn, Instrument};
use yrs::updates::decoder::Decode;
use yrs::{Doc, ReadTxn, StateVector, Transact, Update};

use super::answers::SharedAnswers;
use super::awareness::AwarenessTable;
use super::committed::{self, CommittedCopy};
use super::queue::{Answer, QueueTx, SendError};
use super::{
    ApplyError, CloseReason, DocName, JoinError, PeerAuth, PeerFilter, PeerId, PeerLink, PeerMsg,
    Registry, RoomCmd,
};
use crate::close;
use crate::protocol;
use crate::storage::{Epoch, LeaseGrant, SnapshotOutcome, StorageError, StoredDoc};

/// Attempts at committing one batch before the room gives up (closing its peers with 1011 so
/// they resync against a fresh load). Backoff doubles from [`COMMIT_RETRY_BASE`].
const COMMIT_RETRY_BASE: Duration = Duration::from_millis(50);
/// Attempts of a failing commit while the room is leaving (unloading, shutting down).
const DRAIN_COMMIT_ATTEMPTS: u32 = 6;
/// The longest wait between two attempts of a failing commit.
const COMMIT_RETRY_MAX: Duration = Duration::from_secs(2);

/// The wait before attempt `attempt` (1, 2, ...) of a failing commit: doubling from
/// [`COMMIT_RETRY_BASE`] up to [`COMMIT_RETRY_MAX`].
fn commit_backoff(attempt: u32) -> Duration {
    COMMIT_RETRY_BASE
        .saturating_mul(2u32.saturating_pow(attempt.saturating_sub(1).min(16)))
        .min(COMMIT_RETRY_MAX)
}

/// Removes the room from the registry however the task ends, a panic included, so the next
/// connection starts a fresh room instead of finding a dead handle.
struct Registration {
    registry: Arc<Registry>,
    name: DocName,
    generation: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.registry.remove(&self.name, self.generation);
        self.registry.metrics.rooms_loaded.dec();
    }
}

/// Entry point of a room task.
pub(super) async fn run(
    registry: Arc<Registry>,
    name: DocName,
    generation: u64,
    rx: mpsc::Receiver<RoomCmd>,
) {
    let span = info_span!("room", doc = %name);
    async move {
        registry.metrics.rooms_loaded.inc();
        let registration = Registration {
            registry: registry.clone(),
            name: name.clone(),
            generation,
        };
        let mut rx = rx;
        // What joins still queued when the room stops are told.
        let mut leftover = JoinError::Gone;
        match load_owned(&registry, &name).await {
            Ok(Owned::Here(_, loaded)) if loaded.stored.deleted => leftover = JoinError::Deleted,
            Ok(Owned::Here(fence, loaded)) => {
                let mut room = Room::new(registry.clone(), name.clone(), loaded, fence);
                if room.run(&mut rx).await {
                    leftover = JoinError::Deleted;
                }
            }
            Ok(Owned::Elsewhere { owner }) => {
                // Queued joins are refused and the room stops at once, so the next join asks
                // the database again (the lease may have expired or been released by then).
                debug!(%owner, "served by another node");
                leftover = JoinError::Elsewhere;
            }
            Err(e) => {
                registry.metrics.room_load_failures.inc();
                error!(error = %e, "load failed; refusing connections until the retry delay passes");
                refuse_until(
                    &mut rx,
                    Instant::now() + registry.config.load_retry_delay,
                    JoinError::LoadFailed,
                )
                .await;
            }
        }
        drop(registration);
        rx.close();
        // Joins that raced with the exit are told to ask the registry again (or that the
        // document is deleted).
        while let Ok(cmd) = rx.try_recv() {
            reject(cmd, leftover);
        }
    }
    .instrument(span)
    .await
}

/// Answers a command the room will not serve.
fn reject(cmd: RoomCmd, why: JoinError) {
    // Other commands' reply senders are dropped with `cmd`: HTTP callers see the room gone
    // and retry.
    if let RoomCmd::Join { reply, .. } = cmd {
        let _ = reply.send(Err(why));
    }
}

/// After a failed load (or finding the document owned elsewhere): answer every join with
/// `why` until `until`. Such a room never holds a `Doc`, so it can never write an empty
/// document over stored data.
async fn refuse_until(rx: &mut mpsc::Receiver<RoomCmd>, until: Instant, why: JoinError) {
    loop {
        tokio::select! {
            _ = sleep_until(until) => return,
            cmd = rx.recv() => match cmd {
                Some(cmd) => reject(cmd, why),
                None => return,
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
enum LoadError {
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("stored data does not decode: {0}")]
    Corrupt(String),
}

struct Loaded {
    stored: StoredDoc,
    doc: Doc,
}

/// `fut`, a storage operation, given up after `limit` (counted in `storage_timeouts`): an
/// error like any other for the caller, which retries or fails.
async fn within<T>(
    limit: Duration,
    metrics: &crate::metrics::Metrics,
    op: &'static str,
    fut: impl std::future::Future<Output = Result<T, StorageError>>,
) -> Result<T, StorageError> {
    match tokio::time::timeout(limit, fut).await {
        Ok(result) => result,
        Err(_) => {
            metrics.storage_timeouts.inc();
            Err(StorageError::Timeout { op, after: limit })
        }
    }
}

async fn load(registry: &Registry, name: &DocName) -> Result<Loaded, LoadError> {
    let limit = registry.config.storage_timeout;
    let stored = within(
        limit,
        &registry.metrics,
        "load",
        registry.store.load(name.as_str()),
    )
    .await?;
    let doc = build_doc(&stored)?;
    debug!(
        snapshot_bytes = stored.snapshot.as_ref().map_or(0, Vec::len),
        log_rows = stored.updates.len(),
        "loaded"
    );
    Ok(Loaded { stored, doc })
}

/// Who serves a document.
enum Owned {
    /// This node, under this lease epoch, granted at this instant (`None`: no leases).
    Here(Option<(Epoch, Instant)>, Loaded),
    Elsewhere {
        owner: String,
    },
}

/// Loads a document for a room on this node: with leases, takes the document's lease first
/// and loads again under it, so everything the previous owner committed is seen (a write
/// under its epoch cannot commit after the grant: the storage fences it).
async fn load_owned(registry: &Registry, name: &DocName) -> Result<Owned, LoadError> {
    let loaded = load(registry, name).await?;
    let Some(lease) = &registry.config.lease else {
        return Ok(Owned::Here(None, loaded));
    };
    if loaded.stored.deleted {
        return Ok(Owned::Here(None, loaded));
    }
    let doc = loaded.stored.id;
    // The database counts the lease from the grant: so does the room (taken before asking,
    // so the room's idea of the lease never outlives the database's).
    let asked = Instant::now();
    let limit = registry.config.storage_timeout;
    let asking = registry.store.acquire_lease(doc, &lease.node_id, lease.ttl);
    let grant = within(limit, &registry.metrics, "lease", asking).await?;
    let epoch = match grant {
        LeaseGrant::Granted { epoch } => epoch,
        LeaseGrant::HeldBy { owner, .. } => return Ok(Owned::Elsewhere { owner }),
    };
    info!(epoch, "lease granted");
    let release = || async {
        let releasing = registry.store.release_lease(doc, &lease.node_id, epoch);
        if let Err(e) = within(limit, &registry.metrics, "lease", releasing).await {
            warn!(error = %e, "could not release the lease; it expires by itself");
        }
    };
    match load(registry, name).await {
        Ok(loaded) if loaded.stored.deleted => {
            release().await;
            Ok(Owned::Here(None, loaded))
        }
        Ok(loaded) => Ok(Owned::Here(Some((epoch, asked)), loaded)),
        Err(e) => {
            // No room will run: let another node (or the next attempt) have the document.
            release().await;
            Err(e)
        }
    }
}

/// The most bytes of committed rows a room keeps in its committed copy: twice what triggers a
/// snapshot, so only a room whose snapshots cannot be written passes it.
fn committed_copy_limit(registry: &Registry) -> usize {
    usize::try_from(registry.config.snapshot_bytes.saturating_mul(2)).unwrap_or(usize::MAX)
}

/// Latest snapshot plus the log rows after it, replayed into a fresh `Doc`.
fn build_doc(stored: &StoredDoc) -> Result<Doc, LoadError> {
    let rows = stored
        .updates
        .iter()
        .map(|(seq, data)| (*seq, data.as_slice()));
    committed::replay(stored.snapshot.as_deref(), rows).map_err(LoadError::Corrupt)
}

struct Peer {
    tx: QueueTx,
    auth: PeerAuth,
    /// When the peer's token expires (its entry in `Room::expiries`).
    expires: Option<Instant>,
}

/// The instant a token expiring at `exp` (seconds since the epoch) runs out, on the room's
/// clock.
fn expiry_instant(exp: i64) -> Instant {
    let left_ms = exp
        .saturating_mul(1000)
        .saturating_sub(crate::storage::now_ms());
    Instant::now() + Duration::from_millis(u64::try_from(left_ms).unwrap_or(0))
}

/// Where an update came from: a connection, or an HTTP request waiting for its commit.
enum Origin {
    Peer(PeerId),
    Http(tokio::sync::oneshot::Sender<Result<i64, ApplyError>>),
}

impl Origin {
    fn peer(&self) -> Option<PeerId> {
        match self {
            Origin::Peer(p) => Some(*p),
            Origin::Http(_) => None,
        }
    }
}

/// An update received and not yet applied.
struct Queued {
    idx: u64,
    origin: Origin,
    raw: Bytes,
    update: Option<Update>,
}

/// An update applied to the `Doc` and being committed.
struct Applied {
    idx: u64,
    origin: Origin,
    raw: Bytes,
}

/// Updates applied to the `Doc` together, to be committed in one append; held in `staged`
/// when applied while the previous batch commits.
struct AppliedBatch {
    batch: Vec<Applied>,
    upto_idx: u64,
    /// The state vector before the batch was applied.
    committed_sv: StateVector,
}

/// Reads that must see only committed state; deferred while an append is in flight.
enum DeferredRead {
    Update(StateVector, tokio::sync::oneshot::Sender<Vec<u8>>),
    Json(tokio::sync::oneshot::Sender<serde_json::Value>),
}

/// Something waiting for `committed_idx` to reach `idx`.
enum Waiter {
    /// Echo a durable-ack request to a peer.
    Ack(PeerId, Bytes),
    /// Answer an HTTP update that changed nothing: it may duplicate an update not yet
    /// committed, so the caller hears back only once everything before it is.
    Http(tokio::sync::oneshot::Sender<Result<i64, ApplyError>>),
}

enum Inflight {
    Append {
        batch: Vec<Applied>,
        /// Every update with an index up to this one is committed when this append is.
        upto_idx: u64,
        /// The state vector before the batch was applied: what peers may have seen.
        committed_sv: StateVector,
        started: Instant,
        attempt: u32,
        task: StorageOp<()>,
    },
    Snapshot {
        upto_seq: i64,
        size: u64,
        /// What is being written, for the committed copy once it is.
        data: Bytes,
        task: StorageOp<SnapshotOutcome>,
    },
}

enum OpResult {
    Append(Result<(), StorageError>),
    Snapshot(Result<SnapshotOutcome, StorageError>),
}

/// Why the room loop stopped.
enum Exit {
    Unloaded,
    Deleted,
    Shutdown,
    Failed(String),
    /// The document's lease moved to another node: give the room up at once.
    Fenced(String),
    /// The storage refused an append because the document is deleted (a delete this room
    /// was not told about, made on another node).
    DeletedUnderneath,
}

/// The room's lease, released when the room is dropped without releasing it (a panic
/// unwinding through the room), so another node may take the document at once instead of
/// waiting for the lease to run out.
struct LeaseGuard {
    store: Arc<dyn crate::storage::DocStore>,
    doc: i64,
    node: Arc<str>,
    epoch: Epoch,
    armed: bool,
    /// The deadline of the release (`storage_timeout`).
    limit: Duration,
}

impl LeaseGuard {
    /// Releases the lease now (unless it was already).
    async fn release(&mut self) {
        if std::mem::take(&mut self.armed) {
            let releasing = self.store.release_lease(self.doc, &self.node, self.epoch);
            match tokio::time::timeout(self.limit, releasing).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    warn!(error = %e, "could not release the lease; it expires by itself")
                }
                Err(_) => warn!("the lease release did not answer in time; it expires by itself"),
            }
        }
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // no runtime left to release it with: it expires by itself
        };
        let (store, doc, node, epoch) =
            (self.store.clone(), self.doc, self.node.clone(), self.epoch);
        let limit = self.limit;
        runtime.spawn(async move {
            let _ = tokio::time::timeout(limit, store.release_lease(doc, &node, epoch)).await;
        });
    }
}

/// The room's share of `quire_rooms_storage_stalled`: given back however the room ends, a
/// panic included (or `/readyz` would stay 503).
struct Stalled {
    gauge: prometheus::IntGauge,
    on: bool,
}

impl Stalled {
    fn is_on(&self) -> bool {
        self.on
    }

    /// Sets the state; true if it changed.
    fn set(&mut self, on: bool) -> bool {
        if self.on == on {
            return false;
        }
        self.on = on;
        if on {
            self.gauge.inc();
        } else {
            self.gauge.dec();
        }
        true
    }
}

impl Drop for Stalled {
    fn drop(&mut self) {
        self.set(false);
    }
}

struct Room {
    registry: Arc<Registry>,
    name: DocName,
    doc_id: i64,
    /// The lease epoch every append and snapshot carries (`None`: no leases).
    fence: Option<Epoch>,
    /// A lease renewal in flight, polled by the room like its storage operation.
    renewing: Option<StorageOp<bool>>,
    /// When the renewal in flight was sent, when to renew next, and until when the lease is
    /// known to hold (by this process's clock, counted from when a grant or renewal was sent,
    /// so never later than the database's).
    renew_started: Instant,
    renew_at: Instant,
    lease_until: Instant,
    /// Released on every exit, a panic included (`None`: no leases).
    lease_guard: Option<LeaseGuard>,
    /// Set when a write was fenced: the room must stop.
    fenced: bool,
    /// Set when an append was refused because the document is deleted: the room must stop.
    deleted_underneath: bool,
    /// The last append failed or timed out: updates are refused (1013) until one succeeds.
    stalled: Stalled,
    /// The room is leaving: failing commits are given up after a few attempts.
    draining: bool,
    doc: Doc,
    /// The committed state as storage holds it, for reads while the room is stalled.
    committed: CommittedCopy,
    /// The newest role change acted on, per user: a peer joining with a permission read
    /// before it is closed (4403) at once.
    role_changes: HashMap<String, i64>,
    awareness: AwarenessTable,
    /// Sync answers encoded for the current version of the `Doc`, shared between peers.
    answers: SharedAnswers,
    peers: HashMap<PeerId, Peer>,
    /// Peers whose token expires, by when: the room closes each with 4401 then.
    expiries: BTreeSet<(Instant, PeerId)>,
    /// Peers that sent an update whose dependencies the document lacks (yrs keeps it
    /// pending, not integrated). Their durable acknowledgements wait in `withheld` until a
    /// commit leaves the document with nothing pending: "saved" must mean others see it.
    dangling: HashSet<PeerId>,
    withheld: Vec<(PeerId, Bytes)>,
    /// Version of the document row's snapshot, for the optimistic check.
    snapshot_version: i64,
    /// Highest committed log sequence number.
    last_seq: i64,
    /// Bytes stored for the document (snapshot plus log since), for `max_doc_size`.
    stored_bytes: u64,
    /// Bytes of updates received and not yet applied.
    queued_bytes: u64,
    /// Bytes of updates applied and not yet committed (in flight or staged).
    applied_bytes: u64,
    since_snapshot_updates: u64,
    since_snapshot_bytes: u64,
    /// A snapshot write failed: wait for the next successful append before trying again, so
    /// a failing snapshot never holds up commits.
    snapshot_failed: bool,
    /// yrs could not encode the document for a snapshot (see `spawn_snapshot`).
    unencodable: bool,
    queued: VecDeque<Queued>,
    inflight: Option<Inflight>,
    staged: Option<AppliedBatch>,
    /// At most one deferred Sync/Step1 per peer (a later one replaces an earlier one).
    deferred_step1: HashMap<PeerId, StateVector>,
    deferred_reads: Vec<DeferredRead>,
    waiters: VecDeque<(u64, Waiter)>,
    received_idx: u64,
    committed_idx: u64,
    /// Set when an update failed half-way through being applied: the `Doc` may hold part of
    /// it, so it is rebuilt from storage before anything else happens. Holds what peers may
    /// have seen.
    reload_needed: Option<StateVector>,
    unload_at: Option<Instant>,
}

impl Room {
    fn new(
        registry: Arc<Registry>,
        name: DocName,
        loaded: Loaded,
        lease: Option<(Epoch, Instant)>,
    ) -> Room {
        let Loaded { mut stored, doc } = loaded;
        let copy_limit = committed_copy_limit(&registry);
        let ttl = registry
            .config
            .lease
            .as_ref()
            .map_or(Duration::from_secs(5), |l| l.ttl);
        let granted_at = lease.map_or_else(Instant::now, |(_, at)| at);
        let stalled = Stalled {
            gauge: registry.metrics.rooms_stalled.clone(),
            on: false,
        };
        let lease_guard = lease.and_then(|(epoch, _)| {
            let node = registry.config.lease.as_ref()?.node_id.clone();
            Some(LeaseGuard {
                store: registry.store.clone(),
                doc: stored.id,
                node,
                epoch,
                armed: true,
                limit: registry.config.storage_timeout,
            })
        });
        Room {
            registry,
            name,
            doc_id: stored.id,
            fence: lease.map(|(epoch, _)| epoch),
            renewing: None,
            renew_started: granted_at,
            renew_at: granted_at + ttl / 3,
            lease_until: granted_at + ttl,
            lease_guard,
            fenced: false,
            deleted_underneath: false,
            stalled,
            draining: false,
            doc,
            awareness: AwarenessTable::default(),
            answers: SharedAnswers::default(),
            peers: HashMap::new(),
            expiries: BTreeSet::new(),
            dangling: HashSet::new(),
            withheld: Vec::new(),
            snapshot_version: stored.snapshot_version,
            last_seq: stored.last_seq(),
            stored_bytes: stored.stored_bytes(),
            queued_bytes: 0,
            applied_bytes: 0,
            since_snapshot_updates: stored.updates.len() as u64,
            since_snapshot_bytes: stored.updates.iter().map(|(_, u)| u.len() as u64).sum(),
            snapshot_failed: false,
            unencodable: false,
            queued: VecDeque::new(),
            inflight: None,
            staged: None,
            deferred_step1: HashMap::new(),
            deferred_reads: Vec::new(),
            waiters: VecDeque::new(),
            received_idx: 0,
            committed_idx: 0,
            reload_needed: None,
            unload_at: None,
            role_changes: HashMap::new(),
            // Last: it takes the snapshot and rows out of `stored`.
            committed: CommittedCopy::take(&mut stored, copy_limit),
        }
    }

    /// Runs until the room unloads, fails or shuts down. Returns true if the document was
    /// deleted (queued joins are then told so).
    async fn run(&mut self, rx: &mut mpsc::Receiver<RoomCmd>) -> bool {
        // The first joiner normally arrives at once; until then the room unloads like an
        // abandoned one would.
        self.unload_at = Some(Instant::now() + self.registry.config.unload_delay);
        let sweep_every =
            (self.registry.config.awareness_timeout / 6).max(Duration::from_millis(100));
        let mut sweep = tokio::time::interval(sweep_every);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // One keep-alive timer per room instead of one per connection: each tick asks every
        // connection to check its client is alive and ping it.
        let ping_every = self.registry.config.ping_interval;
        let mut keepalive = tokio::time::interval_at(Instant::now() + ping_every, ping_every);
        keepalive.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let shutdown = self.registry.shutdown.clone();
        // Updates received but not yet applied, in bytes, above which the room stops taking
        // commands until a commit drains them (the senders wait: `room_queue_bytes`).
        let inbound_bound = self.registry.config.room_queue_bytes as u64;
        // This room's share of `quire_room_queue_bytes`, as last reported.
        let gauge = self.registry.metrics.room_queue_bytes.clone();
        let mut reported = 0i64;
        let exit = loop {
            let queued = self.queued_bytes as i64;
            gauge.add(queued - reported);
            reported = queued;
            if let Some(seen) = self.reload_needed.take() {
                if self.inflight.is_none() {
                    if let Err(reason) = self.reload(&seen).await {
                        break Exit::Failed(reason);
                    }
                    self.maybe_start_commit();
                } else {
                    self.reload_needed = Some(seen);
                }
            }
            tokio::select! {
                res = wait_inflight(&mut self.inflight), if self.inflight.is_some() => {
                    if let Err(reason) = self.on_op_done(res).await {
                        break if self.fenced {
                            Exit::Fenced(reason)
                        } else if self.deleted_underneath {
                            Exit::DeletedUnderneath
                        } else {
                            Exit::Failed(reason)
                        };
                    }
                }
                _ = sleep_until(self.renew_at), if self.fence.is_some() && self.renewing.is_none() => {
                    self.start_renewal();
                }
                renewed = wait_renewal(&mut self.renewing), if self.renewing.is_some() => {
                    self.renewing = None;
                    if let Some(exit) = self.on_renewed(renewed) {
                        break exit;
                    }
                }
                // (A stalled room takes commands whatever it holds: it applies no new updates
                // then, and it must keep answering joins, leaves and closes.)
                cmd = rx.recv(), if self.queued_bytes < inbound_bound || self.stalled.is_on() => match cmd {
                    Some(cmd) => {
                        if let Some(exit) = self.handle(cmd) {
                            break exit;
                        }
                    }
                    None => break Exit::Shutdown,
                },
                _ = sleep_until(self.unload_at.unwrap_or_else(Instant::now)), if self.unload_at.is_some() => {
                    if self.peers.is_empty() && self.inflight.is_none() && self.staged.is_none() && self.queued.is_empty() {
                        break Exit::Unloaded;
                    }
                    // Still committing what departed peers sent; look again shortly.
                    self.unload_at = self.peers.is_empty().then(|| Instant::now() + Duration::from_millis(50));
                }
                _ = sweep.tick(), if !self.awareness.is_empty() => {
                    let now = Instant::now();
                    if let Some(gone) = self.awareness.expire(now, self.registry.config.awareness_timeout) {
                        self.broadcast(&protocol::encode_awareness(&gone), None);
                    }
                }
                _ = sleep_until(self.expiries.first().map_or_else(Instant::now, |e| e.0)), if !self.expiries.is_empty() => {
                    self.close_expired(Instant::now());
                }
                _ = keepalive.tick(), if !self.peers.is_empty() => {
                    for peer in self.peers.values() {
                        peer.tx.ping();
                    }
                }
                _ = shutdown.cancelled() => break Exit::Shutdown,
            }
        };
        gauge.sub(reported);
        self.leave(exit).await
    }

    /// What the room does on its way out.
    async fn leave(&mut self, exit: Exit) -> bool {
        match exit {
            Exit::Unloaded | Exit::Deleted => {
                // Commit what is queued (an HTTP update, say) before leaving.
                match self.drain_pipeline().await {
                    Ok(()) => self.final_snapshot().await,
                    Err(reason) => error!(%reason, "could not commit everything before unloading"),
                }
                self.release_lease().await;
                debug!("unloaded");
                matches!(exit, Exit::Deleted)
            }
            Exit::Shutdown => {
                match self.drain_pipeline().await {
                    Ok(()) => self.final_snapshot().await,
                    // The Doc may hold updates that are not committed: no snapshot of it.
                    Err(reason) => error!(%reason, "could not commit everything before shutdown"),
                }
                // Released at once, so another node can take the document without waiting
                // for the lease to expire.
                self.release_lease().await;
                self.close_all(CloseReason::new(close::GOING_AWAY, "server shutting down"));
                false
            }
            Exit::Fenced(reason) => {
                // Nothing more may be written: the new owner has the document. Clients
                // reconnect (through any node) and resync; what they had acknowledged is in
                // the log, which the new owner loaded.
                warn!(%reason, "lost the document's lease; giving the room up");
                self.registry.metrics.lease_losses.inc();
                self.close_all(CloseReason::new(
                    close::RESTART,
                    "document moved to another node, reconnect",
                ));
                false
            }
            Exit::DeletedUnderneath => {
                warn!("the storage refused an append: the document is deleted; unloading");
                self.close_all(CloseReason::new(close::DELETED, "document deleted"));
                self.release_lease().await;
                true
            }
            Exit::Failed(reason) => {
                error!(%reason, "room failed; peers will reconnect and resync");
                self.close_all(CloseReason::new(
                    close::INTERNAL,
                    "document unavailable, reconnect",
                ));
                // Another node (or this one, on the next connection) may serve the document
                // at once instead of after the lease runs out.
                self.release_lease().await;
                false
            }
        }
    }

    /// Handles one command; returns an exit if the room must stop.
    fn handle(&mut self, cmd: RoomCmd) -> Option<Exit> {
        match cmd {
            RoomCmd::Join { peer, reply } => {
                let result = self.join(peer);
                let _ = reply.send(result);
            }
            // The frame's budget goes back when this arm ends: its updates are counted in
            // `queued_bytes` from here on.
            RoomCmd::Messages { peer, msgs, .. } => {
                for msg in msgs {
                    if !self.peers.contains_key(&peer) {
                        break; // closed by the room while its messages were queued
                    }
                    self.on_message(peer, msg);
                }
                self.maybe_start_commit();
            }
            RoomCmd::Leave { peer } => self.remove_peer(peer),
            RoomCmd::Close {
                filter,
                reason,
                unload,
            } => {
                if let PeerFilter::UserBefore(user, change) = &filter {
                    let newest = self.role_changes.entry(user.clone()).or_default();
                    *newest = (*newest).max(*change);
                }
                let matching: Vec<PeerId> = self
                    .peers
                    .iter()
                    .filter(|(_, p)| {
                        let (user, token) = (p.auth.user.as_deref(), p.auth.token_id.as_deref());
                        filter.matches(user, token, p.auth.seen_change)
                    })
                    .map(|(id, _)| *id)
                    .collect();
                for id in matching {
                    self.close_peer(id, reason.clone());
                }
                if unload {
                    return Some(Exit::Deleted);
                }
            }
            RoomCmd::ReadUpdate { since, reply } => {
                if self.has_uncommitted() {
                    self.deferred_reads.push(DeferredRead::Update(since, reply));
                    self.answer_from_committed();
                } else {
                    let _ = reply.send(self.doc.transact().encode_diff_v1(&since));
                }
            }
            RoomCmd::ReadJson { reply } => {
                if self.has_uncommitted() {
                    self.deferred_reads.push(DeferredRead::Json(reply));
                    self.answer_from_committed();
                } else {
                    let _ = reply.send(doc_json(&self.doc));
                }
            }
            RoomCmd::Apply {
                raw, update, reply, ..
            } if self.stalled.is_on() => {
                drop((raw, update));
                let _ = reply.send(Err(ApplyError::Unavailable));
            }
            RoomCmd::Apply {
                raw, update, reply, ..
            } => {
                if let Err(reply) = self.enqueue(Origin::Http(reply), raw, update) {
                    if let Origin::Http(reply) = reply {
                        let _ = reply.send(Err(ApplyError::TooLarge));
                    }
                } else {
                    self.maybe_start_commit();
                }
            }
        }
        None
    }

    /// Enters the stalled state (`Some(why)`: the last append failed or timed out) or leaves
    /// it (`None`).
    fn set_stalled(&mut self, why: Option<String>) {
        match why {
            Some(why) => {
                self.registry.set_storage_error(why);
                self.stalled.set(true);
                // The reads already waiting for the commit need not wait for storage.
                self.answer_from_committed();
            }
            None => {
                if self.stalled.set(false) {
                    info!("storage answers again; the room takes updates");
                }
                self.committed.forget_view();
            }
        }
    }

    fn has_uncommitted(&self) -> bool {
        matches!(self.inflight, Some(Inflight::Append { .. }))
            || self.staged.is_some()
            || self.reload_needed.is_some()
    }

    fn join(&mut self, link: PeerLink) -> Result<(), JoinError> {
        if self.peers.len() >= self.registry.config.max_connections {
            return Err(JoinError::Full);
        }
        let PeerLink { id, auth, tx } = link;
        // The queue is empty and at least 4 long (config), so these cannot overflow (the byte
        // bound lets the first frame in whatever its size; the awareness table, if it does
        // not fit behind it, is what the client's first QueryAwareness would get anyway).
        let _ = tx.try_send(self.answers.step1(&self.doc));
        if let Some(all) = self.awareness.full_state_frame() {
            let _ = tx.try_send_answer(Answer::Awareness, all);
        }
        let expires = auth.expires_at.map(expiry_instant);
        if let Some(at) = expires {
            self.expiries.insert((at, id));
        }
        let stale = auth
            .user
            .as_deref()
            .and_then(|user| self.role_changes.get(user))
            .is_some_and(|&change| auth.seen_change < change);
        self.peers.insert(id, Peer { tx, auth, expires });
        self.unload_at = None;
        if stale {
            // Its permission was read before a role change this room has already acted on
            // (the change committed between the read and the join).
            let reason = CloseReason::new(close::FORBIDDEN, "access changed; reconnect");
            self.close_peer(id, reason);
        }
        Ok(())
    }

    /// Closes every peer whose token has expired by `now` (4401: reconnect with a new token).
    fn close_expired(&mut self, now: Instant) {
        while let Some(&(at, peer)) = self.expiries.first() {
            if at > now {
                break;
            }
            self.expiries.pop_first();
            self.registry.metrics.tokens_expired.inc();
            debug!(peer, "token expired; closing the peer");
            self.close_peer(
                peer,
                CloseReason::new(
                    close::TOKEN_EXPIRED,
                    "token expired, reconnect with a new one",
                ),
            );
        }
    }

    /// Queues an update for the next commit; gives the origin back if the document would
    /// grow past `max_doc_size`.
    fn enqueue(&mut self, origin: Origin, raw: Bytes, update: Update) -> Result<(), Origin> {
        let limit = self.registry.config.max_doc_size;
        if self.stored_bytes + self.applied_bytes + self.queued_bytes + raw.len() as u64 > limit {
            warn!(limit, "update refused: document would exceed max_doc_size");
            return Err(origin);
        }
        self.received_idx += 1;
        self.queued_bytes += raw.len() as u64;
        self.queued.push_back(Queued {
            idx: self.received_idx,
            origin,
            raw,
            update: Some(update),
        });
        Ok(())
    }

    fn on_message(&mut self, peer: PeerId, msg: PeerMsg) {
        match msg {
            PeerMsg::Update { raw, update } => {
                let can_write = self.peers.get(&peer).is_some_and(|p| p.auth.can_write);
                if !can_write {
                    // Not applied, not logged; the client is told why.
                    self.send_to(peer, protocol::encode_permission_denied("read-only access"));
                    return;
                }
                if self.stalled.is_on() {
                    // Not applied: the client keeps it and sends it again when it resyncs.
                    let why = "storage is not answering; retry later";
                    self.close_peer(peer, CloseReason::new(close::TRY_AGAIN_LATER, why));
                    return;
                }
                if self.enqueue(Origin::Peer(peer), raw, update).is_err() {
                    self.close_peer(
                        peer,
                        CloseReason::new(close::DOC_TOO_LARGE, "document size limit reached"),
                    );
                }
            }
            PeerMsg::Step1(sv) => {
                if self.has_uncommitted() {
                    self.deferred_step1.insert(peer, sv);
                    self.answer_from_committed();
                } else {
                    self.answer_step1(peer, &sv);
                }
            }
            PeerMsg::Awareness { update, raw } => {
                if self.awareness.apply(&update, peer, Instant::now()) {
                    self.broadcast(&raw, Some(peer));
                }
            }
            PeerMsg::QueryAwareness => {
                if self.answer_pending(peer, Answer::Awareness) {
                    return;
                }
                if let Some(all) = self.awareness.full_state_frame() {
                    self.send_answer(peer, Answer::Awareness, all);
                }
            }
            PeerMsg::DurableAck(raw) => {
                let newest = self.received_idx;
                if self.committed_idx >= newest {
                    self.send_ack(peer, raw);
                } else if let Some((_, Waiter::Ack(_, last_raw))) =
                    self.waiters.back_mut().filter(|(idx, w)| {
                        *idx == newest && matches!(w, Waiter::Ack(p, _) if *p == peer)
                    })
                {
                    // The same peer asked again with nothing received in between: the newer
                    // request stands for both (an echo means everything before it is
                    // committed), so a flood of requests holds one waiter, not one each.
                    *last_raw = raw;
                } else {
                    self.waiters.push_back((newest, Waiter::Ack(peer, raw)));
                }
            }
        }
    }

    /// Answers a Sync Step 1 with the Step 2 for `sv` (shared with other peers asking for the
    /// same at this version), unless the peer has not yet read its previous answer: then
    /// nothing, since that answer and the broadcasts queued after it bring the peer up to date.
    fn answer_step1(&mut self, peer: PeerId, sv: &StateVector) {
        if self.answer_pending(peer, Answer::Sync) {
            return;
        }
        let frame = self.answers.step2(&self.doc, sv, &self.registry.metrics);
        self.send_answer(peer, Answer::Sync, frame);
    }

    /// Whether `peer` still has an unread answer of this kind queued (counted as skipped).
    fn answer_pending(&self, peer: PeerId, kind: Answer) -> bool {
        let pending = self
            .peers
            .get(&peer)
            .is_some_and(|p| p.tx.answer_pending(kind));
        if pending {
            self.registry.metrics.sync_answers_skipped.inc();
        }
        pending
    }

    fn send_answer(&mut self, peer: PeerId, kind: Answer, frame: Bytes) {
        let full = match self.peers.get(&peer) {
            Some(p) => matches!(p.tx.try_send_answer(kind, frame), Err(SendError::Full)),
            None => false,
        };
        if full {
            self.overflow(peer);
        }
    }

    /// While the room is stalled, answers the reads waiting for committed state from the
    /// committed copy (the `Doc` holds the stalled batch): a joined peer gets the stalled
    /// batch as a broadcast once it commits, like any peer. Otherwise they keep waiting.
    fn answer_from_committed(&mut self) {
        if !self.stalled.is_on()
            || (self.deferred_step1.is_empty() && self.deferred_reads.is_empty())
        {
            return;
        }
        let Some(doc) = self.committed.doc() else {
            return; // no usable copy: they wait for the commit
        };
        let mut json = None;
        for read in std::mem::take(&mut self.deferred_reads) {
            match read {
                DeferredRead::Update(sv, reply) => {
                    let _ = reply.send(doc.transact().encode_diff_v1(&sv));
                }
                DeferredRead::Json(reply) => {
                    let _ = reply.send(json.get_or_insert_with(|| doc_json(doc)).clone());
                }
            }
            self.registry.metrics.stalled_reads.inc();
        }
        for (peer, sv) in std::mem::take(&mut self.deferred_step1) {
            if !self.peers.contains_key(&peer) || self.answer_pending(peer, Answer::Sync) {
                continue;
            }
            match self.committed.step2(&sv) {
                Some(frame) => {
                    self.registry.metrics.stalled_reads.inc();
                    self.send_answer(peer, Answer::Sync, frame);
                }
                // (Not after `doc()` answered; if it did, the peer waits for the commit.)
                None => {
                    self.deferred_step1.insert(peer, sv);
                }
            }
        }
    }

    /// Answers the reads that waited for the `Doc` to hold only committed state.
    fn answer_deferred(&mut self) {
        if self.has_uncommitted() {
            return;
        }
        for (peer, sv) in std::mem::take(&mut self.deferred_step1) {
            if self.peers.contains_key(&peer) {
                self.answer_step1(peer, &sv);
            }
        }
        for read in std::mem::take(&mut self.deferred_reads) {
            match read {
                DeferredRead::Update(sv, reply) => {
                    let _ = reply.send(self.doc.transact().encode_diff_v1(&sv));
                }
                DeferredRead::Json(reply) => {
                    let _ = reply.send(doc_json(&self.doc));
                }
            }
        }
    }

    /// Starts the next append if nothing is in flight (the staged batch, or the queued updates
    /// applied now), and stages a full batch if an append is in flight.
    fn maybe_start_commit(&mut self) {
        while self.reload_needed.is_none() {
            if self.inflight.is_none() {
                if let Some(staged) = self.staged.take() {
                    self.start_append(staged);
                    continue;
                }
                // The `Doc` holds only committed state: answer the reads waiting for that
                // before applying more.
                self.answer_deferred();
                if self.queued.is_empty() {
                    return;
                }
            } else if !self.may_stage() {
                return;
            }
            let Some(next) = self.apply_next_batch() else {
                return; // an update was rejected: the Doc is rebuilt first
            };
            if self.inflight.is_none() {
                self.start_append(next);
            } else {
                self.staged = Some(next);
            }
        }
    }

    /// Whether to apply the next batch now, while an append is in flight: only a full one (a
    /// partial batch may still grow, and group commit wants it large), and only if no read
    /// waits for committed state and no snapshot is due.
    fn may_stage(&self) -> bool {
        matches!(self.inflight, Some(Inflight::Append { .. }))
            && self.staged.is_none()
            && self.queued.len() >= self.registry.config.commit_batch
            && self.deferred_step1.is_empty()
            && self.deferred_reads.is_empty()
            && !self.snapshot_due()
    }

    /// Appends an applied batch (nothing in flight); an empty one (every update a duplicate)
    /// only moves `committed_idx`.
    fn start_append(&mut self, next: AppliedBatch) {
        let AppliedBatch {
            batch,
            upto_idx,
            committed_sv,
        } = next;
        if batch.is_empty() {
            self.committed_idx = upto_idx;
            self.release_waiters();
            return;
        }
        self.inflight = Some(self.spawn_append(batch, upto_idx, committed_sv, 0));
    }

    /// Applies up to `commit_batch` queued updates; `None` if one was rejected (the good ones
    /// are back in the queue and `reload_needed` is set).
    fn apply_next_batch(&mut self) -> Option<AppliedBatch> {
        let committed_sv = self.doc.transact().state_vector();
        let max = self.registry.config.commit_batch;
        let mut batch: Vec<Applied> = Vec::new();
        let mut upto_idx = self.committed_idx;
        let mut rejected = Vec::new();
        while batch.len() < max {
            let Some(q) = self.queued.pop_front() else {
                break;
            };
            upto_idx = q.idx;
            self.queued_bytes -= q.raw.len() as u64;
            let update = match q.update {
                Some(u) => Ok(u),
                None => Update::decode_v1(&q.raw).map_err(|e| e.to_string()),
            };
            // Where each client's blocks in the update start, to tell afterwards whether
            // they are what yrs left pending.
            let starts = update.as_ref().map(Update::state_vector_lower).ok();
            match update.and_then(|u| self.apply(u).map_err(|e| e.to_string())) {
                Ok(true) => {
                    if let (Origin::Peer(peer), Some(starts)) = (&q.origin, &starts) {
                        if left_pending(&self.doc, starts) {
                            self.dangling.insert(*peer);
                        }
                    }
                    batch.push(Applied {
                        idx: q.idx,
                        origin: q.origin,
                        raw: q.raw,
                    })
                }
                Ok(false) => {
                    self.registry.metrics.updates_duplicate.inc();
                    if let Origin::Http(reply) = q.origin {
                        // Waiters stay in index order (durable acks wait for later indexes).
                        let at = self.waiters.partition_point(|(idx, _)| *idx <= q.idx);
                        self.waiters.insert(at, (q.idx, Waiter::Http(reply)));
                    }
                }
                Err(e) => {
                    rejected.push((q.origin, e));
                    break;
                }
            }
        }
        if !rejected.is_empty() {
            // yrs may have integrated part of the rejected update: put the good ones back,
            // rebuild the Doc from storage, and apply them again.
            self.requeue_unapplied(batch);
            for (origin, e) in rejected {
                warn!(error = %e, "update rejected by yrs");
                self.registry.metrics.malformed_messages.inc();
                match origin {
                    Origin::Peer(peer) => {
                        self.close_peer(peer, CloseReason::new(close::MALFORMED, "invalid update"))
                    }
                    Origin::Http(reply) => {
                        let _ = reply.send(Err(ApplyError::Invalid(e)));
                    }
                }
            }
            self.reload_needed = Some(committed_sv);
            return None;
        }
        self.registry
            .metrics
            .updates_applied
            .inc_by(batch.len() as u64);
        self.applied_bytes += batch.iter().map(|a| a.raw.len() as u64).sum::<u64>();
        Some(AppliedBatch {
            batch,
            upto_idx,
            committed_sv,
        })
    }

    /// Puts updates taken from the queue back at its front, in order, to be applied again.
    fn requeue_unapplied(&mut self, batch: Vec<Applied>) {
        for a in batch.into_iter().rev() {
            self.queued_bytes += a.raw.len() as u64;
            self.queued.push_front(Queued {
                idx: a.idx,
                origin: a.origin,
                raw: a.raw,
                update: None,
            });
        }
    }

    /// [`Self::requeue_unapplied`] for a batch that was applied and counted in `applied_bytes`.
    fn requeue_applied(&mut self, batch: Vec<Applied>) {
        self.applied_bytes -= batch.iter().map(|a| a.raw.len() as u64).sum::<u64>();
        self.requeue_unapplied(batch);
    }

    /// Applies one update; true if it changed the document.
    fn apply(&mut self, update: Update) -> Result<bool, yrs::error::UpdateError> {
        // Whatever happens, the Doc may change: answers encoded before are stale.
        self.answers.invalidate();
        let mut txn = self.doc.transact_mut();
        txn.apply_update(update)?;
        // An update whose dependencies are missing is stashed by yrs, not integrated; it is new
        // information all the same and must be logged.
        Ok(!txn.insert_set().is_empty()
            || !txn.delete_set().is_empty()
            || txn.has_missing_updates())
    }

    fn spawn_append(
        &self,
        batch: Vec<Applied>,
        upto_idx: u64,
        committed_sv: StateVector,
        attempt: u32,
    ) -> Inflight {
        let store = self.registry.store.clone();
        let doc = self.doc_id;
        let fence = self.fence;
        let first_seq = self.last_seq + 1;
        let rows: Vec<Bytes> = batch.iter().map(|a| a.raw.clone()).collect();
        let (limit, metrics) = (
            self.registry.config.storage_timeout,
            self.registry.metrics.clone(),
        );
        let task: StorageOp<()> = Box::pin(async move {
            if attempt > 0 {
                sleep(commit_backoff(attempt)).await;
            }
            let append = store.append(doc, fence, first_seq, rows);
            within(limit, &metrics, "append", append).await
        });
        Inflight::Append {
            batch,
            upto_idx,
            committed_sv,
            started: Instant::now(),
            attempt,
            task,
        }
    }

    async fn on_op_done(&mut self, res: OpResult) -> Result<(), String> {
        let Some(inflight) = self.inflight.take() else {
            return Ok(());
        };
        match (inflight, res) {
            (
                Inflight::Append {
                    batch,
                    upto_idx,
                    started,
                    ..
                },
                OpResult::Append(Ok(())),
            ) => {
                self.set_stalled(None);
                let m = &self.registry.metrics;
                m.commits.inc();
                m.commit_seconds.observe(started.elapsed().as_secs_f64());
                m.updates_logged.inc_by(batch.len() as u64);
                let bytes: u64 = batch.iter().map(|a| a.raw.len() as u64).sum();
                self.applied_bytes -= bytes;
                let rows = batch.iter().map(|a| a.raw.as_ref());
                self.committed.committed(self.last_seq + 1, rows);
                self.last_seq += batch.len() as i64;
                self.stored_bytes += bytes;
                self.since_snapshot_updates += batch.len() as u64;
                self.since_snapshot_bytes += bytes;
                self.snapshot_failed = false;
                self.committed_idx = upto_idx;
                let last_seq = self.last_seq;
                for applied in batch {
                    let frame = protocol::encode_update(&applied.raw);
                    self.broadcast(&frame, applied.origin.peer());
                    if let Origin::Http(reply) = applied.origin {
                        let _ = reply.send(Ok(last_seq));
                    }
                }
                self.release_waiters();
                self.release_withheld();
            }
            (Inflight::Append { batch, .. }, OpResult::Append(Err(StorageError::Fenced))) => {
                // Not committed and never will be here: the HTTP callers see the room give up
                // (503) and the peers resend through the new owner when they resync.
                drop(batch);
                self.registry.metrics.fenced_writes.inc();
                self.fenced = true;
                return Err("an append was fenced: the lease moved to another node".into());
            }
            (Inflight::Append { batch, .. }, OpResult::Append(Err(StorageError::Deleted))) => {
                // Never committed: its senders were not acknowledged, and the document is gone.
                drop(batch);
                self.deleted_underneath = true;
                return Err("an append was refused: the document is deleted".into());
            }
            (
                Inflight::Append {
                    batch,
                    committed_sv,
                    ..
                },
                OpResult::Append(Err(StorageError::Conflict)),
            ) => {
                // Another writer took our log position: reload what is stored, then apply this
                // batch again on top of it and commit it at the new position.
                // (After an append that timed out, it may be our own earlier attempt that
                // committed late: the reload finds its updates and the batch adds nothing.)
                warn!("log position taken by another writer; reloading");
                self.registry.metrics.commit_failures.inc();
                self.set_stalled(None); // storage answered
                self.reload(&committed_sv).await?;
                // The reload put a staged batch back in the queue; this one goes before it.
                self.requeue_applied(batch);
            }
            (
                Inflight::Append {
                    batch,
                    upto_idx,
                    committed_sv,
                    attempt,
                    ..
                },
                OpResult::Append(Err(e)),
            ) => {
                // Storage is failing, or slow past `storage_timeout`: the room stalls (no new
                // updates, 1013 to their senders) and retries this batch until storage
                // answers. Nothing in it was broadcast or acknowledged.
                self.registry.metrics.commit_failures.inc();
                if attempt == 0 {
                    warn!(error = %e, "commit failed; the room stalls and retries");
                } else {
                    debug!(error = %e, attempt, "commit failed again; retrying");
                }
                self.set_stalled(Some(e.to_string()));
                if self.draining && attempt + 1 >= DRAIN_COMMIT_ATTEMPTS {
                    return Err(format!("commit failed {DRAIN_COMMIT_ATTEMPTS} times: {e}"));
                }
                self.inflight = Some(self.spawn_append(batch, upto_idx, committed_sv, attempt + 1));
                return Ok(());
            }
            (
                Inflight::Snapshot {
                    upto_seq,
                    size,
                    data,
                    ..
                },
                OpResult::Snapshot(res),
            ) => match res {
                Ok(SnapshotOutcome::Written { new_version }) => {
                    self.registry.metrics.snapshots.inc();
                    self.committed.snapshotted(data, upto_seq);
                    debug!(upto_seq, size, "snapshot written");
                    self.snapshot_version = new_version;
                    let logged_after = (self.last_seq - upto_seq) as u64;
                    self.since_snapshot_updates = logged_after;
                    self.since_snapshot_bytes = 0;
                    self.stored_bytes = size;
                }
                Ok(SnapshotOutcome::Conflict) => {
                    self.registry.metrics.snapshot_conflicts.inc();
                    warn!(
                        expected_version = self.snapshot_version,
                        "snapshot refused: the document row changed; reloading"
                    );
                    // A batch is staged only behind an append, never behind a snapshot, so
                    // the Doc is exactly what peers may have seen.
                    debug_assert!(self.staged.is_none());
                    let sv = self.doc.transact().state_vector();
                    self.reload(&sv).await?;
                }
                Err(StorageError::Fenced) => {
                    self.registry.metrics.fenced_writes.inc();
                    self.fenced = true;
                    return Err("a snapshot was fenced: the lease moved to another node".into());
                }
                Err(e) => {
                    // The log still holds everything; try again after the next commit.
                    warn!(error = %e, "snapshot write failed");
                    self.snapshot_failed = true;
                }
            },
            (_, _) => return Err("internal: operation result does not match".into()),
        }
        if self.staged.is_none() && self.snapshot_due() {
            self.inflight = self.spawn_snapshot();
        }
        if self.inflight.is_some() {
            self.answer_deferred();
        } else {
            self.maybe_start_commit();
        }
        Ok(())
    }

    fn snapshot_due(&self) -> bool {
        let c = &self.registry.config;
        !self.snapshot_failed
            && self.reload_needed.is_none()
            && !(self.unencodable && self.doc.transact().has_missing_updates())
            && snapshot_due(
                c,
                self.since_snapshot_updates,
                self.since_snapshot_bytes,
                self.stored_bytes.saturating_sub(self.since_snapshot_bytes),
            )
    }

    /// Encodes the whole document (v2, compact) and writes it with the version check. Called
    /// only when nothing is in flight, so the `Doc` is exactly the committed state.
    ///
    /// `None` if yrs cannot encode it: a pending update (one waiting on missing dependencies)
    /// that yrs cannot merge makes `encode_state_as_update_v2` panic (found by fuzzing: two
    /// small updates from a writer did it, and the panic killed the room). So no snapshot is
    /// taken while anything is pending (the log keeps every update), and a panic in yrs all the
    /// same is caught.
    fn spawn_snapshot(&mut self) -> Option<Inflight> {
        // Not even tried while an update is pending: that is when yrs may panic (and a panic
        // under the fuzzer aborts, caught or not).
        if self.doc.transact().has_missing_updates() {
            self.unencodable = true;
            return None;
        }
        let doc = &self.doc;
        let encoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            doc.transact()
                .encode_state_as_update_v2(&StateVector::default())
        }));
        let data = match encoded {
            Ok(data) => data,
            Err(_) => {
                warn!("the document cannot be encoded while an update is pending; no snapshot until it integrates");
                self.unencodable = true;
                return None;
            }
        };
        self.unencodable = false;
        let size = data.len() as u64;
        let kept = Bytes::copy_from_slice(&data);
        let store = self.registry.store.clone();
        let (doc, version, upto_seq) = (self.doc_id, self.snapshot_version, self.last_seq);
        let fence = self.fence;
        let (limit, metrics) = (
            self.registry.config.storage_timeout,
            self.registry.metrics.clone(),
        );
        let task = Box::pin(async move {
            let write = store.write_snapshot(doc, fence, version, data, upto_seq);
            within(limit, &metrics, "snapshot", write).await
        });
        Some(Inflight::Snapshot {
            upto_seq,
            size,
            data: kept,
            task,
        })
    }

    /// Replaces the `Doc` with what storage holds and sends peers what they lack relative to
    /// `seen` (the state they may have been sent).
    async fn reload(&mut self, seen: &StateVector) -> Result<(), String> {
        // A staged batch is in the `Doc` being replaced: apply it again later.
        if let Some(staged) = self.staged.take() {
            self.requeue_applied(staged.batch);
        }
        let loaded = load(&self.registry, &self.name)
            .await
            .map_err(|e| format!("reload failed: {e}"))?;
        let diff = loaded.doc.transact().encode_diff_v1(seen);
        let Loaded { mut stored, doc } = loaded;
        self.doc = doc;
        self.answers.invalidate();
        self.snapshot_version = stored.snapshot_version;
        self.last_seq = stored.last_seq();
        self.stored_bytes = stored.stored_bytes();
        self.since_snapshot_updates = stored.updates.len() as u64;
        self.since_snapshot_bytes = stored.updates.iter().map(|(_, u)| u.len() as u64).sum();
        self.committed = CommittedCopy::take(&mut stored, committed_copy_limit(&self.registry));
        if !is_empty_update(&diff) {
            self.broadcast(&protocol::encode_update(&diff), None);
        }
        info!(
            snapshot_version = self.snapshot_version,
            last_seq = self.last_seq,
            "reloaded from storage"
        );
        Ok(())
    }

    /// Commits everything queued and waits for it (unload and shutdown paths).
    async fn drain_pipeline(&mut self) -> Result<(), String> {
        // Leaving: a commit that keeps failing is given up after a few attempts instead of
        // retried until storage answers (its senders resend when they resync elsewhere).
        self.draining = true;
        loop {
            if let Some(seen) = self.reload_needed.take() {
                self.reload(&seen).await?;
            }
            self.maybe_start_commit();
            if self.inflight.is_none() {
                return Ok(());
            }
            let res = wait_inflight(&mut self.inflight).await;
            self.on_op_done(res).await?;
        }
    }

    /// A snapshot before unloading, so the next load replays nothing.
    async fn final_snapshot(&mut self) {
        if self.inflight.is_some()
            || self.since_snapshot_updates == 0
            || self.snapshot_failed
            || self.unencodable
        {
            return;
        }
        self.inflight = self.spawn_snapshot();
        while self.inflight.is_some() {
            let res = wait_inflight(&mut self.inflight).await;
            if let Err(e) = self.on_op_done(res).await {
                warn!(error = %e, "final snapshot failed; the log still holds every update");
                return;
            }
        }
    }

    fn start_renewal(&mut self) {
        let (Some(epoch), Some(lease)) = (self.fence, self.registry.config.lease.clone()) else {
            return;
        };
        let store = self.registry.store.clone();
        let doc = self.doc_id;
        let started = Instant::now();
        // A renewal that has not answered when the lease runs out counts as failed: a stalled
        // connection must not keep the room alive after another node may have the document.
        let deadline = self.lease_until.max(started);
        self.renewing = Some(Box::pin(async move {
            match tokio::time::timeout_at(
                deadline,
                store.renew_lease(doc, &lease.node_id, epoch, lease.ttl),
            )
            .await
            {
                Ok(renewed) => renewed,
                Err(_) => Err(StorageError::Invalid(
                    "lease renewal did not answer before the lease ran out".into(),
                )),
            }
        }));
        self.renew_started = started;
        self.renew_at = started + lease.ttl / 3;
    }

    /// A renewal's outcome: keep going, retry soon, or give the room up.
    fn on_renewed(&mut self, renewed: Result<bool, StorageError>) -> Option<Exit> {
        let ttl = self.registry.config.lease.as_ref()?.ttl;
        match renewed {
            Ok(true) => {
                self.lease_until = self.renew_started + ttl;
                None
            }
            Ok(false) => Some(Exit::Fenced(
                "lease renewal refused: another node holds the document".into(),
            )),
            Err(e) if Instant::now() + ttl / 10 < self.lease_until => {
                warn!(error = %e, "lease renewal failed; retrying");
                self.renew_at = Instant::now() + ttl / 10;
                None
            }
            Err(e) => Some(Exit::Fenced(format!(
                "the lease ran out while renewals failed: {e}"
            ))),
        }
    }

    async fn release_lease(&mut self) {
        // A renewal still in flight is abandoned: the release ends the lease either way.
        self.renewing = None;
        if let Some(guard) = &mut self.lease_guard {
            guard.release().await;
        }
    }

    fn release_waiters(&mut self) {
        while let Some((idx, _)) = self.waiters.front() {
            if *idx > self.committed_idx {
                break;
            }
            let Some((_, waiter)) = self.waiters.pop_front() else {
                break;
            };
            match waiter {
                Waiter::Ack(peer, raw) => self.send_ack(peer, raw),
                Waiter::Http(reply) => {
                    let _ = reply.send(Ok(self.last_seq));
                }
            }
        }
    }

    /// Echoes a durable acknowledgement, or withholds it while the peer has an update
    /// pending on missing dependencies.
    fn send_ack(&mut self, peer: PeerId, raw: Bytes) {
        if self.dangling.contains(&peer) {
            // Only the newest request is kept: its echo stands for the earlier ones.
            self.withheld.retain(|(p, _)| *p != peer);
            self.withheld.push((peer, raw));
        } else {
            self.send_to(peer, raw);
        }
    }

    /// After a commit: if the document holds nothing pending (and no staged batch that
    /// might be what resolved it), the withheld acknowledgements go out.
    fn release_withheld(&mut self) {
        if self.dangling.is_empty()
            || self.staged.is_some()
            || self.doc.transact().has_missing_updates()
        {
            return;
        }
        self.dangling.clear();
        for (peer, raw) in std::mem::take(&mut self.withheld) {
            self.send_to(peer, raw);
        }
    }

    /// Sends `frame` to every peer but `except`. A peer whose queue is full is closed with
    /// 1013: it will reconnect and resync, so nothing is dropped silently.
    fn broadcast(&mut self, frame: &Bytes, except: Option<PeerId>) {
        let mut overflowed = Vec::new();
        for (id, peer) in &self.peers {
            if Some(*id) == except {
                continue;
            }
            if let Err(SendError::Full) = peer.tx.try_send(frame.clone()) {
                overflowed.push(*id);
            }
        }
        for id in overflowed {
            self.overflow(id);
        }
    }

    fn send_to(&mut self, peer: PeerId, frame: Bytes) {
        let full = match self.peers.get(&peer) {
            Some(p) => matches!(p.tx.try_send(frame), Err(SendError::Full)),
            None => false,
        };
        if full {
            self.overflow(peer);
        }
    }

    fn overflow(&mut self, peer: PeerId) {
        self.registry.metrics.broadcast_overflows.inc();
        warn!(
            peer,
            "outbound queue full; closing the peer (it will resync)"
        );
        self.close_peer(
            peer,
            CloseReason::new(close::TRY_AGAIN_LATER, "outbound queue full; reconnect"),
        );
    }

    /// Tells a peer's connection to close and forgets the peer.
    fn close_peer(&mut self, peer: PeerId, reason: CloseReason) {
        if let Some(p) = self.peers.get(&peer) {
            p.tx.kill(reason);
        }
        self.remove_peer(peer);
    }

    fn remove_peer(&mut self, peer: PeerId) {
        let Some(gone) = self.peers.remove(&peer) else {
            return;
        };
        if let Some(at) = gone.expires {
            self.expiries.remove(&(at, peer));
        }
        if self.dangling.remove(&peer) {
            self.withheld.retain(|(p, _)| *p != peer);
        }
        self.deferred_step1.remove(&peer);
        if let Some(removal) = self.awareness.remove_peer(peer, Instant::now()) {
            self.broadcast(&protocol::encode_awareness(&removal), None);
        }
        if self.peers.is_empty() {
            self.unload_at = Some(Instant::now() + self.registry.config.unload_delay);
        }
    }

    fn close_all(&mut self, reason: CloseReason) {
        for (_, peer) in self.peers.drain() {
            peer.tx.kill(reason.clone());
        }
        self.expiries.clear();
    }
}

/// A storage operation in flight. It is polled by the room itself (not spawned): the room's
/// `select!` keeps it and resumes it, so a commit costs no task of its own.
type StorageOp<T> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<T, StorageError>> + Send>>;

async fn wait_inflight(inflight: &mut Option<Inflight>) -> OpResult {
    match inflight {
        Some(Inflight::Append { task, .. }) => OpResult::Append(task.as_mut().await),
        Some(Inflight::Snapshot { task, .. }) => OpResult::Snapshot(task.as_mut().await),
        None => std::future::pending().await,
    }
}

async fn wait_renewal(renewing: &mut Option<StorageOp<bool>>) -> Result<bool, StorageError> {
    match renewing {
        Some(task) => task.as_mut().await,
        None => std::future::pending().await,
    }
}

/// Whether a snapshot is due, given what was logged since the last one and that snapshot's
/// size: by bytes logged at once, by update count only once the log is also a fair share of
/// the snapshot (re-encoding a large document after every `snapshot_updates` small updates
/// would write far more snapshot than log).
fn snapshot_due(
    c: &crate::config::RoomConfig,
    updates: u64,
    log_bytes: u64,
    snapshot_size: u64,
) -> bool {
    log_bytes >= c.snapshot_bytes
        || (updates >= c.snapshot_updates
            && u128::from(log_bytes) * 100
                >= u128::from(snapshot_size) * u128::from(c.snapshot_log_percent))
}

/// Whether the `Doc` holds pending (unintegrated) blocks of an update whose clients' blocks
/// start at `starts`: blocks of one of those clients at or after its start. (Client ids are
/// not authenticated in Yjs, so a peer writing under another's id could make it look
/// pending; it would only delay that peer's durable acknowledgements.)
fn left_pending(doc: &Doc, starts: &StateVector) -> bool {
    let txn = doc.transact();
    let Some(pending) = txn.store().pending_update() else {
        return false;
    };
    let held = pending.update.state_vector_lower();
    starts
        .iter()
        .any(|(client, start)| held.get(client) >= *start && held.contains_client(client))
}

/// A Yjs v1 update with no structs and an empty delete set.
fn is_empty_update(update: &[u8]) -> bool {
    update == [0, 0]
}

/// The document's root types as JSON. Roots loaded from updates have no declared type, so
/// the type is inferred from the content the way yrs does (text, array or map).
pub(crate) fn doc_json(doc: &Doc) -> serde_json::Value {
    use yrs::types::AsPrelim;
    use yrs::types::ToJson;
    use yrs::{ArrayRef, In, MapRef, Out, TextRef, XmlFragmentRef};
    let txn = doc.transact();
    let mut out = serde_json::Map::new();
    for (name, root) in txn.root_refs() {
        let typed = match &root {
            Out::UndefinedRef(branch) => match root.as_prelim(&txn) {
                In::Text(_) => Out::YText(TextRef::from(*branch)),
                In::Array(_) => Out::YArray(ArrayRef::from(*branch)),
                In::Map(_) => Out::YMap(MapRef::from(*branch)),
                _ => Out::YXmlFragment(XmlFragmentRef::from(*branch)),
            },
            _ => root.clone(),
        };
        let json = serde_json::to_value(typed.to_json(&txn)).unwrap_or(serde_json::Value::Null);
        out.insert(name.to_owned(), json);
    }
    serde_json::Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::{snapshot_due, LeaseGuard};
    use crate::close;
    use crate::room::{CloseReason, DocName, PeerAuth, PeerFilter, Registry, RoomCmd};
    use crate::storage::LeaseGrant;
    use std::sync::Arc;
    use std::time::Duration;

    /// Settings with an in-memory SQLite database.
    fn memory_config() -> crate::config::Config {
        crate::config::Config {
            database_url: "sqlite::memory:".into(),
            ..crate::config::Config::default()
        }
    }

    /// A room that panics drops its lease guard while unwinding: the lease is released, so
    /// another node is granted the document at once (the lease here would last an hour).
    /// A peer whose permission was read before a role change the room has already acted on
    /// (the change committed between the read and the join) is closed as it joins; one read
    /// after the change stays.
    #[tokio::test]
    async fn a_peer_authorized_before_a_role_change_the_room_acted_on_is_closed_on_joining() {
        let config = memory_config();
        let stores = crate::open_stores(&config).await.expect("stores");
        let shutdown = tokio_util::sync::CancellationToken::new();
        let registry = Registry::new(
            stores.docs.clone(),
            Arc::new(crate::metrics::Metrics::new()),
            config.room.clone(),
            config.limits.room_queue,
            shutdown.clone(),
        );
        let name = DocName::parse("roles").expect("name");
        let ann = |seen_change| PeerAuth {
            user: Some("ann".into()),
            can_write: true,
            seen_change,
            ..PeerAuth::default()
        };
        let peer = crate::ws::next_peer_id();
        let (room, _rx) = crate::ws::join_room(&registry, &name, peer, ann(0))
            .await
            .expect("join");
        let close = RoomCmd::Close {
            filter: PeerFilter::UserBefore("ann".into(), 5),
            reason: CloseReason::new(close::FORBIDDEN, "access changed; reconnect"),
            unload: false,
        };
        room.command(close).await.expect("close");

        let late = crate::ws::next_peer_id();
        let (_, late_rx) = crate::ws::join_room(&registry, &name, late, ann(4))
            .await
            .expect("join");
        let reason = tokio::time::timeout(Duration::from_secs(5), late_rx.killed())
            .await
            .expect("closed at once");
        assert_eq!(reason.code, close::FORBIDDEN);

        let fresh = crate::ws::next_peer_id();
        let (_, fresh_rx) = crate::ws::join_room(&registry, &name, fresh, ann(5))
            .await
            .expect("join");
        let closed = tokio::time::timeout(Duration::from_millis(300), fresh_rx.killed()).await;
        assert!(closed.is_err(), "a peer authorized after the change stays");
        shutdown.cancel();
    }

    #[tokio::test]
    async fn a_room_dropped_without_releasing_its_lease_releases_it() {
        let config = memory_config();
        let stores = crate::open_stores(&config).await.expect("stores");
        let store = stores.docs;
        let doc = store.load("d").await.expect("load").id;
        let hour = Duration::from_secs(3600);
        let Ok(LeaseGrant::Granted { epoch }) = store.acquire_lease(doc, "a", hour).await else {
            panic!("granted");
        };
        let guard = LeaseGuard {
            store: store.clone(),
            doc,
            node: "a".into(),
            epoch,
            armed: true,
            limit: Duration::from_secs(5),
        };
        let room = tokio::spawn(async move {
            let _guard = guard;
            panic!("a room panics");
        });
        assert!(room.await.is_err(), "the task panicked");
        let mut granted = false;
        for _ in 0..200 {
            if let Ok(LeaseGrant::Granted { .. }) = store.acquire_lease(doc, "b", hour).await {
                granted = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(granted, "node b is granted the document at once");
    }
    use crate::config::RoomConfig;

    fn config(updates: u64, bytes: u64, percent: u64) -> RoomConfig {
        let mut c = crate::config::Settings::default().resolve().room;
        c.snapshot_updates = updates;
        c.snapshot_bytes = bytes;
        c.snapshot_log_percent = percent;
        c
    }

    #[test]
    fn a_snapshot_by_update_count_waits_for_a_fair_share_of_log() {
        let c = config(1000, 4 << 20, 50);
        // A new document (no snapshot yet): the count alone decides.
        assert!(!snapshot_due(&c, 999, 30_000, 0));
        assert!(snapshot_due(&c, 1000, 30_000, 0));
        // A small document: 1,000 updates of 30 bytes are more than half its snapshot.
        assert!(snapshot_due(&c, 1000, 30_000, 20_000));
        // A large one: the same log is a seventh of it, so not yet...
        assert!(!snapshot_due(&c, 1000, 30_000, 210_000));
        assert!(!snapshot_due(&c, 3000, 104_999, 210_000));
        // ... until the log reaches half of it.
        assert!(snapshot_due(&c, 3500, 105_000, 210_000));
        // Bytes logged decide alone, whatever the count.
        assert!(snapshot_due(&c, 1, 4 << 20, 64 << 20));
    }

    #[test]
    fn zero_percent_is_the_plain_update_count() {
        let c = config(10, 4 << 20, 0);
        assert!(!snapshot_due(&c, 9, 1, u64::MAX));
        assert!(snapshot_due(&c, 10, 1, u64::MAX));
    }
}
