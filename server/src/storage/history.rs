//! The rows of a document's history (docs/history.md), on both databases: the attributed
//! log (`doc_updates.author`, `inserted`, `deleted`), the client ids mapped to their authors
//! (`doc_clients`), versions (`doc_versions`: the full state at a log position) and the prune
//! job with its persisted status (`jobs`).
//!
//! Content at log position N is rebuilt from a base, the newest of the snapshot and the
//! versions at or before N, plus the log rows after it up to N; a position whose rows are gone
//! (pruned, or deleted by a snapshot when no history is kept) is not retained.

use std::collections::HashMap;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sqlx::Row;

use super::dialect::backend_impl;
use super::{DocId, StorageError};

/// Why a version was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum VersionKind {
    /// At the end of an editing session, or hourly during a long one; pruned with the log.
    Auto,
    /// Asked for (`POST /versions`), with a label; kept until deleted.
    Named,
    /// The content a restore made; kept until deleted.
    Restore,
}

impl VersionKind {
    pub fn as_str(self) -> &'static str {
        match self {
            VersionKind::Auto => "auto",
            VersionKind::Named => "named",
            VersionKind::Restore => "restore",
        }
    }

    fn parse(s: &str) -> VersionKind {
        match s {
            "named" => VersionKind::Named,
            "restore" => VersionKind::Restore,
            _ => VersionKind::Auto,
        }
    }
}

/// A version to record.
#[derive(Debug, Clone)]
pub struct NewVersion {
    pub doc: DocId,
    /// The log position whose content `state` is.
    pub seq: i64,
    pub kind: VersionKind,
    pub label: Option<String>,
    pub author: Option<String>,
    /// The document's state at `seq`, Yjs v2.
    pub state: Vec<u8>,
    /// Milliseconds since the Unix epoch.
    pub created_at: i64,
}

/// A version as listed.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct Version {
    pub id: i64,
    /// The log position the version's content is at.
    pub seq: i64,
    pub kind: VersionKind,
    pub label: Option<String>,
    pub author: Option<String>,
    /// Milliseconds since the Unix epoch.
    pub created_at: i64,
}

/// One author's rows in a range of the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthorTotals {
    pub author: Option<String>,
    pub updates: i64,
    pub inserted: i64,
    pub deleted: i64,
    pub first_at: i64,
    pub last_at: i64,
}

/// What rebuilds the content at a log position: a base state and the log rows after it.
#[derive(Debug, Clone, Default)]
pub struct StateAt {
    /// The position.
    pub seq: i64,
    /// The snapshot's or a version's state (Yjs v2), `None` for the empty document.
    pub base: Option<Vec<u8>>,
    /// The log rows after the base up to `seq`, in order (Yjs v1).
    pub updates: Vec<Vec<u8>>,
}

/// What one run of the prune job did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PruneReport {
    pub docs: u64,
    pub rows: u64,
    pub versions: u64,
}

/// A background job's persisted status.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct JobStatus {
    pub name: String,
    /// `running`, `idle` (the last run finished) or `failed`.
    pub state: String,
    pub started_at: Option<i64>,
    pub finished_at: Option<i64>,
    pub runs: i64,
    /// Items the job has handled over all its runs (log rows and versions pruned).
    pub items: i64,
    pub last_error: Option<String>,
}

/// What deleting a version did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VersionDelete {
    Deleted,
    NotFound,
    /// The version is the base of the retained history: kept.
    InUse,
}

/// The prune job's name in `jobs`.
pub const PRUNE_JOB: &str = "history-prune";

/// A document's versions without their states, in order. On SQLite it reads only the
/// covering index of migration 0011: a column after a large `state` in the row is reached by
/// walking the state's overflow pages.
pub const VERSIONS_SQL: &str = "SELECT id, seq, kind, label, author, created_at FROM doc_versions \
                                WHERE doc_id = $1 ORDER BY seq, id";
/// One version without its state, from the same index (`+id` keeps SQLite from going to the
/// row by its rowid).
pub const VERSION_SQL: &str = "SELECT id, seq, kind, label, author, created_at FROM doc_versions \
                               WHERE doc_id = $1 AND +id = $2";

