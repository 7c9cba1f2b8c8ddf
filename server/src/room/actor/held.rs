//! Updates a connection sent ahead of what they depend on, held for that connection alone.
//!
//! Stock providers can send an update before one it depends on (a tab relaying another tab's
//! edit over a BroadcastChannel, a reconnect mid-send): the room holds such an update, neither
//! applied nor logged nor relayed, until what it needs arrives from anyone, then integrates it.
//! What one connection holds is bounded in bytes (`held_update_bytes`) and in time
//! (`held_update_timeout`); past either the connection is closed and resyncs, and what it held
//! is dropped. Nothing held outlives its connection.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use tokio::time::{Duration, Instant};
use tracing::{debug, warn};
use yrs::{ReadTxn, StateVector, Transact, ID};

use super::update::{Origin, Queued, Waiter};
use super::Room;
use crate::close;
use crate::room::{ApplyError, CloseReason, PeerId};

/// One update held back.
pub(super) struct HeldUpdate {
    pub(super) raw: Bytes,
    pub(super) author: Option<Arc<str>>,
    /// The id it needs first.
    pub(super) waits: ID,
    /// When it was first held (a release that finds it still missing keeps this).
    pub(super) since: Instant,
}

/// What one connection holds, in the order it sent it.
#[derive(Default)]
struct PeerHeld {
    updates: VecDeque<HeldUpdate>,
    bytes: u64,
}

/// Every connection's held updates.
pub(super) struct Held {
    by_peer: HashMap<PeerId, PeerHeld>,
    /// Bytes held by all of the room's connections.
    total: u64,
    /// Bytes held by all connections (`quire_held_update_bytes`).
    gauge: prometheus::IntGauge,
}

/// Why an update could not be held.
pub(super) struct OverBound;

