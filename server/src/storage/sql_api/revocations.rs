//! Token revocations (`revocations`), read by every node in id order.

use crate::storage::api::Revocation;
use async_trait::async_trait;

use crate::storage::api::RevocationStore;
use crate::storage::dialect::backend_impl;
use crate::storage::StorageError;

backend_impl!(
    #[async_trait]
    impl<DB> RevocationStore for SqlApi<DB> {
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
    }
);
