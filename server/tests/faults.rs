//! Storage faults, injected around the real store (SQLite or PostgreSQL): a failed commit is retried, and
//! nothing is broadcast or acknowledged before it succeeds; a commit that keeps failing closes
//! the document's connections with 1011, and the clients' resync brings their edits back.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use common::*;
use quire_server::storage::{
    DocId, DocStore, Epoch, LeaseGrant, SnapshotOutcome, StorageError, StoredDoc,
};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The real store, with the next `fail_appends` appends failing as a disk error would.
struct FaultyStore {
    inner: Arc<dyn DocStore>,
    fail_appends: AtomicU32,
    appends_tried: AtomicU32,
}

#[async_trait]
impl DocStore for FaultyStore {
    async fn load(&self, name: &str) -> Result<StoredDoc, StorageError> {
        self.inner.load(name).await
    }
    async fn append(
        &self,
        doc: DocId,
        fence: Option<Epoch>,
        first: i64,
        rows: Vec<Bytes>,
    ) -> Result<(), StorageError> {
        self.appends_tried.fetch_add(1, Ordering::SeqCst);
        let failing = self
            .fail_appends
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if failing {
            return Err(StorageError::Database(sqlx::Error::Protocol(
                "injected: disk I/O error".into(),
            )));
        }
        self.inner.append(doc, fence, first, rows).await
    }
    async fn write_snapshot(
        &self,
        doc: DocId,
        fence: Option<Epoch>,
        v: i64,
        s: Vec<u8>,
        upto: i64,
    ) -> Result<SnapshotOutcome, StorageError> {
        self.inner.write_snapshot(doc, fence, v, s, upto).await
    }
    async fn ping(&self) -> Result<(), StorageError> {
        self.inner.ping().await
    }
    async fn acquire_lease(
        &self,
        doc: DocId,
        node: &str,
        ttl: std::time::Duration,
    ) -> Result<LeaseGrant, StorageError> {
        self.inner.acquire_lease(doc, node, ttl).await
    }
    async fn renew_lease(
        &self,
        doc: DocId,
        node: &str,
        epoch: Epoch,
        ttl: std::time::Duration,
    ) -> Result<bool, StorageError> {
        self.inner.renew_lease(doc, node, epoch, ttl).await
    }
    async fn release_lease(
        &self,
        doc: DocId,
        node: &str,
        epoch: Epoch,
    ) -> Result<(), StorageError> {
        self.inner.release_lease(doc, node, epoch).await
    }
}

async fn start(
    dir: &std::path::Path,
) -> (std::net::SocketAddr, Arc<FaultyStore>, CancellationToken) {
    init_tracing();
    let cfg = test_config(dir);
    let real = open_test_stores(dir).await;
    let store = Arc::new(FaultyStore {
        inner: real.docs.clone(),
        fail_appends: AtomicU32::new(0),
        appends_tried: AtomicU32::new(0),
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

#[tokio::test]
async fn a_commit_that_keeps_failing_closes_the_room_with_1011_and_clients_resync() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (addr, store, token) = start(dir.path()).await;
    let url = format!("ws://{addr}/broken");
    let mut a = Client::connect(&url, 1).await;
    let mut b = Client::connect(&url, 2).await;
    store.fail_appends.store(u32::MAX, Ordering::SeqCst);
    a.insert(0, "unsaved").await;
    a.send_raw(quire_server::protocol::encode_durable_ack(1))
        .await;
    assert_eq!(a.wait_closed().await, Some(1011));
    assert_eq!(b.wait_closed().await, Some(1011));
    assert!(a.acks_received.is_empty(), "never acknowledged");
    assert_eq!(b.updates_received, 0, "never broadcast");
    assert_eq!(b.text(), "");
    assert_eq!(log_rows(dir.path(), "broken").await, 0);

    // Storage recovers; the client reconnects with its document and the handshake re-sends it.
    store.fail_appends.store(0, Ordering::SeqCst);
    let doc = a.doc.clone();
    let mut again = Client::connect_with_doc(&url, doc).await;
    again.sync().await;
    again.durable_ack(2).await;
    let fresh = Client::connect(&url, 3).await;
    assert_eq!(fresh.text(), "unsaved");
    token.cancel();
}
