//! Relayed connections: a client connected to one node whose document another node owns.
//! Both ends live here, on top of the bus (`crate::bus`, which carries the signed, numbered
//! envelopes and knows nothing of rooms) and of the room's join (`crate::room::join`):
//!
//! - On the **relaying node**, [`relay_to_owner`] finds the owner by the document's lease,
//!   sends it the client's frames and writes the owner's back to the client; every
//!   [`ALIVE_EVERY`] it tells the owner the client is still there, checks the lease (the owner
//!   may have lost it: the client is closed with 1012 and reconnects to the new owner) and
//!   checks the client's token against revocations (a relayed connection is in no room here).
//! - On the **owner**, [`serve_remote`] joins the client to the room as a *remote peer*, like a
//!   WebSocket connection: sync replies, broadcasts, awareness and durable acknowledgements
//!   reach it the same way, and its frames pass the same decoding and rate limits.

use std::sync::Arc;

use bytes::Bytes;
use futures_util::{Sink, SinkExt, Stream, StreamExt};
use tokio::time::Instant;

use super::transport::{WsError, WsMessage};
use crate::app::AppState;
use crate::bus::owners::Watching;
use crate::bus::{
    lost_link, Bus, Credential, Envelope, NodeName, RemoteIn, RemoteOpen, ALIVE_EVERY,
};
use crate::close;
use crate::limits::PeerRates;
use crate::room::join::{join_room, next_peer_id, peer_bounds, to_peer_msgs};
use crate::room::queue::{self, Next};
use crate::room::{CloseReason, DocName, PeerAuth, PeerId, Registry};
use crate::storage::{DocId, LeaseGrant};

fn moved() -> CloseReason {
    CloseReason::new(close::RESTART, "document moved to another node, reconnect")
}

fn unavailable() -> CloseReason {
    CloseReason::new(close::INTERNAL, "document unavailable, retry")
}

/// The document's id and the node that holds its lease. `Err(moved)` if this node got the
/// lease meanwhile (the owner went away): the client's reconnect is served here.
async fn find_owner(app: &AppState, name: &DocName) -> Result<(DocId, String), CloseReason> {
    let Some(lease) = app.registry.config.lease.clone() else {
        return Err(unavailable());
    };
    let store = &app.registry.store;
    // The id alone: the owner has the document's content.
    let doc = match store.doc_id(name.as_str()).await {
        Ok(id) => id,
        Err(_) => return Err(unavailable()),
    };
    match store.acquire_lease(doc, &lease.node_id, lease.ttl).await {
        Ok(LeaseGrant::HeldBy { owner, .. }) => Ok((doc, owner)),
        Ok(LeaseGrant::Granted { .. }) => Err(moved()),
        Err(_) => Err(unavailable()),
    }
}

/// Relays a client of a document owned by another node (see the module's notes) until one
/// side closes. `None`: the client closed.
pub(crate) async fn relay_to_owner<S, R>(
    sink: &mut S,
    stream: &mut R,
    (name, peer, auth): (&DocName, PeerId, PeerAuth),
    reauth: Option<&mut Reauth>,
    app: &AppState,
    bus: &Arc<Bus>,
) -> Option<CloseReason>
where
    S: Sink<WsMessage> + Unpin,
    R: Stream<Item = Result<WsMessage, WsError>> + Unpin,
{
    let (doc, owner) = match find_owner(app, name).await {
        Ok(found) => found,
        Err(reason) => return Some(reason),
    };
    let conn = bus.conn_id(peer);
    let inbox = bus.register_relay(conn, peer_bounds(&app.registry), name.clone(), &auth);
    let link = Link {
        bus,
        owner,
        from: bus.node.clone(),
        conn,
        sent: 0,
    };
    let open = Envelope::Open {
        from: link.from.clone(),
        conn,
        doc: name.as_str().to_owned(),
        auth: Credential::from(&auth),
    };
    let watching = Watching::new(&app.relay_leases, doc, &link.owner);
    let (outcome, link) = if bus.send(&link.owner, open).await.is_err() {
        (Some(lost_link()), link)
    } else {
        pump(sink, stream, inbox, link, reauth, (doc, &auth, app)).await
    };
    drop(watching);
    bus.unregister_relay(conn);
    let close = Envelope::Close {
        from: link.from,
        conn,
    };
    let _ = bus.send(&link.owner, close).await;
    outcome
}

/// The relaying node's link to the owner for one connection.
struct Link<'a> {
    bus: &'a Bus,
    owner: String,
    /// This node's name, as every envelope of the connection carries it (shared: no
    /// allocation per frame).
    from: NodeName,
    conn: u64,
    /// The last `Frame` sequence number published (the owner applies them in order, and an
    /// `Alive` tells it how many to expect).
    sent: u64,
}

