//! The pipeline: updates from arrival to applied. Queued updates are applied to the `Doc` in
//! batches and handed to the commit (`commit.rs`: one append in flight, one batch staged
//! behind it), which broadcasts and acknowledges them only once committed.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::warn;
use yrs::updates::decoder::Decode;
use yrs::updates::encoder::Encode;
use yrs::{ReadTxn, StateVector, Transact, Update};

use super::commit::{Inflight, Stalled};
use super::held::{missing_text, Held, HeldUpdate};
use super::update::{Applied, AppliedBatch, Changes, Origin, Queued, Waiter};
use super::Room;
use crate::close;
use crate::integrity::{contained, plan, wait_for, Admission};
use crate::protocol;
use crate::room::{ApplyError, CloseReason, PeerId, Registry};

/// Updates on their way from arrival to commit (see the actor's notes), and the state of
/// the room's storage writes.
pub(super) struct Pipeline {
    /// Updates received and not yet applied, and their bytes.
    pub(super) queued: VecDeque<Queued>,
    pub(super) queued_bytes: u64,
    /// Bytes of updates applied and not yet committed (in flight or staged).
    pub(super) applied_bytes: u64,
    /// The storage operation in flight: an append, or a snapshot write between appends.
    pub(super) inflight: Option<Inflight>,
    /// A full batch applied while the previous one commits, appended next.
    pub(super) staged: Option<AppliedBatch>,
    /// What waits for `committed_idx` to reach an index, in order.
    pub(super) waiters: VecDeque<(u64, Waiter)>,
    /// The index of the last update received, and of the last committed.
    pub(super) received_idx: u64,
    pub(super) committed_idx: u64,
    /// Updates peers sent ahead of what they depend on, held for them (`held.rs`). A peer's
    /// durable acknowledgements wait in `withheld` while it holds any: "saved" must mean
    /// others see it.
    pub(super) held: Held,
    pub(super) withheld: Vec<(PeerId, Bytes)>,
    /// Set when an update failed half-way through being applied: the `Doc` may hold part of
    /// it, so it is rebuilt from storage before anything else happens. Holds what peers may
    /// have seen.
    pub(super) reload_needed: Option<StateVector>,
    /// The last append failed or timed out: updates are refused (1013) until one succeeds.
    pub(super) stalled: Stalled,
    /// The room is leaving: failing commits are given up after a few attempts.
    pub(super) draining: bool,
    /// Set when an append was refused because the document is deleted: the room must stop.
    pub(super) deleted_underneath: bool,
}

impl Pipeline {
    pub(super) fn new(registry: &Registry) -> Pipeline {
        Pipeline {
            queued: VecDeque::new(),
            queued_bytes: 0,
            applied_bytes: 0,
            inflight: None,
            staged: None,
            waiters: VecDeque::new(),
            received_idx: 0,
            committed_idx: 0,
            held: Held::new(registry.metrics.held_update_bytes.clone()),
            withheld: Vec::new(),
            reload_needed: None,
            stalled: Stalled {
                gauge: registry.metrics.rooms_stalled.clone(),
                on: false,
            },
            draining: false,
            deleted_underneath: false,
        }
    }
}

impl Room {
    /// An update from a peer: refused if the peer may not write (it is told why), if storage
    /// is stalled (1013: it resends after resyncing) or if the document would grow too large.
    pub(super) fn on_peer_update(&mut self, peer: PeerId, raw: Bytes, update: Update) {
        let can_write = self
            .peers
            .by_id
            .get(&peer)
            .is_some_and(|p| p.auth.can_write);
        if !can_write {
            // Not applied, not logged. An update that brings nothing new (the Sync Step 2 a
            // read-only client answers with, carrying the deletions it was sent) is no
            // attempt to write; any other is refused, and the client is told why.
            if !contained(&self.doc, &update) {
                self.send_to(peer, protocol::encode_permission_denied("read-only access"));
            }
            return;
        }
        if self.pipeline.stalled.is_on() {
            // Not applied: the client keeps it and sends it again when it resyncs.
            let why = "storage is not answering; retry later";
            self.close_peer(peer, CloseReason::new(close::TRY_AGAIN_LATER, why));
            return;
        }
        let author = self
            .peers
            .by_id
            .get(&peer)
            .and_then(|p| p.auth.user.clone());
        if self
            .enqueue(Origin::Peer(peer), raw, update, author)
            .is_err()
        {
            self.close_peer(
                peer,
                CloseReason::new(close::DOC_TOO_LARGE, "document size limit reached"),
            );
        }
    }

