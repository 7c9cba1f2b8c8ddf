//! PostgreSQL implementation of [`DocStore`], for deployments that already run PostgreSQL or
//! want the database on another machine. Same tables, same contracts as the SQLite store.
//!
//! PostgreSQL runs concurrent writers itself, so there is no single writer task. What is kept
//! from the SQLite design is group commit across rooms: appends go to a queue served by a few
//! writer tasks sharing one commit window (`commit_window.rs`); each takes every request
//! waiting (up to [`MAX_APPENDS_PER_TRANSACTION`]) and commits them with one statement outside
//! a transaction per group of up to 1,000 rows or 64 MiB (arrays bound as parameters; the log
//! rows only if every one may be written, their client ids and one outbox upsert), which
//! PostgreSQL commits whole or not at all: one round trip for a group (each writer keeps its
//! connection, which is not pinged while in steady use). If a group's statement writes nothing
//! (a taken log position, a stale fence) and it holds several requests, they run again in a
//! transaction with one savepoint per request, so only the failing request fails; so does a
//! batch with two requests of one document. A request over one statement's size runs in a
//! transaction of its own.
//!
//! Concurrency between writers (rooms, a second node, a stale owner) is settled by row locks:
//! - An append locks its documents' rows `FOR SHARE` in the statement that inserts the log rows
//!   and only inserts above each document's `snapshot_seq` as it is once locked (PostgreSQL
//!   re-reads a row that a concurrent transaction changed before locking it). The primary key
//!   `(doc_id, seq)` rejects a taken position (`23505`, reported as [`StorageError::Conflict`]).
//! - A snapshot is one `UPDATE documents ... WHERE id = $ AND snapshot_version = $` (which waits
//!   for appends holding the row and re-checks the version after a concurrent snapshot), then
//!   the `DELETE` of the covered rows, in one transaction. Snapshots do not go through the
//!   append queue.
//! - A load reads the snapshot and the log after it in one `REPEATABLE READ` transaction, the
//!   equivalent of SQLite's read transaction: both statements see the same committed state.
//!
//! This file opens the store (creating the database if need be) and writes snapshots; the
//! append queue and its writer tasks are in `postgres/writer.rs`.

mod writer;

use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use sqlx::migrate::MigrateDatabase;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::{Connection, Postgres};
use tokio::sync::{mpsc, oneshot, Mutex, Notify};

use self::writer::{writer_loop, AppendRequest, WriteQueue, WRITE_QUEUE};
use super::sql_api::{EventSettings, SqlApi};
use super::{
    DocId, DocStore, Epoch, LogEntry, SharedStatements, SnapshotBytes, SnapshotOutcome,
    StorageError,
};
use crate::storage::commit_window::CommitWindowSettings;

/// Writer tasks, each committing one batch at a time. While all are busy, requests queue up
/// and the next batches grow: group commit.
const WRITERS: usize = 4;
/// Connections in the pool: loads, snapshots and API requests share them (each writer keeps
/// one of its own besides, taken out of the pool: `writer.rs`).
const POOL_SIZE: u32 = 16;
/// How long an operation waits for a free connection before failing.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);
/// A pooled connection idle for longer than this is checked (a round trip) before it is
/// handed out, so one broken while idle (the server restarted) is replaced rather than
/// failing its next statement. One in steady use is not: sqlx's default checks every time,
/// a round trip more per append batch (the writers keep their connections, see `writer.rs`).
pub(super) const CHECK_IDLE_AFTER: Duration = Duration::from_secs(1);

/// SQLSTATE of "database does not exist".
const INVALID_CATALOG_NAME: &str = "3D000";
/// SQLSTATE of "database already exists" (two processes creating it at once).
const DUPLICATE_DATABASE: &str = "42P04";

/// True for the URL schemes this store accepts.
pub fn is_postgres_url(url: &str) -> bool {
    url.starts_with("postgres:") || url.starts_with("postgresql:")
}

/// The PostgreSQL document store. Cheap to share behind an `Arc`.
pub struct PgStore {
    writer: mpsc::Sender<AppendRequest>,
    /// Append batches the writers committed (tests).
    commits: Arc<AtomicU64>,
    /// The API rows and the statements both databases share.
    pub(super) api: SqlApi<Postgres>,
}

impl PgStore {
    /// Connects to the database at `url` (creating the database if it does not exist, as the
    /// SQLite store creates its file) and applies the migrations.
    pub async fn connect(url: &str) -> Result<PgStore, StorageError> {
        PgStore::connect_with_events(
            url,
            EventSettings::default(),
            CommitWindowSettings::default(),
        )
        .await
    }

