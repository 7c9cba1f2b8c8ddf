//! SQLite implementation of [`DocStore`], the embedded default.
//!
//! SQLite allows one writer at a time, so every write goes through a single writer task that
//! owns one connection and commits whatever requests are queued, from any number of documents,
//! in one transaction (group commit across rooms: one fsync covers them all). Each request runs
//! in its own savepoint, so one conflicting request fails alone. Reads (loads) use a small pool;
//! WAL mode lets them run beside the writer.
//!
//! This file opens the store and hands its writes to the writer task (`sqlite/writer.rs`),
//! which holds a commit open as its window (`commit_window.rs`) says.

mod writer;

use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous,
};
use sqlx::{Connection, Sqlite};
use tokio::sync::{mpsc, oneshot, Notify};

use self::writer::{writer_loop, WriteOp, WriteOutcome, WriteRequest, WRITE_QUEUE};
use super::commit_window::CommitWindowSettings;
pub use super::sql_api::EventSettings;
use super::sql_api::SqlApi;
use super::{
    DocId, DocStore, Epoch, LogEntry, SharedStatements, SnapshotBytes, SnapshotOutcome,
    StorageError,
};

/// How long a connection waits on SQLite's lock before giving up with SQLITE_BUSY.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);
/// Read connections: loads and readiness checks.
const READ_POOL_SIZE: u32 = 4;

/// The SQLite document store. Cheap to share behind an `Arc`.
pub struct SqliteStore {
    writer: mpsc::Sender<WriteRequest>,
    /// The API rows and the statements both databases share.
    pub(super) api: SqlApi<Sqlite>,
    /// Transactions the writer has committed (or tried to).
    transactions: Arc<AtomicU64>,
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `url` and applies the migrations.
    pub async fn connect(url: &str, sync: SqliteSynchronous) -> Result<SqliteStore, StorageError> {
        SqliteStore::connect_with_events(
            url,
            sync,
            EventSettings::default(),
            CommitWindowSettings::default(),
        )
        .await
    }

    /// [`SqliteStore::connect`], writing webhook events to the outbox as configured, with
    /// the writer's group-commit window.
    pub async fn connect_with_events(
        url: &str,
        sync: SqliteSynchronous,
        events: EventSettings,
        window: CommitWindowSettings,
    ) -> Result<SqliteStore, StorageError> {
        if !url.starts_with("sqlite:") {
            return Err(StorageError::UnsupportedUrl(crate::storage::redact_url(
                url,
            )));
        }
        let opts = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(sync)
            .busy_timeout(BUSY_TIMEOUT)
            .foreign_keys(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(READ_POOL_SIZE)
            .connect_with(opts.clone())
            .await?;
        migrate(&pool).await?;
        let conn = SqliteConnection::connect_with(&opts).await?;
        let (tx, rx) = mpsc::channel(WRITE_QUEUE);
        let events_written = Arc::new(Notify::new());
        let transactions = Arc::new(AtomicU64::new(0));
        tokio::spawn(writer_loop(
            conn,
            opts,
            rx,
            events_written.clone(),
            window,
            transactions.clone(),
        ));
        Ok(SqliteStore {
            api: SqlApi::new(pool, events, events_written),
            writer: tx,
            transactions,
        })
    }

    /// Transactions the writer has committed (or tried to) so far: with the requests made,
    /// how many shared each commit.
    pub fn transactions(&self) -> u64 {
        self.transactions.load(Ordering::Relaxed)
    }

    /// The store's API rows (metadata, access, idempotency keys, outbox), cheap to clone.
    pub fn api(&self) -> &SqlApi<Sqlite> {
        &self.api
    }

    async fn write(&self, op: WriteOp) -> Result<WriteOutcome, StorageError> {
        let (reply, rx) = oneshot::channel();
        self.writer
            .send(WriteRequest { op, reply })
            .await
            .map_err(|_| StorageError::Closed)?;
        rx.await.map_err(|_| StorageError::Closed)?
    }
}

/// Applies the embedded SQLite migrations.
pub async fn migrate(pool: &SqlitePool) -> Result<(), StorageError> {
    sqlx::migrate!("../migrations/sqlite").run(pool).await?;
    Ok(())
}

#[async_trait]
impl DocStore for SqliteStore {
    fn shared(&self) -> &dyn SharedStatements {
        &self.api
    }

    async fn append_log(
        &self,
        doc: DocId,
        fence: Option<Epoch>,
        first_seq: i64,
        updates: Vec<LogEntry>,
    ) -> Result<(), StorageError> {
        let event_debounce_ms = self.api.events.debounce_ms();
        self.write(WriteOp::Append {
            doc,
            fence,
            first_seq,
            updates,
            event_debounce_ms,
        })
        .await
        .map(|_| ())
    }

    async fn write_snapshot(
        &self,
        doc: DocId,
        fence: Option<Epoch>,
        expected_version: i64,
        snapshot: SnapshotBytes,
        upto_seq: i64,
    ) -> Result<SnapshotOutcome, StorageError> {
        match self
            .write(WriteOp::Snapshot {
                doc,
                fence,
                expected_version,
                snapshot,
                upto_seq,
                delete_covered: !self.api.keeps_history(),
            })
            .await?
        {
            WriteOutcome::Snapshot(outcome) => Ok(outcome),
            WriteOutcome::Appended | WriteOutcome::PartWritten => Err(StorageError::Closed),
        }
    }

    async fn write_snapshot_part(
        &self,
        doc: DocId,
        generation: i64,
        part: i64,
        bytes: Bytes,
    ) -> Result<(), StorageError> {
        self.write(WriteOp::SnapshotPart {
            doc,
            generation,
            part,
            bytes,
        })
        .await
        .map(|_| ())
    }
}

/// Store-level checks: the outbox view's two reads.
#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_outbox_view_reads_both_tables_in_one_snapshot() {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}/q.db", dir.path().display());
        let events = EventSettings {
            enabled: true,
            debounce: Duration::from_secs(1),
        };
        let store = SqliteStore::connect_with_events(
            &url,
            SqliteSynchronous::Normal,
            events,
            CommitWindowSettings::default(),
        )
        .await
        .expect("store");
        let store = store.api();
        crate::storage::api::checks::a_move_between_the_view_reads_shows_once(store, |between| {
            store.outbox_view_with(10, between)
        })
        .await;
    }
}
