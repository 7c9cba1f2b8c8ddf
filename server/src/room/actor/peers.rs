//! Peers: joining (first messages, expiry, role changes), their messages, and sending to
//! them through their bounded queues (a peer that overflows is closed and resyncs).

use std::collections::{BTreeSet, HashMap};

use bytes::Bytes;
use tokio::time::{Duration, Instant};
use tracing::{debug, warn};
use yrs::sync::AwarenessUpdate;

use super::Room;
use crate::close;
use crate::protocol;
use crate::room::awareness::{AwarenessTable, Sender};
use crate::room::queue::{Answer, QueueTx, SendError};
use crate::room::{CloseReason, JoinError, PeerAuth, PeerFilter, PeerId, PeerLink, PeerMsg};

/// The instant a token expiring at `exp` (seconds since the epoch) runs out, on the room's
/// clock.
pub(super) fn expiry_instant(exp: i64) -> Instant {
    let left_ms = exp
        .saturating_mul(1000)
        .saturating_sub(crate::storage::now_ms());
    Instant::now() + Duration::from_millis(u64::try_from(left_ms).unwrap_or(0))
}

/// One connection in the room: its outbound queue, what it may do, and when its token
/// expires.
pub(super) struct Peer {
    pub(super) tx: QueueTx,
    pub(super) auth: PeerAuth,
    /// When the peer's token expires (its entry in `Peers::expiries`).
    pub(super) expires: Option<Instant>,
}

/// The room's peers, and what it keeps about them.
#[derive(Default)]
pub(super) struct Peers {
    pub(super) by_id: HashMap<PeerId, Peer>,
    /// Peers whose token expires, by when: the room closes each with 4401 then.
    pub(super) expiries: BTreeSet<(Instant, PeerId)>,
    /// The newest role change acted on, per user: a peer joining with a permission read
    /// before it is closed (4403) at once.
    role_changes: HashMap<String, i64>,
    pub(super) awareness: AwarenessTable,
    /// When the awareness changes held since the last relay go out (`awareness_tick`);
    /// `None` when none is held.
    pub(super) awareness_due: Option<Instant>,
}

impl Room {
    pub(super) fn join(&mut self, link: PeerLink) -> Result<(), JoinError> {
        if self.peers.by_id.len() >= self.registry.config.max_connections {
            return Err(JoinError::Full);
        }
        let PeerLink { id, auth, tx } = link;
        // The queue is empty and at least 4 long (config), so these cannot overflow (the byte
        // bound lets the first frame in whatever its size; the awareness table, if it does
        // not fit behind it, is what the client's first QueryAwareness would get anyway).
        // (A Hocuspocus peer gets the Step 1 in answer to its own, as the provider expects.)
        if !auth.hocuspocus {
            let _ = tx.try_send(self.answers.step1(&self.doc));
        }
        if let Some(all) = self.peers.awareness.full_state_frame() {
            let _ = tx.try_send_answer(Answer::Awareness, all);
        }
        let expires = auth.expires_at.map(expiry_instant);
        if let Some(at) = expires {
            self.peers.expiries.insert((at, id));
        }
        let stale = auth
            .user
            .as_deref()
            .and_then(|user| self.peers.role_changes.get(user))
            .is_some_and(|&change| auth.seen_change < change);
        self.peers.by_id.insert(id, Peer { tx, auth, expires });
        self.report();
        self.unload_at = None;
        if stale {
            // Its permission was read before a role change this room has already acted on
            // (the change committed between the read and the join).
            let reason = CloseReason::new(close::FORBIDDEN, "access changed; reconnect");
            self.close_peer(id, reason);
        }
        Ok(())
    }

    /// Closes every peer whose token has expired by `now` (4401: reconnect with a new token).
    pub(super) fn close_expired(&mut self, now: Instant) {
        while let Some(&(at, peer)) = self.peers.expiries.first() {
            if at > now {
                break;
            }
            self.peers.expiries.pop_first();
            self.registry.metrics.tokens_expired.inc();
            debug!(peer, "token expired; closing the peer");
            self.close_peer(
                peer,
                CloseReason::new(
                    close::TOKEN_EXPIRED,
                    "token expired, reconnect with a new one",
                ),
            );
        }
    }

