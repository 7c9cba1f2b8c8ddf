//! In-process harnesses for the fuzz targets in `fuzz/` (cargo-fuzz): a document room on an
//! in-memory SQLite database fed one client frame at a time ([`RoomHarness`]), and the HTTP
//! router with the same state `run_with_stores` builds ([`HttpHarness`]).
//!
//! Not an API: hidden from the docs, and it may change with the fuzz targets. The harnesses
//! check what must hold whatever a client sends, and panic (which the fuzzer reports as a
//! crash) when it does not.

use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt;
use tokio::runtime::Runtime;
use tokio_util::sync::CancellationToken;
use yrs::updates::decoder::Decode;
use yrs::{Doc, ReadTxn, Snapshot, StateVector, Transact, Update};

use crate::close;
use crate::config::{Config, RoomConfig, Secret};
use crate::metrics::Metrics;
use crate::protocol::{self, Message};
use crate::room::join;
use crate::room::queue::{Next, QueueRx};
use crate::room::{DocName, PeerAuth, PeerId, Registry, RoomHandle};
use crate::startup::Stores;
use crate::storage::{DocStore, StoredDoc};

mod http;

pub use http::{Answer, HttpHarness, ROUTES};

/// How long the harness waits for anything the room or a handler should do at once (libFuzzer's
/// `-timeout` should be longer, so a hang shows as this panic with its message).
const PATIENCE: Duration = Duration::from_secs(5);
/// A harness's document is replaced (fresh database) after this many inputs, so the state that
/// accumulates across inputs stays small enough to keep the fuzzer fast.
const ROOM_INPUTS_PER_DOC: u32 = 1000;
/// The room's `max_doc_size` under the fuzzer; reaching it also starts a fresh document.
const FUZZ_MAX_DOC_SIZE: u64 = 4 << 20;
/// Requests an [`HttpHarness`] serves before it starts again on a fresh database.
const HTTP_REQUESTS_PER_DB: u32 = 5000;
/// The in-memory database (each open gets a database of its own).
const MEMORY_DB: &str = "sqlite::memory:";

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("cannot build a tokio runtime: {e}"))
}

/// The configuration both harnesses start from: the built-in defaults on an in-memory SQLite
/// database, snapshots often (so the snapshot path runs too) and a small document limit.
fn fuzz_config() -> Config {
    let mut config = Config {
        database_url: Secret::from(MEMORY_DB),
        ..Config::default()
    };
    config.room.max_doc_size = FUZZ_MAX_DOC_SIZE;
    config.room.snapshot_updates = 50;
    config.room.snapshot_bytes = 256 << 10;
    config
}

/// The registry `run_with_stores` builds for `config` (no leases: SQLite, one process).
fn registry(config: &Config, stores: &Stores, shutdown: &CancellationToken) -> Arc<Registry> {
    Registry::new(
        stores.docs.clone(),
        Arc::new(Metrics::new()),
        RoomConfig {
            lease: None,
            ..config.room.clone()
        },
        shutdown.clone(),
    )
}

/// Stops every room (they commit and snapshot) and waits for them, within [`PATIENCE`].
fn stop(rt: &Runtime, registry: &Registry, shutdown: &CancellationToken) {
    shutdown.cancel();
    // (The timer is made inside the runtime: `timeout` needs its time driver.)
    let stopped =
        rt.block_on(async { tokio::time::timeout(PATIENCE, registry.wait_stopped()).await });
    assert!(
        stopped.is_ok(),
        "rooms did not stop within {PATIENCE:?} of shutdown"
    );
}

/// Replays a stored document the way a room loads it: the snapshot (Yjs v2), then the log
/// rows after it (Yjs v1).
fn replay(stored: &StoredDoc) -> Result<Doc, String> {
    let doc = Doc::new();
    {
        let mut txn = doc.transact_mut();
        if let Some(snapshot) = &stored.snapshot {
            let update = Update::decode_v2(snapshot).map_err(|e| format!("snapshot: {e}"))?;
            txn.apply_update(update)
                .map_err(|e| format!("snapshot: {e}"))?;
        }
        for (seq, row) in &stored.updates {
            let update = Update::decode_v1(row).map_err(|e| format!("log row {seq}: {e}"))?;
            txn.apply_update(update)
                .map_err(|e| format!("log row {seq}: {e}"))?;
        }
    }
    Ok(doc)
}

/// The inputs fed since the harness last started on a fresh database, one hex line each. The
/// harnesses keep state across inputs, so the fuzzer's artifact (the last input) may not
/// reproduce a failure alone: on a panic, if `QUIRE_FUZZ_HISTORY` names a file (`fuzz/run.sh`
/// sets it), they are written there. Feed them in order to a new harness to replay
/// (`fuzz/README.md`).
static HISTORY: Mutex<Vec<String>> = Mutex::new(Vec::new());
static HISTORY_HOOK: Once = Once::new();

