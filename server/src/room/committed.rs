//! The committed state of a room's document, kept the way storage holds it: the latest
//! snapshot and the log rows after it.
//!
//! The room's `Doc` runs ahead of storage while an append is in flight (it holds the batch
//! being committed), and nothing in it is sent to anyone before the commit. Normally reads
//! wait the few milliseconds that takes. When storage stalls (an append fails or passes its
//! deadline and is retried until storage answers), the room serves reads from this copy
//! instead: a joining client's sync and the HTTP reads get the committed state at once, and
//! the stalled batch reaches the joined clients as a broadcast once it commits.
//!
//! The copy costs memory, not work: the encoded snapshot the room loaded or last wrote (a
//! fraction of the `Doc`'s own size), and the committed rows since, shared with the batches
//! that carried them (`Bytes`). The `Doc` to read from is built only while the room is
//! stalled, once per stall.

use bytes::Bytes;
use tracing::warn;
use yrs::updates::decoder::Decode;
use yrs::{Doc, Transact, Update};

use crate::storage::StoredDoc;

/// Replays a snapshot (Yjs v2) and log rows (Yjs v1) into a fresh `Doc`; the error names the
/// part that does not decode or apply.
pub(super) fn replay<'a>(
    snapshot: Option<&[u8]>,
    rows: impl IntoIterator<Item = (i64, &'a [u8])>,
) -> Result<Doc, String> {
    let doc = Doc::new();
    {
        let mut txn = doc.transact_mut();
        if let Some(snapshot) = snapshot {
            let update = Update::decode_v2(snapshot).map_err(|e| format!("snapshot: {e}"))?;
            txn.apply_update(update)
                .map_err(|e| format!("snapshot: {e}"))?;
        }
        for (seq, data) in rows {
            let update = Update::decode_v1(data).map_err(|e| format!("log row {seq}: {e}"))?;
            txn.apply_update(update)
                .map_err(|e| format!("log row {seq}: {e}"))?;
        }
    }
    Ok(doc)
}

#[derive(Default)]
pub(super) struct CommittedCopy {
    /// Yjs v2 encoded state covering the log up to `snapshot_seq`.
    snapshot: Option<Bytes>,
    snapshot_seq: i64,
    /// Committed log rows after `snapshot_seq`, ascending, as Yjs v1 updates.
    rows: Vec<(i64, Bytes)>,
    /// The copy replayed into a `Doc`, while the room is stalled.
    view: Option<Doc>,
}

impl CommittedCopy {
    /// Takes the snapshot and rows out of what the room loaded.
    pub(super) fn take(stored: &mut StoredDoc) -> CommittedCopy {
        CommittedCopy {
            snapshot: stored.snapshot.take().map(Bytes::from),
            snapshot_seq: stored.snapshot_seq,
            rows: std::mem::take(&mut stored.updates)
                .into_iter()
                .map(|(seq, data)| (seq, Bytes::from(data)))
                .collect(),
            view: None,
        }
    }

    /// Rows `first_seq`, `first_seq + 1`, ... were committed.
    pub(super) fn committed(&mut self, first_seq: i64, rows: impl IntoIterator<Item = Bytes>) {
        self.view = None;
        let rows = rows
            .into_iter()
            .zip(first_seq..)
            .map(|(data, seq)| (seq, data));
        self.rows.extend(rows);
    }

    /// A snapshot covering the log up to `upto_seq` was written.
    pub(super) fn snapshotted(&mut self, snapshot: Bytes, upto_seq: i64) {
        self.view = None;
        self.snapshot = Some(snapshot);
        self.snapshot_seq = upto_seq;
        self.rows.retain(|(seq, _)| *seq > upto_seq);
    }

    /// The committed state as a `Doc` (built on first use, kept until the copy changes or
    /// [`CommittedCopy::forget_view`]); `None` if it cannot be replayed.
    pub(super) fn view(&mut self) -> Option<&Doc> {
        if self.view.is_none() {
            let rows = self.rows.iter().map(|(seq, data)| (*seq, data.as_ref()));
            match replay(self.snapshot.as_deref(), rows) {
                Ok(doc) => self.view = Some(doc),
                Err(e) => {
                    warn!(error = %e, "the committed copy does not replay; reads wait for the commit");
                    return None;
                }
            }
        }
        self.view.as_ref()
    }

    /// Drops the `Doc` built for reads (the stall is over).
    pub(super) fn forget_view(&mut self) {
        self.view = None;
    }

    /// Bytes held (snapshot and rows), for tests and metrics.
    #[cfg(test)]
    pub(super) fn bytes(&self) -> usize {
        self.snapshot.as_ref().map_or(0, Bytes::len)
            + self.rows.iter().map(|(_, d)| d.len()).sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use yrs::{GetString, ReadTxn, StateVector, Text};

    fn text_of(doc: &Doc) -> String {
        let text = doc.get_or_insert_text("t");
        let txn = doc.transact();
        text.get_string(&txn)
    }

    #[test]
    fn the_copy_follows_commits_and_snapshots() {
        let source = Doc::with_client_id(1);
        let text = source.get_or_insert_text("t");
        let edit = |at: u32, s: &str| {
            let mut txn = source.transact_mut();
            text.insert(&mut txn, at, s);
            Bytes::from(txn.encode_update_v1())
        };
        let mut copy = CommittedCopy::default();
        copy.committed(1, [edit(0, "a"), edit(1, "b")]);
        assert_eq!(copy.view().map(text_of).as_deref(), Some("ab"));

        let snapshot = source
            .transact()
            .encode_state_as_update_v2(&StateVector::default());
        copy.committed(3, [edit(2, "c")]);
        // A snapshot encoded at row 2, written after row 3 committed: row 3 stays.
        copy.snapshotted(Bytes::from(snapshot), 2);
        assert_eq!(copy.rows.len(), 1);
        assert_eq!(copy.view().map(text_of).as_deref(), Some("abc"));
        copy.committed(4, [edit(3, "d")]);
        assert_eq!(copy.view().map(text_of).as_deref(), Some("abcd"));
        assert!(copy.bytes() > 0);
    }
}
