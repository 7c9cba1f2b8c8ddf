//! The rows of branches (docs/branches.md), on both databases: which document is a branch of
//! which, at what base (`branches`), the fate of each change (`branch_decisions`, appended
//! once per change) and the parent's changes brought into a branch (`branch_pulls`).

use async_trait::async_trait;
use serde::Serialize;
use sqlx::Row;

use super::dialect::backend_impl;
use super::DocMeta;
use super::{DocId, LogEntry, StorageError};

/// A branch as stored, with its and its parent's names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BranchRow {
    pub doc_id: DocId,
    pub name: String,
    pub parent_id: DocId,
    pub parent: String,
    pub base_seq: i64,
    /// `open`, `merged` or `closed`.
    pub state: String,
    pub author: Option<String>,
    pub created_at: i64,
    pub version: i64,
}

/// A change's fate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    Merged,
    Rejected,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Merged => "merged",
            Decision::Rejected => "rejected",
        }
    }
}

/// A decision as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecisionRow {
    pub change_id: i64,
    pub last_seq: i64,
    pub decision: Decision,
    pub decided_by: Option<String>,
    pub parent_seq: Option<i64>,
    pub created_at: i64,
}

/// One log row of a branch, for grouping into changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BranchLogRow {
    pub seq: i64,
    pub data: Vec<u8>,
    pub author: Option<String>,
    pub created_at: i64,
    pub inserted: i64,
    pub deleted: i64,
}

/// What a branch's review reads in one database snapshot.
#[derive(Debug, Clone, Default)]
pub struct BranchLog {
    /// Every log row from position 1 (the content at the base) on; `None` if some are no
    /// longer retained.
    pub rows: Option<Vec<BranchLogRow>>,
    pub decisions: Vec<DecisionRow>,
    /// Branch positions holding the parent's changes.
    pub pulls: Vec<i64>,
}

#[async_trait]
pub trait BranchStore: Send + Sync {
    /// Creates document `name` as a branch of `parent` at `base_seq`, holding `first` (the
    /// parent's content there) as its first row, owned by `owner` and with the parent's access
    /// entries, in one transaction. `Ok(None)` if the name is taken.
    async fn create_branch(
        &self,
        name: &str,
        title: &str,
        owner: &str,
        parent: DocId,
        base_seq: i64,
        first: LogEntry,
    ) -> Result<Option<DocMeta>, StorageError>;
    /// The branch whose document is `doc`, if it is one.
    async fn branch(&self, doc: DocId) -> Result<Option<BranchRow>, StorageError>;
    /// The first 200 branches of `parent`, oldest first (deleted documents left out).
    async fn branches_of(&self, parent: DocId) -> Result<Vec<BranchRow>, StorageError>;
    /// Sets the branch's state if its version is still `expected`; the row after, or `None`
    /// when the version moved (optimistic check).
    async fn set_branch_state(
        &self,
        doc: DocId,
        expected: i64,
        state: &str,
    ) -> Result<Option<BranchRow>, StorageError>;
    /// The branch's rows, decisions and pulls, read in one snapshot; the rows without their
    /// data unless `with_data` (enough to group them into changes).
    async fn branch_log(&self, doc: DocId, with_data: bool) -> Result<BranchLog, StorageError>;
    /// Records a change's fate unless one is recorded; the recorded one.
    async fn decide(&self, doc: DocId, row: DecisionRow) -> Result<DecisionRow, StorageError>;
    /// Records that branch position `branch_seq` holds the parent's changes up to `parent_seq`;
    /// `None`: the branch had them all already (nothing was written to it), it is up to date
    /// with `parent_seq` all the same (kept under the key `-parent_seq`, no log position).
    async fn record_pull(
        &self,
        doc: DocId,
        branch_seq: Option<i64>,
        parent_seq: i64,
        by: &str,
    ) -> Result<(), StorageError>;
    /// How many changes of the branch are decided (merged or rejected).
    async fn decided_count(&self, doc: DocId) -> Result<i64, StorageError>;
    /// The parent position the branch last took the parent's changes at (its base, or its
    /// last pull, written or not), and how many of its log rows hold the parent's changes.
    async fn synced(&self, doc: DocId) -> Result<(i64, i64), StorageError>;
}

