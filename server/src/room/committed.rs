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
//! What it costs: memory, not work per update. The encoded snapshot the room loaded or last
//! wrote (a fraction of the `Doc`'s own size), and the rows committed since, copied back to
//! back into one buffer (a row must not pin the frame buffer it arrived in). Snapshots keep
//! the rows few (`snapshot_updates`, `snapshot_bytes`); if snapshots cannot be written and
//! the rows pass their bound, the copy is given up until the next snapshot or reload, and
//! reads during a stall then wait for the commit as they would without it. A snapshot larger
//! than the same bound (twice `snapshot_bytes`) is not held either: a large document would
//! otherwise sit in memory twice, as its `Doc` and as its encoded snapshot. Such a copy holds
//! only the rows after the snapshot; a snapshot encoded off the room reads the stored snapshot
//! back from storage ([`SnapshotSource::needs_stored_snapshot`]), HTTP reads of the current
//! content are answered from storage, and reads during a stall wait for the commit. The `Doc` to read
//! from is replayed only while the room is stalled, once per stall, and the whole-document
//! answer most joining clients ask for is encoded once per stall too.

use bytes::Bytes;
use tracing::warn;
use yrs::updates::decoder::Decode;
use yrs::updates::encoder::Encode;
use yrs::{Doc, ReadTxn, StateVector, Transact, Update, ID};

use crate::integrity::{admit, wait_for, Admission};

use crate::protocol;
use crate::storage::set_aside::SetAsideRow;
use crate::storage::StoredDoc;

/// Replays a snapshot (Yjs v2) and log rows (Yjs v1) into a fresh `Doc`; the error names the
/// part that does not decode or apply. Rows that do not integrate are left out ([`replay_checked`]).
pub(super) fn replay<'a>(
    snapshot: Option<&[u8]>,
    rows: impl IntoIterator<Item = (i64, &'a [u8])>,
) -> Result<Doc, String> {
    replay_checked(snapshot, rows).map(|(doc, _)| doc)
}

/// [`replay`], and what was set aside. Each row passes the check every new update passes
/// (`integrity.rs`): a row that depends on content not stored yet waits for a later row to
/// bring it (out of order within the log integrates), and whatever still waits at the end is
/// set aside; deletions of content no one holds are cut. So a store that holds a pending
/// update loads into a document that encodes whole and snapshots again.
pub(super) fn replay_checked<'a>(
    snapshot: Option<&[u8]>,
    rows: impl IntoIterator<Item = (i64, &'a [u8])>,
) -> Result<(Doc, Vec<SetAsideRow>), String> {
    replay_into(Doc::new(), snapshot, rows)
}

/// [`replay_checked`] into the `Doc` a room edits: text offsets in UTF-16 code units, as
/// JavaScript and Yjs count them (JSON edits index into it; a text's length is then its
/// items' lengths, kept by yrs, with no pass over the string).
pub(super) fn replay_live<'a>(
    snapshot: Option<&[u8]>,
    rows: impl IntoIterator<Item = (i64, &'a [u8])>,
) -> Result<(Doc, Vec<SetAsideRow>), String> {
    let options = yrs::Options {
        offset_kind: yrs::OffsetKind::Utf16,
        ..yrs::Options::default()
    };
    replay_into(Doc::with_options(options), snapshot, rows)
}

fn replay_into<'a>(
    doc: Doc,
    snapshot: Option<&[u8]>,
    rows: impl IntoIterator<Item = (i64, &'a [u8])>,
) -> Result<(Doc, Vec<SetAsideRow>), String> {
    let mut aside = Vec::new();
    {
        let mut txn = doc.transact_mut();
        if let Some(snapshot) = snapshot {
            let (update, repaired) =
                protocol::state::decode_state_v2(snapshot).map_err(|e| format!("snapshot: {e}"))?;
            if repaired {
                warn!("the snapshot was written with yrs 0.28's skip fault (an earlier Quire) and was read around it; the next snapshot rewrites it");
            }
            txn.apply_update(update)
                .map_err(|e| format!("snapshot: {e}"))?;
        }
        // Rows waiting for content a later row may bring: (seq, row, what it needs).
        let mut waiting: Vec<(i64, &[u8], ID)> = Vec::new();
        for (seq, data) in rows {
            let update = Update::decode_v1(data).map_err(|e| format!("log row {seq}: {e}"))?;
            match admit_row(&mut txn, seq, update, &mut aside)? {
                Some(missing) => waiting.push((seq, data, missing)),
                None if !waiting.is_empty() => retry_waiting(&mut txn, &mut waiting, &mut aside)?,
                None => {}
            }
        }
        for (seq, data, missing) in waiting {
            warn!(
                seq,
                "a stored log row depends on content never stored; set aside"
            );
            aside.push(SetAsideRow {
                seq,
                data: data.to_vec(),
                reason: format!(
                    "depends on content never stored (client {}, clock {})",
                    missing.client, missing.clock
                ),
            });
        }
    }
    Ok((doc, aside))
}

