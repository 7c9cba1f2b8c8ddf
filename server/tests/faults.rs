//! Storage faults, injected around the real store (SQLite or PostgreSQL): a failed commit is retried, and
//! nothing is broadcast or acknowledged before it succeeds; a commit that keeps failing closes
//! the document's connections with 1011, and the clients' resync brings their edits back.
//! Appends held at a gate force the room's pipeline into its interleavings: a batch applied
//! while the previous one commits, a sync request arriving while the room stays busy.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use common::*;
use quire_server::storage::{
    DocId, DocStore, Epoch, LogEntry, SharedStatements, SnapshotOutcome, StorageError,
};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The real store, with the next `fail_appends` appends failing as a disk error would, and,
/// while `hold_appends` is set, every append waiting for a `release` permit before it runs;
/// likewise every staged snapshot part while `hold_parts` is set (`release_parts`).
struct FaultyStore {
    inner: Arc<dyn DocStore>,
    fail_appends: AtomicU32,
    appends_tried: AtomicU32,
    hold_appends: AtomicBool,
    release: tokio::sync::Semaphore,
    parts_tried: AtomicU32,
    /// Parts waiting at the gate now (a write given up, by a deadline say, leaves).
    parts_waiting: Arc<AtomicU32>,
    hold_parts: AtomicBool,
    release_parts: tokio::sync::Semaphore,
    /// (first sequence number, rows) of every append, in the order they arrived.
    appends: Mutex<Vec<(i64, usize)>>,
}

impl FaultyStore {
    fn appends(&self) -> Vec<(i64, usize)> {
        self.appends.lock().map(|a| a.clone()).unwrap_or_default()
    }

