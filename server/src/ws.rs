//! One WebSocket connection: decode frames and hand them to the room; write what the room
//! queues; ping, and close when silent too long.
//!
//! Reading and writing run as two halves of one task. The writer owns the bounded outbound
//! queue the room fills; if the socket stops draining, the queue fills, and the room closes the
//! peer with 1013 instead of waiting for it.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::extract::ws::{CloseFrame, Message as WsMessage, WebSocket};
use bytes::Bytes;
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{FutureExt, SinkExt, StreamExt};
use prometheus::IntGauge;
use tokio::time::{Duration, Instant};
use tracing::{debug, info_span, Instrument};
use yrs::updates::decoder::Decode;
use yrs::Update;

use crate::bus::{Bus, Envelope, ALIVE_EVERY};
use crate::close;
use crate::limits::PeerRates;
use crate::protocol::{self, Message};
use crate::room::queue::{self, Bounds, Next, QueueRx};
use crate::room::{
    CloseReason, DocName, JoinError, PeerAuth, PeerLink, PeerMsg, Registry, RoomHandle,
};
use crate::storage::LeaseGrant;
use crate::AppState;

/// How long a close frame may take to leave before the socket is dropped.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);
/// The same for a peer closed because it stopped reading (1013): it may be slow rather than
/// gone, and should learn why it was closed once it reads again; the bound frees the task of
/// one that never does.
const BACKPRESSURE_CLOSE_TIMEOUT: Duration = Duration::from_secs(30);
/// Most queued frames written with one flush.
const MAX_FRAMES_PER_FLUSH: usize = 64;
/// Attempts at joining when the room was unloading at that very moment.
const JOIN_ATTEMPTS: usize = 8;

static NEXT_PEER: AtomicU64 = AtomicU64::new(1);

type Sink = SplitSink<WebSocket, WsMessage>;
type Stream = SplitStream<WebSocket>;

/// Serves one upgraded connection to document `name` until it closes.
///
/// The socket is split before the connection's future exists: it then lives once, in the
/// halves' shared cell, instead of being copied into every layer of the future (which is
/// most of an idle connection's memory). For the same reason the connection is one `async`
/// block and not one wrapped in another: an outer block keeps its own copy of everything it
/// hands the inner one (112 bytes per connection here, measured with `size_of_val`).
#[allow(clippy::boxed_local)] // deliberately boxed: see `Conn`
pub fn serve(socket: WebSocket, conn: Box<Conn>) -> impl Future<Output = ()> + Send {
    let Conn { name, auth, app } = *conn;
    let peer = next_peer_id();
    let user = auth.user.as_deref().unwrap_or("-").to_owned();
    let span = info_span!("conn", doc = %name, peer, user = %user);
    let (sink, stream) = socket.split();
    serve_inner(sink, stream, name, peer, auth, app)
        .map(|reason| debug!(code = reason.code, reason = %reason.reason, "closed"))
        .instrument(span)
}

/// What a connection needs besides its socket. Boxed while the upgrade completes: the
/// upgrade's task keeps what its callback captured for as long as the connection lives, and
/// a box it has handed on costs 8 bytes there instead of 144.
pub struct Conn {
    pub name: DocName,
    pub auth: PeerAuth,
    pub app: AppState,
}

/// Counts an open connection in the metrics for as long as it lives (a connection's future
/// dropped at shutdown included).
struct Counted(IntGauge);

impl Counted {
    fn new(gauge: &IntGauge) -> Counted {
        gauge.inc();
        Counted(gauge.clone())
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.dec();
    }
}