    /// A durable acknowledgement request: echoed once everything the room received before
    /// it is committed.
    pub(super) fn on_ack_request(&mut self, peer: PeerId, raw: Bytes) {
        let newest = self.pipeline.received_idx;
        if self.pipeline.committed_idx >= newest {
            self.send_ack(peer, raw);
        } else if let Some((_, Waiter::Ack(_, last_raw))) = self
            .pipeline
            .waiters
            .back_mut()
            .filter(|(idx, w)| *idx == newest && matches!(w, Waiter::Ack(p, _) if *p == peer))
        {
            // The same peer asked again with nothing received in between: the newer
            // request stands for both (an echo means everything before it is
            // committed), so a flood of requests holds one waiter, not one each.
            *last_raw = raw;
        } else {
            self.pipeline
                .waiters
                .push_back((newest, Waiter::Ack(peer, raw)));
        }
    }

    /// An update sent over HTTP: refused while storage is stalled or when the document would
    /// grow too large, else queued; the reply comes once it is committed.
    pub(super) fn apply_from_http(
        &mut self,
        raw: Bytes,
        update: Update,
        reply: oneshot::Sender<Result<i64, ApplyError>>,
        author: Option<Arc<str>>,
    ) {
        if self.pipeline.stalled.is_on() {
            let _ = reply.send(Err(ApplyError::Unavailable));
            return;
        }
        match self.enqueue(Origin::Http(reply), raw, update, author) {
            Ok(()) => self.maybe_start_commit(),
            Err(Origin::Http(reply)) => {
                let _ = reply.send(Err(ApplyError::TooLarge));
            }
            Err(Origin::Peer(_) | Origin::Part) => {}
        }
    }

    /// Updates of one request applied together (`ApplyCmd::then`): each is checked to
    /// integrate onto the document and the ones before it, before any is queued (else the
    /// caller is told what is missing and nothing changes); then they are queued as one group,
    /// which the pipeline never splits between appends. The reply comes with the last.
    pub(super) fn apply_together(
        &mut self,
        author: Option<Arc<str>>,
        raw: Bytes,
        update: Update,
        then: Vec<(Option<Arc<str>>, Bytes)>,
        reply: oneshot::Sender<Result<i64, ApplyError>>,
    ) {
        if self.pipeline.stalled.is_on() {
            let _ = reply.send(Err(ApplyError::Unavailable));
            return;
        }
        let mut members = vec![(author, raw, update)];
        for (author, raw) in then {
            match Update::decode_v1(&raw) {
                Ok(update) => members.push((author, raw, update)),
                Err(e) => {
                    let _ = reply.send(Err(ApplyError::Invalid(e.to_string())));
                    return;
                }
            }
        }
        let mut sv = self.state_vector();
        for (_, _, update) in &members {
            match plan(&sv, update) {
                Ok(reached) => sv = reached,
                Err(missing) => {
                    self.registry.metrics.updates_unintegrable.inc();
                    let _ = reply.send(Err(ApplyError::Missing(missing_text(missing))));
                    return;
                }
            }
        }
        let total: u64 = members.iter().map(|(_, raw, _)| raw.len() as u64).sum();
        if self.over_size(total) {
            let _ = reply.send(Err(ApplyError::TooLarge));
            return;
        }
        let last = members.len() - 1;
        let mut reply = Some(reply);
        for (i, (author, raw, update)) in members.into_iter().enumerate() {
            let origin = match (i == last, reply.take()) {
                (true, Some(reply)) => Origin::Http(reply),
                (_, r) => {
                    reply = r;
                    Origin::Part
                }
            };
            self.push_queued(Queued {
                idx: 0,
                origin,
                raw,
                update: Some(update),
                author,
                held_since: None,
                joined: i > 0,
                edit: None,
            });
        }
        self.maybe_start_commit();
    }