/// A client's refreshed credentials, as its connection learns them (a Hocuspocus token
/// refresh); the latest is what counts.
pub(crate) type Reauth = tokio::sync::watch::Receiver<PeerAuth>;

/// The next credential `reauth` brings; never, without one.
pub(crate) async fn next_auth(reauth: &mut Option<&mut Reauth>) -> PeerAuth {
    if let Some(rx) = reauth {
        if rx.changed().await.is_ok() {
            return rx.borrow_and_update().clone();
        }
    }
    std::future::pending().await
}

/// Moves frames both ways until one side closes; then gives the link back for the `Close`.
async fn pump<'a, S, R>(
    sink: &mut S,
    stream: &mut R,
    inbox: queue::QueueRx,
    mut link: Link<'a>,
    mut reauth: Option<&mut Reauth>,
    (doc, auth, app): (DocId, &PeerAuth, &AppState),
) -> (Option<CloseReason>, Link<'a>)
where
    S: Sink<WsMessage> + Unpin,
    R: Stream<Item = Result<WsMessage, WsError>> + Unpin,
{
    let mut tick = tokio::time::interval_at(Instant::now() + ALIVE_EVERY, ALIVE_EVERY);
    // The credential the revocation checks look at: the latest refresh's.
    let mut auth = auth.clone();
    let outcome = loop {
        tokio::select! {
            fresh = next_auth(&mut reauth) => {
                let reauth = Envelope::Reauth {
                    from: link.from.clone(),
                    conn: link.conn,
                    auth: Credential::from(&fresh),
                };
                auth = fresh;
                if link.bus.send(&link.owner, reauth).await.is_err() {
                    break Some(lost_link());
                }
            }
            frame = stream.next() => match frame {
                Some(Ok(WsMessage::Binary(data))) => {
                    link.sent += 1;
                    let (from, conn, seq) = (link.from.clone(), link.conn, link.sent);
                    let frame = Envelope::Frame { from, conn, seq, data };
                    if link.bus.send(&link.owner, frame).await.is_err() {
                        break Some(lost_link());
                    }
                }
                Some(Ok(WsMessage::Text(_))) => {
                    break Some(CloseReason::new(
                        close::UNSUPPORTED_DATA,
                        "text frames are not part of the protocol",
                    ))
                }
                Some(Ok(WsMessage::Ping(_) | WsMessage::Pong(_) | WsMessage::Frame(_))) => {}
                Some(Ok(WsMessage::Close(_))) | Some(Err(_)) | None => break None,
            },
            msg = inbox.recv() => match msg {
                Next::Frame(data) => {
                    // A client that stops reading blocks this write: the close order
                    // (1013 when the queue overflows, or the owner dropping the peer) and
                    // the checks each tick overtake it, as on a local connection, and the
                    // close frame then gets slow_close_timeout to leave (`transport::finish`).
                    let write = sink.send(WsMessage::Binary(data));
                    let mut write = std::pin::pin!(futures_util::FutureExt::map(write, |r| r.is_ok()));
                    let stuck = loop {
                        tokio::select! {
                            biased;
                            reason = inbox.killed() => break Some(Some(reason)),
                            sent = &mut write => break (!sent).then_some(None),
                            _ = tick.tick() => {
                                if let Some(reason) = still_relayed(&link, doc, &auth, app).await {
                                    break Some(Some(reason));
                                }
                            }
                        }
                    };
                    if let Some(outcome) = stuck {
                        break outcome;
                    }
                }
                Next::Kill(reason) => break Some(reason),
                Next::Ping => {}
                Next::Closed => break Some(moved()),
            },
            _ = tick.tick() => {
                if let Some(reason) = still_relayed(&link, doc, &auth, app).await {
                    break Some(reason);
                }
            }
        }
    };
    (outcome, link)
}

/// Every [`ALIVE_EVERY`]: the token is not revoked, the owner hears the client is alive, and
/// the owner still holds the lease (as [`crate::bus::owners::LeaseWatch`] last read it). `Some(reason)` to close the client.
async fn still_relayed(
    link: &Link<'_>,
    doc: DocId,
    auth: &PeerAuth,
    app: &AppState,
) -> Option<CloseReason> {
    // Revocations reach rooms, and a relayed connection is in none on this node: it checks
    // for itself.
    if let (Some(token_id), Some(user)) = (&auth.token_id, &auth.user) {
        if app.auth.is_revoked(token_id, user, auth.issued_at) {
            return Some(CloseReason::new(close::FORBIDDEN, "access revoked"));
        }
    }
    let alive = Envelope::Alive {
        from: link.from.clone(),
        conn: link.conn,
        sent: link.sent,
    };
    if link.bus.send(&link.owner, alive).await.is_err() {
        return Some(lost_link());
    }
    match app.relay_leases.owner(doc) {
        // Not read yet, or still the owner this connection relays to.
        None => None,
        Some(Some(owner)) if owner == link.owner => None,
        // Another node holds the lease now, or nobody does (the owner died or let go): the
        // client reconnects and is served by the new owner (or here).
        Some(_) => Some(moved()),
    }
}

/// Serves a client of another node with this node's room for its document, as if it were
/// local (see the module's notes), until either side closes.
pub async fn serve_remote(bus: Arc<Bus>, registry: Arc<Registry>, open: RemoteOpen) {
    let RemoteOpen {
        name,
        from,
        conn,
        auth,
        mut inbox,
    } = open;
    let peer: PeerId = next_peer_id();
    let kill = |reason: CloseReason| Envelope::Kill {
        conn,
        code: reason.code,
        reason: reason.reason.to_string(),
    };
    let hocuspocus = auth.hocuspocus;
    let (room, out_rx) = match join_room(&registry, &name, peer, auth).await {
        Ok(joined) => joined,
        Err(reason) => {
            bus.forget_remote(&from, conn);
            let _ = bus.send(&from, kill(reason)).await;
            return;
        }
    };
    let mut last_heard = Instant::now();
    let opened = Instant::now();
    let mut rates = PeerRates::new(bus.limits());
    // The last `Out` sequence number published to the relaying node.
    let mut sent = 0u64;
    let failed = || CloseReason::new(close::RESTART, "lost the link to the client's node");
    let reason = loop {
        tokio::select! {
            next = out_rx.recv() => match next {
                Next::Frame(frame) => {
                    sent += 1;
                    let out = Envelope::Out { conn, seq: sent, data: frame };
                    if bus.send(&from, out).await.is_err() {
                        break Some(failed());
                    }
                }
                Next::Ping => {
                    if last_heard.elapsed() > ALIVE_EVERY * 3 {
                        break None;
                    }
                }
                Next::Kill(reason) => break Some(reason),
                Next::Closed => break Some(queue::closed_reason()),
            },
            msg = inbox.recv() => match msg {
                Some(RemoteIn::Frame(data)) => {
                    last_heard = Instant::now();
                    let now_ms = u32::try_from(opened.elapsed().as_millis()).unwrap_or(u32::MAX);
                    let handed = hand_on(&data, (&room, peer), &mut rates, now_ms, &bus, &registry).await;
                    inbox.consumed(data.len());
                    if let Err(reason) = handed {
                        break Some(reason);
                    }
                }
                Some(RemoteIn::Overflow) => {
                    break Some(CloseReason::new(close::TRY_AGAIN_LATER, "inbound queue full; reconnect"));
                }
                Some(RemoteIn::Gap) => break Some(bus.lost()),
                Some(RemoteIn::Reauth(mut auth)) => {
                    auth.hocuspocus = hocuspocus;
                    let (reply, _) = tokio::sync::oneshot::channel();
                    let auth = Box::new(auth);
                    let reauth = crate::room::RoomCmd::Reauth { peer, auth, reply };
                    if room.command(reauth).await.is_err() {
                        break Some(queue::closed_reason());
                    }
                }
                Some(RemoteIn::Alive) => {
                    last_heard = Instant::now();
                    if bus.send(&from, Envelope::Beat { conn, sent }).await.is_err() {
                        break Some(failed());
                    }
                }
                Some(RemoteIn::Close) | None => break None,
            },
        }
    };
    room.leave(peer).await;
    bus.forget_remote(&from, conn);
    if let Some(reason) = reason {
        let _ = bus.send(&from, kill(reason)).await;
    }
}

/// A relayed client's frame: decoded and rate-limited as a local connection's, then handed to
/// the room. `Err`: close the client with this.
async fn hand_on(
    data: &Bytes,
    (room, peer): (&crate::room::RoomHandle, PeerId),
    rates: &mut PeerRates,
    now_ms: u32,
    bus: &Bus,
    registry: &Registry,
) -> Result<(), CloseReason> {
    let msgs = to_peer_msgs(data).map_err(|detail| CloseReason::new(close::MALFORMED, detail))?;
    rates
        .check(&msgs, now_ms, bus.limits())
        .inspect_err(|_| registry.metrics.rate_limited.inc())?;
    if msgs.is_empty() {
        return Ok(());
    }
    room.send(peer, msgs, data.len())
        .await
        .map_err(|_| queue::closed_reason())
}
