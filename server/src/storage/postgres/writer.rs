//! PostgreSQL's append queue: a few writer tasks, each committing every request waiting
//! together, held open as long as their shared commit window (`commit_window.rs`) says. A batch of distinct documents that fits one statement is committed by that one
//! statement (its log rows, client ids and `document.updated` events; a statement outside a
//! transaction commits as a whole or not at all): one round trip. A batch that does not fit, or
//! whose statement fails, runs in a transaction, request by request with a savepoint each.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use sqlx::postgres::{PgConnection, PgPool};
use sqlx::{Connection, Postgres};
use tokio::sync::{mpsc, oneshot, Mutex, Notify};

use crate::storage::commit_window::CommitWindow;
use crate::storage::commit_window::CommitWindowSettings;
use crate::storage::dialect::each_in_a_savepoint;
use crate::storage::postgres::CHECK_IDLE_AFTER;
use crate::storage::sql_api::SqlApi;
use crate::storage::{
    answer_batch, client_rows, clone_err, now_ms, take_queued, DocId, Epoch, LogEntry, StorageError,
};

/// Most append requests folded into one transaction.
const MAX_APPENDS_PER_TRANSACTION: usize = 512;
/// Queue of append requests waiting for a writer. Rooms wait (backpressure) when it is full.
pub(super) const WRITE_QUEUE: usize = 4096;
/// Most log rows (and bytes) bound to one INSERT statement.
const ROWS_PER_INSERT: usize = 1000;
const BYTES_PER_INSERT: usize = 64 << 20;

// The SQL both ways of appending share (`concat!` fragments; parameters by position).

/// The rows of the documents `$1` and of their leases, locked `FOR SHARE` in a fixed order: a
/// grant to another node (which updates a lease row) waits for the append, or the append sees
/// the new epoch and writes nothing.
macro_rules! locked_documents {
    () => {
        "locked AS ( \
           SELECT id, snapshot_seq, deleted_at FROM documents \
           WHERE id = ANY($1::bigint[]) ORDER BY id FOR SHARE \
         ), leases AS ( \
           SELECT doc_id, epoch FROM room_leases \
           WHERE doc_id = ANY($1::bigint[]) ORDER BY doc_id FOR SHARE \
         )"
    };
}

/// The log rows to insert (`$2` documents, `$3` positions, `$4` data, `$6` fences, `$7`
/// authors, `$8`/`$9` inserted/deleted counts) that may be: above their document's
/// `snapshot_seq`, of a document not deleted, under the lease's current epoch when fenced.
macro_rules! passing_log_rows {
    () => {
        "unnest($2::bigint[], $3::bigint[], $4::bytea[], $6::bigint[], \
                $7::text[], $8::bigint[], $9::bigint[]) \
           AS v(doc_id, seq, data, fence, author, inserted, deleted) \
         JOIN locked d ON d.id = v.doc_id \
         LEFT JOIN leases l ON l.doc_id = v.doc_id \
         WHERE d.snapshot_seq < v.seq AND d.deleted_at IS NULL \
           AND (v.fence IS NULL OR l.epoch = v.fence)"
    };
}

/// [`append_at_once`]'s statement: the log rows (`passing_log_rows!`, `$10` their count)
/// only if every one passes, then the given data-modifying `WITH` items (each starting with a
/// comma), which run only if so too; it answers whether they did.
macro_rules! append_at_once_sql {
    ($($item:expr),*) => {
        concat!(
            "WITH ",
            locked_documents!(),
            ", passing AS ( \
               SELECT v.doc_id, v.seq, v.data, v.author, v.inserted, v.deleted FROM ",
            passing_log_rows!(),
            "), verdict AS (SELECT count(*) = $10 AS ok FROM passing), \
             log_rows AS ( \
               INSERT INTO doc_updates \
                 (doc_id, seq, data, created_at, author, inserted, deleted) \
               SELECT doc_id, seq, data, $5, author, inserted, deleted FROM passing \
               WHERE (SELECT ok FROM verdict) \
             )",
            $($item,)*
            " SELECT ok FROM verdict"
        )
    };
}

