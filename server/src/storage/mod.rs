//! Durable storage of documents: the [`DocStore`] trait and its implementations, SQLite
//! ([`sqlite`], the embedded default) and PostgreSQL ([`postgres`]), which share one schema
//! (`migrations/sqlite` and `migrations/postgres`, version for version).
//!
//! The contract every backend keeps:
//! - `append` writes a batch of log rows in one transaction; a sequence number that already
//!   exists is a [`StorageError::Conflict`] (another writer holds that log position) and nothing
//!   of the batch is written.
//! - `write_snapshot` replaces the snapshot and (when no history is kept) deletes the log rows
//!   it covers in one transaction, only if the document's `version` still equals the caller's;
//!   otherwise it returns [`SnapshotOutcome::Conflict`] and changes nothing. With
//!   `history_retention` the covered rows stay for the history (`history.rs` prunes them).
//!   A snapshot is stored in parts of at most [`SNAPSHOT_PART_BYTES`]; a large one is staged
//!   first (`stage_snapshot`, a short transaction per part, invisible to readers) so that the
//!   version-checked write that makes it the snapshot is small: a 20 MB snapshot in one
//!   transaction held SQLite's single writer, and so every document's commit, up to 90 ms.
//! - `load` reads the snapshot and the log after it from one consistent read snapshot.

pub mod api;
pub mod branches;
mod commit_window;
pub use commit_window::CommitWindowSettings;
mod dialect;
pub mod history;
pub mod postgres;
mod renewals;
pub mod set_aside;
mod snapshot_parts;
pub mod sql_api;
mod sql_docs;
pub mod sqlite;

use async_trait::async_trait;
use bytes::Bytes;

/// A document's metadata row (`ApiStore`, and the branch rows that name their documents).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct DocMeta {
    pub id: DocId,
    pub name: String,
    pub title: String,
    pub owner: Option<String>,
    /// Milliseconds since the Unix epoch.
    pub created_at: i64,
    pub updated_at: i64,
    pub deleted_at: Option<i64>,
    /// Row version, also sent as the `ETag`.
    pub version: i64,
}

/// Database identifier of a document.
pub type DocId = i64;

/// One update to append to a document's log, with what the history records of it.
#[derive(Debug, Clone, Default)]
pub struct LogEntry {
    /// The update as received (Yjs v1).
    pub data: Bytes,
    /// Who sent it: the token subject, or `anonymous@ADDRESS` in open mode; `None` for rows
    /// written without one (tools, tests).
    pub author: Option<std::sync::Arc<str>>,
    /// Content units (characters, elements, entries) it inserted and deleted.
    pub inserted: i64,
    pub deleted: i64,
    /// The yrs client ids it introduced (their first item), attributed to `author`.
    pub clients: Vec<u64>,
}

impl From<Bytes> for LogEntry {
    fn from(data: Bytes) -> LogEntry {
        LogEntry {
            data,
            ..LogEntry::default()
        }
    }
}

/// The `(doc_id, client_id, author, first_seq)` rows of `doc_clients` a batch of entries
/// appended at `first_seq..` introduces.
pub(crate) fn client_rows(
    doc: DocId,
    first_seq: i64,
    entries: &[LogEntry],
) -> Vec<(DocId, i64, String, i64)> {
    entries
        .iter()
        .enumerate()
        .flat_map(|(i, e)| {
            let author = e.author.as_deref().unwrap_or("").to_owned();
            e.clients
                .iter()
                .map(move |c| (doc, *c as i64, author.clone(), first_seq + i as i64))
        })
        .filter(|(_, _, author, _)| !author.is_empty())
        .collect()
}

