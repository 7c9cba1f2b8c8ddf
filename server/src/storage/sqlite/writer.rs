//! The SQLite writer task: the one connection that writes, committing every queued request,
//! from any number of documents, in one transaction (with a savepoint per request when one
//! fails), held open as long as the commit window says.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use sqlx::{Connection, Sqlite};
use tokio::sync::{mpsc, oneshot, Notify};

use crate::storage::commit_window::CommitWindow;
use crate::storage::commit_window::CommitWindowSettings;
use crate::storage::dialect::each_in_a_savepoint;
use crate::storage::sql_api::SqlApi;
use crate::storage::{
    answer_batch, client_rows, now_ms, take_queued, DocId, Epoch, LogEntry, SnapshotBytes,
    SnapshotOutcome, StorageError,
};

/// Most write requests folded into one transaction. Bounds the latency a request can add to the
/// others in its batch; at ~10 µs per row this is a few milliseconds of work.
const MAX_WRITES_PER_TRANSACTION: usize = 512;
/// Queue of write requests waiting for the writer. Rooms wait (backpressure) when it is full.
pub(super) const WRITE_QUEUE: usize = 4096;

pub(super) enum WriteOp {
    Append {
        doc: DocId,
        fence: Option<Epoch>,
        first_seq: i64,
        updates: Vec<LogEntry>,
        /// Fold a `document.updated` event into the outbox, available after this many ms.
        event_debounce_ms: Option<i64>,
    },
    Snapshot {
        doc: DocId,
        fence: Option<Epoch>,
        expected_version: i64,
        snapshot: SnapshotBytes,
        upto_seq: i64,
        /// Delete the log rows the snapshot covers (no history is kept).
        delete_covered: bool,
    },
    /// One part of a staged snapshot: a request of its own, so it commits in whichever
    /// transaction the writer is at, between other documents' appends.
    SnapshotPart {
        doc: DocId,
        generation: i64,
        part: i64,
        bytes: Bytes,
    },
}

impl WriteOp {
    fn doc(&self) -> DocId {
        match self {
            WriteOp::Append { doc, .. }
            | WriteOp::Snapshot { doc, .. }
            | WriteOp::SnapshotPart { doc, .. } => *doc,
        }
    }
}

pub(super) enum WriteOutcome {
    Appended,
    Snapshot(SnapshotOutcome),
    PartWritten,
}

pub(super) struct WriteRequest {
    pub(super) op: WriteOp,
    pub(super) reply: oneshot::Sender<Result<WriteOutcome, StorageError>>,
}

pub(super) async fn writer_loop(
    mut conn: SqliteConnection,
    opts: SqliteConnectOptions,
    mut rx: mpsc::Receiver<WriteRequest>,
    events_written: Arc<Notify>,
    window: CommitWindowSettings,
    transactions: Arc<AtomicU64>,
) {
    let mut batch = Vec::with_capacity(MAX_WRITES_PER_TRANSACTION);
    let mut window = CommitWindow::new(window, Instant::now());
    while let Some(first) = rx.recv().await {
        if let Some(delay) = window.wait(Instant::now(), rx.len()) {
            tokio::time::sleep(delay).await;
        }
        take_queued(first, &mut rx, &mut batch, MAX_WRITES_PER_TRANSACTION);
        window.record(Instant::now(), batch.iter().map(|r| r.op.doc()));
        transactions.fetch_add(1, Ordering::Relaxed);
        let committed = commit_batch(&mut conn, &mut batch).await;
        let wrote_events = batch.iter().any(|r| {
            matches!(
                r.op,
                WriteOp::Append {
                    event_debounce_ms: Some(_),
                    ..
                }
            )
        });
        if committed.is_ok() && wrote_events {
            events_written.notify_one();
        }
        if !answer_batch(batch.drain(..).map(|r| r.reply), committed) {
            // The connection may be unusable (disk error, lock state); start afresh.
            match SqliteConnection::connect_with(&opts).await {
                Ok(fresh) => conn = fresh,
                Err(e) => tracing::error!(error = %e, "cannot reopen the writer connection"),
            }
        }
    }
}

