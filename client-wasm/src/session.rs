//! The sync engine shared by both transports, as plain functions over frames: no sockets, no
//! timers, no tasks. A driver (tokio in `native`, the browser's WebSocket in `web`) feeds it the
//! frames it receives and sends the frames it returns.
//!
//! What it tracks beside the document:
//! - local changes: every local transaction (any origin but [`REMOTE`]) gets the next sequence
//!   number; updates made while connected are queued for sending, updates made while offline are
//!   not (the sync handshake on reconnect sends everything the server lacks);
//! - durable acknowledgements: after sending local changes it asks the server for the echo of a
//!   tag-102 message carrying the newest sequence number; Quire echoes it once everything sent
//!   before it is committed, so `unsaved = newest - echoed`;
//! - awareness: the local state and the peers' states (removed when the connection drops).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use quire_protocol::{self as protocol, Message};
use yrs::sync::{Awareness, AwarenessUpdate, Clock};
use yrs::updates::decoder::Decode;
use yrs::{ClientID, Doc, Origin, ReadTxn, Transact, Update};

/// Transaction origin of changes that came from the server. Everything else is local.
pub const REMOTE: &str = "quire-remote";

/// The durable-acknowledgement message tag (see docs/protocol.md).
pub const MSG_DURABLE_ACK: u8 = protocol::MSG_DURABLE_ACK;

/// Wakes the driver when a local change is waiting to be sent.
pub type Wake = Arc<dyn Fn() + Send + Sync>;

/// What the server sent that the client cannot use. The driver closes the connection and
/// reconnects; the document is untouched.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("malformed message from the server: {0}")]
    Malformed(String),
    #[error("the server sent an update the document rejects: {0}")]
    BadUpdate(String),
}

/// Something the application may want to hear about, returned by the session's methods.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The document caught up with the server (true) or lost the connection (false).
    Synced(bool),
    /// Peers' awareness states changed. `local` is true for this client's own state.
    Awareness {
        added: Vec<ClientID>,
        updated: Vec<ClientID>,
        removed: Vec<ClientID>,
        local: bool,
    },
    /// The server refused a change (read-only access).
    PermissionDenied(String),
}

/// Local changes recorded by the document observer, between two calls of the driver.
#[derive(Default)]
struct Local {
    /// Sequence number of the newest local transaction.
    seq: u64,
    /// Updates waiting to be sent (only while connected).
    queued: Vec<Vec<u8>>,
    online: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while holding these locks, but a poisoned lock still holds consistent
    // data: keep going.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The part of a session the application reads and writes while the driver runs: progress
/// counters and awareness. No method here touches the document, so none can wait for (or
/// deadlock with) a document transaction, and none can be called back into from yrs.
pub struct Shared {
    local: Mutex<Local>,
    /// Newest sequence number the server has confirmed as committed.
    saved: AtomicU64,
    synced: AtomicBool,
    awareness: Mutex<Awareness>,
    client_id: ClientID,
}

impl Shared {
    /// Local transactions the server has not yet confirmed as committed.
    pub fn unsaved(&self) -> u64 {
        lock(&self.local)
            .seq
            .saturating_sub(self.saved.load(Ordering::Acquire))
    }

    /// The handshake of the current connection finished.
    pub fn synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    pub fn client_id(&self) -> ClientID {
        self.client_id
    }

    /// Sets (Some JSON text) or clears (None) this client's awareness state. Returns the frame
    /// to send if connected, and the event.
    pub fn set_local_state(&self, json: Option<String>) -> (Option<Vec<u8>>, Event) {
        let me = self.client_id;
        let mut awareness = lock(&self.awareness);
        let had = awareness.local_state_raw().is_some();
        let event = match json {
            Some(json) => {
                awareness.set_local_state_raw(json);
                Event::Awareness {
                    added: if had { vec![] } else { vec![me] },
                    updated: if had { vec![me] } else { vec![] },
                    removed: vec![],
                    local: true,
                }
            }
            None => {
                awareness.clean_local_state();
                Event::Awareness {
                    added: vec![],
                    updated: vec![],
                    removed: if had { vec![me] } else { vec![] },
                    local: true,
                }
            }
        };
        let online = lock(&self.local).online;
        let frame = if online {
            own_awareness_frame(&awareness, me)
        } else {
            None
        };
        (frame, event)
    }