fn record(input: &[u8]) {
    HISTORY_HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            // try_lock: the panic may come from code holding the lock.
            let path = std::env::var_os("QUIRE_FUZZ_HISTORY");
            if let (Some(path), Ok(history)) = (path, HISTORY.try_lock()) {
                let mut text = history.join("\n");
                text.push('\n');
                match std::fs::write(&path, text) {
                    Ok(()) => eprintln!(
                        "the {} inputs since the last fresh database are in {}",
                        history.len(),
                        std::path::Path::new(&path).display()
                    ),
                    Err(e) => eprintln!("cannot write the input history: {e}"),
                }
            }
            previous(info)
        }));
    });
    let line: String = input.iter().map(|b| format!("{b:02x}")).collect();
    HISTORY.lock().unwrap_or_else(|e| e.into_inner()).push(line);
}

fn clear_history() {
    HISTORY.lock().unwrap_or_else(|e| e.into_inner()).clear();
}

/// What became of one frame fed to a [`RoomHarness`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fed {
    /// The frame does not decode: a connection closes with 1007 before the room sees it.
    Malformed,
    /// Nothing in it for the room (auth messages, unknown types, empty updates).
    Ignored,
    /// The room took every message and echoed the durable acknowledgement sent after them.
    Acked,
    /// The room took every message and committed them, but withholds the acknowledgement: an
    /// update in the frame waits on missing dependencies (checked: the stored document has
    /// pending updates).
    Withheld,
    /// The room closed the peer with this code instead: 1007 (an update yrs rejected), 1013
    /// (its outbound queue overflowed) or 4413 (the document reached its size limit).
    Closed(u16),
}

/// One document room on an in-memory SQLite database, fed frames as a connection would feed
/// them. The document's state accumulates across frames (up to [`ROOM_INPUTS_PER_DOC`] frames
/// or the size limit, then a fresh database), so later frames meet the state earlier ones left.
pub struct RoomHarness {
    rt: Runtime,
    room: Option<RoomState>,
    /// Counter of the durable acknowledgements the harness sends (unlikely in an input).
    acks: u64,
}

struct RoomState {
    store: Arc<dyn DocStore>,
    registry: Arc<Registry>,
    shutdown: CancellationToken,
    name: DocName,
    inputs: u32,
}

impl Default for RoomHarness {
    fn default() -> Self {
        RoomHarness::new()
    }
}

impl RoomHarness {
    pub fn new() -> RoomHarness {
        RoomHarness {
            rt: runtime(),
            room: None,
            acks: 0x7a5e_0000_0000,
        }
    }

    /// Feeds one binary frame: decoded by [`join::to_peer_msgs`] as a connection decodes it and,
    /// if it decodes, sent to the room by a fresh writer peer, followed by a durable
    /// acknowledgement request. A second (read-only) peer then sends a durable acknowledgement
    /// request of its own, echoed once everything before it is committed: by then the writer
    /// has its echo, a close order, or (an update waiting on missing dependencies) neither.
    /// Then checks, and panics if any fails:
    /// - the second peer's echo arrives within [`PATIENCE`];
    /// - a close is one of the codes a client's data may cause (1007, 1013, 4413), and a
    ///   withheld echo has a reason: the room holds the writer's update, whose dependencies
    ///   never came (and storage never holds anything pending);
    /// - every frame the room sent either peer decodes;
    /// - the room still answers: a new peer's Sync Step 1 with an empty state vector gets a Step 2
    ///   holding a valid update;
    /// - what the room serves is what it stored: the database's snapshot and log replay without
    ///   error into the same state (state vector and delete set) as that Step 2.
    pub fn feed(&mut self, frame: &[u8]) -> Fed {
        let frame = Bytes::copy_from_slice(frame);
        let msgs = match join::to_peer_msgs(&frame) {
            Ok(msgs) => msgs,
            Err(_) => return Fed::Malformed,
        };
        if msgs.is_empty() {
            return Fed::Ignored;
        }
        record(&frame);
        if self.room.is_none() {
            self.room = Some(self.rt.block_on(RoomState::open()));
        }
        let Some(room) = self.room.as_mut() else {
            unreachable!("opened above")
        };
        self.acks += 2;
        let ack = protocol::encode_durable_ack(self.acks);
        let barrier = protocol::encode_durable_ack(self.acks + 1);
        let fed = self.rt.block_on(room.feed(frame, msgs, ack, barrier));
        room.inputs += 1;
        if room.inputs >= ROOM_INPUTS_PER_DOC || fed == Fed::Closed(close::DOC_TOO_LARGE) {
            self.reset();
        }
        fed
    }

