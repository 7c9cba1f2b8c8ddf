//! Document metadata (`documents`): create (with the owner's access row and, for a fork, the
//! first log row), read, list, versioned update, soft delete and restore.

use sqlx::Row;

use crate::storage::api::{DocMeta, DocPatch, DocQuery, Versioned};
use async_trait::async_trait;

use crate::storage::api::DocumentStore;
use crate::storage::dialect::backend_impl;
use crate::storage::{client_rows, now_ms, DocId, LogEntry, StorageError};

const DOC_COLUMNS: &str = "id, name, title, owner, created_at, updated_at, deleted_at, version";

backend_impl!(
    #[async_trait]
    impl<DB> DocumentStore for SqlApi<DB> {
        async fn create_doc_with(
            &self,
            name: &str,
            title: &str,
            owner: Option<&str>,
            first: Option<LogEntry>,
        ) -> Result<Option<DocMeta>, StorageError> {
            self.create_doc_as(name, title, owner, first, None).await
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
    }
);

backend_impl!(
    impl<DB> SqlApi<DB> {
        /// [`SqlApi::create_doc_with`], the new document made a branch of `branch`'s parent
        /// at its base position in the same transaction, with the parent's access entries.
        pub(in crate::storage) async fn create_doc_as(
            &self,
            name: &str,
            title: &str,
            owner: Option<&str>,
            first: Option<LogEntry>,
            branch: Option<(DocId, i64)>,
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
            if let Some((parent, base_seq)) = branch {
                sqlx::query(
                    "INSERT INTO branches (doc_id, parent_id, base_seq, author, created_at) \
                     VALUES ($1, $2, $3, $4, $5)",
                )
                .bind(doc.id)
                .bind(parent)
                .bind(base_seq)
                .bind(owner)
                .bind(now)
                .execute(&mut *tx)
                .await?;
                sqlx::query(
                    "INSERT INTO document_access (doc_id, user_id, role) \
                     SELECT $1, user_id, role FROM document_access WHERE doc_id = $2 \
                     ON CONFLICT (doc_id, user_id) DO NOTHING",
                )
                .bind(doc.id)
                .bind(parent)
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
                for (doc_id, client, author, seq) in client_rows(doc.id, 1, &[first]) {
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