/// Applies one row if it integrates (its deletions of what no one holds cut and set aside);
/// what it waits for if it does not.
fn admit_row(
    txn: &mut yrs::TransactionMut,
    seq: i64,
    mut update: Update,
    aside: &mut Vec<SetAsideRow>,
) -> Result<Option<ID>, String> {
    let sv = txn.state_vector();
    match admit(&sv, &mut update) {
        // (An id the document holds already: it waits for what never comes, not in a loop.)
        Admission::Missing(missing) => return Ok(Some(wait_for(&sv, missing))),
        Admission::Integrates { cut: Some(cut) } => {
            warn!(
                seq,
                "a stored log row deletes content no one holds; those deletions set aside"
            );
            let mut deletions = Update::new();
            deletions.set_delete_set(cut);
            aside.push(SetAsideRow {
                seq,
                data: deletions.encode_v1(),
                reason: "deletes content no one holds".into(),
            });
        }
        Admission::Integrates { cut: None } => {}
    }
    txn.apply_update(update)
        .map_err(|e| format!("log row {seq}: {e}"))?;
    Ok(None)
}

/// Applies the waiting rows that now integrate, until none does.
fn retry_waiting(
    txn: &mut yrs::TransactionMut,
    waiting: &mut Vec<(i64, &[u8], ID)>,
    aside: &mut Vec<SetAsideRow>,
) -> Result<(), String> {
    loop {
        let sv = txn.state_vector();
        let Some(at) = waiting
            .iter()
            .position(|(_, _, missing)| sv.get(&missing.client) > missing.clock)
        else {
            return Ok(());
        };
        let (seq, data, _) = waiting.remove(at);
        let update = Update::decode_v1(data).map_err(|e| format!("log row {seq}: {e}"))?;
        if let Some(missing) = admit_row(txn, seq, update, aside)? {
            waiting.insert(at, (seq, data, missing));
        }
    }
}

/// Rows stored back to back in `data`, each given by its sequence number and where it ends.
fn split_rows<'a>(
    data: &'a [u8],
    rows: &'a [(i64, usize)],
) -> impl Iterator<Item = (i64, &'a [u8])> + 'a {
    let mut start = 0;
    rows.iter().map(move |&(seq, end)| {
        let row = &data[start..end];
        start = end;
        (seq, row)
    })
}

/// The committed state at one position, owned, to encode a snapshot from on a blocking
/// thread while the room goes on ([`CommittedCopy::source`]), or to answer an HTTP read
/// there ([`crate::room::RoomCmd::ReadCommitted`]).
pub struct SnapshotSource {
    snapshot: Option<Bytes>,
    snapshot_seq: i64,
    /// The snapshot at `snapshot_seq` is in storage only ([`CommittedCopy`] did not hold it).
    snapshot_stored: bool,
    data: Bytes,
    rows: Vec<(i64, usize)>,
}

impl SnapshotSource {
    /// Whether the snapshot this state starts from must be read back from storage first
    /// ([`SnapshotSource::fill_snapshot`]): the copy did not hold it, it was too large.
    pub fn needs_stored_snapshot(&self) -> bool {
        self.snapshot_stored
    }

    /// Supplies the stored snapshot the copy did not hold: `stored`, as read back, must be
    /// the snapshot at this source's snapshot position; `false` (nothing taken) if it is not:
    /// another writer replaced it meanwhile (`quire compact`).
    pub fn fill_snapshot(&mut self, stored: &mut crate::storage::StoredDoc) -> bool {
        if !self.snapshot_stored {
            return true;
        }
        if stored.snapshot_seq != self.snapshot_seq || stored.snapshot.is_none() {
            return false;
        }
        self.snapshot = stored.snapshot.take().map(Bytes::from);
        self.snapshot_stored = false;
        true
    }

    /// The log position this state is at.
    pub fn seq(&self) -> i64 {
        self.rows.last().map_or(self.snapshot_seq, |(seq, _)| *seq)
    }

    /// Replays the state into a fresh `Doc` (a blocking computation: call it off the
    /// runtime's threads).
    pub fn replay(&self) -> Result<Doc, String> {
        if self.snapshot_stored {
            return Err("the snapshot to replay from was not read back from storage".into());
        }
        replay(self.snapshot.as_deref(), split_rows(&self.data, &self.rows))
    }

    /// Replays the state and encodes it as a snapshot (Yjs v2). An error if it does not
    /// replay, if an update in it waits on missing dependencies (yrs may panic encoding
    /// that; see the room's `spawn_snapshot`), or if encoding panics all the same.
    pub(super) fn encode(self) -> Result<Vec<u8>, String> {
        let doc = self.replay()?;
        if doc.transact().has_missing_updates() {
            return Err("an update waits on missing dependencies".into());
        }
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            protocol::state::encode_state_v2(&doc.transact())
        }))
        .map_err(|_| "yrs panicked encoding the document".to_owned())
    }
}

