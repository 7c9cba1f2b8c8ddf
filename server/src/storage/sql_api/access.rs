//! Roles on documents (`document_access`); every change of one is also a `doc_changes` row.

use crate::storage::api::Role;
use async_trait::async_trait;

use crate::storage::api::AccessStore;
use crate::storage::dialect::backend_impl;
use crate::storage::{now_ms, DocId, StorageError};

backend_impl!(
    #[async_trait]
    impl<DB> AccessStore for SqlApi<DB> {
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
    }
);
