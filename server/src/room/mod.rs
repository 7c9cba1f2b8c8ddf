//! Rooms: one task per loaded document, the only owner of its `Doc`, awareness and log cursor.
//!
//! Connections hold a [`RoomHandle`] (a bounded channel) and talk to the room with
//! [`RoomCmd`]s; the room talks back through each peer's bounded outbound queue. The
//! [`Registry`] maps document names to running rooms and starts them on demand.

mod actor;
mod answers;
pub mod awareness;
mod committed;
pub mod join;
pub mod queue;
mod registry;
pub mod seen;
pub mod stats;

use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use yrs::sync::AwarenessUpdate;
use yrs::{StateVector, Update};

pub use actor::doc_json;
pub(crate) use actor::Changes;
pub use committed::SnapshotSource;

/// A document's state replayed from what storage returned: its snapshot and the log rows
/// after it. The error names the part that does not decode or apply.
pub fn replay_stored(stored: &crate::storage::StoredDoc) -> Result<yrs::Doc, String> {
    committed::replay(
        stored.snapshot.as_deref(),
        stored
            .updates
            .iter()
            .map(|(seq, data)| (*seq, data.as_slice())),
    )
}
/// [`replay_stored`], and what of the log rows was set aside because it does not integrate
/// (to record before anything snapshots past those rows).
pub fn replay_stored_checked(
    stored: &crate::storage::StoredDoc,
) -> Result<(yrs::Doc, Vec<crate::storage::set_aside::SetAsideRow>), String> {
    committed::replay_checked(
        stored.snapshot.as_deref(),
        stored
            .updates
            .iter()
            .map(|(seq, data)| (*seq, data.as_slice())),
    )
}
pub use registry::Registry;

/// A document's committed state read from storage, for a node that does not serve it (see
/// [`actor`]); `None` if the document is deleted.
pub async fn read_stored(registry: &Registry, name: &DocName) -> Result<Option<yrs::Doc>, String> {
    actor::load_committed(registry, name).await
}

/// Identifies one WebSocket connection within the process.
pub type PeerId = u64;

/// A validated document name: 1 to 255 bytes of UTF-8 without control characters or `*` (a
/// token's document claim ending in `*` is a prefix pattern, so names cannot contain it).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DocName(Arc<str>);

/// Longest document name, in bytes of UTF-8.
pub const MAX_DOC_NAME_BYTES: usize = 255;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DocNameError {
    #[error("document name is empty")]
    Empty,
    #[error("document name is longer than {MAX_DOC_NAME_BYTES} bytes")]
    TooLong,
    #[error("document name contains a control character")]
    Control,
    #[error("document name is not valid UTF-8 once URL-decoded")]
    NotUtf8,
    #[error("document name contains `*`, which tokens use for patterns")]
    Star,
}

impl DocName {
    /// Parses an already-decoded name.
    pub fn parse(name: &str) -> Result<DocName, DocNameError> {
        if name.is_empty() {
            return Err(DocNameError::Empty);
        }
        if name.len() > MAX_DOC_NAME_BYTES {
            return Err(DocNameError::TooLong);
        }
        if name.chars().any(char::is_control) {
            return Err(DocNameError::Control);
        }
        if name.contains('*') {
            return Err(DocNameError::Star);
        }
        Ok(DocName(Arc::from(name)))
    }

