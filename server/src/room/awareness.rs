//! The room's table of awareness (presence) states, keyed by Yjs client id.
//!
//! The server never has presence of its own, so this is a plain relay table rather than
//! `yrs::sync::Awareness` (which owns a `Doc` and a local state): it applies the y-protocols
//! rules (a newer clock wins; an equal clock with a `null` state removes), remembers which
//! connection introduced each client id so its states can be removed when it closes, and drops
//! states that were not refreshed in time.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::time::{Duration, Instant};
use yrs::sync::awareness::AwarenessUpdateEntry;
use yrs::sync::AwarenessUpdate;
use yrs::ClientID;

use super::PeerId;

const NULL: &str = "null";

struct State {
    clock: u32,
    /// `None` once removed; the clock is kept so an older state cannot come back.
    json: Option<Arc<str>>,
    last_updated: Instant,
    owner: PeerId,
}

#[derive(Default)]
pub struct AwarenessTable {
    states: HashMap<u64, State>,
    /// The encoded full state ([`Self::full_state_frame`]) until the table changes; the inner
    /// `None` when there is no live state.
    frame: Option<Option<bytes::Bytes>>,
}

impl AwarenessTable {
    /// Applies an update from `peer`. Returns true if any state changed (then the message is
    /// relayed to the other peers).
    pub fn apply(&mut self, update: &AwarenessUpdate, peer: PeerId, now: Instant) -> bool {
        // Even an update that changes nothing visible may add a removed client's clock.
        self.frame = None;
        let mut changed = false;
        for (client, entry) in &update.clients {
            let json = (entry.json.as_ref() != NULL).then(|| entry.json.clone());
            match self.states.get_mut(&client.get()) {
                Some(s) => {
                    let removes = s.clock == entry.clock && json.is_none() && s.json.is_some();
                    if s.clock < entry.clock || removes {
                        s.clock = entry.clock;
                        s.json = json;
                        s.last_updated = now;
                        s.owner = peer;
                        changed = true;
                    }
                }
                None => {
                    changed |= json.is_some();
                    self.states.insert(
                        client.get(),
                        State {
                            clock: entry.clock,
                            json,
                            last_updated: now,
                            owner: peer,
                        },
                    );
                }
            }
        }
        changed
    }

    /// Removes every live state `peer` introduced; returns the removal to broadcast.
    pub fn remove_peer(&mut self, peer: PeerId, now: Instant) -> Option<AwarenessUpdate> {
        let ids: Vec<u64> = self
            .states
            .iter()
            .filter(|(_, s)| s.owner == peer && s.json.is_some())
            .map(|(id, _)| *id)
            .collect();
        self.remove(ids, now)
    }

    /// Removes states not refreshed within `timeout`, and forgets old removals.
    pub fn expire(&mut self, now: Instant, timeout: Duration) -> Option<AwarenessUpdate> {
        self.states
            .retain(|_, s| s.json.is_some() || now.duration_since(s.last_updated) < timeout);
        let ids: Vec<u64> = self
            .states
            .iter()
            .filter(|(_, s)| s.json.is_some() && now.duration_since(s.last_updated) >= timeout)
            .map(|(id, _)| *id)
            .collect();
        self.remove(ids, now)
    }

    fn remove(&mut self, ids: Vec<u64>, now: Instant) -> Option<AwarenessUpdate> {
        if ids.is_empty() {
            return None;
        }
        self.frame = None;
        let mut clients = HashMap::with_capacity(ids.len());
        for id in ids {
            if let Some(s) = self.states.get_mut(&id) {
                s.clock = s.clock.wrapping_add(1);
                s.json = None;
                s.last_updated = now;
                clients.insert(
                    ClientID::new(id),
                    AwarenessUpdateEntry {
                        clock: s.clock,
                        json: Arc::from(NULL),
                    },
                );
            }
        }
        Some(AwarenessUpdate { clients })
    }