    /// Stops the room and starts the next frame on a fresh database.
    pub fn reset(&mut self) {
        if let Some(room) = self.room.take() {
            stop(&self.rt, &room.registry, &room.shutdown);
        }
        clear_history();
    }
}

impl Drop for RoomHarness {
    fn drop(&mut self) {
        self.reset();
    }
}

/// Receives the next frame or close order, skipping keep-alive ticks; panics after
/// [`PATIENCE`].
async fn next_event(rx: &QueueRx, waiting_for: &str) -> Next {
    let next = tokio::time::timeout(PATIENCE, async {
        loop {
            match rx.recv().await {
                Next::Ping => continue,
                other => return other,
            }
        }
    })
    .await;
    next.unwrap_or_else(|_| panic!("no {waiting_for} within {PATIENCE:?}"))
}

/// Every frame the room sends a client must decode.
fn check_server_frame(frame: &Bytes) -> Vec<Message> {
    protocol::decode_frame(frame).unwrap_or_else(|e| {
        panic!(
            "the room sent a frame that does not decode ({e}): {:02x?}",
            frame.as_ref()
        )
    })
}

impl RoomState {
    async fn open() -> RoomState {
        let config = fuzz_config();
        let stores = crate::open_stores(&config)
            .await
            .unwrap_or_else(|e| panic!("cannot open the in-memory database: {e}"));
        let shutdown = CancellationToken::new();
        let registry = registry(&config, &stores, &shutdown);
        RoomState {
            store: stores.docs.clone(),
            registry,
            shutdown,
            name: DocName::parse("fuzz").unwrap_or_else(|_| unreachable!("a valid name")),
            inputs: 0,
        }
    }

    async fn join(&self, can_write: bool) -> (PeerId, RoomHandle, QueueRx) {
        let peer = join::next_peer_id();
        let auth = PeerAuth {
            user: Some("fuzz".into()),
            can_write,
            ..PeerAuth::default()
        };
        match join::join_room(&self.registry, &self.name, peer, auth).await {
            Ok((room, rx)) => (peer, room, rx),
            Err(reason) => panic!(
                "the room refused a peer: {} {} (it should serve any number of inputs)",
                reason.code, reason.reason
            ),
        }
    }

    async fn feed(
        &self,
        frame: Bytes,
        msgs: Vec<crate::room::PeerMsg>,
        ack: Bytes,
        barrier: Bytes,
    ) -> Fed {
        let (peer, room, rx) = self.join(true).await;
        let ack_msgs = join::to_peer_msgs(&ack)
            .unwrap_or_else(|e| unreachable!("a durable ack request decodes: {e}"));
        assert!(
            room.send(peer, msgs, frame.len()).await.is_ok(),
            "the room stopped while taking a frame"
        );
        assert!(
            room.send(peer, ack_msgs, ack.len()).await.is_ok(),
            "the room stopped while taking a durable ack request"
        );
        // The barrier: another peer's acknowledgement, echoed once everything the room took
        // before it is committed (echoes go out in order, the writer's first).
        let (checker, check_room, check_rx) = self.join(false).await;
        let barrier_msgs = join::to_peer_msgs(&barrier)
            .unwrap_or_else(|e| unreachable!("a durable ack request decodes: {e}"));
        assert!(
            check_room
                .send(checker, barrier_msgs, barrier.len())
                .await
                .is_ok(),
            "the room stopped while taking a durable ack request"
        );
        loop {
            match next_event(&check_rx, "durable ack echo to a second peer").await {
                Next::Frame(f) if f == barrier => break,
                Next::Frame(f) => {
                    check_server_frame(&f);
                }
                Next::Kill(reason) => panic!(
                    "the room closed a peer that only asked for an acknowledgement: {} {}",
                    reason.code, reason.reason
                ),
                Next::Closed => panic!("the room dropped a peer without a close order"),
                Next::Ping => unreachable!("skipped by next_event"),
            }
        }
        // The writer's outcome is decided by now: read what it was sent, without waiting.
        let fed = loop {
            match rx.recv().now_or_never() {
                Some(Next::Frame(f)) if f == ack => break Fed::Acked,
                Some(Next::Frame(f)) => {
                    check_server_frame(&f);
                }
                Some(Next::Kill(reason)) => break Fed::Closed(reason.code),
                Some(Next::Closed) => panic!("the room dropped the peer without a close order"),
                Some(Next::Ping) => {}
                None => break Fed::Withheld,
            }
        };
        if let Fed::Closed(code) = fed {
            assert!(
                matches!(
                    code,
                    close::MALFORMED | close::TRY_AGAIN_LATER | close::DOC_TOO_LARGE
                ),
                "a client's frame made the room close it with {code}"
            );
        }
        room.leave(peer).await;
        let served = self.check_answers(checker, &check_room, &check_rx).await;
        check_room.leave(checker).await;
        self.check_stored(&served).await;
        fed
    }