    /// Parses the path of a request URL (`/my%20doc`), percent-decoding it.
    pub fn from_url_path(path: &str) -> Result<DocName, DocNameError> {
        let raw = path.strip_prefix('/').unwrap_or(path);
        let decoded = percent_encoding::percent_decode_str(raw)
            .decode_utf8()
            .map_err(|_| DocNameError::NotUtf8)?;
        DocName::parse(&decoded)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for DocName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why the room asks a connection to close: sent through the peer's queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloseReason {
    pub code: u16,
    pub reason: Cow<'static, str>,
}

impl CloseReason {
    pub fn new(code: u16, reason: impl Into<Cow<'static, str>>) -> CloseReason {
        CloseReason {
            code,
            reason: reason.into(),
        }
    }
}

/// Who is behind a connection, for permission checks and revocation.
#[derive(Debug, Clone, Default)]
pub struct PeerAuth {
    pub user: Option<Arc<str>>,
    pub token_id: Option<Arc<str>>,
    /// The token's issue time (seconds), to re-check revocations after joining.
    pub issued_at: i64,
    /// False for read-only peers: their updates are refused with an Auth message.
    pub can_write: bool,
    /// When the token expires (seconds since the epoch): the room closes the peer then with
    /// 4401. `None`: the credential does not expire (admin key, open mode).
    pub expires_at: Option<i64>,
    /// The newest `doc_changes` row when the permission was read (read just before it): the
    /// permission already reflects every role change up to this id, so only a later change
    /// closes the peer (`PeerFilter::UserBefore`).
    pub seen_change: i64,
    /// A document of a Hocuspocus socket (`crate::socket::hocuspocus`): the room answers each of its
    /// Sync Step 1s with its own Step 1 first (the provider counts on it), echoes its awareness
    /// back to it (the provider's liveness timer counts on that), and sends it stateless
    /// messages.
    pub hocuspocus: bool,
    /// The user's display name and colour from their profile, when they have one: with
    /// `user`, the identity the room stamps into the peer's awareness states.
    pub profile: Option<(Arc<str>, Arc<str>)>,
}

impl PeerAuth {
    /// The identity the server verified, as the reserved field of awareness states carries it
    /// (docs/protocol.md): `{"user": ..., "name": ..., "color": ...}`, name and colour only
    /// when the user has a profile. `None` without a user.
    pub fn verified(&self) -> Option<serde_json::Value> {
        let user = self.user.as_deref()?;
        let mut who = serde_json::Map::new();
        who.insert("user".into(), user.into());
        if let Some((name, color)) = &self.profile {
            who.insert("name".into(), (**name).into());
            who.insert("color".into(), (**color).into());
        }
        Some(serde_json::Value::Object(who))
    }
}

/// Which peers a [`RoomCmd::Close`] applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerFilter {
    All,
    User(String),
    /// The user's peers whose permission was read before role change `.1` (`seen_change`
    /// older than it): the ones that reconnected since already have the new role.
    UserBefore(String, i64),
    Token(String),
}

impl PeerFilter {
    /// Whether a peer of `user` whose permission reflects changes up to `seen_change` (and
    /// holds token `token`) matches.
    pub fn matches(&self, user: Option<&str>, token: Option<&str>, seen_change: i64) -> bool {
        match self {
            PeerFilter::All => true,
            PeerFilter::User(u) => user == Some(u.as_str()),
            PeerFilter::UserBefore(u, change) => user == Some(u.as_str()) && seen_change < *change,
            PeerFilter::Token(t) => token == Some(t.as_str()),
        }
    }
}

/// What a connection hands the room when it joins.
pub struct PeerLink {
    pub id: PeerId,
    pub auth: PeerAuth,
    /// Outbound frames, already encoded, and the order to close. Bounded: a full queue
    /// closes the peer with 1013.
    pub tx: queue::QueueTx,
}

/// One decoded message from a peer, as the room consumes it.
pub enum PeerMsg {
    /// A Sync/Update or Sync/Step2, validated by decoding in the connection task.
    Update {
        raw: Bytes,
        update: Update,
    },
    /// Sync/Step1: answer with Step2 once the document holds only committed data.
    Step1(StateVector),
    /// Awareness update; `raw` is relayed as is.
    Awareness {
        update: AwarenessUpdate,
        raw: Bytes,
    },
    QueryAwareness,
    /// Durable acknowledgement request: echo `raw` once everything before it is committed.
    DurableAck(Bytes),
}

