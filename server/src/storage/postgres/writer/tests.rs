//! The batches a writer commits, on PostgreSQL when `QUIRE_TEST_DATABASE=postgres` (see the
//! store's tests).

use std::time::{Duration, Instant};

use bytes::Bytes;

use super::*;
use sqlx::Connection;

use crate::storage::commit_window::tests::append_until;
use crate::storage::postgres::tests::{test_db, test_db_with, TestDb};
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
    let mut conn = pool.acquire().await.expect("connection");
    let results = commit_batch(&mut conn, batch).await.expect("batch");
    results.iter().map(outcome).collect()
}

fn outcome(r: &Result<(), StorageError>) -> &'static str {
    match r {
        Ok(()) => "ok",
        Err(StorageError::Conflict) => "conflict",
        Err(_) => "error",
    }
}

/// A store writing events, and a document `name` whose row 1 a snapshot covers (and deleted).
async fn with_a_covered_document(name: &str) -> Option<(TestDb, DocId)> {
    let events = EventSettings {
        enabled: true,
        debounce: Duration::from_secs(1),
    };
    let db = test_db(events).await?;
    let s = &db.store;
    let doc = s.load(name).await.expect("load").id;
    s.append(doc, None, 1, vec![Bytes::from_static(b"x")])
        .await
        .expect("append");
    let written = s
        .write_snapshot(doc, None, 0, b"snap".to_vec().into(), 1)
        .await;
    assert_eq!(
        written.expect("snapshot"),
        SnapshotOutcome::Written { new_version: 1 }
    );
    Some((db, doc))
}

#[tokio::test]
async fn a_batch_fails_only_its_conflicting_requests() {
    let Some((db, d1)) = with_a_covered_document("d1").await else {
        return;
    };
    let s = &db.store;
    let d2 = s.load("d2").await.expect("load").id;
    let d3 = s.load("d3").await.expect("load").id;

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

#[test]
fn a_batch_is_split_into_statements_of_one_chunk_each() {
    let sizes = |batch: &[AppendRequest]| {
        let mut rest = batch;
        let mut groups = Vec::new();
        while !rest.is_empty() {
            let n = one_statement(rest);
            groups.push(n);
            rest = &rest[n..];
        }
        groups
    };
    let batch = [request(1, 1, 400, false), request(2, 1, 400, false)];
    assert_eq!(sizes(&batch), [2]);
    let batch = [
        request(1, 1, 400, false),
        request(2, 1, 400, false),
        request(3, 1, 400, false),
        request(4, 1, 1, false),
    ];
    assert_eq!(sizes(&batch), [2, 2]);
    // A request larger than a chunk goes alone (and in a transaction of its own).
    let batch = [
        request(1, 1, ROWS_PER_INSERT + 1, false),
        request(2, 1, 1, false),
    ];
    assert_eq!(sizes(&batch), [1, 1]);
    assert!(!fits_one_statement(&batch[..1]));
    assert!(fits_one_statement(&batch[1..]));
}

async fn pending_events(pool: &PgPool, doc: DocId) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM outbox WHERE coalesce_key = $1 AND status = 'pending'")
        .bind(format!("document.updated:{doc}"))
        .fetch_one(pool)
        .await
        .expect("outbox")
}

