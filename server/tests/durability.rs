//! Durability: restarts, SIGKILL, compaction, snapshot races, failed loads.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use quire_server::storage::{SnapshotOutcome, StorageError};
use tokio::sync::Barrier;
use yrs::updates::decoder::Decode;
use yrs::{Doc, GetString, ReadTxn, StateVector, Text, Transact, Update};

#[tokio::test]
async fn a_restart_keeps_every_document() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(test_config(dir.path())).await;
    for d in 0..5u64 {
        let mut c = Client::connect(&server.url(&format!("doc-{d}")), d + 1).await;
        for i in 0..10 {
            c.insert(i, &d.to_string()).await;
        }
        c.durable_ack(0).await;
        c.close().await;
    }
    // Let the rooms unload (final snapshot), then keep editing one of them.
    // Idle rooms unload.
    server.wait_metric("quire_rooms_loaded", |v| v == 0.0).await;
    let mut c = Client::connect(&server.url("doc-0"), 50).await;
    assert_eq!(c.text(), "0".repeat(10));
    c.insert(0, "after-unload ").await;
    c.durable_ack(1).await;
    server.stop().await;

    let server = TestServer::start(test_config(dir.path())).await;
    for d in 0..5u64 {
        let c = Client::connect(&server.url(&format!("doc-{d}")), 100 + d).await;
        let want = if d == 0 {
            format!("after-unload {}", "0".repeat(10))
        } else {
            d.to_string().repeat(10)
        };
        assert_eq!(c.text(), want, "doc-{d}");
    }
    server.stop().await;
}

/// A change that reaches the server ahead of its client's earlier one (that client edited on
/// top of what it had from elsewhere, as a browser tab does from another tab over its
/// BroadcastChannel): the room holds it for its connection until the earlier one arrives from
/// another, then stores both; the snapshot written on unload gives back exactly that document
/// (checked from the stored rows). A store an earlier Quire wrote, when yrs integrated such a
/// change at once over the gap and yrs's own v2 encoder wrote the snapshot wrongly, must load
/// after a restart, and complete once the earlier change arrives.
#[tokio::test]
async fn a_snapshot_of_a_change_ahead_of_its_clients_earlier_one_reloads_whole() {
    use yrs::Map;
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(test_config(dir.path())).await;
    let url = server.url("ahead");
    // Client 7 types, then sets a map key (which depends on nothing before it); the second
    // change reaches the server first.
    let writer = Doc::with_client_id(7);
    let (first, second) = {
        let (text, map) = (
            writer.get_or_insert_text("text"),
            writer.get_or_insert_map("map"),
        );
        let mut txn = writer.transact_mut();
        text.insert(&mut txn, 0, "first ");
        let first = txn.encode_update_v1();
        drop(txn);
        let mut txn = writer.transact_mut();
        map.insert(&mut txn, "k", "second");
        (first, txn.encode_update_v1())
    };
    let mut c = Client::connect(&url, 1).await;
    let base = c.insert(0, "base ").await;
    c.send_update(&second).await;
    let mut relay = Client::connect(&url, 4).await;
    relay.send_update(&first).await;
    relay.durable_ack(1).await;
    c.durable_ack(1).await;
    relay.close().await;
    c.close().await;
    server.wait_metric("quire_rooms_loaded", |v| v == 0.0).await;
    assert!(
        server.metric("quire_snapshots_total").await >= 1.0,
        "the room wrote a snapshot as it unloaded"
    );
    server.stop().await;

    let key = |doc: &Doc| {
        let map = doc.get_or_insert_map("map");
        let txn = doc.transact();
        map.get(&txn, "k").map(|v| v.to_string(&txn))
    };
    // What storage holds, replayed here.
    let stored = stored_doc(dir.path(), "ahead").await;
    assert!(text_of(&stored).contains("first "), "{}", text_of(&stored));
    assert!(text_of(&stored).contains("base "), "{}", text_of(&stored));
    assert_eq!(key(&stored).as_deref(), Some("second"));

    // What an earlier Quire stored: "base " and the second change integrated over the gap by
    // yrs, the snapshot as yrs's own encoder writes it, which does not decode as written.
    let stored = Doc::new();
    for u in [&base, &second] {
        stored
            .transact_mut()
            .apply_update(Update::decode_v1(u).expect("decodes"))
            .expect("applies");
    }
    // A store an earlier Quire wrote: the same snapshot as yrs's own encoder writes it, which
    // does not decode as written. It loads all the same.
    let faulty = stored
        .transact()
        .encode_state_as_update_v2(&StateVector::default());
    assert!(
        Update::decode_v2(&faulty).is_err(),
        "written with the fault"
    );
    let pool = open_db(dir.path()).await;
    let replaced = sqlx::query(
        "UPDATE doc_snapshot_parts SET bytes = $1 WHERE doc_id = \
         (SELECT id FROM documents WHERE name = 'ahead') AND generation = \
         (SELECT snapshot_generation FROM documents WHERE name = 'ahead')",
    )
    .bind(faulty)
    .execute(&pool)
    .await
    .expect("replace the snapshot");
    assert_eq!(replaced.rows_affected(), 1, "one part");
    pool.close().await;

    let server = TestServer::start(test_config(dir.path())).await;
    let url = server.url("ahead");
    let mut late = Client::connect(&url, 2).await;
    assert_eq!(late.text(), "base ");
    assert_eq!(key(&late.doc).as_deref(), Some("second"));
    // Another client, which has the earlier change, types right after it: its edit refers to
    // an item in the document's hole, so it waits for that connection alone (yrs would keep
    // it pending in the document, which could then not be read whole).
    let other = Doc::with_client_id(9);
    for u in [&base, &first, &second] {
        other
            .transact_mut()
            .apply_update(Update::decode_v1(u).expect("decodes"))
            .expect("applies");
    }
    let typed = {
        let text = other.get_or_insert_text("text");
        let at = text
            .get_string(&other.transact())
            .find("first ")
            .expect("first")
            + 6;
        let mut txn = other.transact_mut();
        text.insert(&mut txn, at as u32, "AFTER ");
        txn.encode_update_v1()
    };
    let mut typist = Client::connect(&url, 9).await;
    typist.send_update(&typed).await;
    let ack = quire_server::protocol::encode_durable_ack(1);
    typist.send_raw(ack.clone()).await;
    assert!(
        !typist
            .pump_until(Duration::from_millis(300), |c| c
                .acks_received
                .contains(&ack))
            .await,
        "held, not stored, until what it refers to arrives"
    );
    let (status, _) = http_get(server.addr, "/api/v1/docs/ahead/update").await;
    assert_eq!(status, 200, "the document is read whole meanwhile");
    // The earlier change completes the document for everyone.
    late.send_update(&first).await;
    late.durable_ack(2).await;
    assert!(
        typist
            .pump_until(PATIENCE, |c| c.acks_received.contains(&ack))
            .await
    );
    let fresh = Client::connect(&url, 3).await;
    assert!(fresh.text().contains("first AFTER "), "{:?}", fresh.text());
    assert!(fresh.text().contains("base "), "{:?}", fresh.text());
    assert_eq!(key(&fresh.doc).as_deref(), Some("second"));
    server.stop().await;
}