/// What `load` returns: the latest snapshot and every log row after it, in order.
#[derive(Debug, Clone, Default)]
pub struct StoredDoc {
    pub id: DocId,
    /// Version guarding snapshot writes (not the metadata version).
    pub snapshot_version: i64,
    /// Soft-deleted documents are not served.
    pub deleted: bool,
    /// Yjs v2 encoded state covering log rows up to `snapshot_seq`.
    pub snapshot: Option<Vec<u8>>,
    pub snapshot_seq: i64,
    /// Log rows with `seq > snapshot_seq`, ascending, as `(seq, Yjs v1 update)`.
    pub updates: Vec<(i64, Vec<u8>)>,
}

impl StoredDoc {
    /// The highest sequence number the document has (snapshot or log).
    pub fn last_seq(&self) -> i64 {
        self.updates
            .last()
            .map(|(s, _)| *s)
            .unwrap_or(self.snapshot_seq)
    }

    /// Bytes held: snapshot plus log rows.
    pub fn stored_bytes(&self) -> u64 {
        let log: usize = self.updates.iter().map(|(_, u)| u.len()).sum();
        (self.snapshot.as_ref().map_or(0, Vec::len) + log) as u64
    }
}

/// The versions of the migrations this binary applies, ascending (the same for both
/// databases; `quire doctor` compares them with a database's).
pub fn migrations(postgres: bool) -> Vec<i64> {
    let migrator = if postgres {
        sqlx::migrate!("../migrations/postgres")
    } else {
        sqlx::migrate!("../migrations/sqlite")
    };
    migrator.iter().map(|m| m.version).collect()
}

/// Most bytes of one stored part of a snapshot (`doc_snapshot_parts`): the most one staging
/// transaction writes, so the longest another document's commit waits behind a snapshot.
pub const SNAPSHOT_PART_BYTES: usize = 1 << 20;

/// A snapshot's bytes, for [`DocStore::write_snapshot`].
#[derive(Debug, Clone)]
pub enum SnapshotBytes {
    /// Written in parts within the write's own transaction (small snapshots).
    Whole(Bytes),
    /// Written before by [`DocStore::stage_snapshot`]; the write checks that every part is
    /// there and makes the generation the snapshot.
    Staged(StagedSnapshot),
}

impl From<Vec<u8>> for SnapshotBytes {
    fn from(bytes: Vec<u8>) -> SnapshotBytes {
        SnapshotBytes::Whole(Bytes::from(bytes))
    }
}

/// The parts [`DocStore::stage_snapshot`] wrote: `parts` rows of `generation`, `len` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StagedSnapshot {
    pub generation: i64,
    pub parts: i64,
    pub len: i64,
}

/// A fresh generation for a snapshot's parts: random and positive (0 is a snapshot migrated
/// from before parts), so two writers, even of the same version, never share one.
pub(crate) fn new_generation() -> i64 {
    1 + (rand::random::<u64>() >> 2) as i64
}

/// `bytes` cut into parts of at most [`SNAPSHOT_PART_BYTES`], numbered from 0 (none for an
/// empty snapshot).
pub(crate) fn snapshot_parts(bytes: &Bytes) -> impl Iterator<Item = (i64, Bytes)> + '_ {
    (0..bytes.len().div_ceil(SNAPSHOT_PART_BYTES)).map(move |i| {
        let start = i * SNAPSHOT_PART_BYTES;
        let end = (start + SNAPSHOT_PART_BYTES).min(bytes.len());
        (i as i64, bytes.slice(start..end))
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotOutcome {
    /// Written; the document's version is now `new_version`.
    Written { new_version: i64 },
    /// The version did not match: someone else wrote first. Nothing was changed.
    Conflict,
}

#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("log position already taken (another writer appended first)")]
    Conflict,
    /// The write named a lease epoch that is no longer the document's: another node was
    /// granted the document since. Nothing was written; the writer must give the room up.
    #[error("fenced: the document's lease moved to another owner")]
    Fenced,
    /// The document is deleted (`deleted_at` is set): appends to it are refused by the
    /// statement that appends, so an owner that missed the delete writes nothing.
    #[error("the document is deleted")]
    Deleted,
    #[error("storage is shutting down")]
    Closed,
    /// The operation did not finish within the configured `storage_timeout` (it may still
    /// have taken effect: appends and snapshots are checked so that a retry is safe).
    #[error("storage did not answer within {after:?} ({op})")]
    Timeout {
        op: &'static str,
        after: std::time::Duration,
    },
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("unsupported database URL {0:?} (expected sqlite://... or postgres://...)")]
    UnsupportedUrl(String),
    #[error("stored data is invalid: {0}")]
    Invalid(String),
}