    /// Waits until `n` appends have arrived (held or not).
    async fn wait_appends(&self, n: usize) {
        let ok = tokio::time::timeout(PATIENCE, async {
            while self.appends().len() < n {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        assert!(ok.is_ok(), "append {n} never arrived: {:?}", self.appends());
    }
}

#[async_trait]
impl DocStore for FaultyStore {
    fn shared(&self) -> &dyn SharedStatements {
        self.inner.shared()
    }
    async fn append_log(
        &self,
        doc: DocId,
        fence: Option<Epoch>,
        first: i64,
        rows: Vec<LogEntry>,
    ) -> Result<(), StorageError> {
        self.appends_tried.fetch_add(1, Ordering::SeqCst);
        if let Ok(mut a) = self.appends.lock() {
            a.push((first, rows.len()));
        }
        if self.hold_appends.load(Ordering::SeqCst) {
            if let Ok(permit) = self.release.acquire().await {
                permit.forget();
            }
        }
        let failing = self
            .fail_appends
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if failing {
            return Err(StorageError::Database(sqlx::Error::Protocol(
                "injected: disk I/O error".into(),
            )));
        }
        self.inner.append_log(doc, fence, first, rows).await
    }
    async fn write_snapshot(
        &self,
        doc: DocId,
        fence: Option<Epoch>,
        v: i64,
        s: quire_server::storage::SnapshotBytes,
        upto: i64,
    ) -> Result<SnapshotOutcome, StorageError> {
        self.inner.write_snapshot(doc, fence, v, s, upto).await
    }
    async fn write_snapshot_part(
        &self,
        doc: DocId,
        generation: i64,
        part: i64,
        bytes: bytes::Bytes,
    ) -> Result<(), StorageError> {
        self.parts_tried.fetch_add(1, Ordering::SeqCst);
        if self.hold_parts.load(Ordering::SeqCst) {
            struct Waiting(Arc<AtomicU32>);
            impl Drop for Waiting {
                fn drop(&mut self) {
                    self.0.fetch_sub(1, Ordering::SeqCst);
                }
            }
            self.parts_waiting.fetch_add(1, Ordering::SeqCst);
            let _waiting = Waiting(self.parts_waiting.clone());
            if let Ok(permit) = self.release_parts.acquire().await {
                permit.forget();
            }
        }
        self.inner
            .write_snapshot_part(doc, generation, part, bytes)
            .await
    }
}

async fn start(
    dir: &std::path::Path,
) -> (std::net::SocketAddr, Arc<FaultyStore>, CancellationToken) {
    start_with(dir, test_config(dir)).await
}

async fn start_with(
    dir: &std::path::Path,
    cfg: quire_server::config::Config,
) -> (std::net::SocketAddr, Arc<FaultyStore>, CancellationToken) {
    init_tracing();
    let real = open_test_stores(dir).await;
    let store = Arc::new(FaultyStore {
        inner: real.docs.clone(),
        fail_appends: AtomicU32::new(0),
        appends_tried: AtomicU32::new(0),
        hold_appends: AtomicBool::new(false),
        release: tokio::sync::Semaphore::new(0),
        parts_tried: AtomicU32::new(0),
        parts_waiting: Arc::new(AtomicU32::new(0)),
        hold_parts: AtomicBool::new(false),
        release_parts: tokio::sync::Semaphore::new(0),
        appends: Mutex::new(Vec::new()),
    });
    let stores = quire_server::Stores {
        docs: store.clone(),
        api: real.api,
        events_written: real.events_written,
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let token = CancellationToken::new();
    tokio::spawn(quire_server::run_with_stores(
        listener,
        cfg,
        stores,
        token.clone(),
    ));
    (addr, store, token)
}

#[tokio::test]
async fn a_failed_commit_is_retried_and_nothing_is_sent_before_it_succeeds() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (addr, store, token) = start(dir.path()).await;
    let url = format!("ws://{addr}/flaky");
    let mut a = Client::connect(&url, 1).await;
    let mut b = Client::connect(&url, 2).await;
    store.fail_appends.store(3, Ordering::SeqCst);
    a.insert(0, "survives").await;
    a.durable_ack(1).await;
    assert_eq!(
        store.appends_tried.load(Ordering::SeqCst),
        4,
        "three failures, then success"
    );
    assert!(b.pump_until(PATIENCE, |c| c.text() == "survives").await);
    assert_eq!(b.updates_received, 1, "broadcast once, after the commit");
    assert_eq!(log_rows(dir.path(), "flaky").await, 1);
    token.cancel();
}

/// A commit that keeps failing stalls the room instead of closing it: nothing is broadcast
/// or acknowledged, an update sent meanwhile closes its sender with 1013 (retry), `/readyz`
/// says why it is not ready and a gauge counts the room; when storage answers again the
/// stalled commit lands by itself, its ack goes out and a fresh client finds it.
#[tokio::test]
async fn a_commit_that_keeps_failing_stalls_the_room_until_storage_answers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (addr, store, token) = start(dir.path()).await;
    let url = format!("ws://{addr}/broken");
    let mut a = Client::connect(&url, 1).await;
    let mut b = Client::connect(&url, 2).await;
    store.fail_appends.store(u32::MAX, Ordering::SeqCst);
    a.insert(0, "unsaved").await;
    let ack = quire_server::protocol::encode_durable_ack(1);
    a.send_raw(ack.clone()).await;
    wait_metric_at(addr, "quire_rooms_storage_stalled", |v| v == 1.0).await;
    let (status, body) = http_get(addr, "/readyz").await;
    assert_eq!(status, 503);
    assert!(
        body.contains("storage-stalled") && body.contains("injected"),
        "{body}"
    );
    b.insert(0, "refused").await;
    assert_eq!(
        b.wait_closed().await,
        Some(1013),
        "updates are refused while stalled"
    );
    assert!(a.acks_received.is_empty(), "never acknowledged");
    assert_eq!(b.updates_received, 0, "never broadcast");
    assert_eq!(log_rows(dir.path(), "broken").await, 0);

    // Storage recovers: the stalled commit goes through on its next attempt.
    store.fail_appends.store(0, Ordering::SeqCst);
    assert!(
        a.pump_until(PATIENCE, |c| c.acks_received.contains(&ack))
            .await
    );
    assert!(a.closed.is_none(), "the writer stayed connected");
    wait_metric_at(addr, "quire_rooms_storage_stalled", |v| v == 0.0).await;
    assert_eq!(http_get(addr, "/readyz").await.0, 200);
    assert_eq!(fresh_text(&url).await, "unsaved");
    assert_eq!(log_rows(dir.path(), "broken").await, 1);
    token.cancel();
}

/// A database that stops answering (another session holds the log table's lock, so every
/// append waits) stalls the room once `storage_timeout` passes, instead of leaving it stuck
/// forever. Meanwhile the room keeps serving reads of the committed state from memory: a
/// client joining during the stall syncs at once (without the stalled update, which is not
/// committed) and so does an HTTP read. When the lock goes, the room resumes, the joined
/// client receives the stalled update, and every acknowledged update is there once. On the
/// real database of either backend.
#[tokio::test]
async fn a_database_that_stops_answering_stalls_the_room_and_it_resumes_by_itself() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = test_config(dir.path());
    cfg.room.storage_timeout = Duration::from_millis(500);
    let server = TestServer::start(cfg).await;
    let url = server.url("hung");
    let mut a = Client::connect(&url, 1).await;
    a.insert(0, "before ").await;
    a.durable_ack(1).await;
    let id = "hung".to_owned();
    let json_path = format!("/api/v1/docs/{id}/json");

    let pool = open_db(dir.path()).await;
    let mut lock = pool.acquire().await.expect("connection");
    if on_postgres() {
        sqlx::query("BEGIN")
            .execute(&mut *lock)
            .await
            .expect("begin");
        sqlx::query("LOCK TABLE doc_updates IN ACCESS EXCLUSIVE MODE")
            .execute(&mut *lock)
            .await
            .expect("lock");
    } else {
        sqlx::query("BEGIN EXCLUSIVE")
            .execute(&mut *lock)
            .await
            .expect("lock");
    }
    a.insert(7, "during").await;
    let ack = quire_server::protocol::encode_durable_ack(2);
    a.send_raw(ack.clone()).await;
    wait_metric_at(server.addr, "quire_rooms_storage_stalled", |v| v == 1.0).await;
    assert!(server.metric("quire_storage_timeouts_total").await >= 1.0);
    assert!(
        a.acks_received.iter().all(|f| *f != ack),
        "acknowledged while hung"
    );
    let (status, body) = http_get(server.addr, "/readyz").await;
    assert_eq!(status, 503, "{body}");
    // Reads of the committed state, served from memory while storage is stalled (each
    // within its own deadline: a read waiting for the commit would wait for the lock).
    let joined = tokio::time::timeout(PATIENCE, Client::connect(&url, 9)).await;
    let mut joined = joined.expect("a client joining a stalled room syncs at once");
    assert_eq!(joined.text(), "before ", "the committed state only");
    let read = tokio::time::timeout(PATIENCE, http_get(server.addr, &json_path)).await;
    let (status, body) = read.expect("an HTTP read of a stalled room answers at once");
    assert_eq!(status, 200, "{body}");
    let json: serde_json::Value = serde_json::from_str(&body).expect("json body");
    assert_eq!(json["text"], "before ", "{body}");
    assert!(
        server.metric("quire_stalled_reads_total").await >= 2.0,
        "the join and the read"
    );

    sqlx::query("ROLLBACK")
        .execute(&mut *lock)
        .await
        .expect("unlock");
    drop(lock);
    pool.close().await;
    assert!(
        a.pump_until(PATIENCE, |c| c.acks_received.contains(&ack))
            .await
    );
    wait_metric_at(server.addr, "quire_rooms_storage_stalled", |v| v == 0.0).await;
    assert_eq!(http_get(server.addr, "/readyz").await.0, 200);
    assert!(
        joined
            .pump_until(PATIENCE, |c| c.text() == "before during")
            .await,
        "the client that joined during the stall gets the update once it commits: {:?}",
        joined.text()
    );
    assert_eq!(fresh_text(&url).await, "before during");
    assert_eq!(
        log_rows(dir.path(), "hung").await,
        2,
        "each update logged once"
    );
    server.stop().await;
}

/// Appends one character at the end of the shared text.
async fn type_char(c: &mut Client, ch: &str) {
    let end = c.text_len() as u32;
    c.insert(end, ch).await;
}

/// A server whose rooms commit at most two updates per append (so two queued updates are a
/// full batch), over the gated store.
async fn start_pipelined(
    dir: &std::path::Path,
) -> (std::net::SocketAddr, Arc<FaultyStore>, CancellationToken) {
    let mut cfg = test_config(dir);
    cfg.room.commit_batch = 2;
    start_with(dir, cfg).await
}

/// A full batch queued while an append is held is applied at once (overlapping the commit),
/// appended right after the held one at the next sequence number, and broadcast only once it
/// is committed.
#[tokio::test]
async fn a_full_batch_is_applied_while_the_previous_commits_and_sent_only_after_its_own() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (addr, store, token) = start_pipelined(dir.path()).await;
    let url = format!("ws://{addr}/pipelined");
    let mut a = Client::connect(&url, 1).await;
    let mut b = Client::connect(&url, 2).await;
    store.hold_appends.store(true, Ordering::SeqCst);
    type_char(&mut a, "x").await;
    store.wait_appends(1).await;
    type_char(&mut a, "y").await;
    type_char(&mut a, "z").await;
    // Both applied while the first append is still held.
    wait_metric_at(addr, "quire_updates_applied_total", |n| n >= 3.0).await;
    assert_eq!(
        store.appends(),
        vec![(1, 1)],
        "one append in flight at a time"
    );
    assert!(
        !b.pump_until(Duration::from_millis(100), |c| c.updates_received > 0)
            .await
    );