/// A `WITH` item of [`append_at_once_sql!`] mapping client ids to authors (the arrays
/// [`Clients`] binds, at the given positions).
macro_rules! append_clients_sql {
    ($docs:literal, $ids:literal, $authors:literal, $seqs:literal) => {
        concat!(
            ", clients AS ( \
               INSERT INTO doc_clients (doc_id, client_id, author, first_seq) \
               SELECT * FROM unnest(",
            $docs,
            "::bigint[], ",
            $ids,
            "::bigint[], ",
            $authors,
            "::text[], ",
            $seqs,
            "::bigint[]) \
               WHERE (SELECT ok FROM verdict) \
               ON CONFLICT DO NOTHING \
             )"
        )
    };
}

/// A `WITH` item of [`append_at_once_sql!`] folding `document.updated` events (the arrays
/// [`Events`] binds, at the given positions).
macro_rules! append_events_sql {
    ($docs:literal, $seqs:literal, $available:literal, $ids:literal) => {
        concat!(
            ", events AS (",
            fold_updated_events_sql!(
                concat!(
                    "unnest(",
                    $docs,
                    "::bigint[], ",
                    $seqs,
                    "::bigint[], ",
                    $available,
                    "::bigint[], ",
                    $ids,
                    "::text[])"
                ),
                "$5",
                "WHERE (SELECT ok FROM verdict)"
            ),
            ")"
        )
    };
}

/// Folds one pending `document.updated` per document from `$source` (columns `doc_id`,
/// `last_seq`, `available_at`, `event_id`), created at `$now`, rows kept by `$filter`.
macro_rules! fold_updated_events_sql {
    ($source:expr, $now:literal, $filter:literal) => {
        concat!(
            "INSERT INTO outbox (event_id, type, payload, coalesce_key, available_at, created_at) \
             SELECT e.event_id, 'document.updated', \
                    '{\"id\":' || d.id || ',\"name\":' || to_json(d.name)::text \
                      || ',\"seq\":' || e.last_seq || '}', \
                    'document.updated:' || d.id, e.available_at, ",
            $now,
            " FROM ",
            $source,
            " AS e(doc_id, last_seq, available_at, event_id) \
             JOIN documents d ON d.id = e.doc_id ",
            $filter,
            " ORDER BY d.id \
             ON CONFLICT (coalesce_key) WHERE status = 'pending' DO UPDATE SET \
               payload = excluded.payload, event_id = excluded.event_id, \
               revision = outbox.revision + 1, delivered_urls = '[]', attempts = 0, \
               last_error = NULL"
        )
    };
}
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

/// The writers' queue of append requests and the commit window they share: the writer holding
/// it takes the next batch, after holding the batch open as long as the window says.
pub(super) struct WriteQueue {
    rx: mpsc::Receiver<AppendRequest>,
    window: CommitWindow,
}

impl WriteQueue {
    pub(super) fn new(rx: mpsc::Receiver<AppendRequest>, window: CommitWindowSettings) -> Self {
        WriteQueue {
            rx,
            window: CommitWindow::new(window, Instant::now()),
        }
    }
}

/// One writer: takes every queued request (up to the batch limit, once the commit window has
/// passed) and commits them together, while the others may commit theirs.
pub(super) async fn writer_loop(
    pool: PgPool,
    queue: Arc<Mutex<WriteQueue>>,
    events_written: Arc<Notify>,
    commits: Arc<AtomicU64>,
) {
    let mut batch = Vec::with_capacity(MAX_APPENDS_PER_TRANSACTION);
    // The writer keeps its own connection between batches, out of the pool: sqlx pings a
    // connection each time it goes back to the pool, which would cost every batch a second
    // round trip (and the pool's `close` waits for the connections handed out).
    let mut held: Option<(PgConnection, Instant)> = None;
    loop {
        {
            let mut queue = queue.lock().await;
            let WriteQueue { rx, window } = &mut *queue;
            let Some(first) = rx.recv().await else {
                // The store was dropped.
                if let Some((conn, _)) = held {
                    let _ = conn.close().await;
                }
                return;
            };
            if let Some(delay) = window.wait(Instant::now(), rx.len()) {
                tokio::time::sleep(delay).await;
            }
            take_queued(first, rx, &mut batch, MAX_APPENDS_PER_TRANSACTION);
            window.record(Instant::now(), batch.iter().map(|r| r.doc));
        }
        commits.fetch_add(1, Ordering::Relaxed);
        let committed = match connection(&pool, &mut held).await {
            Ok(conn) => commit_batch(conn, &batch).await,
            Err(e) => Err(e),
        };
        // A connection that failed is dropped; the next batch takes another.
        let failed = committed.as_ref().map_or(true, |results| {
            results
                .iter()
                .any(|r| matches!(r, Err(StorageError::Database(_))))
        });
        if failed {
            held = None;
        }
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

/// The writer's connection: the one it holds (checked first if it was idle longer than
/// [`CHECK_IDLE_AFTER`], as the pool checks its idle ones), or a new one taken out of the pool
/// (which may then open another in its place).
async fn connection<'a>(
    pool: &PgPool,
    held: &'a mut Option<(PgConnection, Instant)>,
) -> Result<&'a mut PgConnection, sqlx::Error> {
    let kept = match held.take() {
        Some((mut conn, used)) if used.elapsed() > CHECK_IDLE_AFTER => {
            conn.ping().await.is_ok().then_some((conn, used))
        }
        kept => kept,
    };
    let (conn, used) = match kept {
        Some(kept) => held.insert(kept),
        None => held.insert((pool.acquire().await?.detach(), Instant::now())),
    };
    *used = Instant::now();
    Ok(conn)
}

