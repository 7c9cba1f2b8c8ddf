//! Changes that every node's sockets must see: a document deleted (its sockets close with
//! 4404), a user's role changed (that user's sockets close with 4403 and reconnect under the
//! new role).
//!
//! The node that makes a change applies it to its own sockets at once and announces it on the
//! bus, so other nodes act within milliseconds; the bus delivers at most once, though, so the
//! change is also a `doc_changes` row written in the change's transaction, and every node
//! reads the rows after the last it has seen every [`POLL`]. A change thus reaches every node
//! within about [`POLL`] even when the bus loses its announcement.
//!
//! A role change closes only the sockets whose permission was read before it: each socket
//! records the newest change id when its permission was read (`PeerAuth::seen_change`, read
//! just before the role), so a client that reconnected under the new role is left alone by
//! a node that acts later (nodes act independently: up to a poll apart when the announcement
//! is lost). Each node also acts on a role change once, whichever way it learns of it first
//! ([`crate::room::seen::Seen`]), which saves the work of acting twice. A delete needs no such bookkeeping:
//! acting on it twice finds no sockets the second time, and it is not acted on if storage
//! says the document has been restored since.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::app::AppState;
use crate::bus::{Bus, Change};
use crate::close;
use crate::room::{CloseReason, DocName, PeerFilter, Registry, RoomCmd};

/// How often each node reads new `doc_changes` rows.
pub const POLL: Duration = Duration::from_millis(250);

/// How long `doc_changes` rows are kept (a node that was down longer has no sockets to close).
pub const KEEP: Duration = Duration::from_secs(24 * 3600);

/// Rows read per query.
const BATCH: u32 = 500;

/// Applies `change` to this node's sockets on `name`, unless this node has already acted on
/// it (a role change is acted on once; see the module's notes).
pub async fn apply_once(bus: Option<&Bus>, registry: &Registry, name: &DocName, change: Change) {
    if let Change::Access { id, .. } = &change {
        // (0: no row id, from a node of an earlier version.)
        if *id > 0 && !registry.changes.first(*id) {
            return;
        }
    }
    apply_change(bus, registry, name, change).await;
}

/// A change another node announced on the bus: applied once (a delete only if storage, the
/// source of truth, confirms it: a replayed or forged-by-a-node announcement does nothing).
pub async fn on_announced(bus: Arc<Bus>, registry: Arc<Registry>, name: DocName, change: Change) {
    if change == Change::Deleted && !deleted_in_storage(&registry, &name).await {
        tracing::debug!(doc = %name, "ignoring a delete announcement storage does not confirm");
        return;
    }
    apply_once(Some(&bus), &registry, &name, change).await;
}

/// Whether storage says `name` is deleted (false if it cannot tell in time).
async fn deleted_in_storage(registry: &Registry, name: &DocName) -> bool {
    let limit = registry.config.storage_timeout;
    matches!(
        tokio::time::timeout(limit, registry.store.load(name.as_str())).await,
        Ok(Ok(stored)) if stored.deleted
    )
}

impl Change {
    /// Which sockets on the document it closes, with what, and whether the room unloads.
    pub fn effect(self) -> (PeerFilter, CloseReason, bool) {
        match self {
            Change::Deleted => (
                PeerFilter::All,
                CloseReason::new(close::DELETED, "document deleted"),
                true,
            ),
            // Only the sockets whose permission was read before the change (0: the id of a
            // change from an earlier version, which applies to all of the user's).
            Change::Access { user, id } => (
                if id > 0 {
                    PeerFilter::UserBefore(user, id)
                } else {
                    PeerFilter::User(user)
                },
                CloseReason::new(close::FORBIDDEN, "access changed; reconnect"),
                false,
            ),
        }
    }
}

/// Applies `change` to this node's sockets on `name`: the room's, if this node serves it
/// (its remote peers' relays are closed through it), and this node's relayed connections.
pub async fn apply_change(bus: Option<&Bus>, registry: &Registry, name: &DocName, change: Change) {
    let (filter, reason, unload) = change.effect();
    if let Some(bus) = bus {
        bus.kill_relays(name, &filter, &reason);
    }
    if let Some(room) = registry.get(name) {
        let close = RoomCmd::Close {
            filter,
            reason: Box::new(reason),
            unload,
        };
        let _ = room.command(close).await;
    }
}

/// Reads new `doc_changes` rows after `start` (the newest row before this node took its first
/// socket) every [`POLL`] and applies those this node has not acted on; removes rows older
/// than [`KEEP`] now and then.
pub async fn watch(app: AppState, start: i64, shutdown: CancellationToken) {
    let registry = &app.registry;
    registry.changes.start_at(start);
    let mut cursor = start;
    let mut polls: u64 = 0;
    loop {
        match app.api.doc_changes_after(cursor, BATCH).await {
            Ok(rows) => {
                for row in rows {
                    cursor = row.id;
                    let fresh = registry.changes.reached(row.id);
                    let Ok(name) = DocName::parse(&row.doc_name) else {
                        continue;
                    };
                    let change = match (row.kind.as_str(), row.user_id) {
                        ("deleted", _) => Change::Deleted,
                        ("access", Some(user)) if fresh => Change::Access { user, id: row.id },
                        _ => continue,
                    };
                    // Not inline: a room slow to take the command must not hold up the others.
                    let app = app.clone();
                    tokio::spawn(async move {
                        if change == Change::Deleted && !deleted_here(&app, &name).await {
                            return;
                        }
                        apply_change(app.bus.as_deref(), &app.registry, &name, change).await;
                    });
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot read document changes"),
        }
        polls += 1;
        // About every ten minutes.
        if polls % 2400 == 1 {
            let before = crate::storage::now_ms() - KEEP.as_millis() as i64;
            if let Err(e) = app.api.doc_changes_cleanup(before).await {
                tracing::warn!(error = %e, "cannot prune document changes");
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(POLL) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}

/// Whether a delete has sockets to close on this node, and the document is still deleted (a
/// restore since then wins; if storage cannot tell, the row is evidence enough).
async fn deleted_here(app: &AppState, name: &DocName) -> bool {
    let here =
        app.registry.get(name).is_some() || app.bus.as_ref().is_some_and(|bus| bus.relays_to(name));
    if !here {
        return false;
    }
    let restored = matches!(
        app.api.get_doc_by_name(name.as_str()).await,
        Ok(Some(doc)) if doc.deleted_at.is_none()
    );
    !restored
}
