//! The Hocuspocus endpoint, `ws://HOST:PORT/hocuspocus`: the protocol of
//! `@hocuspocus/provider` (Tiptap's collaboration stack), served by the same rooms as the
//! y-websocket endpoint. docs/protocol.md describes it; docs/hocuspocus-wire.md has the
//! protocol as the npm packages speak it.
//!
//! One socket carries many documents. Every frame starts with the document's address (its
//! name, or `name\0session` from a 4.x provider with session awareness), and each document
//! opens with an `Auth` message carrying a token. Here:
//!
//! - **A socket** ([`Conn`]) reads frames and routes them by address. Frames of an address
//!   not yet authenticated are held, within bounds (frames, bytes, documents, time); crossing
//!   one closes the socket with 1008. An `Auth` is checked like a y-websocket connection's
//!   token and the document's permission, and answered `Authenticated` (`read-write` or
//!   `readonly`) or `PermissionDenied`.
//! - **Each authenticated document** is a session ([`session`]): one peer of the document's
//!   room, as a y-websocket connection is. Its task joins the room; joined on this node, it
//!   hands the room to the socket, which then gives the room the document's frames itself,
//!   and the socket's writer ([`writer`]) reads the room's queue for it, turning its frames
//!   into Hocuspocus frames: one hop each way, as on the y-websocket endpoint. A document
//!   another node owns stays with its task, relayed there. The room never knows the
//!   difference but for [`PeerAuth::hocuspocus`]: such a peer gets a Sync Step 1 in answer to
//!   its own, its awareness echoed back (the provider's liveness timer needs traffic), and
//!   stateless messages.
//! - **SyncStatus means committed.** After every update or Sync Step 2 a document's client
//!   sends, the socket asks the room for a durable acknowledgement (the y-websocket endpoint's
//!   tag 102, in the same frame as the update), which the room echoes once everything before
//!   it is in the log; the writer turns each echo into that many `SyncStatus(true)`. So the
//!   provider's `hasUnsyncedChanges` clears only when its changes are durable. A read-only
//!   client's update gets `SyncStatus(false)`, as Hocuspocus answers.
//! - **Closing.** What concerns one document (an expired or revoked token, a deleted
//!   document, its size limit, the client's own `Close`) closes that document with a `Close`
//!   message; the socket and the other documents stay. What concerns the connection (a
//!   malformed frame, a rate limit, a full outbound queue, a restart) closes the socket with
//!   the y-websocket endpoint's close code, and the provider reconnects every document.

use std::future::{poll_fn, Future};
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::extract::{ConnectInfo, State};
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use tokio::sync::mpsc;
use tokio::time::{Instant, Sleep};
use tracing::{debug, info_span, warn, Instrument};

use super::admit::{admit_address, socket_permission};
use super::transport::{self, socket_config, Counted, Duplex, Fragmenting, LastSeen, WsMessage};
use super::upgrade::{Socket, UpgradeRejection, WsUpgrade};
use crate::app::AppState;
use crate::auth::Principal;
use crate::auth::VerifyError;
use crate::close;
use crate::limits::{Bucket, PeerRates};
use crate::protocol::hocuspocus::{self as hp, types};
use crate::protocol::{self};
use crate::room::join::next_peer_id;
use crate::room::{CloseReason, DocName, PeerAuth};

mod bell;
mod docs;
mod handover;
mod session;
mod writer;

use bell::{BellRx, BellTx, Doorbell};
use docs::{DocState, Docs, HoldBounds};
use handover::{Ended, Event, Handover};
use session::{Local, Route, Session, SessionTask, Undelivered};
use writer::{Direct, Out, Writer, WriterCmd};

/// Frames one document's session task may have waiting while it joins the room (or, relayed,
/// for the owner) before the socket stops reading (backpressure on this client only).
const SESSION_INBOX: usize = 16;

