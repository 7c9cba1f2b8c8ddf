//! Room leases and fencing tokens at the storage level, on whichever backend the suite runs
//! (SQLite, or PostgreSQL with `QUIRE_TEST_DATABASE=postgres`): every grant increments the
//! epoch, and a write under an old epoch is refused by the storage in the statement that
//! would have made it, while the new owner's writes go through.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use quire_server::storage::{LeaseGrant, SnapshotOutcome, StorageError};

const TTL: Duration = Duration::from_secs(30);

fn row(s: &str) -> Vec<Bytes> {
    vec![Bytes::copy_from_slice(s.as_bytes())]
}

fn granted(g: LeaseGrant) -> i64 {
    match g {
        LeaseGrant::Granted { epoch } => epoch,
        other => panic!("expected a grant, got {other:?}"),
    }
}

#[tokio::test]
async fn grants_increment_the_epoch_and_an_unexpired_lease_is_not_granted_twice() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open_test_stores(dir.path()).await.docs;
    let doc = store.load("leased").await.expect("load").id;

    let e1 = granted(store.acquire_lease(doc, "node-a", TTL).await.expect("a"));
    assert_eq!(e1, 1);
    match store.acquire_lease(doc, "node-b", TTL).await.expect("b") {
        LeaseGrant::HeldBy {
            owner,
            epoch,
            expires_in_ms,
        } => {
            assert_eq!(owner, "node-a");
            assert_eq!(epoch, 1);
            assert!(
                expires_in_ms > 0 && expires_in_ms <= 30_000,
                "{expires_in_ms}"
            );
        }
        other => panic!("node-b must not get a held lease: {other:?}"),
    }
    assert!(store
        .renew_lease(doc, "node-a", e1, TTL)
        .await
        .expect("renew"));
    assert!(
        !store
            .renew_lease(doc, "node-b", e1, TTL)
            .await
            .expect("renew"),
        "only the holder renews"
    );

    // Released on a graceful shutdown: the next node takes it at once, under a new epoch.
    store
        .release_lease(doc, "node-a", e1)
        .await
        .expect("release");
    let e2 = granted(store.acquire_lease(doc, "node-b", TTL).await.expect("b"));
    assert_eq!(e2, e1 + 1);
    assert!(
        !store
            .renew_lease(doc, "node-a", e1, TTL)
            .await
            .expect("renew"),
        "the old holder cannot renew a lease that moved on"
    );
    // A lease that expired is granted anew (the crash case), again with a new epoch.
    let short = Duration::from_millis(50);
    store
        .release_lease(doc, "node-b", e2)
        .await
        .expect("release");
    let e3 = granted(store.acquire_lease(doc, "node-c", short).await.expect("c"));
    tokio::time::sleep(Duration::from_millis(120)).await;
    let e4 = granted(
        store
            .acquire_lease(doc, "node-a", TTL)
            .await
            .expect("a again"),
    );
    assert_eq!((e3, e4), (e2 + 1, e2 + 2));
}

/// The paused-owner case, made to happen in order: A holds epoch 1 and has read the document;
/// A's lease expires (as if A were paused); B is granted epoch 2 and writes; A resumes and
/// writes under epoch 1. The storage refuses A's append and A's snapshot; B's rows stay.
#[tokio::test]
async fn a_paused_owner_resuming_with_an_old_epoch_is_refused_by_the_storage() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = open_test_stores(dir.path()).await.docs;
    let b = open_test_stores(dir.path()).await.docs;
    let seen_by_a = a.load("fenced").await.expect("load");
    let doc = seen_by_a.id;
    let short = Duration::from_millis(50);
    let epoch_a = granted(a.acquire_lease(doc, "node-a", short).await.expect("a"));
    a.append(doc, Some(epoch_a), 1, row("a1"))
        .await
        .expect("the owner writes under its epoch");

    // A is "paused" past its lease; B takes over.
    tokio::time::sleep(Duration::from_millis(120)).await;
    let epoch_b = granted(b.acquire_lease(doc, "node-b", TTL).await.expect("b"));
    assert_eq!(epoch_b, epoch_a + 1);
    let seen_by_b = b.load("fenced").await.expect("load");
    assert_eq!(
        seen_by_b.last_seq(),
        1,
        "B sees what A committed before the pause"
    );
    b.append(doc, Some(epoch_b), 2, row("b2"))
        .await
        .expect("the new owner writes");

    // A resumes: its next append (at the next free position, 3, so only the fence can stop
    // it) and its snapshot are refused.
    match a.append(doc, Some(epoch_a), 3, row("a3")).await {
        Err(StorageError::Fenced) => {}
        other => panic!("a stale owner's append must be fenced, got {other:?}"),
    }
    match a
        .write_snapshot(
            doc,
            Some(epoch_a),
            seen_by_a.snapshot_version,
            b"stale".to_vec().into(),
            1,
        )
        .await
    {
        Err(StorageError::Fenced) => {}
        other => panic!("a stale owner's snapshot must be fenced, got {other:?}"),
    }
    // Its renewal fails too, which is how an owner learns it lost the room without writing.
    assert!(!a
        .renew_lease(doc, "node-a", epoch_a, TTL)
        .await
        .expect("renew"));

    // The log holds exactly A's write from before the pause and B's.
    let stored = b.load("fenced").await.expect("load");
    let rows: Vec<(i64, Vec<u8>)> = stored.updates.clone();
    assert_eq!(rows, vec![(1, b"a1".to_vec()), (2, b"b2".to_vec())]);
    assert_eq!(
        stored.snapshot_seq, 0,
        "no snapshot was written by the stale owner"
    );
    // The new owner's snapshot goes through.
    let outcome = b
        .write_snapshot(
            doc,
            Some(epoch_b),
            stored.snapshot_version,
            b"fresh".to_vec().into(),
            2,
        )
        .await
        .expect("snapshot");
    assert!(
        matches!(outcome, SnapshotOutcome::Written { .. }),
        "{outcome:?}"
    );
}

