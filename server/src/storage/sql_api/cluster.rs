//! What the admin pages read: documents' storage figures, the database's size, and the
//! nodes' rows (each node's heartbeat) with the leases they hold.

use sqlx::Row;

use crate::storage::api::{ClusterRows, DocQuery, DocStats, LeaseRow, NodeRow};
use async_trait::async_trait;

use crate::storage::api::ClusterStore;
use crate::storage::dialect::backend_impl;
use crate::storage::StorageError;

/// A node's row is dropped once it has not been seen for this long (ms).
const NODE_FORGOTTEN_MS: i64 = 24 * 3600 * 1000;

backend_impl!(
    #[async_trait]
    impl<DB> ClusterStore for SqlApi<DB> {
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
