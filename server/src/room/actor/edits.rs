//! JSON edits made by the room on its own document (`POST /docs/{name}/edits`).
//!
//! The room owns the document, so an edit costs what it does, not the document's size: it
//! waits in the queue like any update and, in its turn, is checked and made on the `Doc` in one
//! transaction (`crate::edits::apply_to`), its preconditions checked in that same step against
//! exactly the state it lands on (no scratch copy, no retry). What it wrote is then one more
//! applied update: logged, committed and broadcast with the batch, attributed to its author,
//! made under the author's own client id in this document.

use bytes::Bytes;

use super::update::{Changes, EditWork, Origin, Queued};
use super::Room;
use crate::edits::Edits;
use crate::room::{ApplyError, EditCmd};

/// Bytes counted against `max_doc_size` for an edit before it is made: what it inserts at
/// most, plus a little per operation.
fn estimate(edits: &Edits) -> u64 {
    use crate::edits::Op;
    edits
        .ops
        .iter()
        .map(|op| {
            64 + match op {
                Op::TextInsert { text, .. } => text.len(),
                Op::TextReplace { replace, .. } | Op::XmlReplace { replace, .. } => {
                    replace.new.len()
                }
                Op::MapSet { size, .. } | Op::ArrayInsert { size, .. } => *size,
                Op::XmlInsert { node, .. } => node.size,
                Op::TextDelete { .. } | Op::MapDelete { .. } | Op::ArrayDelete { .. } => 0,
            }
        })
        .sum::<usize>() as u64
}

impl Room {
    /// An edit sent over HTTP: refused while storage is stalled or when the document would
    /// grow too large, else queued; it is made in its turn (`make_edit`).
    pub(super) fn edit_from_http(&mut self, cmd: EditCmd) {
        let EditCmd {
            edits,
            author,
            client,
            made,
            committed,
        } = cmd;
        if self.pipeline.stalled.is_on() {
            let _ = committed.send(Err(ApplyError::Unavailable));
            return;
        }
        if self.over_size(estimate(&edits)) {
            let _ = committed.send(Err(ApplyError::TooLarge));
            return;
        }
        self.push_queued(Queued {
            idx: 0,
            origin: Origin::Http(committed),
            raw: Bytes::new(),
            update: None,
            author: Some(author),
            held_since: None,
            joined: false,
            edit: Some(Box::new(EditWork {
                edits,
                client,
                made,
            })),
        });
        self.maybe_start_commit();
    }

    /// Makes a queued edit on the `Doc`: the update it wrote and what it changed (`None`
    /// changes: it changed nothing, as a duplicate update), or `None` when it was refused
    /// (its sender is told why; nothing changed).
    pub(super) fn make_edit(
        &mut self,
        work: EditWork,
    ) -> Option<(Bytes, Result<Option<Changes>, String>)> {
        let budget = self.registry.config.edit_work_bytes;
        let made = crate::edits::apply_to(&self.doc, &work.edits, work.client, budget, |txn| {
            let changed = !txn.insert_set().is_empty() || !txn.delete_set().is_empty();
            changed.then(|| Changes::of(txn))
        });
        match made {
            Ok((outcome, changes)) => {
                if changes.is_some() {
                    // The Doc changed: answers encoded before are stale.
                    self.answers.invalidate();
                }
                // (The sender keeps the update too: should this room go before answering, it
                // sends the update, not the edit, to the next one, which cannot make it twice.)
                let raw = Bytes::copy_from_slice(&outcome.update);
                let _ = work.made.send(Ok(outcome));
                Some((raw, Ok(changes)))
            }
            Err(refused) => {
                let _ = work.made.send(Err(refused));
                None
            }
        }
    }
}
