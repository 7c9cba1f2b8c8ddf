//! One WebSocket connection: decode frames and hand them to the room; write what the room
//! queues; ping, and close when silent too long.
//!
//! Reading and writing are the two directions of one hand-written future ([`Pump`]) that
//! polls both of one unsplit socket. The writer drains the bounded outbound queue the room
//! fills; if the socket stops draining, the queue fills, and the room closes the peer with
//! 1013 instead of waiting for it.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use tracing::{debug, debug_span};

use super::admit::{admit_address, socket_permission, socket_token};
use super::joining::{joining, relayed, room_gone, Joined};
use super::transport::{
    finish, is_too_big, socket_config, truncate, Counted, Duplex, Fragmenting, LastSeen, WsMessage,
};
use super::upgrade::{Socket, UpgradeRejection, WsUpgrade};
use crate::app::{App, AppState};
use crate::auth::Principal;
use crate::close;
use crate::config::Limits;
use crate::limits::PeerRates;
use crate::problem::problem;
use crate::room::join::{next_peer_id, to_peer_msgs};
use crate::room::queue::{self, Next, QueueRx};
use crate::room::{CloseReason, DocName, PeerAuth, RoomHandle, SendWait};

/// Most queued frames written with one flush.
const MAX_FRAMES_PER_FLUSH: u8 = 64;

/// Serves one upgraded connection to document `name` until it closes.
#[allow(clippy::boxed_local)] // deliberately boxed: see `Conn`
pub fn serve(socket: Socket, conn: Box<Conn>) -> Connection {
    let Conn { name, auth, app } = *conn;
    let peer = next_peer_id();
    // A debug span: nothing inside a connection logs above debug, and an enabled span costs
    // every connection about 0.3 KiB in the subscriber's registry. With the default `info`
    // filter it is disabled, and then not kept at all.
    let user = auth.user.as_deref().unwrap_or("-");
    let span = debug_span!("conn", doc = %name, peer, user = %user);
    let span = (!span.is_disabled()).then(|| Box::new(span));
    Connection {
        socket: Some(Fragmenting::new(socket)),
        _counted: Counted::new(&app.metrics.connections),
        stage: Stage::Joining(joining(app.clone(), name, peer, auth)),
        app,
        seen: LastSeen::new(),
        peer,
        span,
    }
}

/// A y-websocket connection, from its upgrade to its close: joins its room, moves frames both
/// ways, leaves and closes.
///
/// A hand-written future, and the socket unsplit: an idle connection is this struct and its
/// task, and nothing else of it lives between frames. The socket is inline (a split keeps it
/// in a shared cell of its own, 0.36 KiB, besides the halves), [`Pump`] polls both its
/// directions, and the steps taken once (joining, leaving, the close handshake) are boxed
/// while they run. `async` blocks nested three deep (the connection, its peer, the reader and
/// writer in a `select!`) came to 1,056 bytes for what this holds in 520: each layer kept its
/// own copy of its arguments and of locals that are never alive together.
pub struct Connection {
    /// Taken by the close handshake (and by a relay to another node, which ends with it).
    socket: Option<Fragmenting<Socket>>,
    app: AppState,
    seen: LastSeen,
    peer: u64,
    stage: Stage,
    /// The connection's debug span, when that level is enabled.
    span: Option<Box<tracing::Span>>,
    _counted: Counted,
}

enum Stage {
    Joining(Pin<Box<dyn Future<Output = Joined> + Send>>),
    Running(Pump),
    /// Leaving the room, then closing with the reason (`None`: the client closed).
    Leaving(
        Pin<Box<dyn Future<Output = ()> + Send>>,
        Option<CloseReason>,
    ),
    /// The close handshake (or, relayed, the relay and then the close).
    Closing(Pin<Box<dyn Future<Output = CloseReason> + Send>>),
    Done,
}

impl Connection {
    /// Leaves for the close handshake with `outcome`.
    fn close(&mut self, outcome: Option<CloseReason>) {
        let socket = self.socket.take();
        let slow = self.app.config.slow_close_timeout;
        self.stage = Stage::Closing(Box::pin(async move {
            match socket {
                Some(socket) => finish(socket, outcome, slow).await,
                None => CloseReason::new(1000, "closed by peer"),
            }
        }));
    }
}