/// The old owner keeps appending while another node is granted the document. Every append
/// of the old owner either committed before the grant, and is then in what the new owner
/// loads right after its grant, or is fenced; none commits after the grant.
#[tokio::test]
async fn appends_racing_a_take_over_commit_before_the_grant_or_are_fenced() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = open_test_stores(dir.path()).await.docs;
    let b = open_test_stores(dir.path()).await.docs;
    let doc = a.load("race").await.expect("load").id;
    let epoch_a = granted(
        a.acquire_lease(doc, "node-a", Duration::from_millis(1))
            .await
            .expect("a"),
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let writer_a = {
        let a = a.clone();
        tokio::spawn(async move {
            let mut committed = Vec::new();
            let mut started = Some(started_tx);
            // Appends until the first fenced one (bounded, so a missing fence fails the test
            // instead of hanging it).
            for seq in 1..=20_000 {
                match a.append(doc, Some(epoch_a), seq, row("a")).await {
                    Ok(()) => committed.push(seq),
                    Err(StorageError::Fenced) => return (committed, true),
                    Err(e) => panic!("unexpected error from the old owner: {e}"),
                }
                if seq == 20 {
                    if let Some(tx) = started.take() {
                        let _ = tx.send(());
                    }
                }
            }
            (committed, false)
        })
    };
    // Take over while A is appending.
    started_rx.await.expect("A started");
    let epoch_b = granted(b.acquire_lease(doc, "node-b", TTL).await.expect("b"));
    assert_eq!(epoch_b, epoch_a + 1);
    let seen_by_b = b.load("race").await.expect("load");
    let (committed_a, fenced) = writer_a.await.expect("writer a");
    assert!(
        fenced,
        "the old owner's appends stop being accepted after the grant"
    );
    assert!(committed_a.len() >= 20, "A committed before the grant");
    let seen: Vec<i64> = seen_by_b.updates.iter().map(|(s, _)| *s).collect();
    assert_eq!(
        seen, committed_a,
        "the new owner's load after its grant holds exactly what the old owner committed"
    );
    // The new owner continues the log; the old epoch never writes again.
    let next = seen_by_b.last_seq() + 1;
    b.append(doc, Some(epoch_b), next, row("b"))
        .await
        .expect("the new owner writes");
    assert!(matches!(
        a.append(doc, Some(epoch_a), next + 1, row("late")).await,
        Err(StorageError::Fenced)
    ));
    let stored = b.load("race").await.expect("load");
    assert_eq!(stored.last_seq(), next);
    assert_eq!(stored.updates.len() as i64, next);
}

/// A write under the current epoch at a position another writer took is a conflict (the room
/// reloads and carries on), not a database error (which would fail the room).
#[tokio::test]
async fn a_taken_position_under_a_valid_fence_is_a_conflict() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open_test_stores(dir.path()).await.docs;
    let doc = store.load("taken").await.expect("load").id;
    let epoch = granted(store.acquire_lease(doc, "node-a", TTL).await.expect("a"));
    store
        .append(doc, Some(epoch), 1, row("first"))
        .await
        .expect("append");
    match store.append(doc, Some(epoch), 1, row("again")).await {
        Err(StorageError::Conflict) => {}
        other => panic!("a taken position must be a conflict, got {other:?}"),
    }
    // Still usable afterwards, in a batch with other documents too.
    let other = store.load("other").await.expect("load").id;
    let (r1, r2) = tokio::join!(
        store.append(doc, Some(epoch), 1, row("third")),
        store.append(other, None, 1, row("fine")),
    );
    assert!(matches!(r1, Err(StorageError::Conflict)), "{r1:?}");
    r2.expect("the other document's append is committed");
}
