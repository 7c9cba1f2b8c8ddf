//! One authenticated document of a Hocuspocus socket: its session task, a peer of the
//! document's room like a y-websocket connection, and the translation of what the room
//! queues into Hocuspocus frames for the document's address.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use futures_util::lock::{OwnedMutexGuard, OwnedMutexLockFuture};
use futures_util::Sink as _;
use tokio::sync::mpsc;
use tracing::{debug, debug_span, Instrument};

use crate::app::AppState;
use crate::protocol::hocuspocus::{self as hp};
use crate::protocol::{self, MSG_DURABLE_ACK, MSG_STATELESS};
use crate::room::{CloseReason, DocName, PeerAuth, PeerId};
use crate::socket::transport::{self, Counted, LastSeen, WsError, WsMessage};
use crate::socket::ws;

use super::SharedSink;

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
    pub(super) socket: SharedSink,
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
            socket,
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
        let sink = Translate::new(address.clone(), socket, acks, app.metrics.clone());
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
/// address (one message per frame, each prefixed with the address) and writes them straight
/// to the socket, taking its write half for the time of a burst: no task or queue between the
/// room and the socket. A session that cannot write waits; its room's queue for it fills
/// meanwhile, and the room closes it with 1013, which closes the socket.
pub(super) struct Translate {
    pub(super) address: String,
    pub(super) socket: SharedSink,
    pub(super) acks: Arc<Acks>,
    pub(super) metrics: Arc<crate::metrics::Metrics>,
    /// Hocuspocus frames translated and not yet handed to the socket.
    pending: VecDeque<Bytes>,
    /// Frames were handed to the socket since its last flush.
    unflushed: bool,
    /// Waiting for the socket's write half.
    locking: Option<OwnedMutexLockFuture<Option<transport::Sink>>>,
    /// The socket's write half, held from the first frame of a write to its end (a write that
    /// waits for the client keeps it: the frames of a burst and the fragments of a long
    /// message stay in order).
    held: Option<OwnedMutexGuard<Option<transport::Sink>>>,
}

/// Translated frames held before a write must first hand them to the socket.
const MAX_PENDING: usize = 64;

impl Translate {
    pub(super) fn new(
        address: String,
        socket: SharedSink,
        acks: Arc<Acks>,
        metrics: Arc<crate::metrics::Metrics>,
    ) -> Translate {
        Translate {
            address,
            socket,
            acks,
            metrics,
            pending: VecDeque::new(),
            unflushed: false,
            locking: None,
            held: None,
        }
    }

    /// The Hocuspocus frames for one frame the room queued.
    fn translate(&mut self, msg: WsMessage) {
        // The room's keep-alive pings: the socket pings for all its documents.
        let WsMessage::Binary(frame) = msg else {
            return;
        };
        let Ok(messages) = protocol::split_frame(&frame) else {
            debug!("dropping a frame that does not split into messages");
            return;
        };
        for (tag, message) in messages {
            match tag {
                // Sync, Awareness and QueryAwareness: the same message after the address.
                0 | 1 | 3 => self.pending.push_back(hp::wrap(&self.address, &message)),
                // The room refused a read-only client's update: Hocuspocus says so with
                // SyncStatus(false).
                2 if message.get(1) == Some(&0) => {
                    self.acks.refused.fetch_add(1, Ordering::Relaxed);
                    let status = hp::encode_sync_status(&self.address, false);
                    self.pending.push_back(status);
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
                        self.pending.push_back(status);
                    }
                }
                t if t == u64::from(MSG_STATELESS) => {
                    if let Some(payload) = protocol::read_stateless(&message) {
                        self.metrics.stateless_sent.inc();
                        let frame = hp::encode_stateless(&self.address, &payload);
                        self.pending.push_back(frame);
                    }
                }
                _ => {}
            }
        }
    }

    /// Hands the pending frames to the socket (and flushes it, with `flush`), taking its write
    /// half for as long as that takes. Fails once the socket is gone.
    fn poll_write(&mut self, cx: &mut Context<'_>, flush: bool) -> Poll<Result<(), ()>> {
        if self.pending.is_empty() && !(flush && self.unflushed) {
            return Poll::Ready(Ok(()));
        }
        if self.held.is_none() {
            let socket = &self.socket;
            let locking = self
                .locking
                .get_or_insert_with(|| socket.clone().lock_owned());
            let guard = ready!(Pin::new(locking).poll(cx));
            self.locking = None;
            self.held = Some(guard);
        }
        let Some(sink) = self.held.as_mut().and_then(|held| held.as_mut()) else {
            // The socket is closing.
            self.held = None;
            return Poll::Ready(Err(()));
        };
        while let Some(frame) = self.pending.pop_front() {
            match Pin::new(&mut *sink).poll_ready(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(_)) => return Poll::Ready(Err(())),
                Poll::Pending => {
                    self.pending.push_front(frame);
                    return Poll::Pending;
                }
            }
            if Pin::new(&mut *sink)
                .start_send(WsMessage::Binary(frame))
                .is_err()
            {
                return Poll::Ready(Err(()));
            }
            self.unflushed = true;
        }
        if flush && self.unflushed {
            if ready!(Pin::new(&mut *sink).poll_flush(cx)).is_err() {
                return Poll::Ready(Err(()));
            }
            self.unflushed = false;
        }
        // The other documents' sessions and the socket's own answers may write now.
        self.held = None;
        Poll::Ready(Ok(()))
    }
}

impl futures_util::Sink<WsMessage> for Translate {
    type Error = ();

    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), ()>> {
        let this = self.get_mut();
        if this.pending.len() >= MAX_PENDING {
            ready!(this.poll_write(cx, false))?;
        }
        Poll::Ready(Ok(()))
    }

    fn start_send(self: Pin<&mut Self>, msg: WsMessage) -> Result<(), ()> {
        self.get_mut().translate(msg);
        Ok(())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), ()>> {
        self.get_mut().poll_write(cx, true)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), ()>> {
        // The socket closes when all its documents are done, not when one is.
        self.get_mut().poll_write(cx, true)
    }
}