    /// [`PgStore::connect`], writing webhook events to the outbox as configured, its writers
    /// holding commits open as `window` says (`writer.rs`).
    pub async fn connect_with_events(
        url: &str,
        events: EventSettings,
        window: CommitWindowSettings,
    ) -> Result<PgStore, StorageError> {
        if !is_postgres_url(url) {
            return Err(StorageError::UnsupportedUrl(crate::storage::redact_url(
                url,
            )));
        }
        // NOTICEs (such as the migrator's "relation already exists, skipping") are noise in
        // the server's log; warnings and errors still come through.
        let opts = PgConnectOptions::from_str(url)?.options([("client_min_messages", "warning")]);
        create_database_if_missing(url, &opts).await?;
        let pool = PgPoolOptions::new()
            .max_connections(POOL_SIZE)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for > CHECK_IDLE_AFTER {
                        conn.ping().await?;
                    }
                    Ok(true)
                })
            })
            .connect_with(opts)
            .await?;
        migrate(&pool).await?;
        let (tx, rx) = mpsc::channel(WRITE_QUEUE);
        let queue = Arc::new(Mutex::new(WriteQueue::new(rx, window)));
        let events_written = Arc::new(Notify::new());
        let commits = Arc::new(AtomicU64::new(0));
        for _ in 0..WRITERS {
            tokio::spawn(writer_loop(
                pool.clone(),
                queue.clone(),
                events_written.clone(),
                commits.clone(),
            ));
        }
        Ok(PgStore {
            api: SqlApi::new(pool, events, events_written),
            writer: tx,
            commits,
        })
    }

    /// The store's API rows (metadata, access, idempotency keys, outbox), cheap to clone.
    pub fn api(&self) -> &SqlApi<Postgres> {
        &self.api
    }

    /// Append batches committed so far (each one round trip, see `writer.rs`).
    pub fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }
}

/// Applies the embedded PostgreSQL migrations (the same versions as the SQLite ones).
pub async fn migrate(pool: &PgPool) -> Result<(), StorageError> {
    sqlx::migrate!("../migrations/postgres").run(pool).await?;
    Ok(())
}

/// Creates the database named in `url` if connecting says it does not exist.
async fn create_database_if_missing(
    url: &str,
    opts: &PgConnectOptions,
) -> Result<(), StorageError> {
    match PgConnection::connect_with(opts).await {
        Ok(conn) => {
            let _ = conn.close().await;
            Ok(())
        }
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some(INVALID_CATALOG_NAME) => {
            tracing::info!("database does not exist; creating it");
            match Postgres::create_database(url).await {
                Ok(()) => Ok(()),
                // Someone else created it meanwhile.
                Err(sqlx::Error::Database(e))
                    if e.code().as_deref() == Some(DUPLICATE_DATABASE)
                        || e.is_unique_violation() =>
                {
                    Ok(())
                }
                Err(e) => Err(e.into()),
            }
        }
        Err(e) => Err(e.into()),
    }
}