/// Commits every request of `batch` in one transaction and returns one result per request,
/// or the error that made the whole transaction fail.
///
/// The fast path writes all appended rows with multi-row INSERTs, then the other requests. If
/// anything fails (a log position taken, say), or the batch mixes a snapshot and an append of
/// one document (whose order then matters), the transaction is rolled back and the batch runs
/// again in order with a savepoint per request, so only the failing request fails.
async fn commit_batch(
    conn: &mut SqliteConnection,
    batch: &mut [WriteRequest],
) -> Result<Vec<Result<WriteOutcome, StorageError>>, sqlx::Error> {
    if let Some(rows) = plain_appends(batch) {
        // One statement is its own transaction: no BEGIN and COMMIT round trips to sqlx's
        // SQLite thread. It either writes every row or none, so on failure the batch simply
        // takes the general path below, which finds the failing request.
        if insert_rows(&mut *conn, &rows, now_ms()).await.is_ok() {
            return Ok(batch.iter().map(|_| Ok(WriteOutcome::Appended)).collect());
        }
    }
    let mut tx = conn.begin().await?;
    if let Ok(results) = fast_path(&mut tx, batch).await {
        tx.commit().await?;
        return Ok(results);
    }
    tx.rollback().await?;
    each_in_a_savepoint!(conn, batch.iter(), |sp, req| apply(&mut sp, &req.op))
}

/// Most rows in one multi-row INSERT (8 bound values each, well under SQLite's limit).
const ROWS_PER_INSERT: usize = 500;

/// One appended row: document, fence, log position, the entry.
type LogRow<'a> = (DocId, Option<Epoch>, i64, &'a LogEntry);

/// The rows of a batch made only of appends that write no outbox event, when they fit in one
/// INSERT: such a batch needs no transaction of its own.
fn plain_appends(batch: &[WriteRequest]) -> Option<Vec<LogRow<'_>>> {
    let mut rows = Vec::new();
    for req in batch {
        match &req.op {
            WriteOp::Append {
                event_debounce_ms: None,
                updates,
                ..
            } if updates.iter().all(|u| u.clients.is_empty()) => {}
            _ => return None,
        }
        rows.extend(log_rows(&req.op));
        if rows.len() > ROWS_PER_INSERT {
            return None;
        }
    }
    Some(rows)
}

/// The log rows an append writes (none for a snapshot).
fn log_rows(op: &WriteOp) -> impl Iterator<Item = LogRow<'_>> {
    let append = match op {
        WriteOp::Append {
            doc,
            fence,
            first_seq,
            updates,
            ..
        } => Some((*doc, *fence, *first_seq, updates)),
        WriteOp::Snapshot { .. } | WriteOp::SnapshotPart { .. } => None,
    };
    append.into_iter().flat_map(|(doc, fence, first, updates)| {
        updates
            .iter()
            .enumerate()
            .map(move |(i, data)| (doc, fence, first + i as i64, data))
    })
}