/// `GET /hocuspocus` with a WebSocket upgrade. Credentials come later, one per document in
/// its `Auth` message; the per-address connection limit applies here as on `/{document}`.
pub async fn socket(
    State(app): State<AppState>,
    connect_info: Option<axum::Extension<ConnectInfo<std::net::SocketAddr>>>,
    ws: Result<WsUpgrade, UpgradeRejection>,
) -> Response {
    let ip = connect_info.map(|c| c.0 .0.ip());
    if let Err(refused) = admit_address(&app, ip) {
        return *refused;
    }
    let ws = match ws {
        Ok(ws) => ws,
        Err(rejection) => return rejection.into_response(),
    };
    let tracker = app.connections.clone();
    ws.config(socket_config(&app.config.limits))
        .on_upgrade(move |socket| tracker.track_future(serve(socket, ip, app)))
}

async fn serve(socket: Socket, ip: Option<IpAddr>, app: AppState) {
    let span = info_span!("hocuspocus", addr = ?ip);
    async move {
        let _counted = Counted::new(&app.metrics.hocuspocus_sockets);
        let mut socket = Fragmenting::new(socket);
        let limits = &app.config.limits;
        let room = &app.config.room;
        let bell = Arc::new(Doorbell::default());
        let (out, out_rx) = Out::new(room.peer_queue, room.peer_queue_bytes, &bell);
        let (events_tx, events_rx) = bell::unbounded(&bell, bell::EVENTS);
        let (writer_tx, writer_rx) = bell::unbounded(&bell, bell::CMDS);
        let mut writer = Writer::new(
            (out_rx, &bell),
            writer_rx,
            events_tx.clone(),
            app.metrics.clone(),
            (room.ping_interval, app.config.idle_timeout),
        );
        let seen = LastSeen::new();
        let mut conn = Conn {
            app: app.clone(),
            ip,
            docs: Docs::new(HoldBounds {
                documents: limits.hocuspocus_max_documents,
                frames: limits.hocuspocus_pending_frames,
                bytes: limits.hocuspocus_pending_bytes,
            }),
            out,
            events_tx,
            events_rx,
            writer: writer_tx,
            seen: &seen,
            opened: Instant::now(),
            authenticated: false,
            rates: PeerRates::new(limits),
            stateless: Bucket::full(limits.stateless_per_second.saturating_mul(2)),
            late: None,
            next_gen: 0,
        };
        let outcome = conn.run(&mut socket, &mut writer).await;
        // Every document leaves its room (and the joins not taken over yet, queued as events,
        // leave theirs).
        drop(conn);
        drop(writer);
        let reason = transport::finish(socket, outcome, app.config.slow_close_timeout).await;
        debug!(code = reason.code, reason = %reason.reason, "closed");
    }
    .instrument(span)
    .await
}

/// Why an `Auth` was not accepted.
enum Refusal {
    /// Answer `PermissionDenied` with this reason.
    Deny(String),
    /// Close the socket (storage is failing: the provider reconnects and tries again).
    Close(CloseReason),
}

struct Conn<'a> {
    app: AppState,
    ip: Option<IpAddr>,
    docs: Docs,
    out: Out,
    /// What the sessions and the writer tell the socket.
    events_tx: BellTx<Event>,
    events_rx: BellRx<Event>,
    writer: BellTx<WriterCmd>,
    seen: &'a LastSeen,
    opened: Instant,
    /// Whether a document has been authenticated on this socket: until one is, the socket
    /// lives at most `hocuspocus_auth_timeout` from its opening, whatever it sends (pings and
    /// frames held for documents count for nothing).
    authenticated: bool,
    /// Sync requests and awareness updates, counted across all the socket's documents.
    rates: PeerRates,
    stateless: Bucket,
    /// The timer of [`Conn::held_deadline`], with the deadline it is set for.
    late: Option<(Instant, Pin<Box<Sleep>>)>,
    next_gen: u64,
}

/// What the socket's task woke up for, besides writing.
enum Input {
    Frame(Option<Result<WsMessage, transport::WsError>>),
    Event(Event),
    /// A held frame (or, before any document is authenticated, the socket) waited too long.
    Late,
    /// The write side ended the socket.
    End(Option<CloseReason>),
}

