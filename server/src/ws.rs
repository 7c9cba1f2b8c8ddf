//! One WebSocket connection: decode frames and hand them to the room; write what the room
//! queues; ping, and close when silent too long.
//!
//! Reading and writing run as two halves of one task. The writer owns the bounded outbound
//! queue the room fills; if the socket stops draining, the queue fills, and the room closes the
//! peer with 1013 instead of waiting for it.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{FutureExt, SinkExt, StreamExt};
use prometheus::IntGauge;
use tokio::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
use tokio_tungstenite::tungstenite::protocol::frame::Frame;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
pub(crate) use tokio_tungstenite::tungstenite::{Error as WsError, Message as WsMessage};
use tracing::{debug, debug_span, Instrument};

use crate::close;
use crate::http::upgrade::Socket;
use crate::limits::PeerRates;
use crate::relay::{next_auth, relay_to_owner, Reauth};
use crate::room::join::{join, join_close, next_peer_id, to_peer_msgs};
use crate::room::queue::{self, Next, QueueRx};
use crate::room::{CloseReason, DocName, JoinError, PeerAuth, RoomCmd, RoomHandle};
use crate::AppState;

/// How long a close frame may take to leave before the socket is dropped.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);
/// The same for a peer closed because it stopped reading (1013): it may be slow rather than
/// gone, and should learn why it was closed once it reads again; the bound frees the task of
/// one that never does.
const BACKPRESSURE_CLOSE_TIMEOUT: Duration = Duration::from_secs(30);
/// Most queued frames written with one flush.
const MAX_FRAMES_PER_FLUSH: usize = 64;

/// Largest WebSocket frame sent: a longer message (a whole document's Sync Step 2) leaves as
/// fragments, each a slice of the one buffer the room shares among its peers. tungstenite
/// copies a message whole into the connection's write buffer, which keeps that capacity
/// afterwards, and moves what is left of it forward after every partial write: 150 clients
/// opening a 20 MB document held 150 copies (3 GB) and spent most of their CPU moving them.
pub(crate) const FRAGMENT_BYTES: usize = 64 * 1024;

pub(crate) type Sink = Fragmenting<SplitSink<Socket, WsMessage>>;
pub(crate) type Stream = SplitStream<Socket>;

/// A sink that sends binary messages longer than [`FRAGMENT_BYTES`] as a fragmented message
/// (a Binary frame, then Continuation frames, the last one final); nothing else is sent
/// between the fragments of one message.
pub(crate) struct Fragmenting<S> {
    inner: S,
    /// The message being fragmented and how much of it has been sent (boxed: an idle
    /// connection keeps 8 bytes for it, not 40).
    rest: Option<Box<(Bytes, usize)>>,
}

impl<S: futures_util::Sink<WsMessage> + Unpin> Fragmenting<S> {
    pub(crate) fn new(inner: S) -> Fragmenting<S> {
        Fragmenting { inner, rest: None }
    }

