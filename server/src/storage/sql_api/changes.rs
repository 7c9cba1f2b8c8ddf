//! The `doc_changes` feed (deletions, access changes) other nodes watch.

use crate::storage::api::DocChange;
use async_trait::async_trait;

use crate::storage::api::DocChangeStore;
use crate::storage::dialect::backend_impl;
use crate::storage::StorageError;

backend_impl!(
    #[async_trait]
    impl<DB> DocChangeStore for SqlApi<DB> {
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
    }
);