    /// Every live state, for a newcomer or a QueryAwareness. `None` when there is none.
    pub fn full_state(&self) -> Option<AwarenessUpdate> {
        let clients: HashMap<_, _> = self
            .states
            .iter()
            .filter_map(|(id, s)| {
                s.json.as_ref().map(|json| {
                    (
                        ClientID::new(*id),
                        AwarenessUpdateEntry {
                            clock: s.clock,
                            json: json.clone(),
                        },
                    )
                })
            })
            .collect();
        (!clients.is_empty()).then_some(AwarenessUpdate { clients })
    }

    /// [`Self::full_state`] as an encoded awareness message, encoded once until the table
    /// changes and shared by every peer that asks meanwhile.
    pub fn full_state_frame(&mut self) -> Option<bytes::Bytes> {
        if let Some(frame) = &self.frame {
            return frame.clone();
        }
        let frame = self
            .full_state()
            .map(|all| crate::protocol::encode_awareness(&all));
        self.frame = Some(frame.clone());
        frame
    }

    pub fn is_empty(&self) -> bool {
        self.states.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn update(entries: &[(u64, u32, &str)]) -> AwarenessUpdate {
        AwarenessUpdate {
            clients: entries
                .iter()
                .map(|(id, clock, json)| {
                    (
                        ClientID::new(*id),
                        AwarenessUpdateEntry {
                            clock: *clock,
                            json: Arc::from(*json),
                        },
                    )
                })
                .collect(),
        }
    }

    #[test]
    fn newer_clock_wins_and_equal_clock_null_removes() {
        let now = Instant::now();
        let mut t = AwarenessTable::default();
        assert!(t.apply(&update(&[(1, 1, "{\"a\":1}")]), 10, now));
        assert!(
            !t.apply(&update(&[(1, 1, "{\"a\":2}")]), 10, now),
            "same clock, not null"
        );
        assert!(
            !t.apply(&update(&[(1, 0, "{\"a\":3}")]), 10, now),
            "older clock"
        );
        assert!(t.apply(&update(&[(1, 2, "{\"a\":4}")]), 10, now));
        assert!(
            t.apply(&update(&[(1, 2, "null")]), 10, now),
            "equal clock with null"
        );
        assert!(t.full_state().is_none());
    }

    #[test]
    fn closing_a_peer_removes_only_its_states() {
        let now = Instant::now();
        let mut t = AwarenessTable::default();
        t.apply(&update(&[(1, 1, "{}"), (2, 5, "{}")]), 10, now);
        t.apply(&update(&[(3, 1, "{}")]), 11, now);
        let removal = t.remove_peer(10, now).expect("peer 10 had states");
        assert_eq!(removal.clients.len(), 2);
        assert_eq!(removal.clients[&ClientID::new(2)].clock, 6);
        assert_eq!(&*removal.clients[&ClientID::new(2)].json, "null");
        let left = t.full_state().expect("peer 11 remains");
        assert_eq!(
            left.clients.keys().map(|c| c.get()).collect::<Vec<_>>(),
            vec![3]
        );
    }

    #[test]
    fn the_encoded_table_is_shared_until_it_changes() {
        let now = Instant::now();
        let mut t = AwarenessTable::default();
        assert!(t.full_state_frame().is_none());
        t.apply(&update(&[(1, 1, "{}")]), 10, now);
        let a = t.full_state_frame().expect("one state");
        let b = t.full_state_frame().expect("one state");
        assert_eq!(a.as_ptr(), b.as_ptr(), "encoded once");
        t.apply(&update(&[(2, 1, "{}")]), 11, now);
        let c = t.full_state_frame().expect("two states");
        assert!(c.len() > a.len(), "re-encoded after a change");
        t.remove_peer(10, now);
        t.remove_peer(11, now);
        assert!(t.full_state_frame().is_none());
    }

    #[test]
    fn stale_states_expire() {
        let start = Instant::now();
        let mut t = AwarenessTable::default();
        t.apply(&update(&[(1, 1, "{}")]), 10, start);
        let timeout = Duration::from_secs(30);
        assert!(t.expire(start + Duration::from_secs(29), timeout).is_none());
        let gone = t
            .expire(start + Duration::from_secs(31), timeout)
            .expect("expired");
        assert_eq!(gone.clients.len(), 1);
        assert!(t.full_state().is_none());
    }
}