    pub(super) fn has_uncommitted(&self) -> bool {
        matches!(self.pipeline.inflight, Some(Inflight::Append { .. }))
            || self.pipeline.staged.is_some()
            || self.pipeline.reload_needed.is_some()
    }

    /// Queues an update for the next commit; gives the origin back if the document would
    /// grow past `max_doc_size`.
    pub(super) fn enqueue(
        &mut self,
        origin: Origin,
        raw: Bytes,
        update: Update,
        author: Option<Arc<str>>,
    ) -> Result<(), Origin> {
        if self.over_size(raw.len() as u64) {
            let limit = self.registry.config.max_doc_size;
            warn!(limit, "update refused: document would exceed max_doc_size");
            return Err(origin);
        }
        self.push_queued(Queued {
            idx: 0,
            origin,
            raw,
            update: Some(update),
            author,
            held_since: None,
            joined: false,
            edit: None,
        });
        Ok(())
    }

    /// Whether `extra` more bytes would take the document past `max_doc_size` (what is
    /// stored, applied and queued counted).
    pub(super) fn over_size(&self, extra: u64) -> bool {
        self.stored_bytes + self.pipeline.applied_bytes + self.pipeline.queued_bytes + extra
            > self.registry.config.max_doc_size
    }

    /// Puts `q` at the back of the queue under the next index (`q.idx` is replaced).
    pub(super) fn push_queued(&mut self, mut q: Queued) {
        self.pipeline.received_idx += 1;
        self.pipeline.queued_bytes += q.raw.len() as u64;
        q.idx = self.pipeline.received_idx;
        self.pipeline.queued.push_back(q);
    }

    /// Starts the next append if nothing is in flight (the staged batch, or the queued updates
    /// applied now), and stages a full batch if an append is in flight.
    pub(super) fn maybe_start_commit(&mut self) {
        while self.pipeline.reload_needed.is_none() {
            if self.pipeline.inflight.is_none() {
                if let Some(staged) = self.pipeline.staged.take() {
                    self.start_append(staged);
                    continue;
                }
                // The `Doc` holds only committed state: answer the reads waiting for that
                // before applying more.
                self.answer_deferred();
                if self.pipeline.queued.is_empty() {
                    return;
                }
            } else if !self.may_stage() {
                return;
            }
            let Some(next) = self.apply_next_batch() else {
                return; // an update was rejected: the Doc is rebuilt first
            };
            if self.pipeline.inflight.is_none() {
                self.start_append(next);
            } else {
                self.pipeline.staged = Some(next);
            }
        }
    }

    /// Whether to apply the next batch now, while an append is in flight: only a full one (a
    /// partial batch may still grow, and group commit wants it large), and only if no read
    /// waits for committed state and no snapshot is due.
    pub(super) fn may_stage(&self) -> bool {
        matches!(self.pipeline.inflight, Some(Inflight::Append { .. }))
            && self.pipeline.staged.is_none()
            && self.pipeline.queued.len() >= self.registry.config.commit_batch
            && self.reads.deferred_step1.is_empty()
            && self.reads.deferred_reads.is_empty()
            && !self.snapshot_due()
    }

