//! One authenticated document of a Hocuspocus socket: a peer of the document's room like a
//! y-websocket connection.
//!
//! A session starts as a task that joins the room. Joined on this node, the task hands the
//! room to the socket ([`Event::Joined`]), which from then on gives the room the document's
//! frames itself, while the socket's writer reads the room's queue for it
//! ([`super::writer`]): no task between the socket and the room either way. The frames that
//! reached the task before the switch go to the room first, in order. A document another node
//! owns stays with its task, relayed there through the bus, its frames turned into Hocuspocus
//! frames into the socket's queue.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{debug, debug_span, Instrument};

use super::bell::BellTx;
use super::handover::{Acks, Ended, Event, Handover, Member};
use super::writer::{next_status, translate, Out, WriterCmd};
use crate::app::AppState;
use crate::close;
use crate::protocol;
use crate::room::join::{to_peer_msgs, to_peer_msgs_with};
use crate::room::queue::QueueRx;
use crate::room::{CloseReason, DocName, PeerAuth, PeerId, PeerMsg, RoomCmd, RoomHandle};
use crate::socket::joining::{self, Joined};
use crate::socket::transport::{self, Counted, WsError, WsMessage};

/// An authenticated document of the socket.
pub(super) struct Session {
    pub(super) name: DocName,
    /// Tells this session's end from an earlier one's for the same address.
    pub(super) generation: u64,
    /// The session's current credential; a refresh replaces it.
    pub(super) auth: watch::Sender<PeerAuth>,
    /// Whether the credential was refreshed (the room learns of it at the switch).
    pub(super) refreshed: bool,
    /// Updates (and Sync Step 2s) sent to the room: the counter of the acknowledgement
    /// requested after each.
    pub(super) updates: u64,
    pub(super) acks: Arc<Acks>,
    pub(super) route: Route,
    pub(super) _counted: Counted,
}

/// Where a session's frames go.
pub(super) enum Route {
    /// To its task: joining, or relayed to the node that owns the document.
    Task(mpsc::Sender<Bytes>),
    /// To its room on this node, from the socket.
    Room(Local),
}

/// A session's room on this node. Dropping it stops the writer reading the room's queue and
/// leaves the room.
pub(super) struct Local {
    pub(super) member: Member,
    pub(super) generation: u64,
    pub(super) writer: BellTx<WriterCmd>,
}

impl Drop for Local {
    fn drop(&mut self) {
        self.writer.send(WriterCmd::Remove(self.generation));
    }
}

/// Why a frame did not reach the room.
pub(super) enum Undelivered {
    /// It does not decode (1007).
    Malformed(String),
    /// The room has stopped (1011).
    Gone,
}

impl Session {
    /// Hands a y-websocket message (and, after an update, the request for its durable
    /// acknowledgement, `ack`) to the room, through the session's task until the switch. Waits
    /// while the room (or the task) has no room for it: backpressure on this socket. If the
    /// session's task has ended, its end is on its way to the socket, which acts on that.
    pub(super) async fn forward(
        &mut self,
        message: Bytes,
        ack: Option<u64>,
    ) -> Result<(), Undelivered> {
        match &self.route {
            Route::Task(tx) => {
                let frame = match ack {
                    // The update and its acknowledgement request in one frame: one hop to
                    // the task and one command to the room.
                    Some(n) => {
                        let ack = protocol::encode_durable_ack(n);
                        let mut both = BytesMut::with_capacity(message.len() + ack.len());
                        both.extend_from_slice(&message);
                        both.extend_from_slice(&ack);
                        both.freeze()
                    }
                    None => message,
                };
                let _ = tx.send(frame).await;
                Ok(())
            }
            Route::Room(local) => {
                let spare = usize::from(ack.is_some());
                let mut msgs =
                    to_peer_msgs_with(&message, spare).map_err(Undelivered::Malformed)?;
                if let Some(n) = ack {
                    msgs.push(PeerMsg::DurableAck(protocol::encode_durable_ack(n)));
                }
                if msgs.is_empty() {
                    return Ok(());
                }
                let Member { room, peer, .. } = &local.member;
                room.send(*peer, msgs, message.len())
                    .await
                    .map_err(|()| Undelivered::Gone)
            }
        }
    }

    /// A refreshed credential: the session's own (what its stateless messages are checked
    /// with), and its room's.
    pub(super) async fn reauth(&mut self, auth: PeerAuth) {
        self.auth.send_replace(auth.clone());
        match &self.route {
            // A relayed task passes it on; a joining one's room gets it at the switch.
            Route::Task(_) => self.refreshed = true,
            Route::Room(local) => {
                let (reply, _) = oneshot::channel();
                let auth = Box::new(auth);
                let Member { room, peer, .. } = &local.member;
                let peer = *peer;
                // A room that has stopped ends the session through its queue.
                let _ = room.command(RoomCmd::Reauth { peer, auth, reply }).await;
            }
        }
    }
}

