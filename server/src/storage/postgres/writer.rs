//! PostgreSQL's append queue: a few writer tasks, each committing every request waiting in one
//! transaction (one multi-row INSERT, one outbox upsert), or request by request with a
//! savepoint each when that fails.

use std::sync::Arc;

use sqlx::postgres::{PgConnection, PgPool};
use sqlx::{Connection, Postgres};
use tokio::sync::{mpsc, oneshot, Mutex, Notify};

use crate::storage::dialect::each_in_a_savepoint;
use crate::storage::sql_api::SqlApi;
use crate::storage::{
    answer_batch, client_rows, now_ms, take_queued, DocId, Epoch, LogEntry, StorageError,
};

/// Most append requests folded into one transaction.
const MAX_APPENDS_PER_TRANSACTION: usize = 512;
/// Queue of append requests waiting for a writer. Rooms wait (backpressure) when it is full.
pub(super) const WRITE_QUEUE: usize = 4096;
/// Most log rows (and bytes) bound to one INSERT statement.
const ROWS_PER_INSERT: usize = 1000;
const BYTES_PER_INSERT: usize = 64 << 20;
pub(super) struct AppendRequest {
    pub(super) doc: DocId,
    pub(super) fence: Option<Epoch>,
    pub(super) first_seq: i64,
    pub(super) updates: Vec<LogEntry>,
    /// Fold a `document.updated` event into the outbox, available after this many ms.
    pub(super) event_debounce_ms: Option<i64>,
    pub(super) reply: oneshot::Sender<Result<(), StorageError>>,
}

impl AppendRequest {
    fn last_seq(&self) -> i64 {
        self.first_seq + self.updates.len() as i64 - 1
    }
}

/// One writer: takes every queued request (up to the batch limit) and commits them together.
pub(super) async fn writer_loop(
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
            take_queued(first, &mut rx, &mut batch, MAX_APPENDS_PER_TRANSACTION);
        }
        let committed = commit_batch(&pool, &batch).await;
        let wrote_events = committed.as_ref().is_ok_and(|results| {
            batch
                .iter()
                .zip(results)
                .any(|(req, r)| req.event_debounce_ms.is_some() && r.is_ok())
        });
        if wrote_events {
            events_written.notify_one();
        }
        answer_batch(batch.drain(..).map(|r| r.reply), committed);
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
    each_in_a_savepoint!(conn, batch, |sp, req| append_one(&mut sp, req, now))
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

/// The batches a writer commits, on PostgreSQL when `QUIRE_TEST_DATABASE=postgres` (see the
/// store's tests).
#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;

    use super::*;
    use crate::storage::postgres::tests::{test_db, TestDb};
    use crate::storage::sql_api::EventSettings;
    use crate::storage::{DocStore, SnapshotOutcome, StoredDoc};

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
}
