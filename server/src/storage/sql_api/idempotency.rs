//! Idempotency keys (`idempotency_keys`): a request's claim, its stored response, and the
//! keys forgotten once expired or abandoned.

use sqlx::Row;

use crate::storage::api::{IdemClaim, StoredResponse};
use async_trait::async_trait;

use crate::storage::api::IdempotencyStore;
use crate::storage::dialect::backend_impl;
use crate::storage::StorageError;

backend_impl!(
    #[async_trait]
    impl<DB> IdempotencyStore for SqlApi<DB> {
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
    }
);