async fn join(
    registry: &Arc<Registry>,
    name: &DocName,
    peer: u64,
    auth: PeerAuth,
) -> Result<(RoomHandle, QueueRx), JoinError> {
    for _ in 0..JOIN_ATTEMPTS {
        let room = registry.get_or_start(name)?;
        let (tx, rx) = queue::queue(peer_bounds(registry));
        let link = PeerLink {
            id: peer,
            auth: auth.clone(),
            tx,
        };
        match room.join(link).await {
            Ok(()) => return Ok((room, rx)),
            Err(JoinError::Gone) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(JoinError::Gone)
}

/// The bounds of a peer's outbound queue (`peer_queue`, `peer_queue_bytes`).
pub(crate) fn peer_bounds(registry: &Registry) -> Bounds {
    Bounds {
        frames: registry.config.peer_queue,
        bytes: registry.config.peer_queue_bytes,
        gauge: registry.metrics.peer_queue_bytes.clone(),
    }
}

/// A fresh connection id, unique in this process.
pub(crate) fn next_peer_id() -> u64 {
    NEXT_PEER.fetch_add(1, Ordering::Relaxed)
}

/// Joins `name`'s room on this node as `peer` (for peers relayed from other nodes).
pub(crate) async fn join_room(
    registry: &Arc<Registry>,
    name: &DocName,
    peer: u64,
    auth: PeerAuth,
) -> Result<(RoomHandle, QueueRx), CloseReason> {
    Box::pin(join(registry, name, peer, auth))
        .await
        .map_err(join_close)
}

fn join_close(e: JoinError) -> CloseReason {
    match e {
        JoinError::LoadFailed => {
            CloseReason::new(close::INTERNAL, "document failed to load, retry later")
        }
        JoinError::Full => CloseReason::new(
            close::TRY_AGAIN_LATER,
            "too many connections to this document",
        ),
        JoinError::ShuttingDown => CloseReason::new(close::RESTART, "server restarting"),
        JoinError::Gone => CloseReason::new(close::TRY_AGAIN_LATER, "document busy, retry"),
        JoinError::Deleted => CloseReason::new(close::DELETED, "document deleted"),
        JoinError::Elsewhere => CloseReason::new(
            close::TRY_AGAIN_LATER,
            "document is served by another node, retry",
        ),
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
    auth: PeerAuth,
    app: AppState,
) -> impl Future<Output = CloseReason> + Send {
    async move {
        let _counted = Counted::new(&app.metrics.connections);
        let (name, app) = (&name, &app);
        // (`auth` stays where it is, in the future's arguments, for the relay and the revocation
        // check below: a copy taken here would stay in the future for the connection's life.)
        // Boxed: joining happens once, and its future is larger than the rest of the
        // connection's.
        let (room, out_rx) = match Box::pin(join(&app.registry, name, peer, auth.clone())).await {
            Ok(joined) => joined,
            Err(JoinError::Elsewhere) if app.bus.is_some() => {
                // Another node owns the document: relay this client to it through the bus.
                let outcome = match &app.bus {
                    Some(bus) => {
                        Box::pin(relay(&mut sink, &mut stream, name, peer, auth, app, bus)).await
                    }
                    None => None,
                };
                return Box::pin(finish(sink, stream, outcome)).await;
            }
            Err(e) => {
                let reason = join_close(e);
                Box::pin(send_close(&mut sink, &reason)).await;
                return reason;
            }
        };
        // A revocation applied between the token check and the join missed this peer in the room
        // (revocations update the in-memory set before they tell the rooms), so look again.
        if let (Some(token_id), Some(user)) = (&auth.token_id, &auth.user) {
            if app.auth.is_revoked(token_id, user, auth.issued_at) {
                Box::pin(room.leave(peer)).await;
                let reason = CloseReason::new(close::FORBIDDEN, "access revoked");
                Box::pin(send_close(&mut sink, &reason)).await;
                return reason;
            }
        }
        // Milliseconds since `opened` at which the last frame arrived (shared by both halves).
        let opened = Instant::now();
        let last_seen = AtomicU64::new(0);
        let mark_seen = || last_seen.store(opened.elapsed().as_millis() as u64, Ordering::Relaxed);

        let reader = async {
            let limits = &app.config.limits;
            let mut rates = PeerRates::new(limits);
            while let Some(frame) = stream.next().await {
                mark_seen();
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
                        let now_ms = opened.elapsed().as_millis() as u32;
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
                    Ok(WsMessage::Ping(_)) | Ok(WsMessage::Pong(_)) => {}
                    Ok(WsMessage::Close(_)) => return None,
                    Err(e) => {
                        let text = e.to_string();
                        if text.contains("Space limit exceeded")
                            || text.contains("too big")
                            || text.contains("too long")
                        {
                            return Some(CloseReason::new(
                                close::MESSAGE_TOO_BIG,
                                "message too big",
                            ));
                        }
                        debug!(error = %text, "read error");
                        return None;
                    }
                }
            }
            None
        };

        let writer = async {
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
                        let seen =
                            opened + Duration::from_millis(last_seen.load(Ordering::Relaxed));
                        if seen.elapsed() >= app.config.idle_timeout {
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
        };

        let outcome = tokio::select! {
            r = reader => r,
            w = writer => w,
        };
        // Boxed, like the other steps taken once: an idle connection's future has no room
        // for them.
        Box::pin(room.leave(peer)).await;
        Box::pin(finish(sink, stream, outcome)).await
    }
}

/// The close handshake: send ours, then read until the client's Close (or the timeout) so
/// the client sees our code instead of a reset connection. `None`: the client closed.
async fn finish(mut sink: Sink, mut stream: Stream, outcome: Option<CloseReason>) -> CloseReason {
    {
        match outcome {
            Some(reason) => {
                let frame = WsMessage::Close(Some(CloseFrame {
                    code: reason.code,
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

/// Relays a client of a document owned by another node: its frames go to the owner over the
/// bus, the owner's come back. Every `ALIVE_EVERY` the relay tells the owner the client is
/// still here and checks the document's lease: if the owner lost it (crash, hand-over), the
/// client is closed with 1012 and reconnects, to be served by the new owner.
async fn relay(
    sink: &mut Sink,
    stream: &mut Stream,
    name: &DocName,
    peer: u64,
    auth: PeerAuth,
    app: &AppState,
    bus: &Arc<Bus>,
) -> Option<CloseReason> {
    let moved = || CloseReason::new(close::RESTART, "document moved to another node, reconnect");
    let lease = app.registry.config.lease.clone()?;
    let doc = match app.registry.store.load(name.as_str()).await {
        Ok(stored) => stored.id,
        Err(_) => {
            return Some(CloseReason::new(
                close::INTERNAL,
                "document unavailable, retry",
            ))
        }
    };
    let owner = match app
        .registry
        .store
        .acquire_lease(doc, &lease.node_id, lease.ttl)
        .await
    {
        Ok(LeaseGrant::HeldBy { owner, .. }) => owner,
        // The owner went away meanwhile and this node holds the lease now: the client's
        // reconnect is served here.
        Ok(LeaseGrant::Granted { .. }) => return Some(moved()),
        Err(_) => {
            return Some(CloseReason::new(
                close::INTERNAL,
                "document unavailable, retry",
            ))
        }
    };
    let conn = bus.conn_id(peer);
    let inbox = bus.register_relay(conn, peer_bounds(&app.registry), name.clone(), &auth);
    let from = bus.node.to_string();
    let lost_link = || {
        CloseReason::new(
            close::RESTART,
            "lost the link to the document's node, reconnect",
        )
    };
    let open = Envelope::Open {
        from: from.clone(),
        conn,
        doc: name.as_str().to_owned(),
        user: auth.user.as_deref().map(str::to_owned),
        can_write: auth.can_write,
        expires_at: auth.expires_at,
        seen_change: auth.seen_change,
    };
    // The last `Frame` sequence number published (the owner applies them in order, and an
    // `Alive` tells it how many to expect).
    let mut sent = 0u64;
    let mut tick = tokio::time::interval_at(Instant::now() + ALIVE_EVERY, ALIVE_EVERY);
    let outcome = if bus.send(&owner, open).await.is_err() {
        Some(lost_link())
    } else {
        loop {
            tokio::select! {
                frame = stream.next() => match frame {
                    Some(Ok(WsMessage::Binary(data))) => {
                        sent += 1;
                        let frame = Envelope::Frame { from: from.clone(), conn, seq: sent, data };
                        if bus.send(&owner, frame).await.is_err() {
                            break Some(lost_link());
                        }
                    }
                    Some(Ok(WsMessage::Text(_))) => {
                        break Some(CloseReason::new(
                            close::UNSUPPORTED_DATA,
                            "text frames are not part of the protocol",
                        ))
                    }
                    Some(Ok(WsMessage::Ping(_))) | Some(Ok(WsMessage::Pong(_))) => {}
                    Some(Ok(WsMessage::Close(_))) | Some(Err(_)) | None => break None,
                },
                msg = inbox.recv() => match msg {
                    Next::Frame(data) => {
                        if sink.send(WsMessage::Binary(data)).await.is_err() {
                            break None;
                        }
                    }
                    Next::Kill(reason) => break Some(reason),
                    Next::Ping => {}
                    Next::Closed => break Some(moved()),
                },
                _ = tick.tick() => {
                    // Revocations reach rooms, and a relayed connection is in none on this
                    // node: it checks for itself.
                    if let (Some(token_id), Some(user)) = (&auth.token_id, &auth.user) {
                        if app.auth.is_revoked(token_id, user, auth.issued_at) {
                            break Some(CloseReason::new(close::FORBIDDEN, "access revoked"));
                        }
                    }
                    let alive = Envelope::Alive { from: from.clone(), conn, sent };
                    if bus.send(&owner, alive).await.is_err() {
                        break Some(lost_link());
                    }
                    match app.registry.store.acquire_lease(doc, &lease.node_id, lease.ttl).await {
                        Ok(LeaseGrant::HeldBy { owner: now, .. }) if now == owner => {}
                        Ok(_) => break Some(moved()),
                        Err(e) => debug!(error = %e, "lease check failed; still relaying"),
                    }
                }
            }
        }
    };
    bus.unregister_relay(conn);
    let _ = bus.send(&owner, Envelope::Close { from, conn }).await;
    outcome
}

async fn send_close(sink: &mut Sink, reason: &CloseReason) {
    let frame = WsMessage::Close(Some(CloseFrame {
        code: reason.code,
        reason: reason.reason.to_string().into(),
    }));
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, sink.send(frame)).await;
}

/// Close reasons must fit a control frame (123 bytes).
fn truncate(mut s: String) -> String {
    if s.len() > 120 {
        let mut cut = 120;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}

/// Most messages one frame may carry (y-websocket clients send one or two; the WASM client at
/// most three: an update, an awareness state and an acknowledgement request). More closes
/// the connection with 1007.
pub const MAX_MESSAGES_PER_FRAME: usize = 64;

/// Decodes a frame into what the room consumes; updates are decoded here (off the room task)
/// so a malformed one is refused before it reaches the document.
///
/// `Err` carries the close reason's text: the connection closes with 1007
/// ([`crate::close::MALFORMED`]). Auth messages, messages of unknown types and empty updates
/// are dropped, so the result may be empty. Public for the fuzz targets (`fuzz/`).
///
/// The payloads kept (an update, an awareness message, an acknowledgement request) are
/// slices of the frame. A slice keeps the whole frame alive, so one that is less than half of
/// it is copied out: queues and the log count a payload's length, and a small message padded
/// with a large unknown one must not hold the padding in memory behind that count.
pub fn to_peer_msgs(frame: &Bytes) -> Result<Vec<PeerMsg>, String> {
    let msgs =
        protocol::decode_frame_max(frame, MAX_MESSAGES_PER_FRAME).map_err(|e| e.to_string())?;
    let own = |raw: Bytes| {
        if raw.len() * 2 < frame.len() {
            Bytes::copy_from_slice(&raw)
        } else {
            raw
        }
    };
    let mut out = Vec::with_capacity(msgs.len());
    for msg in msgs {
        match msg {
            Message::SyncStep1(sv) => out.push(PeerMsg::Step1(sv)),
            // An empty update (no structs, empty delete set) is what a client in sync sends as
            // its Step2; it changes nothing, so it never reaches the room.
            Message::SyncStep2(raw) | Message::Update(raw) if raw.as_ref() == [0, 0] => {}
            Message::SyncStep2(raw) | Message::Update(raw) => {
                crate::counts::check_update(&raw).map_err(|e| format!("invalid update: {e}"))?;
                let update = Update::decode_v1(&raw).map_err(|e| format!("invalid update: {e}"))?;
                out.push(PeerMsg::Update {
                    raw: own(raw),
                    update,
                });
            }
            Message::Awareness { update, raw } => {
                // Other clients parse every state as JSON (y-protocols calls JSON.parse): a
                // state that is not JSON would break their awareness handling, so it is
                // refused here instead of relayed.
                for (client, entry) in &update.clients {
                    if serde_json::from_str::<serde::de::IgnoredAny>(&entry.json).is_err() {
                        return Err(format!("awareness state of client {client} is not JSON"));
                    }
                }
                out.push(PeerMsg::Awareness {
                    update,
                    raw: own(raw),
                })
            }
            Message::QueryAwareness => out.push(PeerMsg::QueryAwareness),
            Message::DurableAck { raw } => out.push(PeerMsg::DurableAck(own(raw))),
            Message::Auth(_) => debug!("ignoring an auth message from a client"),
            Message::Unknown { tag } => debug!(tag, "ignoring a message of unknown type"),
        }
    }
    Ok(out)
}