impl Future for Connection {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let span = this.span.as_deref().cloned();
        let _entered = span.as_ref().map(tracing::Span::enter);
        loop {
            match &mut this.stage {
                Stage::Joining(joining) => match ready!(joining.as_mut().poll(cx)) {
                    Joined::Room(room, out_rx) => {
                        let limits = &this.app.config.limits;
                        this.stage = Stage::Running(Pump::new(room, out_rx, this.peer, limits));
                    }
                    Joined::Closed(reason) => this.close(Some(reason)),
                    Joined::Elsewhere(name, auth) => {
                        let (socket, app, peer) = (this.socket.take(), this.app.clone(), this.peer);
                        this.stage = Stage::Closing(Box::pin(async move {
                            let Some(mut socket) = socket else {
                                return CloseReason::new(1000, "closed by peer");
                            };
                            let who = (&name, peer, auth);
                            let outcome = relayed(&mut socket, who, None, &app).await;
                            finish(socket, outcome, app.config.slow_close_timeout).await
                        }));
                    }
                },
                Stage::Running(pump) => {
                    let Some(socket) = &mut this.socket else {
                        this.stage = Stage::Done;
                        continue;
                    };
                    let outcome = ready!(pump.poll(socket, &this.app, &this.seen, cx));
                    let room = pump.room.clone();
                    let peer = this.peer;
                    let leave = Box::pin(async move { room.leave(peer).await });
                    this.stage = Stage::Leaving(leave, outcome);
                }
                Stage::Leaving(leave, outcome) => {
                    ready!(leave.as_mut().poll(cx));
                    let outcome = outcome.take();
                    this.close(outcome);
                }
                Stage::Closing(closing) => {
                    let reason = ready!(closing.as_mut().poll(cx));
                    debug!(code = reason.code, reason = %reason.reason, "closed");
                    this.stage = Stage::Done;
                }
                Stage::Done => return Poll::Ready(()),
            }
        }
    }
}

/// What a connection needs besides its socket. Boxed while the upgrade completes: the
/// upgrade's task keeps what its callback captured for as long as the connection lives, and
/// a box it has handed on costs 8 bytes there instead of 144.
pub struct Conn {
    pub name: DocName,
    /// Boxed, and handed on to the join (which gives the room its own copy): the connection
    /// keeps none of it once joined.
    pub auth: Box<PeerAuth>,
    pub app: AppState,
}

/// A joined peer's frames both ways, until either side ends: `None` when the client closed,
/// else the reason to close it with.
///
/// Polled by hand rather than a `select!` over a reader and a writer: it polls both
/// directions of one socket, which therefore need not be split, and an idle connection holds
/// just this struct (the `select!` of two `async` loops was about 0.5 KiB). It owns none of
/// the connection: the socket, the app and the last-heard time come with each poll.
///
/// Reading decodes each frame (a malformed one closes with 1007), applies the rate limits and
/// hands the messages to the room, pausing while the room's inbox is full (backpressure on
/// this client only). Writing sends what the room queues (a burst in one flush), pings on the
/// room's keep-alive tick and closes a client silent past `idle_timeout`; the room's close
/// order gets through even while a write is stuck on a client that stopped reading.
pub(crate) struct Pump {
    room: RoomHandle,
    out_rx: QueueRx,
    peer: u64,
    rates: PeerRates,
    /// A frame's messages waiting for room in the room's inbox; nothing is read meanwhile.
    sending: Option<SendWait<'static>>,
    /// A frame taken from the queue that the socket has no room for yet.
    held: Option<Bytes>,
    /// A ping is due (the room's keep-alive tick).
    ping: bool,
    /// Messages were handed to the socket and are not flushed yet.
    flushing: bool,
    /// How many more queued frames may join the current write before its flush.
    burst_left: u8,
    /// Reading goes first in this poll (the two directions alternate).
    read_first: bool,
}

impl Pump {
    fn new(room: RoomHandle, out_rx: QueueRx, peer: u64, limits: &Limits) -> Self {
        Pump {
            room,
            out_rx,
            peer,
            rates: PeerRates::new(limits),
            sending: None,
            held: None,
            ping: false,
            flushing: false,
            burst_left: 0,
            read_first: false,
        }
    }