/// The guarantee: whatever any client has received from the server is durable, even if the
/// process dies the next instant.
#[tokio::test]
async fn sigkill_right_after_clients_received_updates_loses_none_of_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path();
    let seed = seed();
    for round in 0..3u64 {
        let server = ServerProcess::start(db, &[]).await;
        let url = server.url("crash");
        let mut writer = Client::connect(&url, 10 + round).await;
        let mut watcher = Client::connect(&url, 20 + round).await;
        let target = 20 + (seed.wrapping_add(round) % 40) as usize;
        // The writer streams updates without waiting; the watcher waits for `target` of them.
        let writing = tokio::spawn(async move {
            for i in 0..500u32 {
                writer.insert(i, "w").await;
            }
            writer
        });
        let ok = watcher
            .pump_until(PATIENCE, |c| c.updates_received >= target)
            .await;
        assert!(ok, "watcher receives updates");
        server.signal("KILL");
        let seen = watcher.state_vector();
        let seen_text = watcher.text();
        let _ = writing.await;
        drop(server);

        let server = ServerProcess::start(db, &[]).await;
        let fresh = Client::connect(&server.url("crash"), 30 + round).await;
        let have = fresh.state_vector();
        for (client, clock) in seen.iter() {
            assert!(
                have.get(client) >= *clock,
                "round {round}, seed {seed}: client {client} clock {clock} seen before the kill, {} after",
                have.get(client)
            );
        }
        assert!(fresh.text().len() >= seen_text.len());
        server.signal("TERM");
    }
}

#[tokio::test]
async fn compaction_keeps_the_content_and_shrinks_the_log() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path();
    let mut cfg = test_config(dir.path());
    cfg.room.snapshot_updates = 10;
    let server = TestServer::start(cfg.clone()).await;
    let mut c = Client::connect(&server.url("compact"), 1).await;
    for i in 0..35u32 {
        c.insert(i, "c").await;
        c.durable_ack(u64::from(i)).await; // one update per commit, so snapshots are predictable
    }
    let expected = c.text();
    // 35 updates, snapshot every 10: 3 snapshots and 5 rows left in the log.
    server
        .wait_metric("quire_snapshots_total", |v| v >= 3.0)
        .await;
    assert_eq!(log_rows(db, "compact").await, 5);
    let pool = open_db(db).await;
    let (seq, size): (i64, i64) = sqlx::query_as(
        "SELECT d.snapshot_seq, CAST(SUM(length(p.bytes)) AS BIGINT) FROM documents d \
         JOIN doc_snapshot_parts p ON p.doc_id = d.id AND p.generation = d.snapshot_generation \
         WHERE d.name = 'compact' GROUP BY d.snapshot_seq",
    )
    .fetch_one(&pool)
    .await
    .expect("row");
    assert_eq!(seq, 30);
    assert!(size > 0);
    pool.close().await;
    let late = Client::connect(&server.url("compact"), 2).await;
    assert_eq!(late.text(), expected);
    server.stop().await;

    let server = TestServer::start(cfg).await;
    let again = Client::connect(&server.url("compact"), 3).await;
    assert_eq!(again.text(), expected);
    server.stop().await;
    assert_eq!(
        log_rows(db, "compact").await,
        0,
        "the final snapshot covers the log"
    );
}

