//! The room's table of awareness (presence) states, keyed by Yjs client id.
//!
//! The server never has presence of its own, so this is a plain relay table rather than
//! `yrs::sync::Awareness` (which owns a `Doc` and a local state): it applies the y-protocols
//! rules (a newer clock wins; an equal clock with a `null` state removes), remembers which
//! connection introduced each client id so its states can be removed when it closes, and drops
//! states that were not refreshed in time.
//!
//! Presence cannot be forged: a connection may set or remove only the states of client ids it
//! introduced, of ids a connection of the same user holds (a reconnect that arrives before the
//! old socket is noticed dead keeps its presence), or of ids whose connection closed: those
//! stay bound to their user for a grace period (`presence_grace`, at least the awareness
//! timeout), within which only the same user may take them back, so a user who reconnects
//! finds its id its own. Ids of anonymous connections (no user) are bound to nothing. Any
//! other entry is dropped and counted. Every state the room keeps and relays carries, under
//! the reserved key [`VERIFIED_KEY`], the identity the server verified for the connection that
//! set it; a client's own value for that key is replaced.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::time::{Duration, Instant};
use yrs::sync::awareness::AwarenessUpdateEntry;
use yrs::sync::AwarenessUpdate;
use yrs::ClientID;

use super::PeerId;

const NULL: &str = "null";

/// The reserved key of every awareness state the server relays: `{"user", "name", "color"}`
/// as the server verified them (docs/protocol.md). Clients cannot set it.
pub const VERIFIED_KEY: &str = "quire";

/// Who sent an awareness update, as the room knows them.
pub struct Sender<'a> {
    pub peer: PeerId,
    /// The sender's user (`None`: anonymous).
    pub user: Option<&'a str>,
    /// Whether connection `owner` is open.
    pub is_open: &'a dyn Fn(PeerId) -> bool,
    /// How long a closed connection's client ids stay its user's.
    pub grace: Duration,
    /// The identity stamped into the sender's states (`None`: the key is removed).
    pub verified: Option<&'a serde_json::Value>,
}

/// What applying an update did.
#[derive(Debug, Default)]
pub struct Applied {
    /// The entries that changed something, stamped: what to relay (`None`: nothing).
    pub relay: Option<AwarenessUpdate>,
    /// Entries dropped because they spoke for another user's client id.
    pub refused: usize,
}

/// `json` with the verified identity under [`VERIFIED_KEY`]; a state that is valid JSON but
/// not an object is kept as it is (it has no key to forge). `None` for a state the server
/// cannot read back as a value (a number past f64, nesting past serde_json's limit: valid
/// enough for the decoder's check and for browsers, so relaying it unstamped would let its
/// own `quire` key through): such a state is dropped.
pub fn stamp(json: &Arc<str>, verified: Option<&serde_json::Value>) -> Option<Arc<str>> {
    let mut state = match serde_json::from_str::<serde_json::Value>(json).ok()? {
        serde_json::Value::Object(state) => state,
        _ => return Some(json.clone()),
    };
    match verified {
        Some(who) => state.insert(VERIFIED_KEY.to_owned(), who.clone()),
        None => state.remove(VERIFIED_KEY),
    };
    serde_json::to_string(&state).ok().map(Arc::from)
}

struct State {
    clock: u32,
    /// `None` once removed; the clock is kept so an older state cannot come back.
    json: Option<Arc<str>>,
    last_updated: Instant,
    owner: PeerId,
    /// The owner's user (`None`: anonymous, bound to nobody).
    user: Option<Arc<str>>,
    /// When the owner's connection closed.
    left_at: Option<Instant>,
}

impl State {
    /// Whether `from` may speak for this client id at `now`.
    fn may_take(&self, from: &Sender<'_>, now: Instant) -> bool {
        if self.owner == from.peer {
            return true;
        }
        let same_user = self.user.is_some() && self.user.as_deref() == from.user;
        if (from.is_open)(self.owner) {
            return same_user;
        }
        match (&self.user, self.left_at) {
            (None, _) => true,
            (Some(_), Some(left)) if now.saturating_duration_since(left) >= from.grace => true,
            (Some(_), _) => same_user,
        }
    }
}

#[derive(Default)]
pub struct AwarenessTable {
    states: HashMap<u64, State>,
    /// The encoded full state ([`Self::full_state_frame`]) until the table changes; the inner
    /// `None` when there is no live state.
    frame: Option<Option<bytes::Bytes>>,
    /// Changes applied but not yet relayed ([`Self::hold`]): the newest entry per client id.
    held: HashMap<ClientID, AwarenessUpdateEntry>,
}