    /// Appends an applied batch (nothing in flight); an empty one (every update a duplicate)
    /// only moves `committed_idx`.
    pub(super) fn start_append(&mut self, next: AppliedBatch) {
        let AppliedBatch {
            batch,
            upto_idx,
            committed_sv,
        } = next;
        if batch.is_empty() {
            self.pipeline.committed_idx = upto_idx;
            self.release_waiters();
            return;
        }
        self.pipeline.inflight = Some(self.append_op(batch, upto_idx, committed_sv, 0));
    }

    /// Applies up to `commit_batch` queued updates; `None` if one was rejected (the good ones
    /// are back in the queue and `reload_needed` is set).
    pub(super) fn apply_next_batch(&mut self) -> Option<AppliedBatch> {
        let committed_sv = self.doc.transact().state_vector();
        let max = self.registry.config.commit_batch;
        let mut batch: Vec<Applied> = Vec::new();
        let mut upto_idx = self.pipeline.committed_idx;
        let mut rejected = None;
        // A request's updates applied together go in one append, whatever `commit_batch`.
        while batch.len() < max || self.pipeline.queued.front().is_some_and(|q| q.joined) {
            let Some(q) = self.pipeline.queued.pop_front() else {
                break;
            };
            upto_idx = q.idx;
            self.pipeline.queued_bytes -= q.raw.len() as u64;
            let (raw, applied) = match q.edit {
                // A JSON edit is made on the Doc in its turn (`edits.rs`).
                Some(work) => match self.make_edit(*work) {
                    Some(made) => made,
                    None => {
                        if let Origin::Http(reply) = q.origin {
                            let _ = reply.send(Err(ApplyError::EditRefused));
                        }
                        continue;
                    }
                },
                None => {
                    let update = match q.update {
                        Some(u) => Ok(u),
                        None => Update::decode_v1(&q.raw).map_err(|e| e.to_string()),
                    };
                    // Only what integrates completely enters the document (`integrity.rs`).
                    let (raw, update) = match update {
                        Ok(mut u) => match self.admission(&mut u) {
                            Admission::Integrates { cut: None } => (q.raw, Ok(u)),
                            Admission::Integrates { cut: Some(_) } => {
                                // Deletions of what the document does not hold, from a connection
                                // holding an update: they may be of what that update inserts (a
                                // backspace after it), so they wait behind it instead of being cut.
                                let behind =
                                    q.origin.peer().and_then(|p| self.pipeline.held.waits_of(p));
                                if let Some(waits) = behind {
                                    let held = HeldUpdate {
                                        raw: q.raw,
                                        author: q.author,
                                        waits,
                                        since: q.held_since.unwrap_or_else(Instant::now),
                                    };
                                    self.hold(q.origin, held);
                                    continue;
                                }
                                self.registry.metrics.deletes_cut.inc();
                                (Bytes::from(u.encode_v1()), Ok(u))
                            }
                            Admission::Missing(missing) => {
                                let held = HeldUpdate {
                                    raw: q.raw,
                                    author: q.author,
                                    waits: wait_for(&self.state_vector(), missing),
                                    since: q.held_since.unwrap_or_else(Instant::now),
                                };
                                self.hold(q.origin, held);
                                continue;
                            }
                        },
                        Err(e) => (q.raw, Err(e)),
                    };
                    (
                        raw,
                        update.and_then(|u| self.apply(u).map_err(|e| e.to_string())),
                    )
                }
            };
            match applied {
                Ok(Some(changes)) => {
                    batch.push(Applied {
                        idx: q.idx,
                        origin: q.origin,
                        raw,
                        author: q.author,
                        changes,
                        joined: q.joined,
                    });
                    if !self.pipeline.held.is_empty() {
                        self.release_held();
                    }
                }
                Ok(None) => {
                    self.registry.metrics.updates_duplicate.inc();
                    if let Origin::Http(reply) = q.origin {
                        // Waiters stay in index order (durable acks wait for later indexes).
                        let at = self
                            .pipeline
                            .waiters
                            .partition_point(|(idx, _)| *idx <= q.idx);
                        self.pipeline
                            .waiters
                            .insert(at, (q.idx, Waiter::Http(reply)));
                    }
                }
                Err(e) => {
                    rejected = Some((q.origin, e, q.idx));
                    break;
                }
            }
        }
        if let Some((origin, e, idx)) = rejected {
            self.reject_update(batch, origin, e, committed_sv, idx);
            return None;
        }
        self.registry
            .metrics
            .updates_applied
            .inc_by(batch.len() as u64);
        self.pipeline.applied_bytes += batch.iter().map(|a| a.raw.len() as u64).sum::<u64>();
        Some(AppliedBatch {
            batch,
            upto_idx,
            committed_sv,
        })
    }