    /// Moves frames until either side ends: `None` when the client closed, else the reason
    /// to close it with.
    fn poll<T: Duplex>(
        &mut self,
        conn: &mut T,
        app: &App,
        seen: &LastSeen,
        cx: &mut Context<'_>,
    ) -> Poll<Option<CloseReason>> {
        // The two directions take turns at going first, as an unbiased `select!` would: a
        // side that spends the task's I/O budget cannot keep the other waiting poll after
        // poll (a busy queue would otherwise hold back the client's frames and its Close).
        self.read_first = !self.read_first;
        if self.read_first {
            if let Poll::Ready(ended) = self.poll_read(conn, app, seen, cx) {
                return Poll::Ready(ended);
            }
            self.poll_write(conn, app, seen, cx)
        } else {
            if let Poll::Ready(ended) = self.poll_write(conn, app, seen, cx) {
                return Poll::Ready(ended);
            }
            self.poll_read(conn, app, seen, cx)
        }
    }

    fn poll_read<T: Duplex>(
        &mut self,
        conn: &mut T,
        app: &App,
        seen: &LastSeen,
        cx: &mut Context<'_>,
    ) -> Poll<Option<CloseReason>> {
        let limits = &app.config.limits;
        loop {
            if let Some(sending) = &mut self.sending {
                if ready!(sending.as_mut().poll(cx)).is_err() {
                    return Poll::Ready(Some(room_gone()));
                }
                self.sending = None;
            }
            let Some(frame) = ready!(Pin::new(&mut *conn).poll_next(cx)) else {
                return Poll::Ready(None);
            };
            seen.mark();
            match frame {
                Ok(WsMessage::Binary(data)) => {
                    let msgs = match to_peer_msgs(&data) {
                        Ok(msgs) => msgs,
                        Err(detail) => {
                            app.metrics.malformed_messages.inc();
                            debug!(%detail, "malformed message");
                            let reason = CloseReason::new(close::MALFORMED, truncate(detail));
                            return Poll::Ready(Some(reason));
                        }
                    };
                    let now_ms = seen.opened.elapsed().as_millis() as u32;
                    if let Err(reason) = self.rates.check(&msgs, now_ms, limits) {
                        app.metrics.rate_limited.inc();
                        debug!(reason = %reason.reason, "rate limit exceeded");
                        return Poll::Ready(Some(reason));
                    }
                    if !msgs.is_empty() {
                        match self.room.start_send(self.peer, msgs, data.len()) {
                            Ok(wait) => self.sending = wait,
                            Err(()) => return Poll::Ready(Some(room_gone())),
                        }
                    }
                }
                Ok(WsMessage::Text(_)) => {
                    return Poll::Ready(Some(CloseReason::new(
                        close::UNSUPPORTED_DATA,
                        "text frames are not part of the protocol",
                    )))
                }
                // (Reads never yield raw frames.)
                Ok(WsMessage::Ping(_) | WsMessage::Pong(_) | WsMessage::Frame(_)) => {}
                Ok(WsMessage::Close(_)) => return Poll::Ready(None),
                Err(e) => {
                    if is_too_big(&e) {
                        let reason = CloseReason::new(close::MESSAGE_TOO_BIG, "message too big");
                        return Poll::Ready(Some(reason));
                    }
                    debug!(error = %e, "read error");
                    return Poll::Ready(None);
                }
            }
        }
    }

    fn poll_write<T: Duplex>(
        &mut self,
        conn: &mut T,
        app: &App,
        seen: &LastSeen,
        cx: &mut Context<'_>,
    ) -> Poll<Option<CloseReason>> {
        loop {
            // A peer that stops reading blocks a write; the room's close order (1013 when its
            // queue overflows) must still get through, so a write that has to wait also waits
            // for that order. (One that goes on sees it at the next frame: `try_recv` gives
            // nothing once it is given, and `poll_next` gives it first.)
            if self.held.is_some() || self.ping {
                match Pin::new(&mut *conn).poll_ready(cx) {
                    Poll::Pending => return self.poll_stuck(app, seen, cx),
                    Poll::Ready(Err(_)) => return Poll::Ready(None),
                    Poll::Ready(Ok(())) => {}
                }
                let msg = match self.held.take() {
                    Some(frame) => WsMessage::Binary(frame),
                    None => {
                        self.ping = false;
                        WsMessage::Ping(Bytes::new())
                    }
                };
                if Pin::new(&mut *conn).start_send(msg).is_err() {
                    return Poll::Ready(None);
                }
                self.flushing = true;
                // Everything already queued goes out with the same flush: one write for a
                // burst of frames instead of one per frame.
                if self.burst_left > 0 {
                    self.burst_left -= 1;
                    if let Some(next) = self.out_rx.try_recv() {
                        self.held = Some(next);
                        continue;
                    }
                }
            }
            if self.flushing {
                match Pin::new(&mut *conn).poll_flush(cx) {
                    Poll::Pending => return self.poll_stuck(app, seen, cx),
                    Poll::Ready(Err(_)) => return Poll::Ready(None),
                    Poll::Ready(Ok(())) => self.flushing = false,
                }
            }
            match ready!(self.out_rx.poll_next(cx)) {
                Next::Frame(frame) => {
                    self.held = Some(frame);
                    self.burst_left = MAX_FRAMES_PER_FLUSH - 1;
                }
                // The room's keep-alive tick: close a client silent for too long, ping the
                // others.
                Next::Ping => {
                    if let Some(idle) = idle(app, seen) {
                        return Poll::Ready(Some(idle));
                    }
                    self.ping = true;
                    self.burst_left = 0;
                }
                Next::Kill(reason) => return Poll::Ready(Some(reason)),
                Next::Closed => return Poll::Ready(Some(queue::closed_reason())),
            }
        }
    }

