//! Reads of the document: Sync Step 1 answers (shared between peers asking for the same at
//! the same version) and HTTP reads, deferred while the `Doc` holds uncommitted updates and
//! answered from the committed copy while storage is stalled.

use std::collections::HashMap;

use bytes::Bytes;
use tokio::sync::oneshot;
use yrs::{ReadTxn, StateVector, Transact};

pub use crate::history::doc_json;

use super::Room;
use crate::room::queue::{Answer, SendError};
use crate::room::PeerId;

/// Reads that must see only committed state; deferred while an append is in flight.
pub(super) enum DeferredRead {
    Update(StateVector, tokio::sync::oneshot::Sender<Vec<u8>>),
    Json(tokio::sync::oneshot::Sender<serde_json::Value>),
}

/// Reads deferred while the `Doc` holds uncommitted updates.
#[derive(Default)]
pub(super) struct Reads {
    /// At most one deferred Sync/Step1 per peer (a later one replaces an earlier one).
    pub(super) deferred_step1: HashMap<PeerId, StateVector>,
    pub(super) deferred_reads: Vec<DeferredRead>,
}

impl Room {
    /// Answers a Sync Step 1 with the Step 2 for `sv` (shared with other peers asking for the
    /// same at this version), unless the peer has not yet read its previous answer: then
    /// nothing, since that answer and the broadcasts queued after it bring the peer up to date.
    pub(super) fn answer_step1(&mut self, peer: PeerId, sv: &StateVector) {
        if self.answer_pending(peer, Answer::Sync) {
            return;
        }
        let frame = self.answers.step2(&self.doc, sv, &self.registry.metrics);
        self.send_answer(peer, Answer::Sync, frame);
    }

    /// Whether `peer` still has an unread answer of this kind queued (counted as skipped).
    pub(super) fn answer_pending(&self, peer: PeerId, kind: Answer) -> bool {
        let pending = self
            .peers
            .by_id
            .get(&peer)
            .is_some_and(|p| p.tx.answer_pending(kind));
        if pending {
            self.registry.metrics.sync_answers_skipped.inc();
        }
        pending
    }

    pub(super) fn send_answer(&mut self, peer: PeerId, kind: Answer, frame: Bytes) {
        let full = match self.peers.by_id.get(&peer) {
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
    pub(super) fn answer_from_committed(&mut self) {
        if !self.pipeline.stalled.is_on()
            || (self.reads.deferred_step1.is_empty() && self.reads.deferred_reads.is_empty())
        {
            return;
        }
        let Some(doc) = self.committed.doc() else {
            return; // no usable copy: they wait for the commit
        };
        let mut json = None;
        for read in std::mem::take(&mut self.reads.deferred_reads) {
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
        for (peer, sv) in std::mem::take(&mut self.reads.deferred_step1) {
            if !self.peers.by_id.contains_key(&peer) || self.answer_pending(peer, Answer::Sync) {
                continue;
            }
            match self.committed.step2(&sv) {
                Some(frame) => {
                    self.registry.metrics.stalled_reads.inc();
                    self.send_answer(peer, Answer::Sync, frame);
                }
                // (Not after `doc()` answered; if it did, the peer waits for the commit.)
                None => {
                    self.reads.deferred_step1.insert(peer, sv);
                }
            }
        }
    }

    /// Answers the reads that waited for the `Doc` to hold only committed state.
    pub(super) fn answer_deferred(&mut self) {
        if self.has_uncommitted() {
            return;
        }
        for (peer, sv) in std::mem::take(&mut self.reads.deferred_step1) {
            if self.peers.by_id.contains_key(&peer) {
                self.answer_step1(peer, &sv);
            }
        }
        for read in std::mem::take(&mut self.reads.deferred_reads) {
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

    /// An HTTP read of the update a client at `since` lacks: answered now if the `Doc` holds
    /// only committed state, else once it does (or from the committed copy while stalled).
    pub(super) fn read_update(&mut self, since: StateVector, reply: oneshot::Sender<Vec<u8>>) {
        if self.has_uncommitted() {
            self.reads
                .deferred_reads
                .push(DeferredRead::Update(since, reply));
            self.answer_from_committed();
        } else {
            let _ = reply.send(self.doc.transact().encode_diff_v1(&since));
        }
    }

    /// An HTTP read of the document as JSON, committed state only (as [`Self::read_update`]).
    pub(super) fn read_json(&mut self, reply: oneshot::Sender<serde_json::Value>) {
        if self.has_uncommitted() {
            self.reads.deferred_reads.push(DeferredRead::Json(reply));
            self.answer_from_committed();
        } else {
            let _ = reply.send(doc_json(&self.doc));
        }
    }
}