#[async_trait]
pub trait HistoryStore: Send + Sync {
    /// The document's versions, oldest first.
    async fn versions(&self, doc: DocId) -> Result<Vec<Version>, StorageError>;
    /// One version, without its state.
    async fn version(&self, doc: DocId, id: i64) -> Result<Option<Version>, StorageError>;
    /// Records a named or restore version if the document's named and restore versions,
    /// with this one, hold at most `budget` bytes of state (checked in the statement that
    /// writes it); `None` when they would hold more.
    async fn add_version_within(
        &self,
        version: NewVersion,
        budget: u64,
    ) -> Result<Option<i64>, StorageError>;
    /// Bytes of state the document's named and restore versions hold (what
    /// [`HistoryStore::add_version_within`] counts).
    async fn kept_version_bytes(&self, doc: DocId) -> Result<u64, StorageError>;
    /// One version with its state (Yjs v2).
    async fn version_state(
        &self,
        doc: DocId,
        id: i64,
    ) -> Result<Option<(Version, Vec<u8>)>, StorageError>;
    /// Deletes a version, unless the retained log starts right after it (the prune job made
    /// it the history's first base: without it the positions after it could not be rebuilt).
    async fn delete_version(&self, doc: DocId, id: i64) -> Result<VersionDelete, StorageError>;
    /// The positions below `before_seq` that start an editing session (the first retained
    /// row, or a row committed `gap_ms` or more after the one before it), newest first, at
    /// most `limit`; and the last position below `before_seq`.
    async fn session_starts(
        &self,
        doc: DocId,
        before_seq: i64,
        gap_ms: i64,
        limit: u32,
    ) -> Result<(Vec<i64>, Option<i64>), StorageError>;
    /// Per author, the rows from `first` to `last`: updates, units inserted and deleted,
    /// first and last commit time.
    async fn author_totals(
        &self,
        doc: DocId,
        first: i64,
        last: i64,
    ) -> Result<Vec<AuthorTotals>, StorageError>;
    /// The document's last log position (snapshot or log).
    async fn last_seq(&self, doc: DocId) -> Result<i64, StorageError>;
    /// What rebuilds the content at `seq` (at most the last position; `None`: the last
    /// position, found in the same read); `None` if the rows it needs are no longer retained.
    async fn state_at(&self, doc: DocId, seq: Option<i64>)
        -> Result<Option<StateAt>, StorageError>;
    /// Whether the content at `seq` can still be rebuilt (what [`HistoryStore::state_at`]
    /// would find), without reading it.
    async fn position_retained(&self, doc: DocId, seq: i64) -> Result<bool, StorageError>;
    /// The last log position committed at or before `at_ms` (0 before the first, if the
    /// history reaches back to it); `None` if that time is no longer retained.
    async fn position_at(&self, doc: DocId, at_ms: i64) -> Result<Option<i64>, StorageError>;
    /// The document's client ids and their authors.
    async fn authors(&self, doc: DocId) -> Result<HashMap<u64, String>, StorageError>;
    /// Deletes, in every document, the log rows and automatic versions older than `cutoff`
    /// that a newer base (a version older than `cutoff`, within the snapshot) makes
    /// unnecessary, and records the run in `jobs`.
    async fn prune_history(&self, cutoff: i64, now: i64) -> Result<PruneReport, StorageError>;
    /// A job's persisted status.
    async fn job(&self, name: &str) -> Result<Option<JobStatus>, StorageError>;
}