/// A command to a room.
///
/// Every room's inbox holds its commands by value, in blocks of 32: the variants that carry
/// much are boxed, so a command is the frequent `Messages` and its tag (56 bytes on 64-bit
/// targets, not 136).
pub enum RoomCmd {
    Join {
        peer: Box<PeerLink>,
        reply: oneshot::Sender<Result<(), JoinError>>,
    },
    Messages {
        peer: PeerId,
        msgs: Vec<PeerMsg>,
        /// The frame's share of the room's inbound byte budget, returned when the room has
        /// taken the messages in.
        budget: Option<OwnedSemaphorePermit>,
    },
    Leave {
        peer: PeerId,
    },
    /// Closes the matching peers. With `unload`, the room also unloads (a deleted document).
    Close {
        filter: PeerFilter,
        reason: Box<CloseReason>,
        unload: bool,
    },
    /// The committed state as a Yjs v1 update, or its difference from a state vector.
    ReadUpdate {
        since: StateVector,
        reply: oneshot::Sender<Vec<u8>>,
    },
    /// The committed state as the room holds it (its snapshot and the rows after it), to
    /// replay off the room; `None` when the room keeps no usable copy (then `ReadJson` and
    /// `ReadUpdate` answer).
    ReadCommitted {
        reply: oneshot::Sender<Option<SnapshotSource>>,
    },
    /// The log position of the committed state `ReadCommitted` would give now (`None`: no
    /// usable copy): naming it costs nothing, so a reader asks this first and takes the copy
    /// only when the answer at that position is not cached.
    CommittedSeq {
        reply: oneshot::Sender<Option<i64>>,
    },
    /// The committed state as JSON, one key per root type.
    ReadJson {
        reply: oneshot::Sender<serde_json::Value>,
    },
    /// A peer's credential was refreshed (a Hocuspocus token refresh): its permission, token
    /// and expiry are replaced. Replies false if the peer is not in this room.
    Reauth {
        peer: PeerId,
        auth: Box<PeerAuth>,
        reply: oneshot::Sender<bool>,
    },
    /// Sends a stateless message to the document's Hocuspocus peers; replies how many.
    Stateless {
        payload: Arc<str>,
        reply: oneshot::Sender<usize>,
    },
    /// Applies an update sent over HTTP like a client's; replies once it is committed, with the
    /// log sequence number the document has reached (`None` if it changed nothing new).
    Apply(Box<ApplyCmd>),
    /// Makes a JSON edit on the room's document, in its turn among the updates (its
    /// preconditions checked in the same step); replies once it is committed.
    Edit(Box<EditCmd>),
}

/// What [`RoomCmd::Edit`] carries.
pub struct EditCmd {
    pub edits: Arc<crate::edits::Edits>,
    /// Who makes it (the history's author).
    pub author: Arc<str>,
    /// The author's client id in this document (`crate::edits::edit_client`).
    pub client: u64,
    /// What the edit did, or why it was refused, as soon as it is made.
    pub made: oneshot::Sender<Result<crate::edits::Outcome, crate::edits::EditError>>,
    /// The log position once it is committed; [`ApplyError::EditRefused`] when it was refused
    /// (the reason is in `made`).
    pub committed: oneshot::Sender<Result<i64, ApplyError>>,
}

/// Why [`RoomHandle::try_send`] did not queue a frame's messages.
enum TrySend {
    /// No room now: the messages, to send after a wait.
    Full(Vec<PeerMsg>),
    /// The room has stopped.
    Closed,
}

/// What [`RoomCmd::Apply`] carries.
pub struct ApplyCmd {
    pub raw: Bytes,
    pub update: Update,
    pub reply: oneshot::Sender<Result<i64, ApplyError>>,
    /// Who sent it (the history's author).
    pub author: Option<Arc<str>>,
    /// The update's share of the room's inbound byte budget, as for a socket's frame:
    /// [`RoomHandle::command`] takes it; leave `None`.
    pub budget: Option<OwnedSemaphorePermit>,
    /// Updates (Yjs v1) applied after this one, each with its author, together with it: all
    /// of them are checked to integrate, in order, before any is applied, and they are
    /// committed in one append (a merge's changes: all or none). The reply comes once all are
    /// committed.
    pub then: Vec<(Option<Arc<str>>, Bytes)>,
}

impl ApplyCmd {
    /// Bytes of every update it carries.
    pub fn bytes(&self) -> usize {
        self.raw.len() + self.then.iter().map(|(_, b)| b.len()).sum::<usize>()
    }
}

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum ApplyError {
    #[error("the update does not apply: {0}")]
    Invalid(String),
    #[error("the document would exceed its size limit")]
    TooLarge,
    #[error("storage is unavailable; retry later")]
    Unavailable,
    /// The update depends on content the document does not hold (`integrity.rs`).
    #[error("{0}")]
    Missing(String),
    /// A JSON edit was refused; [`EditCmd::made`] says why.
    #[error("the edit was refused")]
    EditRefused,
}