fn text_update(client: u64, base: &Doc, s: &str) -> Vec<u8> {
    let doc = Doc::with_client_id(client);
    let sv = base.transact().state_vector();
    let full = base.transact().encode_diff_v1(&StateVector::default());
    doc.transact_mut()
        .apply_update(Update::decode_v1(&full).expect("decode"))
        .expect("apply");
    let t = doc.get_or_insert_text("text");
    {
        let mut txn = doc.transact_mut();
        let len = t.len(&txn);
        t.insert(&mut txn, len, s);
    }
    let diff = doc.transact().encode_diff_v1(&sv);
    diff
}

fn doc_of(stored: &quire_server::storage::StoredDoc) -> Doc {
    let doc = Doc::new();
    {
        let mut txn = doc.transact_mut();
        if let Some(s) = &stored.snapshot {
            txn.apply_update(Update::decode_v2(s).expect("v2"))
                .expect("apply");
        }
        for (_, u) in &stored.updates {
            txn.apply_update(Update::decode_v1(u).expect("v1"))
                .expect("apply");
        }
    }
    doc
}

fn text_of(doc: &Doc) -> String {
    doc.get_or_insert_text("text").get_string(&doc.transact())
}

/// Two snapshot writers that both read version v are released together by a barrier. Exactly
/// one wins; the loser is refused and changes nothing; no row is lost either way. Run with
/// both orders forced, and concurrently.
#[tokio::test]
async fn two_snapshot_writers_forced_to_interleave_lose_no_data() {
    for order in ["a-first", "b-first", "together"] {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = open_test_stores(dir.path()).await.docs;
        let b = open_test_stores(dir.path()).await.docs;

        // Three client updates in the log.
        let base = Doc::with_client_id(1);
        let seeded = a.load("race").await.expect("load");
        let mut rows = Vec::new();
        for s in ["one ", "two ", "three "] {
            let u = text_update(1, &base, s);
            base.transact_mut()
                .apply_update(Update::decode_v1(&u).expect("d"))
                .expect("a");
            rows.push(bytes::Bytes::from(u));
        }
        a.append(seeded.id, None, 1, rows).await.expect("append");

        // Both writers read version v; then A appends a fourth row B has not seen.
        let seen_by_a = a.load("race").await.expect("load a");
        let seen_by_b = b.load("race").await.expect("load b");
        assert_eq!(seen_by_a.snapshot_version, seen_by_b.snapshot_version);
        let doc_a = doc_of(&seen_by_a);
        let extra = text_update(2, &doc_a, "four");
        doc_a
            .transact_mut()
            .apply_update(Update::decode_v1(&extra).expect("d"))
            .expect("a");
        a.append(seen_by_a.id, None, 4, vec![extra.into()])
            .await
            .expect("append 4");
        // B, still at seq 3, cannot take log position 4: the key fences it.
        let stale = b
            .append(
                seen_by_b.id,
                None,
                4,
                vec![text_update(3, &base, "x").into()],
            )
            .await;
        assert!(matches!(stale, Err(StorageError::Conflict)), "{order}");

        let snap_a = doc_a
            .transact()
            .encode_state_as_update_v2(&StateVector::default());
        let snap_b = doc_of(&seen_by_b)
            .transact()
            .encode_state_as_update_v2(&StateVector::default());
        let v = seen_by_a.snapshot_version;
        let id = seen_by_a.id;
        let (ra, rb) = match order {
            "a-first" => {
                let ra = a
                    .write_snapshot(id, None, v, snap_a.into(), 4)
                    .await
                    .expect("a");
                let rb = b
                    .write_snapshot(id, None, v, snap_b.into(), 3)
                    .await
                    .expect("b");
                (ra, rb)
            }
            "b-first" => {
                let rb = b
                    .write_snapshot(id, None, v, snap_b.into(), 3)
                    .await
                    .expect("b");
                let ra = a
                    .write_snapshot(id, None, v, snap_a.into(), 4)
                    .await
                    .expect("a");
                (ra, rb)
            }
            _ => {
                let barrier = Arc::new(Barrier::new(2));
                let (ba, bb) = (barrier.clone(), barrier.clone());
                let (sa, sb) = (a.clone(), b.clone());
                let ta = tokio::spawn(async move {
                    ba.wait().await;
                    sa.write_snapshot(id, None, v, snap_a.into(), 4).await
                });
                let tb = tokio::spawn(async move {
                    bb.wait().await;
                    sb.write_snapshot(id, None, v, snap_b.into(), 3).await
                });
                (
                    ta.await.expect("join").expect("a"),
                    tb.await.expect("join").expect("b"),
                )
            }
        };
        let wins = [ra, rb]
            .iter()
            .filter(|r| matches!(r, SnapshotOutcome::Written { .. }))
            .count();
        assert_eq!(wins, 1, "{order}: exactly one writer wins ({ra:?}, {rb:?})");
        assert!(
            [ra, rb].contains(&SnapshotOutcome::Conflict),
            "{order}: the other is refused"
        );
        // The stale writer cannot append at a position a snapshot already covers, even where
        // the snapshot deleted the row that held it.
        let late = b
            .append(id, None, 4, vec![text_update(3, &base, "late").into()])
            .await;
        assert!(
            matches!(late, Err(StorageError::Conflict)),
            "{order}: {late:?}"
        );
        let after = a.load("race").await.expect("load");
        assert_eq!(after.snapshot_version, v + 1);
        assert_eq!(text_of(&doc_of(&after)), "one two three four", "{order}");
    }
}