impl Held {
    pub(super) fn new(gauge: prometheus::IntGauge) -> Held {
        Held {
            by_peer: HashMap::new(),
            total: 0,
            gauge,
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.by_peer.is_empty()
    }

    /// Whether `peer` holds anything.
    pub(super) fn holds(&self, peer: PeerId) -> bool {
        self.by_peer.contains_key(&peer)
    }

    /// What `peer`'s first held update waits for, if it holds any.
    pub(super) fn waits_of(&self, peer: PeerId) -> Option<ID> {
        self.by_peer.get(&peer)?.updates.front().map(|u| u.waits)
    }

    /// Holds `update` for `peer`, unless that would take it past `max_bytes`, or the room's
    /// connections together past `max_room` (many connections each holding their share).
    pub(super) fn hold(
        &mut self,
        peer: PeerId,
        update: HeldUpdate,
        max_bytes: u64,
        max_room: u64,
    ) -> Result<(), OverBound> {
        let held = self.by_peer.entry(peer).or_default();
        let size = update.raw.len() as u64;
        if held.bytes + size > max_bytes || self.total + size > max_room {
            if held.updates.is_empty() {
                self.by_peer.remove(&peer);
            }
            return Err(OverBound);
        }
        held.bytes += size;
        held.updates.push_back(update);
        self.total += size;
        self.gauge.add(size as i64);
        Ok(())
    }

    /// Takes out every update of each connection one of whose updates waits for an id `sv`
    /// now holds (all of that connection's, in order: one may need another).
    pub(super) fn take_ready(&mut self, sv: &StateVector) -> Vec<(PeerId, Vec<HeldUpdate>)> {
        let ready: Vec<PeerId> = self
            .by_peer
            .iter()
            .filter(|(_, h)| {
                h.updates
                    .iter()
                    .any(|u| sv.get(&u.waits.client) > u.waits.clock)
            })
            .map(|(peer, _)| *peer)
            .collect();
        ready
            .into_iter()
            .filter_map(|peer| self.drop_peer(peer).map(|updates| (peer, updates)))
            .collect()
    }

    /// Forgets what `peer` holds; what it held, if anything.
    pub(super) fn drop_peer(&mut self, peer: PeerId) -> Option<Vec<HeldUpdate>> {
        let held = self.by_peer.remove(&peer)?;
        self.total -= held.bytes;
        self.gauge.sub(held.bytes as i64);
        Some(held.updates.into())
    }

    /// When the oldest held update passes `timeout`.
    pub(super) fn next_deadline(&self, timeout: Duration) -> Option<Instant> {
        self.by_peer
            .values()
            .filter_map(|h| h.updates.iter().map(|u| u.since).min())
            .min()
            .map(|oldest| oldest + timeout)
    }

    /// The connections holding an update older than `timeout` at `now`.
    pub(super) fn expired(&self, now: Instant, timeout: Duration) -> Vec<PeerId> {
        self.by_peer
            .iter()
            .filter(|(_, h)| h.updates.iter().any(|u| u.since + timeout <= now))
            .map(|(peer, _)| *peer)
            .collect()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let bytes: u64 = self.by_peer.values().map(|h| h.bytes).sum();
        self.gauge.sub(bytes as i64);
    }
}

/// The room's side: holding, releasing and expiring peers' updates.
impl Room {
    /// Holds an update that does not integrate yet for the peer that sent it (closing the
    /// peer if that would pass `held_update_bytes`); an HTTP caller is told at once.
    pub(super) fn hold(&mut self, origin: Origin, update: HeldUpdate) {
        let missing = update.waits;
        match origin {
            Origin::Part => {
                // Checked with its group before it was queued, onto less than the document
                // holds now: cannot happen.
                warn!("an update applied with others no longer integrates; dropped");
            }
            Origin::Http(reply) => {
                self.registry.metrics.updates_unintegrable.inc();
                let _ = reply.send(Err(ApplyError::Missing(missing_text(missing))));
            }
            Origin::Peer(peer) => {
                if !self.peers.by_id.contains_key(&peer) {
                    return; // gone: what it sent goes with it
                }
                let max = self.registry.config.held_update_bytes;
                // Held updates are inbound bytes the room keeps: all of them together within
                // `room_queue_bytes`.
                let max_room = self.registry.config.room_queue_bytes as u64;
                debug!(
                    peer,
                    client = missing.client.get(),
                    clock = missing.clock,
                    "update held: a dependency is missing"
                );
                if self.pipeline.held.hold(peer, update, max, max_room).is_ok() {
                    self.registry.metrics.updates_held.inc();
                    return;
                }
                self.registry.metrics.held_update_closes.inc();
                self.drop_held(peer);
                let why = "updates wait on content never sent (held_update_bytes); resync";
                // (Or the room's connections hold `room_queue_bytes` between them already.)
                self.close_peer(peer, CloseReason::new(close::TRY_AGAIN_LATER, why));
            }
        }
    }

    /// After an update applied: the held updates of each peer one of which now has what it
    /// waited for go back in the queue, in order, and are checked again in their turn; the
    /// durable acknowledgements withheld for that peer then wait for them to commit.
    pub(super) fn release_held(&mut self) {
        let sv = self.state_vector();
        for (peer, updates) in self.pipeline.held.take_ready(&sv) {
            for u in updates {
                self.push_queued(Queued {
                    idx: 0,
                    origin: Origin::Peer(peer),
                    raw: u.raw,
                    update: None,
                    author: u.author,
                    held_since: Some(u.since),
                    joined: false,
                    edit: None,
                });
            }
            // Its acknowledgements, withheld or waiting for an earlier position, now wait for
            // the released updates to commit.
            let idx = self.pipeline.received_idx;
            let (mine, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.pipeline.waiters)
                .into_iter()
                .partition(|(_, w)| matches!(w, Waiter::Ack(p, _) if *p == peer));
            self.pipeline.waiters = rest.into();
            for (_, w) in mine {
                self.pipeline.waiters.push_back((idx, w));
            }
            if let Some(at) = self.pipeline.withheld.iter().position(|(p, _)| *p == peer) {
                let (_, raw) = self.pipeline.withheld.remove(at);
                self.pipeline
                    .waiters
                    .push_back((idx, Waiter::Ack(peer, raw)));
            }
        }
    }

    /// Forgets what a peer held, and its withheld acknowledgement.
    pub(super) fn drop_held(&mut self, peer: PeerId) {
        self.pipeline.held.drop_peer(peer);
        self.pipeline.withheld.retain(|(p, _)| *p != peer);
    }