/// Commits every request of `batch` and returns one result per request, or the error that made
/// the whole batch fail before anything was committed (the connection broke, say).
///
/// Requests of distinct documents are committed in groups that each fit one statement
/// ([`append_at_once`]): one round trip per group. Should a group's statement fail (a taken
/// log position, a stale fence), or two requests concern the same document (one upsert cannot
/// fold both events), those requests run again in order in a transaction with a savepoint per
/// request, so only the failing request fails. A request too large for one statement runs in
/// a transaction of its own, its rows in several statements.
async fn commit_batch(
    conn: &mut PgConnection,
    batch: &[AppendRequest],
) -> Result<Vec<Result<(), StorageError>>, sqlx::Error> {
    let now = now_ms();
    let mut docs: Vec<DocId> = batch.iter().map(|r| r.doc).collect();
    docs.sort_unstable();
    docs.dedup();
    if docs.len() < batch.len() {
        return each_in_a_savepoint!(conn, batch, |sp, req| append_one(&mut sp, req, now));
    }
    let mut results = Vec::with_capacity(batch.len());
    let mut rest = batch;
    while !rest.is_empty() {
        let (group, after) = rest.split_at(one_statement(rest));
        rest = after;
        match commit_group(conn, group, now).await {
            Ok(done) => results.extend(done),
            Err(e) if results.is_empty() => return Err(e),
            // Earlier groups are committed: only this one and the later ones failed.
            Err(e) => {
                tracing::error!(error = %e, "commit failed; part of the batch is not durable");
                let failed = group.len() + rest.len();
                results.extend((0..failed).map(|_| Err(StorageError::Database(clone_err(&e)))));
                break;
            }
        }
    }
    Ok(results)
}

/// How many requests from the start of `batch` go into one statement: as many as fit in one
/// chunk of rows and bytes, and at least one.
fn one_statement(batch: &[AppendRequest]) -> usize {
    let (mut rows, mut bytes) = (0, 0);
    for (i, req) in batch.iter().enumerate() {
        rows += req.updates.len();
        bytes += req.updates.iter().map(|u| u.data.len()).sum::<usize>();
        if rows > ROWS_PER_INSERT || bytes > BYTES_PER_INSERT {
            return i.max(1);
        }
    }
    batch.len()
}