/// A room whose snapshot is refused (someone else wrote the row) counts the conflict, reloads,
/// and carries on without losing anything.
#[tokio::test]
async fn a_room_answers_a_snapshot_conflict_by_reloading() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path();
    let mut cfg = test_config(dir.path());
    cfg.room.snapshot_updates = 5;
    let server = TestServer::start(cfg.clone()).await;
    let mut c = Client::connect(&server.url("conflict"), 1).await;
    for i in 0..3u32 {
        c.insert(i, "a").await;
    }
    c.durable_ack(1).await;
    // Another writer bumps the row's version behind the room's back.
    let pool = open_db(db).await;
    sqlx::query(
        "UPDATE documents SET snapshot_version = snapshot_version + 1 WHERE name = 'conflict'",
    )
    .execute(&pool)
    .await
    .expect("bump");
    pool.close().await;
    for i in 3..6u32 {
        c.insert(i, "b").await;
    }
    c.durable_ack(2).await;
    // The conflict is counted.
    server
        .wait_metric("quire_snapshot_conflicts_total", |v| v >= 1.0)
        .await;
    // The room reloaded and keeps working; the next snapshot succeeds with the new version.
    for i in 6..12u32 {
        c.insert(i, "c").await;
    }
    c.durable_ack(3).await;
    let watcher = Client::connect(&server.url("conflict"), 2).await;
    assert_eq!(watcher.text(), "aaabbbcccccc");
    server.stop().await;
    let server = TestServer::start(cfg).await;
    let again = Client::connect(&server.url("conflict"), 3).await;
    assert_eq!(again.text(), "aaabbbcccccc");
    server.stop().await;
}