/// A lease epoch: the fencing token of one grant of a document's room to one node.
pub type Epoch = i64;

/// What asking for a document's lease gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseGrant {
    /// The lease is ours until it expires (unless renewed), under this epoch.
    Granted { epoch: Epoch },
    /// Another node holds a lease that has not expired.
    HeldBy {
        owner: String,
        epoch: Epoch,
        /// Milliseconds until it expires, by the database's clock.
        expires_in_ms: i64,
    },
}

/// The part of the [`DocStore`] contract whose statements are the same on both databases
/// (`sql_docs.rs`): a backend hands its implementation to [`DocStore::shared`].
#[async_trait]
pub trait SharedStatements: set_aside::SetAsideStore + Send + Sync {
    async fn load(&self, name: &str) -> Result<StoredDoc, StorageError>;
    async fn load_snapshot(&self, doc: DocId) -> Result<StoredDoc, StorageError>;
    async fn acquire_lease(
        &self,
        doc: DocId,
        node: &str,
        ttl: std::time::Duration,
    ) -> Result<LeaseGrant, StorageError>;
    async fn renew_lease(
        &self,
        doc: DocId,
        node: &str,
        epoch: Epoch,
        ttl: std::time::Duration,
    ) -> Result<bool, StorageError>;
    async fn release_lease(&self, doc: DocId, node: &str, epoch: Epoch)
        -> Result<(), StorageError>;
    /// Renews every lease of `leases` that `node` still holds under that epoch, for `ttl`,
    /// with one statement per 500; the ones renewed.
    async fn renew_leases(
        &self,
        node: &str,
        ttl: std::time::Duration,
        leases: &[(DocId, Epoch)],
    ) -> Result<Vec<(DocId, Epoch)>, StorageError>;
    async fn lease_owner(&self, doc: DocId) -> Result<Option<String>, StorageError>;
    async fn lease_owners(&self, docs: &[DocId]) -> Result<Vec<(DocId, String)>, StorageError>;
    async fn doc_id(&self, name: &str) -> Result<DocId, StorageError>;
    async fn ping(&self) -> Result<(), StorageError>;
    async fn add_version(&self, version: history::NewVersion) -> Result<i64, StorageError>;
}