    /// yrs rejected an update, and may have integrated part of it: the good ones go back in
    /// the queue, its sender is closed (1007) or answered (HTTP), and the Doc is rebuilt
    /// from storage (`committed_sv`: what peers may have seen) before they are applied again.
    fn reject_update(
        &mut self,
        good: Vec<Applied>,
        origin: Origin,
        e: String,
        committed_sv: StateVector,
        idx: u64,
    ) {
        // Its place in the order is done with: an empty update stands in for it after the
        // good ones, so what waits for it (a durable acknowledgement, another peer's barrier)
        // is answered once they commit, not only after a later update does.
        self.pipeline.queued_bytes += Update::EMPTY_V1.len() as u64;
        self.pipeline.queued.push_front(Queued {
            idx,
            origin: Origin::Part,
            raw: Bytes::from_static(Update::EMPTY_V1),
            update: None,
            author: None,
            held_since: None,
            joined: false,
            edit: None,
        });
        self.requeue_unapplied(good);
        warn!(error = %e, "update rejected by yrs");
        self.registry.metrics.malformed_messages.inc();
        match origin {
            Origin::Peer(peer) => {
                self.close_peer(peer, CloseReason::new(close::MALFORMED, "invalid update"))
            }
            Origin::Http(reply) => {
                let _ = reply.send(Err(ApplyError::Invalid(e)));
            }
            Origin::Part => {}
        }
        self.pipeline.reload_needed = Some(committed_sv);
    }

    /// Puts updates taken from the queue back at its front, in order, to be applied again.
    pub(super) fn requeue_unapplied(&mut self, batch: Vec<Applied>) {
        for a in batch.into_iter().rev() {
            self.pipeline.queued_bytes += a.raw.len() as u64;
            self.pipeline.queued.push_front(Queued {
                idx: a.idx,
                origin: a.origin,
                raw: a.raw,
                update: None,
                author: a.author,
                // Applied once already, onto the state it expected, which the updates
                // before it rebuild.
                held_since: None,
                joined: a.joined,
                edit: None,
            });
        }
    }

    /// [`Self::requeue_unapplied`] for a batch that was applied and counted in `applied_bytes`.
    pub(super) fn requeue_applied(&mut self, batch: Vec<Applied>) {
        self.pipeline.applied_bytes -= batch.iter().map(|a| a.raw.len() as u64).sum::<u64>();
        self.requeue_unapplied(batch);
    }

    /// Applies one update; what it changed, `None` if nothing.
    pub(super) fn apply(
        &mut self,
        update: Update,
    ) -> Result<Option<Changes>, yrs::error::UpdateError> {
        // Whatever happens, the Doc may change: answers encoded before are stale.
        self.answers.invalidate();
        let mut txn = self.doc.transact_mut();
        txn.apply_update(update)?;
        // An update whose dependencies are missing is stashed by yrs, not integrated; it is new
        // information all the same and must be logged.
        let changed = !txn.insert_set().is_empty()
            || !txn.delete_set().is_empty()
            || txn.has_missing_updates();
        Ok(changed.then(|| Changes::of(&txn)))
    }
}
