//! One authenticated document of a Hocuspocus socket: its session task, a peer of the
//! document's room like a y-websocket connection, and the translation of what the room
//! queues into Hocuspocus frames for the document's address.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::mpsc;
use tracing::{debug, debug_span, Instrument};

use crate::app::AppState;
use crate::protocol::hocuspocus::{self as hp};
use crate::protocol::{self, MSG_DURABLE_ACK, MSG_STATELESS};
use crate::room::{CloseReason, DocName, PeerAuth, PeerId};
use crate::socket::transport::{self, Counted, LastSeen, WsError, WsMessage};
use crate::socket::ws;

use super::Out;

/// An authenticated document of the socket: the channel to its session task.
pub(super) struct Session {
    pub(super) name: DocName,
    pub(super) tx: mpsc::Sender<Bytes>,
    /// Tells this session's end from an earlier one's for the same address.
    pub(super) generation: u64,
    /// The session's current credential; a refresh replaces it, and the session hands it to
    /// its room.
    pub(super) auth: tokio::sync::watch::Sender<PeerAuth>,
    /// Updates (and Sync Step 2s) sent to the room: the counter of the acknowledgement
    /// requested after each.
    pub(super) updates: u64,
    pub(super) acks: Arc<Acks>,
}

/// The SyncStatus count of one session.
#[derive(Default)]
pub(super) struct Acks {
    /// Acknowledgements requested from the room (the socket's count of updates sent): an
    /// echo claiming more is not believed.
    pub(super) requested: AtomicU64,
    /// `SyncStatus(true)` sent.
    pub(super) issued: AtomicU64,
    /// Updates the room refused (read-only), each answered `SyncStatus(false)`.
    pub(super) refused: AtomicU64,
}

/// A session's end, reported to its socket.
pub(super) struct Ended {
    pub(super) address: String,
    pub(super) generation: u64,
    pub(super) outcome: Option<CloseReason>,
}

impl Session {
    /// Hands a y-websocket message to the session. If the session has ended, its end is on
    /// its way to the socket, which acts on that.
    pub(super) async fn forward(&self, message: Bytes) {
        let _ = self.tx.send(message).await;
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
    pub(super) seen: Arc<LastSeen>,
    pub(super) ended: mpsc::UnboundedSender<Ended>,
}

impl SessionTask {
    /// One document of the socket as a peer of its room, until either ends.
    pub(super) async fn run(
        self,
        mut rx: mpsc::Receiver<Bytes>,
        mut reauth: tokio::sync::watch::Receiver<PeerAuth>,
    ) {
        let SessionTask {
            address,
            name,
            peer,
            auth,
            generation,
            acks,
            app,
            out,
            seen,
            ended,
        } = self;
        let _counted = Counted::new(&app.metrics.hocuspocus_documents);
        // At debug, like a y-websocket connection's (`ws::serve`).
        let span = debug_span!("doc", doc = %name, peer);
        let stream = futures_util::stream::poll_fn(move |cx| {
            rx.poll_recv(cx)
                .map(|frame| frame.map(|f| Ok::<_, WsError>(WsMessage::Binary(f))))
        });
        let translate = Translate {
            address: address.clone(),
            out,
            acks,
            metrics: app.metrics.clone(),
        };
        let sink = Box::pin(futures_util::sink::unfold(
            translate,
            |mut t, msg: WsMessage| async move {
                t.write(msg).await?;
                Ok::<_, ()>(t)
            },
        ));
        let who = (&name, peer, Box::new(auth));
        let mut conn = transport::Pair { sink, stream };
        let outcome = ws::run_peer(&mut conn, who, Some(&mut reauth), &app, &seen)
            .instrument(span)
            .await;
        let _ = ended.send(Ended {
            address,
            generation,
            outcome,
        });
    }
}

/// Turns what a room queues for a peer (y-websocket frames) into Hocuspocus frames for one
/// address: one message per frame, each prefixed with the address.
pub(super) struct Translate {
    pub(super) address: String,
    pub(super) out: Out,
    pub(super) acks: Arc<Acks>,
    pub(super) metrics: Arc<crate::metrics::Metrics>,
}

impl Translate {
    async fn write(&mut self, msg: WsMessage) -> Result<(), ()> {
        // The room's keep-alive pings: the socket pings for all its documents.
        let WsMessage::Binary(frame) = msg else {
            return Ok(());
        };
        let Ok(messages) = protocol::split_frame(&frame) else {
            debug!("dropping a frame that does not split into messages");
            return Ok(());
        };
        for (tag, message) in messages {
            match tag {
                // Sync, Awareness and QueryAwareness: the same message after the address.
                0 | 1 | 3 => self.out.send(hp::wrap(&self.address, &message)).await?,
                // The room refused a read-only client's update: Hocuspocus says so with
                // SyncStatus(false).
                2 if message.get(1) == Some(&0) => {
                    self.acks.refused.fetch_add(1, Ordering::Relaxed);
                    let status = hp::encode_sync_status(&self.address, false);
                    self.out.send(status).await?;
                }
                t if t == u64::from(MSG_DURABLE_ACK) => {
                    // Everything up to update `n` is committed: one SyncStatus(true) for each
                    // not yet answered (refusals were answered already; counting them here
                    // before their turn only delays an answer, never sends one early).
                    let Some(n) = protocol::read_durable_ack(&message) else {
                        continue;
                    };
                    let n = n.min(self.acks.requested.load(Ordering::Relaxed));
                    let target = n.saturating_sub(self.acks.refused.load(Ordering::Relaxed));
                    while self.acks.issued.load(Ordering::Relaxed) < target {
                        self.acks.issued.fetch_add(1, Ordering::Relaxed);
                        let status = hp::encode_sync_status(&self.address, true);
                        self.out.send(status).await?;
                    }
                }
                t if t == u64::from(MSG_STATELESS) => {
                    if let Some(payload) = protocol::read_stateless(&message) {
                        self.metrics.stateless_sent.inc();
                        let frame = hp::encode_stateless(&self.address, &payload);
                        self.out.send(frame).await?;
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }
}