    /// When the oldest held update passes `held_update_timeout`.
    pub(super) fn held_due(&self) -> Option<Instant> {
        let timeout = self.registry.config.held_update_timeout;
        self.pipeline.held.next_deadline(timeout)
    }

    /// Closes the peers that held an update past `held_update_timeout`: what it needs never
    /// came. They resync (and send what they have again).
    pub(super) fn expire_held(&mut self, now: Instant) {
        let timeout = self.registry.config.held_update_timeout;
        for peer in self.pipeline.held.expired(now, timeout) {
            self.registry.metrics.held_update_closes.inc();
            self.drop_held(peer);
            let why =
                "an update waited too long for content never sent (held_update_timeout); resync";
            self.close_peer(peer, CloseReason::new(close::TRY_AGAIN_LATER, why));
        }
    }
}
impl Room {
    /// The `Doc`'s state vector.
    pub(super) fn state_vector(&self) -> StateVector {
        self.doc.transact().state_vector()
    }

    /// Whether `update` integrates into the `Doc` (`integrity.rs`), its deletions of what
    /// nobody holds cut.
    pub(super) fn admission(&self, update: &mut yrs::Update) -> crate::integrity::Admission {
        crate::integrity::admit(&self.state_vector(), update)
    }
}

/// How an HTTP caller is told what its update lacks.
pub(super) fn missing_text(missing: ID) -> String {
    format!(
        "the update depends on content the document does not hold (client {}, clock {})",
        missing.client, missing.clock
    )
}

#[cfg(test)]
mod tests {
    use super::{Held, HeldUpdate};
    use bytes::Bytes;
    use tokio::time::{Duration, Instant};
    use yrs::{ClientID, StateVector, ID};

    fn c(id: u64) -> ClientID {
        ClientID::new(id)
    }

    fn update(waits: ID, since: Instant, len: usize) -> HeldUpdate {
        HeldUpdate {
            raw: Bytes::from(vec![0; len]),
            author: None,
            waits,
            since,
        }
    }

    #[test]
    fn held_updates_are_bounded_released_in_order_and_expire() {
        let gauge = prometheus::IntGauge::new("held", "held").expect("gauge");
        let mut held = Held::new(gauge.clone());
        let t0 = Instant::now();
        let (a, b) = (1, 2);
        assert!(held
            .hold(a, update(ID::new(c(7), 3), t0, 10), 25, 1000)
            .is_ok());
        assert!(held
            .hold(a, update(ID::new(c(8), 0), t0, 10), 25, 1000)
            .is_ok());
        assert!(
            held.hold(a, update(ID::new(c(8), 0), t0, 10), 25, 1000)
                .is_err(),
            "over 25 bytes"
        );
        let later = t0 + Duration::from_secs(5);
        assert!(held
            .hold(b, update(ID::new(c(9), 0), later, 1), 25, 1000)
            .is_ok());
        assert!(
            held.hold(b, update(ID::new(c(9), 0), t0, 3), 25, 23)
                .is_err(),
            "the room's connections together over 23 bytes"
        );
        assert_eq!(gauge.get(), 21);
        // Client 7 reaches clock 3 only: nothing is ready.
        let mut sv = StateVector::default();
        sv.set_max(c(7), 3);
        assert!(held.take_ready(&sv).is_empty());
        // At clock 4 peer a's first is ready: both of a's come out, in order.
        sv.set_max(c(7), 4);
        let ready = held.take_ready(&sv);
        assert_eq!(ready.len(), 1);
        assert_eq!(ready[0].0, a);
        assert_eq!(ready[0].1[1].waits, ID::new(c(8), 0));
        assert_eq!(gauge.get(), 1);
        assert_eq!(
            held.next_deadline(Duration::from_secs(10)),
            Some(t0 + Duration::from_secs(15))
        );
        assert!(held
            .expired(t0 + Duration::from_secs(14), Duration::from_secs(10))
            .is_empty());
        assert_eq!(
            held.expired(t0 + Duration::from_secs(15), Duration::from_secs(10)),
            vec![b]
        );
        drop(held);
        assert_eq!(gauge.get(), 0, "a dropped room gives its bytes back");
    }
}