impl Conn<'_> {
    /// Serves the socket until it ends: `None` when the client closed or the socket failed,
    /// else the reason to close it with.
    ///
    /// Both directions of the unsplit socket are polled by this one future, as a y-websocket
    /// connection's are ([`crate::socket::ws`]): no lock between two halves, no `select!`
    /// of two loops each polled on every wake-up. Waiting for input, reading and writing take
    /// turns at going first. A frame's handling is async only for its rare steps (an `Auth` checked against
    /// storage, a stateless message recorded, a room's inbox full): while one waits, the
    /// writer is still driven, so a document's frames keep leaving and a room's close order
    /// still overtakes a write stuck on a client that does not read.
    async fn run<T: Duplex>(&mut self, conn: &mut T, writer: &mut Writer) -> Option<CloseReason> {
        let seen = self.seen;
        let mut read_first = false;
        loop {
            self.arm_deadline();
            let input = poll_fn(|cx| {
                read_first = !read_first;
                if !read_first {
                    if let Poll::Ready(end) = writer.poll_write(conn, seen, cx) {
                        return Poll::Ready(Input::End(end));
                    }
                }
                if let Poll::Ready(input) = self.poll_input(conn, cx) {
                    return Poll::Ready(input);
                }
                if read_first {
                    if let Poll::Ready(end) = writer.poll_write(conn, seen, cx) {
                        return Poll::Ready(Input::End(end));
                    }
                }
                Poll::Pending
            })
            .await;
            let step = match input {
                Input::End(end) => return end,
                Input::Frame(frame) => {
                    seen.mark();
                    match frame {
                        Some(Ok(WsMessage::Binary(data))) => {
                            drive(self.on_frame(data), conn, writer, seen).await
                        }
                        Some(Ok(WsMessage::Text(_))) => Err(Some(CloseReason::new(
                            close::UNSUPPORTED_DATA,
                            "text frames are not part of the protocol",
                        ))),
                        // (Reads never yield raw frames.)
                        Some(Ok(WsMessage::Ping(_) | WsMessage::Pong(_) | WsMessage::Frame(_))) => {
                            Ok(())
                        }
                        Some(Ok(WsMessage::Close(_))) | None => return None,
                        Some(Err(e)) if transport::is_too_big(&e) => Err(Some(CloseReason::new(
                            close::MESSAGE_TOO_BIG,
                            "message too big",
                        ))),
                        Some(Err(e)) => {
                            debug!(error = %e, "read error");
                            return None;
                        }
                    }
                }
                Input::Event(Event::Ended(ended)) => {
                    drive(self.on_ended(ended), conn, writer, seen).await
                }
                Input::Event(Event::Joined(handover)) => {
                    drive(self.take_over(*handover), conn, writer, seen).await
                }
                Input::Late => {
                    self.app.metrics.hocuspocus_pending_overflows.inc();
                    Err(Some(CloseReason::new(
                        close::POLICY,
                        if self.authenticated {
                            "a document was not authenticated in time"
                        } else {
                            "no document was authenticated in time"
                        },
                    )))
                }
            };
            if let Err(outcome) = step {
                return outcome;
            }
        }
    }

    /// The reader's side of one poll: what the sessions and the writer report, the held
    /// frames' deadline, then the client's next frame.
    fn poll_input<T: Duplex>(&mut self, conn: &mut T, cx: &mut Context<'_>) -> Poll<Input> {
        if let Poll::Ready(Some(event)) = self.events_rx.poll_recv(cx) {
            return Poll::Ready(Input::Event(event));
        }
        if let Some((_, late)) = &mut self.late {
            if late.as_mut().poll(cx).is_ready() {
                self.late = None;
                return Poll::Ready(Input::Late);
            }
        }
        Pin::new(conn).poll_next(cx).map(Input::Frame)
    }

    /// Sets the timer of [`Conn::held_deadline`] (kept while the deadline stays the same).
    fn arm_deadline(&mut self) {
        match (self.held_deadline(), &mut self.late) {
            (None, late) => *late = None,
            (Some(at), Some((armed, _))) if *armed == at => {}
            (Some(at), late) => *late = Some((at, Box::pin(tokio::time::sleep_until(at)))),
        }
    }

    /// When the oldest held frames have waited `hocuspocus_auth_timeout`, or, before any
    /// document is authenticated, when the socket has been open that long.
    fn held_deadline(&self) -> Option<Instant> {
        let timeout = self.app.config.limits.hocuspocus_auth_timeout;
        let unauthenticated = (!self.authenticated).then_some(self.opened + timeout);
        self.docs
            .held_deadline(timeout)
            .into_iter()
            .chain(unauthenticated)
            .min()
    }

    /// Queues one of the socket's own answers (Pong, Authenticated, PermissionDenied,
    /// Close) without waiting: the read loop must not stop on a client that does not read, so
    /// a full outbound queue closes the socket with 1013, as it closes a y-websocket one.
    async fn send(&self, frame: Bytes) -> Result<(), CloseReason> {
        if self.out.try_send(frame) {
            Ok(())
        } else {
            self.app.metrics.broadcast_overflows.inc();
            Err(CloseReason::new(
                close::TRY_AGAIN_LATER,
                "outbound queue full; reconnect",
            ))
        }
    }

    fn malformed(&self, detail: String) -> CloseReason {
        self.app.metrics.malformed_messages.inc();
        debug!(%detail, "malformed message");
        CloseReason::new(close::MALFORMED, transport::truncate(detail))
    }

    fn now_ms(&self) -> u32 {
        u32::try_from(self.opened.elapsed().as_millis()).unwrap_or(u32::MAX)
    }

    async fn on_frame(&mut self, data: Bytes) -> Result<(), CloseReason> {
        let head = match hp::head(&data) {
            Ok(Some(head)) => head,
            Ok(None) => {
                if data.as_ref() == [types::PING] {
                    self.send(Bytes::from_static(&[types::PONG])).await?;
                }
                return Ok(());
            }
            Err(e) => return Err(self.malformed(e.to_string())),
        };
        match self.docs.get(head.address) {
            Some(DocState::Open(_)) => self.on_open_frame(head, &data).await,
            _ if head.kind == types::AUTH => match hp::decode(&data) {
                Ok(hp::Frame::Addressed(hp::Addressed {
                    message: hp::HpMessage::Token { token, .. },
                    address,
                })) => self.authenticate(address, &token).await,
                // Other Auth subtypes are the server's to send.
                Ok(_) => Ok(()),
                Err(e) => Err(self.malformed(e.to_string())),
            },
            Some(DocState::Closed) => Ok(()),
            _ if head.kind == types::CLOSE => {
                // The provider gave up on a document still waiting for its Auth.
                self.docs.remove(head.address);
                Ok(())
            }
            _ => {
                let address = head.address.to_owned();
                self.docs
                    .hold(&address, data, Instant::now())
                    .map_err(|why| {
                        self.app.metrics.hocuspocus_pending_overflows.inc();
                        CloseReason::new(close::POLICY, why)
                    })
            }
        }
    }

    /// The credential and permission for a document, as the y-websocket endpoint checks them.
    async fn check(&self, name: &DocName, token: &str) -> Result<PeerAuth, Refusal> {
        let principal = if self.app.auth.is_open() {
            Principal::open(self.ip)
        } else {
            match self.app.verify(self.ip, Some(token)) {
                Ok(p) => p,
                Err(VerifyError::Limited(_)) => {
                    return Err(Refusal::Deny(
                        "too many failed authentications from this address; retry later".into(),
                    ))
                }
                Err(VerifyError::Invalid(e)) => return Err(Refusal::Deny(e.to_string())),
            }
        };
        match socket_permission(&self.app, &principal, name).await {
            Ok(mut auth) => {
                auth.hocuspocus = true;
                Ok(auth)
            }
            Err(e) if e.status.is_server_error() => Err(Refusal::Close(CloseReason::new(
                close::INTERNAL,
                "document unavailable, retry",
            ))),
            Err(e) => Err(Refusal::Deny(e.detail)),
        }
    }

    /// An address's first `Auth`: answered, and on success its session starts and the frames
    /// held for it are handled in order.
    async fn authenticate(&mut self, address: String, token: &str) -> Result<(), CloseReason> {
        let held = match self.docs.remove(&address) {
            Some(DocState::Held { frames, .. }) => frames,
            _ => Vec::new(),
        };
        let name = match DocName::parse(hp::doc_name(&address)) {
            Ok(name) => name,
            Err(e) => return self.deny(&address, &e.to_string()).await,
        };
        if !self.docs.has_room() {
            return self.deny(&address, docs::TOO_MANY_DOCUMENTS).await;
        }
        let auth = match self.check(&name, token).await {
            Ok(auth) => auth,
            Err(Refusal::Deny(reason)) => return self.deny(&address, &reason).await,
            Err(Refusal::Close(reason)) => return Err(reason),
        };
        let scope = if auth.can_write {
            "read-write"
        } else {
            "readonly"
        };
        self.send(hp::encode_authenticated(&address, scope)).await?;
        self.start(address.clone(), name, auth);
        for frame in held {
            Box::pin(self.on_frame(frame)).await?;
        }
        Ok(())
    }

    /// Refuses a document with `PermissionDenied`. Nothing of the address is kept: another
    /// `Auth` is a fresh attempt.
    async fn deny(&mut self, address: &str, reason: &str) -> Result<(), CloseReason> {
        self.app.metrics.hocuspocus_auth_failures.inc();
        debug!(%address, %reason, "document refused");
        self.docs.tombstone(address);
        self.send(hp::encode_permission_denied(address, reason))
            .await
    }

    /// Starts a session for `address`: its task, one peer of the document's room.
    fn start(&mut self, address: String, name: DocName, auth: PeerAuth) {
        let (tx, rx) = mpsc::channel(SESSION_INBOX);
        let (auth_tx, auth_rx) = tokio::sync::watch::channel(auth.clone());
        self.next_gen += 1;
        let session = Session {
            name: name.clone(),
            generation: self.next_gen,
            auth: auth_tx,
            refreshed: false,
            updates: 0,
            acks: Default::default(),
            route: Route::Task(tx),
            _counted: Counted::new(&self.app.metrics.hocuspocus_documents),
        };
        let task = SessionTask {
            address: address.clone(),
            name,
            peer: next_peer_id(),
            auth,
            generation: session.generation,
            acks: session.acks.clone(),
            app: self.app.clone(),
            out: self.out.clone(),
            events: self.events_tx.clone(),
        };
        self.app.connections.spawn(task.run(rx, auth_rx));
        self.docs.open(address, session);
        self.authenticated = true;
    }

    /// A frame for an authenticated document.
    async fn on_open_frame(&mut self, head: hp::Head<'_>, data: &Bytes) -> Result<(), CloseReason> {
        let now_ms = self.now_ms();
        let limits = &self.app.config.limits;
        let metrics = &self.app.metrics;
        let Some(DocState::Open(session)) = self.docs.get_mut(head.address) else {
            return Ok(());
        };
        let message = || data.slice(head.message_at..);
        // SyncReply is Sync with another type: the same y-websocket message once retyped.
        let retyped = || {
            let mut buf = BytesMut::with_capacity(data.len());
            protocol::put_var(&mut buf, 0);
            buf.extend_from_slice(&data[head.message_at + 1..]);
            buf.freeze()
        };
        // Exactly one message after the address: the bytes go to the room as they are, and
        // anything appended (a durable-ack request of the client's own, say) must not.
        let checked = match head.kind {
            types::SYNC_REPLY => Some(retyped()),
            types::SYNC | types::AWARENESS | types::QUERY_AWARENESS => Some(message()),
            _ => None,
        };
        if let Some(one) = &checked {
            if !protocol::split_frame(one).is_ok_and(|m| m.len() == 1) {
                return Err(self.malformed("not one message after the address".into()));
            }
        }
        match head.kind {
            types::SYNC | types::SYNC_REPLY => {
                if head.subtype == Some(0) {
                    self.rates
                        .check_counts(1, 0, now_ms, limits)
                        .inspect_err(|_| metrics.rate_limited.inc())?;
                }
                let one = checked.unwrap_or_else(message);
                let mut ack = None;
                if matches!(head.subtype, Some(1) | Some(2)) {
                    session.updates += 1;
                    let n = session.updates;
                    session.acks.requested.store(n, Ordering::Relaxed);
                    ack = Some(n);
                }
                let sent = session.forward(one, ack).await;
                return sent.map_err(|e| self.undelivered(e));
            }
            types::AWARENESS => {
                self.rates
                    .check_counts(0, 1, now_ms, limits)
                    .inspect_err(|_| metrics.rate_limited.inc())?;
                let sent = session.forward(message(), None).await;
                return sent.map_err(|e| self.undelivered(e));
            }
            types::QUERY_AWARENESS => {
                self.rates
                    .check_counts(1, 0, now_ms, limits)
                    .inspect_err(|_| metrics.rate_limited.inc())?;
                let sent = session.forward(message(), None).await;
                return sent.map_err(|e| self.undelivered(e));
            }
            types::AUTH => match hp::decode(data) {
                Ok(hp::Frame::Addressed(hp::Addressed {
                    message: hp::HpMessage::Token { token, .. },
                    ..
                })) => return self.refresh(head.address, &token).await,
                Ok(_) => {}
                Err(e) => return Err(self.malformed(e.to_string())),
            },
            types::STATELESS => {
                let payload = match hp::decode(data) {
                    Ok(hp::Frame::Addressed(hp::Addressed {
                        message: hp::HpMessage::Stateless(payload),
                        ..
                    })) => payload,
                    Ok(_) => return Ok(()),
                    Err(e) => return Err(self.malformed(e.to_string())),
                };
                let (name, user, can_write) = {
                    let auth = session.auth.borrow();
                    (session.name.clone(), auth.user.clone(), auth.can_write)
                };
                // Each one is an outbox row (a webhook event): a write, so read-only sessions
                // may not send them.
                if !can_write {
                    self.app.metrics.stateless_refused.inc();
                    debug!(doc = %name, "stateless message from a read-only session dropped");
                    return Ok(());
                }
                return self.on_stateless(&name, user.as_deref(), &payload).await;
            }
            types::CLOSE => {
                // The provider is done with this document; the socket stays. Hocuspocus
                // answers with a Close too (the provider ignores it). The provider sends
                // nothing more for it: no need to remember it as closed.
                self.docs.remove(head.address);
                let close = hp::encode_close(head.address, "provider_initiated");
                return self.send(close).await;
            }
            types::BROADCAST_STATELESS => {
                let why = "BroadcastStateless is for servers; clients send Stateless";
                return self.close_doc(head.address, why).await;
            }
            other => debug!(
                kind = other,
                "ignoring a message of a type clients do not send"
            ),
        }
        Ok(())
    }

    /// A stateless message from a client: a `document.stateless` webhook event.
    async fn on_stateless(
        &mut self,
        name: &DocName,
        user: Option<&str>,
        payload: &str,
    ) -> Result<(), CloseReason> {
        let limits = &self.app.config.limits;
        if payload.len() > limits.max_stateless_bytes {
            return Err(CloseReason::new(
                close::MESSAGE_TOO_BIG,
                "stateless message too big",
            ));
        }
        let per_sec = limits.stateless_per_second;
        let now_ms = self.now_ms();
        if !self
            .stateless
            .take(1, now_ms, per_sec as f32, per_sec.saturating_mul(2))
        {
            self.app.metrics.rate_limited.inc();
            return Err(CloseReason::new(
                close::POLICY,
                "too many stateless messages; reconnect later",
            ));
        }
        self.app.metrics.stateless_received.inc();
        let deadline = self.app.registry.config.storage_timeout;
        let recorded = self.app.api.stateless_event(name.as_str(), user, payload);
        match tokio::time::timeout(deadline, recorded).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(doc = %name, error = %e, "could not record a stateless message"),
            Err(_) => warn!(doc = %name, "recording a stateless message timed out"),
        }
        Ok(())
    }

    /// A new token for an open document (the provider's `sendToken()`): checked like the
    /// first; if it does not cover the document any more, the document is closed. Otherwise
    /// the session hands it to its room (on this node or, relayed, the owner's), which takes
    /// its permission and expiry in place of the old ones.
    async fn refresh(&mut self, address: &str, token: &str) -> Result<(), CloseReason> {
        let Some(DocState::Open(session)) = self.docs.get(address) else {
            return Ok(());
        };
        let name = session.name.clone();
        match self.check(&name, token).await {
            Ok(auth) => {
                if let Some(DocState::Open(session)) = self.docs.get_mut(address) {
                    session.reauth(auth).await;
                }
                Ok(())
            }
            Err(Refusal::Deny(reason)) => {
                self.app.metrics.hocuspocus_auth_failures.inc();
                self.close_doc(address, &format!("Unauthorized: {reason}"))
                    .await
            }
            Err(Refusal::Close(reason)) => Err(reason),
        }
    }

    /// Closes one document of the socket with a `Close` message; the others stay.
    async fn close_doc(&mut self, address: &str, reason: &str) -> Result<(), CloseReason> {
        self.docs.tombstone(address);
        self.send(hp::encode_close(address, reason)).await
    }

    /// Why a frame did not reach its document's room, as the socket's close.
    fn undelivered(&self, e: Undelivered) -> CloseReason {
        match e {
            Undelivered::Malformed(detail) => self.malformed(detail),
            Undelivered::Gone => crate::socket::joining::room_gone(),
        }
    }

    /// A session joined its room on this node: from now on the socket hands the document's
    /// frames to the room and its writer reads the room's queue. The frames the session's
    /// task still holds reach the room first.
    async fn take_over(&mut self, handover: Handover) -> Result<(), CloseReason> {
        let Handover {
            address,
            generation,
            member,
            out_rx,
            drained,
        } = handover;
        // Not taken over (the document went, or was opened again, before its room was
        // joined): dropping `member` leaves the room.
        let Some(DocState::Open(session)) = self.docs.get_mut(&address) else {
            return Ok(());
        };
        if session.generation != generation || !matches!(session.route, Route::Task(_)) {
            return Ok(());
        }
        let direct = Direct {
            generation,
            address: address.clone(),
            out_rx,
            acks: session.acks.clone(),
            // (Nothing was translated yet; one look at the counts costs nothing.)
            owing: true,
        };
        self.writer.send(WriterCmd::Add(Box::new(direct)));
        let local = Local {
            member,
            generation,
            writer: self.writer.clone(),
        };
        // Dropping the task's sender lets it finish handing the room what it holds.
        session.route = Route::Room(local);
        let refreshed = session.refreshed.then(|| session.auth.borrow().clone());
        let outcome = drained
            .await
            .unwrap_or_else(|_| Some(crate::socket::joining::room_gone()));
        if outcome.is_some() {
            let ended = Ended {
                address,
                generation,
                outcome,
            };
            return self.on_ended(ended).await;
        }
        if let (Some(auth), Some(DocState::Open(session))) =
            (refreshed, self.docs.get_mut(&address))
        {
            session.reauth(auth).await;
        }
        Ok(())
    }

    /// A session ended. If the room closed it for a reason that concerns that document only,
    /// the document is closed on the socket; any other reason closes the socket.
    async fn on_ended(&mut self, ended: Ended) -> Result<(), CloseReason> {
        let Ended {
            address,
            generation,
            outcome,
        } = ended;
        match self.docs.get(&address) {
            Some(DocState::Open(s)) if s.generation == generation => {}
            // Closed by the client, or replaced: nothing to tell.
            _ => return Ok(()),
        }
        match outcome {
            None => {
                self.docs.remove(&address);
                Ok(())
            }
            Some(reason) if closes_the_document_only(reason.code) => {
                self.close_doc(&address, &reason.reason).await
            }
            Some(reason) => Err(reason),
        }
    }
}

/// Close codes that concern one document, not the connection: they close that document on a
/// Hocuspocus socket and leave the others.
fn closes_the_document_only(code: u16) -> bool {
    matches!(
        code,
        close::TOKEN_EXPIRED | close::FORBIDDEN | close::DELETED | close::DOC_TOO_LARGE
    )
}

/// Drives one step of the reader (a frame's handling, an event's) to its end, and the socket's
/// writer meanwhile. `Err` ends the socket with that outcome.
async fn drive<T: Duplex>(
    step: impl Future<Output = Result<(), CloseReason>>,
    conn: &mut T,
    writer: &mut Writer,
    seen: &LastSeen,
) -> Result<(), Option<CloseReason>> {
    let mut step = std::pin::pin!(step);
    poll_fn(|cx| {
        if let Poll::Ready(done) = step.as_mut().poll(cx) {
            return Poll::Ready(done.map_err(Some));
        }
        writer.poll_write(conn, seen, cx).map(Err)
    })
    .await
}