#[async_trait]
impl DocStore for PgStore {
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
        let (reply, rx) = oneshot::channel();
        self.writer
            .send(AppendRequest {
                doc,
                fence,
                first_seq,
                updates,
                event_debounce_ms,
                reply,
            })
            .await
            .map_err(|_| StorageError::Closed)?;
        rx.await.map_err(|_| StorageError::Closed)?
    }

    async fn write_snapshot(
        &self,
        doc: DocId,
        fence: Option<Epoch>,
        expected_version: i64,
        snapshot: SnapshotBytes,
        upto_seq: i64,
    ) -> Result<SnapshotOutcome, StorageError> {
        let mut tx = self.api.pool.begin().await?;
        let generation = snapshot.generation();
        // Waits for appends that hold the row; after a concurrent snapshot commits, the version
        // is checked again on the new row, so exactly one of two writers of version v wins.
        // With a fence, the lease row is locked and its epoch checked in the same statement:
        // a grant to another node waits for this transaction, or this one sees the new epoch.
        let new_version: Option<i64> = sqlx::query_scalar(
            "UPDATE documents SET snapshot_seq = $1, \
             snapshot_version = snapshot_version + 1, snapshot_generation = $5, \
             snapshot_at = (extract(epoch from clock_timestamp()) * 1000)::bigint \
             WHERE id = $2 AND snapshot_version = $3 \
               AND ($4::bigint IS NULL OR EXISTS ( \
                 SELECT 1 FROM room_leases WHERE doc_id = $2 AND epoch = $4 FOR SHARE)) \
             RETURNING snapshot_version",
        )
        .bind(upto_seq)
        .bind(doc)
        .bind(expected_version)
        .bind(fence)
        .bind(generation)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(new_version) = new_version else {
            let why =
                SqlApi::<Postgres>::why_refused(&mut tx, doc, fence, StorageError::Conflict).await;
            tx.rollback().await?;
            return match why {
                StorageError::Conflict => Ok(SnapshotOutcome::Conflict),
                e => Err(e),
            };
        };
        // Staged parts are checked once the version and fence have matched (a writer that lost
        // the race gets its conflict above, not this error); an error rolls the UPDATE back.
        SqlApi::<Postgres>::check_staged(&mut tx, doc, &snapshot).await?;
        // The snapshot's bytes live apart from the row, in parts (migrations/postgres/0008),
        // placed under the row lock the UPDATE above holds.
        SqlApi::<Postgres>::place_snapshot(
            &mut tx,
            doc,
            generation,
            &snapshot,
            upto_seq,
            !self.api.keeps_history(),
        )
        .await?;
        tx.commit().await?;
        Ok(SnapshotOutcome::Written { new_version })
    }

    async fn write_snapshot_part(
        &self,
        doc: DocId,
        generation: i64,
        part: i64,
        bytes: Bytes,
    ) -> Result<(), StorageError> {
        let mut conn = self.api.pool.acquire().await?;
        SqlApi::<Postgres>::insert_snapshot_part(&mut conn, doc, generation, part, &bytes).await
    }
}