    /// A new peer's Sync Step 1 with an empty state vector gets a Step 2 whose update applies
    /// to an empty document; returns that document's snapshot.
    async fn check_answers(&self, peer: PeerId, room: &RoomHandle, rx: &QueueRx) -> Snapshot {
        let step1 = protocol::encode_step1(&StateVector::default());
        let msgs = join::to_peer_msgs(&step1)
            .unwrap_or_else(|e| unreachable!("a Sync Step 1 decodes: {e}"));
        assert!(
            room.send(peer, msgs, step1.len()).await.is_ok(),
            "the room stopped after a client's frame"
        );
        let update = loop {
            match next_event(rx, "Sync Step 2 after the frame").await {
                Next::Frame(f) => {
                    let msgs = check_server_frame(&f);
                    if let Some(u) = msgs.into_iter().find_map(|m| match m {
                        Message::SyncStep2(u) => Some(u),
                        _ => None,
                    }) {
                        break u;
                    }
                }
                Next::Kill(reason) => panic!(
                    "the room closed a peer that only asked to sync: {} {}",
                    reason.code, reason.reason
                ),
                Next::Closed => panic!("the room dropped a peer that only asked to sync"),
                Next::Ping => unreachable!("skipped by next_event"),
            }
        };
        let decoded = Update::decode_v1(&update).unwrap_or_else(|e| {
            panic!(
                "the room's Sync Step 2 is not a valid update ({e}): {:02x?}",
                update.as_ref()
            )
        });
        let doc = Doc::new();
        let applied = doc.transact_mut().apply_update(decoded);
        if let Err(e) = applied {
            panic!("the room's Sync Step 2 does not apply to an empty document: {e}");
        }
        let snapshot = doc.transact().snapshot();
        snapshot
    }

    /// The database holds exactly what the room serves (everything before the ack is
    /// committed, and a room that rejected an update reloaded from the database).
    async fn check_stored(&self, served: &Snapshot) {
        let stored = self
            .store
            .load(self.name.as_str())
            .await
            .unwrap_or_else(|e| panic!("cannot load the document from the database: {e}"));
        let doc = replay(&stored).unwrap_or_else(|e| {
            panic!("the stored document no longer loads (a room would fail to start): {e}")
        });
        // Only what integrates enters a document: a withheld echo means the room holds the
        // writer's update for it (until it left), never that storage holds it pending.
        assert!(
            !doc.transact().has_missing_updates(),
            "the stored document holds an update that does not integrate"
        );
        let snapshot = doc.transact().snapshot();
        assert_eq!(
            &snapshot, served,
            "the stored document (left) differs from what the room serves (right)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use yrs::Text;

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap_or_else(|e| panic!("{e}")))
            .collect()
    }

    /// Fuzz finding (fuzz/: room_update and http_json; minimized from the input history): two
    /// small updates from a writer leave the document with a pending update (missing
    /// dependencies) that yrs cannot merge back. The room's snapshot calls
    /// `encode_state_as_update_v2` (room/actor.rs `spawn_snapshot`; `final_snapshot` on unload
    /// and shutdown too), which panics in yrs's `merge_pending_v2`
    /// (`merge_updates_v2(..).unwrap()`: `EndOfBuffer`), in release builds as well. The room
    /// task dies and its peers are dropped without a close frame; the log keeps the pending
    /// update, so every later snapshot of the document panics again and the log is never
    /// compacted.
    #[test]
    fn a_pending_update_yrs_cannot_merge_does_not_kill_the_room() {
        let pending = ["010184012123000000000000", "01010177840176016400"];
        let mut harness = RoomHarness::new();
        for u in pending {
            assert_eq!(
                harness.feed(&protocol::encode_update(&unhex(u))),
                Fed::Withheld,
                "{u} waits on missing dependencies"
            );
        }
        // Enough ordinary updates for a snapshot (`snapshot_updates` is 50 here).
        let typist = Doc::with_client_id(99);
        let text = typist.get_or_insert_text("text");
        for i in 0..60 {
            let update = {
                let mut txn = typist.transact_mut();
                text.insert(&mut txn, i, "x");
                txn.encode_update_v1()
            };
            assert_eq!(harness.feed(&protocol::encode_update(&update)), Fed::Acked);
        }
        harness.reset();
    }
}