/// A document whose stored data cannot be read is refused with 1011 and never replaced by an
/// empty one; once the data is readable again, the next connection after the retry delay works.
#[tokio::test]
async fn a_failed_load_refuses_with_1011_and_never_overwrites_stored_data() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path();
    let mut cfg = test_config(dir.path());
    cfg.room.load_retry_delay = Duration::from_millis(300);
    let server = TestServer::start(cfg.clone()).await;
    let mut c = Client::connect(&server.url("fragile"), 1).await;
    c.insert(0, "precious").await;
    c.durable_ack(1).await;
    c.close().await;
    server.stop().await; // final snapshot written

    let pool = open_db(db).await;
    let (good,): (Vec<u8>,) = sqlx::query_as(
        "SELECT bytes FROM doc_snapshot_parts p JOIN documents d \
             ON p.doc_id = d.id AND p.generation = d.snapshot_generation \
             WHERE d.name = 'fragile'",
    )
    .fetch_one(&pool)
    .await
    .expect("snapshot");
    sqlx::query(
        "UPDATE doc_snapshot_parts SET bytes = $1 \
         WHERE doc_id = (SELECT id FROM documents WHERE name = 'fragile')",
    )
    .bind(vec![0xffu8; 4])
    .execute(&pool)
    .await
    .expect("corrupt");

    let server = TestServer::start(cfg).await;
    let mut refused = Client::connect_unsynced(&server.url("fragile"), 2).await;
    assert_eq!(refused.wait_closed().await, Some(1011));
    // A client that has the content and tries to push it while the load is failing changes
    // nothing in storage.
    let mut again = Client::connect_unsynced(&server.url("fragile"), 3).await;
    again.insert(0, "overwrite?").await;
    assert_eq!(again.wait_closed().await, Some(1011));
    assert!(server.metric("quire_room_load_failures_total").await >= 1.0);
    let (still,): (Vec<u8>,) = sqlx::query_as(
        "SELECT bytes FROM doc_snapshot_parts p JOIN documents d \
             ON p.doc_id = d.id AND p.generation = d.snapshot_generation \
             WHERE d.name = 'fragile'",
    )
    .fetch_one(&pool)
    .await
    .expect("snapshot");
    assert_eq!(still, vec![0xff; 4], "the stored row was not touched");

    // Repair, wait out the retry delay, and the document loads.
    sqlx::query(
        "UPDATE doc_snapshot_parts SET bytes = $1 \
         WHERE doc_id = (SELECT id FROM documents WHERE name = 'fragile')",
    )
    .bind(&good)
    .execute(&pool)
    .await
    .expect("repair");
    pool.close().await;
    let ok = tokio::time::timeout(PATIENCE, async {
        loop {
            let mut c = Client::connect_unsynced(&server.url("fragile"), 4).await;
            if c.pump_until(Duration::from_secs(2), |c| c.synced).await {
                return c.text();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert_eq!(ok.expect("loads after the retry delay"), "precious");
    server.stop().await;
}

#[tokio::test]
async fn silent_connections_are_closed_and_live_ones_are_kept() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = test_config(dir.path());
    cfg.room.ping_interval = Duration::from_millis(100);
    cfg.idle_timeout = Duration::from_millis(400);
    let server = TestServer::start(cfg).await;
    let url = server.url("keepalive");
    let mut live = Client::connect(&url, 1).await;
    let mut silent = Client::connect(&url, 2).await;
    // `live` keeps reading (and so answers pings); `silent` reads nothing for a while.
    let stayed = live
        .pump_until(Duration::from_millis(1200), |c| c.closed.is_some())
        .await;
    assert!(!stayed, "a client that answers pings stays connected");
    assert_eq!(silent.wait_closed().await, Some(1001));
    assert_eq!(
        silent.closed.as_ref().map(|f| f.reason.to_string()),
        Some("idle timeout".into())
    );
    server.stop().await;
}

/// Appends from many documents committed together: one stale request (its position is
/// covered by a snapshot) fails alone; the others are committed.
#[tokio::test]
async fn a_conflicting_append_fails_alone_in_a_group_commit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open_test_stores(dir.path()).await.docs;
    let base = Doc::with_client_id(1);
    let stale_doc = store.load("stale").await.expect("load");
    let u = text_update(1, &base, "x");
    store
        .append(stale_doc.id, None, 1, vec![u.clone().into()])
        .await
        .expect("append");
    let snap = doc_of(&store.load("stale").await.expect("load"))
        .transact()
        .encode_state_as_update_v2(&StateVector::default());
    store
        .write_snapshot(
            stale_doc.id,
            None,
            stale_doc.snapshot_version,
            snap.into(),
            1,
        )
        .await
        .expect("snapshot");
    let mut ids = Vec::new();
    for i in 0..20 {
        ids.push(store.load(&format!("d{i}")).await.expect("load").id);
    }
    let mut tasks = Vec::new();
    for id in ids.iter().copied() {
        let (store, u) = (store.clone(), u.clone());
        tasks.push(tokio::spawn(async move {
            store.append(id, None, 1, vec![u.into()]).await
        }));
    }
    let (s, u2) = (store.clone(), u.clone());
    let stale = tokio::spawn(async move { s.append(stale_doc.id, None, 1, vec![u2.into()]).await });
    for t in tasks {
        t.await.expect("join").expect("the other appends commit");
    }
    assert!(matches!(
        stale.await.expect("join"),
        Err(StorageError::Conflict)
    ));
    for i in 0..20 {
        let d = store.load(&format!("d{i}")).await.expect("load");
        assert_eq!(d.updates.len(), 1, "d{i}");
    }
}

/// A snapshot and a stale append of one document submitted together: whichever order or
/// batch the writer puts them in, an append reported committed is never deleted by the
/// snapshot nor hidden below its `snapshot_seq`.
#[tokio::test]
async fn a_stale_append_racing_a_snapshot_is_refused_or_kept_never_lost() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open_test_stores(dir.path()).await.docs;
    for round in 0..20 {
        let name = format!("mixed-{round}");
        let d = store.load(&name).await.expect("load");
        let base = Doc::with_client_id(1);
        let first = text_update(1, &base, "a");
        store
            .append(d.id, None, 1, vec![first.clone().into()])
            .await
            .expect("append");
        let snap = doc_of(&store.load(&name).await.expect("load"))
            .transact()
            .encode_state_as_update_v2(&StateVector::default());
        // A second writer that has seen nothing appends at position 1 (stale: row 1 exists
        // and the snapshot will cover it) while the snapshot up to 1 is written.
        let other = text_update(2, &Doc::new(), "b");
        let (s1, s2) = (store.clone(), store.clone());
        let (id, v) = (d.id, d.snapshot_version);
        let snapshot =
            tokio::spawn(async move { s1.write_snapshot(id, None, v, snap.into(), 1).await });
        let stale = tokio::spawn(async move { s2.append(id, None, 1, vec![other.into()]).await });
        snapshot.await.expect("join").expect("snapshot");
        let stale = stale.await.expect("join");
        let text = text_of(&doc_of(&store.load(&name).await.expect("load")));
        match stale {
            Ok(()) => assert!(
                text.contains('b'),
                "round {round}: acknowledged append lost"
            ),
            Err(StorageError::Conflict) => assert_eq!(text, "a", "round {round}"),
            Err(e) => panic!("round {round}: {e}"),
        }
    }
}