impl AwarenessTable {
    /// Applies an update from `from`: the entries it may set (see the module's notes),
    /// stamped with its verified identity. Returns what to relay to the other peers.
    pub fn apply(&mut self, update: &AwarenessUpdate, from: &Sender<'_>, now: Instant) -> Applied {
        // Even an update that changes nothing visible may add a removed client's clock.
        self.frame = None;
        let mut applied = Applied::default();
        let mut relay = HashMap::new();
        for (client, entry) in &update.clients {
            if let Some(s) = self.states.get(&client.get()) {
                if !s.may_take(from, now) {
                    applied.refused += 1;
                    continue;
                }
            }
            let json = match entry.json.as_ref() {
                NULL => None,
                _ => match stamp(&entry.json, from.verified) {
                    Some(stamped) => Some(stamped),
                    None => {
                        applied.refused += 1;
                        continue;
                    }
                },
            };
            let changed = match self.states.get_mut(&client.get()) {
                Some(s) => {
                    let removes = s.clock == entry.clock && json.is_none() && s.json.is_some();
                    let newer = s.clock < entry.clock || removes;
                    if newer {
                        s.clock = entry.clock;
                        s.json = json.clone();
                        s.last_updated = now;
                        s.owner = from.peer;
                        s.user = from.user.map(Arc::from);
                        s.left_at = None;
                    }
                    newer
                }
                None => {
                    self.states.insert(
                        client.get(),
                        State {
                            clock: entry.clock,
                            json: json.clone(),
                            last_updated: now,
                            owner: from.peer,
                            user: from.user.map(Arc::from),
                            left_at: None,
                        },
                    );
                    json.is_some()
                }
            };
            if changed {
                relay.insert(
                    *client,
                    AwarenessUpdateEntry {
                        clock: entry.clock,
                        json: json.unwrap_or_else(|| Arc::from(NULL)),
                    },
                );
            }
        }
        applied.relay = (!relay.is_empty()).then_some(AwarenessUpdate { clients: relay });
        applied
    }

    /// Removes every live state `peer` introduced; returns the removal to broadcast.
    pub fn remove_peer(&mut self, peer: PeerId, now: Instant) -> Option<AwarenessUpdate> {
        // Its ids stay its user's for the grace period (`State::may_take`).
        for s in self.states.values_mut().filter(|s| s.owner == peer) {
            s.left_at = Some(now);
        }
        let ids: Vec<u64> = self
            .states
            .iter()
            .filter(|(_, s)| s.owner == peer && s.json.is_some())
            .map(|(id, _)| *id)
            .collect();
        self.remove(ids, now)
    }

