//! What a Hocuspocus session and its socket's writer share, apart from both: a session's
//! place in its room ([`Member`]), the room handed to the socket ([`Handover`]), the events a
//! session reports ([`Event`], [`Ended`]) and its acknowledgement counts ([`Acks`]). Both
//! `session.rs` and `writer.rs` import this file; neither imports the other's types through it.

use std::sync::atomic::AtomicU64;

use tokio::sync::oneshot;

use crate::room::queue::QueueRx;
use crate::room::{CloseReason, PeerId, RoomHandle};

/// A peer joined to a room: dropped, it leaves the room (in a task of its own, tracked with
/// the connections so a graceful shutdown waits for it). Leaving twice is harmless.
pub(super) struct Member {
    pub(super) room: RoomHandle,
    pub(super) peer: PeerId,
    pub(super) tracker: tokio_util::task::TaskTracker,
}

impl Drop for Member {
    fn drop(&mut self) {
        let (room, peer) = (self.room.clone(), self.peer);
        if tokio::runtime::Handle::try_current().is_ok() {
            self.tracker.spawn(async move { room.leave(peer).await });
        }
    }
}

/// The SyncStatus count of one session.
#[derive(Default)]
pub(super) struct Acks {
    /// Acknowledgements requested from the room (the socket's count of updates sent): an
    /// echo claiming more is not believed.
    pub(super) requested: AtomicU64,
    /// `SyncStatus(true)` owed so far (`issued` goes up to it): one echo of the room may
    /// cover many updates, and their answers are made one at a time as the writer has room.
    pub(super) owed: AtomicU64,
    /// `SyncStatus(true)` sent.
    pub(super) issued: AtomicU64,
    /// Updates the room refused (read-only), each answered `SyncStatus(false)`.
    pub(super) refused: AtomicU64,
}

/// What a session tells its socket.
pub(super) enum Event {
    /// Joined on this node: the socket takes the room over.
    Joined(Box<Handover>),
    Ended(Ended),
}

/// A session's room, handed to the socket.
pub(super) struct Handover {
    pub(super) address: String,
    pub(super) generation: u64,
    /// The session's place in the room: whoever drops it (the socket, when it does not take
    /// the room over) leaves the room.
    pub(super) member: Member,
    pub(super) out_rx: QueueRx,
    /// Once the task has given the room every frame it got before the switch: `Some` if that
    /// ended the session.
    pub(super) drained: oneshot::Receiver<Option<CloseReason>>,
}

/// A session's end, reported to its socket.
pub(super) struct Ended {
    pub(super) address: String,
    pub(super) generation: u64,
    pub(super) outcome: Option<CloseReason>,
}