    /// This client's awareness state as JSON text.
    pub fn local_state(&self) -> Option<Arc<str>> {
        lock(&self.awareness).local_state_raw()
    }

    /// Every known awareness state (ours included), as JSON text.
    pub fn states(&self) -> Vec<(ClientID, Arc<str>)> {
        lock(&self.awareness)
            .iter()
            .filter_map(|(id, state)| state.data.map(|d| (id, d)))
            .collect()
    }
}

fn own_awareness_frame(awareness: &Awareness, me: ClientID) -> Option<Vec<u8>> {
    awareness.local_state_raw()?;
    let update = awareness.update_with_clients([me]).ok()?;
    Some(protocol::encode_awareness(&update).into())
}

/// The engine, owned by the driver.
pub struct Session {
    doc: Doc,
    shared: Arc<Shared>,
    /// Newest sequence number asked for on this connection (0 = none).
    requested: u64,
    /// Our answer to the server's step 1 went out on this connection.
    answered: bool,
    /// The server refused a change on this connection (read-only access): its echoes no
    /// longer mean our changes are saved.
    denied: bool,
    /// Last `unsaved` value handed out by [`Session::unsaved_changed`].
    reported_unsaved: u64,
}

impl Session {
    /// A session over `doc`. `clock` stamps awareness states; `wake` is called (from inside the
    /// transaction commit) after every local change.
    pub fn new<C: Clock + 'static>(doc: Doc, clock: C, wake: Option<Wake>) -> Session {
        let shared = Arc::new(Shared {
            local: Mutex::new(Local::default()),
            saved: AtomicU64::new(0),
            synced: AtomicBool::new(false),
            awareness: Mutex::new(Awareness::with_clock(doc.clone(), clock)),
            client_id: doc.client_id(),
        });
        // Weak: the document holds the observer, and the awareness in `shared` holds the
        // document.
        let recorder = Arc::downgrade(&shared);
        let observed = doc.observe_update_v1("quire-client", move |txn, e| {
            if txn.origin() == Some(&Origin::from(REMOTE)) {
                return;
            }
            let Some(shared) = recorder.upgrade() else {
                return;
            };
            let mut local = lock(&shared.local);
            local.seq += 1;
            if local.online {
                local.queued.push(e.update.clone());
            }
            drop(local);
            // Offline too: the driver reports the new unsaved count.
            if let Some(wake) = &wake {
                wake();
            }
        });
        if let Err(e) = observed {
            // Only possible if a transaction is open on a brand-new document handle.
            tracing::error!(error = %e, "could not observe the document");
        }
        Session {
            doc,
            shared,
            requested: 0,
            answered: false,
            denied: false,
            reported_unsaved: 0,
        }
    }

    pub fn doc(&self) -> &Doc {
        &self.doc
    }

    /// The handle the application keeps (progress, awareness).
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    pub fn client_id(&self) -> ClientID {
        self.shared.client_id
    }

    pub fn synced(&self) -> bool {
        self.shared.synced()
    }

    pub fn online(&self) -> bool {
        lock(&self.shared.local).online
    }

    pub fn unsaved(&self) -> u64 {
        self.shared.unsaved()
    }

    /// `Some(unsaved)` if it changed since the last call: the driver reports it as an event.
    pub fn unsaved_changed(&mut self) -> Option<u64> {
        let now = self.unsaved();
        (now != self.reported_unsaved).then(|| {
            self.reported_unsaved = now;
            now
        })
    }