/// Commits one group of requests of distinct documents (see [`commit_batch`]).
async fn commit_group(
    conn: &mut PgConnection,
    group: &[AppendRequest],
    now: i64,
) -> Result<Vec<Result<(), StorageError>>, sqlx::Error> {
    if let [req] = group {
        if !fits_one_statement(group) {
            let mut tx = conn.begin().await?;
            let result = append_one(&mut tx, req, now).await;
            if result.is_ok() {
                tx.commit().await?;
            } else {
                tx.rollback().await?;
            }
            return Ok(vec![result]);
        }
    }
    match (append_at_once(conn, group, now).await, group) {
        (Ok(true), _) => Ok(group.iter().map(|_| Ok(())).collect()),
        // A lone request's refusal is its answer: which one (deleted, fenced, a covered
        // position) is read after the statement, which wrote nothing. A lease grant or a
        // delete committed in between may be what it reads; either answer makes the room
        // reload or give the document up, and nothing was written.
        (Ok(false), [req]) => {
            let why =
                SqlApi::<Postgres>::why_refused(conn, req.doc, req.fence, StorageError::Conflict)
                    .await;
            Ok(vec![Err(why)])
        }
        (Err(e), [_]) => Ok(vec![Err(e)]),
        // Several requests: again one by one, so only the refused one fails.
        (done, _) => {
            if let Err(e) = done {
                tracing::debug!(error = %e, "group commit failed; retrying request by request");
            }
            each_in_a_savepoint!(conn, group, |sp, req| append_one(&mut sp, req, now))
        }
    }
}

/// True when every log row of `batch` goes into one statement (see [`insert_rows`]'s chunks).
fn fits_one_statement(batch: &[AppendRequest]) -> bool {
    let rows: usize = batch.iter().map(|r| r.updates.len()).sum();
    let bytes: usize = batch
        .iter()
        .flat_map(|r| r.updates.iter().map(|u| u.data.len()))
        .sum();
    rows <= ROWS_PER_INSERT && bytes <= BYTES_PER_INSERT
}

/// Commits every request of `batch` (one per document, every row in one chunk) with one
/// statement outside a transaction, which PostgreSQL commits whole or not at all: its log rows
/// only if every one of them passes [`insert_rows`]'s checks, their client ids and one upsert
/// folding their `document.updated` events. Ok(false): some row was refused (a covered
/// position, a stale fence, a deleted document) and nothing was written; `Err(Conflict)`: a
/// position was taken.
async fn append_at_once(
    conn: &mut PgConnection,
    batch: &[AppendRequest],
    now: i64,
) -> Result<bool, StorageError> {
    let mut entries: Vec<LogRow> = Vec::new();
    let mut client_ids = Vec::new();
    let mut events = Vec::new();
    for req in batch {
        let seqs = req.first_seq..;
        entries.extend(
            seqs.zip(&req.updates)
                .map(|(seq, e)| (req.doc, req.fence, seq, e)),
        );
        client_ids.extend(client_rows(req.doc, req.first_seq, &req.updates));
        if let Some(debounce) = req.event_debounce_ms {
            events.push((req.doc, req.last_seq(), now + debounce));
        }
    }
    let rows = Rows::of(&entries);
    let clients = Clients::of(&client_ids);
    let events = Events::of(&events);
    let mut docs: Vec<DocId> = batch.iter().map(|r| r.doc).collect();
    docs.sort_unstable();
    let expected = entries.len() as i64;
    // The statement names the client and event tables only when it writes to them: each
    // table a statement names costs PostgreSQL its set-up on every execution.
    let sql = match (clients.docs.is_empty(), events.docs.is_empty()) {
        (true, true) => append_at_once_sql!(""),
        (false, true) => append_at_once_sql!(append_clients_sql!("$11", "$12", "$13", "$14")),
        (true, false) => append_at_once_sql!(append_events_sql!("$11", "$12", "$13", "$14")),
        (false, false) => append_at_once_sql!(
            append_clients_sql!("$11", "$12", "$13", "$14"),
            append_events_sql!("$15", "$16", "$17", "$18")
        ),
    };
    let mut statement = sqlx::query_scalar(sql)
        .bind(&docs)
        .bind(&rows.docs)
        .bind(&rows.seqs)
        .bind(&rows.data)
        .bind(now)
        .bind(&rows.fences)
        .bind(&rows.authors)
        .bind(&rows.inserted)
        .bind(&rows.deleted)
        .bind(expected);
    if !clients.docs.is_empty() {
        statement = statement
            .bind(&clients.docs)
            .bind(&clients.ids)
            .bind(&clients.authors)
            .bind(&clients.seqs);
    }
    if !events.docs.is_empty() {
        statement = statement
            .bind(&events.docs)
            .bind(&events.seqs)
            .bind(&events.available)
            .bind(&events.ids);
    }
    let done: Result<bool, sqlx::Error> = statement.fetch_one(&mut *conn).await;
    match done {
        Ok(ok) => Ok(ok),
        Err(sqlx::Error::Database(e)) if e.is_unique_violation() => Err(StorageError::Conflict),
        Err(e) => Err(e.into()),
    }
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
    let clients = Clients::of(rows);
    sqlx::query(
        "INSERT INTO doc_clients (doc_id, client_id, author, first_seq) \
         SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::bigint[]) \
         ON CONFLICT DO NOTHING",
    )
    .bind(&clients.docs)
    .bind(&clients.ids)
    .bind(&clients.authors)
    .bind(&clients.seqs)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// One log row to insert: document, fence, sequence number, the entry.
type LogRow<'a> = (DocId, Option<Epoch>, i64, &'a LogEntry);