#[derive(Debug, thiserror::Error, Clone, Copy, PartialEq, Eq)]
pub enum JoinError {
    #[error("the document could not be loaded; retry later")]
    LoadFailed,
    #[error("the document has too many connections")]
    Full,
    #[error("the server is shutting down")]
    ShuttingDown,
    #[error("the document is deleted")]
    Deleted,
    /// Another node holds the document's lease (PostgreSQL deployments with several nodes).
    #[error("the document is served by another node")]
    Elsewhere,
    /// The room was unloading; the caller asks the registry again.
    #[error("the room closed before the join was handled")]
    Gone,
}

/// A send to a room waiting for its inbound budget or a place in its queue (`Err`: the room
/// has stopped).
pub type SendWait<'a> = Pin<Box<dyn Future<Output = Result<(), ()>> + Send + 'a>>;

/// A cloneable handle to a running room.
#[derive(Clone)]
pub struct RoomHandle {
    tx: mpsc::Sender<RoomCmd>,
    /// Bytes of frames that may wait in the room's inbound queue (`room_queue_bytes`): a
    /// sender takes the frame's size first, and waits while the room is that far behind.
    budget: Arc<Semaphore>,
    budget_max: u32,
}

impl RoomHandle {
    pub(crate) fn new(tx: mpsc::Sender<RoomCmd>, budget_bytes: usize) -> RoomHandle {
        let budget_max = u32::try_from(budget_bytes).unwrap_or(u32::MAX).max(1);
        RoomHandle {
            tx,
            budget: Arc::new(Semaphore::new(budget_max as usize)),
            budget_max,
        }
    }

    /// Joins the room. [`JoinError::Gone`] means the room was on its way out: ask the
    /// registry for a fresh handle and try again.
    pub async fn join(&self, peer: PeerLink) -> Result<(), JoinError> {
        let (reply, rx) = oneshot::channel();
        let peer = Box::new(peer);
        if self.tx.send(RoomCmd::Join { peer, reply }).await.is_err() {
            return Err(JoinError::Gone);
        }
        rx.await.unwrap_or(Err(JoinError::Gone))
    }