const BRANCH_COLUMNS: &str = "b.doc_id, d.name, b.parent_id, p.name AS parent, b.base_seq, \
    b.state, b.author, b.created_at, b.version";
const BRANCH_FROM: &str =
    "branches b JOIN documents d ON d.id = b.doc_id JOIN documents p ON p.id = b.parent_id";

backend_impl!(
    #[async_trait]
    impl<DB> BranchStore for SqlApi<DB> {
        async fn create_branch(
            &self,
            name: &str,
            title: &str,
            owner: &str,
            parent: DocId,
            base_seq: i64,
            first: LogEntry,
        ) -> Result<Option<DocMeta>, StorageError> {
            self.create_doc_as(
                name,
                title,
                Some(owner),
                Some(first),
                Some((parent, base_seq)),
            )
            .await
        }

        async fn branch(&self, doc: DocId) -> Result<Option<BranchRow>, StorageError> {
            let row = sqlx::query(&format!(
                "SELECT {BRANCH_COLUMNS} FROM {BRANCH_FROM} WHERE b.doc_id = $1"
            ))
            .bind(doc)
            .fetch_optional(&self.pool)
            .await?;
            row.as_ref().map(Self::branch_row).transpose()
        }

        async fn branches_of(&self, parent: DocId) -> Result<Vec<BranchRow>, StorageError> {
            let rows = sqlx::query(&format!(
                "SELECT {BRANCH_COLUMNS} FROM {BRANCH_FROM} \
                 WHERE b.parent_id = $1 AND d.deleted_at IS NULL ORDER BY b.doc_id LIMIT 200"
            ))
            .bind(parent)
            .fetch_all(&self.pool)
            .await?;
            rows.iter().map(Self::branch_row).collect()
        }

        async fn set_branch_state(
            &self,
            doc: DocId,
            expected: i64,
            state: &str,
        ) -> Result<Option<BranchRow>, StorageError> {
            let done = sqlx::query(
                "UPDATE branches SET state = $1, version = version + 1 \
                 WHERE doc_id = $2 AND version = $3",
            )
            .bind(state)
            .bind(doc)
            .bind(expected)
            .execute(&self.pool)
            .await?;
            if DB::rows_affected(&done) == 0 {
                return Ok(None);
            }
            self.branch(doc).await
        }

        async fn branch_log(&self, doc: DocId, with_data: bool) -> Result<BranchLog, StorageError> {
            let mut tx = self.pool.begin_with(DB::BEGIN_READ_SNAPSHOT).await?;
            let data = if with_data { "data" } else { "NULL AS data" };
            let rows = sqlx::query(&format!(
                "SELECT seq, {data}, author, created_at, inserted, deleted FROM doc_updates \
                 WHERE doc_id = $1 ORDER BY seq"
            ))
            .bind(doc)
            .fetch_all(&mut *tx)
            .await?;
            let rows = rows
                .iter()
                .map(|r| {
                    Ok(BranchLogRow {
                        seq: r.try_get("seq")?,
                        data: r.try_get::<Option<Vec<u8>>, _>("data")?.unwrap_or_default(),
                        author: r.try_get("author")?,
                        created_at: r.try_get("created_at")?,
                        inserted: r.try_get("inserted")?,
                        deleted: r.try_get("deleted")?,
                    })
                })
                .collect::<Result<Vec<_>, sqlx::Error>>()?;
            let decisions = sqlx::query(
                "SELECT change_id, last_seq, decision, decided_by, parent_seq, created_at \
                 FROM branch_decisions WHERE branch_id = $1 ORDER BY change_id",
            )
            .bind(doc)
            .fetch_all(&mut *tx)
            .await?
            .iter()
            .map(Self::decision_row)
            .collect::<Result<Vec<_>, _>>()?;
            let pulls: Vec<i64> = sqlx::query_scalar(
                "SELECT branch_seq FROM branch_pulls WHERE branch_id = $1 AND branch_seq > 0 \
                 ORDER BY branch_seq",
            )
            .bind(doc)
            .fetch_all(&mut *tx)
            .await?;
            tx.commit().await?;
            // Positions are consecutive from 1: a missing row is a pruned one.
            let whole = rows.iter().enumerate().all(|(i, r)| r.seq == i as i64 + 1);
            Ok(BranchLog {
                rows: whole.then_some(rows),
                decisions,
                pulls,
            })
        }

        async fn decide(&self, doc: DocId, row: DecisionRow) -> Result<DecisionRow, StorageError> {
            sqlx::query(
                "INSERT INTO branch_decisions \
                 (branch_id, change_id, last_seq, decision, decided_by, parent_seq, created_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7) \
                 ON CONFLICT (branch_id, change_id) DO NOTHING",
            )
            .bind(doc)
            .bind(row.change_id)
            .bind(row.last_seq)
            .bind(row.decision.as_str())
            .bind(&row.decided_by)
            .bind(row.parent_seq)
            .bind(row.created_at)
            .execute(&self.pool)
            .await?;
            let stored = sqlx::query(
                "SELECT change_id, last_seq, decision, decided_by, parent_seq, created_at \
                 FROM branch_decisions WHERE branch_id = $1 AND change_id = $2",
            )
            .bind(doc)
            .bind(row.change_id)
            .fetch_one(&self.pool)
            .await?;
            Self::decision_row(&stored)
        }

        async fn record_pull(
            &self,
            doc: DocId,
            branch_seq: Option<i64>,
            parent_seq: i64,
            by: &str,
        ) -> Result<(), StorageError> {
            let branch_seq = branch_seq.unwrap_or(-parent_seq);
            sqlx::query(
                "INSERT INTO branch_pulls (branch_id, branch_seq, parent_seq, pulled_by, created_at) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (branch_id, branch_seq) DO NOTHING",
            )
            .bind(doc)
            .bind(branch_seq)
            .bind(parent_seq)
            .bind(by)
            .bind(super::now_ms())
            .execute(&self.pool)
            .await?;
            Ok(())
        }

        async fn decided_count(&self, doc: DocId) -> Result<i64, StorageError> {
            let n: i64 = sqlx::query_scalar(
                "SELECT CAST(COUNT(*) AS BIGINT) FROM branch_decisions WHERE branch_id = $1",
            )
            .bind(doc)
            .fetch_one(&self.pool)
            .await?;
            Ok(n)
        }

        async fn synced(&self, doc: DocId) -> Result<(i64, i64), StorageError> {
            let (seq, pulls): (Option<i64>, i64) = sqlx::query_as(
                "SELECT MAX(s), COALESCE(SUM(r), 0) FROM ( \
                   SELECT base_seq AS s, 0 AS r FROM branches WHERE doc_id = $1 \
                   UNION ALL SELECT parent_seq AS s, CASE WHEN branch_seq > 0 THEN 1 ELSE 0 END AS r \
                   FROM branch_pulls WHERE branch_id = $1) x",
            )
            .bind(doc)
            .fetch_one(&self.pool)
            .await?;
            Ok((seq.unwrap_or(0), pulls.max(0)))
        }
    }
);

backend_impl!(
    impl<DB> SqlApi<DB> {
        fn branch_row(row: &DB::Row) -> Result<BranchRow, StorageError> {
            Ok(BranchRow {
                doc_id: row.try_get("doc_id")?,
                name: row.try_get("name")?,
                parent_id: row.try_get("parent_id")?,
                parent: row.try_get("parent")?,
                base_seq: row.try_get("base_seq")?,
                state: row.try_get("state")?,
                author: row.try_get("author")?,
                created_at: row.try_get("created_at")?,
                version: row.try_get("version")?,
            })
        }

        fn decision_row(row: &DB::Row) -> Result<DecisionRow, StorageError> {
            let decision: String = row.try_get("decision")?;
            Ok(DecisionRow {
                change_id: row.try_get("change_id")?,
                last_seq: row.try_get("last_seq")?,
                decision: if decision == "merged" {
                    Decision::Merged
                } else {
                    Decision::Rejected
                },
                decided_by: row.try_get("decided_by")?,
                parent_seq: row.try_get("parent_seq")?,
                created_at: row.try_get("created_at")?,
            })
        }
    }
);