    pub(super) fn on_message(&mut self, peer: PeerId, msg: PeerMsg) {
        match msg {
            PeerMsg::Update { raw, update } => self.on_peer_update(peer, raw, update),
            PeerMsg::Step1(sv) => {
                if self
                    .peers
                    .by_id
                    .get(&peer)
                    .is_some_and(|p| p.auth.hocuspocus)
                {
                    // The provider counts its own Step 1 as unsynced until it has answered
                    // the server's Step 1 and heard that answer applied.
                    let step1 = self.answers.step1(&self.doc);
                    self.send_to(peer, step1);
                }
                if self.has_uncommitted() {
                    self.reads.deferred_step1.insert(peer, sv);
                    self.answer_from_committed();
                } else {
                    self.answer_step1(peer, &sv);
                }
            }
            PeerMsg::Awareness { update, .. } => {
                let Some(sender) = self.peers.by_id.get(&peer) else {
                    return;
                };
                let (user, echo) = (sender.auth.user.clone(), sender.auth.hocuspocus);
                let verified = sender.auth.verified();
                let peers = &self.peers.by_id;
                // Another connection's client id: only if it is the same user's (a reconnect
                // racing the old socket's end), or once that connection is gone and its
                // grace period over (`awareness.rs`).
                let is_open = |owner: PeerId| peers.contains_key(&owner);
                let from = Sender {
                    peer,
                    user: user.as_deref(),
                    is_open: &is_open,
                    grace: self.registry.config.presence_grace,
                    verified: verified.as_ref(),
                };
                let applied = self.peers.awareness.apply(&update, &from, Instant::now());
                if applied.refused > 0 {
                    self.registry
                        .metrics
                        .awareness_refused
                        .inc_by(applied.refused as u64);
                }
                if let Some(relay) = applied.relay {
                    // Hocuspocus echoes awareness to its sender too: a provider that hears
                    // nothing for 30 s reconnects, and its 15-second awareness renewal coming
                    // back is what it hears on a quiet document.
                    self.relay_awareness(relay, (!echo).then_some(peer));
                }
            }
            PeerMsg::QueryAwareness => {
                if self.answer_pending(peer, Answer::Awareness) {
                    return;
                }
                if let Some(all) = self.peers.awareness.full_state_frame() {
                    self.send_answer(peer, Answer::Awareness, all);
                }
            }
            PeerMsg::DurableAck(raw) => self.on_ack_request(peer, raw),
        }
    }

    /// Replaces a peer's credential (a token refresh): its permission, token and expiry. A
    /// refresh that lowers the permission takes effect for the peer's next update.
    pub(super) fn reauth(&mut self, peer: PeerId, mut auth: PeerAuth) -> bool {
        let Some(p) = self.peers.by_id.get_mut(&peer) else {
            return false;
        };
        // A relayed refresh carries no profile: the one read at the join stands.
        if auth.profile.is_none() && auth.user == p.auth.user {
            auth.profile = p.auth.profile.take();
        }
        // Nor the protocol, which a refresh never changes: a Hocuspocus peer stays one.
        auth.hocuspocus = p.auth.hocuspocus;
        if let Some(at) = p.expires.take() {
            self.peers.expiries.remove(&(at, peer));
        }
        let expires = auth.expires_at.map(expiry_instant);
        if let Some(at) = expires {
            self.peers.expiries.insert((at, peer));
        }
        p.expires = expires;
        p.auth = auth;
        true
    }

    /// Relays an awareness change to the peers. With `awareness_tick` zero it goes out at once
    /// to every peer but `except`; otherwise it is held, and when the tick that began with the
    /// first change held ends ([`Room::flush_awareness`]), every change held goes out as one
    /// frame, encoded once, to every peer: each peer gets at most one awareness frame per tick
    /// whatever the number of clients changing, instead of one per change. The sender gets
    /// its own change back in that frame, with the clock it already has, which y-protocols
    /// ignores (and a Hocuspocus provider counts on hearing it).
    pub(super) fn relay_awareness(&mut self, change: AwarenessUpdate, except: Option<PeerId>) {
        let tick = self.registry.config.awareness_tick;
        if tick.is_zero() {
            self.broadcast(&protocol::encode_awareness(&change), except);
            return;
        }
        self.peers.awareness.hold(change);
        if self.peers.awareness_due.is_none() {
            self.peers.awareness_due = Some(Instant::now() + tick);
        }
    }

