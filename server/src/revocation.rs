//! Applying revocations: remembered by [`crate::auth::Auth`] so revoked tokens stop verifying,
//! and enforced on live sockets, which close with 4403. A watcher reads new revocation rows
//! every [`POLL`], so revocations written by another process (the CLI, another node) take
//! effect within a second too.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::app::AppState;
use crate::close;
use crate::room::{CloseReason, PeerFilter, RoomCmd};
use crate::storage::api::Revocation;

/// How often the watcher looks for new revocation rows.
pub const POLL: Duration = Duration::from_millis(250);

/// Records a revocation and closes the matching sockets in every loaded room.
pub async fn apply(app: &AppState, r: &Revocation) {
    app.auth.apply_revocation(r);
    let filters = [
        r.token_id.clone().map(PeerFilter::Token),
        r.user_id.clone().map(PeerFilter::User),
    ];
    // Each room gets its order on its own task: one busy room must not delay the others.
    for room in app.registry.all() {
        for filter in filters.iter().flatten() {
            let cmd = RoomCmd::Close {
                filter: filter.clone(),
                reason: Box::new(CloseReason::new(close::FORBIDDEN, "access revoked")),
                unload: false,
            };
            let room = room.clone();
            tokio::spawn(async move { room.command(cmd).await });
        }
    }
}

/// Loads every revocation at start-up, then applies new ones as they appear.
pub async fn watch(app: AppState, shutdown: CancellationToken) {
    let mut cursor = 0;
    loop {
        match app.api.revocations_after(cursor).await {
            Ok(rows) => {
                for r in rows {
                    cursor = cursor.max(r.id);
                    apply(&app, &r).await;
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot read revocations"),
        }
        tokio::select! {
            _ = tokio::time::sleep(POLL) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}