/// The document storage holds (its snapshot and the log rows after it), replayed here. Read
/// in one transaction: a room may write a snapshot meanwhile, and the row, the parts and
/// the log must be of one moment.
async fn stored_doc(db: &std::path::Path, name: &str) -> Doc {
    let pool = open_db(db).await;
    let mut tx = pool.begin().await.expect("begin");
    if on_postgres() {
        // (SQLite's read transaction sees one snapshot; PostgreSQL's statements need this.)
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            .execute(&mut *tx)
            .await
            .expect("isolation");
    }
    let (id, seq, generation): (i64, i64, Option<i64>) = sqlx::query_as(
        "SELECT id, snapshot_seq, snapshot_generation FROM documents WHERE name = $1",
    )
    .bind(name)
    .fetch_one(&mut *tx)
    .await
    .expect("row");
    let parts: Vec<(Vec<u8>,)> = sqlx::query_as(
        "SELECT bytes FROM doc_snapshot_parts WHERE doc_id = $1 AND generation = $2 \
         ORDER BY part",
    )
    .bind(id)
    .bind(generation)
    .fetch_all(&mut *tx)
    .await
    .expect("snapshot");
    let snapshot: Option<(Vec<u8>,)> =
        generation.map(|_| (parts.into_iter().flat_map(|(b,)| b).collect(),));
    let rows: Vec<(Vec<u8>,)> =
        sqlx::query_as("SELECT data FROM doc_updates WHERE doc_id = $1 AND seq > $2 ORDER BY seq")
            .bind(id)
            .bind(seq)
            .fetch_all(&mut *tx)
            .await
            .expect("rows");
    tx.commit().await.expect("commit");
    pool.close().await;
    let doc = Doc::new();
    let mut txn = doc.transact_mut();
    if let Some((s,)) = snapshot {
        txn.apply_update(Update::decode_v2(&s).expect("v2"))
            .expect("applies");
    }
    for (row,) in rows {
        txn.apply_update(Update::decode_v1(&row).expect("v1"))
            .expect("applies");
    }
    drop(txn);
    doc
}

/// The text storage holds for `name` now.
async fn stored_text(db: &std::path::Path, name: &str) -> String {
    text_of(&stored_doc(db, name).await)
}

/// A large document's snapshot is encoded on a blocking thread while appends go on, and
/// covers only the rows it was encoded from: what storage holds (read from the rows, not from
/// the room) is everything acknowledged, after snapshots that overlapped many appends.
#[tokio::test]
async fn snapshots_encoded_while_appends_go_on_lose_no_row() {
    let read_back = snapshots_encoded_apart_lose_no_row(None).await;
    assert_eq!(read_back, 0.0, "a 1 MB snapshot is held in memory");
}

/// The same with a snapshot larger than the room holds in memory (twice `snapshot_bytes`):
/// each snapshot is encoded from the stored one, read back, and the rows after it.
#[tokio::test]
async fn snapshots_too_large_to_hold_are_read_back_to_encode_and_lose_no_row() {
    let read_back = snapshots_encoded_apart_lose_no_row(Some(384 * 1024)).await;
    assert!(read_back >= 2.0, "{read_back} snapshots read back");
}

