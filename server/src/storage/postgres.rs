//! PostgreSQL implementation of [`DocStore`], for deployments that already run PostgreSQL or
//! want the database on another machine. Same tables, same contracts as the SQLite store.
//!
//! PostgreSQL runs concurrent writers itself, so there is no single writer task. What is kept
//! from the SQLite design is group commit across rooms: appends go to a queue served by a few
//! writer tasks; each takes every request waiting (up to [`MAX_APPENDS_PER_TRANSACTION`]) and
//! commits them in one transaction with one multi-row INSERT (arrays bound as parameters) and
//! one outbox upsert. If anything in that transaction fails (a taken log position), it is rolled
//! back and the batch runs again with one savepoint per request, so only the failing request
//! fails. A lone request runs directly in its own transaction.
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

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use sqlx::migrate::MigrateDatabase;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::{Connection, Postgres};
use tokio::sync::{mpsc, oneshot, Mutex, Notify};

use super::sql_api::SqlApi;
use super::sqlite::EventSettings;
use super::{
    client_rows, clone_err, now_ms, DocId, DocStore, Epoch, LogEntry, SharedStatements,
    SnapshotBytes, SnapshotOutcome, StorageError,
};

/// Most append requests folded into one transaction.
const MAX_APPENDS_PER_TRANSACTION: usize = 512;
/// Queue of append requests waiting for a writer. Rooms wait (backpressure) when it is full.
const WRITE_QUEUE: usize = 4096;
/// Writer tasks, each committing one batch at a time. While all are busy, requests queue up
/// and the next batches grow: group commit.
const WRITERS: usize = 4;
/// Connections in the pool: the writers, loads, snapshots and API requests share them.
const POOL_SIZE: u32 = 16;
/// How long an operation waits for a free connection before failing.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);
/// Most log rows (and bytes) bound to one INSERT statement.
const ROWS_PER_INSERT: usize = 1000;
const BYTES_PER_INSERT: usize = 64 << 20;

/// SQLSTATE of "database does not exist".
const INVALID_CATALOG_NAME: &str = "3D000";
/// SQLSTATE of "database already exists" (two processes creating it at once).
const DUPLICATE_DATABASE: &str = "42P04";

/// True for the URL schemes this store accepts.
pub fn is_postgres_url(url: &str) -> bool {
    url.starts_with("postgres:") || url.starts_with("postgresql:")
}

struct AppendRequest {
    doc: DocId,
    fence: Option<Epoch>,
    first_seq: i64,
    updates: Vec<LogEntry>,
    /// Fold a `document.updated` event into the outbox, available after this many ms.
    event_debounce_ms: Option<i64>,
    reply: oneshot::Sender<Result<(), StorageError>>,
}

impl AppendRequest {
    fn last_seq(&self) -> i64 {
        self.first_seq + self.updates.len() as i64 - 1
    }
}

/// The PostgreSQL document store. Cheap to share behind an `Arc`.
pub struct PgStore {
    writer: mpsc::Sender<AppendRequest>,
    /// The API rows and the statements both databases share.
    pub(super) api: SqlApi<Postgres>,
}

impl PgStore {
    /// Connects to the database at `url` (creating the database if it does not exist, as the
    /// SQLite store creates its file) and applies the migrations.
    pub async fn connect(url: &str) -> Result<PgStore, StorageError> {
        PgStore::connect_with_events(url, EventSettings::default()).await
    }

    /// [`PgStore::connect`], writing webhook events to the outbox as configured.
    pub async fn connect_with_events(
        url: &str,
        events: EventSettings,
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
            .connect_with(opts)
            .await?;
        migrate(&pool).await?;
        let (tx, rx) = mpsc::channel(WRITE_QUEUE);
        let rx = Arc::new(Mutex::new(rx));
        let events_written = Arc::new(Notify::new());
        for _ in 0..WRITERS {
            tokio::spawn(writer_loop(
                pool.clone(),
                rx.clone(),
                events_written.clone(),
            ));
        }
        Ok(PgStore {
            api: SqlApi {
                pool,
                events,
                events_written,
                renewals: Arc::default(),
                retention_ms: Arc::default(),
            },
            writer: tx,
        })
    }