/// The committed copy replayed for reads, with the whole-document Sync Step 2 once encoded.
struct View {
    doc: Doc,
    whole: Option<Bytes>,
}

pub(super) struct CommittedCopy {
    /// Yjs v2 encoded state covering the log up to `snapshot_seq` (`None` also when it is
    /// in storage only: `snapshot_stored`).
    snapshot: Option<Bytes>,
    snapshot_seq: i64,
    /// The snapshot at `snapshot_seq` was larger than `limit`: not held, in storage only.
    snapshot_stored: bool,
    /// Committed log rows after `snapshot_seq` (Yjs v1 updates), back to back.
    data: Vec<u8>,
    /// Each row's sequence number and where it ends in `data`, ascending.
    rows: Vec<(i64, usize)>,
    /// Most bytes of rows kept; past it the copy is given up (`None` rows).
    limit: usize,
    /// Given up (rows past `limit`): nothing to read from until a snapshot or a reload.
    given_up: bool,
    /// The copy replayed, while the room is stalled.
    view: Option<View>,
    /// The copy did not replay: not tried again until it changes.
    unreplayable: bool,
}

impl CommittedCopy {
    /// Takes the snapshot and rows out of what the room loaded; rows past `limit` bytes give
    /// the copy up.
    pub(super) fn take(stored: &mut StoredDoc, limit: usize) -> CommittedCopy {
        let snapshot = stored.snapshot.take().map(Bytes::from);
        let snapshot_stored = snapshot.as_ref().is_some_and(|s| s.len() > limit);
        let mut copy = CommittedCopy {
            snapshot: snapshot.filter(|_| !snapshot_stored),
            snapshot_seq: stored.snapshot_seq,
            snapshot_stored,
            data: Vec::new(),
            rows: Vec::new(),
            limit,
            given_up: false,
            view: None,
            unreplayable: false,
        };
        let rows = std::mem::take(&mut stored.updates);
        copy.push(rows.iter().map(|(seq, data)| (*seq, data.as_slice())));
        copy
    }