    /// The transport opened: frames to send first (our state vector, our awareness state).
    pub fn connected(&mut self) -> Vec<Vec<u8>> {
        self.shared.synced.store(false, Ordering::Release);
        self.requested = 0;
        self.answered = false;
        self.denied = false;
        {
            let mut local = lock(&self.shared.local);
            local.online = true;
            // Anything queued before is covered by the handshake.
            local.queued.clear();
        }
        let sv = self.doc.transact().state_vector();
        let mut out = vec![protocol::encode_step1(&sv).into()];
        out.extend(own_awareness_frame(
            &lock(&self.shared.awareness),
            self.client_id(),
        ));
        out
    }

    /// The transport closed. Peers' awareness states are dropped (they will be sent again on
    /// reconnect); local changes from now on wait for the next handshake.
    pub fn disconnected(&mut self) -> Vec<Event> {
        let mut events = Vec::new();
        {
            let mut local = lock(&self.shared.local);
            local.online = false;
            local.queued.clear();
        }
        if self.shared.synced.swap(false, Ordering::AcqRel) {
            events.push(Event::Synced(false));
        }
        let me = self.client_id();
        let mut awareness = lock(&self.shared.awareness);
        let peers: Vec<ClientID> = awareness
            .iter()
            .filter(|(id, state)| *id != me && state.data.is_some())
            .map(|(id, _)| id)
            .collect();
        for id in &peers {
            awareness.remove_state(*id);
        }
        if !peers.is_empty() {
            events.push(Event::Awareness {
                added: vec![],
                updated: vec![],
                removed: peers,
                local: false,
            });
        }
        events
    }

    /// Local changes to send now: at most one update message (queued updates merged) and, if
    /// anything is unconfirmed, a durable-acknowledgement request for the newest one.
    pub fn outgoing(&mut self) -> Vec<Vec<u8>> {
        let (queued, seq) = {
            let mut local = lock(&self.shared.local);
            if !local.online {
                return Vec::new();
            }
            (std::mem::take(&mut local.queued), local.seq)
        };
        let mut out = Vec::new();
        let update = match queued.len() {
            0 => None,
            1 => queued.into_iter().next(),
            _ => match yrs::merge_updates_v1(&queued) {
                Ok(merged) => Some(merged),
                Err(e) => {
                    // Cannot happen for updates yrs produced; send them one by one.
                    tracing::warn!(error = %e, "could not merge local updates");
                    out.extend(queued.iter().map(|u| protocol::encode_update(u).into()));
                    None
                }
            },
        };
        if let Some(update) = update {
            out.push(protocol::encode_update(&update).into());
        }
        // Before our answer to the server's step 1 an echo would not cover changes made
        // offline (they travel in that answer), so requests wait for it.
        if self.answered {
            out.extend(self.ack_request(seq));
        }
        out
    }

    fn ack_request(&mut self, seq: u64) -> Option<Vec<u8>> {
        if seq <= self.shared.saved.load(Ordering::Acquire) || seq <= self.requested {
            return None;
        }
        self.requested = seq;
        Some(durable_ack(seq))
    }

    /// A message whose echo proves the connection is alive (sent when nothing else arrived for
    /// a while: browsers cannot see the server's pings). Its echo saves nothing new.
    pub fn keepalive(&self) -> Option<Vec<u8>> {
        self.online()
            .then(|| durable_ack(self.shared.saved.load(Ordering::Acquire)))
    }

    /// Handles one frame from the server. Returns the frames to send back and the events.
    pub fn receive(&mut self, frame: &[u8]) -> Result<(Vec<Vec<u8>>, Vec<Event>), SessionError> {
        let mut replies = Vec::new();
        let mut events = Vec::new();
        // Decoded like the server decodes a client's frames: a message cut short is an error
        // (yrs' `MessageReader` would stop silently), and declared counts are checked before
        // yrs allocates for them.
        let frame = Bytes::copy_from_slice(frame);
        let msgs =
            protocol::decode_frame(&frame).map_err(|e| SessionError::Malformed(e.to_string()))?;
        for msg in msgs {
            self.handle(msg, &mut replies, &mut events)?;
        }
        Ok((replies, events))
    }