    store.release.add_permits(1);
    store.wait_appends(2).await;
    assert_eq!(store.appends(), vec![(1, 1), (2, 2)], "gapless, in order");
    assert!(b.pump_until(PATIENCE, |c| c.text() == "x").await);
    assert!(
        !b.pump_until(Duration::from_millis(100), |c| c.text() != "x")
            .await,
        "the staged batch is not sent before it commits"
    );
    store.release.add_permits(1);
    assert!(b.pump_until(PATIENCE, |c| c.text() == "xyz").await);
    assert_eq!(log_rows(dir.path(), "pipelined").await, 3);
    token.cancel();
}

/// A newcomer's Sync/Step1 arrives while the room has a commit in flight, a staged batch and a
/// full batch queued behind it: it is answered as soon as the staged batch commits, before the
/// room applies anything more (it used to wait until the room fell quiet).
#[tokio::test]
async fn a_sync_request_is_answered_while_updates_keep_arriving() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (addr, store, token) = start_pipelined(dir.path()).await;
    let url = format!("ws://{addr}/busy");
    let mut a = Client::connect(&url, 1).await;
    store.hold_appends.store(true, Ordering::SeqCst);
    type_char(&mut a, "1").await;
    store.wait_appends(1).await;
    type_char(&mut a, "2").await;
    type_char(&mut a, "3").await;
    // The newcomer's Step1, then its awareness: once `a` sees the awareness, the room has
    // handled the Step1 (one connection's messages are handled in order).
    let mut c = Client::connect_unsynced(&url, 3).await;
    c.send_raw(presence(3, r#"{"user":{"name":"cy"}}"#)).await;
    assert!(
        a.pump_until(PATIENCE, |a| a.awareness.contains_key(&3))
            .await
    );
    assert!(!c.synced);
    type_char(&mut a, "4").await;
    type_char(&mut a, "5").await;
    store.release.add_permits(1); // "1" commits; the staged "23" is appended
    store.wait_appends(2).await;
    store.release.add_permits(1); // "23" commits: the Step1 is answered before "45" is applied
    c.sync().await;
    assert_eq!(c.text(), "123", "exactly the committed state");
    store.wait_appends(3).await;
    assert_eq!(store.appends(), vec![(1, 1), (2, 2), (4, 2)]);
    store.release.add_permits(1);
    assert!(c.pump_until(PATIENCE, |c| c.text() == "12345").await);
    token.cancel();
}

/// An HTTP update identical to one that is applied but not yet committed changes nothing when
/// applied; it is answered only once that update commits (answering at once would acknowledge
/// something the server could still lose).
#[tokio::test]
async fn an_http_update_repeating_an_uncommitted_one_is_answered_after_its_commit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (addr, store, token) = start_pipelined(dir.path()).await;
    let http = reqwest::Client::new();
    let created = http
        .post(format!("http://{addr}/api/v1/docs"))
        .json(&serde_json::json!({ "name": "twice" }))
        .json_body()
        .await;
    let id = quire_server::http::doc_path(created["name"].as_str().expect("name"));
    let mut a = Client::connect(&format!("ws://{addr}/twice"), 1).await;
    store.hold_appends.store(true, Ordering::SeqCst);
    type_char(&mut a, "x").await;
    store.wait_appends(1).await;
    let y = a.insert(1, "y").await;
    // The same update over HTTP: with the socket's copy it makes a full batch, applied (the
    // copy changes nothing) while "x" commits.
    let post = tokio::spawn(
        http.post(format!("http://{addr}/api/v1/docs/{id}/update"))
            .body(y)
            .send(),
    );
    // The HTTP copy is applied (and changes nothing) while "x" is still held.
    wait_metric_at(addr, "quire_updates_duplicate_total", |n| n >= 1.0).await;
    store.release.add_permits(1);
    store.wait_appends(2).await;
    assert_eq!(
        store.appends(),
        vec![(1, 1), (2, 1)],
        "the copy is not logged"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !post.is_finished(),
        "answered before the update it repeats committed"
    );
    store.release.add_permits(1);
    let resp = post.await.expect("task").expect("response");
    assert_eq!(resp.status(), reqwest::StatusCode::OK);
    let body: serde_json::Value = resp.json().await.expect("json");
    assert_eq!(body["seq"], 2);
    token.cancel();
}