#[tokio::test]
async fn one_statement_writes_all_of_a_batch_or_nothing() {
    let Some((db, covered)) = with_a_covered_document("covered").await else {
        return;
    };
    let s = &db.store;
    let pool = s.api().pool();
    let fine = s.load("fine").await.expect("load").id;
    let mut conn = pool.acquire().await.expect("connection");
    let seqs = |d: StoredDoc| d.updates.iter().map(|(s, _)| *s).collect::<Vec<_>>();

    // One row of the batch may not be written (its position is covered): nothing is,
    // neither the other document's rows nor its event.
    let batch = [request(fine, 1, 2, true), request(covered, 1, 1, true)];
    let done = append_at_once(&mut conn, &batch, now_ms()).await;
    assert!(
        !done.expect("statement"),
        "a refused row must fail the batch"
    );
    assert!(seqs(s.load("fine").await.expect("load")).is_empty());
    assert_eq!(pending_events(pool, fine).await, 0);

    // Alone, its rows and its event are written.
    let batch = [request(fine, 1, 2, true)];
    assert!(append_at_once(&mut conn, &batch, now_ms())
        .await
        .expect("statement"));
    assert_eq!(pending_events(pool, fine).await, 1);
    // A taken position: a conflict, and nothing written either.
    let other = s.load("other").await.expect("load").id;
    let batch = [request(other, 1, 1, true), request(fine, 2, 1, true)];
    let done = append_at_once(&mut conn, &batch, now_ms()).await;
    assert!(matches!(done, Err(StorageError::Conflict)), "{done:?}");
    assert!(seqs(s.load("other").await.expect("load")).is_empty());
    assert_eq!(pending_events(pool, other).await, 0);

    // Through the writer's path the refused requests fail alone, whatever the grouping.
    let batch = [
        request(other, 1, 700, true),
        request(covered, 1, 1, true),
        request(fine, 3, 700, false),
    ];
    let got = outcomes(pool, &batch).await;
    assert_eq!(got, ["ok", "conflict", "ok"]);
    assert_eq!(
        seqs(s.load("other").await.expect("load")),
        (1..=700).collect::<Vec<_>>()
    );
    assert_eq!(
        seqs(s.load("fine").await.expect("load")),
        (1..=702).collect::<Vec<_>>()
    );
    drop(conn);
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

fn window(delay_ms: u64, siblings: u32) -> CommitWindowSettings {
    CommitWindowSettings {
        delay: Duration::from_millis(delay_ms),
        siblings,
    }
}

#[tokio::test]
async fn a_busy_store_holds_its_commits_open_for_other_documents() {
    // Siblings far beyond what four documents can send: every wait is the whole delay.
    let Some(db) = test_db_with(EventSettings::default(), window(200, 1000)).await else {
        return;
    };
    let store = &db.store;
    let mut docs = Vec::new();
    for name in ["a", "b", "c", "d"] {
        docs.push(store.load(name).await.expect("load").id);
    }
    let until = Instant::now() + Duration::from_millis(1200);
    let took =
        futures_util::future::join_all(docs.iter().map(|d| append_until(store, *d, until))).await;
    // The first period (100 ms) runs unheld; once the writers have seen four documents
    // writing, each commit waits 200 ms for the others.
    for t in &took {
        let last = t.last().copied().unwrap_or_default();
        assert!(
            last >= Duration::from_millis(150),
            "the last append took {last:?}: {t:?}"
        );
    }
    let requests: usize = took.iter().map(Vec::len).sum();
    assert!(
        store.commits() < requests as u64,
        "some commits were shared: {} for {requests}",
        store.commits()
    );
    db.drop_db().await;
}

#[tokio::test]
async fn a_lone_busy_document_is_never_held() {
    // The most eager window: any expected sibling would hold the commit for 10 s.
    let Some(db) = test_db_with(EventSettings::default(), window(10_000, 0)).await else {
        return;
    };
    let store = &db.store;
    let doc = store.load("alone").await.expect("load").id;
    let took = append_until(store, doc, Instant::now() + Duration::from_millis(400)).await;
    let slowest = took.iter().max().copied().unwrap_or_default();
    assert!(took.len() > 10, "{took:?}");
    assert!(
        slowest < Duration::from_secs(5),
        "an append was held for {slowest:?}"
    );
    assert_eq!(store.commits(), took.len() as u64, "one commit per append");
    db.drop_db().await;
}

/// A writer whose connection the server closed (a restart, an administrator's
/// `pg_terminate_backend`) fails that batch and takes a new connection for the next one at
/// once, without waiting for the idle check: appends succeed again within a few attempts,
/// and what they wrote is in the stored rows.
#[tokio::test]
async fn a_writer_replaces_a_connection_the_server_closed() {
    let Some(db) = test_db(EventSettings::default()).await else {
        return;
    };
    let store = &db.store;
    let doc = store.load("terminated").await.expect("load").id;
    let mut seq = 1;
    // Every writer has taken its connection.
    for _ in 0..16 {
        let append = store.append(doc, None, seq, vec![Bytes::from_static(b"u")]);
        append.await.expect("append");
        seq += 1;
    }
    let mut admin = PgConnection::connect(&db.admin).await.expect("admin");
    sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1")
        .bind(&db.name)
        .execute(&mut admin)
        .await
        .expect("terminate");
    // Straight after (well inside the idle check's second), so only replacing a connection
    // that failed brings the writers back.
    let mut failures = 0;
    let mut successes = 0;
    while successes < 8 && failures < 40 {
        let append = store.append(doc, None, seq, vec![Bytes::from_static(b"u")]);
        match append.await {
            Ok(_) => {
                successes += 1;
                seq += 1;
            }
            Err(_) => failures += 1,
        }
    }
    assert_eq!(
        successes, 8,
        "appends still failing after {failures} attempts"
    );
    let stored = store.load("terminated").await.expect("load");
    assert_eq!(
        stored.last_seq(),
        seq - 1,
        "every append that succeeded is stored"
    );
    db.drop_db().await;
}