    /// Removes states not refreshed within `timeout`, and forgets old removals (once neither
    /// their clock nor, within `grace` of their connection's close, their user matters).
    pub fn expire(
        &mut self,
        now: Instant,
        timeout: Duration,
        grace: Duration,
    ) -> Option<AwarenessUpdate> {
        self.states.retain(|_, s| {
            s.json.is_some()
                || now.saturating_duration_since(s.last_updated) < timeout
                || s.left_at
                    .is_some_and(|left| now.saturating_duration_since(left) < grace)
        });
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

    /// Keeps `change` (what [`Self::apply`], [`Self::remove_peer`] or [`Self::expire`]
    /// returned) to relay later with every other change held meanwhile. Each entry of a change
    /// is newer than the table held before it (that is why it was returned), so the newest
    /// entry per client id replaces the one held: a client applying only it ends where one
    /// applying every change in turn would (newest clock wins; a removal is a `null` entry
    /// with its clock, kept like any other).
    pub fn hold(&mut self, change: AwarenessUpdate) {
        self.held.extend(change.clients);
    }

    /// The changes held since the last call, as one update; `None` if there are none.
    pub fn take_held(&mut self) -> Option<AwarenessUpdate> {
        (!self.held.is_empty()).then(|| AwarenessUpdate {
            clients: std::mem::take(&mut self.held),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sender that may take over any id (the rules before ownership), without identity.
    fn anyone(peer: PeerId) -> Sender<'static> {
        Sender {
            peer,
            user: None,
            is_open: &|_| false,
            grace: Duration::ZERO,
            verified: None,
        }
    }

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
        assert!(t
            .apply(&update(&[(1, 1, "{\"a\":1}")]), &anyone(10), now)
            .relay
            .is_some());
        assert!(
            t.apply(&update(&[(1, 1, "{\"a\":2}")]), &anyone(10), now)
                .relay
                .is_none(),
            "same clock, not null"
        );
        assert!(
            t.apply(&update(&[(1, 0, "{\"a\":3}")]), &anyone(10), now)
                .relay
                .is_none(),
            "older clock"
        );
        assert!(t
            .apply(&update(&[(1, 2, "{\"a\":4}")]), &anyone(10), now)
            .relay
            .is_some());
        assert!(
            t.apply(&update(&[(1, 2, "null")]), &anyone(10), now)
                .relay
                .is_some(),
            "equal clock with null"
        );
        assert!(t.full_state().is_none());
    }

    #[test]
    fn closing_a_peer_removes_only_its_states() {
        let now = Instant::now();
        let mut t = AwarenessTable::default();
        t.apply(&update(&[(1, 1, "{}"), (2, 5, "{}")]), &anyone(10), now);
        t.apply(&update(&[(3, 1, "{}")]), &anyone(11), now);
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
        t.apply(&update(&[(1, 1, "{}")]), &anyone(10), now);
        let a = t.full_state_frame().expect("one state");
        let b = t.full_state_frame().expect("one state");
        assert_eq!(a.as_ptr(), b.as_ptr(), "encoded once");
        t.apply(&update(&[(2, 1, "{}")]), &anyone(11), now);
        let c = t.full_state_frame().expect("two states");
        assert!(c.len() > a.len(), "re-encoded after a change");
        t.remove_peer(10, now);
        t.remove_peer(11, now);
        assert!(t.full_state_frame().is_none());
    }

    #[test]
    fn only_the_ids_a_connection_may_speak_for_are_applied_and_each_state_is_stamped() {
        let now = Instant::now();
        let mut t = AwarenessTable::default();
        let alice = serde_json::json!({"user": "alice"});
        let mallory = serde_json::json!({"user": "mallory"});
        // Peer 10 (alice) introduces client 1, claiming to be someone else.
        let open = |p: PeerId| p == 10 || p == 11 || p == 12;
        let grace = Duration::from_secs(30);
        let from_alice = Sender {
            peer: 10,
            user: Some("alice"),
            is_open: &open,
            grace,
            verified: Some(&alice),
        };
        let applied = t.apply(
            &update(&[(1, 1, r#"{"name":"alice","quire":{"user":"root"}}"#)]),
            &from_alice,
            now,
        );
        let relayed = applied.relay.expect("relayed");
        let state: serde_json::Value =
            serde_json::from_str(&relayed.clients[&ClientID::new(1)].json).expect("json");
        assert_eq!(
            state["quire"], alice,
            "the verified identity replaces the client's"
        );
        assert_eq!(state["name"], "alice");
        // Peer 11 (mallory, another user, while alice's connection lives) may not take it.
        let from_mallory = Sender {
            peer: 11,
            user: Some("mallory"),
            is_open: &open,
            grace,
            verified: Some(&mallory),
        };
        let forged = t.apply(
            &update(&[(1, 9, r#"{"name":"mallory-as-alice"}"#)]),
            &from_mallory,
            now,
        );
        assert!(forged.relay.is_none());
        assert_eq!(forged.refused, 1);
        let kept = t.full_state().expect("alice's state");
        assert!(kept.clients[&ClientID::new(1)].json.contains("\"alice\""));
        // A state the server cannot read back as a value is dropped, not relayed unstamped.
        let unreadable = t.apply(
            &update(&[(5, 1, r#"{"quire":{"user":"alice"},"n":1e400}"#)]),
            &from_mallory,
            now,
        );
        assert!(unreadable.relay.is_none());
        assert_eq!(unreadable.refused, 1);
        // Nor remove it, but it may set ids of its own in the same message.
        let mixed = t.apply(&update(&[(1, 1, "null"), (2, 1, "{}")]), &from_mallory, now);
        assert_eq!(mixed.refused, 1);
        assert_eq!(mixed.relay.map(|r| r.clients.len()), Some(1));
        // A connection allowed to take over (alice reconnecting, or alice's closed) may.
        let alice_again = Sender {
            peer: 12,
            user: Some("alice"),
            is_open: &open,
            grace,
            verified: Some(&alice),
        };
        let taken = t.apply(&update(&[(1, 2, r#"{"name":"alice"}"#)]), &alice_again, now);
        assert!(taken.relay.is_some());
        // Closing the old connection no longer removes the state it handed on.
        assert!(t.remove_peer(10, now).is_none());
        assert!(t.remove_peer(12, now).is_some());
    }

    #[test]
    fn held_changes_relay_the_newest_entry_per_client() {
        let now = Instant::now();
        let mut t = AwarenessTable::default();
        let relay = |t: &mut AwarenessTable, u: AwarenessUpdate, peer| {
            let applied = t.apply(&u, &anyone(peer), now);
            t.hold(applied.relay.expect("a change"));
        };
        relay(&mut t, update(&[(1, 1, r#"{"at":1}"#), (2, 1, "{}")]), 10);
        relay(&mut t, update(&[(1, 2, r#"{"at":2}"#)]), 10);
        relay(&mut t, update(&[(3, 1, "{}")]), 11);
        relay(&mut t, update(&[(3, 1, "null")]), 11);
        // Older than what was held: not a change, so nothing is held for it.
        assert!(t
            .apply(&update(&[(1, 1, r#"{"at":0}"#)]), &anyone(10), now)
            .relay
            .is_none());
        let held = t.take_held().expect("held changes");
        let entries: std::collections::BTreeMap<u64, (u32, String)> = held
            .clients
            .iter()
            .map(|(id, e)| (id.get(), (e.clock, e.json.to_string())))
            .collect();
        assert_eq!(
            entries,
            [
                (1, (2, r#"{"at":2}"#.to_owned())),
                (2, (1, "{}".to_owned())),
                (3, (1, "null".to_owned())),
            ]
            .into_iter()
            .collect()
        );
        assert!(t.take_held().is_none(), "taken once");
        // A closed peer's removal supersedes its state held before it.
        relay(&mut t, update(&[(4, 1, "{}")]), 12);
        let removal = t.remove_peer(12, now).expect("peer 12's state");
        t.hold(removal);
        let held = t.take_held().expect("the removal");
        assert_eq!(held.clients.len(), 1);
        let entry = &held.clients[&ClientID::new(4)];
        assert_eq!((entry.clock, &*entry.json), (2, "null"));
    }

    #[test]
    fn stale_states_expire() {
        let start = Instant::now();
        let mut t = AwarenessTable::default();
        t.apply(&update(&[(1, 1, "{}")]), &anyone(10), start);
        let timeout = Duration::from_secs(30);
        let grace = timeout;
        assert!(t
            .expire(start + Duration::from_secs(29), timeout, grace)
            .is_none());
        let gone = t
            .expire(start + Duration::from_secs(31), timeout, grace)
            .expect("expired");
        assert_eq!(gone.clients.len(), 1);
        assert!(t.full_state().is_none());
    }

    #[test]
    fn a_closed_connections_ids_stay_its_users_for_the_grace_period() {
        let t0 = Instant::now();
        let mut t = AwarenessTable::default();
        let (alice, mallory) = (
            serde_json::json!({"user": "alice"}),
            serde_json::json!({"user": "mallory"}),
        );
        let grace = Duration::from_secs(30);
        // Peer 21 (mallory) stays open; alice's connections (20, then 22) are the ones that
        // close (the table is told by `remove_peer`, and asks only about owners).
        let open = |p: PeerId| p == 21;
        let sender = |peer, user, verified| Sender {
            peer,
            user: Some(user),
            is_open: &open,
            grace,
            verified: Some(verified),
        };
        t.apply(&update(&[(1, 1, "{}")]), &sender(20, "alice", &alice), t0);
        // Alice's connection closes: its state is removed, the id stays hers.
        assert!(t.remove_peer(20, t0).is_some());
        let later = t0 + Duration::from_secs(29);
        assert!(t.expire(later, Duration::from_secs(5), grace).is_none());
        let taken = t.apply(
            &update(&[(1, 9, r#"{"name":"mallory-as-alice"}"#)]),
            &sender(21, "mallory", &mallory),
            later,
        );
        assert_eq!((taken.refused, taken.relay.is_none()), (1, true));
        // Alice reconnecting takes it back within the grace period.
        let back = t.apply(
            &update(&[(1, 3, "{}")]),
            &sender(22, "alice", &alice),
            later,
        );
        assert!(back.relay.is_some());
        let state = t.full_state().expect("alice's state");
        assert!(state.clients[&ClientID::new(1)].json.contains("\"alice\""));
        // Past the grace period after a close, the id is anybody's.
        assert!(t.remove_peer(22, later).is_some());
        let after = later + grace;
        let reused = t.apply(
            &update(&[(1, 9, "{}")]),
            &sender(21, "mallory", &mallory),
            after,
        );
        assert!(reused.relay.is_some());
    }
}