/// A room whose commit does not come back stops taking in more than `room_queue_bytes` of
/// updates: the senders wait (their frames stay in their sockets) instead of the server
/// holding everything they send. Once the commit returns, everything is committed.
#[tokio::test]
async fn a_room_stuck_on_a_commit_holds_at_most_room_queue_bytes_of_updates() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = test_config(dir.path());
    const BOUND: usize = 64 << 10;
    cfg.room.room_queue_bytes = BOUND;
    let (addr, store, token) = start_with(dir.path(), cfg).await;
    let url = format!("ws://{addr}/stuck");
    let mut a = Client::connect(&url, 1).await;
    store.hold_appends.store(true, Ordering::SeqCst);
    type_char(&mut a, "x").await;
    store.wait_appends(1).await;
    // 40 updates of 8 KiB (320 KiB) while the first commit is held.
    let chunk = "y".repeat(8 << 10);
    for _ in 0..40 {
        type_char(&mut a, &chunk).await;
    }
    // The room takes in a bound's worth, then stops reading.
    wait_metric_at(addr, "quire_room_queue_bytes", |v| v >= (BOUND / 2) as f64).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let held = metric_at(addr, "quire_room_queue_bytes").await;
    assert!(
        held <= (BOUND + (9 << 10)) as f64,
        "{held} bytes of updates queued in the room (bound {BOUND} plus one update)"
    );
    // The commit returns: everything sent is committed, in order.
    store.hold_appends.store(false, Ordering::SeqCst);
    store.release.add_permits(1);
    a.durable_ack(1).await;
    wait_metric_at(addr, "quire_room_queue_bytes", |v| v == 0.0).await;
    let fresh = Client::connect(&url, 2).await;
    assert_eq!(fresh.text_len(), 1 + 40 * chunk.len());
    token.cancel();
}

