//! What both protocols do to put a connection on a document: join its room (or learn that
//! another node owns it and relay the client there), and the close of a peer whose room went
//! away. `ws.rs` (one document per socket) and `hocuspocus/` (many) both start here.

use std::future::Future;
use std::pin::Pin;

use futures_util::StreamExt;

use super::relay::{relay_to_owner, Reauth};
use super::transport::Duplex;
use crate::app::AppState;
use crate::close;
use crate::room::join::{join, join_close};
use crate::room::queue::QueueRx;
use crate::room::{CloseReason, DocName, JoinError, PeerAuth, RoomHandle};

/// How a join ended.
pub(crate) enum Joined {
    Room(RoomHandle, QueueRx),
    /// Refused, or closed at once: close with this.
    Closed(CloseReason),
    /// Another node owns the document (and there is a bus to relay through).
    Elsewhere(DocName, Box<PeerAuth>),
}

/// Joins `name`'s room as `peer` (boxed: it happens once, and its future is larger than the
/// rest of a connection's).
pub(crate) fn joining(
    app: AppState,
    name: DocName,
    peer: u64,
    auth: Box<PeerAuth>,
) -> Pin<Box<dyn Future<Output = Joined> + Send>> {
    Box::pin(async move {
        let (room, out_rx) = match join(&app.registry, &name, peer, (*auth).clone()).await {
            Ok(joined) => joined,
            Err(JoinError::Elsewhere) if app.bus.is_some() => {
                return Joined::Elsewhere(name, auth);
            }
            Err(e) => return Joined::Closed(join_close(e)),
        };
        // A revocation applied between the token check and the join missed this peer in the
        // room (revocations update the in-memory set before they tell the rooms), so look
        // again.
        if let (Some(token_id), Some(user)) = (&auth.token_id, &auth.user) {
            if app.auth.is_revoked(token_id, user, auth.issued_at) {
                room.leave(peer).await;
                return Joined::Closed(CloseReason::new(close::FORBIDDEN, "access revoked"));
            }
        }
        Joined::Room(room, out_rx)
    })
}

/// A client of a document another node owns, relayed to it through the bus until either side
/// ends (`None`: the client closed). Boxed, and the connection split only here (the relay
/// reads and writes at once): a connection served by this node keeps no room for either.
/// `reauth` brings the client's refreshed credentials (a Hocuspocus token refresh), which the
/// owner's room takes in place of the first.
pub(crate) fn relayed<'a, T: Duplex>(
    conn: &'a mut T,
    (name, peer, auth): (&'a DocName, u64, Box<PeerAuth>),
    reauth: Option<&'a mut Reauth>,
    app: &'a AppState,
) -> Pin<Box<dyn Future<Output = Option<CloseReason>> + Send + 'a>> {
    Box::pin(async move {
        let bus = app.bus.as_ref()?;
        let (mut sink, mut stream) = conn.split();
        relay_to_owner(
            &mut sink,
            &mut stream,
            (name, peer, *auth),
            reauth,
            app,
            bus,
        )
        .await
    })
}

/// The reason a peer is closed with when its room went away.
pub(crate) fn room_gone() -> CloseReason {
    CloseReason::new(close::INTERNAL, "document closed, reconnect")
}