backend_impl!(
    #[async_trait]
    impl<DB> HistoryStore for SqlApi<DB> {
        async fn versions(&self, doc: DocId) -> Result<Vec<Version>, StorageError> {
            let rows = sqlx::query(VERSIONS_SQL)
                .bind(doc)
                .fetch_all(&self.pool)
                .await?;
            rows.iter().map(Self::version_row).collect()
        }

        async fn version(&self, doc: DocId, id: i64) -> Result<Option<Version>, StorageError> {
            let row = sqlx::query(VERSION_SQL)
                .bind(doc)
                .bind(id)
                .fetch_optional(&self.pool)
                .await?;
            row.as_ref().map(Self::version_row).transpose()
        }

        async fn kept_version_bytes(&self, doc: DocId) -> Result<u64, StorageError> {
            let bytes: i64 = sqlx::query_scalar(
                "SELECT COALESCE(SUM(LENGTH(state)), 0) FROM doc_versions \
                 WHERE doc_id = $1 AND kind <> 'auto'",
            )
            .bind(doc)
            .fetch_one(&self.pool)
            .await?;
            Ok(u64::try_from(bytes).unwrap_or(0))
        }

        async fn add_version_within(
            &self,
            v: NewVersion,
            budget: u64,
        ) -> Result<Option<i64>, StorageError> {
            let size = i64::try_from(v.state.len()).unwrap_or(i64::MAX);
            let budget = i64::try_from(budget).unwrap_or(i64::MAX);
            Ok(sqlx::query_scalar(
                "INSERT INTO doc_versions (doc_id, seq, kind, label, author, state, created_at) \
                 SELECT $1, $2, $3, $4, $5, $6, $7 \
                 WHERE (SELECT COALESCE(SUM(LENGTH(state)), 0) FROM doc_versions \
                        WHERE doc_id = $1 AND kind <> 'auto') + $8 <= $9 \
                 RETURNING id",
            )
            .bind(v.doc)
            .bind(v.seq)
            .bind(v.kind.as_str())
            .bind(v.label)
            .bind(v.author)
            .bind(v.state.as_slice())
            .bind(v.created_at)
            .bind(size)
            .bind(budget)
            .fetch_optional(&self.pool)
            .await?)
        }

        async fn version_state(
            &self,
            doc: DocId,
            id: i64,
        ) -> Result<Option<(Version, Vec<u8>)>, StorageError> {
            let row = sqlx::query(
                "SELECT id, seq, kind, label, author, created_at, state FROM doc_versions \
                 WHERE doc_id = $1 AND id = $2",
            )
            .bind(doc)
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
            match row {
                None => Ok(None),
                Some(row) => Ok(Some((Self::version_row(&row)?, row.try_get("state")?))),
            }
        }

        async fn delete_version(&self, doc: DocId, id: i64) -> Result<VersionDelete, StorageError> {
            // Serialized with the prune job per document (the document's row locked, as prune
            // locks it): under PostgreSQL's READ COMMITTED a prune making this version the base
            // could otherwise commit between this check and the delete. (SQLite has one writer.)
            let mut tx = self.pool.begin().await?;
            Self::lock_doc(&mut tx, doc).await?;
            // A version is the history's base when the log's first retained row follows it, rows
            // before it were pruned, and no other version stands at its position.
            let done = sqlx::query(
                "DELETE FROM doc_versions WHERE doc_id = $1 AND id = $2 AND NOT ( \
                   seq + 1 = (SELECT COALESCE(MIN(u.seq), -1) FROM doc_updates u \
                     WHERE u.doc_id = $1) \
                   AND seq > 0 \
                   AND NOT EXISTS (SELECT 1 FROM doc_versions o \
                     WHERE o.doc_id = $1 AND o.seq = doc_versions.seq AND o.id <> $2))",
            )
            .bind(doc)
            .bind(id)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            if DB::rows_affected(&done) > 0 {
                return Ok(VersionDelete::Deleted);
            }
            let exists: Option<i64> =
                sqlx::query_scalar("SELECT id FROM doc_versions WHERE doc_id = $1 AND id = $2")
                    .bind(doc)
                    .bind(id)
                    .fetch_optional(&self.pool)
                    .await?;
            Ok(match exists {
                Some(_) => VersionDelete::InUse,
                None => VersionDelete::NotFound,
            })
        }

        async fn session_starts(
            &self,
            doc: DocId,
            before_seq: i64,
            gap_ms: i64,
            limit: u32,
        ) -> Result<(Vec<i64>, Option<i64>), StorageError> {
            // Newest first along the primary key, each row checked against the one before it by
            // a key lookup: the scan stops at the `limit`th start, whatever the log's length.
            let starts: Vec<i64> = sqlx::query_scalar(
                "SELECT u.seq FROM doc_updates u \
                 WHERE u.doc_id = $1 AND u.seq < $2 AND NOT EXISTS ( \
                   SELECT 1 FROM doc_updates p \
                   WHERE p.doc_id = $1 AND p.seq = u.seq - 1 AND u.created_at - p.created_at < $3) \
                 ORDER BY u.seq DESC LIMIT $4",
            )
            .bind(doc)
            .bind(before_seq)
            .bind(gap_ms)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
            let last: Option<i64> = sqlx::query_scalar(
                "SELECT MAX(seq) FROM doc_updates WHERE doc_id = $1 AND seq < $2",
            )
            .bind(doc)
            .bind(before_seq)
            .fetch_one(&self.pool)
            .await?;
            Ok((starts, last))
        }

        async fn author_totals(
            &self,
            doc: DocId,
            first: i64,
            last: i64,
        ) -> Result<Vec<AuthorTotals>, StorageError> {
            let rows = sqlx::query(
                "SELECT author, COUNT(*) AS updates, CAST(SUM(inserted) AS BIGINT) AS inserted, \
                   CAST(SUM(deleted) AS BIGINT) AS deleted, MIN(created_at) AS first_at, MAX(created_at) AS last_at \
                 FROM doc_updates WHERE doc_id = $1 AND seq >= $2 AND seq <= $3 GROUP BY author",
            )
            .bind(doc)
            .bind(first)
            .bind(last)
            .fetch_all(&self.pool)
            .await?;
            rows.iter()
                .map(|r| {
                    Ok(AuthorTotals {
                        author: r.try_get("author")?,
                        updates: r.try_get("updates")?,
                        inserted: r.try_get::<Option<i64>, _>("inserted")?.unwrap_or(0),
                        deleted: r.try_get::<Option<i64>, _>("deleted")?.unwrap_or(0),
                        first_at: r.try_get::<Option<i64>, _>("first_at")?.unwrap_or(0),
                        last_at: r.try_get::<Option<i64>, _>("last_at")?.unwrap_or(0),
                    })
                })
                .collect()
        }

        async fn last_seq(&self, doc: DocId) -> Result<i64, StorageError> {
            let (snapshot_seq, last_row): (i64, Option<i64>) = sqlx::query_as(
                "SELECT snapshot_seq, (SELECT MAX(seq) FROM doc_updates WHERE doc_id = $1) \
                 FROM documents WHERE id = $1",
            )
            .bind(doc)
            .fetch_one(&self.pool)
            .await?;
            Ok(snapshot_seq.max(last_row.unwrap_or(0)))
        }

        async fn state_at(
            &self,
            doc: DocId,
            seq: Option<i64>,
        ) -> Result<Option<StateAt>, StorageError> {
            // One read snapshot: a snapshot or a prune committing between the statements would
            // otherwise take rows the base chosen first still needs.
            let mut tx = self.pool.begin_with(DB::BEGIN_READ_SNAPSHOT).await?;
            let (snapshot_seq, generation, last_row): (i64, Option<i64>, Option<i64>) =
                sqlx::query_as(
                    "SELECT snapshot_seq, snapshot_generation, \
                     (SELECT MAX(seq) FROM doc_updates WHERE doc_id = $1) \
                     FROM documents WHERE id = $1",
                )
                .bind(doc)
                .fetch_one(&mut *tx)
                .await?;
            let seq = seq.unwrap_or_else(|| snapshot_seq.max(last_row.unwrap_or(0)));
            let version: Option<(i64, i64)> = sqlx::query_as(
                "SELECT id, seq FROM doc_versions WHERE doc_id = $1 AND seq <= $2 \
                 ORDER BY seq DESC, id DESC LIMIT 1",
            )
            .bind(doc)
            .bind(seq)
            .fetch_optional(&mut *tx)
            .await?;
            let version_seq = version.map_or(-1, |(_, s)| s);
            let (base_seq, base) =
                if snapshot_seq <= seq && snapshot_seq > 0 && snapshot_seq >= version_seq {
                    (
                        snapshot_seq,
                        Self::read_snapshot(&mut tx, doc, generation).await?,
                    )
                } else if let Some((id, vseq)) = version {
                    let state: Vec<u8> =
                        sqlx::query_scalar("SELECT state FROM doc_versions WHERE id = $1")
                            .bind(id)
                            .fetch_one(&mut *tx)
                            .await?;
                    (vseq, Some(state))
                } else {
                    (0, None)
                };
            let rows: Vec<(i64, Vec<u8>)> = sqlx::query_as(
                "SELECT seq, data FROM doc_updates WHERE doc_id = $1 AND seq > $2 AND seq <= $3 \
                 ORDER BY seq",
            )
            .bind(doc)
            .bind(base_seq)
            .bind(seq)
            .fetch_all(&mut *tx)
            .await?;
            tx.commit().await?;
            // Positions are consecutive: a missing row is a pruned one.
            if rows.len() as i64 != seq - base_seq {
                return Ok(None);
            }
            Ok(Some(StateAt {
                seq,
                base,
                updates: rows.into_iter().map(|(_, data)| data).collect(),
            }))
        }

        async fn position_retained(&self, doc: DocId, seq: i64) -> Result<bool, StorageError> {
            // The same choice of base as `state_at`, in one read snapshot, counting the rows.
            let mut tx = self.pool.begin_with(DB::BEGIN_READ_SNAPSHOT).await?;
            let snapshot_seq: i64 =
                sqlx::query_scalar("SELECT snapshot_seq FROM documents WHERE id = $1")
                    .bind(doc)
                    .fetch_one(&mut *tx)
                    .await?;
            let version_seq: Option<i64> = sqlx::query_scalar(
                "SELECT seq FROM doc_versions WHERE doc_id = $1 AND seq <= $2 \
                 ORDER BY seq DESC, id DESC LIMIT 1",
            )
            .bind(doc)
            .bind(seq)
            .fetch_optional(&mut *tx)
            .await?;
            let version_seq = version_seq.unwrap_or(-1);
            let base_seq = if snapshot_seq <= seq && snapshot_seq > 0 && snapshot_seq >= version_seq
            {
                snapshot_seq
            } else {
                version_seq.max(0)
            };
            let rows: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM doc_updates WHERE doc_id = $1 AND seq > $2 AND seq <= $3",
            )
            .bind(doc)
            .bind(base_seq)
            .bind(seq)
            .fetch_one(&mut *tx)
            .await?;
            tx.commit().await?;
            Ok(rows == seq - base_seq)
        }

        async fn position_at(&self, doc: DocId, at_ms: i64) -> Result<Option<i64>, StorageError> {
            let (at, first): (Option<i64>, Option<i64>) = sqlx::query_as(
                "SELECT (SELECT MAX(seq) FROM doc_updates WHERE doc_id = $1 AND created_at <= $2), \
                        (SELECT MIN(seq) FROM doc_updates WHERE doc_id = $1)",
            )
            .bind(doc)
            .bind(at_ms)
            .fetch_one(&self.pool)
            .await?;
            Ok(match (at, first) {
                (Some(seq), _) => Some(seq),
                // Before the first edit, and the log reaches back to it: the empty document.
                (None, Some(1)) => Some(0),
                (None, _) => None,
            })
        }

        async fn authors(&self, doc: DocId) -> Result<HashMap<u64, String>, StorageError> {
            let rows: Vec<(i64, String)> =
                sqlx::query_as("SELECT client_id, author FROM doc_clients WHERE doc_id = $1")
                    .bind(doc)
                    .fetch_all(&self.pool)
                    .await?;
            Ok(rows.into_iter().map(|(c, a)| (c as u64, a)).collect())
        }

        async fn prune_history(&self, cutoff: i64, now: i64) -> Result<PruneReport, StorageError> {
            self.job_started(PRUNE_JOB, now).await?;
            let result = self.prune(cutoff).await;
            let finished = super::now_ms();
            match &result {
                Ok(report) => {
                    sqlx::query(
                        "UPDATE jobs SET state = 'idle', finished_at = $2, runs = runs + 1, \
                         items = items + $3, last_error = NULL WHERE name = $1",
                    )
                    .bind(PRUNE_JOB)
                    .bind(finished)
                    .bind((report.rows + report.versions) as i64)
                    .execute(&self.pool)
                    .await?;
                }
                Err(e) => {
                    sqlx::query(
                        "UPDATE jobs SET state = 'failed', finished_at = $2, runs = runs + 1, \
                         last_error = $3 WHERE name = $1",
                    )
                    .bind(PRUNE_JOB)
                    .bind(finished)
                    .bind(e.to_string())
                    .execute(&self.pool)
                    .await?;
                }
            }
            result
        }

        async fn job(&self, name: &str) -> Result<Option<JobStatus>, StorageError> {
            let row = sqlx::query(
                "SELECT name, state, started_at, finished_at, runs, items, last_error FROM jobs \
                 WHERE name = $1",
            )
            .bind(name)
            .fetch_optional(&self.pool)
            .await?;
            let Some(r) = row else {
                return Ok(None);
            };
            Ok(Some(JobStatus {
                name: r.try_get("name")?,
                state: r.try_get("state")?,
                started_at: r.try_get("started_at")?,
                finished_at: r.try_get("finished_at")?,
                runs: r.try_get("runs")?,
                items: r.try_get("items")?,
                last_error: r.try_get("last_error")?,
            }))
        }
    }
);