    fn handle(
        &mut self,
        msg: Message,
        replies: &mut Vec<Vec<u8>>,
        events: &mut Vec<Event>,
    ) -> Result<(), SessionError> {
        match msg {
            Message::SyncStep1(sv) => {
                // Counter first, then the document: a change counted here has finished its
                // commit (the observer runs inside it), so the diff below includes it; a change
                // made after stays queued and goes out as an update (a harmless duplicate).
                let seq = {
                    let mut local = lock(&self.shared.local);
                    local.queued.clear();
                    local.seq
                };
                let diff = self.doc.transact().encode_state_as_update_v1(&sv);
                replies.push(protocol::encode_step2(&diff).into());
                // Every local change up to `seq` is in that answer: one echo confirms them.
                self.answered = true;
                self.requested = 0;
                replies.extend(self.ack_request(seq));
            }
            Message::SyncStep2(update) => {
                self.apply_remote(&update)?;
                if !self.shared.synced.swap(true, Ordering::AcqRel) {
                    events.push(Event::Synced(true));
                }
            }
            Message::Update(update) => self.apply_remote(&update)?,
            Message::Awareness { update, .. } => events.extend(self.apply_awareness(update)?),
            Message::QueryAwareness => {
                if let Ok(update) = lock(&self.shared.awareness).update() {
                    replies.push(protocol::encode_awareness(&update).into());
                }
            }
            Message::Auth(Some(reason)) => {
                // The refusal arrives before the echo that follows the refused change (the
                // server handles a connection's messages in order): from here on, echoes on
                // this connection do not mean our changes are saved.
                self.denied = true;
                events.push(Event::PermissionDenied(reason));
            }
            Message::Auth(None) => {}
            Message::DurableAck { raw } => {
                let n = protocol::read_durable_ack(&raw)
                    .ok_or_else(|| SessionError::Malformed("durable ack: no counter".into()))?;
                if !self.denied {
                    self.shared.saved.fetch_max(n, Ordering::AcqRel);
                }
            }
            Message::Unknown { tag } => tracing::debug!(tag, "ignoring unknown message"),
        }
        Ok(())
    }

    fn apply_remote(&mut self, update: &[u8]) -> Result<(), SessionError> {
        let update =
            Update::decode_v1(update).map_err(|e| SessionError::BadUpdate(e.to_string()))?;
        // Blocking: the application may hold a transaction on another thread for a moment.
        let mut txn = self.doc.transact_mut_with(REMOTE);
        txn.apply_update(update)
            .map_err(|e| SessionError::BadUpdate(e.to_string()))
    }

    fn apply_awareness(&mut self, update: AwarenessUpdate) -> Result<Vec<Event>, SessionError> {
        let me = self.client_id();
        let mut update = update;
        // Our own entry comes back only as a stale copy from an earlier connection.
        update.clients.remove(&me);
        let summary = lock(&self.shared.awareness)
            .apply_update_summary_with(update, REMOTE)
            .map_err(|e| SessionError::Malformed(format!("awareness: {e}")))?;
        Ok(summary
            .map(|s| Event::Awareness {
                added: s.added,
                updated: s.updated,
                removed: s.removed,
                local: false,
            })
            .into_iter()
            .collect())
    }

    /// Sets or clears this client's awareness state (see [`Shared::set_local_state`]).
    pub fn set_local_state(&mut self, json: Option<String>) -> (Option<Vec<u8>>, Event) {
        self.shared.set_local_state(json)
    }

    /// Re-sends the local state with a new clock so peers do not time it out (every 15 s).
    pub fn refresh_awareness(&mut self) -> Option<Vec<u8>> {
        let mut awareness = lock(&self.shared.awareness);
        let state = awareness.local_state_raw()?;
        awareness.set_local_state_raw(state);
        if self.online() {
            own_awareness_frame(&awareness, self.client_id())
        } else {
            None
        }
    }
}