/// Runs the scenario of the two tests above; returns how many snapshots were read back from
/// storage to encode from.
async fn snapshots_encoded_apart_lose_no_row(snapshot_bytes: Option<u64>) -> f64 {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path();
    let mut cfg = test_config(db);
    // A snapshot is due after every few commits, whatever the log's size.
    cfg.room.snapshot_updates = 4;
    cfg.room.snapshot_log_percent = 0;
    if let Some(bytes) = snapshot_bytes {
        cfg.room.snapshot_bytes = bytes;
    }
    let server = TestServer::start(cfg).await;
    let url = server.url("large");
    let mut c = Client::connect(&url, 1).await;
    // Over the size snapshotted away from the room (1 MiB), one commit at a time: the rows
    // since the last snapshot stay under the copy's bound (twice `snapshot_bytes`), which
    // would give the copy up until a snapshot covers every row.
    let chunk = "x".repeat(64 * 1024);
    for n in 0..18 {
        c.insert(0, &chunk).await;
        c.durable_ack(1_000_000 + n).await;
    }
    c.durable_ack(1).await;
    let apart_before = server.metric("quire_snapshots_encoded_apart_total").await;
    // Small edits in bursts, one acknowledgement per burst, until three snapshots have been
    // encoded away from the room: commits go on while each is encoded.
    let mut apart = 0.0;
    let mut burst = 0u64;
    while apart < 3.0 {
        assert!(
            burst < 5_000,
            "only {apart} snapshots encoded away from the room"
        );
        for i in 0..5 {
            c.insert(i, "ab").await;
        }
        c.durable_ack(burst + 2).await;
        burst += 1;
        apart = server.metric("quire_snapshots_encoded_apart_total").await - apart_before;
    }
    assert_eq!(server.metric("quire_snapshot_conflicts_total").await, 0.0);
    // Storage holds every acknowledged edit, whatever snapshot is being encoded or written
    // (read from the rows, not from the room).
    let (stored, text) = (stored_text(db, "large").await, c.text());
    assert!(
        stored == text,
        "storage holds {} characters, the client {}",
        stored.len(),
        text.len()
    );
    // A fresh client gets it all too (the room's own state, after those snapshots).
    let fresh = Client::connect(&url, 99).await;
    assert_eq!(fresh.text(), text);
    let read_back = server.metric("quire_snapshots_read_back_total").await;
    server.stop().await;
    read_back
}

/// A snapshot the room does not hold in memory, replaced underneath it by another writer (as
/// `quire compact` beside a running server does): the room's next snapshot finds the stored
/// one moved, and the room reloads (counted as a snapshot conflict) and goes on writing
/// snapshots; nothing acknowledged is lost.
#[tokio::test]
async fn a_stored_snapshot_replaced_underneath_the_room_makes_it_reload() {
    use quire_server::storage::{SnapshotBytes, SNAPSHOT_PART_BYTES};
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path();
    let mut cfg = test_config(db);
    cfg.room.snapshot_updates = 4;
    cfg.room.snapshot_log_percent = 0;
    // The 1.2 MB snapshot below is past twice this: not held in memory.
    cfg.room.snapshot_bytes = 384 * 1024;
    let server = TestServer::start(cfg).await;
    let url = server.url("replaced");
    let mut c = Client::connect(&url, 1).await;
    // One commit at a time (see `snapshots_encoded_apart_lose_no_row`).
    let chunk = "x".repeat(64 * 1024);
    for n in 0..18 {
        c.insert(0, &chunk).await;
        c.durable_ack(1_000_000 + n).await;
    }
    let mut ack = 1;
    c.durable_ack(ack).await;
    // Small edits until the room has encoded a snapshot from one read back.
    let mut bursts = 0;
    while server.metric("quire_snapshots_read_back_total").await < 1.0 {
        assert!(bursts < 2_000, "no snapshot read back");
        for i in 0..5 {
            c.insert(i, "ab").await;
        }
        ack += 1;
        c.durable_ack(ack).await;
        bursts += 1;
    }
    // Let the snapshot in progress, if any, be written.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let read_back = server.metric("quire_snapshots_read_back_total").await;
    // Another writer replaces the stored snapshot with one of its own (same content).
    let stores = open_test_stores(db).await;
    let mut replaced = false;
    for _ in 0..5 {
        let stored = stores.docs.load("replaced").await.expect("load");
        let state = quire_server::room::replay_stored(&stored)
            .expect("replays")
            .transact()
            .encode_state_as_update_v2(&StateVector::default());
        let data = bytes::Bytes::from(state);
        let snapshot = if data.len() > SNAPSHOT_PART_BYTES {
            SnapshotBytes::Staged(
                stores
                    .docs
                    .stage_snapshot(stored.id, data)
                    .await
                    .expect("staged"),
            )
        } else {
            SnapshotBytes::Whole(data)
        };
        let written = stores
            .docs
            .write_snapshot(
                stored.id,
                None,
                stored.snapshot_version,
                snapshot,
                stored.last_seq(),
            )
            .await
            .expect("write");
        if matches!(written, SnapshotOutcome::Written { .. }) {
            replaced = true;
            break;
        }
    }
    assert!(replaced, "the other writer's snapshot was written");
    // The room's next snapshot meets it: it reloads, then writes snapshots again.
    let mut bursts = 0;
    while server.metric("quire_snapshot_conflicts_total").await < 1.0
        || server.metric("quire_snapshots_read_back_total").await < read_back + 1.0
    {
        assert!(
            bursts < 2_000,
            "conflicts {}, read back {} (was {read_back})",
            server.metric("quire_snapshot_conflicts_total").await,
            server.metric("quire_snapshots_read_back_total").await
        );
        for i in 0..5 {
            c.insert(i, "cd").await;
        }
        ack += 1;
        c.durable_ack(ack).await;
        bursts += 1;
    }
    let text = c.text();
    assert!(
        stored_text(db, "replaced").await == text,
        "storage holds every edit"
    );
    let fresh = Client::connect(&url, 99).await;
    assert!(fresh.text() == text, "a fresh client gets every edit");
    server.stop().await;
}

