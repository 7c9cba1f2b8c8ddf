//! The commit: the append of an applied batch put in flight (one at a time, polled by the
//! room itself), its outcome acted on (broadcast, acknowledgements and HTTP answers once
//! committed; a reload on a conflict; a stall and retries while storage fails), and the
//! snapshot write that takes the same slot between appends.

use bytes::Bytes;
use tokio::time::{sleep, Duration, Instant};
use tracing::{debug, info, warn};
use yrs::StateVector;

use super::update::{Applied, AppliedBatch, Origin, Waiter};
use super::Room;
use crate::protocol;
use crate::room::PeerId;
use crate::storage::{LogEntry, SnapshotOutcome, StorageError};

/// Attempts at committing one batch before the room gives up (closing its peers with 1011 so
/// they resync against a fresh load). Backoff doubles from [`COMMIT_RETRY_BASE`].
pub(super) const COMMIT_RETRY_BASE: Duration = Duration::from_millis(50);

/// Attempts of a failing commit while the room is leaving (unloading, shutting down).
pub(super) const DRAIN_COMMIT_ATTEMPTS: u32 = 6;

/// The longest wait between two attempts of a failing commit.
pub(super) const COMMIT_RETRY_MAX: Duration = Duration::from_secs(2);

/// The wait before attempt `attempt` (1, 2, ...) of a failing commit: doubling from
/// [`COMMIT_RETRY_BASE`] up to [`COMMIT_RETRY_MAX`].
pub(super) fn commit_backoff(attempt: u32) -> Duration {
    COMMIT_RETRY_BASE
        .saturating_mul(2u32.saturating_pow(attempt.saturating_sub(1).min(16)))
        .min(COMMIT_RETRY_MAX)
}

/// A storage operation in flight. It is polled by the room itself (not spawned): the room's
/// `select!` keeps it and resumes it, so a commit costs no task of its own.
pub(super) type StorageOp<T> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<T, StorageError>> + Send>>;

pub(super) async fn wait_inflight(inflight: &mut Option<Inflight>) -> OpResult {
    match inflight {
        Some(Inflight::Append { task, .. }) => OpResult::Append(task.as_mut().await),
        Some(Inflight::Snapshot { task, .. }) => OpResult::Snapshot(task.as_mut().await),
        None => std::future::pending().await,
    }
}

/// `fut`, a storage operation, given up after `limit` (counted in `storage_timeouts`): an
/// error like any other for the caller, which retries or fails.
pub(super) async fn within<T>(
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

/// The room's storage operation in flight: an append, or a snapshot write between appends.
pub(super) enum Inflight {
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
        /// Bytes logged since the last snapshot that this one covers.
        covered_bytes: u64,
        /// What is being written, for the committed copy once it is.
        data: Bytes,
        task: StorageOp<SnapshotOutcome>,
    },
}

pub(super) enum OpResult {
    Append(Result<(), StorageError>),
    Snapshot(Result<SnapshotOutcome, StorageError>),
}

/// The room's share of `quire_rooms_storage_stalled`: given back however the room ends, a
/// panic included (or `/readyz` would stay 503).
pub(super) struct Stalled {
    pub(super) gauge: prometheus::IntGauge,
    pub(super) on: bool,
}

impl Stalled {
    pub(super) fn is_on(&self) -> bool {
        self.on
    }