/// Log rows as the arrays a statement binds (`passing_log_rows!`).
struct Rows<'a> {
    docs: Vec<DocId>,
    fences: Vec<Option<Epoch>>,
    seqs: Vec<i64>,
    data: Vec<&'a [u8]>,
    authors: Vec<Option<&'a str>>,
    inserted: Vec<i64>,
    deleted: Vec<i64>,
}

impl<'a> Rows<'a> {
    fn of(rows: &[LogRow<'a>]) -> Rows<'a> {
        Rows {
            docs: rows.iter().map(|r| r.0).collect(),
            fences: rows.iter().map(|r| r.1).collect(),
            seqs: rows.iter().map(|r| r.2).collect(),
            data: rows.iter().map(|r| r.3.data.as_ref()).collect(),
            authors: rows.iter().map(|r| r.3.author.as_deref()).collect(),
            inserted: rows.iter().map(|r| r.3.inserted).collect(),
            deleted: rows.iter().map(|r| r.3.deleted).collect(),
        }
    }
}

/// Client ids and their authors (`client_rows`) as the arrays a statement binds.
struct Clients<'a> {
    docs: Vec<DocId>,
    ids: Vec<i64>,
    authors: Vec<&'a str>,
    seqs: Vec<i64>,
}

impl<'a> Clients<'a> {
    fn of(rows: &'a [(DocId, i64, String, i64)]) -> Clients<'a> {
        Clients {
            docs: rows.iter().map(|r| r.0).collect(),
            ids: rows.iter().map(|r| r.1).collect(),
            authors: rows.iter().map(|r| r.2.as_str()).collect(),
            seqs: rows.iter().map(|r| r.3).collect(),
        }
    }
}

/// `document.updated` events, `(doc, last_seq, available_at)`, as the arrays
/// `fold_updated_events_sql!` binds, each with a fresh event id (receivers dedupe by id).
struct Events {
    docs: Vec<DocId>,
    seqs: Vec<i64>,
    available: Vec<i64>,
    ids: Vec<String>,
}

impl Events {
    fn of(events: &[(DocId, i64, i64)]) -> Events {
        Events {
            docs: events.iter().map(|e| e.0).collect(),
            seqs: events.iter().map(|e| e.1).collect(),
            available: events.iter().map(|e| e.2).collect(),
            ids: events
                .iter()
                .map(|_| uuid::Uuid::new_v4().to_string())
                .collect(),
        }
    }
}

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
        let cols = Rows::of(chunk);
        let done = sqlx::query(concat!(
            "WITH ",
            locked_documents!(),
            " INSERT INTO doc_updates \
               (doc_id, seq, data, created_at, author, inserted, deleted) \
             SELECT v.doc_id, v.seq, v.data, $5, v.author, v.inserted, v.deleted FROM ",
            passing_log_rows!()
        ))
        .bind(&docs)
        .bind(&cols.docs)
        .bind(&cols.seqs)
        .bind(&cols.data)
        .bind(now)
        .bind(&cols.fences)
        .bind(&cols.authors)
        .bind(&cols.inserted)
        .bind(&cols.deleted)
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
    let events = Events::of(events);
    sqlx::query(fold_updated_events_sql!(
        "unnest($1::bigint[], $2::bigint[], $3::bigint[], $4::text[])",
        "$5",
        ""
    ))
    .bind(&events.docs)
    .bind(&events.seqs)
    .bind(&events.available)
    .bind(&events.ids)
    .bind(now)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// The batches a writer commits, on PostgreSQL when `QUIRE_TEST_DATABASE=postgres` (see the
/// store's tests).
#[cfg(test)]
mod tests;
