//! The statements of the [`DocStore`](super::DocStore) contract that are the same on both
//! databases: load, the lease, and why a write matched no row. How appends and snapshots are
//! committed differs (SQLite's single writer task with its commit window, PostgreSQL's writer
//! tasks and row locks) and stays in `sqlite.rs` and `postgres.rs`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::Row;

use super::dialect::backend_impl;
use super::history::NewVersion;
use super::sql_api::SqlApi;
use super::{now_ms, DocId, Epoch, LeaseGrant, SharedStatements, StorageError, StoredDoc};

backend_impl!(
    #[async_trait]
    impl<DB> SharedStatements for SqlApi<DB> {
        /// The snapshot and the log after it, read from one committed state (see
        /// [`Dialect::BEGIN_READ_SNAPSHOT`]), creating the document's row if there is none.
        async fn load(&self, name: &str) -> Result<StoredDoc, StorageError> {
            loop {
                let mut tx = self.pool.begin_with(DB::BEGIN_READ_SNAPSHOT).await?;
                let row = sqlx::query(
                    "SELECT id, snapshot_version, snapshot_generation, snapshot_seq, deleted_at \
                     FROM documents WHERE name = $1",
                )
                .bind(name)
                .fetch_optional(&mut *tx)
                .await?;
                let Some(row) = row else {
                    tx.commit().await?;
                    self.create_for_load(name).await?;
                    continue;
                };
                let id: i64 = row.try_get("id")?;
                let snapshot_seq: i64 = row.try_get("snapshot_seq")?;
                let deleted_at: Option<i64> = row.try_get("deleted_at")?;
                let generation: Option<i64> = row.try_get("snapshot_generation")?;
                let snapshot = Self::read_snapshot(&mut tx, id, generation).await?;
                let updates = sqlx::query(
                    "SELECT seq, data FROM doc_updates WHERE doc_id = $1 AND seq > $2 ORDER BY seq",
                )
                .bind(id)
                .bind(snapshot_seq)
                .fetch_all(&mut *tx)
                .await?
                .into_iter()
                .map(|r| Ok((r.try_get("seq")?, r.try_get("data")?)))
                .collect::<Result<Vec<_>, sqlx::Error>>()?;
                tx.commit().await?;
                return Ok(StoredDoc {
                    id,
                    snapshot_version: row.try_get("snapshot_version")?,
                    deleted: deleted_at.is_some(),
                    snapshot,
                    snapshot_seq,
                    updates,
                });
            }
        }

        async fn load_snapshot(&self, doc: DocId) -> Result<StoredDoc, StorageError> {
            let mut tx = self.pool.begin_with(DB::BEGIN_READ_SNAPSHOT).await?;
            let row = sqlx::query(
                "SELECT snapshot_version, snapshot_generation, snapshot_seq, deleted_at \
                 FROM documents WHERE id = $1",
            )
            .bind(doc)
            .fetch_optional(&mut *tx)
            .await?;
            let Some(row) = row else {
                tx.commit().await?;
                return Err(StorageError::Deleted);
            };
            let generation: Option<i64> = row.try_get("snapshot_generation")?;
            let snapshot = Self::read_snapshot(&mut tx, doc, generation).await?;
            tx.commit().await?;
            let deleted_at: Option<i64> = row.try_get("deleted_at")?;
            Ok(StoredDoc {
                id: doc,
                snapshot_version: row.try_get("snapshot_version")?,
                deleted: deleted_at.is_some(),
                snapshot,
                snapshot_seq: row.try_get("snapshot_seq")?,
                updates: Vec::new(),
            })
        }

        async fn lease_owner(&self, doc: DocId) -> Result<Option<String>, StorageError> {
            Ok(sqlx::query_scalar(&format!(
                "SELECT owner FROM room_leases WHERE doc_id = $1 AND expires_at > {}",
                DB::NOW_MS
            ))
            .bind(doc)
            .fetch_optional(&self.pool)
            .await?)
        }

        async fn lease_owners(&self, docs: &[DocId]) -> Result<Vec<(DocId, String)>, StorageError> {
            let mut owners = Vec::new();
            // In chunks: a statement takes a bounded number of parameters.
            for chunk in docs.chunks(500) {
                let list = (1..=chunk.len())
                    .map(|i| format!("${i}"))
                    .collect::<Vec<_>>()
                    .join(", ");
                let sql = format!(
                    "SELECT doc_id, owner FROM room_leases WHERE doc_id IN ({list}) AND expires_at > {}",
                    DB::NOW_MS
                );
                let mut query = sqlx::query_as::<_, (i64, String)>(&sql);
                for doc in chunk {
                    query = query.bind(*doc);
                }
                owners.extend(query.fetch_all(&self.pool).await?);
            }
            Ok(owners)
        }

        async fn doc_id(&self, name: &str) -> Result<DocId, StorageError> {
            loop {
                let id: Option<i64> =
                    sqlx::query_scalar("SELECT id FROM documents WHERE name = $1")
                        .bind(name)
                        .fetch_optional(&self.pool)
                        .await?;
                match id {
                    Some(id) => return Ok(id),
                    None => self.create_for_load(name).await?,
                }
            }
        }

        async fn ping(&self) -> Result<(), StorageError> {
            sqlx::query("SELECT 1").execute(&self.pool).await?;
            Ok(())
        }

        async fn add_version(&self, v: NewVersion) -> Result<i64, StorageError> {
            Ok(sqlx::query_scalar(
                "INSERT INTO doc_versions (doc_id, seq, kind, label, author, state, created_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id",
            )
            .bind(v.doc)
            .bind(v.seq)
            .bind(v.kind.as_str())
            .bind(v.label.as_deref())
            .bind(v.author.as_deref())
            .bind(v.state.as_slice())
            .bind(v.created_at)
            .fetch_one(&self.pool)
            .await?)
        }

        /// Times come from the database's clock, the one every node shares.
        async fn acquire_lease(
            &self,
            doc: DocId,
            node: &str,
            ttl: Duration,
        ) -> Result<LeaseGrant, StorageError> {
            let now = DB::NOW_MS;
            let granted: Option<i64> = sqlx::query_scalar(&format!(
                "INSERT INTO room_leases (doc_id, owner, epoch, expires_at) \
                 VALUES ($1, $2, 1, {now} + $3) \
                 ON CONFLICT (doc_id) DO UPDATE SET owner = EXCLUDED.owner, \
                   epoch = room_leases.epoch + 1, expires_at = EXCLUDED.expires_at \
                 WHERE room_leases.expires_at <= {now} OR room_leases.owner = EXCLUDED.owner \
                 RETURNING epoch"
            ))
            .bind(doc)
            .bind(node)
            .bind(ttl.as_millis() as i64)
            .fetch_optional(&self.pool)
            .await?;
            if let Some(epoch) = granted {
                return Ok(LeaseGrant::Granted { epoch });
            }
            let (owner, epoch, expires_in_ms): (String, i64, i64) = sqlx::query_as(&format!(
                "SELECT owner, epoch, expires_at - {now} FROM room_leases WHERE doc_id = $1"
            ))
            .bind(doc)
            .fetch_one(&self.pool)
            .await?;
            Ok(LeaseGrant::HeldBy {
                owner,
                epoch,
                expires_in_ms: expires_in_ms.max(0),
            })
        }

        /// Joins the node's next batch of renewals (`renewals.rs`).
        async fn renew_lease(
            &self,
            doc: DocId,
            node: &str,
            epoch: Epoch,
            ttl: Duration,
        ) -> Result<bool, StorageError> {
            // The queue's task holds a handle of its own to the pool, without the queue (which
            // would keep itself alive): it ends when the store's last handle goes.
            let statements = || {
                Arc::new(SqlApi {
                    pool: self.pool.clone(),
                    events: self.events,
                    events_written: self.events_written.clone(),
                    renewals: Arc::default(),
                    retention_ms: self.retention_ms.clone(),
                }) as Arc<dyn SharedStatements>
            };
            self.renewals
                .renew(statements, (doc, node, epoch, ttl))
                .await
        }

        async fn renew_leases(
            &self,
            node: &str,
            ttl: Duration,
            leases: &[(DocId, Epoch)],
        ) -> Result<Vec<(DocId, Epoch)>, StorageError> {
            let mut renewed = Vec::new();
            for chunk in leases.chunks(500) {
                let pairs = (0..chunk.len())
                    .map(|i| format!("(${}, ${})", 3 + 2 * i, 4 + 2 * i))
                    .collect::<Vec<_>>()
                    .join(", ");
                // The rows are locked in document order first: appends lock the lease rows of
                // several documents in that order too (FOR SHARE), so the two never deadlock.
                let sql = format!(
                    "UPDATE room_leases SET expires_at = {} + $1 \
                     WHERE owner = $2 AND (doc_id, epoch) IN (VALUES {pairs}) \
                       AND doc_id IN (SELECT doc_id FROM room_leases \
                         WHERE owner = $2 AND (doc_id, epoch) IN (VALUES {pairs}) \
                         ORDER BY doc_id {}) \
                     RETURNING doc_id, epoch",
                    DB::NOW_MS,
                    DB::LOCK_ROWS
                );
                let mut query = sqlx::query_as::<_, (i64, i64)>(&sql)
                    .bind(ttl.as_millis() as i64)
                    .bind(node);
                for (doc, epoch) in chunk {
                    query = query.bind(*doc).bind(*epoch);
                }
                renewed.extend(query.fetch_all(&self.pool).await?);
            }
            Ok(renewed)
        }

        async fn release_lease(
            &self,
            doc: DocId,
            node: &str,
            epoch: Epoch,
        ) -> Result<(), StorageError> {
            sqlx::query(
                "UPDATE room_leases SET expires_at = 0 WHERE doc_id = $1 AND owner = $2 AND epoch = $3",
            )
            .bind(doc)
            .bind(node)
            .bind(epoch)
            .execute(&self.pool)
            .await?;
            Ok(())
        }
    }
);

backend_impl!(
    impl<DB> SqlApi<DB> {
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
    }
);
