//! Snapshots: when one is due (by bytes or count logged since the last), encoding the whole
//! document and writing it with the optimistic version check, between appends.
//!
//! A small document is encoded in the room, between appends, in a fraction of a millisecond.
//! A large one (at least [`ENCODE_APART_BYTES`] stored) took the room tens of milliseconds
//! (60 to 90 ms for 20 MB), during which nothing was applied, committed or delivered: it is
//! encoded on a blocking thread instead, from the committed copy (the snapshot and the rows
//! after it, exactly what storage holds), while appends go on; the bytes are written at the
//! next free storage slot with the usual version check, covering the log up to the row the
//! copy ended at. That costs a replay of the document on the blocking thread (about four
//! times the encode's CPU), never the room's time.
//!
//! Writing is kept off the room's storage slot the same way: a snapshot larger than one part
//! ([`SNAPSHOT_PART_BYTES`]) is staged part by part by the task that encoded it, each part a
//! short transaction of its own (`DocStore::stage_snapshot`), while the room's appends go on;
//! the room's own write only checks the version and names the staged parts (one small
//! transaction). Writing 20 MB in the room's write held its appends, and on SQLite every
//! document's, for up to 90 ms.

use bytes::Bytes;
use tokio::time::Duration;
use tracing::{debug, warn};
use yrs::{ReadTxn, Transact};

use super::commit::{wait_inflight, within, Inflight};
use super::Room;
use crate::room::committed::SnapshotSource;
use crate::storage::{
    DocStore, SnapshotBytes, SnapshotOutcome, StagedSnapshot, StorageError, StoredDoc,
    SNAPSHOT_PART_BYTES,
};

/// Documents with at least this many bytes stored (snapshot and log) are snapshotted away
/// from the room.
pub(super) const ENCODE_APART_BYTES: u64 = 1 << 20;

/// A snapshot being encoded on a blocking thread (one at a time per process: the registry's
/// `snapshot_encoders`).
pub(super) struct Encoding {
    /// The log position the copy ended at, the snapshot version and the bytes logged since
    /// the last snapshot, when it started.
    upto_seq: i64,
    version: i64,
    covered_bytes: u64,
    task: tokio::task::JoinHandle<Result<Prepared, NotEncoded>>,
}