fn durable_ack(n: u64) -> Vec<u8> {
    protocol::encode_durable_ack(n).into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use yrs::encoding::read::{Cursor, Read};
    use yrs::sync::protocol::{Message, SyncMessage};
    use yrs::updates::encoder::Encode;
    use yrs::{GetString, StateVector, Text};

    fn session(id: u64) -> Session {
        let doc = Doc::with_client_id(id);
        Session::new(doc, || 1_000u64, None)
    }

    fn decode(frame: &[u8]) -> Message {
        Message::decode_v1(frame).expect("a message")
    }

    fn insert(s: &Session, index: u32, chunk: &str) {
        let text = s.doc().get_or_insert_text("t");
        text.insert(&mut s.doc().transact_mut(), index, chunk);
    }

    fn text(doc: &Doc) -> String {
        let text = doc.get_or_insert_text("t");
        let txn = doc.transact();
        text.get_string(&txn)
    }

    fn echo(n: u64) -> Vec<u8> {
        durable_ack(n)
    }

    fn ack_of(frame: &[u8]) -> u64 {
        match decode(frame) {
            Message::Custom(MSG_DURABLE_ACK, payload) => {
                Cursor::new(&payload).read_var().expect("counter")
            }
            other => panic!("expected an ack request, got {other:?}"),
        }
    }

    #[test]
    fn handshake_answers_with_what_the_server_lacks_then_asks_for_an_echo() {
        let mut s = session(1);
        insert(&s, 0, "offline");
        assert_eq!(s.unsaved(), 1);
        let first = s.connected();
        assert!(matches!(
            decode(&first[0]),
            Message::Sync(SyncMessage::SyncStep1(_))
        ));
        // The server knows nothing: step 1 with an empty state vector.
        let server = Doc::with_client_id(9);
        let step1 = Message::Sync(SyncMessage::SyncStep1(StateVector::default())).encode_v1();
        let (replies, events) = s.receive(&step1).expect("step 1");
        assert!(events.is_empty());
        let Message::Sync(SyncMessage::SyncStep2(diff)) = decode(&replies[0]) else {
            panic!("expected step 2");
        };
        server
            .transact_mut()
            .apply_update(Update::decode_v1(&diff).expect("update"))
            .expect("apply");
        assert_eq!(text(&server), "offline");
        assert_eq!(ack_of(&replies[1]), 1);
        // Until the echo the change is unsaved; the echo saves it.
        assert_eq!(s.unsaved(), 1);
        let (replies, _) = s.receive(&echo(1)).expect("echo");
        assert!(replies.is_empty());
        assert_eq!(s.unsaved(), 0);
        assert_eq!(s.unsaved_changed(), None);
    }

    #[test]
    fn local_changes_go_out_merged_with_one_ack_request() {
        let mut s = session(1);
        s.connected();
        s.receive(&Message::Sync(SyncMessage::SyncStep1(StateVector::default())).encode_v1())
            .expect("step 1");
        insert(&s, 0, "a");
        insert(&s, 1, "b");
        insert(&s, 2, "c");
        let out = s.outgoing();
        assert_eq!(out.len(), 2, "one merged update and one ack request");
        let Message::Sync(SyncMessage::Update(update)) = decode(&out[0]) else {
            panic!("expected an update");
        };
        let peer = Doc::with_client_id(2);
        peer.transact_mut()
            .apply_update(Update::decode_v1(&update).expect("update"))
            .expect("apply");
        assert_eq!(text(&peer), "abc");
        assert_eq!(ack_of(&out[1]), 3);
        assert!(s.outgoing().is_empty(), "nothing new, nothing sent");
        assert_eq!(s.unsaved_changed(), Some(3));
        // An echo of an older request saves only what was sent before it.
        s.receive(&echo(2)).expect("echo");
        assert_eq!(s.unsaved(), 1);
        s.receive(&echo(3)).expect("echo");
        assert_eq!(s.unsaved_changed(), Some(0));
    }

    #[test]
    fn echoes_after_a_refusal_do_not_count_as_saved() {
        let mut s = session(1);
        s.connected();
        s.receive(&Message::Sync(SyncMessage::SyncStep1(StateVector::default())).encode_v1())
            .expect("step 1");
        insert(&s, 0, "read-only user typing");
        let out = s.outgoing();
        assert_eq!(ack_of(&out[1]), 1);
        let (_, events) = s
            .receive(&Message::Auth(Some("read-only access".into())).encode_v1())
            .expect("auth");
        assert_eq!(
            events,
            vec![Event::PermissionDenied("read-only access".into())]
        );
        s.receive(&echo(1)).expect("echo");
        assert_eq!(s.unsaved(), 1, "refused, so not saved");
        // A new connection starts trusting echoes again.
        s.disconnected();
        s.connected();
        s.receive(&echo(1)).expect("echo");
        assert_eq!(s.unsaved(), 0);
    }

    #[test]
    fn no_ack_request_before_the_handshake_answer() {
        let mut s = session(1);
        insert(&s, 0, "offline");
        s.connected();
        insert(&s, 0, "x");
        let out = s.outgoing();
        assert_eq!(out.len(), 1, "the update goes out, the ack request waits");
        assert!(matches!(
            decode(&out[0]),
            Message::Sync(SyncMessage::Update(_))
        ));
    }

    #[test]
    fn remote_updates_apply_without_counting_as_local() {
        let mut s = session(1);
        s.connected();
        let peer = Doc::with_client_id(2);
        let t = peer.get_or_insert_text("t");
        t.insert(&mut peer.transact_mut(), 0, "remote");
        let update = peer
            .transact()
            .encode_state_as_update_v1(&StateVector::default());
        let (_, events) = s
            .receive(&Message::Sync(SyncMessage::SyncStep2(update)).encode_v1())
            .expect("step 2");
        assert_eq!(events, vec![Event::Synced(true)]);
        assert_eq!(text(s.doc()), "remote");
        assert_eq!(s.unsaved(), 0);
        assert!(s.outgoing().is_empty());
        assert_eq!(s.disconnected(), vec![Event::Synced(false)]);
    }

    #[test]
    fn malformed_frames_and_bad_updates_are_errors_not_panics() {
        let mut s = session(1);
        s.connected();
        assert!(matches!(
            s.receive(&[0, 2, 5, 1]),
            Err(SessionError::Malformed(_))
        ));
        let bad = Message::Sync(SyncMessage::Update(vec![1, 2, 3])).encode_v1();
        assert!(matches!(s.receive(&bad), Err(SessionError::BadUpdate(_))));
        assert!(matches!(s.receive(&[]), Err(SessionError::Malformed(_))));
        assert!(matches!(
            s.receive(&[MSG_DURABLE_ACK, 1, 0x80]),
            Err(SessionError::Malformed(_))
        ));
    }

    #[test]
    fn awareness_peers_come_and_go_with_the_connection() {
        let mut s = session(1);
        s.set_local_state(Some(r#"{"name":"me"}"#.into()));
        let first = s.connected();
        assert_eq!(first.len(), 2, "step 1 and our awareness state");
        let peer = Doc::with_client_id(2);
        let mut peer_awareness = Awareness::with_clock(peer, || 5u64);
        peer_awareness.set_local_state_raw(r#"{"name":"peer"}"#);
        let update = peer_awareness.update().expect("update");
        let (_, events) = s
            .receive(&Message::Awareness(update).encode_v1())
            .expect("awareness");
        assert_eq!(
            events,
            vec![Event::Awareness {
                added: vec![ClientID::new(2)],
                updated: vec![],
                removed: vec![],
                local: false
            }]
        );
        assert_eq!(s.shared().states().len(), 2);
        let events = s.disconnected();
        assert!(events.contains(&Event::Awareness {
            added: vec![],
            updated: vec![],
            removed: vec![ClientID::new(2)],
            local: false
        }));
        assert_eq!(s.shared().states().len(), 1, "only our own state is left");
        // Offline, a new local state produces no frame; the next handshake sends it.
        let (frame, _) = s.set_local_state(Some(r#"{"name":"me2"}"#.into()));
        assert!(frame.is_none());
        assert_eq!(s.connected().len(), 2);
    }
}