    fn push<'a>(&mut self, rows: impl IntoIterator<Item = (i64, &'a [u8])>) {
        self.view = None;
        self.unreplayable = false;
        if self.given_up {
            return;
        }
        for (seq, row) in rows {
            if self.data.len() + row.len() > self.limit {
                self.give_up();
                return;
            }
            self.data.extend_from_slice(row);
            self.rows.push((seq, self.data.len()));
        }
    }

    fn give_up(&mut self) {
        self.given_up = true;
        self.data = Vec::new();
        self.rows = Vec::new();
    }

    /// Rows `first_seq`, `first_seq + 1`, ... were committed.
    pub(super) fn committed<'a>(
        &mut self,
        first_seq: i64,
        rows: impl IntoIterator<Item = &'a [u8]>,
    ) {
        let rows = rows
            .into_iter()
            .zip(first_seq..)
            .map(|(data, seq)| (seq, data));
        self.push(rows);
    }

    /// A snapshot covering the log up to `upto_seq` was written; `last_seq` is the room's
    /// highest committed row now (later than `upto_seq` when the snapshot was encoded off
    /// the room while appends went on).
    pub(super) fn snapshotted(&mut self, snapshot: Bytes, upto_seq: i64, last_seq: i64) {
        self.view = None;
        self.unreplayable = false;
        self.snapshot_stored = snapshot.len() > self.limit;
        self.snapshot = (!self.snapshot_stored).then_some(snapshot);
        self.snapshot_seq = upto_seq;
        if self.given_up {
            // Usable again only if no row after `upto_seq` was dropped while given up.
            self.given_up = last_seq > upto_seq;
            return;
        }
        let kept = self.rows.partition_point(|(seq, _)| *seq <= upto_seq);
        let cut = kept.checked_sub(1).map_or(0, |i| self.rows[i].1);
        self.data.drain(..cut);
        self.rows.drain(..kept);
        if self.rows.is_empty() {
            // (The usual case: a snapshot covers every committed row.) Give the memory back.
            self.data = Vec::new();
            self.rows = Vec::new();
        }
        for (_, end) in &mut self.rows {
            *end -= cut;
        }
    }

    /// What an HTTP read of the current content replays: the snapshot and the rows after it,
    /// up to the room's last committed row (`None` if the copy was given up or does not hold
    /// its snapshot). Costs a copy of the rows, which snapshots keep few.
    pub(super) fn source(&self) -> Option<SnapshotSource> {
        self.snapshot_source().filter(|s| !s.snapshot_stored)
    }

    /// What a snapshot encoded away from the room replays: [`CommittedCopy::source`], or,
    /// when the copy does not hold its snapshot, the rows with the snapshot to be read back
    /// from storage ([`SnapshotSource::fill_snapshot`]). `None` if the copy was given up.
    pub(super) fn snapshot_source(&self) -> Option<SnapshotSource> {
        (!self.given_up).then(|| SnapshotSource {
            snapshot: self.snapshot.clone(),
            snapshot_seq: self.snapshot_seq,
            snapshot_stored: self.snapshot_stored,
            data: Bytes::copy_from_slice(&self.data),
            rows: self.rows.clone(),
        })
    }

    /// The log position [`CommittedCopy::source`] would be at (`None` if the copy was given
    /// up).
    pub(super) fn seq(&self) -> Option<i64> {
        (!self.given_up).then(|| self.rows.last().map_or(self.snapshot_seq, |(seq, _)| *seq))
    }

    /// Bytes held (snapshot and rows).
    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.snapshot.as_ref().map_or(0, Bytes::len) + self.data.len()
    }

    fn view(&mut self) -> Option<&mut View> {
        if self.view.is_none() && !self.given_up && !self.unreplayable && !self.snapshot_stored {
            match replay(self.snapshot.as_deref(), split_rows(&self.data, &self.rows)) {
                Ok(doc) => self.view = Some(View { doc, whole: None }),
                Err(e) => {
                    warn!(error = %e, "the committed copy does not replay; reads wait for the commit");
                    self.unreplayable = true;
                }
            }
        }
        self.view.as_mut()
    }

    /// The committed state as a `Doc` (replayed on first use, kept until the copy changes or
    /// [`CommittedCopy::forget_view`]); `None` if there is no usable copy.
    pub(super) fn doc(&mut self) -> Option<&Doc> {
        self.view().map(|v| &v.doc)
    }

    /// The Sync Step 2 answering `sv` from the committed state (the whole document, which most
    /// joining clients ask for, encoded once per view); `None` if there is no usable copy.
    pub(super) fn step2(&mut self, sv: &StateVector) -> Option<Bytes> {
        let view = self.view()?;
        if *sv != StateVector::default() {
            return Some(protocol::encode_step2(
                &view.doc.transact().encode_diff_v1(sv),
            ));
        }
        let doc = &view.doc;
        let whole = view.whole.get_or_insert_with(|| {
            protocol::encode_step2(&doc.transact().encode_diff_v1(&StateVector::default()))
        });
        Some(whole.clone())
    }

    /// Drops the `Doc` replayed for reads (the stall is over).
    pub(super) fn forget_view(&mut self) {
        self.view = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use yrs::{GetString, Text};

    fn text_of(doc: &Doc) -> String {
        let text = doc.get_or_insert_text("t");
        let txn = doc.transact();
        text.get_string(&txn)
    }

    struct Source(Doc);

    impl Source {
        fn edit(&self, at: u32, s: &str) -> Vec<u8> {
            let text = self.0.get_or_insert_text("t");
            let mut txn = self.0.transact_mut();
            text.insert(&mut txn, at, s);
            txn.encode_update_v1()
        }

        fn snapshot(&self) -> Bytes {
            Bytes::from(protocol::state::encode_state_v2(&self.0.transact()))
        }
    }

    fn empty(limit: usize) -> CommittedCopy {
        CommittedCopy::take(&mut StoredDoc::default(), limit)
    }

    #[test]
    fn the_copy_follows_commits_and_snapshots() {
        let source = Source(Doc::with_client_id(1));
        let mut copy = empty(1 << 20);
        let (a, b) = (source.edit(0, "a"), source.edit(1, "b"));
        copy.committed(1, [a.as_slice(), b.as_slice()]);
        assert_eq!(copy.doc().map(text_of).as_deref(), Some("ab"));

        let snapshot = source.snapshot();
        let c = source.edit(2, "c");
        copy.committed(3, [c.as_slice()]);
        // A snapshot covering rows up to 2: row 3 stays.
        copy.snapshotted(snapshot, 2, 3);
        assert_eq!(copy.rows, vec![(3, c.len())]);
        assert_eq!(copy.doc().map(text_of).as_deref(), Some("abc"));
        let d = source.edit(3, "d");
        copy.committed(4, [d.as_slice()]);
        assert_eq!(copy.doc().map(text_of).as_deref(), Some("abcd"));
        // The whole-document answer, encoded once for the view.
        let whole = copy.step2(&StateVector::default()).expect("answer");
        let again = copy.step2(&StateVector::default()).expect("answer");
        assert_eq!(whole.as_ptr(), again.as_ptr());
    }

    #[test]
    fn rows_past_the_bound_give_the_copy_up_until_the_next_snapshot() {
        let source = Source(Doc::with_client_id(1));
        let first = source.edit(0, "first");
        let mut copy = empty(first.len() + 4);
        copy.committed(1, [first.as_slice()]);
        assert!(copy.doc().is_some());
        let second = source.edit(5, " second");
        copy.committed(2, [second.as_slice()]);
        assert!(copy.doc().is_none(), "given up");
        assert_eq!(copy.bytes(), 0);
        assert!(copy.source().is_none(), "nothing to encode a snapshot from");
        // (Room for the snapshots below: a snapshot past the bound is not held either, see
        // the next test.)
        copy.limit = 1 << 20;
        // A snapshot encoded before row 2 (off the room) does not make the copy whole: row 2
        // was dropped while given up.
        copy.snapshotted(source.snapshot(), 1, 2);
        assert!(copy.doc().is_none(), "still given up");
        copy.snapshotted(source.snapshot(), 2, 2);
        assert_eq!(copy.doc().map(text_of).as_deref(), Some("first second"));
    }

    #[test]
    fn a_snapshot_encoded_from_the_source_holds_the_committed_state() {
        let source = Source(Doc::with_client_id(1));
        let mut copy = empty(1 << 20);
        let a = source.edit(0, "abc");
        copy.committed(1, [a.as_slice()]);
        copy.snapshotted(source.snapshot(), 1, 1);
        let (d, e) = (source.edit(3, "d"), source.edit(0, "e"));
        copy.committed(2, [d.as_slice(), e.as_slice()]);
        let encoded = copy.source().expect("a source").encode().expect("encodes");
        let doc = replay(Some(&encoded), []).expect("replays");
        assert_eq!(text_of(&doc), "eabcd");
        assert_eq!(
            doc.transact().state_vector(),
            source.0.transact().state_vector()
        );
    }

    #[test]
    fn a_snapshot_past_the_bound_is_left_in_storage_and_read_back_to_encode() {
        let source = Source(Doc::with_client_id(1));
        let a = source.edit(0, &"a".repeat(200));
        let big = source.snapshot();
        let limit = big.len() - 1;
        let mut stored = StoredDoc {
            snapshot: Some(big.to_vec()),
            snapshot_seq: 1,
            ..StoredDoc::default()
        };
        let mut copy = CommittedCopy::take(&mut stored, limit);
        assert_eq!(copy.bytes(), 0, "the snapshot is not held");
        let b = source.edit(0, "b");
        copy.committed(2, [b.as_slice()]);
        assert_eq!(copy.seq(), Some(2));
        assert!(copy.doc().is_none(), "no stall reads without the snapshot");
        assert!(copy.source().is_none(), "HTTP reads go to storage");
        let mut apart = copy.snapshot_source().expect("rows to encode from");
        assert!(apart.needs_stored_snapshot());
        assert!(apart.replay().is_err());
        // A stored snapshot at another position is refused.
        let mut moved = StoredDoc {
            snapshot: Some(big.to_vec()),
            snapshot_seq: 2,
            ..StoredDoc::default()
        };
        assert!(!apart.fill_snapshot(&mut moved));
        let mut loaded = StoredDoc {
            snapshot: Some(big.to_vec()),
            snapshot_seq: 1,
            ..StoredDoc::default()
        };
        assert!(
            apart.fill_snapshot(&mut loaded),
            "the snapshot it starts from"
        );
        let encoded = apart.encode().expect("encodes");
        let doc = replay(Some(&encoded), []).expect("replays");
        assert_eq!(text_of(&doc), format!("b{}", "a".repeat(200)));
        drop(a);
        // A small snapshot written later is held again.
        let small_limit = Source(Doc::with_client_id(2));
        let small = small_limit.snapshot();
        copy.snapshotted(small.clone(), 2, 2);
        assert!(copy.source().is_some());
        assert_eq!(copy.bytes(), small.len());
    }
}
