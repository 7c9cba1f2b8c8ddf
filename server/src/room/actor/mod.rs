//! The room task: applies updates, commits them to the log, broadcasts them, snapshots.
//!
//! The pipeline keeps one rule: **no peer ever receives state that is not committed**.
//! - Updates arrive in `Pipeline::queued`, unapplied.
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
//! - Snapshots are written between appends, when the `Doc` is exactly the committed state. A
//!   large document's snapshot is encoded on a blocking thread from the committed copy while
//!   appends go on, and written at the next free slot (`snapshots.rs`).
//! - While storage is stalled (an append failed or passed its deadline and is being retried),
//!   the waiting reads are answered from the committed copy (`committed.rs`) instead.
//!
//! Following one update: a peer's frame arrives in [`Room::handle`] (this file), goes to
//! `peers.rs` (`on_message`: the peer's rights and rates), then `pipeline.rs` (queued,
//! applied in a batch; `held.rs` when its dependencies have not arrived), then `commit.rs`
//! (the append in flight; on commit, broadcast through `peers.rs` and acknowledged). The types
//! an update takes on the way are in `update.rs`; the lease the appends carry is `lease.rs`'s;
//! `snapshots.rs`, `versions.rs`, `reads.rs` and `edits.rs` act between commits;
//! `lifecycle.rs` loads the room and sees it out.

mod commit;
mod edits;
mod held;
mod lease;
mod lifecycle;
mod peers;
mod pipeline;
mod reads;
mod snapshots;
mod update;
mod versions;

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio::time::{sleep_until, Duration, Instant};
use yrs::Doc;

use super::answers::SharedAnswers;
use super::committed::CommittedCopy;
use super::{ApplyCmd, DocName, Registry, RoomCmd};
use crate::storage::Epoch;
use commit::wait_inflight;
use lease::{wait_renewal, Lease};
use lifecycle::{committed_copy_limit, load, Loaded};
use peers::Peers;
use pipeline::Pipeline;
use reads::Reads;
use snapshots::Snapshots;
use versions::VersionClock;

pub(super) use lifecycle::run;
pub use reads::doc_json;
pub(crate) use update::Changes;

