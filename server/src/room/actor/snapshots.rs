//! Snapshots: when one is due (by bytes or count logged since the last), encoding the whole
//! document and writing it with the optimistic version check, between appends.

use super::*;

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
    pub(super) fn spawn_snapshot(&mut self) -> Option<Inflight> {
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

    /// A snapshot before unloading, so the next load replays nothing.
    pub(super) async fn final_snapshot(&mut self) {
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

    /// A snapshot write finished: the log rows it covers are gone (written), another writer
    /// changed the row (reload), or it failed (try again after the next commit).
    pub(super) async fn on_snapshot_done(
        &mut self,
        upto_seq: i64,
        size: u64,
        data: Bytes,
        res: Result<SnapshotOutcome, StorageError>,
    ) -> Result<(), String> {
        match res {
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
        }
        Ok(())
    }
}
