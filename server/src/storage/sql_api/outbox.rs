//! The webhook outbox (`outbox`, `outbox_dead`): events due, claimed, delivered, failed or
//! moved to the dead-letter table, and the admin view of both tables.

use sqlx::Row;

use crate::storage::api::{DeadEvent, OutboxEvent};
use async_trait::async_trait;

use crate::storage::api::OutboxStore;
use crate::storage::dialect::backend_impl;
use crate::storage::{now_ms, StorageError};

backend_impl!(
    #[async_trait]
    impl<DB> OutboxStore for SqlApi<DB> {
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
    }
);

backend_impl!(
    impl<DB> SqlApi<DB> {
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

        /// [`OutboxStore::outbox_view`], awaiting `between` after the outbox is read and before the
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
    }
);
