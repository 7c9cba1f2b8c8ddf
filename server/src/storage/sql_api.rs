//! The one implementation of [`ApiStore`], for both databases ([`Dialect`] holds what differs).
//! These writes are rare next to log appends, so they use the pool directly (on SQLite, the
//! busy timeout serialises them with the writer task).

use std::sync::Arc;

use async_trait::async_trait;
use sqlx::{Pool, Row, Transaction};
use tokio::sync::Notify;

use super::api::*;
use super::dialect::{backend_impl, Dialect};
use super::sqlite::EventSettings;
use super::{now_ms, DocId, Epoch, StorageError};

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

/// A node's row is dropped once it has not been seen for this long (ms).
const NODE_FORGOTTEN_MS: i64 = 24 * 3600 * 1000;

impl<DB: Dialect> SqlApi<DB> {
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

const DOC_COLUMNS: &str = "id, name, title, owner, created_at, updated_at, deleted_at, version";
const USER_COLUMNS: &str = "id, display_name, color, avatar_url, version, created_at, updated_at";

backend_impl!(
    impl<DB> SqlApi<DB> {
        fn doc_row(r: &DB::Row) -> Result<DocMeta, sqlx::Error> {
            Ok(DocMeta {
                id: r.try_get("id")?,
                name: r.try_get("name")?,
                title: r.try_get("title")?,
                owner: r.try_get("owner")?,
                created_at: r.try_get("created_at")?,
                updated_at: r.try_get("updated_at")?,
                deleted_at: r.try_get("deleted_at")?,
                version: r.try_get("version")?,
            })
        }

        fn user_row(r: &DB::Row) -> Result<UserProfile, sqlx::Error> {
            Ok(UserProfile {
                id: r.try_get("id")?,
                display_name: r.try_get("display_name")?,
                color: r.try_get("color")?,
                avatar_url: r.try_get("avatar_url")?,
                version: r.try_get("version")?,
                created_at: r.try_get("created_at")?,
                updated_at: r.try_get("updated_at")?,
            })
        }

        fn event_row(r: &DB::Row) -> Result<OutboxEvent, sqlx::Error> {
            let urls: String = r.try_get("delivered_urls")?;
            Ok(OutboxEvent {
                id: r.try_get("id")?,
                event_id: r.try_get("event_id")?,
                kind: r.try_get("type")?,
                payload: r.try_get("payload")?,
                revision: r.try_get("revision")?,
                status: r.try_get("status")?,
                attempts: r.try_get("attempts")?,
                available_at: r.try_get("available_at")?,
                delivered_urls: serde_json::from_str(&urls).unwrap_or_default(),
                last_error: r.try_get("last_error")?,
                created_at: r.try_get("created_at")?,
                delivered_at: r.try_get("delivered_at")?,
            })
        }

        /// [`ApiStore::outbox_view`], awaiting `between` after the outbox is read and before the
        /// dead-letter table is: a test commits a move there to check that both reads see the
        /// snapshot of the first.
        pub(crate) async fn outbox_view_with(
            &self,
            limit: u32,
            between: impl std::future::Future<Output = ()> + Send,
        ) -> Result<(Vec<OutboxEvent>, Vec<DeadEvent>), StorageError> {
            let mut tx = self.pool.begin_with(DB::BEGIN_READ_SNAPSHOT).await?;
            let rows = sqlx::query("SELECT * FROM outbox ORDER BY id DESC LIMIT $1")
                .bind(i64::from(limit))
                .fetch_all(&mut *tx)
                .await?;
            let events = rows.iter().map(Self::event_row).collect::<Result<_, _>>()?;
            between.await;
            let dead = sqlx::query_as(
                "SELECT id, event_id, type, payload, attempts, last_error, created_at, died_at \
                 FROM outbox_dead ORDER BY id DESC LIMIT $1",
            )
            .bind(i64::from(limit))
            .fetch_all(&mut *tx)
            .await?;
            tx.commit().await?;
            Ok((events, dead))
        }

        /// Writes an event to the outbox inside `tx`, if events are enabled.
        async fn emit(
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

        async fn committed_with_events(&self, tx: Transaction<'_, DB>) -> Result<(), sqlx::Error> {
            tx.commit().await?;
            if self.events.enabled {
                self.events_written.notify_one();
            }
            Ok(())
        }

        /// Creates the row of a document first opened over WebSocket (no owner yet).
        pub(super) async fn create_for_load(&self, name: &str) -> Result<(), StorageError> {
            let now = now_ms();
            let mut tx = self.pool.begin().await?;
            let created = sqlx::query(
                "INSERT INTO documents (name, created_at, updated_at) VALUES ($1, $2, $3) \
                 ON CONFLICT (name) DO NOTHING RETURNING id",
            )
            .bind(name)
            .bind(now)
            .bind(now)
            .fetch_optional(&mut *tx)
            .await?;
            if let Some(row) = created {
                let id: i64 = row.try_get("id")?;
                self.emit(
                    &mut tx,
                    "document.created",
                    serde_json::json!({ "id": id, "name": name, "owner": null }),
                    now,
                )
                .await?;
            }
            self.committed_with_events(tx).await?;
            Ok(())
        }

        /// Why a write matched no row: the document is deleted ([`StorageError::Deleted`]), the
        /// lease moved on ([`StorageError::Fenced`]), or else the write's own conflict.
        pub(super) async fn why_refused(
            conn: &mut DB::Connection,
            doc: DocId,
            fence: Option<Epoch>,
            otherwise: StorageError,
        ) -> StorageError {
            let deleted: Result<Option<Option<i64>>, _> =
                sqlx::query_scalar("SELECT deleted_at FROM documents WHERE id = $1")
                    .bind(doc)
                    .fetch_optional(&mut *conn)
                    .await;
            match deleted {
                Ok(Some(Some(_))) => return StorageError::Deleted,
                Ok(_) => {}
                Err(e) => return e.into(),
            }
            let Some(fence) = fence else {
                return otherwise;
            };
            let current: Result<Option<i64>, _> =
                sqlx::query_scalar("SELECT epoch FROM room_leases WHERE doc_id = $1")
                    .bind(doc)
                    .fetch_optional(&mut *conn)
                    .await;
            match current {
                Ok(Some(epoch)) if epoch == fence => otherwise,
                Ok(_) => StorageError::Fenced,
                Err(e) => e.into(),
            }
        }

        async fn doc_versioned(
            &self,
            id: DocId,
            updated: bool,
        ) -> Result<Versioned<DocMeta>, StorageError> {
            Ok(match self.get_doc(id).await? {
                None => Versioned::NotFound,
                Some(d) if updated => Versioned::Updated(d),
                Some(d) => Versioned::Stale(d),
            })
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
            let now = now_ms();
            let mut tx = self.pool.begin().await?;
            let row = sqlx::query(&format!(
                "INSERT INTO documents (name, title, owner, created_at, updated_at) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (name) DO NOTHING RETURNING {DOC_COLUMNS}"
            ))
            .bind(name)
            .bind(title)
            .bind(owner)
            .bind(now)
            .bind(now)
            .fetch_optional(&mut *tx)
            .await?;
            let Some(row) = row else {
                return Ok(None);
            };
            let doc = Self::doc_row(&row)?;
            if let Some(owner) = owner {
                sqlx::query(
                    "INSERT INTO document_access (doc_id, user_id, role) VALUES ($1, $2, 'owner')",
                )
                .bind(doc.id)
                .bind(owner)
                .execute(&mut *tx)
                .await?;
            }
            if let Some(first) = first {
                sqlx::query(
                    "INSERT INTO doc_updates (doc_id, seq, data, created_at, author, inserted, deleted) \
                     VALUES ($1, 1, $2, $3, $4, $5, $6)",
                )
                .bind(doc.id)
                .bind(first.data.as_ref())
                .bind(now)
                .bind(first.author.as_deref())
                .bind(first.inserted)
                .bind(first.deleted)
                .execute(&mut *tx)
                .await?;
                for (doc_id, client, author, seq) in super::client_rows(doc.id, 1, &[first]) {
                    sqlx::query(
                        "INSERT INTO doc_clients (doc_id, client_id, author, first_seq) \
                         VALUES ($1, $2, $3, $4)",
                    )
                    .bind(doc_id)
                    .bind(client)
                    .bind(author)
                    .bind(seq)
                    .execute(&mut *tx)
                    .await?;
                }
            }
            self.emit(
                &mut tx,
                "document.created",
                serde_json::json!({ "id": doc.id, "name": doc.name, "owner": doc.owner }),
                now,
            )
            .await?;
            self.committed_with_events(tx).await?;
            Ok(Some(doc))
        }

        async fn get_doc(&self, id: DocId) -> Result<Option<DocMeta>, StorageError> {
            let row = sqlx::query(&format!(
                "SELECT {DOC_COLUMNS} FROM documents WHERE id = $1"
            ))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
            Ok(row.as_ref().map(Self::doc_row).transpose()?)
        }

        async fn get_doc_by_name(&self, name: &str) -> Result<Option<DocMeta>, StorageError> {
            let row = sqlx::query(&format!(
                "SELECT {DOC_COLUMNS} FROM documents WHERE name = $1"
            ))
            .bind(name)
            .fetch_optional(&self.pool)
            .await?;
            Ok(row.as_ref().map(Self::doc_row).transpose()?)
        }

        async fn list_docs(&self, q: &DocQuery) -> Result<Vec<DocMeta>, StorageError> {
            // `name >= prefix AND name < prefix || U+10FFFF` is a prefix match that can use the
            // unique index on name (byte-wise, COLLATE "C") and needs no LIKE escaping.
            let upper = q.name_prefix.as_ref().map(|p| format!("{p}\u{10FFFF}"));
            let rows = sqlx::query(&format!(
                "SELECT {DOC_COLUMNS} FROM documents \
                 WHERE id > $1 \
                   AND (CAST($2 AS TEXT) IS NULL OR owner = $2) \
                   AND (CAST($3 AS TEXT) IS NULL OR (name >= $3 AND name < $4)) \
                   AND ($5 OR deleted_at IS NULL) \
                 ORDER BY id LIMIT $6"
            ))
            .bind(q.after_id.unwrap_or(0))
            .bind(&q.owner)
            .bind(&q.name_prefix)
            .bind(upper)
            .bind(q.include_deleted)
            .bind(i64::from(q.limit))
            .fetch_all(&self.pool)
            .await?;
            Ok(rows.iter().map(Self::doc_row).collect::<Result<_, _>>()?)
        }

        async fn update_doc(
            &self,
            id: DocId,
            expected_version: i64,
            patch: &DocPatch,
        ) -> Result<Versioned<DocMeta>, StorageError> {
            let now = now_ms();
            let mut tx = self.pool.begin().await?;
            let row = sqlx::query(&format!(
                "UPDATE documents SET title = COALESCE($1, title), owner = COALESCE($2, owner), \
                 version = version + 1, updated_at = $3 \
                 WHERE id = $4 AND version = $5 AND deleted_at IS NULL RETURNING {DOC_COLUMNS}"
            ))
            .bind(&patch.title)
            .bind(&patch.owner)
            .bind(now)
            .bind(id)
            .bind(expected_version)
            .fetch_optional(&mut *tx)
            .await?;
            let Some(row) = row else {
                drop(tx);
                return self.doc_versioned(id, false).await;
            };
            let doc = Self::doc_row(&row)?;
            if let Some(owner) = &patch.owner {
                // Ownership moves: the new owner gets the role, any other owner becomes an editor.
                sqlx::query(
                    "UPDATE document_access SET role = 'editor' \
                     WHERE doc_id = $1 AND role = 'owner' AND user_id <> $2",
                )
                .bind(id)
                .bind(owner)
                .execute(&mut *tx)
                .await?;
                sqlx::query(
                    "INSERT INTO document_access (doc_id, user_id, role) VALUES ($1, $2, 'owner') \
                     ON CONFLICT (doc_id, user_id) DO UPDATE SET role = 'owner'",
                )
                .bind(id)
                .bind(owner)
                .execute(&mut *tx)
                .await?;
            }
            tx.commit().await?;
            Ok(Versioned::Updated(doc))
        }

        async fn delete_doc(&self, id: DocId) -> Result<Versioned<DocMeta>, StorageError> {
            let now = now_ms();
            let mut tx = self.pool.begin().await?;
            let row = sqlx::query(&format!(
                "UPDATE documents SET deleted_at = $1, version = version + 1, updated_at = $2 \
                 WHERE id = $3 AND deleted_at IS NULL RETURNING {DOC_COLUMNS}"
            ))
            .bind(now)
            .bind(now)
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?;
            let Some(row) = row else {
                drop(tx);
                return self.doc_versioned(id, false).await;
            };
            let doc = Self::doc_row(&row)?;
            DB::order_ids(&mut tx, "doc_changes").await?;
            sqlx::query(
                "INSERT INTO doc_changes (doc_id, kind, changed_at) VALUES ($1, 'deleted', $2)",
            )
            .bind(id)
            .bind(now)
            .execute(&mut *tx)
            .await?;
            self.emit(
                &mut tx,
                "document.deleted",
                serde_json::json!({ "id": doc.id, "name": doc.name }),
                now,
            )
            .await?;
            self.committed_with_events(tx).await?;
            Ok(Versioned::Updated(doc))
        }

        async fn restore_doc(&self, id: DocId) -> Result<Versioned<DocMeta>, StorageError> {
            let now = now_ms();
            let row = sqlx::query(&format!(
                "UPDATE documents SET deleted_at = NULL, version = version + 1, updated_at = $1 \
                 WHERE id = $2 AND deleted_at IS NOT NULL RETURNING {DOC_COLUMNS}"
            ))
            .bind(now)
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
            match row {
                Some(row) => Ok(Versioned::Updated(Self::doc_row(&row)?)),
                None => self.doc_versioned(id, false).await,
            }
        }

        async fn get_user(&self, id: &str) -> Result<Option<UserProfile>, StorageError> {
            let row = sqlx::query(&format!("SELECT {USER_COLUMNS} FROM users WHERE id = $1"))
                .bind(id)
                .fetch_optional(&self.pool)
                .await?;
            Ok(row.as_ref().map(Self::user_row).transpose()?)
        }

        async fn ensure_user(&self, id: &str) -> Result<UserProfile, StorageError> {
            let now = now_ms();
            sqlx::query(
                "INSERT INTO users (id, created_at, updated_at) VALUES ($1, $2, $3) \
                 ON CONFLICT (id) DO NOTHING",
            )
            .bind(id)
            .bind(now)
            .bind(now)
            .execute(&self.pool)
            .await?;
            self.get_user(id)
                .await?
                .ok_or_else(|| StorageError::Invalid(format!("user {id} vanished")))
        }

        async fn update_user(
            &self,
            id: &str,
            expected_version: i64,
            patch: &UserPatch,
        ) -> Result<Versioned<UserProfile>, StorageError> {
            let now = now_ms();
            let mut tx = self.pool.begin().await?;
            let row = sqlx::query(&format!(
                "UPDATE users SET display_name = COALESCE($1, display_name), \
                 color = COALESCE($2, color), avatar_url = COALESCE($3, avatar_url), \
                 version = version + 1, updated_at = $4 \
                 WHERE id = $5 AND version = $6 RETURNING {USER_COLUMNS}"
            ))
            .bind(&patch.display_name)
            .bind(&patch.color)
            .bind(&patch.avatar_url)
            .bind(now)
            .bind(id)
            .bind(expected_version)
            .fetch_optional(&mut *tx)
            .await?;
            let Some(row) = row else {
                drop(tx);
                return Ok(match self.get_user(id).await? {
                    Some(u) => Versioned::Stale(u),
                    None => Versioned::NotFound,
                });
            };
            let user = Self::user_row(&row)?;
            self.emit(
                &mut tx,
                "profile.updated",
                serde_json::to_value(&user).unwrap_or_default(),
                now,
            )
            .await?;
            self.committed_with_events(tx).await?;
            Ok(Versioned::Updated(user))
        }

        async fn get_role(&self, doc: DocId, user: &str) -> Result<Option<Role>, StorageError> {
            let role: Option<String> = sqlx::query_scalar(
                "SELECT role FROM document_access WHERE doc_id = $1 AND user_id = $2",
            )
            .bind(doc)
            .bind(user)
            .fetch_optional(&self.pool)
            .await?;
            Ok(role.as_deref().and_then(Role::parse))
        }

        async fn set_role(
            &self,
            doc: DocId,
            user: &str,
            role: Option<Role>,
        ) -> Result<i64, StorageError> {
            let mut tx = self.pool.begin().await?;
            match role {
                Some(role) => {
                    sqlx::query(
                        "INSERT INTO document_access (doc_id, user_id, role) VALUES ($1, $2, $3) \
                         ON CONFLICT (doc_id, user_id) DO UPDATE SET role = excluded.role",
                    )
                    .bind(doc)
                    .bind(user)
                    .bind(role.as_str())
                    .execute(&mut *tx)
                    .await?;
                }
                None => {
                    sqlx::query("DELETE FROM document_access WHERE doc_id = $1 AND user_id = $2")
                        .bind(doc)
                        .bind(user)
                        .execute(&mut *tx)
                        .await?;
                }
            }
            DB::order_ids(&mut tx, "doc_changes").await?;
            let id = sqlx::query_scalar(
                "INSERT INTO doc_changes (doc_id, kind, user_id, changed_at) \
                 VALUES ($1, 'access', $2, $3) RETURNING id",
            )
            .bind(doc)
            .bind(user)
            .bind(now_ms())
            .fetch_one(&mut *tx)
            .await?;
            tx.commit().await?;
            Ok(id)
        }

        async fn list_access(&self, doc: DocId) -> Result<Vec<(String, Role)>, StorageError> {
            let rows: Vec<(String, String)> = sqlx::query_as(
                "SELECT user_id, role FROM document_access WHERE doc_id = $1 ORDER BY user_id",
            )
            .bind(doc)
            .fetch_all(&self.pool)
            .await?;
            Ok(rows
                .into_iter()
                .filter_map(|(u, r)| Role::parse(&r).map(|r| (u, r)))
                .collect())
        }

        async fn idem_claim(
            &self,
            principal: &str,
            key: &str,
            request_hash: &str,
            now: i64,
            expires_before: i64,
        ) -> Result<IdemClaim, StorageError> {
            // Read committed is enough: a concurrent claim of the same key waits in the INSERT for
            // the first one to commit, then does nothing, and the SELECT (a new statement) sees it.
            let mut tx = self.pool.begin().await?;
            // An expired key is forgotten first, so the claim below can take it afresh.
            sqlx::query(
                "DELETE FROM idempotency_keys WHERE principal = $1 AND key = $2 AND created_at < $3",
            )
            .bind(principal)
            .bind(key)
            .bind(expires_before)
            .execute(&mut *tx)
            .await?;
            let claimed = sqlx::query(
                "INSERT INTO idempotency_keys (principal, key, request_hash, created_at) \
                 VALUES ($1, $2, $3, $4) ON CONFLICT (principal, key) DO NOTHING",
            )
            .bind(principal)
            .bind(key)
            .bind(request_hash)
            .bind(now)
            .execute(&mut *tx)
            .await
            .map(|done| DB::rows_affected(&done))?
                == 1;
            let outcome = if claimed {
                IdemClaim::Started
            } else {
                let row = sqlx::query(
                    "SELECT request_hash, response_status, response_body, response_headers \
                     FROM idempotency_keys WHERE principal = $1 AND key = $2",
                )
                .bind(principal)
                .bind(key)
                .fetch_optional(&mut *tx)
                .await?;
                match row {
                    // Abandoned (deleted) between our INSERT and SELECT: report it as running; the
                    // client retries, and the retry claims it afresh.
                    None => IdemClaim::InProgress,
                    Some(row) => {
                        let hash: String = row.try_get("request_hash")?;
                        let status: Option<i64> = row.try_get("response_status")?;
                        if hash != request_hash {
                            IdemClaim::Mismatch
                        } else if let Some(status) = status {
                            let headers: Option<String> = row.try_get("response_headers")?;
                            IdemClaim::Replay(StoredResponse {
                                status: u16::try_from(status).unwrap_or(500),
                                headers: headers
                                    .and_then(|h| serde_json::from_str(&h).ok())
                                    .unwrap_or_default(),
                                body: row
                                    .try_get::<Option<Vec<u8>>, _>("response_body")?
                                    .unwrap_or_default(),
                            })
                        } else {
                            IdemClaim::InProgress
                        }
                    }
                }
            };
            tx.commit().await?;
            Ok(outcome)
        }

        async fn idem_finish(
            &self,
            principal: &str,
            key: &str,
            response: &StoredResponse,
        ) -> Result<(), StorageError> {
            sqlx::query(
                "UPDATE idempotency_keys SET response_status = $1, response_body = $2, \
                 response_headers = $3 WHERE principal = $4 AND key = $5",
            )
            .bind(i64::from(response.status))
            .bind(&response.body)
            .bind(serde_json::to_string(&response.headers).unwrap_or_else(|_| "[]".into()))
            .bind(principal)
            .bind(key)
            .execute(&self.pool)
            .await?;
            Ok(())
        }

        async fn idem_abandon(&self, principal: &str, key: &str) -> Result<(), StorageError> {
            sqlx::query(
                "DELETE FROM idempotency_keys WHERE principal = $1 AND key = $2 \
                 AND response_status IS NULL",
            )
            .bind(principal)
            .bind(key)
            .execute(&self.pool)
            .await?;
            Ok(())
        }

        async fn idem_cleanup(&self, expires_before: i64) -> Result<u64, StorageError> {
            let done = sqlx::query("DELETE FROM idempotency_keys WHERE created_at < $1")
                .bind(expires_before)
                .execute(&self.pool)
                .await?;
            Ok(DB::rows_affected(&done))
        }

        async fn revoke(
            &self,
            token_id: Option<&str>,
            user_id: Option<&str>,
            now: i64,
        ) -> Result<Revocation, StorageError> {
            // Readers apply the rows after the last id they have seen. Revocations are rare.
            let mut tx = self.pool.begin().await?;
            DB::order_ids(&mut tx, "revocations").await?;
            let id: i64 = sqlx::query_scalar(
                "INSERT INTO revocations (token_id, user_id, revoked_at) VALUES ($1, $2, $3) \
                 RETURNING id",
            )
            .bind(token_id)
            .bind(user_id)
            .bind(now)
            .fetch_one(&mut *tx)
            .await?;
            tx.commit().await?;
            Ok(Revocation {
                id,
                token_id: token_id.map(str::to_owned),
                user_id: user_id.map(str::to_owned),
                revoked_at: now,
            })
        }

        async fn revocations_after(&self, id: i64) -> Result<Vec<Revocation>, StorageError> {
            let rows: Vec<(i64, Option<String>, Option<String>, i64)> = sqlx::query_as(
                "SELECT id, token_id, user_id, revoked_at FROM revocations WHERE id > $1 ORDER BY id",
            )
            .bind(id)
            .fetch_all(&self.pool)
            .await?;
            Ok(rows
                .into_iter()
                .map(|(id, token_id, user_id, revoked_at)| Revocation {
                    id,
                    token_id,
                    user_id,
                    revoked_at,
                })
                .collect())
        }

        async fn stateless_event(
            &self,
            doc: &str,
            user: Option<&str>,
            payload: &str,
        ) -> Result<(), StorageError> {
            if !self.events.enabled {
                return Ok(());
            }
            let now = now_ms();
            let mut tx = self.pool.begin().await?;
            self.emit(
                &mut tx,
                "document.stateless",
                serde_json::json!({ "name": doc, "user": user, "payload": payload }),
                now,
            )
            .await?;
            self.committed_with_events(tx).await?;
            Ok(())
        }

        async fn last_doc_change(&self) -> Result<i64, StorageError> {
            let id: Option<i64> = sqlx::query_scalar("SELECT MAX(id) FROM doc_changes")
                .fetch_one(&self.pool)
                .await?;
            Ok(id.unwrap_or(0))
        }

        async fn doc_changes_after(
            &self,
            id: i64,
            limit: u32,
        ) -> Result<Vec<DocChange>, StorageError> {
            Ok(sqlx::query_as(
                "SELECT c.id, d.name AS doc_name, c.kind, c.user_id, c.changed_at \
                 FROM doc_changes c JOIN documents d ON d.id = c.doc_id \
                 WHERE c.id > $1 ORDER BY c.id LIMIT $2",
            )
            .bind(id)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?)
        }

        async fn doc_changes_cleanup(&self, before: i64) -> Result<u64, StorageError> {
            let done = sqlx::query("DELETE FROM doc_changes WHERE changed_at < $1")
                .bind(before)
                .execute(&self.pool)
                .await?;
            Ok(DB::rows_affected(&done))
        }

        async fn due_events(&self, now: i64, limit: u32) -> Result<Vec<OutboxEvent>, StorageError> {
            let rows = sqlx::query(
                "SELECT * FROM outbox WHERE status = 'pending' AND available_at <= $1 \
                 ORDER BY id LIMIT $2",
            )
            .bind(now)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
            Ok(rows.iter().map(Self::event_row).collect::<Result<_, _>>()?)
        }

        async fn claim_due_events(
            &self,
            now: i64,
            claim_ms: i64,
            limit: u32,
        ) -> Result<Vec<OutboxEvent>, StorageError> {
            let clock = DB::NOW_MS;
            let rows = sqlx::query(&format!(
                "UPDATE outbox SET claimed_until = {clock} + $2 WHERE id IN ( \
                   SELECT id FROM outbox \
                   WHERE status = 'pending' AND available_at <= $1 AND claimed_until <= {clock} \
                   ORDER BY id LIMIT $3 {}) \
                 RETURNING *",
                DB::SKIP_LOCKED
            ))
            .bind(now)
            .bind(claim_ms)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
            let mut events = rows
                .iter()
                .map(Self::event_row)
                .collect::<Result<Vec<_>, _>>()?;
            events.sort_by_key(|e| e.id);
            Ok(events)
        }

        async fn release_claims(&self, ids: &[i64]) -> Result<(), StorageError> {
            // (A round holds at most a few dozen events.)
            for chunk in ids.chunks(500) {
                let list = (1..=chunk.len())
                    .map(|i| format!("${i}"))
                    .collect::<Vec<_>>()
                    .join(", ");
                let sql = format!("UPDATE outbox SET claimed_until = 0 WHERE id IN ({list})");
                let mut query = sqlx::query(&sql);
                for id in chunk {
                    query = query.bind(*id);
                }
                query.execute(&self.pool).await?;
            }
            Ok(())
        }

        async fn event_delivered(
            &self,
            id: i64,
            revision: i64,
            now: i64,
        ) -> Result<(), StorageError> {
            // A row folded meanwhile (new revision) stays pending, unclaimed: delivered again.
            sqlx::query(
                "UPDATE outbox SET \
                   status = CASE WHEN revision = $3 THEN 'delivered' ELSE status END, \
                   delivered_at = CASE WHEN revision = $3 THEN $1 ELSE delivered_at END, \
                   attempts = attempts + CASE WHEN revision = $3 THEN 1 ELSE 0 END, \
                   claimed_until = 0 \
                 WHERE id = $2",
            )
            .bind(now)
            .bind(id)
            .bind(revision)
            .execute(&self.pool)
            .await?;
            Ok(())
        }

        async fn event_failed(
            &self,
            id: i64,
            revision: i64,
            delivered_urls: &[String],
            next_attempt_at: i64,
            error: &str,
        ) -> Result<(), StorageError> {
            // After a fold (new revision), the URLs that took the old revision must get the new one.
            sqlx::query(
                "UPDATE outbox SET attempts = attempts + 1, available_at = $1, last_error = $2, \
                 delivered_urls = CASE WHEN revision = $3 THEN $4 ELSE '[]' END, claimed_until = 0 \
                 WHERE id = $5",
            )
            .bind(next_attempt_at)
            .bind(error)
            .bind(revision)
            .bind(serde_json::to_string(delivered_urls).unwrap_or_else(|_| "[]".into()))
            .bind(id)
            .execute(&self.pool)
            .await?;
            Ok(())
        }

        async fn event_dead(
            &self,
            id: i64,
            revision: i64,
            error: &str,
            now: i64,
        ) -> Result<(), StorageError> {
            if !DB::move_to_dead(&self.pool, id, revision, error, now).await? {
                // Folded meanwhile: it stays, with a new revision to deliver, and unclaimed.
                self.release_claims(&[id]).await?;
            }
            Ok(())
        }

        async fn outbox_view(
            &self,
            limit: u32,
        ) -> Result<(Vec<OutboxEvent>, Vec<DeadEvent>), StorageError> {
            self.outbox_view_with(limit, async {}).await
        }

        async fn retry_dead(&self, id: i64, now: i64) -> Result<Option<OutboxEvent>, StorageError> {
            let mut tx = self.pool.begin().await?;
            // The row keeps its id (taken from the outbox's sequence, so no later event can have
            // it) and its event id; a second retry finds it in the outbox and inserts nothing.
            let moved = sqlx::query(
                "INSERT INTO outbox (id, event_id, type, payload, available_at, created_at) \
                 SELECT id, event_id, type, payload, $1, created_at FROM outbox_dead WHERE id = $2 \
                 ON CONFLICT DO NOTHING",
            )
            .bind(now)
            .bind(id)
            .execute(&mut *tx)
            .await?;
            sqlx::query("DELETE FROM outbox_dead WHERE id = $1")
                .bind(id)
                .execute(&mut *tx)
                .await?;
            let row = sqlx::query("SELECT * FROM outbox WHERE id = $1")
                .bind(id)
                .fetch_optional(&mut *tx)
                .await?;
            tx.commit().await?;
            if DB::rows_affected(&moved) > 0 {
                self.events_written.notify_one();
            }
            Ok(row.as_ref().map(Self::event_row).transpose()?)
        }

        async fn doc_stats(&self, q: &DocQuery) -> Result<Vec<DocStats>, StorageError> {
            let upper = q.name_prefix.as_ref().map(|p| format!("{p}\u{10FFFF}"));
            let rows = sqlx::query(
                "SELECT d.id, d.name, d.title, d.created_at, d.snapshot_seq, d.snapshot_at, \
                   COALESCE((SELECT SUM(length(p.bytes)) FROM doc_snapshot_parts p \
                     WHERE p.doc_id = d.id AND p.generation = d.snapshot_generation), 0) \
                     AS snapshot_bytes, \
                   (SELECT COUNT(*) FROM doc_updates u WHERE u.doc_id = d.id AND u.seq > d.snapshot_seq) \
                     AS log_rows, \
                   COALESCE((SELECT SUM(length(u.data)) FROM doc_updates u \
                     WHERE u.doc_id = d.id AND u.seq > d.snapshot_seq), 0) AS log_bytes, \
                   (SELECT u.created_at FROM doc_updates u WHERE u.doc_id = d.id \
                     ORDER BY u.seq DESC LIMIT 1) AS last_commit, \
                   l.owner AS lease_owner, l.epoch AS lease_epoch, l.expires_at AS lease_expires_at \
                 FROM documents d LEFT JOIN room_leases l ON l.doc_id = d.id \
                 WHERE d.id > $1 AND d.deleted_at IS NULL \
                   AND (CAST($2 AS TEXT) IS NULL OR (d.name >= $2 AND d.name < $3)) \
                 ORDER BY d.id LIMIT $4",
            )
            .bind(q.after_id.unwrap_or(0))
            .bind(&q.name_prefix)
            .bind(upper)
            .bind(i64::from(q.limit))
            .fetch_all(&self.pool)
            .await?;
            let stats = |r: &DB::Row| -> Result<DocStats, sqlx::Error> {
                Ok(DocStats {
                    id: r.try_get("id")?,
                    name: r.try_get("name")?,
                    title: r.try_get("title")?,
                    created_at: r.try_get("created_at")?,
                    snapshot_seq: r.try_get("snapshot_seq")?,
                    snapshot_bytes: r.try_get("snapshot_bytes")?,
                    snapshot_at: r.try_get("snapshot_at")?,
                    log_rows: r.try_get("log_rows")?,
                    log_bytes: r.try_get("log_bytes")?,
                    last_commit: r.try_get("last_commit")?,
                    lease_owner: r.try_get("lease_owner")?,
                    lease_epoch: r.try_get("lease_epoch")?,
                    lease_expires_at: r.try_get("lease_expires_at")?,
                })
            };
            Ok(rows.iter().map(stats).collect::<Result<_, _>>()?)
        }

        async fn store_size(&self) -> Result<i64, StorageError> {
            let size: i64 = sqlx::query_scalar(DB::STORE_SIZE)
                .fetch_one(&self.pool)
                .await?;
            Ok(size)
        }

        async fn node_heartbeat(
            &self,
            id: &str,
            address: &str,
            version: &str,
            started_at: i64,
        ) -> Result<(), StorageError> {
            sqlx::query(&format!(
                "INSERT INTO nodes (id, address, version, started_at, last_seen_at) \
                 VALUES ($1, $2, $3, $4, {now}) \
                 ON CONFLICT (id) DO UPDATE SET address = excluded.address, \
                   version = excluded.version, started_at = excluded.started_at, \
                   last_seen_at = excluded.last_seen_at",
                now = DB::NOW_MS
            ))
            .bind(id)
            .bind(address)
            .bind(version)
            .bind(started_at)
            .execute(&self.pool)
            .await?;
            // Rows of nodes gone for a day (a node started without --node-id has a new id each
            // time) are dropped, so the table stays the size of the cluster.
            sqlx::query(&format!(
                "DELETE FROM nodes WHERE last_seen_at < {now} - $1",
                now = DB::NOW_MS
            ))
            .bind(NODE_FORGOTTEN_MS)
            .execute(&self.pool)
            .await?;
            Ok(())
        }

        async fn cluster_rows(&self, limit: u32) -> Result<ClusterRows, StorageError> {
            let mut tx = self.pool.begin_with(DB::BEGIN_READ_SNAPSHOT).await?;
            let now: i64 = sqlx::query_scalar(&format!("SELECT {}", DB::NOW_MS))
                .fetch_one(&mut *tx)
                .await?;
            let nodes = sqlx::query(
                "SELECT id, address, version, started_at, last_seen_at FROM nodes ORDER BY id LIMIT $1",
            )
            .bind(i64::from(limit))
            .fetch_all(&mut *tx)
            .await?;
            let leases = sqlx::query(
                "SELECT l.doc_id, d.name, l.owner, l.epoch, l.expires_at \
                 FROM room_leases l JOIN documents d ON d.id = l.doc_id \
                 WHERE l.expires_at > $1 ORDER BY d.name LIMIT $2",
            )
            .bind(now)
            .bind(i64::from(limit))
            .fetch_all(&mut *tx)
            .await?;
            tx.commit().await?;
            let node = |r: &DB::Row| -> Result<NodeRow, sqlx::Error> {
                Ok(NodeRow {
                    id: r.try_get("id")?,
                    address: r.try_get("address")?,
                    version: r.try_get("version")?,
                    started_at: r.try_get("started_at")?,
                    last_seen_at: r.try_get("last_seen_at")?,
                })
            };
            let lease = |r: &DB::Row| -> Result<LeaseRow, sqlx::Error> {
                Ok(LeaseRow {
                    doc_id: r.try_get("doc_id")?,
                    doc_name: r.try_get("name")?,
                    owner: r.try_get("owner")?,
                    epoch: r.try_get("epoch")?,
                    expires_at: r.try_get("expires_at")?,
                })
            };
            Ok(ClusterRows {
                now,
                nodes: nodes.iter().map(node).collect::<Result<_, _>>()?,
                leases: leases.iter().map(lease).collect::<Result<_, _>>()?,
            })
        }
    }
);
