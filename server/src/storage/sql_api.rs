//! The one implementation of [`ApiStore`], for both databases ([`Dialect`] holds what differs).
//! These writes are rare next to log appends, so they use the pool directly (on SQLite, the
//! busy timeout serialises them with the writer task).
//!
//! This file holds the store itself, the outbox write every change shares, and the map from
//! [`ApiStore`] to the statements, which live by the rows they touch: `sql_api/documents.rs`
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

use async_trait::async_trait;
use sqlx::{Pool, Transaction};
use tokio::sync::Notify;

use super::api::*;
use super::dialect::{backend_impl, Dialect};
use super::{DocId, StorageError};

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
    #[async_trait]
    impl<DB> ApiStore for SqlApi<DB> {
        fn set_history_retention(&self, retention: std::time::Duration) {
            SqlApi::set_history_retention(self, retention)
        }

        async fn create_doc_with(
            &self,
            name: &str,
            title: &str,
            owner: Option<&str>,
            first: Option<super::LogEntry>,
        ) -> Result<Option<DocMeta>, StorageError> {
            SqlApi::create_doc_with(self, name, title, owner, first).await
        }

        async fn get_doc(&self, id: DocId) -> Result<Option<DocMeta>, StorageError> {
            SqlApi::get_doc(self, id).await
        }

        async fn get_doc_by_name(&self, name: &str) -> Result<Option<DocMeta>, StorageError> {
            SqlApi::get_doc_by_name(self, name).await
        }

        async fn list_docs(&self, q: &DocQuery) -> Result<Vec<DocMeta>, StorageError> {
            SqlApi::list_docs(self, q).await
        }

        async fn update_doc(
            &self,
            id: DocId,
            expected_version: i64,
            patch: &DocPatch,
        ) -> Result<Versioned<DocMeta>, StorageError> {
            SqlApi::update_doc(self, id, expected_version, patch).await
        }

        async fn delete_doc(&self, id: DocId) -> Result<Versioned<DocMeta>, StorageError> {
            SqlApi::delete_doc(self, id).await
        }

        async fn restore_doc(&self, id: DocId) -> Result<Versioned<DocMeta>, StorageError> {
            SqlApi::restore_doc(self, id).await
        }

        async fn get_user(&self, id: &str) -> Result<Option<UserProfile>, StorageError> {
            SqlApi::get_user(self, id).await
        }

        async fn ensure_user(&self, id: &str) -> Result<UserProfile, StorageError> {
            SqlApi::ensure_user(self, id).await
        }

        async fn update_user(
            &self,
            id: &str,
            expected_version: i64,
            patch: &UserPatch,
        ) -> Result<Versioned<UserProfile>, StorageError> {
            SqlApi::update_user(self, id, expected_version, patch).await
        }

        async fn get_role(&self, doc: DocId, user: &str) -> Result<Option<Role>, StorageError> {
            SqlApi::get_role(self, doc, user).await
        }

        async fn set_role(
            &self,
            doc: DocId,
            user: &str,
            role: Option<Role>,
        ) -> Result<i64, StorageError> {
            SqlApi::set_role(self, doc, user, role).await
        }

        async fn list_access(&self, doc: DocId) -> Result<Vec<(String, Role)>, StorageError> {
            SqlApi::list_access(self, doc).await
        }

        async fn idem_claim(
            &self,
            principal: &str,
            key: &str,
            request_hash: &str,
            now: i64,
            expires_before: i64,
        ) -> Result<IdemClaim, StorageError> {
            SqlApi::idem_claim(self, principal, key, request_hash, now, expires_before).await
        }

        async fn idem_finish(
            &self,
            principal: &str,
            key: &str,
            response: &StoredResponse,
        ) -> Result<(), StorageError> {
            SqlApi::idem_finish(self, principal, key, response).await
        }

        async fn idem_abandon(&self, principal: &str, key: &str) -> Result<(), StorageError> {
            SqlApi::idem_abandon(self, principal, key).await
        }

        async fn idem_cleanup(&self, expires_before: i64) -> Result<u64, StorageError> {
            SqlApi::idem_cleanup(self, expires_before).await
        }

        async fn revoke(
            &self,
            token_id: Option<&str>,
            user_id: Option<&str>,
            now: i64,
        ) -> Result<Revocation, StorageError> {
            SqlApi::revoke(self, token_id, user_id, now).await
        }

        async fn revocations_after(&self, id: i64) -> Result<Vec<Revocation>, StorageError> {
            SqlApi::revocations_after(self, id).await
        }

        async fn stateless_event(
            &self,
            doc: &str,
            user: Option<&str>,
            payload: &str,
        ) -> Result<(), StorageError> {
            SqlApi::stateless_event(self, doc, user, payload).await
        }

        async fn last_doc_change(&self) -> Result<i64, StorageError> {
            SqlApi::last_doc_change(self).await
        }

        async fn doc_changes_after(
            &self,
            id: i64,
            limit: u32,
        ) -> Result<Vec<DocChange>, StorageError> {
            SqlApi::doc_changes_after(self, id, limit).await
        }

        async fn doc_changes_cleanup(&self, before: i64) -> Result<u64, StorageError> {
            SqlApi::doc_changes_cleanup(self, before).await
        }

        async fn due_events(&self, now: i64, limit: u32) -> Result<Vec<OutboxEvent>, StorageError> {
            SqlApi::due_events(self, now, limit).await
        }

        async fn claim_due_events(
            &self,
            now: i64,
            claim_ms: i64,
            limit: u32,
        ) -> Result<Vec<OutboxEvent>, StorageError> {
            SqlApi::claim_due_events(self, now, claim_ms, limit).await
        }

        async fn release_claims(&self, ids: &[i64]) -> Result<(), StorageError> {
            SqlApi::release_claims(self, ids).await
        }

        async fn event_delivered(
            &self,
            id: i64,
            revision: i64,
            now: i64,
        ) -> Result<(), StorageError> {
            SqlApi::event_delivered(self, id, revision, now).await
        }

        async fn event_failed(
            &self,
            id: i64,
            revision: i64,
            delivered_urls: &[String],
            next_attempt_at: i64,
            error: &str,
        ) -> Result<(), StorageError> {
            SqlApi::event_failed(self, id, revision, delivered_urls, next_attempt_at, error).await
        }

        async fn event_dead(
            &self,
            id: i64,
            revision: i64,
            error: &str,
            now: i64,
        ) -> Result<(), StorageError> {
            SqlApi::event_dead(self, id, revision, error, now).await
        }

        async fn outbox_view(
            &self,
            limit: u32,
        ) -> Result<(Vec<OutboxEvent>, Vec<DeadEvent>), StorageError> {
            SqlApi::outbox_view(self, limit).await
        }

        async fn retry_dead(&self, id: i64, now: i64) -> Result<Option<OutboxEvent>, StorageError> {
            SqlApi::retry_dead(self, id, now).await
        }

        async fn doc_stats(&self, q: &DocQuery) -> Result<Vec<DocStats>, StorageError> {
            SqlApi::doc_stats(self, q).await
        }

        async fn store_size(&self) -> Result<i64, StorageError> {
            SqlApi::store_size(self).await
        }

        async fn node_heartbeat(
            &self,
            id: &str,
            address: &str,
            version: &str,
            started_at: i64,
        ) -> Result<(), StorageError> {
            SqlApi::node_heartbeat(self, id, address, version, started_at).await
        }

        async fn cluster_rows(&self, limit: u32) -> Result<ClusterRows, StorageError> {
            SqlApi::cluster_rows(self, limit).await
        }
    }
);
