//! The room's life: the entry point that loads the document (taking its lease when nodes
//! share the database) and registers the room, reloads from storage, and the way out (drain,
//! final snapshot, release, close the peers). The lease itself is `lease.rs`'s.

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio::time::{sleep_until, Instant};
use tracing::{debug, error, info, info_span, warn, Instrument};
use yrs::{Doc, ReadTxn, StateVector, Transact};

use super::commit::{wait_inflight, within};
use super::{Exit, Room};
use crate::close;
use crate::protocol;
use crate::room::committed::{self, CommittedCopy};
use crate::room::{CloseReason, DocName, JoinError, Registry, RoomCmd};
use crate::storage::set_aside::SetAsideRow;
use crate::storage::{Epoch, LeaseGrant, StorageError, StoredDoc};

/// Removes the room from the registry however the task ends, a panic included, so the next
/// connection starts a fresh room instead of finding a dead handle.
pub(super) struct Registration {
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
pub(in crate::room) async fn run(
    registry: Arc<Registry>,
    name: DocName,
    generation: u64,
    rx: mpsc::Receiver<RoomCmd>,
    stats: Arc<crate::room::stats::RoomStats>,
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
                let mut room = Room::new(registry.clone(), name.clone(), loaded, fence, stats);
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
pub(super) fn reject(cmd: RoomCmd, why: JoinError) {
    // Other commands' reply senders are dropped with `cmd`: HTTP callers see the room gone
    // and retry.
    if let RoomCmd::Join { reply, .. } = cmd {
        let _ = reply.send(Err(why));
    }
}

/// After a failed load (or finding the document owned elsewhere): answer every join with
/// `why` until `until`. Such a room never holds a `Doc`, so it can never write an empty
/// document over stored data.
pub(super) async fn refuse_until(rx: &mut mpsc::Receiver<RoomCmd>, until: Instant, why: JoinError) {
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
pub(super) enum LoadError {
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("stored data does not decode: {0}")]
    Corrupt(String),
}

pub(super) struct Loaded {
    pub(super) stored: StoredDoc,
    pub(super) doc: Doc,
    /// Stored rows held what does not integrate: it was set aside, and the document must be
    /// snapshotted so that the next load starts past those rows.
    pub(super) repair: bool,
}

pub(super) async fn load(registry: &Registry, name: &DocName) -> Result<Loaded, LoadError> {
    let limit = registry.config.storage_timeout;
    let stored = within(
        limit,
        &registry.metrics,
        "load",
        registry.store.load(name.as_str()),
    )
    .await?;
    let (doc, aside) = build_doc(&stored)?;
    debug!(
        snapshot_bytes = stored.snapshot.as_ref().map_or(0, Vec::len),
        log_rows = stored.updates.len(),
        "loaded"
    );
    let repair = !aside.is_empty();
    if repair {
        // Recorded before anything snapshots past those rows, or the load fails (and is
        // retried): what was set aside is never only in a log line.
        warn!(
            rows = aside.len(),
            "stored log rows do not integrate; set aside (quire doctor lists them)"
        );
        let recording = registry.store.shared().set_aside(stored.id, &aside);
        within(limit, &registry.metrics, "set aside", recording).await?;
        registry
            .metrics
            .updates_set_aside
            .inc_by(aside.len() as u64);
    }
    Ok(Loaded {
        stored,
        doc,
        repair,
    })
}

/// Who serves a document.
pub(super) enum Owned {
    /// This node, under this lease epoch, granted at this instant (`None`: no leases).
    Here(Option<(Epoch, Instant)>, Loaded),
    Elsewhere {
        owner: String,
    },
}

/// Loads a document for a room on this node: with leases, takes the document's lease first
/// and loads under it, so everything the previous owner committed is seen (a write under its
/// epoch cannot commit after the grant: the storage fences it). A deleted document's lease is
/// given back at once.
pub(super) async fn load_owned(registry: &Registry, name: &DocName) -> Result<Owned, LoadError> {
    let Some(lease) = &registry.config.lease else {
        return Ok(Owned::Here(None, load(registry, name).await?));
    };
    // Only the id before the lease: a node that finds the document served elsewhere reads
    // none of its content.
    let limit = registry.config.storage_timeout;
    let asking = registry.store.doc_id(name.as_str());
    let doc = within(limit, &registry.metrics, "load", asking).await?;
    // The database counts the lease from the grant: so does the room (taken before asking,
    // so the room's idea of the lease never outlives the database's).
    let asked = Instant::now();
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
pub(super) fn committed_copy_limit(registry: &Registry) -> usize {
    usize::try_from(registry.config.snapshot_bytes.saturating_mul(2)).unwrap_or(usize::MAX)
}

/// Latest snapshot plus the log rows after it, replayed into a fresh `Doc`, and what of the
/// rows does not integrate (left out of it).
pub(super) fn build_doc(stored: &StoredDoc) -> Result<(Doc, Vec<SetAsideRow>), LoadError> {
    let rows = stored
        .updates
        .iter()
        .map(|(seq, data)| (*seq, data.as_slice()));
    committed::replay_live(stored.snapshot.as_deref(), rows).map_err(LoadError::Corrupt)
}

impl Room {
    /// What the room does on its way out.
    pub(super) async fn leave(&mut self, exit: Exit) -> bool {
        match exit {
            Exit::Unloaded | Exit::Deleted => {
                // Commit what is queued (an HTTP update, say) before leaving.
                match self.drain_pipeline().await {
                    Ok(()) => {
                        self.final_version().await;
                        self.final_snapshot().await
                    }
                    Err(reason) => error!(%reason, "could not commit everything before unloading"),
                }
                self.lease.release().await;
                debug!("unloaded");
                matches!(exit, Exit::Deleted)
            }
            Exit::Shutdown => {
                match self.drain_pipeline().await {
                    Ok(()) => {
                        self.final_version().await;
                        self.final_snapshot().await
                    }
                    // The Doc may hold updates that are not committed: no snapshot of it.
                    Err(reason) => error!(%reason, "could not commit everything before shutdown"),
                }
                // Released at once, so another node can take the document without waiting
                // for the lease to expire.
                self.lease.release().await;
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
                self.lease.release().await;
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
                self.lease.release().await;
                false
            }
        }
    }

    /// Replaces the `Doc` with what storage holds and sends peers what they lack relative to
    /// `seen` (the state they may have been sent).
    pub(super) async fn reload(&mut self, seen: &StateVector) -> Result<(), String> {
        // A staged batch is in the `Doc` being replaced: apply it again later.
        if let Some(staged) = self.pipeline.staged.take() {
            self.requeue_applied(staged.batch);
        }
        let loaded = load(&self.registry, &self.name)
            .await
            .map_err(|e| format!("reload failed: {e}"))?;
        let diff = loaded.doc.transact().encode_diff_v1(seen);
        let Loaded {
            mut stored,
            doc,
            repair,
        } = loaded;
        self.doc = doc;
        self.snapshots.repair |= repair;
        self.answers.invalidate();
        self.snapshots.version = stored.snapshot_version;
        self.last_seq = stored.last_seq();
        self.stored_bytes = stored.stored_bytes();
        self.snapshots.since_updates = stored.updates.len() as u64;
        self.report();
        self.snapshots.since_bytes = stored.updates.iter().map(|(_, u)| u.len() as u64).sum();
        self.committed = CommittedCopy::take(&mut stored, committed_copy_limit(&self.registry));
        // A snapshot encoded from the old copy is not written (its task finishes unheard).
        self.snapshots.encoding = None;
        self.snapshots.encoded = None;
        if !is_empty_update(&diff) {
            self.broadcast(&protocol::encode_update(&diff), None);
        }
        info!(
            snapshot_version = self.snapshots.version,
            last_seq = self.last_seq,
            "reloaded from storage"
        );
        Ok(())
    }

    /// Commits everything queued and waits for it (unload and shutdown paths).
    pub(super) async fn drain_pipeline(&mut self) -> Result<(), String> {
        // Leaving: a commit that keeps failing is given up after a few attempts instead of
        // retried until storage answers (its senders resend when they resync elsewhere).
        self.pipeline.draining = true;
        loop {
            if let Some(seen) = self.pipeline.reload_needed.take() {
                self.reload(&seen).await?;
            }
            self.maybe_start_commit();
            if self.pipeline.inflight.is_none() {
                return Ok(());
            }
            let res = wait_inflight(&mut self.pipeline.inflight).await;
            self.on_op_done(res).await?;
        }
    }
}

/// A Yjs v1 update with no structs and an empty delete set.
fn is_empty_update(update: &[u8]) -> bool {
    update == [0, 0]
}
