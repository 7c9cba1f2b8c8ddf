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

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::ws::{WsError, WsMessage};
use bytes::Bytes;
use futures_util::{Sink, SinkExt, Stream, StreamExt};
use tokio::time::Instant;
use tracing::debug;

use crate::bus::{Bus, Envelope, RemoteIn, RemoteOpen, ALIVE_EVERY};
use crate::close;
use crate::limits::PeerRates;
use crate::room::join::{join_room, next_peer_id, peer_bounds, to_peer_msgs};
use crate::room::queue::{self, Next};
use crate::room::{CloseReason, DocName, PeerAuth, PeerId, Registry};
use crate::storage::{DocId, LeaseGrant};
use crate::AppState;

/// The owners of the documents this node relays connections to, read for all of them with
/// one statement every [`ALIVE_EVERY`] (not one per relayed connection), so a thousand
/// relayed connections cost this node one lease statement a second.
#[derive(Default)]
pub struct LeaseWatch {
    docs: Mutex<HashMap<DocId, Watched>>,
}

/// One watched document.
#[derive(Default)]
struct Watched {
    /// Relayed connections watching it.
    count: usize,
    /// Its owner as last read: `None` until read (again), `Some(None)`: no unexpired lease.
    owner: Option<Option<String>>,
    /// Bumped when a new connection found another owner than the one last read: a read
    /// begun before that is not taken.
    resets: u64,
}

impl LeaseWatch {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<DocId, Watched>> {
        self.docs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One more relayed connection to `doc`, whose owner it found to be `owner`. An owner
    /// read before that (for the other connections) may be out of date: it is read again
    /// before this connection is judged by it.
    fn watch(&self, doc: DocId, owner: &str) {
        let mut docs = self.lock();
        let entry = docs.entry(doc).or_default();
        entry.count += 1;
        if entry
            .owner
            .as_ref()
            .is_some_and(|read| read.as_deref() != Some(owner))
        {
            entry.owner = None;
            entry.resets += 1;
        }
    }

    fn unwatch(&self, doc: DocId) {
        let mut docs = self.lock();
        if let Some(entry) = docs.get_mut(&doc) {
            entry.count -= 1;
            if entry.count == 0 {
                docs.remove(&doc);
            }
        }
    }

    /// The document's owner as last read (`None`: not read yet).
    fn owner(&self, doc: DocId) -> Option<Option<String>> {
        self.lock().get(&doc).and_then(|entry| entry.owner.clone())
    }

    /// The documents to read the owners of, each with its reset count as the read begins.
    fn begin_read(&self) -> HashMap<DocId, u64> {
        self.lock()
            .iter()
            .map(|(doc, entry)| (*doc, entry.resets))
            .collect()
    }

    /// Takes what a read begun with `asked` found: for each document still watched and not
    /// reset since, its owner (`owners` lists the unexpired leases).
    fn finish_read(&self, asked: &HashMap<DocId, u64>, owners: &HashMap<DocId, String>) {
        for (doc, entry) in self.lock().iter_mut() {
            if asked.get(doc) == Some(&entry.resets) {
                entry.owner = Some(owners.get(doc).cloned());
            }
        }
    }

    /// Reads the owners of every watched document every [`ALIVE_EVERY`] until `shutdown`.
    pub async fn run(
        self: Arc<Self>,
        store: Arc<dyn crate::storage::DocStore>,
        metrics: Arc<crate::metrics::Metrics>,
        shutdown: tokio_util::sync::CancellationToken,
    ) {
        let mut tick = tokio::time::interval(ALIVE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.cancelled() => return,
            }
            let asked = self.begin_read();
            if asked.is_empty() {
                continue;
            }
            let docs: Vec<DocId> = asked.keys().copied().collect();
            metrics.relay_lease_checks.inc();
            match store.lease_owners(&docs).await {
                Ok(owners) => self.finish_read(&asked, &owners.into_iter().collect()),
                Err(e) => debug!(error = %e, "lease check failed; still relaying"),
            }
        }
    }
}

/// A relayed connection's interest in its document's owner, dropped with the connection
/// (its future included, at shutdown).
struct Watching<'a> {
    leases: &'a LeaseWatch,
    doc: DocId,
}

impl<'a> Watching<'a> {
    fn new(leases: &'a LeaseWatch, doc: DocId, owner: &str) -> Watching<'a> {
        leases.watch(doc, owner);
        Watching { leases, doc }
    }
}

impl Drop for Watching<'_> {
    fn drop(&mut self) {
        self.leases.unwatch(self.doc);
    }
}

fn moved() -> CloseReason {
    CloseReason::new(close::RESTART, "document moved to another node, reconnect")
}

fn unavailable() -> CloseReason {
    CloseReason::new(close::INTERNAL, "document unavailable, retry")
}

fn lost_link() -> CloseReason {
    CloseReason::new(
        close::RESTART,
        "lost the link to the document's node, reconnect",
    )
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
        from: bus.node.to_string(),
        conn,
        sent: 0,
    };
    let open = Envelope::Open {
        from: link.from.clone(),
        conn,
        doc: name.as_str().to_owned(),
        user: auth.user.as_deref().map(str::to_owned),
        can_write: auth.can_write,
        expires_at: auth.expires_at,
        seen_change: auth.seen_change,
        hocuspocus: auth.hocuspocus,
        profile: auth
            .profile
            .as_ref()
            .map(|(name, color)| (name.to_string(), color.to_string())),
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
    from: String,
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
                    user: fresh.user.as_deref().map(str::to_owned),
                    can_write: fresh.can_write,
                    expires_at: fresh.expires_at,
                    seen_change: fresh.seen_change,
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
                    // close frame then gets slow_close_timeout to leave (`ws::finish`).
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
/// the owner still holds the lease (as [`LeaseWatch`] last read it). `Some(reason)` to close the client.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_begun_before_a_connection_found_a_new_owner_is_not_taken() {
        let watch = LeaseWatch::default();
        let owners = |o: &str| HashMap::from([(7, o.to_owned())]);
        watch.watch(7, "a");
        let asked = watch.begin_read();
        watch.finish_read(&asked, &owners("a"));
        assert_eq!(watch.owner(7), Some(Some("a".into())));
        // A read begins; meanwhile the lease moved and a new connection found owner b.
        let asked = watch.begin_read();
        watch.watch(7, "b");
        assert_eq!(watch.owner(7), None, "unknown until read again");
        watch.finish_read(&asked, &owners("a"));
        assert_eq!(watch.owner(7), None, "the older read is not taken");
        let asked = watch.begin_read();
        watch.finish_read(&asked, &owners("b"));
        assert_eq!(watch.owner(7), Some(Some("b".into())));
        // No lease at all: known to be nobody's.
        let asked = watch.begin_read();
        watch.finish_read(&asked, &HashMap::new());
        assert_eq!(watch.owner(7), Some(None));
        watch.unwatch(7);
        watch.unwatch(7);
        assert!(
            watch.begin_read().is_empty(),
            "forgotten with its last connection"
        );
    }
}