/// A room that gives up a snapshot being prepared (it leaves, or reloads) stops its task:
/// the task would otherwise go on staging parts nobody will name, holding the process's
/// encoder permit.
impl Drop for Encoding {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A snapshot encoded (and, when large, staged) away from the room.
pub(super) struct Prepared {
    data: Bytes,
    staged: Option<StagedSnapshot>,
}

/// A snapshot encoded away from the room, waiting to be written.
pub(super) struct Encoded {
    upto_seq: i64,
    covered_bytes: u64,
    prepared: Prepared,
}

/// Why a snapshot encoded away from the room was not.
pub(super) enum NotEncoded {
    Failed(String),
    /// The stored snapshot it was to start from had been replaced by another writer (`quire
    /// compact`): the room's view of the document row is stale.
    Moved,
}

impl From<String> for NotEncoded {
    fn from(why: String) -> NotEncoded {
        NotEncoded::Failed(why)
    }
}

pub(super) type EncodingResult = Result<Result<Prepared, NotEncoded>, tokio::task::JoinError>;

pub(super) async fn wait_encoding(encoding: &mut Option<Encoding>) -> EncodingResult {
    match encoding {
        Some(e) => (&mut e.task).await,
        None => std::future::pending().await,
    }
}

/// Where the room stands with snapshots.
pub(super) struct Snapshots {
    /// Version of the document row's snapshot, for the optimistic check.
    pub(super) version: i64,
    /// Updates and bytes logged since the last snapshot.
    pub(super) since_updates: u64,
    pub(super) since_bytes: u64,
    /// A snapshot write failed: wait for the next successful append before trying again, so
    /// a failing snapshot never holds up commits.
    pub(super) failed: bool,
    /// yrs could not encode the document for a snapshot (see `spawn_snapshot`).
    unencodable: bool,
    /// Stored rows were set aside when the document loaded: a snapshot is due at once, so
    /// that loads start past them.
    pub(super) repair: bool,
    /// A snapshot of a large document being encoded on a blocking thread while appends go on,
    /// and one encoded that waits for the storage slot.
    pub(super) encoding: Option<Encoding>,
    pub(super) encoded: Option<Encoded>,
}

impl Snapshots {
    /// As the document was loaded: its snapshot and the log after it.
    pub(super) fn new(stored: &StoredDoc) -> Snapshots {
        Snapshots {
            version: stored.snapshot_version,
            since_updates: stored.updates.len() as u64,
            since_bytes: stored.updates.iter().map(|(_, u)| u.len() as u64).sum(),
            failed: false,
            unencodable: false,
            repair: false,
            encoding: None,
            encoded: None,
        }
    }
}

/// Whether a snapshot is due, given what was logged since the last one and that snapshot's
/// size: by bytes logged at once, by update count only once the log is also a fair share of
/// the snapshot (re-encoding a large document after every `snapshot_updates` small updates
/// would write far more snapshot than log).
pub(super) fn snapshot_due(
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

impl Room {
    pub(super) fn snapshot_due(&self) -> bool {
        if self.snapshots.encoded.is_some() {
            return true; // written at the next free slot
        }
        let c = &self.registry.config;
        self.snapshots.encoding.is_none()
            && !self.snapshots.failed
            && self.pipeline.reload_needed.is_none()
            && !(self.snapshots.unencodable && self.doc.transact().has_missing_updates())
            && (self.snapshots.repair
                || snapshot_due(
                    c,
                    self.snapshots.since_updates,
                    self.snapshots.since_bytes,
                    self.stored_bytes.saturating_sub(self.snapshots.since_bytes),
                ))
    }

    /// Starts the snapshot that is due (nothing in flight, nothing staged): writes one encoded
    /// away from the room, starts encoding a large document away from it, or encodes a small
    /// one here and writes it.
    pub(super) fn start_snapshot(&mut self) {
        if let Some(Encoded {
            upto_seq,
            covered_bytes,
            prepared,
        }) = self.snapshots.encoded.take()
        {
            self.pipeline.inflight = Some(self.snapshot_write(prepared, upto_seq, covered_bytes));
            return;
        }
        if self.stored_bytes >= ENCODE_APART_BYTES {
            if let Some(source) = self.committed.snapshot_source() {
                self.encode_apart(source);
                return;
            }
        }
        self.pipeline.inflight = self.spawn_snapshot(true);
    }

    /// Stages a snapshot encoded in the room on a task of its own, like one encoded away
    /// from it (its write then comes at the next free storage slot, as `on_encoded` does).
    fn stage_apart(&mut self, data: Bytes) {
        let store = self.registry.store.clone();
        let doc = self.doc_id;
        let (limit, metrics) = (
            self.registry.config.storage_timeout,
            self.registry.metrics.clone(),
        );
        let task = tokio::spawn(async move {
            let staged = stage(&*store, doc, data.clone(), limit, &metrics)
                .await
                .map_err(|e| format!("staging: {e}"))?;
            Ok(Prepared {
                data,
                staged: Some(staged),
            })
        });
        self.snapshots.encoding = Some(Encoding {
            upto_seq: self.last_seq,
            version: self.snapshots.version,
            covered_bytes: self.snapshots.since_bytes,
            task,
        });
    }

    fn encode_apart(&mut self, mut source: SnapshotSource) {
        self.registry.metrics.snapshots_encoded_apart.inc();
        let permits = self.registry.snapshot_encoders.clone();
        let store = self.registry.store.clone();
        let (doc, version) = (self.doc_id, self.snapshots.version);
        let (limit, metrics) = (
            self.registry.config.storage_timeout,
            self.registry.metrics.clone(),
        );
        let task = tokio::spawn(async move {
            let _turn = permits.acquire_owned().await.map_err(|e| e.to_string())?;
            if source.needs_stored_snapshot() {
                // The copy does not hold a snapshot this large: read it back. It is the
                // copy's unless another writer (`quire compact`) replaced it: then the room
                // reloads, as its own write would have found.
                let mut stored = within(limit, &metrics, "load", store.load_snapshot(doc))
                    .await
                    .map_err(|e| format!("reading the snapshot back: {e}"))?;
                if stored.snapshot_version != version || !source.fill_snapshot(&mut stored) {
                    return Err(NotEncoded::Moved);
                }
                metrics.snapshots_read_back.inc();
            }
            let data = tokio::task::spawn_blocking(move || source.encode())
                .await
                .map_err(|e| format!("the encoding thread failed: {e}"))??;
            let data = Bytes::from(data);
            let staged = if data.len() > SNAPSHOT_PART_BYTES {
                let staging = stage(&*store, doc, data.clone(), limit, &metrics);
                Some(staging.await.map_err(|e| format!("staging: {e}"))?)
            } else {
                None
            };
            Ok(Prepared { data, staged })
        });
        self.snapshots.encoding = Some(Encoding {
            upto_seq: self.last_seq,
            version: self.snapshots.version,
            covered_bytes: self.snapshots.since_bytes,
            task,
        });
    }

    /// A snapshot encoded away from the room: written at once if the storage slot is free,
    /// else after the append in flight.
    pub(super) fn on_encoded(&mut self, result: EncodingResult) {
        let Some(encoding) = self.snapshots.encoding.take() else {
            return;
        };
        debug!(
            upto_seq = encoding.upto_seq,
            ok = matches!(result, Ok(Ok(_))),
            "snapshot encoded away from the room"
        );
        match result {
            Ok(Ok(prepared)) if encoding.version == self.snapshots.version => {
                self.snapshots.encoded = Some(Encoded {
                    upto_seq: encoding.upto_seq,
                    covered_bytes: encoding.covered_bytes,
                    prepared,
                });
                if self.pipeline.inflight.is_none() && self.pipeline.staged.is_none() {
                    self.start_snapshot();
                }
            }
            Ok(Ok(_)) => debug!("a snapshot encoded for an older version is dropped"),
            Ok(Err(NotEncoded::Moved)) => {
                self.registry.metrics.snapshot_conflicts.inc();
                warn!("the stored snapshot was replaced by another writer; reloading");
                let sv = self.doc.transact().state_vector();
                self.pipeline.reload_needed = Some(sv);
            }
            Ok(Err(NotEncoded::Failed(e))) => {
                warn!(error = %e, "snapshot not encoded; trying again after the next commit");
                self.snapshots.failed = true;
            }
            Err(e) => {
                warn!(error = %e, "the snapshot encoding task failed; trying again after the next commit");
                self.snapshots.failed = true;
            }
        }
    }

    /// Encodes the whole document (v2, compact) and writes it with the version check. Called
    /// only when nothing is in flight, so the `Doc` is exactly the committed state.
    ///
    /// `None` if yrs cannot encode it: a pending update (one waiting on missing dependencies)
    /// that yrs cannot merge makes `encode_state_as_update_v2` panic (found by fuzzing: two
    /// small updates from a writer did it, and the panic killed the room). So no snapshot is
    /// taken while anything is pending (the log keeps every update), and a panic in yrs all the
    /// same is caught.
    ///
    /// With `apart`, a snapshot larger than one part is staged on a task of its own (the
    /// room goes on; the write follows at a free slot) instead of in this write (the final
    /// snapshot of a room that leaves, which has nothing left to hold up).
    pub(super) fn spawn_snapshot(&mut self, apart: bool) -> Option<Inflight> {
        // Not even tried while an update is pending: that is when yrs may panic (and a panic
        // under the fuzzer aborts, caught or not).
        if self.doc.transact().has_missing_updates() {
            self.snapshots.unencodable = true;
            return None;
        }
        let doc = &self.doc;
        let encoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            crate::protocol::state::encode_state_v2(&doc.transact())
        }));
        let data = match encoded {
            Ok(data) => data,
            Err(_) => {
                warn!("the document cannot be encoded while an update is pending; no snapshot until it integrates");
                self.snapshots.unencodable = true;
                return None;
            }
        };
        self.snapshots.unencodable = false;
        let data = Bytes::from(data);
        if apart && data.len() > SNAPSHOT_PART_BYTES {
            self.stage_apart(data);
            return None;
        }
        let prepared = Prepared { data, staged: None };
        Some(self.snapshot_write(prepared, self.last_seq, self.snapshots.since_bytes))
    }

    /// Writes an encoded snapshot covering the log up to `upto_seq` (and `covered_bytes` of
    /// what was logged since the last one) with the version check. One that is larger than a
    /// part and not staged yet (only the final snapshot of a room that leaves) is staged
    /// first, in this write.
    fn snapshot_write(&self, prepared: Prepared, upto_seq: i64, covered_bytes: u64) -> Inflight {
        let Prepared { data, staged } = prepared;
        let size = data.len() as u64;
        let kept = data.clone();
        let store = self.registry.store.clone();
        let (doc, version) = (self.doc_id, self.snapshots.version);
        let fence = self.lease.fence;
        let (limit, metrics) = (
            self.registry.config.storage_timeout,
            self.registry.metrics.clone(),
        );
        let task = Box::pin(async move {
            let bytes = match staged {
                Some(staged) => SnapshotBytes::Staged(staged),
                None if data.len() > SNAPSHOT_PART_BYTES => {
                    SnapshotBytes::Staged(stage(&*store, doc, data, limit, &metrics).await?)
                }
                None => SnapshotBytes::Whole(data),
            };
            let write = store.write_snapshot(doc, fence, version, bytes, upto_seq);
            within(limit, &metrics, "snapshot", write).await
        });
        Inflight::Snapshot {
            upto_seq,
            size,
            covered_bytes,
            data: kept,
            task,
        }
    }

    /// A snapshot before unloading, so the next load replays nothing.
    pub(super) async fn final_snapshot(&mut self) {
        if self.pipeline.inflight.is_some()
            || self.snapshots.since_updates == 0
            || self.snapshots.failed
            || self.snapshots.unencodable
        {
            return;
        }
        // Leaving: whatever is being encoded away from the room is not waited for.
        self.snapshots.encoding = None;
        self.snapshots.encoded = None;
        self.pipeline.inflight = self.spawn_snapshot(false);
        while self.pipeline.inflight.is_some() {
            let res = wait_inflight(&mut self.pipeline.inflight).await;
            if let Err(e) = self.on_op_done(res).await {
                warn!(error = %e, "final snapshot failed; the log still holds every update");
                return;
            }
        }
    }

    /// A snapshot write finished: the log rows it covers are gone (written), another writer
    /// changed the row (reload), or it failed (try again after the next commit).
    pub(super) async fn on_snapshot_done(
        &mut self,
        upto_seq: i64,
        size: u64,
        covered_bytes: u64,
        data: Bytes,
        res: Result<SnapshotOutcome, StorageError>,
    ) -> Result<(), String> {
        match res {
            Ok(SnapshotOutcome::Written { new_version }) => {
                self.registry.metrics.snapshots.inc();
                self.committed.snapshotted(data, upto_seq, self.last_seq);
                debug!(upto_seq, size, "snapshot written");
                self.snapshots.version = new_version;
                self.snapshots.repair = false;
                // Rows committed while it was encoded away from the room stay in the log.
                let logged_after = (self.last_seq - upto_seq) as u64;
                self.snapshots.since_updates = logged_after;
                self.snapshots.since_bytes =
                    self.snapshots.since_bytes.saturating_sub(covered_bytes);
                self.stored_bytes = size + self.snapshots.since_bytes;
                self.stats.last_snapshot.store(
                    crate::storage::now_ms(),
                    std::sync::atomic::Ordering::Relaxed,
                );
                self.report();
            }
            Ok(SnapshotOutcome::Conflict) => {
                self.registry.metrics.snapshot_conflicts.inc();
                warn!(
                    expected_version = self.snapshots.version,
                    "snapshot refused: the document row changed; reloading"
                );
                // A batch is staged only behind an append, never behind a snapshot, so
                // the Doc is exactly what peers may have seen.
                debug_assert!(self.pipeline.staged.is_none());
                let sv = self.doc.transact().state_vector();
                self.reload(&sv).await?;
            }
            Err(StorageError::Fenced) => {
                self.registry.metrics.fenced_writes.inc();
                self.lease.fenced = true;
                return Err("a snapshot was fenced: the lease moved to another node".into());
            }
            Err(e) => {
                // The log still holds everything; try again after the next commit.
                warn!(error = %e, "snapshot write failed");
                self.snapshots.failed = true;
            }
        }
        Ok(())
    }
}

/// Stages a snapshot's parts (`DocStore::stage_snapshot`), each part within the storage
/// deadline.
async fn stage(
    store: &dyn DocStore,
    doc: crate::storage::DocId,
    data: Bytes,
    limit: Duration,
    metrics: &crate::metrics::Metrics,
) -> Result<StagedSnapshot, StorageError> {
    within(
        limit.saturating_mul(data.len().div_ceil(SNAPSHOT_PART_BYTES).max(1) as u32),
        metrics,
        "snapshot staging",
        store.stage_snapshot(doc, data),
    )
    .await
}
