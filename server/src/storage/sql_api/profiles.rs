//! User profiles (`users`): read, created empty on first use, versioned update.

use sqlx::Row;

use crate::storage::api::{UserPatch, UserProfile, Versioned};
use async_trait::async_trait;

use crate::storage::api::ProfileStore;
use crate::storage::dialect::backend_impl;
use crate::storage::{now_ms, StorageError};

const USER_COLUMNS: &str = "id, display_name, color, avatar_url, version, created_at, updated_at";

backend_impl!(
    #[async_trait]
    impl<DB> ProfileStore for SqlApi<DB> {
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
    }
);

backend_impl!(
    impl<DB> SqlApi<DB> {
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
    }
);