/// A document's committed state straight from storage (the snapshot and the log after it,
/// replayed into a fresh `Doc`), within `storage_timeout`; `None` if it is deleted. What a
/// room would answer a read with once nothing uncommitted is in its `Doc`.
pub(super) async fn load_committed(
    registry: &Registry,
    name: &DocName,
) -> Result<Option<Doc>, String> {
    let loaded = load(registry, name).await.map_err(|e| e.to_string())?;
    Ok((!loaded.stored.deleted).then_some(loaded.doc))
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

/// The room's periodic timers.
struct Timers {
    /// Expires awareness states of clients that stopped renewing them.
    sweep: tokio::time::Interval,
    /// One keep-alive timer per room instead of one per connection: each tick asks every
    /// connection to check its client is alive and ping it.
    keepalive: tokio::time::Interval,
}

impl Timers {
    fn new(config: &crate::config::RoomConfig) -> Timers {
        use tokio::time::MissedTickBehavior::Delay;
        let sweep_every = (config.awareness_timeout / 6).max(Duration::from_millis(100));
        let mut sweep = tokio::time::interval(sweep_every);
        sweep.set_missed_tick_behavior(Delay);
        let ping_every = config.ping_interval;
        let mut keepalive = tokio::time::interval_at(Instant::now() + ping_every, ping_every);
        keepalive.set_missed_tick_behavior(Delay);
        Timers { sweep, keepalive }
    }
}

/// The room's state. The parts of the actor each own a group of it, defined in its file with
/// the types it holds: `lease` (`lease.rs`), `pipeline` (updates from arrival to commit:
/// `pipeline.rs`, and `commit.rs` for its storage slot and stall), `peers` (`peers.rs`),
/// `snapshots` (`snapshots.rs`), `versions` (`versions.rs`) and `reads` (`reads.rs`); what
/// they all use is here.
struct Room {
    registry: Arc<Registry>,
    name: DocName,
    doc_id: i64,
    doc: Doc,
    /// The committed state as storage holds it, for reads while the room is stalled.
    committed: CommittedCopy,
    /// Sync answers encoded for the current version of the `Doc`, shared between peers.
    answers: SharedAnswers,
    /// Highest committed log sequence number.
    last_seq: i64,
    /// Bytes stored for the document (snapshot plus log since), for `max_doc_size`.
    stored_bytes: u64,
    /// When the room unloads if it is still empty then.
    unload_at: Option<Instant>,
    /// What the room reports of itself (the admin dashboard), kept current by [`Room::report`].
    stats: Arc<crate::room::stats::RoomStats>,
    lease: Lease,
    pipeline: Pipeline,
    peers: Peers,
    snapshots: Snapshots,
    /// Commits since the last automatic version (`versions.rs`).
    versions: VersionClock,
    reads: Reads,
}

impl Room {
    fn new(
        registry: Arc<Registry>,
        name: DocName,
        loaded: Loaded,
        lease: Option<(Epoch, Instant)>,
        stats: Arc<crate::room::stats::RoomStats>,
    ) -> Room {
        let Loaded {
            mut stored,
            doc,
            repair,
        } = loaded;
        let copy_limit = committed_copy_limit(&registry);
        let mut snapshots = Snapshots::new(&stored);
        snapshots.repair = repair;
        let room = Room {
            lease: Lease::new(&registry, stored.id, lease),
            pipeline: Pipeline::new(&registry),
            snapshots,
            registry,
            name,
            doc_id: stored.id,
            doc,
            answers: SharedAnswers::default(),
            last_seq: stored.last_seq(),
            stored_bytes: stored.stored_bytes(),
            unload_at: None,
            stats,
            peers: Peers::default(),
            versions: VersionClock::default(),
            reads: Reads::default(),
            // Last: it takes the snapshot and rows out of `stored`.
            committed: CommittedCopy::take(&mut stored, copy_limit),
        };
        use std::sync::atomic::Ordering::Relaxed;
        let stats = &room.stats;
        stats.loaded_at.store(crate::storage::now_ms(), Relaxed);
        stats.epoch.store(room.lease.fence.unwrap_or(0), Relaxed);
        room.report();
        room
    }

    /// Publishes the room's sizes and peer count to its [`RoomStats`](crate::room::stats).
    fn report(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        self.stats
            .peers
            .store(self.peers.by_id.len() as u64, Relaxed);
        self.stats.stored_bytes.store(self.stored_bytes, Relaxed);
        self.stats
            .log_rows
            .store(self.snapshots.since_updates, Relaxed);
    }

    /// Runs until the room unloads, fails or shuts down. Returns true if the document was
    /// deleted (queued joins are then told so).
    async fn run(&mut self, rx: &mut mpsc::Receiver<RoomCmd>) -> bool {
        // The first joiner normally arrives at once; until then the room unloads like an
        // abandoned one would.
        self.unload_at = Some(Instant::now() + self.registry.config.unload_delay);
        let mut timers = Timers::new(&self.registry.config);
        // This room's share of `quire_room_queue_bytes`, as last reported.
        let gauge = self.registry.metrics.room_queue_bytes.clone();
        let mut reported = 0i64;
        // A document loaded with rows set aside is snapshotted at once (`Snapshots::repair`).
        if self.pipeline.inflight.is_none() && self.snapshot_due() {
            self.start_snapshot();
        }
        let exit = loop {
            let queued = self.pipeline.queued_bytes as i64;
            gauge.add(queued - reported);
            reported = queued;
            if let Some(seen) = self.pipeline.reload_needed.take() {
                if self.pipeline.inflight.is_none() {
                    if let Err(reason) = self.reload(&seen).await {
                        break Exit::Failed(reason);
                    }
                    self.maybe_start_commit();
                } else {
                    self.pipeline.reload_needed = Some(seen);
                }
            }
            if let Some(exit) = self.next_event(rx, &mut timers).await {
                break exit;
            }
        };
        gauge.sub(reported);
        self.leave(exit).await
    }

    /// Waits for the next thing to happen (a storage result, a lease renewal, a command, a
    /// timer) and handles it; returns an exit if the room must stop. The one place the room
    /// waits: everything it owns is touched only from here, one event at a time.
    async fn next_event(
        &mut self,
        rx: &mut mpsc::Receiver<RoomCmd>,
        timers: &mut Timers,
    ) -> Option<Exit> {
        let shutdown = self.registry.shutdown.clone();
        // Updates received but not yet applied, in bytes, above which the room stops taking
        // commands until a commit drains them (the senders wait: `room_queue_bytes`).
        // (A stalled room takes commands whatever it holds: it applies no new updates then,
        // and it must keep answering joins, leaves and closes.)
        let take_commands = self.pipeline.queued_bytes
            < self.registry.config.room_queue_bytes as u64
            || self.pipeline.stalled.is_on();
        let unload_at = self.unload_at.unwrap_or_else(Instant::now);
        let next_expiry = self
            .peers
            .expiries
            .first()
            .map_or_else(Instant::now, |e| e.0);
        let version_due = self.version_due_at();
        let awareness_due = self.peers.awareness_due;
        let answers_due = self.answers.release_due();
        let held_due = self.held_due();
        tokio::select! {
            res = wait_inflight(&mut self.pipeline.inflight), if self.pipeline.inflight.is_some() => {
                let reason = self.on_op_done(res).await.err()?;
                Some(if self.lease.fenced {
                    Exit::Fenced(reason)
                } else if self.pipeline.deleted_underneath {
                    Exit::DeletedUnderneath
                } else {
                    Exit::Failed(reason)
                })
            }
            encoded = snapshots::wait_encoding(&mut self.snapshots.encoding), if self.snapshots.encoding.is_some() => {
                self.on_encoded(encoded);
                None
            }
            _ = sleep_until(self.lease.renew_at), if self.lease.fence.is_some() && self.lease.renewing.is_none() => {
                self.lease.start_renewal(&self.registry, self.doc_id);
                None
            }
            renewed = wait_renewal(&mut self.lease.renewing), if self.lease.renewing.is_some() => {
                self.lease.on_renewed(&self.registry, renewed).err().map(Exit::Fenced)
            }
            cmd = rx.recv(), if take_commands => match cmd {
                Some(cmd) => self.handle(cmd),
                None => Some(Exit::Shutdown),
            },
            _ = sleep_until(unload_at), if self.unload_at.is_some() => self.on_unload_due(),
            _ = sleep_until(version_due.unwrap_or_else(Instant::now)), if version_due.is_some() => {
                self.on_version_due();
                None
            }
            _ = timers.sweep.tick(), if !self.peers.awareness.is_empty() => {
                let timeout = self.registry.config.awareness_timeout;
                let grace = self.registry.config.presence_grace;
                if let Some(gone) = self.peers.awareness.expire(Instant::now(), timeout, grace) {
                    self.relay_awareness(gone, None);
                }
                None
            }
            _ = sleep_until(awareness_due.unwrap_or_else(Instant::now)), if awareness_due.is_some() => {
                self.flush_awareness();
                None
            }
            _ = sleep_until(answers_due.unwrap_or_else(Instant::now)), if answers_due.is_some() => {
                self.answers.release(Instant::now());
                None
            }
            _ = sleep_until(held_due.unwrap_or_else(Instant::now)), if held_due.is_some() => {
                self.expire_held(Instant::now());
                None
            }
            _ = sleep_until(next_expiry), if !self.peers.expiries.is_empty() => {
                self.close_expired(Instant::now());
                None
            }
            _ = timers.keepalive.tick(), if !self.peers.by_id.is_empty() => {
                for peer in self.peers.by_id.values() {
                    peer.tx.ping();
                }
                None
            }
            _ = shutdown.cancelled() => Some(Exit::Shutdown),
        }
    }

    /// The room has had no peers for `unload_delay`: it unloads once what departed peers sent
    /// is committed.
    fn on_unload_due(&mut self) -> Option<Exit> {
        if self.peers.by_id.is_empty()
            && self.pipeline.inflight.is_none()
            && self.pipeline.staged.is_none()
            && self.pipeline.queued.is_empty()
        {
            return Some(Exit::Unloaded);
        }
        // Still committing what departed peers sent; look again shortly.
        self.unload_at = self
            .peers
            .by_id
            .is_empty()
            .then(|| Instant::now() + Duration::from_millis(50));
        None
    }

    /// Handles one command; returns an exit if the room must stop.
    fn handle(&mut self, cmd: RoomCmd) -> Option<Exit> {
        match cmd {
            RoomCmd::Join { peer, reply } => {
                let result = self.join(*peer);
                let _ = reply.send(result);
            }
            // The frame's budget goes back when this arm ends: its updates are counted in
            // `queued_bytes` from here on.
            RoomCmd::Messages { peer, msgs, .. } => {
                for msg in msgs {
                    if !self.peers.by_id.contains_key(&peer) {
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
                self.close_matching(&filter, *reason);
                if unload {
                    return Some(Exit::Deleted);
                }
            }
            RoomCmd::ReadUpdate { since, reply } => self.read_update(since, reply),
            RoomCmd::ReadJson { reply } => self.read_json(reply),
            RoomCmd::CommittedSeq { reply } => {
                let _ = reply.send(self.committed.seq());
            }
            RoomCmd::ReadCommitted { reply } => {
                if self.pipeline.stalled.is_on() {
                    self.registry.metrics.stalled_reads.inc();
                }
                let _ = reply.send(self.committed.source());
            }
            RoomCmd::Apply(apply) => {
                let ApplyCmd {
                    raw,
                    update,
                    reply,
                    author,
                    then,
                    ..
                } = *apply;
                if then.is_empty() {
                    self.apply_from_http(raw, update, reply, author);
                } else {
                    self.apply_together(author, raw, update, then, reply);
                }
            }
            RoomCmd::Edit(edit) => self.edit_from_http(*edit),
            RoomCmd::Reauth { peer, auth, reply } => {
                let _ = reply.send(self.reauth(peer, *auth));
            }
            RoomCmd::Stateless { payload, reply } => {
                let _ = reply.send(self.send_stateless(&payload));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::lease::LeaseGuard;
    use super::snapshots::snapshot_due;
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

    /// A registry of rooms on an in-memory SQLite database, and the token that stops them.
    async fn memory_registry() -> (Arc<Registry>, tokio_util::sync::CancellationToken) {
        let config = memory_config();
        let stores = crate::startup::open_stores(&config).await.expect("stores");
        let shutdown = tokio_util::sync::CancellationToken::new();
        let registry = Registry::new(
            stores.docs.clone(),
            Arc::new(crate::metrics::Metrics::new()),
            config.room.clone(),
            shutdown.clone(),
        );
        (registry, shutdown)
    }

    /// A peer whose permission was read before a role change the room has already acted on
    /// (the change committed between the read and the join) is closed as it joins; one read
    /// after the change stays.
    #[tokio::test]
    async fn a_peer_authorized_before_a_role_change_the_room_acted_on_is_closed_on_joining() {
        let (registry, shutdown) = memory_registry().await;
        let name = DocName::parse("roles").expect("name");
        let ann = |seen_change| PeerAuth {
            user: Some("ann".into()),
            can_write: true,
            seen_change,
            ..PeerAuth::default()
        };
        let peer = crate::room::join::next_peer_id();
        let (room, _rx) = crate::room::join::join_room(&registry, &name, peer, ann(0))
            .await
            .expect("join");
        let close = RoomCmd::Close {
            filter: PeerFilter::UserBefore("ann".into(), 5),
            reason: Box::new(CloseReason::new(
                close::FORBIDDEN,
                "access changed; reconnect",
            )),
            unload: false,
        };
        room.command(close).await.expect("close");

        let late = crate::room::join::next_peer_id();
        let (_, late_rx) = crate::room::join::join_room(&registry, &name, late, ann(4))
            .await
            .expect("join");
        let reason = tokio::time::timeout(Duration::from_secs(5), late_rx.killed())
            .await
            .expect("closed at once");
        assert_eq!(reason.code, close::FORBIDDEN);

        let fresh = crate::room::join::next_peer_id();
        let (_, fresh_rx) = crate::room::join::join_room(&registry, &name, fresh, ann(5))
            .await
            .expect("join");
        let closed = tokio::time::timeout(Duration::from_millis(300), fresh_rx.killed()).await;
        assert!(closed.is_err(), "a peer authorized after the change stays");
        shutdown.cancel();
    }

    /// A relayed token refresh (which carries neither the protocol nor the profile) leaves a
    /// Hocuspocus peer a Hocuspocus peer: stateless messages still reach it.
    #[tokio::test]
    async fn a_hocuspocus_peer_refreshed_through_a_relay_stays_one() {
        let (registry, shutdown) = memory_registry().await;
        let name = DocName::parse("tiptap").expect("name");
        let peer = crate::room::join::next_peer_id();
        let joined = PeerAuth {
            user: Some("ann".into()),
            can_write: true,
            hocuspocus: true,
            ..PeerAuth::default()
        };
        let (room, _rx) = crate::room::join::join_room(&registry, &name, peer, joined)
            .await
            .expect("join");
        let stateless = || async {
            let (reply, answer) = tokio::sync::oneshot::channel();
            let payload = "hello".into();
            room.command(RoomCmd::Stateless { payload, reply })
                .await
                .expect("command");
            answer.await.expect("answer")
        };
        assert_eq!(stateless().await, 1);
        // What a relaying node's refresh becomes on the owner (bus::Credential into PeerAuth).
        let relayed = PeerAuth {
            user: Some("ann".into()),
            can_write: true,
            ..PeerAuth::default()
        };
        let (reply, answer) = tokio::sync::oneshot::channel();
        let auth = Box::new(relayed);
        room.command(RoomCmd::Reauth { peer, auth, reply })
            .await
            .expect("command");
        assert!(answer.await.expect("answer"));
        assert_eq!(stateless().await, 1, "still a Hocuspocus peer");
        shutdown.cancel();
    }

    /// A room that panics drops its lease guard while unwinding: the lease is released, so
    /// another node is granted the document at once (the lease here would last an hour).
    #[tokio::test]
    async fn a_room_dropped_without_releasing_its_lease_releases_it() {
        let config = memory_config();
        let stores = crate::startup::open_stores(&config).await.expect("stores");
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

    #[test]
    fn renewals_fall_on_a_shared_tick_within_the_lease() {
        let ttl = Duration::from_secs(3);
        let t0 = tokio::time::Instant::now();
        let mut ticks = std::collections::BTreeSet::new();
        for ms in (0..3000).step_by(37) {
            let from = t0 + Duration::from_millis(ms);
            let at = super::lease::renewal_tick(from, ttl);
            assert!(at > from, "{ms}: too early");
            assert!(at <= from + ttl / 3, "{ms}: too late");
            ticks.insert(at);
        }
        // 82 rooms granted over three seconds renew at 3 or 4 moments, a period (1 s) apart.
        assert!(ticks.len() <= 4, "{} distinct moments", ticks.len());
        // A lease granted long before the ticks' origin still renews in time.
        let early = t0 - Duration::from_secs(5);
        assert!(super::lease::renewal_tick(early, ttl) <= early + ttl / 3);
        let v: Vec<_> = ticks.into_iter().collect();
        for w in v.windows(2) {
            assert_eq!(w[1] - w[0], ttl / 3);
        }
    }
}
