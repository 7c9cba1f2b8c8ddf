//! The room's lease on its document when nodes share the database: granted when the room
//! loads, renewed on the node-wide tick before it runs out, released on the way out (and by
//! [`LeaseGuard`] if the room is dropped without releasing it). Appends and snapshots carry
//! its epoch (`fence`), which the storage checks.

use std::sync::Arc;

use tokio::time::{Duration, Instant};
use tracing::warn;

use super::commit::StorageOp;
use crate::room::Registry;
use crate::storage::{Epoch, StorageError};

/// The room's lease, released when the room is dropped without releasing it (a panic
/// unwinding through the room), so another node may take the document at once instead of
/// waiting for the lease to run out.
pub(super) struct LeaseGuard {
    pub(super) store: Arc<dyn crate::storage::DocStore>,
    pub(super) doc: i64,
    pub(super) node: Arc<str>,
    pub(super) epoch: Epoch,
    pub(super) armed: bool,
    /// The deadline of the release (`storage_timeout`).
    pub(super) limit: Duration,
}

impl LeaseGuard {
    /// Releases the lease now (unless it was already).
    async fn release(&mut self) {
        if std::mem::take(&mut self.armed) {
            let releasing = self.store.release_lease(self.doc, &self.node, self.epoch);
            match tokio::time::timeout(self.limit, releasing).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    warn!(error = %e, "could not release the lease; it expires by itself")
                }
                Err(_) => warn!("the lease release did not answer in time; it expires by itself"),
            }
        }
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // no runtime left to release it with: it expires by itself
        };
        let (store, doc, node, epoch) =
            (self.store.clone(), self.doc, self.node.clone(), self.epoch);
        let limit = self.limit;
        runtime.spawn(async move {
            let _ = tokio::time::timeout(limit, store.release_lease(doc, &node, epoch)).await;
        });
    }
}

/// When to renew a lease granted or renewed at `from`: on the node-wide tick (every third of
/// the lease time, counted from the first lease of the process), the first one after `from`,
/// and never later than a third of the lease after it (the lease lasts the whole of it). The
/// node's rooms renew at the same moments, and the storage sends renewals that arrive
/// together as one statement (`storage/renewals.rs`).
pub(super) fn renewal_tick(from: Instant, ttl: Duration) -> Instant {
    static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let origin = *ORIGIN.get_or_init(Instant::now);
    let period = (ttl / 3).as_nanos().max(1);
    let since = from.saturating_duration_since(origin).as_nanos();
    let ticks = since / period + 1;
    let tick = origin + Duration::from_nanos(u64::try_from(ticks * period).unwrap_or(u64::MAX / 2));
    // (A lease granted before the origin was set, while its room loaded, renews a third of the
    // lease after its grant at the latest.)
    tick.min(from + ttl / 3)
}

pub(super) async fn wait_renewal(
    renewing: &mut Option<StorageOp<bool>>,
) -> Result<bool, StorageError> {
    match renewing {
        Some(task) => task.as_mut().await,
        None => std::future::pending().await,
    }
}

/// The room's lease on its document (all `None` and unused without leases).
pub(super) struct Lease {
    /// The lease epoch every append and snapshot carries (`None`: no leases).
    pub(super) fence: Option<Epoch>,
    /// A lease renewal in flight, polled by the room like its storage operation.
    pub(super) renewing: Option<StorageOp<bool>>,
    /// When the renewal in flight was sent, when to renew next, and until when the lease is
    /// known to hold (by this process's clock, counted from when a grant or renewal was sent,
    /// so never later than the database's).
    renew_started: Instant,
    pub(super) renew_at: Instant,
    until: Instant,
    /// Released on every exit, a panic included (`None`: no leases).
    guard: Option<LeaseGuard>,
    /// Set when a write was fenced: the room must stop.
    pub(super) fenced: bool,
}

impl Lease {
    /// The lease the room was loaded under (its epoch and when it was granted), if any.
    pub(super) fn new(registry: &Registry, doc: i64, lease: Option<(Epoch, Instant)>) -> Lease {
        let ttl = registry
            .config
            .lease
            .as_ref()
            .map_or(Duration::from_secs(5), |l| l.ttl);
        let granted_at = lease.map_or_else(Instant::now, |(_, at)| at);
        let guard = lease.and_then(|(epoch, _)| {
            let node = registry.config.lease.as_ref()?.node_id.clone();
            Some(LeaseGuard {
                store: registry.store.clone(),
                doc,
                node,
                epoch,
                armed: true,
                limit: registry.config.storage_timeout,
            })
        });
        Lease {
            fence: lease.map(|(epoch, _)| epoch),
            renewing: None,
            renew_started: granted_at,
            renew_at: renewal_tick(granted_at, ttl),
            until: granted_at + ttl,
            guard,
            fenced: false,
        }
    }

    /// Sends a renewal of the lease on document `doc`, polled by the room as `renewing`.
    pub(super) fn start_renewal(&mut self, registry: &Registry, doc: i64) {
        let (Some(epoch), Some(lease)) = (self.fence, registry.config.lease.clone()) else {
            return;
        };
        let store = registry.store.clone();
        let started = Instant::now();
        // A renewal that has not answered when the lease runs out counts as failed: a stalled
        // connection must not keep the room alive after another node may have the document.
        let deadline = self.until.max(started);
        self.renewing = Some(Box::pin(async move {
            match tokio::time::timeout_at(
                deadline,
                store.renew_lease(doc, &lease.node_id, epoch, lease.ttl),
            )
            .await
            {
                Ok(renewed) => renewed,
                Err(_) => Err(StorageError::Invalid(
                    "lease renewal did not answer before the lease ran out".into(),
                )),
            }
        }));
        self.renew_started = started;
        self.renew_at = renewal_tick(started, lease.ttl);
    }

    /// A renewal's outcome: keep going, retry soon, or (`Err`, with the reason) give the
    /// room up.
    pub(super) fn on_renewed(
        &mut self,
        registry: &Registry,
        renewed: Result<bool, StorageError>,
    ) -> Result<(), String> {
        self.renewing = None;
        let Some(ttl) = registry.config.lease.as_ref().map(|l| l.ttl) else {
            return Ok(());
        };
        match renewed {
            Ok(true) => {
                self.until = self.renew_started + ttl;
                Ok(())
            }
            Ok(false) => Err("lease renewal refused: another node holds the document".into()),
            Err(e) if Instant::now() + ttl / 10 < self.until => {
                warn!(error = %e, "lease renewal failed; retrying");
                self.renew_at = Instant::now() + ttl / 10;
                Ok(())
            }
            Err(e) => Err(format!("the lease ran out while renewals failed: {e}")),
        }
    }

    /// Releases the lease now (the room is leaving).
    pub(super) async fn release(&mut self) {
        // A renewal still in flight is abandoned: the release ends the lease either way.
        self.renewing = None;
        if let Some(guard) = &mut self.guard {
            guard.release().await;
        }
    }
}