    /// Sends the awareness changes held this tick ([`Room::relay_awareness`]).
    pub(super) fn flush_awareness(&mut self) {
        self.peers.awareness_due = None;
        if let Some(held) = self.peers.awareness.take_held() {
            self.registry.metrics.awareness_relays.inc();
            self.broadcast(&protocol::encode_awareness(&held), None);
        }
    }

    /// Sends a stateless message to every Hocuspocus peer; returns how many.
    pub(super) fn send_stateless(&mut self, payload: &str) -> usize {
        let frame = protocol::encode_stateless(payload);
        let targets: Vec<PeerId> = self
            .peers
            .by_id
            .iter()
            .filter(|(_, p)| p.auth.hocuspocus)
            .map(|(id, _)| *id)
            .collect();
        for &id in &targets {
            self.send_to(id, frame.clone());
        }
        targets.len()
    }

    /// Sends `frame` to every peer but `except`. A peer whose queue is full is closed with
    /// 1013: it will reconnect and resync, so nothing is dropped silently. Returns how many
    /// peers it was queued to.
    pub(super) fn broadcast(&mut self, frame: &Bytes, except: Option<PeerId>) -> u64 {
        let mut overflowed = Vec::new();
        let mut queued = 0;
        for (id, peer) in &self.peers.by_id {
            if Some(*id) == except {
                continue;
            }
            match peer.tx.try_send(frame.clone()) {
                Ok(()) => queued += 1,
                Err(SendError::Full) => overflowed.push(*id),
                Err(SendError::Disconnected) => {}
            }
        }
        for id in overflowed {
            self.overflow(id);
        }
        queued
    }

    pub(super) fn send_to(&mut self, peer: PeerId, frame: Bytes) {
        let full = match self.peers.by_id.get(&peer) {
            Some(p) => matches!(p.tx.try_send(frame), Err(SendError::Full)),
            None => false,
        };
        if full {
            self.overflow(peer);
        }
    }

    pub(super) fn overflow(&mut self, peer: PeerId) {
        self.registry.metrics.broadcast_overflows.inc();
        warn!(
            peer,
            "outbound queue full; closing the peer (it will resync)"
        );
        self.close_peer(
            peer,
            CloseReason::new(close::TRY_AGAIN_LATER, "outbound queue full; reconnect"),
        );
    }

    /// Tells a peer's connection to close and forgets the peer.
    pub(super) fn close_peer(&mut self, peer: PeerId, reason: CloseReason) {
        if let Some(p) = self.peers.by_id.get(&peer) {
            p.tx.kill(reason);
        }
        self.remove_peer(peer);
    }

    pub(super) fn remove_peer(&mut self, peer: PeerId) {
        let Some(gone) = self.peers.by_id.remove(&peer) else {
            return;
        };
        if let Some(at) = gone.expires {
            self.peers.expiries.remove(&(at, peer));
        }
        self.drop_held(peer);
        self.reads.deferred_step1.remove(&peer);
        if let Some(removal) = self.peers.awareness.remove_peer(peer, Instant::now()) {
            self.relay_awareness(removal, None);
        }
        if self.peers.by_id.is_empty() {
            self.unload_at = Some(Instant::now() + self.registry.config.unload_delay);
        }
        self.report();
    }

    pub(super) fn close_all(&mut self, reason: CloseReason) {
        self.stats
            .peers
            .store(0, std::sync::atomic::Ordering::Relaxed);
        for (_, peer) in self.peers.by_id.drain() {
            peer.tx.kill(reason.clone());
        }
        self.peers.expiries.clear();
    }

    /// Closes the peers `filter` matches (a delete, a revocation, a role change). A role
    /// change is remembered, so a peer authorized before it that joins later is closed too.
    pub(super) fn close_matching(&mut self, filter: &PeerFilter, reason: CloseReason) {
        if let PeerFilter::UserBefore(user, change) = filter {
            let newest = self.peers.role_changes.entry(user.clone()).or_default();
            *newest = (*newest).max(*change);
        }
        let matching: Vec<PeerId> = self
            .peers
            .by_id
            .iter()
            .filter(|(_, p)| {
                let (user, token) = (p.auth.user.as_deref(), p.auth.token_id.as_deref());
                filter.matches(user, token, p.auth.seen_change)
            })
            .map(|(id, _)| *id)
            .collect();
        for id in matching {
            self.close_peer(id, reason.clone());
        }
    }
}
