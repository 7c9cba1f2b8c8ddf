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
            b"stale".to_vec(),
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
            b"fresh".to_vec(),
            2,
        )
        .await
        .expect("snapshot");
    assert!(
        matches!(outcome, SnapshotOutcome::Written { .. }),
        "{outcome:?}"
    );
}

/// Many appends from two owners racing across a take-over: every append is either committed
/// under the epoch that was current when it ran, or refused; none is half written, and the
/// positions the log holds are exactly the ones reported committed.
#[tokio::test]
async fn appends_racing_a_take_over_are_committed_or_fenced_never_lost() {
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
    let writer_a = {
        let a = a.clone();
        tokio::spawn(async move {
            let mut committed = Vec::new();
            for seq in (1..=200).step_by(2) {
                match a.append(doc, Some(epoch_a), seq, row("a")).await {
                    Ok(()) => committed.push(seq),
                    Err(StorageError::Fenced) => {}
                    Err(e) => panic!("unexpected error from the old owner: {e}"),
                }
            }
            committed
        })
    };
    let take_over = {
        let b = b.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(5)).await;
            granted(b.acquire_lease(doc, "node-b", TTL).await.expect("b"))
        })
    };
    let epoch_b = take_over.await.expect("take over");
    let committed_a = writer_a.await.expect("writer a");
    let mut committed_b = Vec::new();
    for seq in (2..=200).step_by(2) {
        b.append(doc, Some(epoch_b), seq, row("b"))
            .await
            .expect("the new owner writes");
        committed_b.push(seq);
    }
    // After the take-over, the old epoch never writes again.
    assert!(matches!(
        a.append(doc, Some(epoch_a), 1001, row("late")).await,
        Err(StorageError::Fenced)
    ));
    let stored = b.load("race").await.expect("load");
    let mut expected: Vec<i64> = committed_a.iter().chain(&committed_b).copied().collect();
    expected.sort_unstable();
    let held: Vec<i64> = stored.updates.iter().map(|(s, _)| *s).collect();
    assert_eq!(
        held, expected,
        "the log holds exactly the committed positions"
    );
}