#[async_trait]
pub trait DocStore: Send + Sync + 'static {
    /// The statements this store shares with the other backend; the provided methods below
    /// (load, leases, ping) run them.
    fn shared(&self) -> &dyn SharedStatements;

    /// Loads a document by name, creating its row if it does not exist yet.
    async fn load(&self, name: &str) -> Result<StoredDoc, StorageError> {
        self.shared().load(name).await
    }

    /// A document's snapshot alone (its version, position and bytes; no log rows), read in
    /// one database snapshot, by id: what a room that does not hold its snapshot in memory
    /// encodes the next one from. [`StorageError::Deleted`] if the row is gone.
    async fn load_snapshot(&self, doc: DocId) -> Result<StoredDoc, StorageError> {
        self.shared().load_snapshot(doc).await
    }

    /// Appends `entries` with sequence numbers `first_seq..`, all or nothing, with the
    /// `doc_clients` rows of the client ids they introduce. With a `fence`, the rows are
    /// written only if the document's lease epoch still equals it, checked in the statement
    /// that writes them; otherwise [`StorageError::Fenced`]. A deleted document takes no rows:
    /// [`StorageError::Deleted`].
    async fn append_log(
        &self,
        doc: DocId,
        fence: Option<Epoch>,
        first_seq: i64,
        entries: Vec<LogEntry>,
    ) -> Result<(), StorageError>;

    /// [`DocStore::append_log`] of updates without an author.
    async fn append(
        &self,
        doc: DocId,
        fence: Option<Epoch>,
        first_seq: i64,
        updates: Vec<Bytes>,
    ) -> Result<(), StorageError> {
        let entries = updates.into_iter().map(LogEntry::from).collect();
        self.append_log(doc, fence, first_seq, entries).await
    }

    /// Records a version: the document's full state (`state`, Yjs v2) at log position `seq`.
    async fn add_version(&self, version: history::NewVersion) -> Result<i64, StorageError> {
        self.shared().add_version(version).await
    }

    /// Writes a snapshot covering the log up to `upto_seq` if the version still matches (and,
    /// with a `fence`, the lease epoch too: otherwise [`StorageError::Fenced`]). A staged
    /// snapshot missing a part is [`StorageError::Invalid`] and changes nothing.
    async fn write_snapshot(
        &self,
        doc: DocId,
        fence: Option<Epoch>,
        expected_version: i64,
        snapshot: SnapshotBytes,
        upto_seq: i64,
    ) -> Result<SnapshotOutcome, StorageError>;

    /// Writes one part of a staged snapshot in a transaction of its own.
    async fn write_snapshot_part(
        &self,
        doc: DocId,
        generation: i64,
        part: i64,
        bytes: Bytes,
    ) -> Result<(), StorageError>;

    /// Writes `snapshot` in parts under a new generation, one part at a time, each in a
    /// transaction of its own, so that other writes commit between them. Nothing reads the
    /// parts until [`DocStore::write_snapshot`] names them; parts of a snapshot never named
    /// are deleted by the document's next snapshot.
    async fn stage_snapshot(
        &self,
        doc: DocId,
        snapshot: Bytes,
    ) -> Result<StagedSnapshot, StorageError> {
        let generation = new_generation();
        let mut parts = 0;
        for (part, bytes) in snapshot_parts(&snapshot) {
            self.write_snapshot_part(doc, generation, part, bytes)
                .await?;
            parts += 1;
        }
        Ok(StagedSnapshot {
            generation,
            parts,
            len: snapshot.len() as i64,
        })
    }

    /// Grants `node` the document's lease for `ttl` if nobody else holds an unexpired one (a
    /// node restarted under the same name takes its own leases back at once); every grant
    /// increments the epoch (the fencing token), which fences any earlier holder.
    async fn acquire_lease(
        &self,
        doc: DocId,
        node: &str,
        ttl: std::time::Duration,
    ) -> Result<LeaseGrant, StorageError> {
        self.shared().acquire_lease(doc, node, ttl).await
    }

    /// Extends `node`'s lease under `epoch` by `ttl` from now; false if the epoch moved on
    /// (another node was granted the document).
    async fn renew_lease(
        &self,
        doc: DocId,
        node: &str,
        epoch: Epoch,
        ttl: std::time::Duration,
    ) -> Result<bool, StorageError> {
        self.shared().renew_lease(doc, node, epoch, ttl).await
    }

    /// Ends `node`'s lease under `epoch` now, so the next node may take the document at once.
    async fn release_lease(
        &self,
        doc: DocId,
        node: &str,
        epoch: Epoch,
    ) -> Result<(), StorageError> {
        self.shared().release_lease(doc, node, epoch).await
    }

    /// The node holding the document's unexpired lease, if any (reads only: grants nothing).
    async fn lease_owner(&self, doc: DocId) -> Result<Option<String>, StorageError> {
        self.shared().lease_owner(doc).await
    }

    /// The holders of the unexpired leases among `docs`, in one statement.
    async fn lease_owners(&self, docs: &[DocId]) -> Result<Vec<(DocId, String)>, StorageError> {
        self.shared().lease_owners(docs).await
    }

    /// The document's id, creating its row if it has none (like [`DocStore::load`], without
    /// reading its content).
    async fn doc_id(&self, name: &str) -> Result<DocId, StorageError> {
        self.shared().doc_id(name).await
    }

    /// Checks that the database answers (for `/readyz`).
    async fn ping(&self) -> Result<(), StorageError> {
        self.shared().ping().await
    }
}