/// A document deleted behind its room's back (a delete on another node whose announcement
/// was lost; here an UPDATE of its row) takes no more appends: the statement that appends
/// checks `deleted_at`, the room closes its sockets with 4404, the client's update is not
/// acknowledged and the log holds nothing new.
#[tokio::test]
async fn an_append_to_a_document_deleted_underneath_its_room_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(test_config(dir.path())).await;
    let mut c = Client::connect(&server.url("gone"), 1).await;
    c.insert(0, "kept").await;
    c.durable_ack(1).await;
    let pool = open_db(dir.path()).await;
    sqlx::query("UPDATE documents SET deleted_at = 1 WHERE name = $1")
        .bind("gone")
        .execute(&pool)
        .await
        .expect("delete the row");
    pool.close().await;
    let before = log_rows(dir.path(), "gone").await;
    c.insert(4, " more").await;
    let ack = quire_server::protocol::encode_durable_ack(2);
    c.send_raw(ack.clone()).await;
    assert_eq!(c.wait_closed().await, Some(4404));
    assert!(
        !c.acks_received.contains(&ack),
        "acknowledged an append to a deleted document"
    );
    assert_eq!(log_rows(dir.path(), "gone").await, before);
    server.stop().await;
}

/// A room stalled with a queue of updates behind its failing commit still takes commands: a
/// delete closes its sockets at once instead of waiting until storage comes back.
#[tokio::test]
async fn a_delete_reaches_a_stalled_room_with_updates_queued() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = test_config(dir.path());
    cfg.room.room_queue_bytes = 64 << 10;
    cfg.room.commit_batch = 1;
    let (addr, store, token) = start_with(dir.path(), cfg).await;
    let url = format!("ws://{addr}/clogged");
    let mut a = Client::connect(&url, 1).await;
    let mut b = Client::connect(&url, 2).await;
    // The first append is held while the queue fills up behind it, then fails: the room
    // stalls holding a full queue.
    store.hold_appends.store(true, Ordering::SeqCst);
    for i in 0..12 {
        a.insert(0, &format!("{i}{}", "x".repeat(16 << 10))).await;
    }
    store.wait_appends(1).await;
    wait_metric_at(addr, "quire_room_queue_bytes", |v| v >= (64 << 10) as f64).await;
    store.fail_appends.store(u32::MAX, Ordering::SeqCst);
    store.hold_appends.store(false, Ordering::SeqCst);
    store.release.add_permits(1);
    wait_metric_at(addr, "quire_rooms_storage_stalled", |v| v == 1.0).await;
    let http = reqwest::Client::new();
    let id = "clogged".to_owned();
    let deleted = http
        .delete(format!("http://{addr}/api/v1/docs/{id}"))
        .send()
        .await
        .expect("delete");
    assert!(deleted.status().is_success(), "{}", deleted.status());
    assert_eq!(b.wait_closed().await, Some(4404));
    drop(a);
    token.cancel();
}