backend_impl!(
    impl<DB> SqlApi<DB> {
        async fn job_started(&self, name: &str, now: i64) -> Result<(), StorageError> {
            sqlx::query(
                "INSERT INTO jobs (name, state, started_at) VALUES ($1, 'running', $2) \
                 ON CONFLICT (name) DO UPDATE SET state = 'running', started_at = $2",
            )
            .bind(name)
            .bind(now)
            .execute(&self.pool)
            .await?;
            Ok(())
        }

        /// For each document, the newest version older than `cutoff` and within the snapshot
        /// becomes the history's first base: the log rows up to it and the automatic versions
        /// before it go. Each document in its own short transaction.
        async fn prune(&self, cutoff: i64) -> Result<PruneReport, StorageError> {
            let mut report = PruneReport::default();
            let mut after: i64 = 0;
            loop {
                // Only documents with something to delete: rows up to the base, or automatic
                // versions before it.
                let bases: Vec<(i64, Option<i64>)> = sqlx::query_as(
                    "SELECT b.id, b.base FROM ( \
                       SELECT d.id, (SELECT MAX(v.seq) FROM doc_versions v \
                         WHERE v.doc_id = d.id AND v.created_at < $2 AND v.seq <= d.snapshot_seq) \
                         AS base \
                       FROM documents d WHERE d.id > $1 \
                         AND NOT EXISTS (SELECT 1 FROM branches r \
                           WHERE r.doc_id = d.id AND r.state <> 'closed')) b \
                     WHERE b.base IS NOT NULL AND ( \
                       EXISTS (SELECT 1 FROM doc_updates u WHERE u.doc_id = b.id AND u.seq <= b.base) \
                       OR EXISTS (SELECT 1 FROM doc_versions o WHERE o.doc_id = b.id \
                         AND o.kind = 'auto' AND o.seq < b.base AND o.created_at < $2)) \
                     ORDER BY b.id LIMIT 500",
                )
                .bind(after)
                .bind(cutoff)
                .fetch_all(&self.pool)
                .await?;
                let Some((last, _)) = bases.last() else {
                    break;
                };
                after = *last;
                for (doc, base) in bases {
                    let Some(base) = base else { continue };
                    let mut tx = self.pool.begin().await?;
                    Self::lock_doc(&mut tx, doc).await?;
                    // Only while the base still stands (a version deleted meanwhile is no base).
                    let rows = sqlx::query(
                        "DELETE FROM doc_updates WHERE doc_id = $1 AND seq <= $2 \
                         AND EXISTS (SELECT 1 FROM doc_versions WHERE doc_id = $1 AND seq = $2)",
                    )
                    .bind(doc)
                    .bind(base)
                    .execute(&mut *tx)
                    .await?;
                    let versions = sqlx::query(
                        "DELETE FROM doc_versions WHERE doc_id = $1 AND kind = 'auto' \
                         AND seq < $2 AND created_at < $3",
                    )
                    .bind(doc)
                    .bind(base)
                    .bind(cutoff)
                    .execute(&mut *tx)
                    .await?;
                    tx.commit().await?;
                    let (rows, versions) = (DB::rows_affected(&rows), DB::rows_affected(&versions));
                    if rows + versions > 0 {
                        report.docs += 1;
                        report.rows += rows;
                        report.versions += versions;
                    }
                }
            }
            Ok(report)
        }

        /// Locks the document's row for the rest of the transaction (PostgreSQL; SQLite serializes
        /// every write anyway, and a read lock taken first would only have to be upgraded).
        async fn lock_doc(
            tx: &mut sqlx::Transaction<'_, DB>,
            doc: DocId,
        ) -> Result<(), StorageError> {
            if DB::LOCK_ROWS.is_empty() {
                return Ok(());
            }
            sqlx::query(&format!(
                "SELECT id FROM documents WHERE id = $1 {}",
                DB::LOCK_ROWS
            ))
            .bind(doc)
            .execute(&mut **tx)
            .await?;
            Ok(())
        }

        fn version_row(row: &DB::Row) -> Result<Version, StorageError> {
            let kind: String = row.try_get("kind")?;
            Ok(Version {
                id: row.try_get("id")?,
                seq: row.try_get("seq")?,
                kind: VersionKind::parse(&kind),
                label: row.try_get("label")?,
                author: row.try_get("author")?,
                created_at: row.try_get("created_at")?,
            })
        }
    }
);