/// `url` with any password replaced by `***`, for logs and error messages.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, tail) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _password)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

/// A copy of `e` for every request of a batch that failed as a whole (`sqlx::Error` is not
/// `Clone`).
fn clone_err(e: &sqlx::Error) -> sqlx::Error {
    sqlx::Error::Protocol(e.to_string())
}

/// Adds `first` and then whatever requests are already queued to `batch`, up to `max` in all:
/// what a writer task commits together (both backends' group commit).
fn take_queued<T>(
    first: T,
    rx: &mut tokio::sync::mpsc::Receiver<T>,
    batch: &mut Vec<T>,
    max: usize,
) {
    batch.push(first);
    while batch.len() < max {
        match rx.try_recv() {
            Ok(req) => batch.push(req),
            Err(_) => break,
        }
    }
}

/// Sends each request of a committed batch its own result, or, when the commit failed as a
/// whole, the error (logged once) to every one; false in that case.
fn answer_batch<R>(
    replies: impl Iterator<Item = tokio::sync::oneshot::Sender<Result<R, StorageError>>>,
    committed: Result<Vec<Result<R, StorageError>>, sqlx::Error>,
) -> bool {
    match committed {
        Ok(results) => {
            for (reply, result) in replies.zip(results) {
                let _ = reply.send(result);
            }
            true
        }
        Err(e) => {
            tracing::error!(error = %e, "commit failed; the batch is not durable");
            for reply in replies {
                let _ = reply.send(Err(StorageError::Database(clone_err(&e))));
            }
            false
        }
    }
}

/// Milliseconds since the Unix epoch, for `created_at` columns.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod redact_tests {
    use super::redact_url;

    #[test]
    fn passwords_never_reach_logs() {
        assert_eq!(
            redact_url("postgres://quire:s3cret@db:5432/quire"),
            "postgres://quire:***@db:5432/quire"
        );
        assert_eq!(
            redact_url("postgres://quire@db/quire"),
            "postgres://quire@db/quire"
        );
        assert_eq!(redact_url("sqlite://quire.db"), "sqlite://quire.db");
        assert_eq!(redact_url("postgres://u:p@w@h/db"), "postgres://u:***@h/db");
    }
}

#[cfg(test)]
mod tests {
    /// `(version, description)` of every migration, as sqlx sees them.
    fn listed(migrator: &sqlx::migrate::Migrator) -> Vec<(i64, String)> {
        migrator
            .iter()
            .map(|m| (m.version, m.description.to_string()))
            .collect()
    }

    #[test]
    fn both_backends_have_the_same_migrations() {
        let sqlite = listed(&sqlx::migrate!("../migrations/sqlite"));
        let postgres = listed(&sqlx::migrate!("../migrations/postgres"));
        assert!(!sqlite.is_empty());
        assert_eq!(sqlite, postgres);
        // The files themselves, in case the folders hold something sqlx would skip.
        let files = |backend: &str| {
            let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../migrations")
                .join(backend);
            let mut names: Vec<String> = std::fs::read_dir(&dir)
                .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
                .map(|e| {
                    e.expect("directory entry")
                        .file_name()
                        .to_string_lossy()
                        .into_owned()
                })
                .collect();
            names.sort();
            names
        };
        assert_eq!(files("sqlite"), files("postgres"));
    }
}