    /// Sets the state; true if it changed.
    pub(super) fn set(&mut self, on: bool) -> bool {
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

impl Room {
    /// Enters the stalled state (`Some(why)`: the last append failed or timed out) or leaves
    /// it (`None`).
    pub(super) fn set_stalled(&mut self, why: Option<String>) {
        match why {
            Some(why) => {
                self.registry.set_storage_error(why);
                self.pipeline.stalled.set(true);
                // The reads already waiting for the commit need not wait for storage.
                self.answer_from_committed();
            }
            None => {
                if self.pipeline.stalled.set(false) {
                    info!("storage answers again; the room takes updates");
                }
                self.committed.forget_view();
            }
        }
    }

    /// The append of `batch` (updates up to `upto_idx`), as the storage operation to put in
    /// flight. Nothing is spawned and nothing runs until the room polls it in its loop (see
    /// [`StorageOp`]); a retry (`attempt` > 0) first waits out its backoff there.
    pub(super) fn append_op(
        &self,
        batch: Vec<Applied>,
        upto_idx: u64,
        committed_sv: StateVector,
        attempt: u32,
    ) -> Inflight {
        let store = self.registry.store.clone();
        let doc = self.doc_id;
        let fence = self.lease.fence;
        let first_seq = self.last_seq + 1;
        let rows: Vec<LogEntry> = batch
            .iter()
            .map(|a| LogEntry {
                data: a.raw.clone(),
                author: a.author.clone(),
                inserted: a.changes.inserted,
                deleted: a.changes.deleted,
                clients: a.changes.clients.clone(),
            })
            .collect();
        let (limit, metrics) = (
            self.registry.config.storage_timeout,
            self.registry.metrics.clone(),
        );
        let task: StorageOp<()> = Box::pin(async move {
            if attempt > 0 {
                sleep(commit_backoff(attempt)).await;
            }
            let append = store.append_log(doc, fence, first_seq, rows);
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

    /// The storage operation in flight finished: act on its outcome, then start what comes
    /// next (a due snapshot, else the next append). `Err` means the room must stop.
    pub(super) async fn on_op_done(&mut self, res: OpResult) -> Result<(), String> {
        let Some(inflight) = self.pipeline.inflight.take() else {
            return Ok(());
        };
        match (inflight, res) {
            (
                Inflight::Append {
                    batch,
                    upto_idx,
                    committed_sv,
                    started,
                    attempt,
                    ..
                },
                OpResult::Append(res),
            ) => match res {
                Ok(()) => self.on_committed(batch, upto_idx, started),
                Err(e) => {
                    let batch = AppliedBatch {
                        batch,
                        upto_idx,
                        committed_sv,
                    };
                    self.on_append_failed(batch, attempt, e).await?
                }
            },
            (
                Inflight::Snapshot {
                    upto_seq,
                    size,
                    covered_bytes,
                    data,
                    ..
                },
                OpResult::Snapshot(res),
            ) => {
                self.on_snapshot_done(upto_seq, size, covered_bytes, data, res)
                    .await?
            }
            (_, _) => return Err("internal: operation result does not match".into()),
        }
        // (An append being retried is in flight again: nothing starts behind it.)
        if self.pipeline.inflight.is_none() && self.pipeline.staged.is_none() && self.snapshot_due()
        {
            self.start_snapshot();
        }
        if self.pipeline.inflight.is_some() {
            self.answer_deferred();
        } else {
            self.maybe_start_commit();
        }
        Ok(())
    }

    /// A batch is in the log: count it, broadcast it, answer its HTTP senders and the durable
    /// acknowledgements waiting for it.
    fn on_committed(&mut self, batch: Vec<Applied>, upto_idx: u64, started: Instant) {
        self.set_stalled(None);
        let m = &self.registry.metrics;
        m.commits.inc();
        m.commit_seconds.observe(started.elapsed().as_secs_f64());
        m.updates_logged.inc_by(batch.len() as u64);
        let bytes: u64 = batch.iter().map(|a| a.raw.len() as u64).sum();
        self.pipeline.applied_bytes -= bytes;
        let rows = batch.iter().map(|a| a.raw.as_ref());
        self.committed.committed(self.last_seq + 1, rows);
        self.last_seq += batch.len() as i64;
        self.stored_bytes += bytes;
        self.snapshots.since_updates += batch.len() as u64;
        self.snapshots.since_bytes += bytes;
        self.snapshots.failed = false;
        self.pipeline.committed_idx = upto_idx;
        let last_seq = self.last_seq;
        let author = batch.iter().rev().find_map(|a| a.author.clone());
        self.versions.edited(Instant::now(), author);
        {
            use std::sync::atomic::Ordering::Relaxed;
            self.stats.updates_in.fetch_add(batch.len() as u64, Relaxed);
            self.stats
                .last_commit
                .store(crate::storage::now_ms(), Relaxed);
            self.report();
        }
        let mut delivered = 0;
        for applied in batch {
            let frame = protocol::encode_update(&applied.raw);
            delivered += self.broadcast(&frame, applied.origin.peer());
            if let Origin::Http(reply) = applied.origin {
                let _ = reply.send(Ok(last_seq));
            }
        }
        self.registry.metrics.updates_sent.inc_by(delivered);
        self.stats
            .updates_out
            .fetch_add(delivered, std::sync::atomic::Ordering::Relaxed);
        self.release_waiters();
    }

    /// An append failed: give the room up (fenced, deleted), reload and retry at the new
    /// position (conflict), or stall and retry (storage failing or slow).
    async fn on_append_failed(
        &mut self,
        next: AppliedBatch,
        attempt: u32,
        e: StorageError,
    ) -> Result<(), String> {
        match e {
            StorageError::Fenced => {
                // Not committed and never will be here: the HTTP callers see the room give up
                // (503) and the peers resend through the new owner when they resync.
                self.registry.metrics.fenced_writes.inc();
                self.lease.fenced = true;
                Err("an append was fenced: the lease moved to another node".into())
            }
            StorageError::Deleted => {
                // Never committed: its senders were not acknowledged, and the document is gone.
                self.pipeline.deleted_underneath = true;
                Err("an append was refused: the document is deleted".into())
            }
            StorageError::Conflict => {
                // Another writer took our log position: reload what is stored, then apply this
                // batch again on top of it and commit it at the new position.
                // (After an append that timed out, it may be our own earlier attempt that
                // committed late: the reload finds its updates and the batch adds nothing.)
                warn!("log position taken by another writer; reloading");
                self.registry.metrics.commit_failures.inc();
                self.set_stalled(None); // storage answered
                self.reload(&next.committed_sv).await?;
                // The reload put a staged batch back in the queue; this one goes before it.
                self.requeue_applied(next.batch);
                Ok(())
            }
            e => {
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
                if self.pipeline.draining && attempt + 1 >= DRAIN_COMMIT_ATTEMPTS {
                    return Err(format!("commit failed {DRAIN_COMMIT_ATTEMPTS} times: {e}"));
                }
                let AppliedBatch {
                    batch,
                    upto_idx,
                    committed_sv,
                } = next;
                self.pipeline.inflight =
                    Some(self.append_op(batch, upto_idx, committed_sv, attempt + 1));
                Ok(())
            }
        }
    }

    pub(super) fn release_waiters(&mut self) {
        while let Some((idx, _)) = self.pipeline.waiters.front() {
            if *idx > self.pipeline.committed_idx {
                break;
            }
            let Some((_, waiter)) = self.pipeline.waiters.pop_front() else {
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

    /// Echoes a durable acknowledgement, or withholds it while the peer holds updates that
    /// wait for their dependencies.
    pub(super) fn send_ack(&mut self, peer: PeerId, raw: Bytes) {
        if self.pipeline.held.holds(peer) {
            // Only the newest request is kept: its echo stands for the earlier ones.
            self.pipeline.withheld.retain(|(p, _)| *p != peer);
            self.pipeline.withheld.push((peer, raw));
        } else {
            self.send_to(peer, raw);
        }
    }
}