/// Store-level checks against PostgreSQL, run when `QUIRE_TEST_DATABASE=postgres` (server at
/// `QUIRE_TEST_PG_URL`, as for the integration tests), each in a database of its own: the API
/// rows here, the batches a writer commits in `postgres/writer.rs`.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::api::{
        AccessStore, DocPatch, DocQuery, DocumentStore, IdempotencyStore, OutboxStore,
        RevocationStore, Versioned,
    };

    pub(super) struct TestDb {
        pub(super) store: PgStore,
        pub(super) admin: String,
        pub(super) name: String,
    }

    pub(super) async fn test_db(events: EventSettings) -> Option<TestDb> {
        test_db_with(events, CommitWindowSettings::default()).await
    }

    /// [`test_db`] with the writers' commit window `window`.
    pub(super) async fn test_db_with(
        events: EventSettings,
        window: CommitWindowSettings,
    ) -> Option<TestDb> {
        if !matches!(
            std::env::var("QUIRE_TEST_DATABASE").as_deref(),
            Ok("postgres") | Ok("postgresql")
        ) {
            eprintln!("not on PostgreSQL (QUIRE_TEST_DATABASE is not postgres): skipped");
            return None;
        }
        let admin = std::env::var("QUIRE_TEST_PG_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
        let base = admin.rsplit_once('/').map_or(admin.as_str(), |(b, _)| b);
        // `quire_t_<pid>_...`: the integration harness drops those of dead processes.
        let name = format!(
            "quire_t_{}_unit{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        );
        // The store creates the missing database itself.
        let store = PgStore::connect_with_events(&format!("{base}/{name}"), events, window)
            .await
            .expect("store");
        Some(TestDb { store, admin, name })
    }

    impl TestDb {
        pub(super) async fn drop_db(self) {
            self.store.api().pool().close().await;
            drop(self.store);
            let mut c = PgConnection::connect(&self.admin).await.expect("admin");
            sqlx::query(&format!("DROP DATABASE \"{}\" WITH (FORCE)", self.name))
                .execute(&mut c)
                .await
                .expect("drop database");
        }
    }

    #[tokio::test]
    async fn api_rows_behave_as_on_sqlite() {
        let events = EventSettings {
            enabled: true,
            debounce: Duration::from_secs(1),
        };
        let Some(db) = test_db(events).await else {
            return;
        };
        let s = db.store.api();
        for name in ["a", "a/b", "a/c", "ab", "b/é"] {
            s.create_doc(name, "", Some("ann"))
                .await
                .expect("create")
                .expect("new");
        }
        assert!(s.create_doc("a", "", None).await.expect("create").is_none());
        let names = |docs: Vec<crate::storage::api::DocMeta>| {
            docs.into_iter().map(|d| d.name).collect::<Vec<_>>()
        };
        let q = DocQuery {
            name_prefix: Some("a/".into()),
            limit: 10,
            ..DocQuery::default()
        };
        assert_eq!(names(s.list_docs(&q).await.expect("list")), ["a/b", "a/c"]);
        let q = DocQuery {
            owner: Some("ann".into()),
            limit: 2,
            ..DocQuery::default()
        };
        assert_eq!(names(s.list_docs(&q).await.expect("list")), ["a", "a/b"]);

        let a = s.get_doc_by_name("a").await.expect("get").expect("a");
        let patch = DocPatch {
            title: Some("T".into()),
            owner: Some("bo".into()),
        };
        let Versioned::Updated(a2) = s.update_doc(a.id, a.version, &patch).await.expect("up")
        else {
            panic!("not updated");
        };
        assert_eq!((a2.title.as_str(), a2.version), ("T", a.version + 1));
        assert!(matches!(
            s.update_doc(a.id, a.version, &patch).await.expect("up"),
            Versioned::Stale(_)
        ));
        let access = s.list_access(a.id).await.expect("access");
        assert_eq!(
            access,
            vec![
                ("ann".to_owned(), crate::storage::api::Role::Editor),
                ("bo".to_owned(), crate::storage::api::Role::Owner)
            ]
        );
        assert!(matches!(
            s.delete_doc(a.id).await.expect("delete"),
            Versioned::Updated(_)
        ));
        assert!(matches!(
            s.delete_doc(a.id).await.expect("delete"),
            Versioned::Stale(_)
        ));

        // Idempotency keys.
        use crate::storage::api::{IdemClaim, StoredResponse};
        let claim = |h: &'static str| s.idem_claim("p", "k", h, 10, 0);
        assert_eq!(claim("h").await.expect("claim"), IdemClaim::Started);
        assert_eq!(claim("h").await.expect("claim"), IdemClaim::InProgress);
        assert_eq!(claim("other").await.expect("claim"), IdemClaim::Mismatch);
        let response = StoredResponse {
            status: 201,
            headers: vec![("etag".into(), "\"1\"".into())],
            body: b"{}".to_vec(),
        };
        s.idem_finish("p", "k", &response).await.expect("finish");
        assert_eq!(
            claim("h").await.expect("claim"),
            IdemClaim::Replay(response)
        );
        assert_eq!(s.idem_cleanup(11).await.expect("cleanup"), 1);

        // Revocations: concurrent inserts, listed in id order, none skipped.
        let mut tasks = Vec::new();
        for i in 0..20 {
            tasks.push(s.revoke(None, Some(if i % 2 == 0 { "x" } else { "y" }), i));
        }
        let revoked = futures_util::future::join_all(tasks).await;
        assert!(revoked.iter().all(Result::is_ok));
        let listed = s.revocations_after(0).await.expect("list");
        assert_eq!(listed.len(), 20);
        assert!(listed.windows(2).all(|w| w[0].id < w[1].id));
        assert!(s.revoke(None, None, 1).await.is_err(), "CHECK constraint");

        // Outbox: created and deleted events; a dead letter moves only at its revision.
        let due = s.due_events(i64::MAX, 100).await.expect("due");
        assert_eq!(due.len(), 6, "five created, one deleted");
        let first = &due[0];
        s.event_failed(first.id, first.revision, &["u".into()], 5, "boom")
            .await
            .expect("failed");
        s.event_dead(first.id, first.revision + 1, "gone", 6)
            .await
            .expect("dead");
        assert!(s.outbox_view(10).await.expect("view").1.is_empty());
        s.event_dead(first.id, first.revision, "gone", 6)
            .await
            .expect("dead");
        let (_, dead) = s.outbox_view(10).await.expect("view");
        assert_eq!(dead.len(), 1);
        assert_eq!((dead[0].attempts, dead[0].died_at), (2, 6));
        let second = &due[1];
        s.event_delivered(second.id, second.revision, 7)
            .await
            .expect("delivered");
        let (listed, _) = s.outbox_view(100).await.expect("view");
        assert_eq!(listed.len(), 5);
        assert!(listed
            .iter()
            .any(|e| e.id == second.id && e.status == "delivered"));
        db.drop_db().await;
    }

    #[tokio::test]
    async fn the_outbox_view_reads_both_tables_in_one_snapshot() {
        let events = EventSettings {
            enabled: true,
            debounce: Duration::from_secs(1),
        };
        let Some(db) = test_db(events).await else {
            return;
        };
        let store = db.store.api();
        crate::storage::api::checks::a_move_between_the_view_reads_shows_once(store, |between| {
            store.outbox_view_with(10, between)
        })
        .await;
        db.drop_db().await;
    }
}