/// A large document's snapshot is written in parts beside the room, not in its storage slot:
/// with the writing of its parts held, edits are still committed, acknowledged and delivered
/// (before, the 20 MB write held the room's commits for up to 90 ms); once released, the
/// snapshot lands, stored in parts, and a fresh client finds every edit.
#[tokio::test]
async fn a_large_snapshot_being_written_holds_no_commit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = test_config(dir.path());
    // A snapshot is due after every few commits, whatever the log's size.
    cfg.room.snapshot_updates = 4;
    cfg.room.snapshot_log_percent = 0;
    let (addr, store, token) = start_with(dir.path(), cfg).await;
    store.hold_parts.store(true, Ordering::SeqCst);
    let url = format!("ws://{addr}/large");
    let mut a = Client::connect(&url, 1).await;
    let mut b = Client::connect(&url, 2).await;
    // 2.5 MiB: over the size snapshotted away from the room and over one part (1 MiB).
    let chunk = "x".repeat(64 * 1024);
    for _ in 0..40 {
        a.insert(0, &chunk).await;
    }
    a.durable_ack(1).await;
    let held = tokio::time::timeout(PATIENCE, async {
        while store.parts_tried.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(held.is_ok(), "no snapshot part was ever written");
    let snapshots = metric_at(addr, "quire_snapshots_total").await;

    // The snapshot's first part is held: the room commits and delivers all the same.
    for i in 0..10 {
        a.insert(0, "edit").await;
        a.durable_ack(i + 2).await;
    }
    let text = a.text();
    assert!(b.pump_until(PATIENCE, |c| c.text() == text).await);
    assert_eq!(
        (
            store.parts_tried.load(Ordering::SeqCst),
            store.parts_waiting.load(Ordering::SeqCst)
        ),
        (1, 1),
        "the part stayed held, still being written, while the edits committed"
    );
    assert_eq!(metric_at(addr, "quire_snapshots_total").await, snapshots);

    store.hold_parts.store(false, Ordering::SeqCst);
    store.release_parts.add_permits(1_000);
    wait_metric_at(addr, "quire_snapshots_total", |v| v > snapshots).await;
    assert!(store.parts_tried.load(Ordering::SeqCst) >= 2);
    let pool = open_db(dir.path()).await;
    let (parts,): (i64,) = sqlx::query_as(
        "SELECT COUNT(*) FROM doc_snapshot_parts p JOIN documents d \
         ON p.doc_id = d.id AND p.generation = d.snapshot_generation WHERE d.name = 'large'",
    )
    .fetch_one(&pool)
    .await
    .expect("parts");
    assert!(parts >= 2, "the snapshot is stored in {parts} parts");
    pool.close().await;
    let mut fresh = Client::connect(&url, 3).await;
    assert!(fresh.pump_until(PATIENCE, |c| c.text() == text).await);
    token.cancel();
}