    /// Hands the pending fragments to the inner sink, as far as it takes them.
    fn poll_fragments(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        while let Some(rest) = &mut self.rest {
            let (message, at) = &mut **rest;
            ready!(Pin::new(&mut self.inner).poll_ready(cx))?;
            let end = (*at + FRAGMENT_BYTES).min(message.len());
            let opcode = if *at == 0 {
                OpCode::Data(Data::Binary)
            } else {
                OpCode::Data(Data::Continue)
            };
            let last = end == message.len();
            let frame = Frame::message(message.slice(*at..end), opcode, last);
            *at = end;
            if last {
                self.rest = None;
            }
            Pin::new(&mut self.inner).start_send(WsMessage::Frame(frame))?;
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: futures_util::Sink<WsMessage> + Unpin> futures_util::Sink<WsMessage> for Fragmenting<S> {
    type Error = S::Error;

    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        let this = self.get_mut();
        ready!(this.poll_fragments(cx))?;
        Pin::new(&mut this.inner).poll_ready(cx)
    }

    fn start_send(self: Pin<&mut Self>, item: WsMessage) -> Result<(), S::Error> {
        let this = self.get_mut();
        match item {
            WsMessage::Binary(message) if message.len() > FRAGMENT_BYTES => {
                // poll_ready returned Ready, so no earlier message is still pending.
                this.rest = Some(Box::new((message, 0)));
                Ok(())
            }
            other => Pin::new(&mut this.inner).start_send(other),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        let this = self.get_mut();
        ready!(this.poll_fragments(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        let this = self.get_mut();
        ready!(this.poll_fragments(cx))?;
        Pin::new(&mut this.inner).poll_close(cx)
    }
}

/// Serves one upgraded connection to document `name` until it closes.
///
/// The socket is split before the connection's future exists: it then lives once, in the
/// halves' shared cell, instead of being copied into every layer of the future (which is
/// most of an idle connection's memory). For the same reason the connection is one `async`
/// block and not one wrapped in another: an outer block keeps its own copy of everything it
/// hands the inner one (112 bytes per connection here, measured with `size_of_val`).
#[allow(clippy::boxed_local)] // deliberately boxed: see `Conn`
pub fn serve(socket: Socket, conn: Box<Conn>) -> impl Future<Output = ()> + Send {
    let Conn { name, auth, app } = *conn;
    let peer = next_peer_id();
    // A debug span: nothing inside a connection logs above debug, and an enabled span costs
    // every connection about 0.3 KiB in the subscriber's registry (with the default `info`
    // filter a disabled one costs nothing).
    let user = auth.user.as_deref().unwrap_or("-");
    let span = debug_span!("conn", doc = %name, peer, user = %user);
    let (sink, stream) = socket.split();
    serve_inner(Fragmenting::new(sink), stream, name, peer, auth, app)
        .map(|reason| debug!(code = reason.code, reason = %reason.reason, "closed"))
        .instrument(span)
}

/// What a connection needs besides its socket. Boxed while the upgrade completes: the
/// upgrade's task keeps what its callback captured for as long as the connection lives, and
/// a box it has handed on costs 8 bytes there instead of 144.
pub struct Conn {
    pub name: DocName,
    /// Boxed: a connection's future holds it in three places (here, the connection and its
    /// peer), 8 bytes each instead of 72.
    pub auth: Box<PeerAuth>,
    pub app: AppState,
}

/// Counts an open connection in the metrics for as long as it lives (a connection's future
/// dropped at shutdown included).
pub(crate) struct Counted(IntGauge);

impl Counted {
    pub(crate) fn new(gauge: &IntGauge) -> Counted {
        gauge.inc();
        Counted(gauge.clone())
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// (A plain function returning an `async move` block: an `async fn` would keep its
/// arguments twice in the future, once as arguments and once as locals.)
#[allow(clippy::manual_async_fn)] // deliberately not `async fn`: see above
fn serve_inner(
    mut sink: Sink,
    mut stream: Stream,
    name: DocName,
    peer: u64,
    auth: Box<PeerAuth>,
    app: AppState,
) -> impl Future<Output = CloseReason> + Send {
    async move {
        let _counted = Counted::new(&app.metrics.connections);
        let seen = LastSeen::new();
        let who = (&name, peer, auth);
        let outcome = run_peer(&mut sink, &mut stream, who, None, &app, &seen).await;
        // Boxed, like the other steps taken once: an idle connection's future has no room
        // for them.
        Box::pin(finish(sink, stream, outcome)).await
    }
}

/// One client of document `name` through `sink` and `stream`, as a peer of its room (or,
/// when another node owns it, relayed there): joins, moves frames both ways until either side
/// ends, and leaves. Returns why it ended (`None`: the client closed); the caller closes the
/// transport. A WebSocket of the y-websocket endpoint is one such client; each document of a
/// Hocuspocus socket is another (`crate::hocuspocus`), with channels for `sink` and `stream`.
///
/// `reauth` brings the client's refreshed credentials (a Hocuspocus token refresh), which the
/// room (or, relayed, the owner's) takes in place of the first.
pub(crate) async fn run_peer<S, R>(
    sink: &mut S,
    stream: &mut R,
    (name, peer, auth): (&DocName, u64, Box<PeerAuth>),
    mut reauth: Option<&mut Reauth>,
    app: &AppState,
    seen: &LastSeen,
) -> Option<CloseReason>
where
    S: futures_util::Sink<WsMessage> + Unpin + Send,
    R: futures_util::Stream<Item = Result<WsMessage, WsError>> + Unpin + Send,
{
    // Boxed: joining happens once, and its future is larger than the rest of the
    // connection's.
    let (room, out_rx) = match Box::pin(join(&app.registry, name, peer, (*auth).clone())).await {
        Ok(joined) => joined,
        Err(JoinError::Elsewhere) if app.bus.is_some() => {
            // Another node owns the document: relay this client to it through the bus.
            return match &app.bus {
                Some(bus) => {
                    let who = (name, peer, *auth);
                    Box::pin(relay_to_owner(sink, stream, who, reauth, app, bus)).await
                }
                None => None,
            };
        }
        Err(e) => return Some(join_close(e)),
    };
    // A revocation applied between the token check and the join missed this peer in the room
    // (revocations update the in-memory set before they tell the rooms), so look again.
    if let (Some(token_id), Some(user)) = (&auth.token_id, &auth.user) {
        if app.auth.is_revoked(token_id, user, auth.issued_at) {
            Box::pin(room.leave(peer)).await;
            return Some(CloseReason::new(close::FORBIDDEN, "access revoked"));
        }
    }
    let reauthing = async {
        if reauth.is_none() {
            // A y-websocket client never refreshes its credentials.
            return std::future::pending().await;
        }
        // Boxed: passing a refresh to the room takes more room than the rest of an idle
        // connection's future, and only Hocuspocus documents need it.
        Box::pin(async {
            loop {
                let auth = Box::new(next_auth(&mut reauth).await);
                let (reply, _) = tokio::sync::oneshot::channel();
                if room
                    .command(RoomCmd::Reauth { peer, auth, reply })
                    .await
                    .is_err()
                {
                    return queue::closed_reason();
                }
            }
        })
        .await
    };
    let outcome = tokio::select! {
        r = read_frames(stream, &room, peer, app, seen) => r,
        w = write_frames(sink, &out_rx, app, seen) => w,
        gone = reauthing => Some(gone),
    };
    Box::pin(room.leave(peer)).await;
    outcome
}

/// When a connection's client was last heard from, shared by its two halves: milliseconds
/// since the connection opened (an atomic, not an `Instant` behind a lock).
pub(crate) struct LastSeen {
    opened: Instant,
    at_ms: AtomicU64,
}

impl LastSeen {
    pub(crate) fn new() -> LastSeen {
        LastSeen {
            opened: Instant::now(),
            at_ms: AtomicU64::new(0),
        }
    }

    pub(crate) fn mark(&self) {
        let now = self.opened.elapsed().as_millis() as u64;
        self.at_ms.store(now, Ordering::Relaxed);
    }

    pub(crate) fn last(&self) -> Instant {
        self.opened + Duration::from_millis(self.at_ms.load(Ordering::Relaxed))
    }
}

/// The reader half: decodes each frame (a malformed one closes with 1007), applies the rate
/// limits and hands the messages to the room (waiting while its inbox is full: backpressure
/// on this client only). Returns how the connection ends (`None`: the client closed).
async fn read_frames<R>(
    stream: &mut R,
    room: &RoomHandle,
    peer: u64,
    app: &AppState,
    seen: &LastSeen,
) -> Option<CloseReason>
where
    R: futures_util::Stream<Item = Result<WsMessage, WsError>> + Unpin,
{
    let limits = &app.config.limits;
    let mut rates = PeerRates::new(limits);
    while let Some(frame) = stream.next().await {
        seen.mark();
        match frame {
            Ok(WsMessage::Binary(data)) => {
                let msgs = match to_peer_msgs(&data) {
                    Ok(msgs) => msgs,
                    Err(detail) => {
                        app.metrics.malformed_messages.inc();
                        debug!(%detail, "malformed message");
                        return Some(CloseReason::new(close::MALFORMED, truncate(detail)));
                    }
                };
                let now_ms = seen.opened.elapsed().as_millis() as u32;
                if let Err(reason) = rates.check(&msgs, now_ms, limits) {
                    app.metrics.rate_limited.inc();
                    debug!(reason = %reason.reason, "rate limit exceeded");
                    return Some(reason);
                }
                if !msgs.is_empty() && room.send(peer, msgs, data.len()).await.is_err() {
                    return Some(CloseReason::new(
                        close::INTERNAL,
                        "document closed, reconnect",
                    ));
                }
            }
            Ok(WsMessage::Text(_)) => {
                return Some(CloseReason::new(
                    close::UNSUPPORTED_DATA,
                    "text frames are not part of the protocol",
                ))
            }
            // (Reads never yield raw frames.)
            Ok(WsMessage::Ping(_) | WsMessage::Pong(_) | WsMessage::Frame(_)) => {}
            Ok(WsMessage::Close(_)) => return None,
            Err(e) => {
                if is_too_big(&e) {
                    return Some(CloseReason::new(close::MESSAGE_TOO_BIG, "message too big"));
                }
                debug!(error = %e, "read error");
                return None;
            }
        }
    }
    None
}

/// The writer half: sends what the room queues (a burst in one flush), pings on the room's
/// keep-alive tick and closes a client silent past `idle_timeout`; the room's close order
/// gets through even while a send is stuck on a client that stopped reading.
async fn write_frames<S>(
    sink: &mut S,
    out_rx: &QueueRx,
    app: &AppState,
    seen: &LastSeen,
) -> Option<CloseReason>
where
    S: futures_util::Sink<WsMessage> + Unpin,
{
    loop {
        match out_rx.recv().await {
            Next::Frame(frame) => {
                // A peer that stops reading blocks this send; the room's close order
                // (1013 when its queue overflows) must still get through.
                // Everything already queued goes out with the same flush: one write
                // for a burst of frames instead of one per frame.
                // Boxed: an idle connection's future then has no room for it.
                let burst = Box::pin(async {
                    sink.feed(WsMessage::Binary(frame)).await?;
                    for _ in 1..MAX_FRAMES_PER_FLUSH {
                        match out_rx.try_recv() {
                            Some(next) => sink.feed(WsMessage::Binary(next)).await?,
                            None => break,
                        }
                    }
                    sink.flush().await
                });
                tokio::select! {
                    biased;
                    reason = out_rx.killed() => return Some(reason),
                    sent = burst => {
                        if sent.is_err() {
                            return None;
                        }
                    }
                }
            }
            // The room's keep-alive tick: close a client silent for too long, ping
            // the others.
            Next::Ping => {
                if seen.last().elapsed() >= app.config.idle_timeout {
                    return Some(CloseReason::new(close::GOING_AWAY, "idle timeout"));
                }
                let ping = Box::pin(sink.send(WsMessage::Ping(Bytes::new())));
                tokio::select! {
                    biased;
                    reason = out_rx.killed() => return Some(reason),
                    sent = ping => {
                        if sent.is_err() {
                            return None;
                        }
                    }
                }
            }
            Next::Kill(reason) => return Some(reason),
            Next::Closed => return Some(queue::closed_reason()),
        }
    }
}

/// The close handshake: send ours, then read until the client's Close (or the timeout) so
/// the client sees our code instead of a reset connection. `None`: the client closed.
pub(crate) async fn finish(
    mut sink: Sink,
    mut stream: Stream,
    outcome: Option<CloseReason>,
) -> CloseReason {
    {
        match outcome {
            Some(reason) => {
                let frame = WsMessage::Close(Some(CloseFrame {
                    code: reason.code.into(),
                    reason: reason.reason.to_string().into(),
                }));
                let patience = if reason.code == close::TRY_AGAIN_LATER {
                    BACKPRESSURE_CLOSE_TIMEOUT
                } else {
                    CLOSE_TIMEOUT
                };
                let _ = tokio::time::timeout(patience, async {
                    if sink.send(frame).await.is_ok() {
                        while let Some(Ok(msg)) = stream.next().await {
                            if matches!(msg, WsMessage::Close(_)) {
                                break;
                            }
                        }
                    }
                    let _ = sink.close().await;
                })
                .await;
                reason
            }
            None => CloseReason::new(1000, "closed by peer"),
        }
    }
}

/// Whether a read failed on a message or frame over the configured bounds.
pub(crate) fn is_too_big(e: &WsError) -> bool {
    matches!(e, WsError::Capacity(_))
}

/// Close reasons must fit a control frame (123 bytes).
pub(crate) fn truncate(mut s: String) -> String {
    if s.len() > 120 {
        let mut cut = 120;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}
