//! The one implementation of [`ApiStore`], for both databases ([`Dialect`] holds what differs).
//! These writes are rare next to log appends, so they use the pool directly (on SQLite, the
//! busy timeout serialises them with the writer task).
//!
//! This file holds the store itself and the outbox write every change shares; each of the
//! traits [`ApiStore`] is made of is implemented by the rows it touches: `sql_api/documents.rs`
//! (metadata), `profiles.rs`, `access.rs`, `idempotency.rs`, `revocations.rs`, `changes.rs`
//! (the `doc_changes` feed), `outbox.rs` (webhook events) and `cluster.rs` (admin figures,
//! nodes, leases).

mod access;
mod changes;
mod cluster;
mod documents;
mod idempotency;
mod outbox;
mod profiles;
mod revocations;

use std::sync::Arc;
use std::time::Duration;

use sqlx::{Pool, Transaction};
use tokio::sync::Notify;

use super::api::*;
use super::dialect::{backend_impl, Dialect};

/// Whether document changes write webhook events to the outbox, and how `document.updated`
/// events are debounced.
#[derive(Debug, Clone, Copy, Default)]
pub struct EventSettings {
    pub enabled: bool,
    pub debounce: Duration,
}

impl EventSettings {
    /// After how many ms a `document.updated` event folded into the outbox by an append
    /// becomes available; `None` if events are off.
    pub fn debounce_ms(&self) -> Option<i64> {
        self.enabled.then_some(self.debounce.as_millis() as i64)
    }
}

/// The API rows of one database: its pool and whether writes emit outbox events. Both stores
/// hold one; cheap to clone.
pub struct SqlApi<DB: Dialect> {
    pub(super) pool: Pool<DB>,
    pub(super) events: EventSettings,
    /// Woken after a transaction that wrote outbox events commits.
    pub(super) events_written: Arc<Notify>,
    /// The node's lease renewals, batched (`renewals.rs`).
    pub(super) renewals: Arc<super::renewals::Renewals>,
    /// `history_retention` in milliseconds; 0: snapshots delete the rows they cover.
    pub(super) retention_ms: Arc<std::sync::atomic::AtomicI64>,
}

impl<DB: Dialect> SqlApi<DB> {
    /// The API rows of the database behind `pool`; `events_written` is woken after each
    /// commit that wrote outbox events.
    pub(super) fn new(pool: Pool<DB>, events: EventSettings, events_written: Arc<Notify>) -> Self {
        SqlApi {
            pool,
            events,
            events_written,
            renewals: Arc::default(),
            retention_ms: Arc::default(),
        }
    }

    /// The connection pool, for tests and tools that inspect the database.
    pub fn pool(&self) -> &Pool<DB> {
        &self.pool
    }

    /// Keeps log rows for `retention` after a snapshot covers them (the history); zero
    /// restores the default, where a snapshot deletes the rows it covers.
    pub fn set_history_retention(&self, retention: std::time::Duration) {
        let ms = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
        self.retention_ms
            .store(ms, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether log rows are kept after a snapshot covers them.
    pub fn keeps_history(&self) -> bool {
        self.retention_ms.load(std::sync::atomic::Ordering::Relaxed) > 0
    }

    /// Notified whenever outbox events were committed (the delivery worker waits on it).
    pub fn events_notify(&self) -> Arc<Notify> {
        self.events_written.clone()
    }
}

impl<DB: Dialect> Clone for SqlApi<DB> {
    fn clone(&self) -> Self {
        SqlApi {
            pool: self.pool.clone(),
            events: self.events,
            events_written: self.events_written.clone(),
            renewals: self.renewals.clone(),
            retention_ms: self.retention_ms.clone(),
        }
    }
}

backend_impl!(
    impl<DB> SqlApi<DB> {
        /// Writes an event to the outbox inside `tx`, if events are enabled.
        pub(super) async fn emit(
            &self,
            tx: &mut Transaction<'_, DB>,
            kind: &str,
            payload: serde_json::Value,
            now: i64,
        ) -> Result<(), sqlx::Error> {
            if !self.events.enabled {
                return Ok(());
            }
            sqlx::query(
                "INSERT INTO outbox (event_id, type, payload, available_at, created_at) \
                 VALUES ($1, $2, $3, $4, $5)",
            )
            .bind(uuid::Uuid::new_v4().to_string())
            .bind(kind)
            .bind(payload.to_string())
            .bind(now)
            .bind(now)
            .execute(&mut **tx)
            .await?;
            Ok(())
        }

        pub(super) async fn committed_with_events(
            &self,
            tx: Transaction<'_, DB>,
        ) -> Result<(), sqlx::Error> {
            tx.commit().await?;
            if self.events.enabled {
                self.events_written.notify_one();
            }
            Ok(())
        }
    }
);

backend_impl!(
    impl<DB> ApiStore for SqlApi<DB> {
        fn set_history_retention(&self, retention: std::time::Duration) {
            SqlApi::set_history_retention(self, retention)
        }
    }
);