    /// A write waits on a client that does not read: the room's close order still gets
    /// through, and the keep-alive tick still closes a client silent for `idle_timeout` (its
    /// ping goes out after the stuck frame, if ever).
    fn poll_stuck(
        &mut self,
        app: &App,
        seen: &LastSeen,
        cx: &mut Context<'_>,
    ) -> Poll<Option<CloseReason>> {
        loop {
            match ready!(self.out_rx.poll_stuck(cx)) {
                Next::Ping => {
                    if let Some(idle) = idle(app, seen) {
                        return Poll::Ready(Some(idle));
                    }
                    self.ping = true;
                }
                Next::Kill(reason) => return Poll::Ready(Some(reason)),
                Next::Closed | Next::Frame(_) => return Poll::Ready(Some(queue::closed_reason())),
            }
        }
    }
}

/// The close for a client heard from last `idle_timeout` ago or more.
fn idle(app: &App, seen: &LastSeen) -> Option<CloseReason> {
    (seen.last().elapsed() >= app.config.idle_timeout)
        .then(|| CloseReason::new(close::GOING_AWAY, "idle timeout"))
}

/// `GET /<document-name>` with a WebSocket upgrade. The name and the token are checked before
/// the upgrade, so a bad one gets a plain HTTP error.
pub async fn accept(
    State(app): State<AppState>,
    connect_info: Option<axum::Extension<axum::extract::ConnectInfo<std::net::SocketAddr>>>,
    uri: Uri,
    headers: HeaderMap,
    ws: Result<WsUpgrade, UpgradeRejection>,
) -> Response {
    let ip = connect_info.map(|c| c.0 .0.ip());
    if let Err(refused) = admit_address(&app, ip) {
        return *refused;
    }
    let name = match DocName::from_url_path(uri.path()) {
        Ok(name) => name,
        Err(e) => {
            return problem(
                StatusCode::BAD_REQUEST,
                "invalid-document-name",
                &e.to_string(),
            )
        }
    };
    let (principal, via_protocol) = if app.auth.is_open() {
        (Principal::open(ip), false)
    } else {
        let (token, via_protocol) = socket_token(&uri, &headers).unzip();
        match app.verify(ip, token.as_deref()) {
            Ok(p) => (p, via_protocol.unwrap_or(false)),
            Err(refused) => return crate::problem::refused(refused),
        }
    };
    let auth = match socket_permission(&app, &principal, &name).await {
        Ok(auth) => auth,
        Err(e) => return e.into_response(),
    };
    let ws = match ws {
        Ok(ws) => ws,
        Err(rejection) => return rejection.into_response(),
    };
    let ws = if via_protocol {
        ws.protocol("quire")
    } else {
        ws
    };
    let tracker = app.connections.clone();
    let conn = Box::new(Conn {
        name,
        auth: Box::new(auth),
        app: app.clone(),
    });
    ws.config(socket_config(&app.config.limits))
        .on_upgrade(move |socket| tracker.track_future(serve(socket, conn)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What an idle y-websocket connection's task holds besides the socket's own parts
    /// (docs/benchmarks.md, "Idle connections, round three"): a bound, so that growth shows.
    #[test]
    fn an_idle_connection_holds_little() {
        let connection = std::mem::size_of::<Connection>();
        let socket = std::mem::size_of::<Fragmenting<Socket>>();
        let pump = std::mem::size_of::<Pump>();
        assert!(
            connection - socket <= 184 && pump <= 128,
            "a connection is {connection} bytes, its socket {socket}, its pump {pump}"
        );
    }
}
