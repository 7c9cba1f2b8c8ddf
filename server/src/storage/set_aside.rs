//! What stored log rows held that does not integrate into their document (`set_aside`): found
//! when a document loads (`room::committed::replay_checked`), kept out of it, and listed for
//! operators.

use async_trait::async_trait;
use sqlx::Row;

use super::dialect::backend_impl;
use super::{DocId, StorageError};

/// One row's part that was set aside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetAsideRow {
    /// The log position of the row it came from.
    pub seq: i64,
    /// The whole row, or the deletions cut from it (a Yjs v1 update).
    pub data: Vec<u8>,
    pub reason: String,
}

/// A set-aside row as listed: its document, and its size instead of its bytes.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct SetAsideListed {
    pub document: String,
    pub seq: i64,
    pub bytes: i64,
    pub reason: String,
    /// Unix milliseconds.
    pub created_at: i64,
}

#[async_trait]
pub trait SetAsideStore: Send + Sync {
    /// Records `rows` of document `doc` (a row already recorded is left as it is: loading
    /// the same store again finds the same rows).
    async fn set_aside(&self, doc: DocId, rows: &[SetAsideRow]) -> Result<(), StorageError>;
    /// The newest `limit` set-aside rows, of one document or of all.
    async fn set_aside_rows(
        &self,
        document: Option<&str>,
        limit: i64,
    ) -> Result<Vec<SetAsideListed>, StorageError>;
}

backend_impl!(
    #[async_trait]
    impl<DB> SetAsideStore for SqlApi<DB> {
        async fn set_aside(&self, doc: DocId, rows: &[SetAsideRow]) -> Result<(), StorageError> {
            let now = DB::NOW_MS;
            let mut tx = self.pool.begin().await?;
            for row in rows {
                sqlx::query(&format!(
                    "INSERT INTO set_aside (doc_id, seq, data, reason, created_at) \
                     VALUES ($1, $2, $3, $4, {now}) ON CONFLICT (doc_id, seq) DO NOTHING"
                ))
                .bind(doc)
                .bind(row.seq)
                .bind(row.data.as_slice())
                .bind(row.reason.as_str())
                .execute(&mut *tx)
                .await?;
            }
            tx.commit().await?;
            Ok(())
        }

        async fn set_aside_rows(
            &self,
            document: Option<&str>,
            limit: i64,
        ) -> Result<Vec<SetAsideListed>, StorageError> {
            let rows = sqlx::query(
                "SELECT d.name, s.seq, CAST(length(s.data) AS BIGINT) AS bytes, s.reason, s.created_at \
                 FROM set_aside s JOIN documents d ON d.id = s.doc_id \
                 WHERE ($1 IS NULL OR d.name = $1) \
                 ORDER BY s.created_at DESC, s.doc_id, s.seq LIMIT $2",
            )
            .bind(document)
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
            rows.iter()
                .map(|r| {
                    Ok(SetAsideListed {
                        document: r.try_get(0)?,
                        seq: r.try_get(1)?,
                        bytes: r.try_get::<i64, _>(2)?,
                        reason: r.try_get(3)?,
                        created_at: r.try_get(4)?,
                    })
                })
                .collect::<Result<_, sqlx::Error>>()
                .map_err(StorageError::from)
        }
    }
);