    /// Sends a peer's messages, decoded from a frame of `bytes` bytes. Waits while the room's
    /// queue is full, in messages or in bytes (backpressure on that peer's socket). Fails only
    /// if the room has stopped.
    ///
    /// Queued at once when the budget and the queue allow (the usual case); only the wait is
    /// boxed, so the returned future, which every connection's reader holds, stays small.
    pub fn send(
        &self,
        peer: PeerId,
        msgs: Vec<PeerMsg>,
        bytes: usize,
    ) -> impl Future<Output = Result<(), ()>> + Send + '_ {
        let waiting = self.start_send(peer, msgs, bytes);
        async move {
            match waiting? {
                None => Ok(()),
                Some(wait) => wait.await,
            }
        }
    }

    /// [`RoomHandle::send`] for a caller that polls: `Ok(None)` when the messages were queued
    /// at once (the usual case), else the boxed wait for the budget and the queue.
    pub(crate) fn start_send(
        &self,
        peer: PeerId,
        msgs: Vec<PeerMsg>,
        bytes: usize,
    ) -> Result<Option<SendWait<'static>>, ()> {
        match self.try_send(peer, msgs, bytes) {
            Ok(()) => Ok(None),
            Err(TrySend::Full(msgs)) => {
                let room = self.clone();
                Ok(Some(Box::pin(async move {
                    room.send_waiting(peer, msgs, bytes).await
                })))
            }
            Err(TrySend::Closed) => Err(()),
        }
    }

    /// [`RoomHandle::send`] if it need not wait: `Full` gives the messages back when the
    /// room's budget or queue has no room now.
    fn try_send(&self, peer: PeerId, msgs: Vec<PeerMsg>, bytes: usize) -> Result<(), TrySend> {
        let Ok(budget) = self
            .budget
            .clone()
            .try_acquire_many_owned(self.budget_units(bytes))
        else {
            return Err(TrySend::Full(msgs));
        };
        let cmd = RoomCmd::Messages {
            peer,
            msgs,
            budget: Some(budget),
        };
        match self.tx.try_send(cmd) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Full(RoomCmd::Messages { msgs, .. })) => {
                Err(TrySend::Full(msgs))
            }
            Err(_) => Err(TrySend::Closed),
        }
    }

    /// [`RoomHandle::send`]'s wait: for the budget, then for a place in the queue.
    async fn send_waiting(&self, peer: PeerId, msgs: Vec<PeerMsg>, bytes: usize) -> Result<(), ()> {
        let budget = self
            .budget
            .clone()
            .acquire_many_owned(self.budget_units(bytes));
        let budget = budget.await.map_err(|_| ())?;
        let cmd = RoomCmd::Messages {
            peer,
            msgs,
            budget: Some(budget),
        };
        self.tx.send(cmd).await.map_err(|_| ())
    }

    /// A frame's or an update's share of the room's inbound byte budget.
    fn budget_units(&self, bytes: usize) -> u32 {
        u32::try_from(bytes)
            .unwrap_or(u32::MAX)
            .clamp(1, self.budget_max)
    }

    pub async fn leave(&self, peer: PeerId) {
        let _ = self.send_cmd(RoomCmd::Leave { peer }).await;
    }

    /// Queues `cmd` at once if there is room (the usual case); otherwise the returned future
    /// waits for room. The waiting path is boxed: it is rare, and keeping it out of line keeps
    /// small the future every connection holds (a queue-send future is about 300 bytes).
    fn send_cmd(&self, cmd: RoomCmd) -> impl Future<Output = Result<(), ()>> + Send + '_ {
        let waiting = match self.tx.try_send(cmd) {
            Ok(()) => Ok(None),
            Err(mpsc::error::TrySendError::Closed(_)) => Err(()),
            Err(mpsc::error::TrySendError::Full(cmd)) => Ok(Some(Box::pin(self.tx.send(cmd)))),
        };
        async move {
            match waiting? {
                None => Ok(()),
                Some(send) => send.await.map_err(|_| ()),
            }
        }
    }

    /// Sends any other command; fails if the room has stopped.
    pub async fn command(&self, mut cmd: RoomCmd) -> Result<(), JoinError> {
        // An update sent over HTTP waits for the room's inbound budget like a socket's frame.
        if let RoomCmd::Apply(apply) = &mut cmd {
            let n = self.budget_units(apply.bytes());
            let permit = self.budget.clone().acquire_many_owned(n).await;
            apply.budget = Some(permit.map_err(|_| JoinError::Gone)?);
        }
        self.tx.send(cmd).await.map_err(|_| JoinError::Gone)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_role_change_closes_only_what_was_authorized_before_it() {
        let change = PeerFilter::UserBefore("ann".into(), 7);
        assert!(
            change.matches(Some("ann"), None, 6),
            "read before the change"
        );
        assert!(
            !change.matches(Some("ann"), None, 7),
            "read with the change committed"
        );
        assert!(!change.matches(Some("bob"), None, 0), "another user");
        assert!(PeerFilter::User("ann".into()).matches(Some("ann"), None, 99));
        assert!(PeerFilter::Token("t".into()).matches(None, Some("t"), 0));
        assert!(!PeerFilter::Token("t".into()).matches(Some("ann"), None, 0));
    }

    #[test]
    fn names_are_decoded_and_validated() {
        assert_eq!(
            DocName::from_url_path("/my%20doc").map(|n| n.to_string()),
            Ok("my doc".to_owned())
        );
        assert_eq!(
            DocName::from_url_path("/a/b").map(|n| n.to_string()),
            Ok("a/b".to_owned())
        );
        assert_eq!(DocName::from_url_path("/"), Err(DocNameError::Empty));
        assert_eq!(DocName::from_url_path("/a%0Ab"), Err(DocNameError::Control));
        assert_eq!(DocName::from_url_path("/%FF"), Err(DocNameError::NotUtf8));
        assert_eq!(DocName::from_url_path("/notes*"), Err(DocNameError::Star));
        let long = format!("/{}", "x".repeat(256));
        assert_eq!(DocName::from_url_path(&long), Err(DocNameError::TooLong));
        let ok = "é".repeat(127); // 254 bytes
        assert!(DocName::parse(&ok).is_ok());
    }
}

#[cfg(test)]
mod size {
    use super::*;

    /// A room's inbox holds its commands by value in blocks of 32, two per busy room: 8.7 KiB
    /// per room at 136 bytes a command, which is 440 bytes per connection with 20 on a room.
    #[test]
    fn a_room_command_is_a_frames_messages_and_a_tag() {
        let messages = std::mem::size_of::<(PeerId, Vec<PeerMsg>, Option<OwnedSemaphorePermit>)>();
        let tag = std::mem::size_of::<usize>();
        assert!(std::mem::size_of::<RoomCmd>() <= messages + tag);
    }
}