/// Inserts `rows` with one multi-row INSERT that also checks them, all or nothing: a snapshot
/// may cover (and have deleted) the rows at a requested position, which the primary key alone
/// would not notice, so a row at or below its document's `snapshot_seq`, or a fenced row whose
/// document's lease epoch is no longer the one it names, or a row of an unknown document, gets
/// a NULL `data`, and the NOT NULL constraint aborts the whole statement (as a taken position
/// does through the key).
async fn insert_rows(
    conn: &mut SqliteConnection,
    rows: &[LogRow<'_>],
    now: i64,
) -> Result<(), StorageError> {
    let fenced = rows.iter().any(|(_, fence, _, _)| fence.is_some());
    let mut q = sqlx::QueryBuilder::<sqlx::Sqlite>::new(
        "INSERT INTO doc_updates (doc_id, seq, data, created_at, author, inserted, deleted) \
         SELECT v.column1, v.column2, ",
    );
    // The lease join only when a row carries a fence (never on a single node).
    q.push(if fenced {
        "CASE WHEN d.snapshot_seq < v.column2 AND d.deleted_at IS NULL \
           AND (v.column5 IS NULL OR l.epoch = v.column5) THEN v.column3 END, "
    } else {
        "CASE WHEN d.snapshot_seq < v.column2 AND d.deleted_at IS NULL THEN v.column3 END, "
    });
    q.push("v.column4, v.column6, v.column7, v.column8 FROM (");
    q.push_values(rows, |mut b, (doc, fence, seq, entry)| {
        b.push_bind(*doc)
            .push_bind(*seq)
            .push_bind(entry.data.as_ref())
            .push_bind(now)
            .push_bind(*fence)
            .push_bind(entry.author.as_deref())
            .push_bind(entry.inserted)
            .push_bind(entry.deleted);
    });
    q.push(") AS v LEFT JOIN documents d ON d.id = v.column1");
    if fenced {
        q.push(" LEFT JOIN room_leases l ON l.doc_id = v.column1");
    }
    let done = q.build().execute(&mut *conn).await?;
    if done.rows_affected() != rows.len() as u64 {
        return Err(StorageError::Conflict);
    }
    Ok(())
}

/// Every request of the batch with as few statements as possible: multi-row INSERTs (which
/// also check the covered log positions) for all appended rows, then the per-request
/// statements (snapshots, outbox events). Any failure (a taken position above all) fails the whole
/// batch, which then runs again request by request.
async fn fast_path(
    conn: &mut SqliteConnection,
    batch: &[WriteRequest],
) -> Result<Vec<Result<WriteOutcome, StorageError>>, StorageError> {
    let now = now_ms();
    let rows: Vec<LogRow<'_>> = batch.iter().flat_map(|r| log_rows(&r.op)).collect();
    // Appends are written before snapshots here; that is only the same as the requests' order
    // when no snapshot in the batch concerns a document that is also appended to.
    let snapshotted = batch.iter().filter_map(|r| match &r.op {
        WriteOp::Snapshot { doc, .. } => Some(*doc),
        _ => None,
    });
    for doc in snapshotted {
        if rows.iter().any(|(d, _, _, _)| *d == doc) {
            return Err(StorageError::Conflict);
        }
    }
    for chunk in rows.chunks(ROWS_PER_INSERT) {
        insert_rows(&mut *conn, chunk, now).await?;
    }
    let mut results = Vec::with_capacity(batch.len());
    for req in batch {
        if let WriteOp::Append {
            doc,
            first_seq,
            updates,
            ..
        } = &req.op
        {
            insert_clients(conn, &client_rows(*doc, *first_seq, updates)).await?;
        }
        let outcome = match &req.op {
            WriteOp::Append {
                doc,
                first_seq,
                updates,
                event_debounce_ms: Some(debounce),
                ..
            } => {
                fold_updated_event(
                    conn,
                    *doc,
                    first_seq + updates.len() as i64 - 1,
                    now,
                    *debounce,
                )
                .await?;
                WriteOutcome::Appended
            }
            WriteOp::Append { .. } => WriteOutcome::Appended,
            op @ (WriteOp::Snapshot { .. } | WriteOp::SnapshotPart { .. }) => {
                apply(conn, op).await?
            }
        };
        results.push(Ok(outcome));
    }
    Ok(results)
}

/// One pending `document.updated` per document: a fold updates its sequence number, gives it
/// a new event id (receivers dedupe by id) and resets its delivery state.
async fn fold_updated_event(
    conn: &mut SqliteConnection,
    doc: DocId,
    last_seq: i64,
    now: i64,
    debounce: i64,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO outbox (event_id, type, payload, coalesce_key, available_at, created_at) \
         SELECT ?, 'document.updated', \
                json_object('id', id, 'name', name, 'seq', ?), \
                'document.updated:' || id, ?, ? \
         FROM documents WHERE id = ? \
         ON CONFLICT (coalesce_key) WHERE status = 'pending' DO UPDATE SET \
           payload = excluded.payload, event_id = excluded.event_id, \
           revision = revision + 1, delivered_urls = '[]', attempts = 0, \
           last_error = NULL",
    )
    .bind(uuid::Uuid::new_v4().to_string())
    .bind(last_seq)
    .bind(now + debounce)
    .bind(now)
    .bind(doc)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Maps client ids to their authors; a client id already mapped keeps its first author.
async fn insert_clients(
    conn: &mut SqliteConnection,
    rows: &[(DocId, i64, String, i64)],
) -> Result<(), sqlx::Error> {
    for (doc, client, author, seq) in rows {
        sqlx::query(
            "INSERT INTO doc_clients (doc_id, client_id, author, first_seq) \
             VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
        )
        .bind(doc)
        .bind(client)
        .bind(author)
        .bind(seq)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

async fn apply(conn: &mut SqliteConnection, op: &WriteOp) -> Result<WriteOutcome, StorageError> {
    let now = now_ms();
    match op {
        WriteOp::Append {
            doc,
            fence,
            first_seq,
            updates,
            event_debounce_ms,
        } => {
            // A snapshot may already cover (and have deleted) the rows at our position: the
            // key alone would not notice, so the first row checks `snapshot_seq` too. With a
            // fence, the first row also checks the lease epoch (the rest follow in the same
            // transaction, which holds SQLite's write lock).
            for (i, entry) in updates.iter().enumerate() {
                let r = sqlx::query(
                    "INSERT INTO doc_updates \
                       (doc_id, seq, data, created_at, author, inserted, deleted) \
                     SELECT ?1, ?2, ?3, ?4, ?7, ?8, ?9 \
                     WHERE ?5 <> 0 OR ( \
                       (SELECT snapshot_seq FROM documents WHERE id = ?1 AND deleted_at IS NULL) \
                         < ?2 \
                       AND (?6 IS NULL OR (SELECT epoch FROM room_leases WHERE doc_id = ?1) = ?6))",
                )
                .bind(doc)
                .bind(first_seq + i as i64)
                .bind(entry.data.as_ref())
                .bind(now)
                .bind(i as i64)
                .bind(fence)
                .bind(entry.author.as_deref())
                .bind(entry.inserted)
                .bind(entry.deleted)
                .execute(&mut *conn)
                .await;
                match r {
                    Ok(done) if done.rows_affected() == 1 => {}
                    Ok(_) => {
                        return Err(SqlApi::<Sqlite>::why_refused(
                            conn,
                            *doc,
                            *fence,
                            StorageError::Conflict,
                        )
                        .await)
                    }
                    Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                        return Err(StorageError::Conflict)
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            insert_clients(conn, &client_rows(*doc, *first_seq, updates)).await?;
            if let Some(debounce) = event_debounce_ms {
                let last_seq = first_seq + updates.len() as i64 - 1;
                fold_updated_event(conn, *doc, last_seq, now, *debounce).await?;
            }
            Ok(WriteOutcome::Appended)
        }
        WriteOp::Snapshot {
            doc,
            fence,
            expected_version,
            snapshot,
            upto_seq,
            delete_covered,
        } => {
            let generation = snapshot.generation();
            let done = sqlx::query(
                "UPDATE documents SET snapshot_seq = ?1, \
                 snapshot_version = snapshot_version + 1, snapshot_generation = ?5, \
                 snapshot_at = CAST(unixepoch('subsec') * 1000 AS INTEGER) \
                 WHERE id = ?2 AND snapshot_version = ?3 \
                   AND (?4 IS NULL OR (SELECT epoch FROM room_leases WHERE doc_id = ?2) = ?4)",
            )
            .bind(upto_seq)
            .bind(doc)
            .bind(expected_version)
            .bind(fence)
            .bind(generation)
            .execute(&mut *conn)
            .await?;
            if done.rows_affected() == 0 {
                return match SqlApi::<Sqlite>::why_refused(
                    conn,
                    *doc,
                    *fence,
                    StorageError::Conflict,
                )
                .await
                {
                    StorageError::Conflict => Ok(WriteOutcome::Snapshot(SnapshotOutcome::Conflict)),
                    e => Err(e),
                };
            }
            // Staged parts are checked once the version and fence have matched: a writer that
            // lost the race (whose parts the winner deleted) gets its conflict, not this error.
            // An error here rolls the UPDATE back with the rest of the request.
            SqlApi::<Sqlite>::check_staged(conn, *doc, snapshot).await?;
            // The snapshot's bytes live apart from the row, in parts (migrations/sqlite/0008).
            SqlApi::<Sqlite>::place_snapshot(
                conn,
                *doc,
                generation,
                snapshot,
                *upto_seq,
                *delete_covered,
            )
            .await?;
            Ok(WriteOutcome::Snapshot(SnapshotOutcome::Written {
                new_version: expected_version + 1,
            }))
        }
        WriteOp::SnapshotPart {
            doc,
            generation,
            part,
            bytes,
        } => {
            SqlApi::<Sqlite>::insert_snapshot_part(conn, *doc, *generation, *part, bytes).await?;
            Ok(WriteOutcome::PartWritten)
        }
    }
}

/// Store-level checks of what the integration tests cannot force: the batch a writer commits.
#[cfg(test)]
mod tests {
    use std::str::FromStr;
    use std::time::Duration;

    use super::*;
    use crate::storage::sqlite::SqliteStore;
    use crate::storage::{DocStore, LeaseGrant};
    use sqlx::sqlite::SqliteSynchronous;

    fn append(doc: DocId, fence: Option<Epoch>, first_seq: i64, n: usize) -> WriteRequest {
        let updates = (0..n)
            .map(|i| Bytes::from(format!("u{doc}-{}", first_seq + i as i64)).into())
            .collect();
        WriteRequest {
            op: WriteOp::Append {
                doc,
                fence,
                first_seq,
                updates,
                event_debounce_ms: None,
            },
            reply: oneshot::channel().0,
        }
    }

    async fn outcomes(
        conn: &mut SqliteConnection,
        mut batch: Vec<WriteRequest>,
    ) -> Vec<&'static str> {
        let results = commit_batch(conn, &mut batch).await.expect("batch");
        results
            .iter()
            .map(|r| match r {
                Ok(WriteOutcome::Appended) => "ok",
                Ok(WriteOutcome::Snapshot(_)) => "snapshot",
                Ok(WriteOutcome::PartWritten) => "part",
                Err(StorageError::Conflict) => "conflict",
                Err(StorageError::Fenced) => "fenced",
                Err(_) => "error",
            })
            .collect()
    }

    async fn seqs(store: &SqliteStore, name: &str) -> Vec<i64> {
        let d = store.load(name).await.expect("load");
        d.updates.iter().map(|(s, _)| *s).collect()
    }

    /// Batches of plain appends go out as one statement; when one request in them is stale
    /// (covered by a snapshot, a taken position, an old fence), nothing of that statement is
    /// written and the batch runs again request by request, so only that request fails.
    #[tokio::test]
    async fn a_plain_append_batch_is_all_or_nothing_and_fails_only_its_stale_requests() {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("sqlite://{}", dir.path().join("t.db").display());
        let store = SqliteStore::connect(&url, SqliteSynchronous::Full)
            .await
            .expect("open");
        let opts = SqliteConnectOptions::from_str(&url).expect("url");
        let mut conn = SqliteConnection::connect_with(&opts).await.expect("conn");
        let d1 = store.load("d1").await.expect("load").id;
        let d2 = store.load("d2").await.expect("load").id;
        let d3 = store.load("d3").await.expect("load").id;

        // The one-statement path proper.
        let got = outcomes(
            &mut conn,
            vec![append(d1, None, 1, 2), append(d2, None, 1, 1)],
        )
        .await;
        assert_eq!(got, ["ok", "ok"]);

        // d1's rows 1-2 covered by a snapshot (and deleted): a request at position 2 is stale.
        let written = store
            .write_snapshot(d1, None, 0, b"snap".to_vec().into(), 2)
            .await;
        assert_eq!(
            written.expect("snapshot"),
            SnapshotOutcome::Written { new_version: 1 }
        );
        let batch = vec![
            append(d2, None, 2, 2),
            append(d1, None, 2, 1),
            append(d3, None, 1, 1),
        ];
        assert_eq!(outcomes(&mut conn, batch).await, ["ok", "conflict", "ok"]);

        // A taken position (the key) fails alone too.
        let batch = vec![append(d3, None, 1, 1), append(d2, None, 4, 1)];
        assert_eq!(outcomes(&mut conn, batch).await, ["conflict", "ok"]);

        // A fenced request whose epoch is no longer the lease's fails alone, as fenced.
        let LeaseGrant::Granted { epoch } = store
            .acquire_lease(d3, "n1", Duration::from_secs(60))
            .await
            .expect("lease")
        else {
            panic!("lease not granted");
        };
        let batch = vec![
            append(d3, Some(epoch), 2, 1),
            append(d3, Some(epoch - 1), 3, 1),
            append(d2, None, 5, 1),
        ];
        assert_eq!(outcomes(&mut conn, batch).await, ["ok", "fenced", "ok"]);

        assert!(seqs(&store, "d1").await.is_empty());
        assert_eq!(seqs(&store, "d2").await, vec![1, 2, 3, 4, 5]);
        assert_eq!(seqs(&store, "d3").await, vec![1, 2]);
    }
}