/// What a session's task runs with.
pub(super) struct SessionTask {
    pub(super) address: String,
    pub(super) name: DocName,
    pub(super) peer: PeerId,
    pub(super) auth: PeerAuth,
    pub(super) generation: u64,
    pub(super) acks: Arc<Acks>,
    pub(super) app: AppState,
    pub(super) out: Out,
    pub(super) events: BellTx<Event>,
}

impl SessionTask {
    /// Joins the document's room and hands it to the socket, or, when another node owns the
    /// document, relays the session there until either ends.
    pub(super) async fn run(self, rx: mpsc::Receiver<Bytes>, reauth: watch::Receiver<PeerAuth>) {
        let span = debug_span!("doc", doc = %self.name, peer = self.peer);
        let joined = joining::joining(
            self.app.clone(),
            self.name.clone(),
            self.peer,
            Box::new(self.auth.clone()),
        )
        .instrument(span.clone())
        .await;
        let outcome = match joined {
            Joined::Room(room, out_rx) => return self.hand_over(room, out_rx, rx).await,
            Joined::Closed(reason) => Some(reason),
            Joined::Elsewhere(name, auth) => {
                self.relay(rx, reauth, name, auth).instrument(span).await
            }
        };
        self.events.send(Event::Ended(Ended {
            address: self.address,
            generation: self.generation,
            outcome,
        }));
    }

    /// Hands the joined room to the socket, and the frames that reached this task before the
    /// socket took it to the room, in order.
    async fn hand_over(self, room: RoomHandle, out_rx: QueueRx, mut rx: mpsc::Receiver<Bytes>) {
        let (drained_tx, drained) = oneshot::channel();
        let member = Member {
            room: room.clone(),
            peer: self.peer,
            tracker: self.app.connections.clone(),
        };
        let handover = Handover {
            address: self.address,
            generation: self.generation,
            member,
            out_rx,
            drained,
        };
        let mut outcome = None;
        if self.events.send(Event::Joined(Box::new(handover))) {
            // The socket drops its sender when it takes the room over.
            while let Some(frame) = rx.recv().await {
                let msgs = match to_peer_msgs(&frame) {
                    Ok(msgs) => msgs,
                    Err(detail) => {
                        self.app.metrics.malformed_messages.inc();
                        debug!(%detail, "malformed message");
                        let detail = transport::truncate(detail);
                        outcome = Some(CloseReason::new(close::MALFORMED, detail));
                        break;
                    }
                };
                if !msgs.is_empty() && room.send(self.peer, msgs, frame.len()).await.is_err() {
                    outcome = Some(joining::room_gone());
                    break;
                }
            }
        }
        // Unanswered when the socket did not take the room over: its `Member` leaves it.
        let _ = drained_tx.send(outcome);
    }

    /// A session relayed to the node that owns its document: its frames both ways through
    /// the bus, what comes back turned into Hocuspocus frames into the socket's queue.
    async fn relay(
        &self,
        mut rx: mpsc::Receiver<Bytes>,
        mut reauth: watch::Receiver<PeerAuth>,
        name: DocName,
        auth: Box<PeerAuth>,
    ) -> Option<CloseReason> {
        let stream = futures_util::stream::poll_fn(move |cx| {
            rx.poll_recv(cx)
                .map(|frame| frame.map(|f| Ok::<_, WsError>(WsMessage::Binary(f))))
        });
        let to = Relayed {
            address: self.address.clone(),
            acks: self.acks.clone(),
            out: self.out.clone(),
            metrics: self.app.metrics.clone(),
        };
        let sink = Box::pin(futures_util::sink::unfold(
            to,
            |to, msg: WsMessage| async move {
                to.write(msg).await?;
                Ok::<_, ()>(to)
            },
        ));
        let mut conn = transport::Pair { sink, stream };
        let who = (&name, self.peer, auth);
        joining::relayed(&mut conn, who, Some(&mut reauth), &self.app).await
    }
}

/// What a relayed session writes: its frames into the socket's queue.
struct Relayed {
    address: String,
    acks: Arc<Acks>,
    out: Out,
    metrics: Arc<crate::metrics::Metrics>,
}

impl Relayed {
    async fn write(&self, msg: WsMessage) -> Result<(), ()> {
        // The owner's keep-alive pings: the socket pings for all its documents.
        let WsMessage::Binary(frame) = msg else {
            return Ok(());
        };
        let mut frames = Vec::new();
        let to = (self.address.as_str(), &*self.acks);
        translate(to, &self.metrics, &frame, |f| frames.push(f));
        for frame in frames {
            self.out.send(frame).await?;
        }
        // The acknowledgements owed, one at a time within the socket's queue bound.
        while let Some(status) = next_status(to) {
            self.out.send(status).await?;
        }
        Ok(())
    }
}