    /// The store's API rows (metadata, access, idempotency keys, outbox), cheap to clone.
    pub fn api(&self) -> &SqlApi<Postgres> {
        &self.api
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

/// Why a fenced write matched no row: the lease moved on ([`StorageError::Fenced`]), or else
/// One writer: takes every queued request (up to the batch limit) and commits them together.
async fn writer_loop(
    pool: PgPool,
    rx: Arc<Mutex<mpsc::Receiver<AppendRequest>>>,
    events_written: Arc<Notify>,
) {
    let mut batch = Vec::with_capacity(MAX_APPENDS_PER_TRANSACTION);
    loop {
        {
            let mut rx = rx.lock().await;
            let Some(first) = rx.recv().await else {
                return; // the store was dropped
            };
            batch.push(first);
            while batch.len() < MAX_APPENDS_PER_TRANSACTION {
                match rx.try_recv() {
                    Ok(req) => batch.push(req),
                    Err(_) => break,
                }
            }
        }
        match commit_batch(&pool, &batch).await {
            Ok(results) => {
                let wrote_events = batch
                    .iter()
                    .zip(&results)
                    .any(|(req, r)| req.event_debounce_ms.is_some() && r.is_ok());
                if wrote_events {
                    events_written.notify_one();
                }
                for (req, result) in batch.drain(..).zip(results) {
                    let _ = req.reply.send(result);
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "commit failed; the batch is not durable");
                for req in batch.drain(..) {
                    let _ = req.reply.send(Err(StorageError::Database(clone_err(&e))));
                }
            }
        }
    }
}

/// Commits every request of `batch` and returns one result per request, or the error that made
/// the whole transaction fail (the connection broke, say).
///
/// A lone request runs in its own transaction. A batch first tries one transaction with one
/// INSERT for all its rows; if that fails (a taken log position above all), or two requests
/// concern the same document (one upsert statement cannot fold both events), the batch runs
/// again in order with a savepoint per request, so only the failing request fails.
async fn commit_batch(
    pool: &PgPool,
    batch: &[AppendRequest],
) -> Result<Vec<Result<(), StorageError>>, sqlx::Error> {
    let now = now_ms();
    let mut conn = pool.acquire().await?;
    if let [req] = batch {
        let mut tx = conn.begin().await?;
        let result = append_one(&mut tx, req, now).await;
        if result.is_ok() {
            tx.commit().await?;
        } else {
            tx.rollback().await?;
        }
        return Ok(vec![result]);
    }
    let mut docs: Vec<DocId> = batch.iter().map(|r| r.doc).collect();
    docs.sort_unstable();
    docs.dedup();
    if docs.len() == batch.len() {
        let mut tx = conn.begin().await?;
        match fast_path(&mut tx, batch, now).await {
            Ok(()) => {
                tx.commit().await?;
                return Ok(batch.iter().map(|_| Ok(())).collect());
            }
            Err(e) => {
                tracing::debug!(error = %e, "group commit failed; retrying request by request");
                tx.rollback().await?;
            }
        }
    }
    let mut results = Vec::with_capacity(batch.len());
    let mut tx = conn.begin().await?;
    for req in batch {
        let mut sp = tx.begin().await?;
        let result = append_one(&mut sp, req, now).await;
        if result.is_ok() {
            sp.commit().await?;
        } else {
            sp.rollback().await?;
        }
        results.push(result);
    }
    tx.commit().await?;
    Ok(results)
}

/// Every request of the batch (one per document) with as few statements as possible: the log
/// rows of all of them, then one upsert folding their `document.updated` events.
async fn fast_path(
    conn: &mut PgConnection,
    batch: &[AppendRequest],
    now: i64,
) -> Result<(), StorageError> {
    let mut rows: Vec<LogRow> = batch
        .iter()
        .flat_map(|r| {
            r.updates
                .iter()
                .enumerate()
                .map(move |(i, entry)| (r.doc, r.fence, r.first_seq + i as i64, entry))
        })
        .collect();
    // A fixed order (the key's) for every writer's inserts.
    rows.sort_unstable_by_key(|(doc, _, seq, _)| (*doc, *seq));
    if !insert_rows(conn, &rows, now).await? {
        // The batch is re-run request by request, which tells a fence from a conflict.
        return Err(StorageError::Conflict);
    }
    for r in batch {
        insert_clients(conn, &client_rows(r.doc, r.first_seq, &r.updates)).await?;
    }
    let events: Vec<(DocId, i64, i64)> = batch
        .iter()
        .filter_map(|r| {
            r.event_debounce_ms
                .map(|debounce| (r.doc, r.last_seq(), now + debounce))
        })
        .collect();
    fold_updated_events(conn, &events, now).await?;
    Ok(())
}

/// One request: its log rows, then its `document.updated` event.
async fn append_one(
    conn: &mut PgConnection,
    req: &AppendRequest,
    now: i64,
) -> Result<(), StorageError> {
    let rows: Vec<LogRow> = req
        .updates
        .iter()
        .enumerate()
        .map(|(i, entry)| (req.doc, req.fence, req.first_seq + i as i64, entry))
        .collect();
    if !insert_rows(conn, &rows, now).await? {
        // Some row was not inserted and the transaction is intact (a taken position, which
        // aborts it, is reported as a conflict by `insert_rows` itself): the fence or the
        // covered-position check filtered it.
        return Err(SqlApi::<Postgres>::why_refused(
            conn,
            req.doc,
            req.fence,
            StorageError::Conflict,
        )
        .await);
    }
    insert_clients(conn, &client_rows(req.doc, req.first_seq, &req.updates)).await?;
    if let Some(debounce) = req.event_debounce_ms {
        fold_updated_events(conn, &[(req.doc, req.last_seq(), now + debounce)], now).await?;
    }
    Ok(())
}

/// Maps client ids to their authors; a client id already mapped keeps its first author.
async fn insert_clients(
    conn: &mut PgConnection,
    rows: &[(DocId, i64, String, i64)],
) -> Result<(), sqlx::Error> {
    if rows.is_empty() {
        return Ok(());
    }
    let docs: Vec<DocId> = rows.iter().map(|r| r.0).collect();
    let clients: Vec<i64> = rows.iter().map(|r| r.1).collect();
    let authors: Vec<&str> = rows.iter().map(|r| r.2.as_str()).collect();
    let seqs: Vec<i64> = rows.iter().map(|r| r.3).collect();
    sqlx::query(
        "INSERT INTO doc_clients (doc_id, client_id, author, first_seq) \
         SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::bigint[]) \
         ON CONFLICT DO NOTHING",
    )
    .bind(&docs)
    .bind(&clients)
    .bind(&authors)
    .bind(&seqs)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// One log row to insert: document, fence, sequence number, the entry.
type LogRow<'a> = (DocId, Option<Epoch>, i64, &'a LogEntry);

/// Inserts log rows, all or none (the caller rolls back on error). One statement per chunk
/// locks the chunk's document rows and inserts only rows above their document's
/// `snapshot_seq`: a snapshot may cover (and have deleted) the row at a requested position,
/// which the primary key alone would not notice, so a short count is a conflict; so is a
/// position already taken (unique violation).
///
/// Ok(false): some row was filtered out (covered position or stale fence), the transaction is
/// still usable; `Err(Conflict)`: a position was taken (unique violation), which aborts the
/// transaction. A fenced row never reaches the key check: the fence filters it first.
async fn insert_rows(
    conn: &mut PgConnection,
    rows: &[LogRow<'_>],
    now: i64,
) -> Result<bool, StorageError> {
    let mut start = 0;
    while start < rows.len() {
        let mut end = start;
        let mut bytes = 0;
        while end < rows.len() && end - start < ROWS_PER_INSERT {
            if end > start && bytes + rows[end].3.data.len() > BYTES_PER_INSERT {
                break;
            }
            bytes += rows[end].3.data.len();
            end += 1;
        }
        let chunk = &rows[start..end];
        start = end;
        let mut docs: Vec<DocId> = chunk.iter().map(|(d, _, _, _)| *d).collect();
        docs.dedup(); // rows are grouped by document
        let doc_ids: Vec<DocId> = chunk.iter().map(|(d, _, _, _)| *d).collect();
        let fences: Vec<Option<Epoch>> = chunk.iter().map(|(_, f, _, _)| *f).collect();
        let seqs: Vec<i64> = chunk.iter().map(|(_, _, s, _)| *s).collect();
        let data: Vec<&[u8]> = chunk.iter().map(|(_, _, _, e)| e.data.as_ref()).collect();
        let authors: Vec<Option<&str>> = chunk.iter().map(|r| r.3.author.as_deref()).collect();
        let inserted: Vec<i64> = chunk.iter().map(|r| r.3.inserted).collect();
        let deleted: Vec<i64> = chunk.iter().map(|r| r.3.deleted).collect();
        // The lease rows are locked too: a grant to another node (which updates the row) waits
        // for this transaction, or this statement sees the new epoch and writes nothing.
        let done = sqlx::query(
            "WITH locked AS ( \
               SELECT id, snapshot_seq, deleted_at FROM documents \
               WHERE id = ANY($1::bigint[]) ORDER BY id FOR SHARE \
             ), leases AS ( \
               SELECT doc_id, epoch FROM room_leases \
               WHERE doc_id = ANY($1::bigint[]) ORDER BY doc_id FOR SHARE \
             ) \
             INSERT INTO doc_updates \
               (doc_id, seq, data, created_at, author, inserted, deleted) \
             SELECT v.doc_id, v.seq, v.data, $5, v.author, v.inserted, v.deleted \
             FROM unnest($2::bigint[], $3::bigint[], $4::bytea[], $6::bigint[], \
                         $7::text[], $8::bigint[], $9::bigint[]) \
               AS v(doc_id, seq, data, fence, author, inserted, deleted) \
             JOIN locked d ON d.id = v.doc_id \
             LEFT JOIN leases l ON l.doc_id = v.doc_id \
             WHERE d.snapshot_seq < v.seq AND d.deleted_at IS NULL \
               AND (v.fence IS NULL OR l.epoch = v.fence)",
        )
        .bind(&docs)
        .bind(&doc_ids)
        .bind(&seqs)
        .bind(&data)
        .bind(now)
        .bind(&fences)
        .bind(&authors)
        .bind(&inserted)
        .bind(&deleted)
        .execute(&mut *conn)
        .await;
        match done {
            Ok(done) if done.rows_affected() == chunk.len() as u64 => {}
            Ok(_) => return Ok(false),
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                return Err(StorageError::Conflict)
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(true)
}

/// One pending `document.updated` per document: a fold updates its sequence number, gives it
/// a new event id (receivers dedupe by id) and resets its delivery state. `events` holds
/// `(doc, last_seq, available_at)`, at most one per document. The payload is built as compact
/// JSON, byte for byte what SQLite's `json_object` writes.
async fn fold_updated_events(
    conn: &mut PgConnection,
    events: &[(DocId, i64, i64)],
    now: i64,
) -> Result<(), sqlx::Error> {
    if events.is_empty() {
        return Ok(());
    }
    let docs: Vec<DocId> = events.iter().map(|e| e.0).collect();
    let seqs: Vec<i64> = events.iter().map(|e| e.1).collect();
    let available: Vec<i64> = events.iter().map(|e| e.2).collect();
    let ids: Vec<String> = events
        .iter()
        .map(|_| uuid::Uuid::new_v4().to_string())
        .collect();
    sqlx::query(
        "INSERT INTO outbox (event_id, type, payload, coalesce_key, available_at, created_at) \
         SELECT e.event_id, 'document.updated', \
                '{\"id\":' || d.id || ',\"name\":' || to_json(d.name)::text \
                  || ',\"seq\":' || e.last_seq || '}', \
                'document.updated:' || d.id, e.available_at, $5 \
         FROM unnest($1::bigint[], $2::bigint[], $3::bigint[], $4::text[]) \
              AS e(doc_id, last_seq, available_at, event_id) \
         JOIN documents d ON d.id = e.doc_id \
         ORDER BY d.id \
         ON CONFLICT (coalesce_key) WHERE status = 'pending' DO UPDATE SET \
           payload = excluded.payload, event_id = excluded.event_id, \
           revision = outbox.revision + 1, delivered_urls = '[]', attempts = 0, \
           last_error = NULL",
    )
    .bind(&docs)
    .bind(&seqs)
    .bind(&available)
    .bind(&ids)
    .bind(now)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Store-level checks of what the integration tests cannot force: the batch a writer commits.
/// They run against PostgreSQL when `QUIRE_TEST_DATABASE=postgres` (server at
/// `QUIRE_TEST_PG_URL`, as for the integration tests), each in a database of its own.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::api::{ApiStore, DocPatch, DocQuery, Versioned};
    use crate::storage::StoredDoc;
    use bytes::Bytes;

    struct TestDb {
        store: PgStore,
        admin: String,
        name: String,
    }

    async fn test_db(events: EventSettings) -> Option<TestDb> {
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
        let store = PgStore::connect_with_events(&format!("{base}/{name}"), events)
            .await
            .expect("store");
        Some(TestDb { store, admin, name })
    }

    impl TestDb {
        async fn drop_db(self) {
            self.store.api().pool().close().await;
            drop(self.store);
            let mut c = PgConnection::connect(&self.admin).await.expect("admin");
            sqlx::query(&format!("DROP DATABASE \"{}\" WITH (FORCE)", self.name))
                .execute(&mut c)
                .await
                .expect("drop database");
        }
    }

    fn request(doc: DocId, first_seq: i64, n: usize, events: bool) -> AppendRequest {
        AppendRequest {
            doc,
            fence: None,
            first_seq,
            updates: (0..n)
                .map(|i| Bytes::from(vec![doc as u8, (first_seq as usize + i) as u8]).into())
                .collect(),
            event_debounce_ms: events.then_some(1000),
            reply: oneshot::channel().0,
        }
    }

    async fn outcomes(pool: &PgPool, batch: &[AppendRequest]) -> Vec<&'static str> {
        let results = commit_batch(pool, batch).await.expect("batch");
        results.iter().map(outcome).collect()
    }

    fn outcome(r: &Result<(), StorageError>) -> &'static str {
        match r {
            Ok(()) => "ok",
            Err(StorageError::Conflict) => "conflict",
            Err(_) => "error",
        }
    }

    #[tokio::test]
    async fn a_batch_fails_only_its_conflicting_requests() {
        let events = EventSettings {
            enabled: true,
            debounce: Duration::from_secs(1),
        };
        let Some(db) = test_db(events).await else {
            return;
        };
        let s = &db.store;
        let d1 = s.load("d1").await.expect("load").id;
        let d2 = s.load("d2").await.expect("load").id;
        let d3 = s.load("d3").await.expect("load").id;
        // d1: row 1 covered by a snapshot (and deleted).
        s.append(d1, None, 1, vec![Bytes::from_static(b"x")])
            .await
            .expect("append");
        let written = s
            .write_snapshot(d1, None, 0, b"snap".to_vec().into(), 1)
            .await;
        assert_eq!(
            written.expect("snapshot"),
            SnapshotOutcome::Written { new_version: 1 }
        );

        // Distinct documents: the one-statement path fails on the covered position and the
        // batch runs again request by request.
        let batch = [
            request(d2, 1, 2, true),
            request(d1, 1, 1, true),
            request(d3, 1, 1, true),
        ];
        let got = outcomes(s.api().pool(), &batch).await;
        assert_eq!(got, ["ok", "conflict", "ok"]);

        // A taken position (unique violation) fails alone too.
        let batch = [request(d3, 1, 1, true), request(d2, 3, 1, true)];
        let got = outcomes(s.api().pool(), &batch).await;
        assert_eq!(got, ["conflict", "ok"]);

        // Two requests of one document in one batch (savepoint path), in order.
        let batch = [request(d2, 4, 1, true), request(d2, 5, 2, true)];
        let got = outcomes(s.api().pool(), &batch).await;
        assert_eq!(got, ["ok", "ok"]);

        // The fast path proper: distinct documents, nothing stale.
        let batch = [request(d2, 7, 3, true), request(d3, 2, 1, false)];
        let got = outcomes(s.api().pool(), &batch).await;
        assert_eq!(got, ["ok", "ok"]);

        let seqs = |d: StoredDoc| d.updates.iter().map(|(s, _)| *s).collect::<Vec<_>>();
        assert_eq!(
            seqs(s.load("d2").await.expect("load")),
            (1..=9).collect::<Vec<_>>()
        );
        assert_eq!(seqs(s.load("d3").await.expect("load")), vec![1, 2]);
        let d1_loaded = s.load("d1").await.expect("load");
        assert!(d1_loaded.updates.is_empty());
        assert_eq!(d1_loaded.snapshot.as_deref(), Some(&b"snap"[..]));

        // One pending `document.updated` per document, folded, with SQLite's compact payload.
        let pending: Vec<(String, String, i64)> = sqlx::query_as(
            "SELECT coalesce_key, payload, revision FROM outbox \
             WHERE type = 'document.updated' AND status = 'pending' ORDER BY coalesce_key",
        )
        .fetch_all(s.api().pool())
        .await
        .expect("outbox");
        assert_eq!(
            pending,
            vec![
                (
                    format!("document.updated:{d1}"),
                    format!(r#"{{"id":{d1},"name":"d1","seq":1}}"#),
                    1
                ),
                (
                    format!("document.updated:{d2}"),
                    format!(r#"{{"id":{d2},"name":"d2","seq":9}}"#),
                    5
                ),
                (
                    format!("document.updated:{d3}"),
                    format!(r#"{{"id":{d3},"name":"d3","seq":1}}"#),
                    1
                ),
            ]
        );
        db.drop_db().await;
    }

    #[tokio::test]
    async fn concurrent_appends_commit_in_groups_and_stale_ones_fail_alone() {
        let Some(db) = test_db(EventSettings::default()).await else {
            return;
        };
        let store = Arc::new(db.store);
        let stale = store.load("stale").await.expect("load");
        store
            .append(stale.id, None, 1, vec![Bytes::from_static(b"a")])
            .await
            .expect("append");
        store
            .write_snapshot(
                stale.id,
                None,
                stale.snapshot_version,
                b"s".to_vec().into(),
                1,
            )
            .await
            .expect("snapshot");
        let mut ids = Vec::new();
        for i in 0..50 {
            ids.push(store.load(&format!("d{i}")).await.expect("load").id);
        }
        let mut tasks = Vec::new();
        for round in 0..5i64 {
            for id in ids.iter().copied() {
                let store = store.clone();
                tasks.push(tokio::spawn(async move {
                    store
                        .append(id, None, round * 1000 + 1, vec![Bytes::from_static(b"u")])
                        .await
                }));
            }
            let s = store.clone();
            let id = stale.id;
            tasks.push(tokio::spawn(async move {
                match s
                    .append(id, None, 1, vec![Bytes::from_static(b"late")])
                    .await
                {
                    Err(StorageError::Conflict) => Ok(()),
                    other => panic!("stale append: {other:?}"),
                }
            }));
        }
        for t in tasks {
            t.await.expect("join").expect("append commits");
        }
        for i in 0..50 {
            let d = store.load(&format!("d{i}")).await.expect("load");
            assert_eq!(d.updates.len(), 5, "d{i}");
        }
        let db = TestDb {
            store: Arc::into_inner(store).expect("last reference"),
            ..db
        };
        db.drop_db().await;
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