/// A snapshot staged in parts is read back whole once written; a staged snapshot missing a
/// part is refused and changes nothing; the write deletes every other generation (the
/// previous snapshot, and parts a writer staged and abandoned).
#[tokio::test]
async fn a_snapshot_staged_in_parts_is_read_back_whole_and_checked() {
    use quire_server::storage::{SnapshotBytes, StagedSnapshot, SNAPSHOT_PART_BYTES};
    let dir = tempfile::tempdir().expect("tempdir");
    init_tracing();
    let store = open_test_stores(dir.path()).await.docs;
    let d = store.load("parts").await.expect("load");
    let big: Vec<u8> = (0..2 * SNAPSHOT_PART_BYTES + 1000)
        .map(|i| (i * 7 % 251) as u8)
        .collect();
    store
        .write_snapshot_part(d.id, 12_345, 0, bytes::Bytes::from_static(b"abandoned"))
        .await
        .expect("abandoned part");
    let staged = store
        .stage_snapshot(d.id, bytes::Bytes::from(big.clone()))
        .await
        .expect("staged");
    assert_eq!((staged.parts, staged.len), (3, big.len() as i64));

    let missing = StagedSnapshot { parts: 4, ..staged };
    let refused = store
        .write_snapshot(
            d.id,
            None,
            d.snapshot_version,
            SnapshotBytes::Staged(missing),
            0,
        )
        .await;
    assert!(
        matches!(refused, Err(StorageError::Invalid(_))),
        "{refused:?}"
    );
    let unchanged = store.load("parts").await.expect("load");
    assert_eq!(unchanged.snapshot, None);
    assert_eq!(unchanged.snapshot_version, d.snapshot_version);

    let written = store
        .write_snapshot(
            d.id,
            None,
            d.snapshot_version,
            SnapshotBytes::Staged(staged),
            0,
        )
        .await
        .expect("written");
    assert_eq!(
        written,
        SnapshotOutcome::Written {
            new_version: d.snapshot_version + 1
        }
    );
    let loaded = store.load("parts").await.expect("load");
    assert!(
        loaded.snapshot.as_deref() == Some(&big[..]),
        "read back whole"
    );
    let pool = open_db(dir.path()).await;
    let rows = |pool: sqlx::AnyPool| async move {
        let rows: Vec<(i64, i64)> = sqlx::query_as(
            "SELECT generation, part FROM doc_snapshot_parts WHERE doc_id = $1 \
             ORDER BY generation, part",
        )
        .bind(d.id)
        .fetch_all(&pool)
        .await
        .expect("rows");
        rows
    };
    let g = staged.generation;
    assert_eq!(rows(pool.clone()).await, vec![(g, 0), (g, 1), (g, 2)]);

    let written = store
        .write_snapshot(
            d.id,
            None,
            d.snapshot_version + 1,
            b"small".to_vec().into(),
            0,
        )
        .await
        .expect("written");
    assert_eq!(
        written,
        SnapshotOutcome::Written {
            new_version: d.snapshot_version + 2
        }
    );
    let loaded = store.load("parts").await.expect("load");
    assert_eq!(loaded.snapshot.as_deref(), Some(&b"small"[..]));
    assert_eq!(rows(pool.clone()).await.len(), 1);
    pool.close().await;
}

/// Two writers stage a large snapshot of the same version: the first to write wins, and its
/// write deletes the other's parts; the other gets the conflict (and reloads), not an error
/// about its missing parts.
#[tokio::test]
async fn a_staged_snapshot_that_loses_the_race_is_a_conflict() {
    use quire_server::storage::{SnapshotBytes, SNAPSHOT_PART_BYTES};
    let dir = tempfile::tempdir().expect("tempdir");
    init_tracing();
    let store = open_test_stores(dir.path()).await.docs;
    let d = store.load("race").await.expect("load");
    let big = bytes::Bytes::from(vec![7u8; SNAPSHOT_PART_BYTES + 1]);
    let a = store.stage_snapshot(d.id, big.clone()).await.expect("a");
    let b = store.stage_snapshot(d.id, big).await.expect("b");
    let v = d.snapshot_version;
    let first = store
        .write_snapshot(d.id, None, v, SnapshotBytes::Staged(a), 0)
        .await
        .expect("a writes");
    assert_eq!(first, SnapshotOutcome::Written { new_version: v + 1 });
    let second = store
        .write_snapshot(d.id, None, v, SnapshotBytes::Staged(b), 0)
        .await;
    assert!(
        matches!(second, Ok(SnapshotOutcome::Conflict)),
        "the loser gets its conflict: {second:?}"
    );
}
